// Test producers on the device -> host API (include/vkgdr/ring_d2h.cuh), for the device -> host
// ring's tests and benchmarks: records whose payload names their writer, and release tokens.
//
// d2h_produce_test: every thread publishes `per_thread` records into lane blockIdx.x % view.lanes,
// one reservation per warp and round (d2h_publish_each), kind 1. A record's payload is min(len,
// 64) bytes of little-endian u64 words w, w + 1, w + 2, ... with w = thread << 32 | round. A
// thread stops at its first refusal: result[0] counts refusals, result[1 + status] each status
// (result: 5 words, zeroed).
//
// d2h_release_test: thread i releases tokens[i] (i < n) through vkgdr_release_token (the lane of
// its block); refusals counted in result as above.
//
// Build: nvcc -ptx -arch=compute_75 -O3.

#include "../include/vkgdr/ring_d2h.cuh"

extern "C" __global__ void d2h_produce_test(vkgdr_d2h_view view, unsigned int per_thread,
                                            unsigned int len, unsigned long long* result)
{
    const unsigned int thread = blockIdx.x * blockDim.x + threadIdx.x;
    const vkgdr::D2hLane lane = vkgdr::d2h_lane(view, blockIdx.x % view.lanes);
    unsigned long long words[8]; // built 64 bytes at a time: the payload repeats after them
    for (unsigned int round = 0; round < per_thread; ++round) {
        const unsigned long long base = ((unsigned long long)thread << 32) | round;
        words[0] = base;
        for (unsigned int k = 1; k < 8u; ++k) {
            words[k] = base + k;
        }
        const unsigned int n = len < sizeof(words) ? len : (unsigned int)sizeof(words);
        const int status = vkgdr::d2h_publish_each(lane, 1u, words, n);
        if (status != VKGDR_D2H_OK) {
            atomicAdd(&result[0], 1ull);
            atomicAdd(&result[1 + status], 1ull);
            return;
        }
    }
}

extern "C" __global__ void d2h_release_test(vkgdr_d2h_view view,
                                            const unsigned long long* tokens, unsigned int n,
                                            unsigned long long* result)
{
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    const int status = vkgdr_release_token(view, tokens[i]);
    if (status != VKGDR_D2H_OK) {
        atomicAdd(&result[0], 1ull);
        atomicAdd(&result[1 + status], 1ull);
    }
}
