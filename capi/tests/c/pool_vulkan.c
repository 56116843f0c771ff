/* Pools from C over the Vulkan half alone (vkgdr_open_vulkan): runs on Mesa's lavapipe on CI, for
 * coherent memory and with FORCE_NON_COHERENT (every flush and invalidate really issued).
 * Several threads allocate blocks of many sizes and alignments, write them through the host
 * pointer and vkgdr_block_write, flush, read back and free (also blocks of other threads);
 * stats, trim, the byte limit, freed and foreign handles, what a Vulkan-only handle
 * refuses (raw memory, rings, stream-ordered block frees) and its release times (all zero:
 * nothing waits for GPU work). vkgdr_open_vulkan ignores unknown
 * flag bits and clears the last error, as vkgdr 0.1's vkgdr_open does.
 * Usage: pool_vulkan [vulkan_device]  (default -1: the first suitable device). */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "check.h"

#define THREADS 4
#define PER_THREAD 3000

typedef struct {
    vkgdr_pool_t pool;
    int id;
    vkgdr_block_t blocks[PER_THREAD];
    int errors;
} worker;

static unsigned char pattern(int thread, int k, size_t j)
{
    return (unsigned char)(thread * 71 + k * 13 + (int)j * 5 + 1);
}

static size_t block_size(int k) { return (size_t)(1 + (k * 37) % 700); }
static size_t block_align(int k) { return (size_t)1 << (k % 9); }

static void *work(void *arg)
{
    worker *w = arg;
    unsigned char buf[700];
    int k;
    size_t j;
    for (k = 0; k < PER_THREAD; k++) {
        size_t n = block_size(k), align = block_align(k);
        vkgdr_block_t b = vkgdr_pool_alloc(w->pool, n, align);
        unsigned char *p;
        w->blocks[k] = b;
        if (b == NULL) {
            w->errors++;
            continue;
        }
        p = vkgdr_block_get_host_ptr(b);
        w->errors += p == NULL || ((uintptr_t)p % align) != 0;
        w->errors += vkgdr_block_get_size(b) != n || vkgdr_block_get_device_ptr(b) != 0;
        for (j = 0; j < n; j++) {
            buf[j] = pattern(w->id, k, j);
        }
        if (k % 2) {
            /* Raw stores through the host pointer, then flush the written range. */
            memcpy(p, buf, n);
            w->errors += vkgdr_block_flush(b, 0, n) != VKGDR_SUCCESS;
        } else {
            /* The checked write records the range; the pool flush below pushes it. */
            w->errors += vkgdr_block_write(b, 0, buf, n) != VKGDR_SUCCESS;
        }
    }
    w->errors += vkgdr_pool_flush(w->pool) != VKGDR_SUCCESS;
    for (k = 0; k < PER_THREAD; k++) {
        size_t n = block_size(k);
        if (w->blocks[k] == NULL) {
            continue;
        }
        w->errors += vkgdr_block_invalidate(w->blocks[k], 0, n) != VKGDR_SUCCESS;
        w->errors += vkgdr_block_read(w->blocks[k], 0, buf, n) != VKGDR_SUCCESS;
        for (j = 0; j < n; j++) {
            w->errors += buf[j] != pattern(w->id, k, j);
        }
        /* Free the even ones here; the odd ones are freed by another thread. */
        if (k % 2 == 0) {
            vkgdr_block_free(w->blocks[k]);
            w->blocks[k] = NULL;
        }
    }
    return NULL;
}

static void *free_other(void *arg)
{
    worker *w = arg;
    int k;
    for (k = 0; k < PER_THREAD; k++) {
        vkgdr_block_free(w->blocks[k]);
        w->errors += !no_last_error();
    }
    return NULL;
}

