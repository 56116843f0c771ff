/* A C ring feeding a kernel: ring_consume_persistent[_mirrored] of kernels/ring.ptx stays resident
 * and consumes the records that C threads reserve, write (sequence number and checksum inside the
 * payload, in the test format of kernels/ring.cu) and commit; some reservations are cancelled
 * (they become padding that keeps its number). Before the consumer starts, one thread pushes until
 * the ring reports VKGDR_RING_FULL; afterwards it pushes a few more. The kernel's result words
 * must count every record once, in order, with the producers' checksum sum and no error.
 * Padded ring (coherent and forced non-coherent) and mirrored ring.
 *
 * Then a two-lane ring made with vkgdr_ring_create_with_options, consumed by ring_check_lanes (one
 * block per lane, the view passed by value): two threads with a vkgdr_ring_producer_t each push,
 * write and batch records of mixed sizes, a share of them 8 KiB and more so that the copy engine
 * carries them; every lane's result words must match what its producer wrote, and the copy-engine
 * counters must show copies and no fallback. A third producer is refused while both lanes are
 * taken, and a producer keeps its ring alive after vkgdr_ring_destroy.
 *
 * Usage: gpu_ring path/to/kernels/ring.ptx */
#define _POSIX_C_SOURCE 199309L /* nanosleep */
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "gpu_util.h"

#define PRODUCERS 4
/* Threads per block of the checking kernels of kernels/ring.cu (RING_THREADS there). */
#define CHECK_THREADS 512
#define CANCEL_EVERY 997

typedef struct {
    vkgdr_ring_t ring;
    unsigned long long records, max_body;
    unsigned long long data, sum, errors;
} producer;

static void *produce(void *arg)
{
    producer *w = arg;
    unsigned char *buf = malloc(16 + w->max_body);
    unsigned long long k;
    for (k = 0; k < w->records; k++) {
        size_t len = 16 + (size_t)((k * 7919u + (uintptr_t)w) % w->max_body);
        vkgdr_ring_reservation_t r = NULL;
        uint64_t seq, sum;
        if (vkgdr_ring_reserve(w->ring, len, 30000000000ll, &r) != VKGDR_SUCCESS) {
            w->errors++;
            break;
        }
        seq = vkgdr_ring_reservation_get_seq(r);
        if (seq % CANCEL_EVERY == 0) {
            vkgdr_ring_cancel(r);
            continue;
        }
        sum = make_test_payload(buf, len, seq);
        /* In two pieces, to exercise offsets. */
        w->errors += vkgdr_ring_reservation_write(r, 0, buf, 16) != VKGDR_SUCCESS;
        w->errors += vkgdr_ring_reservation_write(r, 16, buf + 16, len - 16) != VKGDR_SUCCESS;
        w->errors += vkgdr_ring_commit(r) != VKGDR_SUCCESS;
        w->data++;
        w->sum += sum;
    }
    free(buf);
    return NULL;
}

