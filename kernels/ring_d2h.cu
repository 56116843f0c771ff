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
// d2h_produce_check: as d2h_produce_test, but the payload (len <= 64 bytes) is word 0 = the
// record's id (thread << 32 | round) and word k >= 1 = d2h_test_word(id, k), a 64-bit mix: every
// byte after the id depends on the whole id, so a record that repeats another, or a slot that
// still holds an earlier lap's bytes, fails a check of every byte.
//
// d2h_produce_warp_check: each warp publishes `per_warp` records of `len` bytes (len <= 4080, a
// multiple of 16) with d2h_publish_warp, from shared memory, into lane
// (warp of the grid) % view.lanes, kind 2; payload as above with id = warp << 32 | round. A warp
// stops at its first refusal (counted once per warp in result).
//
// d2h_produce_sparse: as d2h_produce_check, but in round r thread t publishes only when
// d2h_sparse_in(t, r) (so warps publish with every lane, and with changing subsets of their
// lanes), kind 5, a payload of 8 + id % (max_len - 7) bytes (8 to max_len <= 248, the whole
// test payload of d2h_test_word's bytes) from a byte buffer at an odd address or an 8-byte
// aligned one, in turn. The threads stay in the loop to its end (a refusal is counted in result
// and ends the thread's publishing), so the warp's ballots always see every thread.
//
// d2h_ping: one thread publishes `n` records of 8 bytes (kind 3, payload i) into lane 0, record i
// once *go > i (a word in GPU memory the CPU stores to through the BAR): the CPU measures a lone
// record's trip. It stops when lane 0 is closed, or at its first refusal (counted in result).
//
// d2h_lone: one thread publishes one record of 8 bytes (kind 4, payload `value`) into lane 0.
//
// d2h_pong_word: see below (a plain word's round trip, the floor under d2h_ping's).
//
// d2h_write_word: *dst = value, from one thread (the baseline of a lone record's latency: a
// kernel's write seen through a stream synchronisation).
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

