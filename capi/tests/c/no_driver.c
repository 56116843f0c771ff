/* The C API on a machine without the NVIDIA driver (CI), also meaningful with one:
 * - vkgdr_open fails with NULL and a message naming the missing libcuda.so.1 (with the driver
 *   present: device -1 is CUDA_ERROR_INVALID_DEVICE); unknown flag bits are ignored, as in
 *   vkgdr 0.1;
 * - every kind of bad handle (NULL, made-up, of another type) is an error, never a crash;
 *   destructors ignore NULL; the stream-ordered frees and the release figures check their
 *   handles (and vkgdr_get_release_times its struct, before the handle);
 * - vkgdr 0.1's last-error rule: a successful call leaves the last error alone, the next
 *   vkgdr_open or vkgdr_memory_alloc replaces it;
 * - the copy helpers, on host memory at odd offsets and lengths;
 * - versioned structs: unset or unknown-field sizes are refused;
 * - ring options are checked before the device handle (bad flags and combinations of them,
 *   lanes, copy-engine sizes), and the producer and lane calls check their handles;
 * - device -> host rings: the shape before the device, every call's handle. */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "check.h"

static void open_without_driver(void)
{
    void *cuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    vkgdr_t g = vkgdr_open(0, 0);
    if (cuda == NULL) {
        CHECK(g == NULL, "vkgdr_open succeeded without libcuda.so.1");
        CHECK(last_error_contains("libcuda.so.1"), "message names the library");
        g = vkgdr_open(0, VKGDR_OPEN_CURRENT_CONTEXT_BIT);
        CHECK(g == NULL, "CURRENT_CONTEXT open succeeded without a driver");
        CHECK(last_error_contains("libcuda.so.1"), "message names the library");
    } else {
        printf("libcuda.so.1 is present here: checking device -1 instead\n");
        vkgdr_close(g);
        dlclose(cuda);
        g = vkgdr_open(-1, 0);
        CHECK(g == NULL, "device -1 opened");
        CHECK(last_error_contains("CUDA_ERROR_INVALID_DEVICE"), "result name");
    }
    /* Unknown flag bits are ignored, as vkgdr 0.1 ignores them: vkgdr_open(0, 8) is
     * vkgdr_open(0, 0). */
    g = vkgdr_open(0, 8);
    if (cuda == NULL) {
        CHECK(g == NULL && last_error_contains("libcuda.so.1"), "flag bit 8: still the driver");
        g = vkgdr_open(0, 0xfffffff8u);
        CHECK(g == NULL && last_error_contains("libcuda.so.1"), "every unknown bit");
    } else {
        CHECK(g != NULL && no_last_error(), "flag bit 8 is ignored");
        vkgdr_close(g);
    }
    CHECK(vkgdr_open_vulkan(0, VKGDR_OPEN_CURRENT_CONTEXT_BIT) == NULL, "vulkan + context");
    CHECK(last_error_contains("VKGDR_OPEN_CURRENT_CONTEXT_BIT needs CUDA"), "explains");
}

static void bad_handles(void)
{
    /* Tokens nobody handed out, and NULL: errors with the function and type named. */
    vkgdr_t made_up = (vkgdr_t)(uintptr_t)0x123456789ull;
    vkgdr_memory_t mem = (vkgdr_memory_t)(uintptr_t)0x2000000000000001ull;
    char buf[16] = {0};
    size_t released = 99;
    vkgdr_pool_stats stats;

    CHECK(vkgdr_memory_alloc(NULL, 4096, 0) == NULL, "alloc on NULL");
    CHECK(last_error_contains("vkgdr_memory_alloc: the vkgdr_t handle is NULL"), "NULL named");
    CHECK(vkgdr_memory_alloc(made_up, 4096, 0) == NULL, "alloc on a made-up handle");
    CHECK(last_error_contains("invalid vkgdr_t handle"), "invalid named");
    CHECK(vkgdr_memory_get_host_ptr(mem) == NULL, "host ptr of a made-up handle");
    CHECK(last_error_contains("vkgdr_memory_get_host_ptr: invalid vkgdr_memory_t"), "named");
    CHECK(vkgdr_memory_get_device_ptr(mem) == 0, "device ptr");
    CHECK(vkgdr_memory_get_size(NULL) == 0, "size of NULL");
    CHECK(last_error_contains("vkgdr_memory_get_size"), "named");
    CHECK(!vkgdr_memory_is_coherent(NULL), "coherent of NULL");
    CHECK(vkgdr_memory_non_coherent_atom_size(NULL) == 0, "atom of NULL");
    vkgdr_memory_flush(mem, 0, 1);
    CHECK(last_error_contains("vkgdr_memory_flush: invalid vkgdr_memory_t"), "flush reports");
    vkgdr_memory_invalidate(NULL, 0, 1);
    CHECK(last_error_contains("vkgdr_memory_invalidate"), "invalidate reports");
    CHECK(vkgdr_memory_write(NULL, 0, buf, 1) == VKGDR_ERROR, "write to NULL");
    CHECK(vkgdr_memory_read(mem, 0, buf, 1) == VKGDR_ERROR, "read from made-up");

    /* A handle of one type passed as another (a cast away from the C types). */
    CHECK(vkgdr_pool_alloc((vkgdr_pool_t)made_up, 64, 16) == NULL, "device as pool");
    CHECK(last_error_contains("invalid vkgdr_pool_t handle"), "type checked");
    CHECK(vkgdr_block_get_size((vkgdr_block_t)mem) == 0, "memory as block");
    CHECK(last_error_contains("invalid vkgdr_block_t handle"), "type checked");
    CHECK(vkgdr_pool_create(NULL, NULL) == NULL, "pool of NULL");
    CHECK(vkgdr_pool_flush(NULL) == VKGDR_ERROR, "flush NULL pool");
    CHECK(vkgdr_pool_trim(NULL, &released) == VKGDR_ERROR && released == 99, "trim NULL pool");
    stats.struct_size = sizeof stats;
    CHECK(vkgdr_pool_get_stats(NULL, &stats) == VKGDR_ERROR, "stats of NULL pool");
    CHECK(vkgdr_block_flush(NULL, 0, 1) == VKGDR_ERROR, "flush NULL block");
    CHECK(vkgdr_block_write(NULL, 0, buf, 1) == VKGDR_ERROR, "write NULL block");
    CHECK(vkgdr_ring_create(NULL, 4096, 0) == NULL, "ring of NULL");
    CHECK(vkgdr_ring_push(NULL, buf, 1, 0, NULL) == VKGDR_ERROR, "push to NULL ring");
    CHECK(vkgdr_ring_get_head(NULL) == UINT64_MAX, "head of NULL ring");

    /* Destructors: NULL is a no-op (and a success), a made-up handle an error. */
    mark_last_error();
    vkgdr_close(NULL);
    CHECK(still_marked(), "vkgdr_close(NULL) is a no-op");
    vkgdr_memory_free(NULL);
    vkgdr_memory_free_now(NULL);
    vkgdr_pool_destroy(NULL);
    vkgdr_block_free(NULL);
    vkgdr_ring_destroy(NULL);
    CHECK(still_marked(), "NULL destructors are no-ops");
    vkgdr_memory_free(mem);
    CHECK(last_error_contains("vkgdr_memory_free: invalid vkgdr_memory_t handle"), "reported");
    vkgdr_close(made_up);
    CHECK(last_error_contains("vkgdr_close: invalid vkgdr_t handle"), "reported");
}