static void run(CUmodule module, uint32_t open_flags, int mirrored, unsigned long long records,
                unsigned long long max_body, const char *what)
{
    vkgdr_t g = vkgdr_open(0, VKGDR_OPEN_CURRENT_CONTEXT_BIT | open_flags);
    vkgdr_ring_t ring = vkgdr_ring_create(g, mirrored ? 2u << 20 : 1u << 20,
                                          mirrored ? VKGDR_RING_MIRRORED_BIT : 0);
    vkgdr_ring_device_view v;
    CUfunction consume = NULL;
    CUstream stream;
    producer workers[PRODUCERS];
    pthread_t threads[PRODUCERS];
    unsigned char payload[200];
    unsigned long long data = 0, seqs = 0, sum = 0, errors = 0;
    uint64_t seq = 0, res[8] = {0};
    void *args[6];
    int i, r;

    CHECK(g != NULL && ring != NULL, "%s: open and create", what);
    if (ring == NULL) {
        vkgdr_close(g);
        return;
    }
    v.struct_size = sizeof v;
    CHECK(vkgdr_ring_get_device_view(ring, &v) == VKGDR_SUCCESS && v.mirrored == (uint32_t)mirrored,
          "%s: view", what);
    CU_OK(cuModuleGetFunction(&consume, module, mirrored ? "ring_consume_persistent_mirrored"
                                                         : "ring_consume_persistent"));

    /* No consumer yet: fill the ring from one thread (its numbers are predictable). */
    if (!mirrored) {
        for (;;) {
            uint64_t sum1 = make_test_payload(payload, sizeof payload, seqs);
            r = vkgdr_ring_push(ring, payload, sizeof payload, 0, &seq);
            if (r != VKGDR_SUCCESS) {
                break;
            }
            errors += seq != seqs;
            seqs++;
            data++;
            sum += sum1;
        }
        CHECK(r == VKGDR_RING_FULL && seqs > 1000, "%s: %d after %llu pushes", what, r, seqs);
    }

    CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    args[0] = &v.data;
    args[1] = &v.capacity;
    args[2] = &v.tail;
    args[3] = &v.stop;
    args[4] = &v.head;
    args[5] = &v.result;
    CU_OK(cuLaunchKernel(consume, 1, 1, 1, CHECK_THREADS, 1, 1, 0, stream, args, NULL));

    for (i = 0; i < PRODUCERS; i++) {
        memset(&workers[i], 0, sizeof workers[i]);
        workers[i].ring = ring;
        workers[i].records = records / PRODUCERS;
        workers[i].max_body = max_body;
        pthread_create(&threads[i], NULL, produce, &workers[i]);
    }
    for (i = 0; i < PRODUCERS; i++) {
        pthread_join(threads[i], NULL);
        data += workers[i].data;
        sum += workers[i].sum;
        errors += workers[i].errors;
        seqs += workers[i].records;
    }
    /* After the threads: a few more pushes, numbered on from every reservation so far. */
    for (i = 0; i < 50; i++, seqs++) {
        sum += make_test_payload(payload, sizeof payload, seqs);
        errors += vkgdr_ring_push(ring, payload, sizeof payload, -1, &seq) != VKGDR_SUCCESS;
        errors += seq != seqs;
        data++;
    }
    CHECK(errors == 0, "%s: %llu producer errors", what, errors);

    CHECK(vkgdr_ring_stop(ring) == VKGDR_SUCCESS, "%s: stop", what);
    CHECK(wait_stream(stream, 60), "%s: the consumer did not finish", what);
    CHECK(vkgdr_ring_get_results(ring, res, 5) == VKGDR_SUCCESS, "%s: results", what);
    CHECK(res[2] == 0, "%s: the kernel found %llu bad records", what,
          (unsigned long long)res[2]);
    CHECK(res[0] == data, "%s: %llu records consumed, %llu produced", what,
          (unsigned long long)res[0], data);
    CHECK(res[3] == seqs, "%s: next seq %llu, expected %llu", what, (unsigned long long)res[3],
          seqs);
    CHECK(res[1] == sum, "%s: checksum sum differs", what);
    CHECK(vkgdr_ring_get_head(ring) == res[4], "%s: head %llu, position %llu", what,
          (unsigned long long)vkgdr_ring_get_head(ring), (unsigned long long)res[4]);
    printf("%s: %llu records (%llu cancelled) consumed by a persistent kernel\n", what, data,
           seqs - data);
    cuStreamDestroy(stream);
    vkgdr_ring_destroy(ring);
    vkgdr_close(g);
    CHECK(no_last_error(), "%s: teardown", what);
}

/* vkgdr_ring_view of include/vkgdr/ring.cuh: what ring_check_lanes takes by value. */
typedef struct {
    unsigned long long data, capacity, tail, stop, head, result, lane_data;
    unsigned int lanes, wrap;
} ring_view_arg;
_Static_assert(sizeof(ring_view_arg) == 64, "vkgdr_ring_view is 64 bytes");

/* Launches ring_check_lanes (one block of CHECK_THREADS per lane) over the ring of view `v` on
 * a new non-blocking stream, registered as the ring's consumer; returns the stream. */
static CUstream launch_check_lanes(CUmodule module, vkgdr_ring_t ring,
                                   const vkgdr_ring_device_view *v, const char *what)
{
    ring_view_arg arg;
    CUfunction check = NULL;
    CUstream stream;
    void *args[1] = { &arg };
    arg.data = v->data;
    arg.capacity = v->capacity;
    arg.tail = v->tail;
    arg.stop = v->stop;
    arg.head = v->head;
    arg.result = v->result;
    arg.lane_data = v->lane_data;
    arg.lanes = v->lanes;
    arg.wrap = v->mirrored;
    CU_OK(cuModuleGetFunction(&check, module, "ring_check_lanes"));
    CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CU_OK(cuLaunchKernel(check, v->lanes, 1, 1, CHECK_THREADS, 1, 1, 0, stream, args, NULL));
    CHECK(vkgdr_ring_watch_consumer(ring, stream) == VKGDR_SUCCESS, "%s: watch", what);
    return stream;
}

