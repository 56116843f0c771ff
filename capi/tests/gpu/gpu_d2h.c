/* A device -> host ring from C: d2h_produce_test of kernels/ring_d2h.ptx publishes records from
 * 8 blocks of 64 threads into 4 lanes (two blocks a lane, 200 rounds a thread, so each lane of
 * 1024 slots wraps 25 times) while 4 C threads take them with vkgdr_d2h_ring_next, one lane each.
 * Every record must arrive once, in its lane's order (seq 0, 1, 2, ...), with kind 1, 64 bytes
 * and the words its thread wrote in that round (thread << 32 | round, + 1, ...), each thread's
 * rounds in order; after vkgdr_d2h_ring_finish each lane ends (VKGDR_D2H_RING_ENDED), the
 * kernel reports no refusal and the lane counters agree. Coherent and forced non-coherent,
 * and a ring of tagged slots (vkgdr_d2h_ring_create_with_format, 256-byte slots: 120 bytes).
 *
 * Then closing: a kernel fills a lane of 32 slots that nobody empties, the consumer takes 5
 * records and closes the lane, and the kernel, waiting for room, gives up with
 * VKGDR_D2H_CLOSED instead of hanging; the lane opens again on the next take, which finds the
 * other 27 records. Then misuse on a live ring: a lane that does not exist, a buffer too small,
 * an unset struct_size, a lane another thread is inside, a destroyed handle.
 *
 * Then device-side release: a pool whose release feed is a two-lane ring lends 300 blocks
 * (vkgdr_block_release_on_device); d2h_release_test hands their tokens back through
 * vkgdr_release_token, and the pool gets every block back; a second launch with the same
 * (now stale) tokens frees nothing; the feed's lanes are the pool's, not the C caller's. With
 * each slot format.
 *
 * Usage: gpu_d2h path/to/kernels/ring_d2h.ptx */
#define _POSIX_C_SOURCE 199309L /* nanosleep */
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "gpu_util.h"

#define LANES 4
#define BLOCKS 8
#define THREADS 64
#define ROUNDS 200
#define LEN 64
#define SEC 1000000000ll

typedef struct {
    vkgdr_d2h_ring_t ring;
    unsigned int lane;
    unsigned long long records, errors, ended;
    char first_error[200];
} lane_consumer;

static void lane_error(lane_consumer *c, const char *what, unsigned long long a,
                       unsigned long long b)
{
    if (c->errors++ == 0) {
        snprintf(c->first_error, sizeof c->first_error, "%s (%llu, %llu)", what, a, b);
    }
}

/* Takes lane `lane`'s records until the lane ends, checking each one. */
static void *consume(void *arg)
{
    lane_consumer *c = arg;
    unsigned int next_round[BLOCKS * THREADS] = {0};
    unsigned char buf[4096];
    vkgdr_d2h_record rec;
    time_t start = time(NULL);
    rec.struct_size = sizeof rec;
    while (time(NULL) - start < 120) {
        int r = vkgdr_d2h_ring_next(c->ring, c->lane, SEC, buf, sizeof buf, &rec);
        uint64_t w[LEN / 8];
        unsigned int thread, round, k;
        if (r == VKGDR_D2H_RING_EMPTY) {
            continue;
        }
        if (r == VKGDR_D2H_RING_ENDED) {
            c->ended = 1;
            break;
        }
        if (r != VKGDR_SUCCESS) {
            char *e = vkgdr_last_error();
            lane_error(c, e ? e : "next failed", (unsigned long long)r, 0);
            free(e);
            break;
        }
        if (rec.seq != c->records) {
            lane_error(c, "seq out of order", rec.seq, c->records);
        }
        if (rec.kind != 1 || rec.len != LEN) {
            lane_error(c, "kind, len", rec.kind, rec.len);
            c->records++;
            continue;
        }
        memcpy(w, buf, sizeof w);
        thread = (unsigned int)(w[0] >> 32);
        round = (unsigned int)w[0];
        if (thread >= BLOCKS * THREADS || (thread / THREADS) % LANES != c->lane) {
            lane_error(c, "a thread of another lane", thread, c->lane);
        } else {
            if (round != next_round[thread]) {
                lane_error(c, "a thread's rounds out of order", round, next_round[thread]);
            }
            next_round[thread] = round + 1;
        }
        for (k = 1; k < LEN / 8; k++) {
            if (w[k] != w[0] + k) {
                lane_error(c, "payload word", k, w[k]);
            }
        }
        c->records++;
    }
    for (unsigned int t = 0; t < BLOCKS * THREADS; t++) {
        if ((t / THREADS) % LANES == c->lane && next_round[t] != ROUNDS) {
            lane_error(c, "a thread's records missing", t, next_round[t]);
            break;
        }
    }
    return NULL;
}