/* vkgdr 0.1's rule: the last error is that of the last failing call; a successful call leaves
 * it (0.1's header: "the error (if any) from the previous call to vkgdr_open or
 * vkgdr_memory_alloc"), and vkgdr_open and vkgdr_memory_alloc clear it before they start. */
static void last_error_survives_successful_calls(void)
{
    vkgdr_t made_up = (vkgdr_t)(uintptr_t)0x123456789ull;
    vkgdr_pool_config cfg;
    char a[8] = "abcdefg", b[8] = {0};
    vkgdr_close(made_up);
    CHECK(last_error_contains("vkgdr_close: invalid vkgdr_t handle"), "an error");
    CHECK(last_error_contains("vkgdr_close: invalid vkgdr_t handle"), "reading does not clear");
    vkgdr_close(NULL);
    vkgdr_memory_free(NULL);
    CHECK(vkgdr_pool_config_init(&cfg, sizeof cfg) == VKGDR_SUCCESS, "a successful call");
    CHECK(vkgdr_copy_to_mapping(b, a, sizeof a) == VKGDR_SUCCESS && b[6] == 'g', "another");
    CHECK(vkgdr_memory_free_after(NULL, NULL) == VKGDR_SUCCESS, "and another");
    CHECK(last_error_contains("vkgdr_close: invalid vkgdr_t handle"),
          "successful calls leave the last error, as in vkgdr 0.1");
    CHECK(vkgdr_memory_alloc(NULL, 4096, 0) == NULL, "alloc on NULL");
    CHECK(last_error_contains("vkgdr_memory_alloc: the vkgdr_t handle is NULL"),
          "the next vkgdr_memory_alloc replaces it");
    /* (That a successful vkgdr_open_vulkan, vkgdr_open or vkgdr_memory_alloc leaves no error is
     * checked where they can succeed: pool_vulkan.c, compat_v0_1.c and the GPU programs.) */
}

/* The stream-ordered frees and their companions: NULL handles are no-ops (a success), bad ones
 * errors naming the function and type, whatever the stream. */