#define LANE_RECORDS 6000
#define LARGE_MIN 8192u
#define LARGE_SPAN 57000u
#define BATCH 4

typedef struct {
    vkgdr_ring_producer_t producer;
    int salt;
    unsigned long long records, sum, errors, large;
} lane_producer;

/* Payload length of record `k` of a producer: every fifth one 8 KiB or more (the copy engine's
 * share with the default 4096-byte threshold), the others 16 to ~1 KiB (the BAR's). */
static size_t lane_record_len(unsigned long long k, int salt)
{
    if (k % 5 == 0) {
        return LARGE_MIN + (size_t)((k * 7919u + (unsigned)salt) % LARGE_SPAN);
    }
    return 16 + (size_t)((k * 131u + (unsigned)salt) % 1000u);
}

/* Writes LANE_RECORDS records through the producer: one push, two writes (published by the
 * flush policy), then a batch of BATCH, over and over; checks every sequence number. */
static void *produce_lane(void *arg)
{
    lane_producer *w = arg;
    unsigned char *bufs[BATCH];
    const void *ptrs[BATCH];
    size_t sizes[BATCH];
    unsigned long long k = 0;
    uint64_t seq = 0, expect = vkgdr_ring_producer_get_next_seq(w->producer);
    int i;
    w->errors += expect != 0; /* a new lane: numbering starts at 0 */
    for (i = 0; i < BATCH; i++) {
        bufs[i] = malloc(LARGE_MIN + LARGE_SPAN + 16);
    }
    while (k < LANE_RECORDS) {
        int mode = (int)(k % 7);
        size_t len = lane_record_len(k, w->salt);
        if (mode == 0) {
            w->sum += make_test_payload(bufs[0], len, expect);
            w->errors += vkgdr_ring_producer_push(w->producer, bufs[0], len, 30000000000ll,
                                                  &seq) != VKGDR_SUCCESS;
            w->errors += seq != expect;
            w->large += len >= LARGE_MIN;
            expect++, k++;
        } else if (mode <= 2) {
            w->sum += make_test_payload(bufs[0], len, expect);
            w->errors += vkgdr_ring_producer_write(w->producer, bufs[0], len, 30000000000ll,
                                                   &seq) != VKGDR_SUCCESS;
            w->errors += seq != expect;
            w->large += len >= LARGE_MIN;
            expect++, k++;
        } else {
            size_t written = 0;
            int n = LANE_RECORDS - k < BATCH ? (int)(LANE_RECORDS - k) : BATCH;
            for (i = 0; i < n; i++) {
                sizes[i] = lane_record_len(k + (unsigned)i, w->salt);
                w->sum += make_test_payload(bufs[i], sizes[i], expect + (unsigned)i);
                w->large += sizes[i] >= LARGE_MIN;
                ptrs[i] = bufs[i];
            }
            w->errors += vkgdr_ring_producer_push_batch(w->producer, ptrs, sizes, (size_t)n,
                                                        30000000000ll, &written) != VKGDR_SUCCESS;
            w->errors += written != (size_t)n;
            expect += (unsigned)n, k += (unsigned)n;
        }
    }
    w->errors += vkgdr_ring_producer_flush(w->producer) != VKGDR_SUCCESS;
    w->errors += vkgdr_ring_producer_get_next_seq(w->producer) != expect;
    w->records = k;
    for (i = 0; i < BATCH; i++) {
        free(bufs[i]);
    }
    return NULL;
}

/* How run_lanes makes its ring: the copy engine from 4 KiB on both lanes, the ring's own choice
 * (the default options: lane 0 keeps records below 8 KiB on the BAR, lane 1 stages records of
 * 1 KiB and more; both take a staging copy), or every record through the BAR. */
enum lanes_mode { LANES_COPY_ENGINE, LANES_DEFAULT, LANES_OFF };

