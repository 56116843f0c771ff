/* A running kernel never stalls the library, from C.
 *
 * First, what a free waits for (deterministic): with spin_until_stopped (kernels/mapping.ptx) on
 * the legacy stream, vkgdr_memory_free returns at once and the memory waits, counted by
 * vkgdr_wait_for_releases, until the kernel ends; with it on a non-blocking stream of its own, a
 * plain free does not wait for it, while vkgdr_memory_free_after, vkgdr_block_free_after and the
 * destroy of a ring whose consumer vkgdr_ring_watch_consumer registered return at once and keep
 * their memory (free VRAM, pool statistics) until the kernel's stream has passed them, and
 * vkgdr_get_release_times names the release that waits and then how long it waited.
 *
 * Then the churn: the persistent kernel spins on its own non-blocking stream while eight threads
 * churn a thread-cached pool, an uncached pool and dedicated blocks (8 MiB and more), make raw
 * allocations of 4 KiB to 4 MiB and free them every way (vkgdr_memory_free, _free_now,
 * _free_after), create and destroy rings (padded and mirrored) and whole pools, and the main
 * thread exhausts the BAR with 1 GiB allocations and recovers, again and again. Every byte read
 * back must be what was written, the kernel's heartbeat must advance throughout, a kernel
 * launched meanwhile on another stream must find every kept block intact (and find a corrupted
 * one), and after a warm-up pass and the measured pass the process's fds and free VRAM must be
 * back where they were once the releases have settled. A watchdog ends a hang after
 * LIMIT_SECONDS, printing what each thread was doing.
 *
 * Every kernel is launched once before the persistent one: loading a module, and under CUDA's lazy
 * loading the first launch of a kernel, wait for running kernels.
 *
 * Usage: coexistence path/to/kernels/mapping.ptx */
#define _POSIX_C_SOURCE 200809L /* nanosleep, clock_gettime */
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "gpu_util.h"

#define WORKERS 8
#define MAIN_THREAD WORKERS
#define LIMIT_SECONDS 150
#define WARMUP_SECONDS 3.0
#define CHURN_SECONDS 15.0
#define KEEP 32
#define MIB ((size_t)1 << 20)

/* ---- time, randomness, what each thread is doing (for the watchdog) ---------------------- */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static uint64_t next_random(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static _Atomic(const char *) states[WORKERS + 1];
static atomic_ullong steps[WORKERS + 1];
static atomic_int bar_round;
static atomic_int finished;
/* The persistent kernel's stop word, for the watchdog to let the GPU go before it exits. */
static _Atomic(volatile unsigned int *) watchdog_stop;

static void set_state(int i, const char *what)
{
    atomic_store_explicit(&states[i], what, memory_order_relaxed);
    atomic_fetch_add_explicit(&steps[i], 1, memory_order_relaxed);
}

static void *watchdog(void *arg)
{
    double deadline = now() + LIMIT_SECONDS;
    int i;
    (void)arg;
    while (!atomic_load(&finished)) {
        if (now() > deadline) {
            volatile unsigned int *stop = atomic_load(&watchdog_stop);
            fprintf(stderr, "WATCHDOG: coexistence did not finish in %d s; thread states:\n",
                    LIMIT_SECONDS);
            for (i = 0; i <= WORKERS; i++) {
                const char *s = atomic_load(&states[i]);
                fprintf(stderr, "  %s %d: %s (step %llu%s)\n", i == MAIN_THREAD ? "main" : "worker",
                        i, s ? s : "not started", (unsigned long long)atomic_load(&steps[i]),
                        i == MAIN_THREAD ? ", BAR round counted separately" : "");
            }
            fprintf(stderr, "  BAR exhaustion round %d\n", atomic_load(&bar_round));
            if (stop != NULL) {
                *stop = 1;
            }
            fflush(stderr);
            _exit(3);
        }
        sleep_ms(100);
    }
    return NULL;
}

/* ---- driver figures -------------------------------------------------------------------------- */

static size_t free_vram(void)
{
    size_t free_bytes = 0, total = 0;
    CU_OK(cuMemGetInfo(&free_bytes, &total));
    return free_bytes;
}

static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (d == NULL) {
        return -1;
    }
    while (readdir(d) != NULL) {
        n++;
    }
    closedir(d);
    return n;
}

/* Whether `msg` is an out-of-memory answer (the BAR is exhausted on purpose): the driver's
 * VK_ERROR_OUT_OF_DEVICE_MEMORY or CUDA_ERROR_OUT_OF_MEMORY, or an arena slot still being
 * released. */
static int is_out_of_memory(const char *msg)
{
    return msg != NULL &&
           (strstr(msg, "OUT_OF_DEVICE_MEMORY") != NULL || strstr(msg, "OUT_OF_MEMORY") != NULL ||
            strstr(msg, "out of device memory") != NULL);
}

/* ---- the persistent kernel ------------------------------------------------------------------- */

typedef struct {
    vkgdr_memory_t words; /* stop (u32 at 0) and heartbeat (u64 at 64) */
    volatile unsigned int *stop;
    volatile unsigned long long *beats;
    CUdeviceptr d_words;
    CUfunction spin;
    CUstream stream; /* NULL: the legacy default stream */
    int running;
} persistent;

static unsigned long long beats(persistent *k)
{
    vkgdr_memory_invalidate(k->words, 64, 8);
    return *k->beats;
}

/* Launches spin_until_stopped on `stream` and waits up to 10 s for its heartbeat. */
static void kernel_launch(persistent *k, CUstream stream)
{
    CUdeviceptr stop = k->d_words, beat = k->d_words + 64;
    void *args[2] = {&stop, &beat};
    double t = now();
    *k->stop = 0;
    *k->beats = 0;
    atomic_thread_fence(memory_order_seq_cst);
    vkgdr_memory_flush(k->words, 0, 128);
    CU_OK(cuLaunchKernel(k->spin, 1, 1, 1, 1, 1, 1, 0, stream, args, NULL));
    k->stream = stream;
    k->running = 1;
    atomic_store(&watchdog_stop, k->stop);
    while (beats(k) == 0 && now() - t < 10.0) {
        sleep_ms(1);
    }
    CHECK(beats(k) != 0, "the persistent kernel never started");
}