static void stream_ordered_frees(void)
{
    vkgdr_memory_t mem = (vkgdr_memory_t)(uintptr_t)0x2000000000000001ull;
    vkgdr_block_t block = (vkgdr_block_t)(uintptr_t)0x123456789ull;
    vkgdr_pool_t pool = (vkgdr_pool_t)(uintptr_t)0x123456789ull;
    vkgdr_ring_t ring = (vkgdr_ring_t)(uintptr_t)0x123456789ull;
    CUstream stream = (CUstream)(uintptr_t)0x1234;
    vkgdr_release_times times;

    mark_last_error();
    CHECK(vkgdr_memory_free_after(NULL, stream) == VKGDR_SUCCESS, "free_after of NULL");
    CHECK(vkgdr_memory_free_after(NULL, NULL) == VKGDR_SUCCESS, "free_after of NULL, NULL");
    vkgdr_memory_free_now(NULL);
    CHECK(vkgdr_block_free_after(NULL, pool, stream) == VKGDR_SUCCESS, "block NULL");
    CHECK(vkgdr_block_free_after(NULL, NULL, NULL) == VKGDR_SUCCESS, "all NULL");
    CHECK(still_marked(), "NULL handles are no-ops");

    CHECK(vkgdr_memory_free_after(mem, stream) == VKGDR_ERROR, "made-up memory");
    CHECK(last_error_contains("vkgdr_memory_free_after: invalid vkgdr_memory_t handle"),
          "named");
    mark_last_error();
    CHECK(vkgdr_memory_free_after(mem, NULL) == VKGDR_ERROR, "made-up memory, NULL stream");
    CHECK(last_error_contains("vkgdr_memory_free_after: invalid vkgdr_memory_t"), "named");
    mark_last_error();
    vkgdr_memory_free_now(mem);
    CHECK(last_error_contains("vkgdr_memory_free_now: invalid vkgdr_memory_t handle"), "named");
    mark_last_error();
    vkgdr_memory_free_now((vkgdr_memory_t)block);
    CHECK(last_error_contains("vkgdr_memory_free_now: invalid vkgdr_memory_t"), "type checked");

    CHECK(vkgdr_block_free_after(block, pool, stream) == VKGDR_ERROR, "made-up block");
    CHECK(last_error_contains("vkgdr_block_free_after: invalid vkgdr_block_t handle"), "named");
    CHECK(vkgdr_block_free_after((vkgdr_block_t)mem, NULL, NULL) == VKGDR_ERROR, "memory");
    CHECK(last_error_contains("invalid vkgdr_block_t handle"), "type checked");

    CHECK(vkgdr_ring_watch_consumer(NULL, stream) == VKGDR_ERROR, "watch on NULL");
    CHECK(last_error_contains("vkgdr_ring_watch_consumer: the vkgdr_ring_t handle is NULL"),
          "named");
    CHECK(vkgdr_ring_watch_consumer(ring, NULL) == VKGDR_ERROR, "watch on a made-up ring");
    CHECK(last_error_contains("vkgdr_ring_watch_consumer: invalid vkgdr_ring_t handle"),
          "named");

    CHECK(vkgdr_wait_for_releases(NULL, 0) == SIZE_MAX, "releases of NULL");
    CHECK(last_error_contains("vkgdr_wait_for_releases: the vkgdr_t handle is NULL"), "named");
    /* A bad handle is refused before any waiting, also with no time limit. */
    CHECK(vkgdr_wait_for_releases((vkgdr_t)pool, -1) == SIZE_MAX, "releases of a made-up");
    CHECK(last_error_contains("invalid vkgdr_t handle"), "named");
    CHECK(vkgdr_trim(NULL, NULL) == VKGDR_ERROR, "trim of NULL");
    CHECK(last_error_contains("vkgdr_trim: the vkgdr_t handle is NULL"), "named");
    {
        uint64_t each = 7, total = 7;
        CHECK(vkgdr_get_spare_limits(NULL, &each, &total) == VKGDR_ERROR && each == 7 &&
                  total == 7,
              "spare limits of NULL, nothing written");
        CHECK(last_error_contains("vkgdr_get_spare_limits: the vkgdr_t handle is NULL"), "named");
        CHECK(vkgdr_get_spare_limits((vkgdr_t)pool, NULL, NULL) == VKGDR_ERROR,
              "spare limits of a made-up handle");
        CHECK(last_error_contains("vkgdr_get_spare_limits: invalid vkgdr_t handle"), "named");
        CHECK(vkgdr_set_spare_limits(NULL, 0, 0, NULL) == VKGDR_ERROR, "set on NULL");
        CHECK(last_error_contains("vkgdr_set_spare_limits: the vkgdr_t handle is NULL"), "named");
    }

    /* The struct is checked first, then the handle; nothing is written on error. */
    memset(&times, 0xAB, sizeof times);
    times.struct_size = sizeof times;
    CHECK(vkgdr_get_release_times(NULL, NULL) == VKGDR_ERROR, "release times into NULL");
    CHECK(last_error_contains("vkgdr_get_release_times: the vkgdr_release_times pointer is NULL"),
          "named");
    CHECK(vkgdr_get_release_times(NULL, &times) == VKGDR_ERROR, "release times of NULL");
    CHECK(last_error_contains("vkgdr_get_release_times: the vkgdr_t handle is NULL"), "named");
    CHECK(vkgdr_get_release_times((vkgdr_t)pool, &times) == VKGDR_ERROR, "of a made-up handle");
    CHECK(last_error_contains("vkgdr_get_release_times: invalid vkgdr_t handle"), "named");
    CHECK(times.waiting == 0xABABABABABABABABull && times.longest_wait.what[0] == (char)0xAB,
          "nothing written on error");
    times.struct_size = 0;
    CHECK(vkgdr_get_release_times(NULL, &times) == VKGDR_ERROR, "unset struct_size");
    CHECK(last_error_contains("vkgdr_release_times.struct_size is 0"), "explains");
}