static void run_lanes(CUmodule module, enum lanes_mode mode)
{
    const char *what = mode == LANES_COPY_ENGINE ? "two lanes, producers, copy engine"
                       : mode == LANES_DEFAULT   ? "two lanes, producers, default options"
                                                 : "two lanes, producers, copy engine off";
    /* Lanes with a staging copy, and whether copies carried records, once both have run. */
    const unsigned int want_ready = mode == LANES_OFF ? 0u : 2u;
    vkgdr_t g = vkgdr_open(0, VKGDR_OPEN_CURRENT_CONTEXT_BIT);
    vkgdr_ring_options opts;
    vkgdr_ring_t ring;
    vkgdr_ring_device_view v;
    vkgdr_ring_copy_engine_stats stats;
    CUstream stream;
    lane_producer workers[2];
    pthread_t threads[2];
    vkgdr_ring_producer_t third;
    uint64_t res[8];
    uint32_t lanes[2];
    int i;

    CHECK(vkgdr_ring_options_init(&opts, sizeof opts) == VKGDR_SUCCESS && opts.lanes == 1 &&
              opts.flags == 0 && opts.copy_engine_record == 0,
          "%s: option defaults", what);
    opts.lanes = 2;
    if (mode == LANES_COPY_ENGINE) {
        opts.copy_engine_record = 4096; /* every lane stages from 4 KiB */
    } else if (mode == LANES_OFF) {
        opts.flags = VKGDR_RING_COPY_ENGINE_OFF_BIT;
    }
    ring = vkgdr_ring_create_with_options(g, 1u << 20, &opts);
    CHECK(g != NULL && ring != NULL, "%s: open and create", what);
    if (ring == NULL) {
        vkgdr_close(g);
        return;
    }
    CHECK(vkgdr_ring_get_lanes(ring) == 2, "%s: lanes", what);
    v.struct_size = sizeof v;
    CHECK(vkgdr_ring_get_device_view(ring, &v) == VKGDR_SUCCESS && v.lanes == 2 &&
              v.lane_data != 0 && v.mirrored == 0,
          "%s: view", what);
    stream = launch_check_lanes(module, ring, &v, what);

    memset(workers, 0, sizeof workers);
    for (i = 0; i < 2; i++) {
        workers[i].producer = vkgdr_ring_producer_create(ring);
        workers[i].salt = 17 * i + 3;
        CHECK(workers[i].producer != NULL, "%s: producer %d", what, i);
        lanes[i] = vkgdr_ring_producer_get_lane(workers[i].producer);
    }
    CHECK(lanes[0] != lanes[1] && lanes[0] < 2 && lanes[1] < 2, "%s: lanes %u and %u", what,
          lanes[0], lanes[1]);
    third = vkgdr_ring_producer_create(ring);
    CHECK(third == NULL, "%s: a third producer on two lanes", what);
    CHECK(last_error_contains("every one of the ring's 2 lanes has a producer"), "%s: explains",
          what);
    /* The producer of lane 0 publishes by a small policy with a time bound; the one of lane 1
     * gathers up to 1 MiB, so its large records are staged where its lane stages (the copy
     * engine takes them once a batch has 64 KiB pending before them). */
    for (i = 0; i < 2; i++) {
        CHECK(vkgdr_ring_producer_set_flush_policy(workers[i].producer,
                                                   lanes[i] == 1 ? 1u << 20 : 16384,
                                                   lanes[i] == 1 ? -1 : 100000) == VKGDR_SUCCESS,
              "%s: policy", what);
    }
    for (i = 0; i < 2; i++) {
        pthread_create(&threads[i], NULL, produce_lane, &workers[i]);
    }
    for (i = 0; i < 2; i++) {
        pthread_join(threads[i], NULL);
        CHECK(workers[i].errors == 0, "%s: producer %d: %llu errors", what, i, workers[i].errors);
        CHECK(workers[i].large > LANE_RECORDS / 10, "%s: %llu large records", what,
              workers[i].large);
        /* Destroying publishes what is left (nothing, after the flush) and frees the lane. */
        vkgdr_ring_producer_destroy(workers[i].producer);
    }
    third = vkgdr_ring_producer_create(ring);
    CHECK(third != NULL, "%s: a lane is free again", what);
    vkgdr_ring_producer_destroy(third);

    CHECK(vkgdr_ring_stop(ring) == VKGDR_SUCCESS, "%s: stop", what);
    CHECK(wait_stream(stream, 60), "%s: the consumer did not finish", what);
    for (i = 0; i < 2; i++) {
        memset(res, 0, sizeof res);
        CHECK(vkgdr_ring_get_lane_results(ring, lanes[i], res, 5) == VKGDR_SUCCESS,
              "%s: results", what);
        CHECK(res[2] == 0, "%s: lane %u: the kernel found %llu bad records", what, lanes[i],
              (unsigned long long)res[2]);
        CHECK(res[0] == workers[i].records, "%s: lane %u: %llu records consumed, %llu produced",
              what, lanes[i], (unsigned long long)res[0], workers[i].records);
        CHECK(res[3] == workers[i].records, "%s: lane %u: next seq %llu", what, lanes[i],
              (unsigned long long)res[3]);
        CHECK(res[1] == workers[i].sum, "%s: lane %u: checksum sum differs", what, lanes[i]);
        CHECK(vkgdr_ring_get_lane_head(ring, lanes[i]) == res[4], "%s: lane %u: head", what,
              lanes[i]);
    }
    CHECK(vkgdr_ring_get_lane_head(ring, 2) == UINT64_MAX, "%s: no lane 2", what);
    CHECK(last_error_contains("lane 2 does not exist (the ring has 2)"), "%s: explains", what);
    mark_last_error(); /* nothing may fail from here on */

    stats.struct_size = sizeof stats;
    CHECK(vkgdr_ring_get_copy_engine_stats(ring, &stats) == VKGDR_SUCCESS, "%s: stats", what);
    if (stats.unavailable) {
        char *why = vkgdr_ring_get_copy_engine_error(ring);
        CHECK(0, "%s: copy engine unavailable: %s", what, why ? why : "(no reason)");
        free(why);
    }
    CHECK(stats.lanes_ready == want_ready && (stats.copies > 0) == (want_ready > 0) &&
              (stats.bytes > 0) == (want_ready > 0) && stats.fallbacks == 0,
          "%s: copy engine: %u lanes ready, %llu copies, %llu bytes, %llu fallbacks", what,
          stats.lanes_ready, (unsigned long long)stats.copies, (unsigned long long)stats.bytes,
          (unsigned long long)stats.fallbacks);
    CHECK(vkgdr_ring_get_copy_engine_error(ring) == NULL, "%s: no copy-engine error", what);
    printf("%s: %llu + %llu records checked by ring_check_lanes, %llu copies of %llu bytes\n",
           what, workers[0].records, workers[1].records, (unsigned long long)stats.copies,
           (unsigned long long)stats.bytes);
    cuStreamDestroy(stream);
    vkgdr_ring_destroy(ring);
    vkgdr_close(g);
    CHECK(still_marked(), "%s: teardown", what);
}