/* Whether the heartbeat advances within 2 s (the kernel really runs). */
static int kernel_alive(persistent *k)
{
    unsigned long long a = beats(k), b;
    double t = now();
    while (now() - t < 2.0) {
        b = beats(k);
        if (b != a && (b & 1) == 0) {
            return 1;
        }
        sleep_ms(1);
    }
    return 0;
}

/* Stops the kernel with a plain store through the BAR (no driver call, which could queue behind
 * it), waits up to 10 s for it to exit, then for its stream. */
static void kernel_stop(persistent *k)
{
    double t = now();
    if (!k->running) {
        return;
    }
    *k->stop = 1;
    atomic_thread_fence(memory_order_seq_cst);
    vkgdr_memory_flush(k->words, 0, 4);
    while ((beats(k) & 1) == 0 && now() - t < 10.0) {
        sleep_ms(1);
    }
    CHECK((beats(k) & 1) == 1, "the persistent kernel did not exit");
    if (k->stream == NULL) {
        CU_OK(cuCtxSynchronize());
    } else {
        CU_OK(cuStreamSynchronize(k->stream));
    }
    k->running = 0;
}

/* ---- what a free waits for -------------------------------------------------------------------- */

static size_t pending(vkgdr_t g)
{
    return vkgdr_wait_for_releases(g, 0);
}

/* The release times of `g`, filled for the whole struct. */
static vkgdr_release_times release_times(vkgdr_t g)
{
    vkgdr_release_times times;
    memset(&times, 0xAB, sizeof times);
    times.struct_size = sizeof times;
    CHECK(vkgdr_get_release_times(g, &times) == VKGDR_SUCCESS, "vkgdr_get_release_times");
    return times;
}