static void run(int vulkan_device, uint32_t flags)
{
    static worker workers[THREADS];
    pthread_t threads[THREADS];
    vkgdr_pool_config cfg;
    vkgdr_pool_stats stats;
    vkgdr_t g = vkgdr_open_vulkan(vulkan_device, flags);
    vkgdr_pool_t pool, limited;
    vkgdr_block_t b, big;
    size_t released = 0;
    int i, errors = 0;
    unsigned char byte = 0;

    CHECK(g != NULL, "vkgdr_open_vulkan(%d, %u) failed", vulkan_device, flags);
    if (g == NULL) {
        return;
    }
    CHECK(vkgdr_memory_alloc(g, 4096, 0) == NULL, "raw memory needs CUDA");
    CHECK(last_error_contains("opened with vkgdr_open_vulkan"), "explains");
    CHECK(vkgdr_ring_create(g, 4096, 0) == NULL, "rings need CUDA");
    CHECK(vkgdr_wait_for_releases(g, 0) == 0 && vkgdr_wait_for_releases(g, -1) == 0,
          "nothing waits for GPU work on a Vulkan-only handle");
    {
        size_t released = 99;
        uint64_t each = 1, total = 1;
        CHECK(vkgdr_trim(g, &released) == VKGDR_SUCCESS && released == 0,
              "a Vulkan-only handle keeps nothing to trim: %zu", released);
        CHECK(vkgdr_get_spare_limits(g, &each, &total) == VKGDR_SUCCESS && each == 0 &&
                  total == 0,
              "a Vulkan-only handle keeps no spare mappings: %llu, %llu",
              (unsigned long long)each, (unsigned long long)total);
        CHECK(last_error_contains("vkgdr_ring_create: this vkgdr_t has no CUDA device"),
              "still the ring's error: success leaves it");
        CHECK(vkgdr_set_spare_limits(g, 1 << 20, 2 << 20, &released) == VKGDR_ERROR,
              "no limits to set on a Vulkan-only handle");
        CHECK(last_error_contains("vkgdr_set_spare_limits: this vkgdr_t has no CUDA device"),
              "explains");
    }
    CHECK(vkgdr_d2h_ring_create(g, 1, 64, 64, 100) == NULL, "device -> host rings need CUDA");
    CHECK(last_error_contains("vkgdr_d2h_ring_create: this vkgdr_t has no CUDA device"),
          "explains");
    {
        /* Nothing waits for GPU work: every figure 0 and every name empty, struct_size as the
         * caller set it; an older caller's smaller struct is written only as far as it goes. */
        vkgdr_release_times times, zero;
        memset(&zero, 0, sizeof zero);
        zero.struct_size = sizeof zero;
        memset(&times, 0xAB, sizeof times);
        times.struct_size = sizeof times;
        CHECK(vkgdr_get_release_times(g, &times) == VKGDR_SUCCESS &&
                  memcmp(&times, &zero, sizeof times) == 0,
              "a Vulkan-only handle's release times are all zero: %llu waiting, oldest %llu ns",
              (unsigned long long)times.waiting,
              (unsigned long long)times.oldest_waiting.time_ns);
        memset(&times, 0xAB, sizeof times);
        times.struct_size = offsetof(vkgdr_release_times, oldest_waiting);
        CHECK(vkgdr_get_release_times(g, &times) == VKGDR_SUCCESS && times.waiting == 0 &&
                  times.oldest_waiting.time_ns == 0xABABABABABABABABull,
              "an older caller's struct: written as far as its struct_size");
        CHECK(vkgdr_get_release_times(g, NULL) == VKGDR_ERROR, "release times into NULL");
        CHECK(last_error_contains("vkgdr_get_release_times: the vkgdr_release_times pointer is "
                                  "NULL"),
              "named");
    }
    {
        /* An unknown flag bit is ignored; a successful open clears the last error. */
        vkgdr_t again = vkgdr_open_vulkan(vulkan_device, flags | 0x100);
        CHECK(again != NULL && no_last_error(), "open with bit 0x100, error cleared");
        vkgdr_close(again);
    }

    vkgdr_pool_config_init(&cfg, sizeof cfg);
    cfg.chunk_size = 1 << 20;
    cfg.max_chunk_size = 4 << 20;
    cfg.dedicated_threshold = 256 << 10;
    cfg.shards = 4;
    pool = vkgdr_pool_create(g, &cfg);
    CHECK(pool != NULL, "pool");
    CHECK(vkgdr_pool_is_coherent(pool) == !(flags & VKGDR_OPEN_FORCE_NON_COHERENT_BIT),
          "coherence follows the open flags");

    for (i = 0; i < THREADS; i++) {
        workers[i].pool = pool;
        workers[i].id = i;
        workers[i].errors = 0;
        pthread_create(&threads[i], NULL, work, &workers[i]);
    }
    for (i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
    }
    /* Each thread's remaining blocks are freed by the next thread. */
    for (i = 0; i < THREADS; i++) {
        pthread_create(&threads[i], NULL, free_other, &workers[(i + 1) % THREADS]);
    }
    for (i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
    }
    for (i = 0; i < THREADS; i++) {
        errors += workers[i].errors;
    }
    CHECK(errors == 0, "%d errors in the worker threads", errors);

    stats.struct_size = sizeof stats;
    CHECK(vkgdr_pool_get_stats(pool, &stats) == VKGDR_SUCCESS, "stats");
    CHECK(stats.bytes_in_use == 0 && stats.chunks >= 1 && stats.bytes_reserved >= (1 << 20),
          "after freeing everything: in use %llu, chunks %llu, reserved %llu",
          (unsigned long long)stats.bytes_in_use, (unsigned long long)stats.chunks,
          (unsigned long long)stats.bytes_reserved);
    CHECK(vkgdr_pool_trim(pool, &released) == VKGDR_SUCCESS && released >= 1, "trim");
    vkgdr_pool_get_stats(pool, &stats);
    CHECK(stats.bytes_reserved == 0, "trim returned every chunk: %llu",
          (unsigned long long)stats.bytes_reserved);

    /* No GPU work can use a Vulkan-only pool's blocks: a stream-ordered free is refused and
     * leaves the block with the caller; so does a bad pool handle. */
    b = vkgdr_pool_alloc(pool, 100, 64);
    CHECK(vkgdr_block_free_after(b, pool, (CUstream)(uintptr_t)0x1234) == VKGDR_ERROR,
          "free_after on a Vulkan-only pool");
    CHECK(last_error_contains("vkgdr_block_free_after: the pool has no CUDA device"), "why");
    CHECK(vkgdr_block_free_after(b, NULL, NULL) == VKGDR_ERROR, "free_after, NULL pool");
    CHECK(last_error_contains("vkgdr_block_free_after: the vkgdr_pool_t handle is NULL"), "why");
    CHECK(vkgdr_block_free_after(b, (vkgdr_pool_t)b, NULL) == VKGDR_ERROR, "block as pool");
    CHECK(last_error_contains("invalid vkgdr_pool_t handle"), "why");
    CHECK(vkgdr_block_get_size(b) == 100, "the block is still there");

    /* Device-side release needs a release feed (a device -> host ring, which needs CUDA): a
     * block of a pool without one is refused and freed (the handle is consumed), a NULL token
     * pointer or a bad handle consumes nothing. */
    {
        vkgdr_block_t lent = vkgdr_pool_alloc(pool, 64, 16);
        uint64_t token = 77;
        CHECK(vkgdr_block_release_on_device(lent, NULL) == VKGDR_ERROR, "NULL token pointer");
        CHECK(last_error_contains("vkgdr_block_release_on_device: the token pointer is NULL"),
              "why");
        CHECK(vkgdr_block_get_size(lent) == 64, "nothing consumed");
        CHECK(vkgdr_block_release_on_device((vkgdr_block_t)pool, &token) == VKGDR_ERROR,
              "a pool as a block");
        CHECK(last_error_contains("invalid vkgdr_block_t handle"), "why");
        CHECK(vkgdr_block_release_on_device(lent, &token) == VKGDR_ERROR && token == 77,
              "no release feed");
        CHECK(last_error_contains("the pool has no release feed"), "why");
        CHECK(vkgdr_block_get_size(lent) == 0, "the refused block was freed");
        CHECK(last_error_contains("invalid vkgdr_block_t handle"), "consumed");
        CHECK(vkgdr_pool_get_lent_blocks(pool) == 0, "nothing lent");
        /* The batch form: a refused batch gives every block back under a new handle. */
        {
            vkgdr_block_t many[3];
            uint64_t toks[3] = {7, 7, 7};
            size_t lent_n = 99;
            for (int i = 0; i < 3; i++) {
                many[i] = vkgdr_pool_alloc(pool, 64, 16);
            }
            CHECK(vkgdr_pool_release_many_on_device(pool, many, 3, toks, NULL) == VKGDR_ERROR,
                  "NULL lent pointer");
            CHECK(vkgdr_pool_release_many_on_device(pool, many, 0, NULL, &lent_n) ==
                          VKGDR_SUCCESS &&
                      lent_n == 0,
                  "an empty batch");
            vkgdr_block_t twice[2] = {many[0], many[0]};
            CHECK(vkgdr_pool_release_many_on_device(pool, twice, 2, toks, &lent_n) ==
                          VKGDR_ERROR &&
                      lent_n == 0,
                  "a handle given twice");
            CHECK(last_error_contains("blocks[1] is a handle given twice"), "why");
            many[0] = twice[0]; /* its new handle */
            CHECK(vkgdr_block_get_size(many[0]) == 64, "given back");
            vkgdr_block_t bad[2] = {many[1], (vkgdr_block_t)pool};
            CHECK(vkgdr_pool_release_many_on_device(pool, bad, 2, toks, &lent_n) ==
                          VKGDR_ERROR &&
                      lent_n == 0 && bad[0] == many[1],
                  "a bad handle consumes nothing");
            CHECK(last_error_contains("blocks[1]: invalid vkgdr_block_t handle"), "why");
            vkgdr_block_t old0 = many[0];
            CHECK(vkgdr_pool_release_many_on_device(pool, many, 3, toks, &lent_n) ==
                          VKGDR_ERROR &&
                      lent_n == 0 && toks[0] == 7,
                  "no release feed: nothing lent");
            CHECK(last_error_contains("0 of 3 blocks lent; blocks[0] and after not: the pool "
                                      "has no release feed"),
                  "why");
            CHECK(vkgdr_block_get_size(old0) == 0, "the old handle is gone");
            for (int i = 0; i < 3; i++) {
                CHECK(vkgdr_block_get_size(many[i]) == 64, "each block is the caller's");
                vkgdr_block_free(many[i]);
            }
        }
        CHECK(vkgdr_pool_drain_device_releases(pool) == 0, "nothing to drain");
        CHECK(vkgdr_pool_reclaim_device_releases(pool) == 0, "nothing to reclaim");
        stats.struct_size = sizeof stats;
        CHECK(vkgdr_pool_get_stats(pool, &stats) == VKGDR_SUCCESS && stats.lent_blocks == 0 &&
                  stats.tokens_issued == 0 && stats.tokens_refused == 0 &&
                  stats.release_lane_broken == 0,
              "no release counted");
    }

    /* A freed block is an error, not a crash, also after its slot is reused. */
    mark_last_error();
    vkgdr_block_free(b);
    CHECK(still_marked(), "free");
    vkgdr_block_free(b);
    CHECK(last_error_contains("vkgdr_block_free: invalid vkgdr_block_t handle"), "double free");
    big = vkgdr_pool_alloc(pool, 300 << 10, 4096); /* dedicated chunk */
    CHECK(big != NULL && vkgdr_block_get_host_ptr(b) == NULL, "use after free caught");
    CHECK(last_error_contains("already freed"), "explains");
    CHECK(vkgdr_block_write(big, (300 << 10) - 1, &byte, 2) == VKGDR_ERROR, "past the end");
    CHECK(last_error_contains("outside the 307200-byte"), "explains");
    CHECK(vkgdr_block_flush(big, 0, 300 << 10) == VKGDR_SUCCESS, "whole-block flush");
    stats.struct_size = sizeof stats;
    vkgdr_pool_get_stats(pool, &stats);
    CHECK(stats.dedicated_chunks == 1, "dedicated");

    /* Bad requests. */
    CHECK(vkgdr_pool_alloc(pool, 0, 16) == NULL, "zero size");
    CHECK(last_error_contains("size is zero"), "explains");
    CHECK(vkgdr_pool_alloc(pool, 64, 24) == NULL, "alignment 24");
    CHECK(last_error_contains("not a power of two"), "explains");

    /* Blocks outlive their pool handle; the device outlives its handle while pools use it. */
    mark_last_error();
    vkgdr_pool_destroy(pool);
    vkgdr_close(g);
    CHECK(still_marked(), "close with a live block");
    CHECK(vkgdr_block_write(big, 0, &byte, 1) == VKGDR_SUCCESS, "block after pool destroy");
    CHECK(vkgdr_pool_alloc(pool, 64, 16) == NULL, "destroyed pool");
    CHECK(last_error_contains("invalid vkgdr_pool_t handle"), "explains");
    mark_last_error();
    vkgdr_block_free(big);
    CHECK(still_marked(), "last block frees the pool");

    /* A byte limit. */
    g = vkgdr_open_vulkan(vulkan_device, flags);
    vkgdr_pool_config_init(&cfg, sizeof cfg);
    cfg.chunk_size = 1 << 20;
    cfg.max_chunk_size = 1 << 20;
    cfg.max_bytes = 1 << 20;
    cfg.shards = 1;
    limited = vkgdr_pool_create(g, &cfg);
    b = vkgdr_pool_alloc(limited, 1000, 16);
    CHECK(b != NULL, "within the limit");
    CHECK(vkgdr_pool_alloc(limited, 1 << 20, 16) == NULL, "beyond max_bytes");
    CHECK(last_error_contains("pool limit"), "explains");
    CHECK(vkgdr_pool_alloc(limited, 64, 256 << 10) == NULL, "alignment above max_align");
    CHECK(last_error_contains("exceeds the pool's maximum"), "explains");
    mark_last_error();
    vkgdr_block_free(b);
    vkgdr_pool_destroy(limited);

    /* The fields appended to the structs later: max_align raises the largest alignment, and the
     * stats count what the thread caches keep. */
    vkgdr_pool_config_init(&cfg, sizeof cfg);
    CHECK(cfg.max_align == 64 << 10 && cfg.thread_cache_bytes == 256 << 10, "their defaults");
    cfg.chunk_size = 1 << 20;
    cfg.max_chunk_size = 1 << 20;
    cfg.shards = 1;
    cfg.max_align = 256 << 10;
    pool = vkgdr_pool_create(g, &cfg);
    b = vkgdr_pool_alloc(pool, 64, 256 << 10);
    CHECK(b != NULL, "alignment 256 KiB with max_align 256 KiB");
    vkgdr_block_free(b);
    stats.struct_size = sizeof stats;
    CHECK(vkgdr_pool_get_stats(pool, &stats) == VKGDR_SUCCESS, "stats");
    CHECK(stats.blocks_cached == 1 && stats.bytes_cached >= 64 && stats.bytes_in_use == 0,
          "the freed block waits in this thread's cache: %llu blocks, %llu bytes",
          (unsigned long long)stats.blocks_cached, (unsigned long long)stats.bytes_cached);
    CHECK(stats.thread_cache_handshake == VKGDR_THREAD_CACHE_MEMBARRIER ||
              stats.thread_cache_handshake == VKGDR_THREAD_CACHE_FENCE,
          "a pool with a thread cache says how other threads reach it: %u",
          stats.thread_cache_handshake);
    vkgdr_pool_destroy(pool);
    cfg.thread_cache = 0;
    pool = vkgdr_pool_create(g, &cfg);
    stats.struct_size = sizeof stats;
    CHECK(vkgdr_pool_get_stats(pool, &stats) == VKGDR_SUCCESS &&
              stats.thread_cache_handshake == VKGDR_THREAD_CACHE_OFF,
          "without a thread cache: off (%u)", stats.thread_cache_handshake);
    vkgdr_pool_destroy(pool);
    vkgdr_close(g);
    CHECK(still_marked(), "clean teardown");
}

int main(int argc, char **argv)
{
    int device = argc > 1 ? atoi(argv[1]) : -1;
    run(device, 0);
    run(device, VKGDR_OPEN_FORCE_NON_COHERENT_BIT);
    return CHECK_SUMMARY("pool_vulkan");
}