static void copies(void)
{
    /* Host memory stands in for the mapping: every offset pair, lengths around vector widths. */
    static const size_t offsets[] = {0, 1, 2, 3, 4, 5, 6, 7, 11, 129, 1023};
    static const size_t lengths[] = {0, 1, 7, 15, 16, 31, 33, 63, 64, 65, 200, 4097};
    unsigned char *src = malloc(8192), *dst = malloc(8192);
    size_t a, b, l, i;
    int bad = 0;
    for (i = 0; i < 8192; i++) {
        src[i] = (unsigned char)(i * 7 + 3);
    }
    for (a = 0; a < sizeof offsets / sizeof *offsets; a++) {
        for (b = 0; b < sizeof offsets / sizeof *offsets; b++) {
            for (l = 0; l < sizeof lengths / sizeof *lengths; l++) {
                size_t n = lengths[l], so = offsets[a], d = offsets[b];
                memset(dst, 0xEE, 8192);
                if (vkgdr_copy_to_mapping(dst + d, src + so, n) != VKGDR_SUCCESS) {
                    bad++;
                    continue;
                }
                bad += memcmp(dst + d, src + so, n) != 0;
                bad += d > 0 && dst[d - 1] != 0xEE; /* nothing before */
                bad += dst[d + n] != 0xEE;          /* nothing after */
                memset(dst, 0, 8192);
                bad += vkgdr_copy_from_mapping(dst + d, src + so, n) != VKGDR_SUCCESS;
                bad += memcmp(dst + d, src + so, n) != 0;
                bad += dst[d + n] != 0;
            }
        }
    }
    CHECK(bad == 0, "%d copy mismatches", bad);
    CHECK(no_last_error(), "successful copies set no error");
    CHECK(vkgdr_copy_to_mapping(NULL, src, 1) == VKGDR_ERROR, "NULL destination");
    CHECK(last_error_contains("vkgdr_copy_to_mapping: the mapping pointer is NULL"), "named");
    CHECK(vkgdr_copy_from_mapping(dst, NULL, 1) == VKGDR_ERROR, "NULL source");
    CHECK(vkgdr_copy_to_mapping(NULL, NULL, 0) == VKGDR_SUCCESS, "empty copy of NULLs");
    free(src);
    free(dst);
}

static void *run_copies(void *arg)
{
    (void)arg;
    copies();
    return NULL;
}

/* copies() checks that no call failed: on a new thread, whose last error starts empty. */
static void copies_in_a_fresh_thread(void)
{
    pthread_t t;
    pthread_create(&t, NULL, run_copies, NULL);
    pthread_join(t, NULL);
}

static void versioned_structs(void)
{
    struct {
        vkgdr_pool_config known;
        uint64_t future_field;
    } bigger;
    vkgdr_pool_config cfg;
    memset(&cfg, 0xAB, sizeof cfg);
    CHECK(vkgdr_pool_config_init(&cfg, sizeof cfg) == VKGDR_SUCCESS, "init");
    CHECK(cfg.struct_size == sizeof cfg && cfg.chunk_size == 16u << 20 && cfg.flags == 0 &&
              cfg.max_bytes == UINT64_MAX && cfg.thread_cache == 32 && cfg.shards >= 1,
          "defaults");
    CHECK(vkgdr_pool_config_init(NULL, sizeof cfg) == VKGDR_ERROR, "NULL config");
    /* An older caller's smaller struct: only its bytes are written. */
    memset(&cfg, 0xAB, sizeof cfg);
    CHECK(vkgdr_pool_config_init(&cfg, 16) == VKGDR_SUCCESS, "older size");
    CHECK(cfg.struct_size == 16 && cfg.chunk_size == 16u << 20 && cfg.max_chunk_size ==
              0xABABABABABABABABull, "wrote past the caller's struct");
    /* A caller built before thread_cache_bytes and max_align were appended: what follows its
     * struct is neither written nor read. */
    memset(&cfg, 0xAB, sizeof cfg);
    CHECK(vkgdr_pool_config_init(&cfg, offsetof(vkgdr_pool_config, thread_cache_bytes)) ==
              VKGDR_SUCCESS && cfg.flags == 0 && cfg.max_align == 0xABABABABABABABABull,
          "a struct without the appended fields");
    CHECK(vkgdr_pool_create(NULL, &cfg) == NULL, "old size");
    CHECK(last_error_contains("the vkgdr_t handle is NULL"), "got past the config");
    /* Checked before the device: an unset size, a newer caller's unknown field. */
    cfg.struct_size = 0;
    CHECK(vkgdr_pool_create(NULL, &cfg) == NULL, "unset size");
    CHECK(last_error_contains("struct_size is 0"), "explains");
    memset(&bigger, 0, sizeof bigger);
    vkgdr_pool_config_init(&bigger.known, sizeof bigger);
    bigger.future_field = 1;
    CHECK(vkgdr_pool_create(NULL, &bigger.known) == NULL, "unknown field set");
    CHECK(last_error_contains("fields this library version does not know"), "explains");
    bigger.future_field = 0;
    CHECK(vkgdr_pool_create(NULL, &bigger.known) == NULL, "NULL device");
    CHECK(last_error_contains("the vkgdr_t handle is NULL"), "got past the config");
    vkgdr_pool_config_init(&cfg, sizeof cfg);
    cfg.flags = 1;
    CHECK(vkgdr_pool_create(NULL, &cfg) == NULL, "flags");
    CHECK(last_error_contains("flags must be 0"), "explains");
}