static void releases_follow_their_stream(vkgdr_t g, persistent *k, CUstream own)
{
    const size_t big = 64 * MIB;
    vkgdr_memory_t a, b, c;
    vkgdr_pool_t pool;
    vkgdr_pool_config cfg;
    vkgdr_pool_stats stats;
    vkgdr_block_t small, dedicated, other;
    vkgdr_ring_t ring;
    uint64_t stamp = 0x0123456789abcdefull, back = 0;
    size_t held, n;
    double t, kept;
    vkgdr_release_times times;

    CHECK(vkgdr_wait_for_releases(g, 30000000000ll) == 0, "nothing pending at the start");

    /* A kernel on the legacy stream: plain frees return at once, the memory waits for it (and
     * counts as in use), as vkgdr 0.1 programs that free right after a launch need. */
    kernel_launch(k, NULL);
    t = now();
    a = vkgdr_memory_alloc(g, 4 * MIB, 0);
    b = vkgdr_memory_alloc(g, 64 << 10, 0);
    CHECK(a != NULL && b != NULL, "allocations beside a kernel on the legacy stream");
    vkgdr_memory_free(a);
    vkgdr_memory_free(b);
    CHECK(now() - t < 1.0, "allocations and frees took %.3f s beside the legacy kernel", now() - t);
    sleep_ms(50);
    n = pending(g);
    CHECK(n == 2, "the frees wait for the kernel on the legacy stream: %zu pending", n);
    n = vkgdr_wait_for_releases(g, 100000000ll);
    CHECK(n == 2, "still waiting after 100 ms: %zu", n);
    kernel_stop(k);
    n = vkgdr_wait_for_releases(g, 30000000000ll);
    CHECK(n == 0, "released once the legacy kernel ended: %zu pending", n);

    /* The kernel on a non-blocking stream of its own. */
    kernel_launch(k, own);
    /* A plain free does not wait for it; a free "now" queues nothing at all. */
    c = vkgdr_memory_alloc(g, 4 * MIB, 0);
    vkgdr_memory_free(c);
    n = vkgdr_wait_for_releases(g, 5000000000ll);
    CHECK(c != NULL && n == 0, "a plain free does not wait for a non-blocking stream: %zu", n);
    c = vkgdr_memory_alloc(g, 4 * MIB, 0);
    vkgdr_memory_free_now(c);
    CHECK(c != NULL && pending(g) == 0, "vkgdr_memory_free_now queues nothing");

    /* Memory, pool blocks (no thread cache: a released block would otherwise sit, counted as
     * in use, in the releasing thread's cache) and a ring, all in use by the kernel's stream. */
    a = vkgdr_memory_alloc(g, big, 0);
    CHECK(a != NULL && vkgdr_memory_write(a, big - 8, &stamp, 8) == VKGDR_SUCCESS &&
              vkgdr_memory_read(a, big - 8, &back, 8) == VKGDR_SUCCESS && back == stamp,
          "64 MiB written and read back beside the kernel");
    vkgdr_pool_config_init(&cfg, sizeof cfg);
    cfg.thread_cache = 0;
    pool = vkgdr_pool_create(g, &cfg);
    small = vkgdr_pool_alloc(pool, 256, 64);
    dedicated = vkgdr_pool_alloc(pool, 16 * MIB, 256);
    ring = vkgdr_ring_create(g, 64 << 10, 0);
    CHECK(pool != NULL && small != NULL && dedicated != NULL && ring != NULL,
          "pool, blocks and ring beside the kernel");
    CHECK(vkgdr_ring_watch_consumer(ring, own) == VKGDR_SUCCESS, "watch the consumer's stream");
    held = free_vram();

    t = now();
    CHECK(vkgdr_memory_free_after(a, own) == VKGDR_SUCCESS, "vkgdr_memory_free_after");
    CHECK(vkgdr_block_free_after(small, pool, own) == VKGDR_SUCCESS, "vkgdr_block_free_after");
    CHECK(vkgdr_block_free_after(dedicated, pool, own) == VKGDR_SUCCESS, "dedicated block");
    vkgdr_ring_destroy(ring);
    CHECK(now() - t < 1.0, "the stream-ordered frees took %.3f s beside the kernel", now() - t);
    sleep_ms(50);
    n = pending(g);
    CHECK(n == 4, "memory, two blocks and the ring wait for the kernel's stream: %zu", n);
    n = vkgdr_wait_for_releases(g, 100000000ll);
    CHECK(n == 4, "still waiting after 100 ms: %zu", n);
    stats.struct_size = sizeof stats;
    CHECK(vkgdr_pool_get_stats(pool, &stats) == VKGDR_SUCCESS && stats.bytes_in_use == 256 &&
              stats.dedicated_chunks == 1,
          "the blocks stay in use: %llu bytes, %llu dedicated chunks",
          (unsigned long long)stats.bytes_in_use, (unsigned long long)stats.dedicated_chunks);
    CHECK(free_vram() < held + 32 * MIB, "the memory is not released before the stream passes it "
          "(free VRAM %zu MiB, %zu MiB before the frees)", free_vram() / MIB, held / MIB);
    CHECK(kernel_alive(k), "the kernel runs on");
    /* The four wait, the oldest for at least the 150 ms slept and waited above, and named. */
    times = release_times(g);
    CHECK(times.waiting == 4 && times.oldest_waiting.time_ns >= 100000000ull &&
              times.oldest_waiting.what[0] != '\0',
          "the releases wait, the oldest named: %llu waiting, the oldest for %.3f ms (%.64s)",
          (unsigned long long)times.waiting, (double)times.oldest_waiting.time_ns * 1e-6,
          times.oldest_waiting.what);

    kept = now() - t; /* the kernel holds the releases at least this long */
    kernel_stop(k);
    n = vkgdr_wait_for_releases(g, 30000000000ll);
    CHECK(n == 0, "released once the stream passed: %zu pending", n);
    /* None waits now; the longest wait is at least about as long as the kernel held them (half
     * of it: the bound is generous, never tight), and the drops were timed. */
    times = release_times(g);
    CHECK(times.waiting == 0 && times.oldest_waiting.time_ns == 0 &&
              times.oldest_waiting.what[0] == '\0',
          "nothing waits once released: %llu waiting, the oldest for %llu ns",
          (unsigned long long)times.waiting, (unsigned long long)times.oldest_waiting.time_ns);
    CHECK((double)times.longest_wait.time_ns * 1e-9 >= kept / 2 &&
              times.longest_wait.what[0] != '\0' && times.longest_drop.what[0] != '\0',
          "the longest wait %.3f ms (%.64s) covers the %.3f ms the kernel held the releases",
          (double)times.longest_wait.time_ns * 1e-6, times.longest_wait.what, kept * 1e3);
    printf("release times: the longest wait %.3f ms (%.64s), the longest drop %.3f ms (%.64s), "
           "the longest turn %.3f ms\n",
           (double)times.longest_wait.time_ns * 1e-6, times.longest_wait.what,
           (double)times.longest_drop.time_ns * 1e-6, times.longest_drop.what,
           (double)times.longest_turn.time_ns * 1e-6);
    vkgdr_pool_get_stats(pool, &stats);
    CHECK(stats.bytes_in_use == 0 && stats.dedicated_chunks == 0,
          "the blocks are back in the pool: %llu bytes, %llu dedicated chunks",
          (unsigned long long)stats.bytes_in_use, (unsigned long long)stats.dedicated_chunks);
    /* The 64 MiB's mapping may be kept for the next allocation of its size (the handle's spare
     * limits scale with the device): trimming gives it back to the driver. */
    CHECK(vkgdr_trim(g, NULL) == VKGDR_SUCCESS, "vkgdr_trim");
    CHECK(free_vram() >= held + 60 * MIB, "the 64 MiB and the dedicated chunk went back "
          "(free VRAM %zu MiB, %zu MiB before)", free_vram() / MIB, held / MIB);

    /* NULL and CU_STREAM_LEGACY are the legacy default stream: the plain frees' fence. */
    a = vkgdr_memory_alloc(g, 4 * MIB, 0);
    small = vkgdr_pool_alloc(pool, 256, 64);
    other = vkgdr_pool_alloc(pool, 100, 16);
    CHECK(vkgdr_memory_free_after(a, NULL) == VKGDR_SUCCESS, "free_after, NULL stream");
    CHECK(vkgdr_block_free_after(small, pool, NULL) == VKGDR_SUCCESS, "block, NULL stream");
    CHECK(vkgdr_block_free_after(other, pool, CU_STREAM_LEGACY) == VKGDR_SUCCESS,
          "block, CU_STREAM_LEGACY");
    n = vkgdr_wait_for_releases(g, 5000000000ll);
    vkgdr_pool_get_stats(pool, &stats);
    CHECK(n == 0 && stats.bytes_in_use == 0, "legacy-stream frees done: %zu pending, %llu bytes",
          n, (unsigned long long)stats.bytes_in_use);
    vkgdr_pool_destroy(pool);
    printf("releases: the legacy stream, a named stream and a watched consumer each hold their "
           "memory until they pass it; nothing waited\n");
}

/* ---- the churn ------------------------------------------------------------------------------- */

typedef struct {
    int id;
    vkgdr_t g;
    CUcontext ctx;
    vkgdr_pool_t pool; /* the pool the worker churns */
    double end;
    unsigned long long ops, oom, errors, destroyed_with_live_blocks;
    vkgdr_block_t kept[KEEP];
    unsigned int kept_tags[KEEP];
    int n_kept;
} worker;