static void stream_of_records(CUfunction produce, uint32_t open_flags, uint32_t format,
                              const char *what)
{
    vkgdr_t g = vkgdr_open(0, VKGDR_OPEN_CURRENT_CONTEXT_BIT | open_flags);
    const uint32_t stride = format == VKGDR_D2H_FORMAT_TAGGED ? 256 : 128;
    vkgdr_d2h_ring_t ring =
        format == VKGDR_D2H_FORMAT_COMMITTED
            ? vkgdr_d2h_ring_create(g, LANES, 1024, stride, 1u << 22)
            : vkgdr_d2h_ring_create_with_format(g, LANES, 1024, stride, 1u << 22, format);
    vkgdr_d2h_ring_device_view view;
    lane_consumer consumers[LANES];
    pthread_t threads[LANES];
    CUdeviceptr result = 0;
    CUstream stream;
    unsigned int rounds = ROUNDS, len = LEN, i;
    uint64_t res[5] = {0};
    void *args[4];
    const unsigned long long per_lane = (unsigned long long)BLOCKS / LANES * THREADS * ROUNDS;

    CHECK(g != NULL && ring != NULL, "%s: open and create", what);
    if (ring == NULL) {
        vkgdr_close(g);
        return;
    }
    CHECK(vkgdr_d2h_ring_get_lanes(ring) == LANES, "%s: lanes", what);
    CHECK(vkgdr_d2h_ring_get_max_payload(ring) == (format == VKGDR_D2H_FORMAT_TAGGED ? 120 : 112),
          "%s: max payload", what);
    CHECK(vkgdr_d2h_ring_get_device_view(ring, &view) == VKGDR_SUCCESS, "%s: view", what);
    CHECK(view.lanes == LANES && view.slots_per_lane == 1024 && view.stride == stride &&
              view.spin_limit == 1u << 22 && view.slots != 0 && view.control != 0 &&
              view.device == view.control + LANES * 128ull && view.format == format &&
              view.reserved == 0,
          "%s: the view's fields", what);
    CU_OK(cuMemAlloc(&result, sizeof res));
    CU_OK(cuMemsetD8(result, 0, sizeof res));
    CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

    for (i = 0; i < LANES; i++) {
        memset(&consumers[i], 0, sizeof consumers[i]);
        consumers[i].ring = ring;
        consumers[i].lane = i;
        pthread_create(&threads[i], NULL, consume, &consumers[i]);
    }
    args[0] = &view;
    args[1] = &rounds;
    args[2] = &len;
    args[3] = &result;
    CU_OK(cuLaunchKernel(produce, BLOCKS, 1, 1, THREADS, 1, 1, 0, stream, args, NULL));
    CHECK(wait_stream(stream, 120), "%s: the producing kernel did not finish", what);
    CHECK(vkgdr_d2h_ring_finish(ring) == VKGDR_SUCCESS, "%s: finish", what);
    for (i = 0; i < LANES; i++) {
        vkgdr_d2h_lane_stats stats;
        pthread_join(threads[i], NULL);
        CHECK(consumers[i].errors == 0, "%s: lane %u: %llu errors, the first: %s", what, i,
              consumers[i].errors, consumers[i].first_error);
        CHECK(consumers[i].records == per_lane && consumers[i].ended,
              "%s: lane %u took %llu records of %llu, ended %llu", what, i, consumers[i].records,
              per_lane, consumers[i].ended);
        stats.struct_size = sizeof stats;
        CHECK(vkgdr_d2h_ring_get_lane_stats(ring, i, &stats) == VKGDR_SUCCESS, "%s: stats", what);
        CHECK(stats.reserved == per_lane && stats.taken == per_lane && stats.gave_up == 0,
              "%s: lane %u: reserved %llu, taken %llu, gave up %llu", what, i,
              (unsigned long long)stats.reserved, (unsigned long long)stats.taken,
              (unsigned long long)stats.gave_up);
    }
    CU_OK(cuMemcpyDtoH(res, result, sizeof res));
    CHECK(res[0] == 0, "%s: the kernel was refused %llu times (closed %llu, stalled %llu)", what,
          (unsigned long long)res[0], (unsigned long long)res[2], (unsigned long long)res[3]);
    printf("%s: %llu records through %d lanes, each in order\n", what, per_lane * LANES, LANES);
    cuMemFree(result);
    cuStreamDestroy(stream);
    vkgdr_d2h_ring_destroy(ring);
    vkgdr_close(g);
    CHECK(no_last_error(), "%s: teardown", what);
}