/* vkgdr_ring_producer_set_stage_after: a producer at the default writes a lone 4 KiB record
 * through the BAR; told 0, it stages the next one for the copy engine. The checking kernel sees
 * both. */
static void stage_after(CUmodule module)
{
    const char *what = "stage after";
    vkgdr_t g = vkgdr_open(0, VKGDR_OPEN_CURRENT_CONTEXT_BIT);
    vkgdr_ring_options opts;
    vkgdr_ring_t ring;
    vkgdr_ring_producer_t p;
    vkgdr_ring_device_view v;
    vkgdr_ring_copy_engine_stats stats;
    CUstream stream;
    static unsigned char payload[4080];
    uint64_t res[8], sum = 0;

    vkgdr_ring_options_init(&opts, sizeof opts);
    opts.copy_engine_record = 4096;
    ring = vkgdr_ring_create_with_options(g, 1u << 20, &opts);
    CHECK(g != NULL && ring != NULL, "%s: open and create", what);
    if (ring == NULL) {
        vkgdr_close(g);
        return;
    }
    v.struct_size = sizeof v;
    CHECK(vkgdr_ring_get_device_view(ring, &v) == VKGDR_SUCCESS, "%s: view", what);
    stream = launch_check_lanes(module, ring, &v, what);
    p = vkgdr_ring_producer_create(ring);
    CHECK(p != NULL, "%s: producer", what);
    stats.struct_size = sizeof stats;
    CHECK(vkgdr_ring_producer_get_stage_after(p) == 65536, "%s: 64 KiB at first", what);
    sum += make_test_payload(payload, sizeof payload, 0);
    CHECK(vkgdr_ring_producer_push(p, payload, sizeof payload, -1, NULL) == VKGDR_SUCCESS,
          "%s: a lone record", what);
    CHECK(vkgdr_ring_get_copy_engine_stats(ring, &stats) == VKGDR_SUCCESS && stats.copies == 0,
          "%s: through the BAR at the default (%llu copies)", what,
          (unsigned long long)stats.copies);
    CHECK(vkgdr_ring_producer_set_stage_after(p, 0) == VKGDR_SUCCESS &&
              vkgdr_ring_producer_get_stage_after(p) == 0,
          "%s: set to 0", what);
    sum += make_test_payload(payload, sizeof payload, 1);
    CHECK(vkgdr_ring_producer_push(p, payload, sizeof payload, -1, NULL) == VKGDR_SUCCESS,
          "%s: a lone record, staged", what);
    CHECK(vkgdr_ring_get_copy_engine_stats(ring, &stats) == VKGDR_SUCCESS &&
              stats.copies == 1 && stats.bytes == 4096 && stats.fallbacks == 0,
          "%s: through the copy engine (%llu copies of %llu bytes)", what,
          (unsigned long long)stats.copies, (unsigned long long)stats.bytes);
    vkgdr_ring_producer_destroy(p);
    CHECK(vkgdr_ring_stop(ring) == VKGDR_SUCCESS, "%s: stop", what);
    CHECK(wait_stream(stream, 60), "%s: the consumer did not finish", what);
    memset(res, 0, sizeof res);
    CHECK(vkgdr_ring_get_lane_results(ring, 0, res, 5) == VKGDR_SUCCESS && res[0] == 2 &&
              res[1] == sum && res[2] == 0 && res[3] == 2,
          "%s: the kernel saw %llu records, %llu bad", what, (unsigned long long)res[0],
          (unsigned long long)res[2]);
    cuStreamDestroy(stream);
    vkgdr_ring_destroy(ring);
    vkgdr_close(g);
}