// Word k of test record `id`'s payload: the id itself for k = 0, else splitmix64's finaliser of
// id and k (src/ring/d2h tests and the bench compute the same).
__device__ __forceinline__ unsigned long long d2h_test_word(unsigned long long id, unsigned int k)
{
    if (k == 0u) {
        return id;
    }
    unsigned long long z = id * 0x9E3779B97F4A7C15ull + (unsigned long long)k * 0xD1B54A32D192ED03ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ void d2h_count_refusal(unsigned long long* result, int status)
{
    atomicAdd(&result[0], 1ull);
    atomicAdd(&result[1 + status], 1ull);
}

extern "C" __global__ void d2h_produce_check(vkgdr_d2h_view view, unsigned int per_thread,
                                             unsigned int len, unsigned long long* result)
{
    const unsigned int thread = blockIdx.x * blockDim.x + threadIdx.x;
    const vkgdr::D2hLane lane = vkgdr::d2h_lane(view, blockIdx.x % view.lanes);
    unsigned long long words[8];
    const unsigned int n = len < sizeof(words) ? len : (unsigned int)sizeof(words);
    for (unsigned int round = 0; round < per_thread; ++round) {
        const unsigned long long id = ((unsigned long long)thread << 32) | round;
#pragma unroll
        for (unsigned int k = 0; k < 8u; ++k) {
            words[k] = d2h_test_word(id, k);
        }
        const int status = vkgdr::d2h_publish_each(lane, 1u, words, n);
        if (status != VKGDR_D2H_OK) {
            d2h_count_refusal(result, status);
            return;
        }
    }
}

// Whether thread `thread` publishes in round `round` of d2h_produce_sparse (the tests compute
// the same): every thread in every fourth round, about four in five otherwise.
__device__ __forceinline__ bool d2h_sparse_in(unsigned int thread, unsigned int round)
{
    return round % 4u == 0u || (thread * 7u + round * 3u) % 5u != 0u;
}

#define D2H_SPARSE_MAX 248u

extern "C" __global__ void d2h_produce_sparse(vkgdr_d2h_view view, unsigned int per_thread,
                                              unsigned int max_len, unsigned long long* result)
{
    const unsigned int thread = blockIdx.x * blockDim.x + threadIdx.x;
    const vkgdr::D2hLane lane = vkgdr::d2h_lane(view, blockIdx.x % view.lanes);
    __align__(16) unsigned char buf[D2H_SPARSE_MAX + 16u];
    if (max_len < 8u || max_len > D2H_SPARSE_MAX) {
        if (threadIdx.x == 0u) {
            d2h_count_refusal(result, VKGDR_D2H_TOO_LARGE);
        }
        return;
    }
    bool refused = false;
    for (unsigned int round = 0; round < per_thread; ++round) {
        const bool in = !refused && d2h_sparse_in(thread, round);
        const unsigned int callers = __ballot_sync(0xFFFFFFFFu, in);
        if (in) {
            __syncwarp(callers); // the callers converged
            const unsigned long long id = ((unsigned long long)thread << 32) | round;
            const unsigned int len = 8u + (unsigned int)(id % (unsigned long long)(max_len - 7u));
            unsigned char* src = buf + ((thread + round) % 2u == 0u ? 8u : 1u);
            for (unsigned int b = 0; b < len; ++b) {
                src[b] = (unsigned char)(d2h_test_word(id, b / 8u) >> (8u * (b % 8u)));
            }
            const int status = vkgdr::d2h_publish_each(lane, 5u, src, len);
            if (status != VKGDR_D2H_OK) {
                d2h_count_refusal(result, status);
                refused = true;
            }
        }
        __syncwarp();
    }
}

#define D2H_WARP_WORDS 510u // 4080 bytes: a 4 KiB slot's payload
#define D2H_MAX_WARPS 8u    // blockDim.x <= 256

extern "C" __global__ void d2h_produce_warp_check(vkgdr_d2h_view view, unsigned int per_warp,
                                                  unsigned int len, unsigned long long* result)
{
    __shared__ __align__(16) unsigned long long buf[D2H_MAX_WARPS][D2H_WARP_WORDS + 2u];
    const unsigned int me = threadIdx.x & 31u;
    const unsigned int local = threadIdx.x / 32u;
    const unsigned int warp = blockIdx.x * (blockDim.x / 32u) + local;
    const vkgdr::D2hLane lane = vkgdr::d2h_lane(view, warp % view.lanes);
    const unsigned int words = len / 8u;
    if (local >= D2H_MAX_WARPS || words > D2H_WARP_WORDS) {
        if (me == 0u) {
            d2h_count_refusal(result, VKGDR_D2H_TOO_LARGE);
        }
        return;
    }
    for (unsigned int round = 0; round < per_warp; ++round) {
        const unsigned long long id = ((unsigned long long)warp << 32) | round;
        for (unsigned int k = me; k < words; k += 32u) {
            buf[local][k] = d2h_test_word(id, k);
        }
        __syncwarp();
        const int status = vkgdr::d2h_publish_warp(lane, 2u, buf[local], len);
        __syncwarp(); // every thread's reads of buf are done before the next round writes it
        if (status != VKGDR_D2H_OK) {
            if (me == 0u) {
                d2h_count_refusal(result, status);
            }
            return;
        }
    }
}

extern "C" __global__ void d2h_ping(vkgdr_d2h_view view, const unsigned long long* go,
                                    unsigned int n, unsigned long long* result)
{
    if (blockIdx.x != 0u || threadIdx.x != 0u) {
        return;
    }
    const vkgdr::D2hLane lane = vkgdr::d2h_lane(view, 0u);
    for (unsigned int i = 0; i < n; ++i) {
        for (;;) {
            // Both loads in flight at once: the go word is seen one load after it lands.
            const unsigned long long g = *(const volatile unsigned long long*)go;
            const unsigned long long closed = *lane.closed;
            if (g > i) {
                break;
            }
            if (closed != 0ull) {
                return;
            }
        }
        const unsigned long long value = i;
        const int status = vkgdr::d2h_publish(lane, 3u, &value, 8u);
        if (status != VKGDR_D2H_OK) {
            d2h_count_refusal(result, status);
            return;
        }
    }
}

extern "C" __global__ void d2h_lone(vkgdr_d2h_view view, unsigned long long value)
{
    if (blockIdx.x == 0u && threadIdx.x == 0u) {
        vkgdr::d2h_publish(vkgdr::d2h_lane(view, 0u), 4u, &value, 8u);
    }
}

extern "C" __global__ void d2h_write_word(unsigned long long* dst, unsigned long long value)
{
    if (blockIdx.x == 0u && threadIdx.x == 0u) {
        *(volatile unsigned long long*)dst = value;
    }
}

// d2h_pong_word: one thread writes i + 1 into *out (pinned host memory) once *go > i, for i < n:
// the machine's own CPU store -> kernel -> CPU round trip, beside d2h_ping's. A go of ~0 ends it.
extern "C" __global__ void d2h_pong_word(const unsigned long long* go, unsigned long long* out,
                                         unsigned int n)
{
    if (blockIdx.x != 0u || threadIdx.x != 0u) {
        return;
    }
    for (unsigned int i = 0; i < n; ++i) {
        while (*(const volatile unsigned long long*)go <= i) {
        }
        *(volatile unsigned long long*)out = i + 1ull;
        __threadfence_system();
    }
}