typedef struct {
    vkgdr_d2h_ring_t ring;
    int rc;
} lane_waiter;

/* Waits in vkgdr_d2h_ring_next on lane 0 for 2 s (nothing comes). */
static void *wait_on_lane_0(void *arg)
{
    lane_waiter *w = arg;
    unsigned char buf[64];
    vkgdr_d2h_record rec;
    rec.struct_size = sizeof rec;
    w->rc = vkgdr_d2h_ring_next(w->ring, 0, 2 * SEC, buf, sizeof buf, &rec);
    return NULL;
}

static void closing_and_misuse(CUfunction produce)
{
    vkgdr_t g = vkgdr_open(0, VKGDR_OPEN_CURRENT_CONTEXT_BIT);
    /* A spin budget of minutes: only the close can end the kernel's wait in time. */
    vkgdr_d2h_ring_t ring = vkgdr_d2h_ring_create(g, 1, 32, 64, 1u << 30);
    vkgdr_d2h_ring_device_view view;
    vkgdr_d2h_record rec;
    vkgdr_d2h_lane_stats stats;
    unsigned char buf[64];
    CUdeviceptr result = 0;
    CUstream stream;
    unsigned int rounds = 10, len = 48, taken = 0, i;
    uint64_t res[5] = {0};
    void *args[4];
    int r;
    lane_waiter waiter;
    pthread_t thread;

    CHECK(g != NULL && ring != NULL, "close: open and create");
    if (ring == NULL) {
        vkgdr_close(g);
        return;
    }
    rec.struct_size = sizeof rec;
    CHECK(vkgdr_d2h_ring_get_device_view(ring, &view) == VKGDR_SUCCESS, "close: view");
    CU_OK(cuMemAlloc(&result, sizeof res));
    CU_OK(cuMemsetD8(result, 0, sizeof res));
    CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    args[0] = &view;
    args[1] = &rounds;
    args[2] = &len;
    args[3] = &result;
    /* One warp, 10 rounds of 32 records into 32 slots: it fills the lane and waits. */
    CU_OK(cuLaunchKernel(produce, 1, 1, 1, 32, 1, 1, 0, stream, args, NULL));
    for (i = 0; i < 5; i++) {
        r = vkgdr_d2h_ring_next(ring, 0, 30 * SEC, buf, sizeof buf, &rec);
        CHECK(r == VKGDR_SUCCESS && rec.seq == i && rec.len == 48, "close: record %u: %d", i, r);
        taken += r == VKGDR_SUCCESS;
    }
    /* A take leaves the head one record behind until the lane's next call. */
    stats.struct_size = sizeof stats;
    CHECK(vkgdr_d2h_ring_get_lane_stats(ring, 0, &stats) == VKGDR_SUCCESS && stats.taken == 4,
          "the head one behind after the takes: %llu", (unsigned long long)stats.taken);
    CHECK(vkgdr_d2h_ring_publish_head(ring, 0) == VKGDR_SUCCESS, "publish the head");
    CHECK(vkgdr_d2h_ring_get_lane_stats(ring, 0, &stats) == VKGDR_SUCCESS && stats.taken == 5,
          "the head past every record taken: %llu", (unsigned long long)stats.taken);
    CHECK(vkgdr_d2h_ring_publish_head(ring, 1) == VKGDR_ERROR, "no lane 1");
    CHECK(vkgdr_d2h_ring_close_lane(ring, 0) == VKGDR_SUCCESS, "close the lane");
    CHECK(wait_stream(stream, 60), "the kernel still waits for room after the close");
    CU_OK(cuMemcpyDtoH(res, result, sizeof res));
    CHECK(res[0] == 32 && res[2] == 32, "every thread gave up with VKGDR_D2H_CLOSED: %llu, %llu",
          (unsigned long long)res[0], (unsigned long long)res[2]);
    stats.struct_size = sizeof stats;
    CHECK(vkgdr_d2h_ring_get_lane_stats(ring, 0, &stats) == VKGDR_SUCCESS && stats.taken == 5 &&
              stats.reserved == 32 && stats.gave_up >= 1,
          "close: reserved %llu, taken %llu, gave up %llu", (unsigned long long)stats.reserved,
          (unsigned long long)stats.taken, (unsigned long long)stats.gave_up);
    /* The next take opens the lane again, where the consumer stopped. */
    CHECK(vkgdr_d2h_ring_finish(ring) == VKGDR_SUCCESS, "finish");
    while ((r = vkgdr_d2h_ring_try_next(ring, 0, buf, sizeof buf, &rec)) == VKGDR_SUCCESS) {
        CHECK(rec.seq == taken, "reopened: seq %llu, expected %u", (unsigned long long)rec.seq,
              taken);
        taken++;
    }
    CHECK(r == VKGDR_D2H_RING_ENDED && taken == 32, "reopened: %d after %u records", r, taken);
    CHECK(vkgdr_d2h_ring_restart(ring) == VKGDR_SUCCESS, "restart");
    CHECK(vkgdr_d2h_ring_try_next(ring, 0, buf, sizeof buf, &rec) == VKGDR_D2H_RING_EMPTY,
          "after a restart an empty lane waits again");

    /* Misuse on a live ring. */
    CHECK(vkgdr_d2h_ring_try_next(ring, 1, buf, sizeof buf, &rec) == VKGDR_ERROR, "lane 1");
    CHECK(last_error_contains("vkgdr_d2h_ring_try_next: lane 1 does not exist (the ring has 1)"),
          "named");
    CHECK(vkgdr_d2h_ring_try_next(ring, 0, buf, 47, &rec) == VKGDR_ERROR, "a 47-byte buffer");
    CHECK(last_error_contains("smaller than the ring's largest payload, 48 bytes"), "explains");
    CHECK(vkgdr_d2h_ring_try_next(ring, 0, NULL, 64, &rec) == VKGDR_ERROR, "a NULL buffer");
    rec.struct_size = 0;
    CHECK(vkgdr_d2h_ring_try_next(ring, 0, buf, sizeof buf, &rec) == VKGDR_ERROR, "size unset");
    CHECK(last_error_contains("vkgdr_d2h_record.struct_size is 0"), "explains");
    CHECK(vkgdr_d2h_ring_try_next(ring, 0, buf, sizeof buf, NULL) == VKGDR_ERROR, "NULL record");
    CHECK(vkgdr_d2h_ring_get_lane_stats(ring, 3, &stats) == VKGDR_ERROR, "stats of lane 3");
    CHECK(vkgdr_d2h_ring_close_lane(ring, 7) == VKGDR_ERROR, "close lane 7");
    CHECK(last_error_contains("lane 7 does not exist"), "named");
    /* A lane another thread is inside: refused at once, not waited for. */
    waiter.rc = -7;
    waiter.ring = ring;
    pthread_create(&thread, NULL, wait_on_lane_0, &waiter);
    {
        struct timespec ms = {0, 300000000};
        nanosleep(&ms, NULL);
    }
    rec.struct_size = sizeof rec;
    CHECK(vkgdr_d2h_ring_try_next(ring, 0, buf, sizeof buf, &rec) == VKGDR_ERROR,
          "a second thread on lane 0");
    CHECK(last_error_contains("lane 0 is in use by another thread"), "explains");
    pthread_join(thread, NULL);
    CHECK(waiter.rc == VKGDR_D2H_RING_EMPTY, "the waiter timed out: %d", waiter.rc);

    cuMemFree(result);
    cuStreamDestroy(stream);
    vkgdr_d2h_ring_destroy(ring);
    CHECK(vkgdr_d2h_ring_try_next(ring, 0, buf, sizeof buf, &rec) == VKGDR_ERROR, "destroyed");
    CHECK(last_error_contains("invalid vkgdr_d2h_ring_t handle"), "named");
    vkgdr_d2h_ring_destroy(ring);
    CHECK(last_error_contains("vkgdr_d2h_ring_destroy: invalid vkgdr_d2h_ring_t"), "twice");
    vkgdr_close(g);
}

