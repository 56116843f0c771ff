/* 100,000 pool blocks allocated and written from C threads, checked by a kernel
 * (check_tagged_blocks of kernels/mapping.ptx: block k must hold tag_byte(tag, j)), on coherent
 * memory and with FORCE_NON_COHERENT (writes recorded per block, one pool flush per thread), with
 * and without the per-thread block cache. A corrupted byte must be found (the check can fail).
 *
 * Usage: gpu_pool path/to/kernels/mapping.ptx */
#include <pthread.h>
#include <stdint.h>

#include "gpu_util.h"

#define BLOCKS 100000
#define THREADS 4

static vkgdr_pool_t pool;
static vkgdr_block_t blocks[BLOCKS];
static unsigned long long ptrs[BLOCKS];
static unsigned int lens[BLOCKS], tags[BLOCKS];

static size_t block_size(int k) { return (size_t)(1 + (k * 37) % 300); }

static void *produce(void *arg)
{
    int first = (int)(intptr_t)arg, k, errors = 0;
    for (k = first; k < BLOCKS; k += THREADS) {
        size_t n = block_size(k), j, align = (size_t)1 << (k % 7);
        vkgdr_block_t b = vkgdr_pool_alloc(pool, n, align);
        unsigned char *p = vkgdr_block_get_host_ptr(b);
        blocks[k] = b;
        if (b == NULL || p == NULL) {
            errors++;
            continue;
        }
        tags[k] = (unsigned int)k * 7u + 3u;
        for (j = 0; j < n; j++) {
            p[j] = tag_byte(tags[k], j);
        }
        errors += vkgdr_block_mark_written(b, 0, n) != VKGDR_SUCCESS;
        ptrs[k] = vkgdr_block_get_device_ptr(b);
        lens[k] = (unsigned int)n;
        errors += ptrs[k] == 0 || ptrs[k] % align != 0;
    }
    /* One flush for all of this thread's blocks (a no-op on coherent memory). */
    errors += vkgdr_pool_flush(pool) != VKGDR_SUCCESS;
    return (void *)(intptr_t)errors;
}

static unsigned long long check_on_gpu(CUfunction check)
{
    CUdeviceptr d_ptrs, d_lens, d_tags, d_bad;
    unsigned long long n = BLOCKS, bad = ~0ull;
    void *args[5] = {&d_ptrs, &d_lens, &d_tags, &n, &d_bad};
    CU_OK(cuMemAlloc(&d_ptrs, sizeof ptrs));
    CU_OK(cuMemAlloc(&d_lens, sizeof lens));
    CU_OK(cuMemAlloc(&d_tags, sizeof tags));
    CU_OK(cuMemAlloc(&d_bad, sizeof bad));
    CU_OK(cuMemcpyHtoD(d_ptrs, ptrs, sizeof ptrs));
    CU_OK(cuMemcpyHtoD(d_lens, lens, sizeof lens));
    CU_OK(cuMemcpyHtoD(d_tags, tags, sizeof tags));
    CU_OK(cuMemsetD8(d_bad, 0, sizeof bad));
    CU_OK(cuLaunchKernel(check, 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    CU_OK(cuCtxSynchronize());
    CU_OK(cuMemcpyDtoH(&bad, d_bad, sizeof bad));
    cuMemFree(d_ptrs);
    cuMemFree(d_lens);
    cuMemFree(d_tags);
    cuMemFree(d_bad);
    return bad;
}

static void run(CUfunction check, uint32_t flags, unsigned int thread_cache, const char *what)
{
    vkgdr_t g = vkgdr_open(0, VKGDR_OPEN_CURRENT_CONTEXT_BIT | flags);
    vkgdr_pool_config cfg;
    vkgdr_pool_stats stats;
    pthread_t threads[THREADS];
    unsigned long long expected_bytes = 0, bad;
    unsigned char *victim;
    vkgdr_memory_t probe;
    size_t atom;
    void *ret;
    int i, errors = 0;

    CHECK(g != NULL, "%s: open", what);
    vkgdr_pool_config_init(&cfg, sizeof cfg);
    cfg.thread_cache = thread_cache;
    pool = vkgdr_pool_create(g, &cfg);
    CHECK(pool != NULL, "%s: pool", what);
    for (i = 0; i < THREADS; i++) {
        pthread_create(&threads[i], NULL, produce, (void *)(intptr_t)i);
    }
    for (i = 0; i < THREADS; i++) {
        pthread_join(threads[i], &ret);
        errors += (int)(intptr_t)ret;
    }
    CHECK(errors == 0, "%s: %d errors while allocating and writing", what, errors);
    /* Blocks of non-coherent pools own whole atoms: the pool counts their rounded sizes. */
    probe = vkgdr_memory_alloc(g, 4096, 0);
    atom = vkgdr_memory_non_coherent_atom_size(probe);
    vkgdr_memory_free(probe);
    CHECK(atom >= 1 && (atom == 1) == vkgdr_pool_is_coherent(pool), "%s: atom %zu", what, atom);
    atom = atom ? atom : 1;
    for (i = 0; i < BLOCKS; i++) {
        expected_bytes += (block_size(i) + atom - 1) / atom * atom;
    }
    stats.struct_size = sizeof stats;
    CHECK(vkgdr_pool_get_stats(pool, &stats) == VKGDR_SUCCESS &&
              stats.bytes_in_use == expected_bytes,
          "%s: %llu bytes in use, expected %llu", what,
          (unsigned long long)stats.bytes_in_use, expected_bytes);

    bad = check_on_gpu(check);
    CHECK(bad == 0, "%s: the kernel found %llu wrong blocks", what, bad);

    /* The check can fail: corrupt one byte of one block. */
    victim = vkgdr_block_get_host_ptr(blocks[12345]);
    victim[lens[12345] - 1] ^= 0x5a;
    vkgdr_block_flush(blocks[12345], lens[12345] - 1, 1);
    bad = check_on_gpu(check);
    CHECK(bad == 1, "%s: the corrupted block was not found (%llu)", what, bad);
    printf("%s: %d blocks (%.1f MiB in %llu chunks) checked by the kernel\n", what, BLOCKS,
           (double)expected_bytes / (1 << 20), (unsigned long long)stats.chunks);

    /* Blocks of other threads freed here; the pool is then empty. */
    for (i = 0; i < BLOCKS; i++) {
        vkgdr_block_free(blocks[i]);
    }
    CHECK(no_last_error(), "%s: frees", what);
    vkgdr_pool_trim(pool, NULL);
    vkgdr_pool_get_stats(pool, &stats);
    CHECK(stats.bytes_in_use == 0, "%s: %llu bytes still in use", what,
          (unsigned long long)stats.bytes_in_use);
    vkgdr_pool_destroy(pool);
    vkgdr_close(g);
}

int main(int argc, char **argv)
{
    char *ptx = ptx_argument(argc, argv, "mapping.ptx");
    CUdevice dev = enter_primary_context();
    CUmodule module;
    CUfunction check = load_kernel(ptx, "check_tagged_blocks", &module);
    run(check, 0, 0, "coherent");
    run(check, VKGDR_OPEN_FORCE_NON_COHERENT_BIT, 0, "forced non-coherent");
    run(check, 0, 16, "coherent, thread cache 16");
    cuModuleUnload(module);
    leave_primary_context(dev);
    free(ptx);
    return CHECK_SUMMARY("gpu_pool");
}