/* Ring options and producers: everything a ring or producer call can check without a device. */
static void ring_options_and_producers(void)
{
    vkgdr_ring_producer_t made_up = (vkgdr_ring_producer_t)(uintptr_t)0x123456789ull;
    vkgdr_ring_t ring = (vkgdr_ring_t)(uintptr_t)0x123456789ull;
    vkgdr_ring_options opts;
    vkgdr_ring_copy_engine_stats stats;
    struct {
        vkgdr_ring_options known;
        uint64_t future_field;
    } bigger;
    vkgdr_ring_device_view view;
    unsigned char buf[32] = {0};
    const void *ptrs[1] = {buf};
    size_t sizes[1] = {sizeof buf}, written = 99;
    uint64_t seq = 7, words[8];

    memset(&opts, 0xAB, sizeof opts);
    CHECK(vkgdr_ring_options_init(&opts, sizeof opts) == VKGDR_SUCCESS, "ring options init");
    CHECK(opts.struct_size == sizeof opts && opts.lanes == 1 && opts.flags == 0 &&
              opts.copy_engine_record == 0,
          "ring option defaults");
    CHECK(vkgdr_ring_options_init(NULL, sizeof opts) == VKGDR_ERROR, "NULL options");
    CHECK(vkgdr_ring_options_init(&opts, 4) == VKGDR_ERROR, "struct_size too small");
    /* Valid options get as far as the device handle. */
    vkgdr_ring_options_init(&opts, sizeof opts);
    opts.lanes = 64;
    opts.copy_engine_record = 0;
    opts.flags = VKGDR_RING_MIRRORED_BIT;
    CHECK(vkgdr_ring_create_with_options(NULL, 4096, &opts) == NULL, "NULL device");
    CHECK(last_error_contains("vkgdr_ring_create_with_options: the vkgdr_t handle is NULL"),
          "got past the options");
    CHECK(vkgdr_ring_create_with_options(NULL, 4096, NULL) == NULL, "NULL device, defaults");
    CHECK(last_error_contains("the vkgdr_t handle is NULL"), "NULL options are the defaults");
    /* Bad ones are refused before it. */
    opts.lanes = 0;
    CHECK(vkgdr_ring_create_with_options(NULL, 4096, &opts) == NULL, "0 lanes");
    CHECK(last_error_contains("a ring has 1 to 64 lanes, not 0"), "explains");
    opts.lanes = 65;
    CHECK(vkgdr_ring_create_with_options(NULL, 4096, &opts) == NULL, "65 lanes");
    CHECK(last_error_contains("1 to 64 lanes, not 65"), "explains");
    opts.lanes = 2;
    opts.flags = 0x30 | VKGDR_RING_SHAREABLE_BIT;
    CHECK(vkgdr_ring_create_with_options(NULL, 4096, &opts) == NULL, "unknown flags");
    CHECK(last_error_contains("unknown ring flag bits 0x30"), "explains");
    opts.flags = VKGDR_RING_SHAREABLE_BIT | VKGDR_RING_MIRRORED_BIT;
    CHECK(vkgdr_ring_create_with_options(NULL, 4096, &opts) == NULL, "shareable and mirrored");
    CHECK(last_error_contains("a shareable ring is padded"), "explains");
    CHECK(vkgdr_ring_create(NULL, 4096, 3) == NULL, "shareable and mirrored, no options");
    CHECK(last_error_contains("vkgdr_ring_create: a shareable ring is padded"), "explains");
    opts.flags = VKGDR_RING_SHAREABLE_BIT;
    opts.copy_engine_record = 4096;
    CHECK(vkgdr_ring_create_with_options(NULL, 4096, &opts) == NULL, "shareable, copy engine");
    CHECK(last_error_contains("a shareable ring has no copy engine"), "explains");
    opts.copy_engine_record = 0;
    CHECK(vkgdr_ring_create_with_options(NULL, 4096, &opts) == NULL, "shareable");
    CHECK(last_error_contains("the vkgdr_t handle is NULL"), "got past the options");
    /* The split between the BAR and the copy engine: a record size, and no shareable ring. */
    CHECK(VKGDR_RING_COPY_ENGINE_SPLIT_BIT == 4, "the next free flag bit");
    opts.flags = VKGDR_RING_COPY_ENGINE_SPLIT_BIT;
    opts.copy_engine_record = 0;
    CHECK(vkgdr_ring_create_with_options(NULL, 4096, &opts) == NULL, "split, no record size");
    CHECK(last_error_contains("vkgdr_ring_create_with_options: VKGDR_RING_COPY_ENGINE_SPLIT_BIT "
                              "needs a copy_engine_record"),
          "explains");
    CHECK(vkgdr_ring_create(NULL, 4096, VKGDR_RING_COPY_ENGINE_SPLIT_BIT) == NULL,
          "split, no options");
    CHECK(last_error_contains("vkgdr_ring_create: VKGDR_RING_COPY_ENGINE_SPLIT_BIT needs a "
                              "copy_engine_record"),
          "explains");
    opts.flags = VKGDR_RING_COPY_ENGINE_SPLIT_BIT | VKGDR_RING_SHAREABLE_BIT;
    opts.copy_engine_record = 4096;
    CHECK(vkgdr_ring_create_with_options(NULL, 4096, &opts) == NULL, "split and shareable");
    CHECK(last_error_contains("VKGDR_RING_SHAREABLE_BIT does not go with "
                              "VKGDR_RING_COPY_ENGINE_SPLIT_BIT"),
          "explains");
    opts.flags = VKGDR_RING_COPY_ENGINE_SPLIT_BIT;
    CHECK(vkgdr_ring_create_with_options(NULL, 4096, &opts) == NULL, "split");
    CHECK(last_error_contains("vkgdr_ring_create_with_options: the vkgdr_t handle is NULL"),
          "got past the options");
    opts.flags = VKGDR_RING_COPY_ENGINE_SPLIT_BIT | VKGDR_RING_MIRRORED_BIT;
    opts.copy_engine_record = 1024;
    CHECK(vkgdr_ring_create_with_options(NULL, 2 << 20, &opts) == NULL, "split, mirrored");
    CHECK(last_error_contains("the vkgdr_t handle is NULL"), "got past the options");
    opts.flags = VKGDR_RING_COPY_ENGINE_SPLIT_BIT;
    opts.copy_engine_record = 1ull << 32;
    CHECK(vkgdr_ring_create_with_options(NULL, 4096, &opts) == NULL, "split, record size");
    CHECK(last_error_contains("copy_engine_record 4294967296 is larger than UINT32_MAX"),
          "explains");
    /* The copy engine kept off: alone it is valid, with a record size or a split it is not. */
    CHECK(VKGDR_RING_COPY_ENGINE_OFF_BIT == 8, "the next free flag bit");
    opts.flags = VKGDR_RING_COPY_ENGINE_OFF_BIT;
    opts.copy_engine_record = 0;
    CHECK(vkgdr_ring_create_with_options(NULL, 4096, &opts) == NULL, "off");
    CHECK(last_error_contains("the vkgdr_t handle is NULL"), "got past the options");
    CHECK(vkgdr_ring_create(NULL, 4096, VKGDR_RING_COPY_ENGINE_OFF_BIT) == NULL, "off, plain");
    CHECK(last_error_contains("vkgdr_ring_create: the vkgdr_t handle is NULL"),
          "got past the flags");
    opts.copy_engine_record = 4096;
    CHECK(vkgdr_ring_create_with_options(NULL, 4096, &opts) == NULL, "off, record size");
    CHECK(last_error_contains("VKGDR_RING_COPY_ENGINE_OFF_BIT keeps the copy engine off"),
          "explains");
    opts.flags = VKGDR_RING_COPY_ENGINE_OFF_BIT | VKGDR_RING_COPY_ENGINE_SPLIT_BIT;
    CHECK(vkgdr_ring_create_with_options(NULL, 4096, &opts) == NULL, "off and split");
    CHECK(last_error_contains("goes with neither"), "explains");
    opts.flags = 0;
    opts.copy_engine_record = 1ull << 32;
    CHECK(vkgdr_ring_create_with_options(NULL, 4096, &opts) == NULL, "copy engine size");
    CHECK(last_error_contains("copy_engine_record 4294967296 is larger than UINT32_MAX"),
          "explains");
    opts.struct_size = 0;
    CHECK(vkgdr_ring_create_with_options(NULL, 4096, &opts) == NULL, "unset size");
    CHECK(last_error_contains("vkgdr_ring_options.struct_size is 0"), "explains");
    memset(&bigger, 0, sizeof bigger);
    vkgdr_ring_options_init(&bigger.known, sizeof bigger);
    bigger.future_field = 1;
    CHECK(vkgdr_ring_create_with_options(NULL, 4096, &bigger.known) == NULL, "unknown field");
    CHECK(last_error_contains("fields this library version does not know"), "explains");

    /* Producers: NULL and made-up handles, of the ring and of the producer. */
    CHECK(vkgdr_ring_producer_create(NULL) == NULL, "producer of NULL ring");
    CHECK(last_error_contains("vkgdr_ring_producer_create: the vkgdr_ring_t handle is NULL"),
          "named");
    CHECK(vkgdr_ring_producer_create(ring) == NULL, "producer of a made-up ring");
    CHECK(last_error_contains("invalid vkgdr_ring_t handle"), "named");
    CHECK(vkgdr_ring_producer_push(NULL, buf, sizeof buf, 0, &seq) == VKGDR_ERROR && seq == 7,
          "push to NULL producer");
    CHECK(last_error_contains("vkgdr_ring_producer_push: the vkgdr_ring_producer_t handle is "
                              "NULL"),
          "named");
    CHECK(vkgdr_ring_producer_write(made_up, buf, sizeof buf, 0, &seq) == VKGDR_ERROR,
          "write to a made-up producer");
    CHECK(last_error_contains("vkgdr_ring_producer_write: invalid vkgdr_ring_producer_t"),
          "named");
    CHECK(vkgdr_ring_producer_push((vkgdr_ring_producer_t)ring, buf, 1, 0, NULL) == VKGDR_ERROR,
          "a ring as a producer");
    CHECK(last_error_contains("invalid vkgdr_ring_producer_t handle"), "type checked");
    CHECK(vkgdr_ring_producer_push_batch(NULL, ptrs, sizes, 1, 0, &written) == VKGDR_ERROR &&
              written == 0,
          "batch to NULL producer");
    CHECK(vkgdr_ring_producer_flush(made_up) == VKGDR_ERROR, "flush a made-up producer");
    CHECK(vkgdr_ring_producer_set_flush_policy(NULL, 0, -1) == VKGDR_ERROR, "policy of NULL");
    CHECK(vkgdr_ring_producer_set_stage_after(made_up, 0) == VKGDR_ERROR,
          "stage after of a made-up producer");
    CHECK(last_error_contains("vkgdr_ring_producer_set_stage_after: invalid"), "named");
    CHECK(vkgdr_ring_producer_get_stage_after(NULL) == UINT64_MAX, "stage after of NULL");
    CHECK(vkgdr_ring_producer_get_next_seq(NULL) == UINT64_MAX, "next seq of NULL");
    CHECK(vkgdr_ring_producer_get_lane(made_up) == UINT32_MAX, "lane of a made-up producer");
    CHECK(last_error_contains("vkgdr_ring_producer_get_lane: invalid"), "named");
    mark_last_error();
    vkgdr_ring_producer_destroy(NULL);
    CHECK(still_marked(), "destroying NULL is a no-op");
    vkgdr_ring_producer_destroy(made_up);
    CHECK(last_error_contains("vkgdr_ring_producer_destroy: invalid vkgdr_ring_producer_t"),
          "reported");

    /* Lane and copy-engine calls on bad rings. */
    CHECK(vkgdr_ring_get_lanes(NULL) == 0, "lanes of NULL");
    CHECK(last_error_contains("vkgdr_ring_get_lanes: the vkgdr_ring_t handle is NULL"), "named");
    CHECK(vkgdr_ring_get_lane_head(ring, 0) == UINT64_MAX, "lane head of a made-up ring");
    CHECK(vkgdr_ring_get_lane_results(NULL, 0, words, 8) == VKGDR_ERROR, "lane results");
    stats.struct_size = sizeof stats;
    CHECK(vkgdr_ring_get_copy_engine_stats(NULL, &stats) == VKGDR_ERROR, "stats of NULL");
    CHECK(last_error_contains("vkgdr_ring_get_copy_engine_stats: the vkgdr_ring_t handle"),
          "named");
    CHECK(vkgdr_ring_get_copy_engine_error(ring) == NULL, "copy-engine error of a made-up");
    CHECK(last_error_contains("vkgdr_ring_get_copy_engine_error: invalid vkgdr_ring_t"), "named");
    view.struct_size = sizeof view;
    CHECK(vkgdr_ring_get_device_view(NULL, &view) == VKGDR_ERROR, "view of NULL");
}