#define LENT 300

static void device_releases(CUfunction release, uint32_t format)
{
    vkgdr_t g = vkgdr_open(0, VKGDR_OPEN_CURRENT_CONTEXT_BIT);
    vkgdr_pool_t pool = vkgdr_pool_create(g, NULL);
    vkgdr_d2h_ring_t ring = vkgdr_d2h_ring_create_with_format(g, 2, 64, 64, 1u << 22, format);
    vkgdr_d2h_ring_device_view view;
    vkgdr_d2h_record rec;
    vkgdr_pool_stats stats;
    uint64_t tokens[LENT], res[5] = {0};
    unsigned char buf[64];
    CUdeviceptr dtokens = 0, result = 0;
    unsigned int n = LENT, i, lent = 0, round;
    void *args[4];
    time_t start;

    CHECK(g != NULL && pool != NULL && ring != NULL, "release: open and create");
    if (ring == NULL || pool == NULL) {
        return;
    }
    CHECK(vkgdr_pool_set_release_feed(pool, ring) == VKGDR_SUCCESS, "release feed");
    CHECK(vkgdr_pool_set_release_feed(pool, ring) == VKGDR_ERROR, "a second feed");
    rec.struct_size = sizeof rec;
    CHECK(vkgdr_d2h_ring_try_next(ring, 0, buf, sizeof buf, &rec) == VKGDR_ERROR,
          "the feed's lanes are the pool's");
    CHECK(last_error_contains("lane 0 has a consumer already"), "explains");
    for (i = 0; i < LENT; i++) {
        vkgdr_block_t b = vkgdr_pool_alloc(pool, 64 + i, 16);
        lent += b != NULL && vkgdr_block_release_on_device(b, &tokens[i]) == VKGDR_SUCCESS;
    }
    CHECK(lent == LENT && vkgdr_pool_get_lent_blocks(pool) == LENT, "lent %u", lent);
    CHECK(vkgdr_d2h_ring_get_device_view(ring, &view) == VKGDR_SUCCESS, "release: view");
    CU_OK(cuMemAlloc(&dtokens, sizeof tokens));
    CU_OK(cuMemcpyHtoD(dtokens, tokens, sizeof tokens));
    CU_OK(cuMemAlloc(&result, sizeof res));
    for (round = 0; round < 2; round++) {
        CU_OK(cuMemsetD8(result, 0, sizeof res));
        args[0] = &view;
        args[1] = &dtokens;
        args[2] = &n;
        args[3] = &result;
        CU_OK(cuLaunchKernel(release, (LENT + 63) / 64, 1, 1, 64, 1, 1, 0, NULL, args, NULL));
        CU_OK(cuCtxSynchronize());
        CU_OK(cuMemcpyDtoH(res, result, sizeof res));
        CHECK(res[0] == 0, "release (format %u) round %u: %llu refusals", format, round,
              (unsigned long long)res[0]);
        /* The pool's thread drains the lanes while blocks are lent; this drains the spent
         * tokens of the second launch too. */
        start = time(NULL);
        stats.struct_size = sizeof stats;
        while (time(NULL) - start < 30) {
            struct timespec ms = {0, 1000000};
            vkgdr_pool_drain_device_releases(pool);
            vkgdr_pool_get_stats(pool, &stats);
            if (stats.lent_blocks == 0 && stats.tokens_refused >= LENT * round) {
                break;
            }
            nanosleep(&ms, NULL);
        }
        CHECK(vkgdr_pool_get_lent_blocks(pool) == 0,
              "release (format %u) round %u: %llu blocks still lent", format, round,
              (unsigned long long)vkgdr_pool_get_lent_blocks(pool));
        stats.struct_size = sizeof stats;
        CHECK(vkgdr_pool_get_stats(pool, &stats) == VKGDR_SUCCESS && stats.tokens_issued == LENT &&
                  stats.tokens_redeemed == LENT && stats.tokens_refused == LENT * round &&
                  stats.release_lane_broken == 0,
              "release (format %u) round %u: issued %llu, redeemed %llu, refused %llu", format,
              round, (unsigned long long)stats.tokens_issued, (unsigned long long)stats.tokens_redeemed,
              (unsigned long long)stats.tokens_refused);
    }
    CHECK(vkgdr_pool_reclaim_device_releases(pool) == 0, "nothing left to reclaim");
    cuMemFree(dtokens);
    cuMemFree(result);
    vkgdr_d2h_ring_destroy(ring);
    mark_last_error();
    vkgdr_pool_destroy(pool);
    vkgdr_close(g);
    CHECK(still_marked(), "release: teardown");
}

int main(int argc, char **argv)
{
    char *ptx = ptx_argument(argc, argv, "ring_d2h.ptx");
    CUdevice dev = enter_primary_context();
    CUmodule module;
    CUfunction produce = load_kernel(ptx, "d2h_produce_test", &module);
    stream_of_records(produce, 0, VKGDR_D2H_FORMAT_COMMITTED, "device -> host ring");
    stream_of_records(produce, VKGDR_OPEN_FORCE_NON_COHERENT_BIT, VKGDR_D2H_FORMAT_COMMITTED,
                      "non-coherent");
    stream_of_records(produce, 0, VKGDR_D2H_FORMAT_TAGGED, "tagged slots");
    closing_and_misuse(produce);
    {
        CUfunction release = NULL;
        CU_OK(cuModuleGetFunction(&release, module, "d2h_release_test"));
        device_releases(release, VKGDR_D2H_FORMAT_COMMITTED);
        device_releases(release, VKGDR_D2H_FORMAT_TAGGED);
    }
    cuModuleUnload(module);
    leave_primary_context(dev);
    free(ptx);
    return CHECK_SUMMARY("gpu_d2h");
}
