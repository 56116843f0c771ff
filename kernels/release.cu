// Device-side releases of pool blocks (Block::release_on_device, vkgdr_release_token), for
// tests/gpu_release.rs and the release benchmark.
//
// The host hands blocks to a persistent kernel through a mailbox in GPU memory: slot i is
// { check, ptr, token, item }, the CPU stores ptr, token and item (= i + 1), fences, then
// check = ptr ^ token ^ item ^ RELEASE_CHECK. The kernel takes a slot only when all four agree,
// re-reading it otherwise (result[7] counts the times its check was seen before the words it
// covers), so a store of the CPU that reaches the kernel late is never taken for a block
// address. A
// block's first two u64 words are its stamp: word 0 the item the CPU lent it for (stored before
// the lend), word 1 the item whose kernel is done with it (stored by the kernel before its
// release). A block the pool handed out again before its release arrived shows on either side:
// the kernel finds another item in word 0, or the CPU, allocating it again, finds word 1 behind
// word 0.
//
// release_worker: warp w serves items w * 32 + lane (and so on, a stride of every warp's 32
// further): each thread waits for its slot (or *stop != 0: the warp returns), checks word 0
// (result[5] counts mismatches), stores word 1, __threadfence_system(), and then the warp,
// converged, releases its tokens with vkgdr_release_token, retrying a stalled lane up to 1000
// times. blockDim.x must be a multiple of 32, or 1 (each thread alone). result: [0] refusals, [1 + status] each refusal's
// status, [5] stamp mismatches, [6] items served, [7] checks seen before their slot's words
// (8 words, zeroed).
//
// release_tokens: thread i releases tokens[i] (i < n) as it is, hostile or not; refusals in
// result as above.
//
// Build: nvcc -ptx -arch=compute_75 -O3.

#include "../include/vkgdr/ring_d2h.cuh"

typedef unsigned long long u64;

#define RELEASE_CHECK 0x9E3779B97F4A7C15ull

struct ReleaseSlot {
    u64 check;
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
    // Whole warps (blockDim.x a multiple of 32): warp w serves items w * 32 + lane, then a
    // stride of every warp's 32 further, and releases its 32 blocks together, converged, as
    // the warp calls of ring_d2h.cuh expect (one record for the warp's tokens).
    // Blocks of one thread: each thread alone (a warp of one), for a lone block's latency.
    const unsigned int width = blockDim.x == 1u ? 1u : 32u;
    const unsigned int mask = width == 1u ? 1u : 0xFFFFFFFFu;
    const unsigned int lane = threadIdx.x % width;
    const unsigned int warp = (blockIdx.x * blockDim.x + threadIdx.x) / width;
    const unsigned int warps = gridDim.x * blockDim.x / width;
    for (unsigned int base = warp * width; base < items; base += warps * width) {
        const unsigned int i = base + lane;
        const bool mine = i < items;
        u64 ptr = 0ull, token = 0ull, item = 0ull;
        bool stopped = false;
        if (mine) {
            const volatile ReleaseSlot* slot = (const volatile ReleaseSlot*)&box[i];
            const u64 want = (u64)i + 1ull;
            unsigned int nap = 32u;
            for (;;) {
                const u64 check = slot->check;
                __threadfence_system(); // the slot's other words after its check
                ptr = slot->ptr;
                token = slot->token;
                item = slot->item;
                if (item == want && check == (ptr ^ token ^ item ^ RELEASE_CHECK)) {
                    break;
                }
                if (check != 0ull) {
                    atomicAdd(&result[7], 1ull); // the check came before the words it covers
                }
                if (*(const volatile u64*)stop != 0ull) {
                    stopped = true;
                    break;
                }
                __nanosleep(nap);
                nap = nap < 1024u ? nap * 2u : nap;
            }
        }
        if (__any_sync(mask, stopped)) {
            return;
        }
        if (mine) {
            volatile u64* block = (volatile u64*)ptr;
            if (block[0] != item) {
                atomicAdd(&result[5], 1ull);
            }
            block[1] = item;
            __threadfence_system(); // the done marker before the release
        }
        __syncwarp(mask);
        if (mine) {
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
        __syncwarp(mask);
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