/* A call failed: out-of-memory is expected while the BAR is exhausted (back off 2 ms); anything
 * else counts as an error, and the first few are printed. */
static void failed(worker *w, const char *what)
{
    char *msg = vkgdr_last_error();
    if (is_out_of_memory(msg)) {
        w->oom++;
        set_state(w->id, "backing off after out-of-memory");
        sleep_ms(2);
    } else {
        w->errors++;
        if (w->errors <= 5) {
            fprintf(stderr, "worker %d: %s failed: %s\n", w->id, what, msg ? msg : "(no message)");
        }
    }
    free(msg);
}

static void mismatch(worker *w, const char *what)
{
    w->errors++;
    if (w->errors <= 5) {
        fprintf(stderr, "worker %d: %s: the bytes read back differ\n", w->id, what);
    }
}

/* A driver call of a worker (CHECK's counters belong to the main thread). */
#define WORKER_CU(w, call)                                                                 \
    do {                                                                                   \
        CUresult r_ = (call);                                                              \
        if (r_ != CUDA_SUCCESS) {                                                          \
            const char *n_ = "?";                                                          \
            cuGetErrorName(r_, &n_);                                                       \
            (w)->errors++;                                                                 \
            fprintf(stderr, "worker %d: %s returned %s\n", (w)->id, #call, n_);            \
        }                                                                                  \
    } while (0)

static void enter(worker *w, uint64_t *rng)
{
    *rng = 0x9e3779b97f4a7c15ull ^ ((uint64_t)w->id + 1) * 0x123456789abcull;
    WORKER_CU(w, cuCtxSetCurrent(w->ctx));
    set_state(w->id, "started");
}

static void tag_bytes(unsigned char *p, unsigned int tag, size_t len)
{
    size_t j;
    for (j = 0; j < len; j++) {
        p[j] = tag_byte(tag, j);
    }
}

/* Workers 0-2: blocks of [lo, hi) bytes, written whole, read back in part, 64 live at a time;
 * the last KEEP stay alive for the kernel check. */
static void pool_churn(worker *w, size_t lo, size_t hi)
{
    vkgdr_block_t live[64];
    unsigned int tags[64];
    unsigned char *buf = malloc(hi), back[256];
    unsigned int tag = (unsigned int)w->id << 24;
    int head = 0, count = 0, i;
    uint64_t rng;
    enter(w, &rng);
    if (buf == NULL) {
        w->errors++;
        return;
    }
    while (now() < w->end) {
        size_t len = lo + (size_t)(next_random(&rng) % (hi - lo)), n = len < 256 ? len : 256;
        vkgdr_block_t b;
        set_state(w->id, "pool alloc");
        b = vkgdr_pool_alloc(w->pool, len, 16);
        if (b == NULL) {
            failed(w, "vkgdr_pool_alloc");
            continue;
        }
        tag++;
        tag_bytes(buf, tag, len);
        set_state(w->id, "pool write");
        if (vkgdr_block_write(b, 0, buf, len) != VKGDR_SUCCESS ||
            vkgdr_block_flush(b, 0, len) != VKGDR_SUCCESS) {
            failed(w, "vkgdr_block_write/flush");
        }
        set_state(w->id, "pool read");
        if (vkgdr_block_read(b, 0, back, n) != VKGDR_SUCCESS) {
            failed(w, "vkgdr_block_read");
        } else if (memcmp(back, buf, n) != 0) {
            mismatch(w, "pool block");
        }
        live[(head + count) % 64] = b;
        tags[(head + count) % 64] = tag;
        if (++count == 64) {
            set_state(w->id, "pool free");
            vkgdr_block_free(live[head]);
            head = (head + 1) % 64;
            count--;
        }
        w->ops++;
    }
    for (i = 0; i < count; i++) {
        int at = (head + i) % 64;
        if (count - i <= KEEP) {
            w->kept[w->n_kept] = live[at];
            w->kept_tags[w->n_kept++] = tags[at];
        } else {
            vkgdr_block_free(live[at]);
        }
    }
    free(buf);
    set_state(w->id, "done");
}

/* Worker 3: dedicated blocks (8 MiB and more get a chunk of their own), stamped at the end and
 * read back, freed at once or after this thread's (idle) stream. */
static void dedicated_churn(worker *w)
{
    CUstream own;
    uint64_t rng;
    enter(w, &rng);
    WORKER_CU(w, cuStreamCreate(&own, CU_STREAM_NON_BLOCKING));
    while (now() < w->end) {
        uint64_t len = 8 * MIB + next_random(&rng) % (16 * MIB), back = 0;
        vkgdr_block_t b;
        set_state(w->id, "dedicated block alloc");
        b = vkgdr_pool_alloc(w->pool, (size_t)len, 256);
        if (b == NULL) {
            failed(w, "vkgdr_pool_alloc (dedicated)");
            continue;
        }
        set_state(w->id, "dedicated block write");
        if (vkgdr_block_write(b, (size_t)len - 8, &len, 8) != VKGDR_SUCCESS ||
            vkgdr_block_read(b, (size_t)len - 8, &back, 8) != VKGDR_SUCCESS) {
            failed(w, "vkgdr_block_write/read (dedicated)");
        } else if (back != len) {
            mismatch(w, "dedicated block");
        }
        set_state(w->id, "dedicated block free");
        if (w->ops % 2 == 0) {
            vkgdr_block_free(b);
        } else if (vkgdr_block_free_after(b, w->pool, own) != VKGDR_SUCCESS) {
            failed(w, "vkgdr_block_free_after");
        }
        w->ops++;
    }
    WORKER_CU(w, cuStreamDestroy(own));
    set_state(w->id, "done");
}

/* Workers 4-5: raw allocations of 4 KiB to 4 MiB (carved from shared granules up to 1 MiB, mapped
 * on their own above), stamped at the end and read back, freed every way. */
static void raw_churn(worker *w)
{
    CUstream own;
    uint64_t rng;
    enter(w, &rng);
    WORKER_CU(w, cuStreamCreate(&own, CU_STREAM_NON_BLOCKING));
    while (now() < w->end) {
        size_t len = (size_t)4096 << (next_random(&rng) % 11);
        uint64_t stamp = next_random(&rng), back = 0;
        vkgdr_memory_t m;
        set_state(w->id, "raw alloc");
        m = vkgdr_memory_alloc(w->g, len, 0);
        if (m == NULL) {
            failed(w, "vkgdr_memory_alloc");
            continue;
        }
        set_state(w->id, "raw write");
        if (vkgdr_memory_write(m, len - 8, &stamp, 8) != VKGDR_SUCCESS ||
            vkgdr_memory_read(m, len - 8, &back, 8) != VKGDR_SUCCESS) {
            failed(w, "vkgdr_memory_write/read");
        } else if (back != stamp) {
            mismatch(w, "raw allocation");
        }
        set_state(w->id, "raw free");
        switch (next_random(&rng) % 3) {
        case 0:
            vkgdr_memory_free(m);
            break;
        case 1:
            vkgdr_memory_free_now(m);
            break;
        default:
            if (vkgdr_memory_free_after(m, own) != VKGDR_SUCCESS) {
                failed(w, "vkgdr_memory_free_after");
            }
        }
        w->ops++;
    }
    WORKER_CU(w, cuStreamDestroy(own));
    set_state(w->id, "done");
}

/* Worker 6: rings made, filled a little (no consumer) and destroyed; every 8th one mirrored. */
static void ring_churn(worker *w)
{
    unsigned char record[100];
    uint64_t rng;
    enter(w, &rng);
    memset(record, 7, sizeof record);
    while (now() < w->end) {
        int mirrored = w->ops % 8 == 7;
        vkgdr_ring_t r;
        uint64_t k, n = next_random(&rng) % 16;
        set_state(w->id, mirrored ? "mirrored ring create" : "ring create");
        r = vkgdr_ring_create(w->g, mirrored ? 2 * MIB : 64 << 10,
                              mirrored ? VKGDR_RING_MIRRORED_BIT : 0);
        if (r == NULL) {
            failed(w, "vkgdr_ring_create");
            continue;
        }
        set_state(w->id, "ring push");
        for (k = 0; k < n; k++) {
            int rc = vkgdr_ring_push(r, record, sizeof record, 0, NULL);
            if (rc == VKGDR_RING_FULL) {
                /* Not an error of the library (no last error): the ring holds all of them. */
                w->errors++;
                fprintf(stderr, "worker %d: ring full after %llu records\n", w->id,
                        (unsigned long long)k);
                break;
            }
            if (rc != VKGDR_SUCCESS) {
                failed(w, "vkgdr_ring_push");
                break;
            }
        }
        set_state(w->id, "ring destroy");
        vkgdr_ring_destroy(r);
        w->ops++;
    }
    set_state(w->id, "done");
}

/* Worker 7: whole pools made, used and destroyed, sometimes with blocks that outlive them. */
static void pool_lifecycle(worker *w)
{
    vkgdr_block_t blocks[32];
    uint64_t rng;
    enter(w, &rng);
    while (now() < w->end) {
        vkgdr_pool_config cfg;
        vkgdr_pool_t p;
        size_t released = 0;
        int n = 1 + (int)(next_random(&rng) % 32), i, made = 0;
        unsigned char byte = 0x5a, back = 0;
        set_state(w->id, "pool create");
        vkgdr_pool_config_init(&cfg, sizeof cfg);
        cfg.chunk_size = 2 * MIB;
        cfg.max_chunk_size = 4 * MIB;
        cfg.shards = 1;
        p = vkgdr_pool_create(w->g, &cfg);
        if (p == NULL) {
            failed(w, "vkgdr_pool_create");
            continue;
        }
        set_state(w->id, "pool of its own: alloc");
        for (i = 0; i < n; i++) {
            blocks[made] = vkgdr_pool_alloc(p, 64 + (size_t)(next_random(&rng) % (64 << 10)), 64);
            if (blocks[made] == NULL) {
                failed(w, "vkgdr_pool_alloc (pool of its own)");
                break;
            }
            made++;
        }
        if (made > 0 && (vkgdr_block_write(blocks[0], 0, &byte, 1) != VKGDR_SUCCESS ||
                         vkgdr_block_read(blocks[0], 0, &back, 1) != VKGDR_SUCCESS)) {
            failed(w, "vkgdr_block_write/read (pool of its own)");
        } else if (made > 0 && back != byte) {
            mismatch(w, "pool of its own");
        }
        if (w->ops % 2 == 0) {
            set_state(w->id, "pool of its own: free, trim, destroy");
            for (i = 0; i < made; i++) {
                vkgdr_block_free(blocks[i]);
            }
            if (vkgdr_pool_trim(p, &released) != VKGDR_SUCCESS) {
                failed(w, "vkgdr_pool_trim");
            }
            vkgdr_pool_destroy(p);
        } else {
            /* Blocks outlive their pool handle; the last one frees the pool. */
            set_state(w->id, "pool of its own: destroy, then free its blocks");
            vkgdr_pool_destroy(p);
            for (i = 0; i < made; i++) {
                vkgdr_block_free(blocks[i]);
            }
            w->destroyed_with_live_blocks++;
        }
        w->ops++;
    }
    set_state(w->id, "done");
}

static void *work(void *arg)
{
    worker *w = arg;
    switch (w->id) {
    case 0:
    case 1:
        pool_churn(w, 16, 64 << 10);
        break;
    case 2:
        pool_churn(w, 16, 4096);
        break;
    case 3:
        dedicated_churn(w);
        break;
    case 4:
    case 5:
        raw_churn(w);
        break;
    case 6:
        ring_churn(w);
        break;
    default:
        pool_lifecycle(w);
    }
    return NULL;
}

/* The main thread meanwhile: allocate 1 GiB at a time until the BAR is exhausted, hold it,
 * free it, and allocate again (the BAR must be free again), until `end`. Also watches the
 * heartbeat between rounds. */
static void exhaust_the_bar(vkgdr_t g, persistent *k, double end, int *rounds, int *stalls,
                            int *errors)
{
    static vkgdr_memory_t held[512];
    unsigned long long last = beats(k), b;
    while (now() < end) {
        int n = 0, i, tries;
        char *msg;
        vkgdr_memory_t again = NULL;
        atomic_fetch_add(&bar_round, 1);
        set_state(MAIN_THREAD, "exhausting the BAR");
        while (n < 512 && (held[n] = vkgdr_memory_alloc(g, 1ull << 30, 0)) != NULL) {
            n++;
        }
        msg = vkgdr_last_error();
        if (n == 512 || !is_out_of_memory(msg)) {
            (*errors)++;
            fprintf(stderr, "BAR round %d: %d GiB, then %s\n", *rounds + 1, n,
                    msg ? msg : "(no error)");
        }
        free(msg);
        sleep_ms(200);
        set_state(MAIN_THREAD, "freeing the BAR");
        for (i = 0; i < n; i++) {
            vkgdr_memory_free(held[i]);
        }
        set_state(MAIN_THREAD, "allocating again after exhaustion");
        /* Other threads take bits of the BAR meanwhile: a few tries within a second. */
        for (tries = 0; tries < 50 && again == NULL; tries++) {
            again = vkgdr_memory_alloc(g, 1ull << 30, 0);
            if (again == NULL) {
                sleep_ms(20);
            }
        }
        if (again == NULL) {
            (*errors)++;
            msg = vkgdr_last_error();
            fprintf(stderr, "BAR round %d: after freeing %d GiB, 1 GiB failed: %s\n", *rounds + 1,
                    n, msg ? msg : "(no error)");
            free(msg);
        } else if (tries > 1) {
            printf("BAR round %d: 1 GiB again after %d tries\n", *rounds + 1, tries);
        }
        vkgdr_memory_free(again);
        (*rounds)++;
        b = beats(k);
        *stalls += b == last || (b & 1) != 0;
        last = b;
        sleep_ms(300);
    }
    set_state(MAIN_THREAD, "waiting for the workers");
}

/* The block the checks corrupt on purpose: the first kept block of the first worker that kept
 * any (entry 0 of check_kept's table). */
static vkgdr_block_t first_kept(worker *workers)
{
    int i;
    for (i = 0; i < WORKERS; i++) {
        if (workers[i].n_kept > 0) {
            return workers[i].kept[0];
        }
    }
    return NULL;
}

/* Flips bits of the block's last byte (twice: back as it was). */
static void flip_last_byte(vkgdr_block_t b)
{
    size_t last = vkgdr_block_get_size(b) - 1;
    ((unsigned char *)vkgdr_block_get_host_ptr(b))[last] ^= 0x5a;
    vkgdr_block_flush(b, last, 1);
}

/* With the persistent kernel still running, check_tagged_blocks on another stream checks every
 * kept block (and must find one corrupted on purpose); returns what it found. */
static unsigned long long check_kept(vkgdr_t g, CUfunction check, worker *workers, int corrupt)
{
    vkgdr_memory_t table;
    unsigned long long *ptrs, n = 0, bad = ~0ull;
    unsigned int *lens, *tags;
    CUdeviceptr d, d_ptrs, d_lens, d_tags, d_bad;
    CUstream s;
    vkgdr_block_t victim = NULL;
    void *args[5];
    int i, j;
    for (i = 0; i < WORKERS; i++) {
        n += (unsigned long long)workers[i].n_kept;
    }
    table = vkgdr_memory_alloc(g, 16 * n + 8, 0);
    CHECK(table != NULL, "the check's table");
    if (table == NULL) {
        return bad;
    }
    ptrs = vkgdr_memory_get_host_ptr(table);
    lens = (unsigned int *)(ptrs + n);
    tags = lens + n;
    n = 0;
    for (i = 0; i < WORKERS; i++) {
        for (j = 0; j < workers[i].n_kept; j++, n++) {
            vkgdr_block_t b = workers[i].kept[j];
            ptrs[n] = vkgdr_block_get_device_ptr(b);
            lens[n] = (unsigned int)vkgdr_block_get_size(b);
            tags[n] = workers[i].kept_tags[j];
        }
    }
    *(unsigned long long *)(tags + n) = 0;
    victim = corrupt ? first_kept(workers) : NULL;
    if (victim != NULL) {
        flip_last_byte(victim);
    }
    vkgdr_memory_flush(table, 0, SIZE_MAX);
    d = vkgdr_memory_get_device_ptr(table);
    d_ptrs = d;
    d_lens = d + 8 * n;
    d_tags = d + 12 * n;
    d_bad = d + 16 * n;
    args[0] = &d_ptrs;
    args[1] = &d_lens;
    args[2] = &d_tags;
    args[3] = &n;
    args[4] = &d_bad;
    CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CU_OK(cuLaunchKernel(check, 8, 1, 1, 256, 1, 1, 0, s, args, NULL));
    CU_OK(cuStreamSynchronize(s));
    vkgdr_memory_invalidate(table, 16 * n, 8);
    bad = *(volatile unsigned long long *)(tags + n);
    CHECK(vkgdr_memory_free_after(table, s) == VKGDR_SUCCESS, "the table, after its stream");
    CU_OK(cuStreamDestroy(s));
    if (victim != NULL) {
        flip_last_byte(victim);
    }
    return bad;
}

/* Under compute-sanitizer (scripts/gpu-check sets VKGDR_UNDER_SANITIZER under SANITIZE=1)
 * kernels run one at a time: a kernel launched beside the persistent one would never start. */
static int under_sanitizer(void)
{
    const char *v = getenv("VKGDR_UNDER_SANITIZER");
    return v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
}

/* check_kept's check done by the CPU, reading every kept block back through the library. */
static unsigned long long check_kept_on_cpu(worker *workers, int corrupt)
{
    unsigned long long bad = 0;
    vkgdr_block_t victim = corrupt ? first_kept(workers) : NULL;
    unsigned char *want, *back;
    int i, j;
    if (victim != NULL) {
        flip_last_byte(victim);
    }
    for (i = 0; i < WORKERS; i++) {
        for (j = 0; j < workers[i].n_kept; j++) {
            vkgdr_block_t b = workers[i].kept[j];
            size_t len = vkgdr_block_get_size(b);
            want = malloc(len);
            back = malloc(len);
            CHECK(want != NULL && back != NULL, "buffers for the CPU check");
            if (want != NULL && back != NULL) {
                tag_bytes(want, workers[i].kept_tags[j], len);
                if (vkgdr_block_read(b, 0, back, len) != VKGDR_SUCCESS || memcmp(want, back, len) != 0) {
                    bad++;
                }
            }
            free(want);
            free(back);
        }
    }
    if (victim != NULL) {
        flip_last_byte(victim);
    }
    return bad;
}

/* Raw allocations of up to 1 MiB are carved from shared 2 MiB granules, and one empty granule is
 * kept for the next: make sure it exists (three 1 MiB pieces need a granule beside the one that
 * holds the kernel's words), so that the figures before and after a pass see the same state. */
static void carve_baseline(vkgdr_t g)
{
    vkgdr_memory_t m[3];
    size_t n;
    int i;
    for (i = 0; i < 3; i++) {
        m[i] = vkgdr_memory_alloc(g, MIB, 0);
    }
    CHECK(m[0] != NULL && m[1] != NULL && m[2] != NULL, "three 1 MiB pieces");
    for (i = 0; i < 3; i++) {
        vkgdr_memory_free(m[i]);
    }
    n = vkgdr_wait_for_releases(g, 30000000000ll);
    CHECK(n == 0, "%zu releases still waiting after 30 s", n);
    /* The mappings of freed 2 and 4 MiB allocations, kept for the next of their size. */
    CHECK(vkgdr_trim(g, &n) == VKGDR_SUCCESS, "vkgdr_trim");
}

/* One pass of the churn beside the running kernel, for `seconds`. */
static void churn_beside(vkgdr_t g, CUcontext ctx, persistent *k, CUfunction check,
                         double seconds, const char *what)
{
    static worker workers[WORKERS];
    pthread_t threads[WORKERS];
    vkgdr_pool_config cfg;
    vkgdr_pool_t cached, uncached;
    unsigned long long ops = 0, oom = 0, errors = 0, beats_start = beats(k), beats_end, bad;
    int rounds = 0, stalls = 0, bar_errors = 0, kept = 0, i, j;
    double end = now() + seconds;
    size_t n;

    cached = vkgdr_pool_create(g, NULL);
    vkgdr_pool_config_init(&cfg, sizeof cfg);
    cfg.thread_cache = 0;
    uncached = vkgdr_pool_create(g, &cfg);
    CHECK(cached != NULL && uncached != NULL, "%s: pools", what);
    for (i = 0; i < WORKERS; i++) {
        memset(&workers[i], 0, sizeof workers[i]);
        workers[i].id = i;
        workers[i].g = g;
        workers[i].ctx = ctx;
        workers[i].pool = i == 2 ? uncached : cached;
        workers[i].end = end;
        pthread_create(&threads[i], NULL, work, &workers[i]);
    }
    exhaust_the_bar(g, k, end, &rounds, &stalls, &bar_errors);
    for (i = 0; i < WORKERS; i++) {
        pthread_join(threads[i], NULL);
        ops += workers[i].ops;
        oom += workers[i].oom;
        errors += workers[i].errors;
        kept += workers[i].n_kept;
    }
    set_state(MAIN_THREAD, "checking");
    CHECK(kernel_alive(k), "%s: the kernel stopped while the library was used", what);
    beats_end = beats(k);
    printf("%s: %llu operations, %llu out-of-memory answers, %d BAR exhaustions, %llu pools "
           "destroyed before their blocks; heartbeat %llu -> %llu\n",
           what, ops, oom, rounds, workers[7].destroyed_with_live_blocks, beats_start, beats_end);
    CHECK(errors == 0, "%s: %llu errors in the workers", what, errors);
    CHECK(bar_errors == 0 && rounds >= 1, "%s: %d BAR rounds, %d failed", what, rounds,
          bar_errors);
    CHECK(stalls == 0, "%s: the heartbeat stood still in %d of %d rounds", what, stalls, rounds);
    CHECK(beats_end > beats_start, "%s: heartbeat %llu -> %llu", what, beats_start, beats_end);
    CHECK(ops > 1000, "%s: only %llu operations", what, ops);
    for (i = 0; i < WORKERS; i++) {
        CHECK(workers[i].ops > 0, "%s: worker %d did nothing", what, i);
    }

    if (under_sanitizer()) {
        set_state(MAIN_THREAD, "CPU check of the kept blocks");
        bad = check_kept_on_cpu(workers, 0);
        CHECK(bad == 0, "%s: %llu of %d kept blocks changed", what, bad, kept);
        bad = check_kept_on_cpu(workers, 1);
        CHECK(bad == 1, "%s: the corrupted block was not found (%llu)", what, bad);
        printf("%s: %d kept blocks checked by the CPU (under compute-sanitizer "
               "kernels run one at a time)\n", what, kept);
    } else {
        set_state(MAIN_THREAD, "kernel check of the kept blocks");
        bad = check_kept(g, check, workers, 0);
        CHECK(bad == 0, "%s: %llu of %d kept blocks changed", what, bad, kept);
        bad = check_kept(g, check, workers, 1);
        CHECK(bad == 1, "%s: the corrupted block was not found (%llu)", what, bad);
        printf("%s: %d kept blocks checked by a kernel beside the persistent one\n", what, kept);
    }

    set_state(MAIN_THREAD, "freeing the kept blocks and the pools");
    for (i = 0; i < WORKERS; i++) {
        for (j = 0; j < workers[i].n_kept; j++) {
            vkgdr_block_free(workers[i].kept[j]);
        }
    }
    vkgdr_pool_destroy(cached);
    vkgdr_pool_destroy(uncached);
    set_state(MAIN_THREAD, "settling the releases");
    n = vkgdr_wait_for_releases(g, 30000000000ll);
    CHECK(n == 0, "%s: %zu releases still waiting after 30 s", what, n);
}

int main(int argc, char **argv)
{
    char *ptx = ptx_argument(argc, argv, "mapping.ptx");
    CUdevice dev = enter_primary_context();
    CUcontext ctx;
    CUmodule module;
    CUfunction check;
    CUstream kernel_stream;
    persistent k;
    pthread_t dog;
    vkgdr_t g;
    size_t vram_before, vram_after;
    int fds_before, fds_after;
    double start = now();
    unsigned long long zero = 0;
    void *zeros[5] = {&zero, &zero, &zero, &zero, &zero};
    CUdeviceptr stop, beat;
    void *spin_args[2] = {&stop, &beat};

    set_state(MAIN_THREAD, "starting");
    pthread_create(&dog, NULL, watchdog, NULL);
    CU_OK(cuCtxGetCurrent(&ctx));
    g = vkgdr_open(0, VKGDR_OPEN_CURRENT_CONTEXT_BIT);
    CHECK(g != NULL, "open");
    if (g == NULL) {
        return CHECK_SUMMARY("coexistence");
    }

    /* The module, and every kernel's first launch, before the persistent kernel starts. */
    memset(&k, 0, sizeof k);
    CU_OK(cuModuleLoadData(&module, ptx));
    CU_OK(cuModuleGetFunction(&k.spin, module, "spin_until_stopped"));
    CU_OK(cuModuleGetFunction(&check, module, "check_tagged_blocks"));
    k.words = vkgdr_memory_alloc(g, 4096, 0);
    CHECK(k.words != NULL, "the kernel's words");
    k.stop = vkgdr_memory_get_host_ptr(k.words);
    k.beats = (volatile unsigned long long *)((char *)k.stop + 64);
    k.d_words = vkgdr_memory_get_device_ptr(k.words);
    CU_OK(cuStreamCreate(&kernel_stream, CU_STREAM_NON_BLOCKING));
    set_state(MAIN_THREAD, "first launches");
    *k.stop = 1; /* the warm-up launch of spin_until_stopped exits at once */
    vkgdr_memory_flush(k.words, 0, 4);
    stop = k.d_words;
    beat = k.d_words + 64;
    CU_OK(cuLaunchKernel(k.spin, 1, 1, 1, 1, 1, 1, 0, kernel_stream, spin_args, NULL));
    CU_OK(cuLaunchKernel(check, 1, 1, 1, 1, 1, 1, 0, kernel_stream, zeros, NULL));
    CU_OK(cuStreamSynchronize(kernel_stream));

    set_state(MAIN_THREAD, "what a free waits for");
    releases_follow_their_stream(g, &k, kernel_stream);

    /* The churn beside the persistent kernel: a warm-up pass (what the driver sets up once per
     * process is no leak), then the measured one. */
    kernel_launch(&k, kernel_stream);
    churn_beside(g, ctx, &k, check, WARMUP_SECONDS, "warm-up");
    carve_baseline(g);
    fds_before = open_fds();
    vram_before = free_vram();
    churn_beside(g, ctx, &k, check, CHURN_SECONDS, "coexistence");
    /* The figures with the kernel still running, as at the start. */
    carve_baseline(g);
    fds_after = open_fds();
    vram_after = free_vram();
    set_state(MAIN_THREAD, "stopping the kernel");
    kernel_stop(&k);
    printf("coexistence: fds %d -> %d, free VRAM %zu -> %zu bytes\n", fds_before, fds_after,
           vram_before, vram_after);
    CHECK(fds_after == fds_before, "fds left behind: %d -> %d", fds_before, fds_after);
    /* Less than one VMM granule (2 MiB) apart: every allocation of the library is a granule or
     * more, so a leaked one would show. Not under compute-sanitizer, which allocates device
     * memory of its own as the run goes on. */
    CHECK(under_sanitizer() || (vram_after + MIB > vram_before && vram_before + MIB > vram_after),
          "device memory left behind: free VRAM %zu -> %zu bytes", vram_before, vram_after);

    set_state(MAIN_THREAD, "teardown");
    atomic_store(&watchdog_stop, NULL);
    vkgdr_memory_free(k.words);
    CHECK(vkgdr_wait_for_releases(g, 30000000000ll) == 0, "nothing left waiting");
    vkgdr_close(g);
    CU_OK(cuStreamDestroy(kernel_stream));
    CU_OK(cuModuleUnload(module));
    leave_primary_context(dev);
    free(ptx);
    atomic_store(&finished, 1);
    pthread_join(dog, NULL);
    printf("coexistence: %.1f s\n", now() - start);
    return CHECK_SUMMARY("coexistence");
}