/* Device -> host rings without a device: the shape and lane count are checked before the device
 * handle; every consumer call refuses NULL, made-up and other types' handles, naming the call and
 * the type, and checks its struct and buffer arguments; the destructor ignores NULL. */
static void d2h_rings_without_a_device(void)
{
    vkgdr_d2h_ring_t made_up = (vkgdr_d2h_ring_t)(uintptr_t)0x123456789ull;
    vkgdr_ring_t h2d = (vkgdr_ring_t)(uintptr_t)0x123456789ull;
    vkgdr_d2h_ring_device_view view;
    vkgdr_d2h_record rec;
    vkgdr_d2h_lane_stats stats;
    unsigned char buf[64];

    CHECK(sizeof view == 48, "the device view is vkgdr_d2h_view's 48 bytes");
    CHECK(vkgdr_d2h_ring_create(NULL, 1, 1000, 64, 100) == NULL, "1000 slots");
    CHECK(last_error_contains("1000 slots"), "the shape is checked before the device");
    CHECK(vkgdr_d2h_ring_create(NULL, 1, 64, 16, 100) == NULL, "stride 16");
    CHECK(last_error_contains("powers of two"), "explains");
    CHECK(vkgdr_d2h_ring_create(NULL, 0, 64, 64, 100) == NULL, "0 lanes");
    CHECK(last_error_contains("1 to 1024 lanes, not 0"), "the lanes before the device");
    CHECK(vkgdr_d2h_ring_create(NULL, 1025, 64, 64, 100) == NULL, "1025 lanes");
    CHECK(last_error_contains("1 to 1024 lanes, not 1025"), "explains");
    CHECK(vkgdr_d2h_ring_create(NULL, 1, 64, 64, 100) == NULL, "a good shape, no device");
    CHECK(last_error_contains("vkgdr_d2h_ring_create: the vkgdr_t handle is NULL"), "named");
    CHECK(vkgdr_d2h_ring_create((vkgdr_t)made_up, 1, 64, 64, 100) == NULL, "a made-up device");
    CHECK(last_error_contains("invalid vkgdr_t handle"), "named");
    CHECK(vkgdr_d2h_ring_create_with_format(NULL, 1, 64, 64, 100, 2) == NULL, "format 2");
    CHECK(last_error_contains("vkgdr_d2h_ring_create_with_format: slot format 2"),
          "the format is checked before the device");
    CHECK(vkgdr_d2h_ring_create_with_format(NULL, 1, 64, 16, 100, VKGDR_D2H_FORMAT_TAGGED) ==
              NULL,
          "stride 16, tagged");
    CHECK(last_error_contains("powers of two"), "the shape too");
    CHECK(vkgdr_d2h_ring_create_with_format(NULL, 1, 64, 64, 100, VKGDR_D2H_FORMAT_COMMITTED) ==
              NULL,
          "a good shape and format, no device");
    CHECK(last_error_contains("vkgdr_d2h_ring_create_with_format: the vkgdr_t handle is NULL"),
          "named");

    rec.struct_size = sizeof rec;
    stats.struct_size = sizeof stats;
    CHECK(vkgdr_d2h_ring_get_device_view(NULL, &view) == VKGDR_ERROR, "view of NULL");
    CHECK(last_error_contains("vkgdr_d2h_ring_get_device_view: the vkgdr_d2h_ring_t handle is "
                              "NULL"),
          "named");
    CHECK(vkgdr_d2h_ring_get_lanes(made_up) == 0, "lanes of a made-up ring");
    CHECK(last_error_contains("vkgdr_d2h_ring_get_lanes: invalid vkgdr_d2h_ring_t handle"),
          "named");
    CHECK(vkgdr_d2h_ring_get_max_payload(NULL) == 0, "max payload of NULL");
    CHECK(vkgdr_d2h_ring_try_next(made_up, 0, buf, sizeof buf, &rec) == VKGDR_ERROR,
          "try_next on a made-up ring");
    CHECK(last_error_contains("vkgdr_d2h_ring_try_next: invalid vkgdr_d2h_ring_t handle"),
          "named");
    /* Handles of other types, cast: refused by type, never read as a ring. */
    CHECK(vkgdr_d2h_ring_next((vkgdr_d2h_ring_t)h2d, 0, -1, buf, sizeof buf, &rec) == VKGDR_ERROR,
          "a vkgdr_ring_t as a device -> host ring (no wait, even without limit)");
    CHECK(last_error_contains("vkgdr_d2h_ring_next: invalid vkgdr_d2h_ring_t handle"), "named");
    CHECK(vkgdr_ring_get_head((vkgdr_ring_t)made_up) == UINT64_MAX, "and the other way");
    CHECK(last_error_contains("invalid vkgdr_ring_t handle"), "named");
    CHECK(vkgdr_d2h_ring_close_lane(NULL, 0) == VKGDR_ERROR, "close a lane of NULL");
    CHECK(last_error_contains("vkgdr_d2h_ring_close_lane: the vkgdr_d2h_ring_t handle is NULL"),
          "named");
    CHECK(vkgdr_d2h_ring_publish_head(NULL, 0) == VKGDR_ERROR, "publish a head of NULL");
    CHECK(last_error_contains("vkgdr_d2h_ring_publish_head: the vkgdr_d2h_ring_t handle is NULL"),
          "named");
    CHECK(vkgdr_d2h_ring_publish_head(made_up, 0) == VKGDR_ERROR, "of a made-up ring");
    CHECK(last_error_contains("vkgdr_d2h_ring_publish_head: invalid vkgdr_d2h_ring_t handle"),
          "named");
    CHECK(vkgdr_d2h_ring_get_lane_stats(made_up, 0, &stats) == VKGDR_ERROR, "stats");
    CHECK(last_error_contains("vkgdr_d2h_ring_get_lane_stats: invalid vkgdr_d2h_ring_t"),
          "named");

    mark_last_error();
    vkgdr_d2h_ring_destroy(NULL);
    CHECK(still_marked(), "destroying NULL is a no-op");
    vkgdr_d2h_ring_destroy(made_up);
    CHECK(last_error_contains("vkgdr_d2h_ring_destroy: invalid vkgdr_d2h_ring_t handle"),
          "a made-up ring is reported");
    vkgdr_d2h_ring_destroy((vkgdr_d2h_ring_t)h2d);
    CHECK(last_error_contains("vkgdr_d2h_ring_destroy: invalid vkgdr_d2h_ring_t handle"),
          "another type's handle is reported, not freed");

    /* Device-side release: every handle checked, naming the call and the type. */
    {
        uint64_t token = 5;
        vkgdr_pool_t pool = (vkgdr_pool_t)(uintptr_t)0x123456789ull;
        CHECK(vkgdr_block_release_on_device(NULL, &token) == VKGDR_ERROR && token == 5,
              "release NULL");
        CHECK(last_error_contains("vkgdr_block_release_on_device: the vkgdr_block_t handle is "
                                  "NULL"),
              "named");
        CHECK(vkgdr_block_release_on_device((vkgdr_block_t)made_up, &token) == VKGDR_ERROR,
              "a ring as a block");
        CHECK(last_error_contains("invalid vkgdr_block_t handle"), "type checked");
        CHECK(vkgdr_pool_set_release_feed(NULL, made_up) == VKGDR_ERROR, "feed of NULL pool");
        CHECK(last_error_contains("vkgdr_pool_set_release_feed: the vkgdr_pool_t handle is NULL"),
              "named");
        CHECK(vkgdr_pool_set_release_feed(pool, NULL) == VKGDR_ERROR, "made-up pool");
        CHECK(last_error_contains("invalid vkgdr_pool_t handle"), "named");
        CHECK(vkgdr_pool_drain_device_releases(NULL) == SIZE_MAX, "drain NULL");
        CHECK(last_error_contains("vkgdr_pool_drain_device_releases"), "named");
        CHECK(vkgdr_pool_get_lent_blocks((vkgdr_pool_t)made_up) == UINT64_MAX, "a ring as pool");
        CHECK(last_error_contains("invalid vkgdr_pool_t handle"), "type checked");
        CHECK(vkgdr_pool_reclaim_device_releases(pool) == SIZE_MAX, "reclaim made-up");
    }
}

int main(void)
{
    open_without_driver();
    bad_handles();
    last_error_survives_successful_calls();
    stream_ordered_frees();
    /* A thread of its own: nothing has failed on it yet. */
    copies_in_a_fresh_thread();
    versioned_structs();
    ring_options_and_producers();
    d2h_rings_without_a_device();
    return CHECK_SUMMARY("no_driver");
}