/* A producer keeps its ring alive: the ring handle may go first; the producer still writes
 * (no consumer: the records stay unread) and its destruction frees the ring. */
static void producer_outlives_ring_handle(void)
{
    const char *what = "producer after vkgdr_ring_destroy";
    vkgdr_t g = vkgdr_open(0, VKGDR_OPEN_CURRENT_CONTEXT_BIT);
    vkgdr_ring_t ring = vkgdr_ring_create_with_options(g, 4096, NULL);
    vkgdr_ring_producer_t p = vkgdr_ring_producer_create(ring);
    unsigned char payload[64];
    uint64_t seq = 99;
    CHECK(g != NULL && ring != NULL && p != NULL, "%s: made", what);
    vkgdr_ring_destroy(ring);
    make_test_payload(payload, sizeof payload, 0);
    CHECK(vkgdr_ring_producer_push(p, payload, sizeof payload, 0, &seq) == VKGDR_SUCCESS &&
              seq == 0,
          "%s: push", what);
    CHECK(vkgdr_ring_producer_get_next_seq(p) == 1, "%s: next seq", what);
    CHECK(vkgdr_ring_producer_create(ring) == NULL, "%s: the ring handle is gone", what);
    CHECK(last_error_contains("invalid vkgdr_ring_t handle"), "%s: explains", what);
    vkgdr_ring_producer_destroy(p);
    vkgdr_ring_producer_destroy(p);
    CHECK(last_error_contains("vkgdr_ring_producer_destroy: invalid vkgdr_ring_producer_t"),
          "%s: destroyed once", what);
    vkgdr_close(g);
}

int main(int argc, char **argv)
{
    char *ptx = ptx_argument(argc, argv, "ring.ptx");
    CUdevice dev = enter_primary_context();
    CUmodule module;
    CU_OK(cuModuleLoadData(&module, ptx));
    run(module, 0, 0, 200000, 1000, "padded ring");
    run(module, VKGDR_OPEN_FORCE_NON_COHERENT_BIT, 0, 40000, 1000, "padded ring, non-coherent");
    run(module, 0, 1, 20000, 60000, "mirrored ring");
    run_lanes(module, LANES_COPY_ENGINE);
    run_lanes(module, LANES_DEFAULT);
    run_lanes(module, LANES_OFF);
    stage_after(module);
    producer_outlives_ring_handle();
    cuModuleUnload(module);
    leave_primary_context(dev);
    free(ptx);
    return CHECK_SUMMARY("gpu_ring");
}
