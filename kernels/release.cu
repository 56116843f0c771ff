// Device-side releases of pool blocks (Block::release_on_device, vkgdr_release_token), for
// tests/gpu_release.rs and the release benchmark.
//
// The host hands blocks to a persistent kernel through a mailbox in GPU memory: slot i is
// { seq, ptr, token, item }, the CPU stores ptr, token and item, fences, then seq = i + 1. A
// block's first two u64 words are its stamp: word 0 the item the CPU lent it for (stored before
// the lend), word 1 the item whose kernel is done with it (stored by the kernel before its
// release). A block the pool handed out again before its release arrived shows on either side:
// the kernel finds another item in word 0, or the CPU, allocating it again, finds word 1 behind
// word 0.
//
// release_worker: grid thread g serves items g, g + threads, ... below `items`: waits for its
// slot (or *stop != 0: returns), checks word 0 (result[5] counts mismatches), stores word 1,
// __threadfence_system(), and releases the token with vkgdr_release_token, retrying a stalled
// lane up to 1000 times. result: [0] refusals, [1 + status] each refusal's status, [5] stamp
// mismatches, [6] items served (8 words, zeroed).
//
// release_tokens: thread i releases tokens[i] (i < n) as it is, hostile or not; refusals in
// result as above.
//
// Build: nvcc -ptx -arch=compute_75 -O3.

#include "../include/vkgdr/ring_d2h.cuh"

typedef unsigned long long u64;

struct ReleaseSlot {
    u64 seq;
    u64 ptr;
    u64 token;
    u64 item;
};

__device__ __forceinline__ void count_refusal(u64* result, int status)
{
    atomicAdd(&result[0], 1ull);
    atomicAdd(&result[1 + status], 1ull);
}

extern "C" __global__ void release_worker(vkgdr_d2h_view view, const ReleaseSlot* box,
                                          unsigned int items, const u64* stop, u64* result)
{
    const unsigned int threads = gridDim.x * blockDim.x;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < items; i += threads) {
        const volatile ReleaseSlot* slot = (const volatile ReleaseSlot*)&box[i];
        unsigned int nap = 32u;
        while (slot->seq != (u64)i + 1ull) {
            if (*(const volatile u64*)stop != 0ull) {
                return;
            }
            __nanosleep(nap);
            nap = nap < 1024u ? nap * 2u : nap;
        }
        __threadfence(); // the slot's words, and the block's stamp, after its seq
        volatile u64* block = (volatile u64*)slot->ptr;
        const u64 token = slot->token;
        const u64 item = slot->item;
        if (block[0] != item) {
            atomicAdd(&result[5], 1ull);
        }
        block[1] = item;
        __threadfence_system(); // the done marker before the release
        int status = VKGDR_D2H_OK;
        for (int tries = 0; tries < 1000; ++tries) {
            status = vkgdr_release_token(view, token);
            if (status != VKGDR_D2H_STALLED) {
                break;
            }
        }
        if (status != VKGDR_D2H_OK) {
            count_refusal(result, status);
        }
        atomicAdd(&result[6], 1ull);
    }
}

extern "C" __global__ void release_tokens(vkgdr_d2h_view view, const u64* tokens, unsigned int n,
                                          u64* result)
{
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    const int status = vkgdr_release_token(view, tokens[i]);
    if (status != VKGDR_D2H_OK) {
        count_refusal(result, status);
    }
}
