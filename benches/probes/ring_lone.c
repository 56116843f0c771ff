// A lone record's round trip through a ring of 8 lanes, for any consumer kernel of a cubin that
// takes the ring's view by value (ring_lone.cu's, kernels/ring.cu's): one thread pushes one 64-byte
// record (a test payload the checking kernel accepts) and waits until the lane's head passes it,
// N times; prints the median and percentiles, and the lane's result words (records, errors).
// Every kernel gets two more arguments, which kernels of the view alone ignore: a device buffer of
// N (cycles, ns) pairs per lane and N; where the kernel wrote its in-kernel times there
// (ring_lone.cu's block_floor and window_timed kernels), their percentiles are printed too.
// With RING_LONE_LOAD=GBPS,BATCH[,bar|,staged] in the environment, seven more producer threads
// stream records of 4 KiB (header included) into the other lanes meanwhile, BATCH records a
// batch, the seven held to GBPS GB/s in all (each waits for its share of the rate before a batch;
// 0: as fast as they go), on a ring whose records of 4 KiB take the copy engine
// (`copy_engine_record` 4096) once 64 KiB of the batch are pending before them; with `staged`
// from the batch's first record (`vkgdr_ring_producer_set_stage_after(p, 0)`), with `bar` all
// through the BAR (`VKGDR_RING_COPY_ENGINE_OFF_BIT`): what a lone record's tail waits behind
// under load. Run it on several cores then (`taskset -c 2-15`), one per thread.
//
//   cc -O2 -std=c11 -pthread -I bundle/capi/include -I <cuda>/include benches/probes/ring_lone.c \
//       -o ring_lone -L bundle/capi/lib -lvkgdr -Wl,-rpath,bundle/capi/lib -lcuda -lm
//   taskset -c 2 ./ring_lone KERNEL N THREADS CUBIN    (e.g. ring_check_lanes 20000 512 x.cubin)
#define _GNU_SOURCE
#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vkgdr.h"

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char* n_; cuGetErrorName(r_, &n_); fprintf(stderr, "%s: %s\n", #x, n_); exit(1);} } while (0)

typedef struct {
    unsigned long long data, capacity, tail, stop, head, result, lane_data;
    unsigned int lanes, wrap;
} view_t;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static uint64_t term(uint64_t i, uint32_t w)
{
    uint64_t x = (((i << 32) | w) + 1) * 0x9E3779B97F4A7C15ull;
    return x ^ (x >> 29);
}

static int cmp(const void* a, const void* b)
{
    double x = *(const double*)a, y = *(const double*)b;
    return x < y ? -1 : x > y;
}

static double pct(double* v, int n, double p)
{
    return v[(int)(p * (n - 1))];
}

#define LANES 8
#define STREAM_RECORD 4096
#define STREAM_PAYLOAD (STREAM_RECORD - 16)

typedef struct {
    vkgdr_ring_producer_t p;
    int batch;
    double period_ns; // 0: unpaced
    atomic_int* done;
    atomic_ullong* bytes;
    int failed;
} stream_t;

// Fills a test payload the checking kernel accepts (seq, checksum of the body, body).
static void seal(unsigned char* payload, size_t size, uint64_t seq)
{
    uint64_t sum = 0;
    for (size_t i = 0; 16 + 4 * i + 4 <= size; i++) {
        uint32_t w;
        memcpy(&w, payload + 16 + 4 * i, 4);
        sum += term(i, w);
    }
    memcpy(payload, &seq, 8);
    memcpy(payload + 8, &sum, 8);
}

static void* stream(void* arg)
{
    stream_t* st = arg;
    unsigned char** bufs = malloc(sizeof(void*) * st->batch);
    size_t* sizes = malloc(sizeof(size_t) * st->batch);
    for (int i = 0; i < st->batch; i++) {
        bufs[i] = malloc(STREAM_PAYLOAD);
        for (int j = 0; j < STREAM_PAYLOAD; j++) bufs[i][j] = (unsigned char)(j * 7 + i);
        seal(bufs[i], STREAM_PAYLOAD, 0);
        sizes[i] = STREAM_PAYLOAD;
    }
    uint64_t due = now_ns();
    while (!atomic_load_explicit(st->done, memory_order_relaxed)) {
        if (st->period_ns > 0) {
            const uint64_t now = now_ns();
            due += (uint64_t)st->period_ns;
            if (due + (uint64_t)st->period_ns < now) due = now - (uint64_t)st->period_ns;
            while (now_ns() < due) {}
        }
        const uint64_t first = vkgdr_ring_producer_get_next_seq(st->p);
        for (int i = 0; i < st->batch; i++) memcpy(bufs[i], &(uint64_t){first + i}, 8);
        size_t written = 0;
        if (vkgdr_ring_producer_push_batch(st->p, (const void* const*)bufs, sizes, st->batch,
                                           10000000000ll, &written)) {
            fprintf(stderr, "stream push: %s\n", vkgdr_last_error());
            st->failed = 1;
            break;
        }
        atomic_fetch_add_explicit(st->bytes, (unsigned long long)st->batch * STREAM_RECORD,
                                  memory_order_relaxed);
    }
    for (int i = 0; i < st->batch; i++) free(bufs[i]);
    free(bufs);
    free(sizes);
    return NULL;
}

int main(int argc, char** argv)
{
    const char* kname = argc > 1 ? argv[1] : "ring_check_lanes";
    int n = argc > 2 ? atoi(argv[2]) : 20000;
    int threads = argc > 3 ? atoi(argv[3]) : 512;
    const char* cubin = argc > 4 ? argv[4] : "ring_lone.cubin";
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    vkgdr_t g = vkgdr_open(dev, VKGDR_OPEN_CURRENT_CONTEXT_BIT);
    if (!g) { fprintf(stderr, "open: %s\n", vkgdr_last_error()); return 1; }
    CUmodule mod;
    CK(cuModuleLoad(&mod, cubin));
    CUfunction f;
    CK(cuModuleGetFunction(&f, mod, kname));
    vkgdr_ring_options o;
    vkgdr_ring_options_init(&o, sizeof o);
    o.lanes = LANES;
    double load_gbps = -1;
    int load_batch = 64;
    char path[8] = "";
    const char* load = getenv("RING_LONE_LOAD");
    if (load && *load) {
        sscanf(load, "%lf,%d,%7s", &load_gbps, &load_batch, path);
        if (strcmp(path, "bar") == 0) {
            o.flags |= VKGDR_RING_COPY_ENGINE_OFF_BIT;
        } else {
            o.copy_engine_record = STREAM_RECORD;
        }
    }
    vkgdr_ring_t ring = vkgdr_ring_create_with_options(g, 4u << 20, &o);
    if (!ring) { fprintf(stderr, "ring: %s\n", vkgdr_last_error()); return 1; }
    vkgdr_ring_device_view v;
    v.struct_size = sizeof v;
    vkgdr_ring_get_device_view(ring, &v);
    view_t a = { v.data, v.capacity, v.tail, v.stop, v.head, v.result, v.lane_data, v.lanes, v.mirrored };
    vkgdr_ring_producer_t p = vkgdr_ring_producer_create(ring);
    unsigned lane = vkgdr_ring_producer_get_lane(p);
    if (lane != 0) { fprintf(stderr, "the lone producer took lane %u, not 0\n", lane); return 1; }
    stream_t streams[LANES - 1];
    pthread_t stream_threads[LANES - 1];
    atomic_int done = 0;
    atomic_ullong streamed = 0;
    const int nstreams = load_gbps >= 0 ? LANES - 1 : 0;
    for (int i = 0; i < nstreams; i++) {
        const double period =
            load_gbps > 0 ? (double)load_batch * STREAM_RECORD * nstreams / load_gbps : 0;
        streams[i] = (stream_t){ vkgdr_ring_producer_create(ring), load_batch, period,
                                 &done, &streamed, 0 };
        if (!streams[i].p) {
            fprintf(stderr, "stream producer: %s\n", vkgdr_last_error());
            return 1;
        }
        if (strcmp(path, "staged") == 0 && vkgdr_ring_producer_set_stage_after(streams[i].p, 0)) {
            fprintf(stderr, "stage after: %s\n", vkgdr_last_error()); return 1;
        }
    }
    unsigned int max = (unsigned int)n;
    CUdeviceptr times;
    CK(cuMemAlloc(&times, (size_t)LANES * max * 16));
    CK(cuMemsetD8(times, 0, (size_t)LANES * max * 16));
    void* args[] = { &a, &times, &max };
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuLaunchKernel(f, LANES, 1, 1, threads, 1, 1, 0, s, args, NULL));
    vkgdr_ring_watch_consumer(ring, s);
    for (int i = 0; i < nstreams; i++) {
        pthread_create(&stream_threads[i], NULL, stream, &streams[i]);
    }
    if (nstreams) {
        struct timespec ms100 = { 0, 100000000 };
        nanosleep(&ms100, NULL);
    }
    const unsigned long long bytes0 = atomic_load(&streamed);
    const uint64_t start = now_ns();
    unsigned char payload[48];
    memset(payload, 0x5a, sizeof payload);
    uint64_t sum = 0;
    for (int i = 0; i < 8; i++) {
        uint32_t w; memcpy(&w, payload + 16 + 4 * i, 4); sum += term(i, w);
    }
    memcpy(payload + 8, &sum, 8);
    double* rtt = malloc(sizeof(double) * n);
    for (int i = 0; i < n; i++) {
        uint64_t t0 = now_ns();
        uint64_t seq = vkgdr_ring_producer_get_next_seq(p);
        memcpy(payload, &seq, 8);
        uint64_t before = vkgdr_ring_get_lane_head(ring, lane);
        if (vkgdr_ring_producer_push(p, payload, sizeof payload, 10000000000ll, NULL)) { fprintf(stderr, "push: %s\n", vkgdr_last_error()); return 1; }
        while (vkgdr_ring_get_lane_head(ring, lane) == before) {
            if (now_ns() - t0 > 5000000000ull) { fprintf(stderr, "%s: no head after 5 s at %d\n", kname, i); return 1; }
        }
        rtt[i] = (double)(now_ns() - t0);
    }
    const double secs = (double)(now_ns() - start) / 1e9;
    const double gbps = (double)(atomic_load(&streamed) - bytes0) / secs / 1e9;
    atomic_store(&done, 1);
    int stream_failed = 0;
    for (int i = 0; i < nstreams; i++) {
        pthread_join(stream_threads[i], NULL);
        stream_failed |= streams[i].failed;
        vkgdr_ring_producer_destroy(streams[i].p);
    }
    vkgdr_ring_producer_destroy(p);
    vkgdr_ring_stop(ring);
    CK(cuStreamSynchronize(s));
    uint64_t res[5] = {0};
    vkgdr_ring_get_lane_results(ring, lane, res, 5);
    qsort(rtt, n, sizeof(double), cmp);
    printf("%-18s thr %3d: median %6.0f ns p10 %6.0f p90 %6.0f p99 %6.0f  (results rec %llu err %llu)\n", kname, threads,
           pct(rtt, n, 0.5), pct(rtt, n, 0.1), pct(rtt, n, 0.9), pct(rtt, n, 0.99),
           (unsigned long long)res[0], (unsigned long long)res[2]);
    if (nstreams) {
        uint64_t errors = 0;
        for (unsigned l = 0; l < LANES; l++) {
            uint64_t r[5] = {0};
            vkgdr_ring_get_lane_results(ring, l, r, 5);
            errors += r[2];
        }
        const char* how = strcmp(path, "bar") == 0      ? " through the BAR"
                          : strcmp(path, "staged") == 0 ? " staged from the first record"
                                                        : "";
        printf("%-18s beside %d lanes streaming %.1f GB/s (batches of %d%s, paced to %g GB/s; "
               "errors on all lanes %llu)%s\n",
               "", nstreams, gbps, load_batch, how, load_gbps, (unsigned long long)errors,
               stream_failed ? " STREAM FAILED" : "");
    }
    uint64_t* t = malloc((size_t)LANES * max * 16);
    CK(cuMemcpyDtoH(t, times, (size_t)LANES * max * 16));
    CK(cuMemFree(times));
    double* cycles = malloc(sizeof(double) * n);
    double* ns = malloc(sizeof(double) * n);
    int k = 0;
    for (int i = 0; i < n; i++) {
        const uint64_t* pair = t + ((size_t)lane * max + i) * 2;
        if (pair[0] != 0) {
            cycles[k] = (double)pair[0];
            ns[k] = (double)pair[1];
            k++;
        }
    }
    if (k > 0) {
        qsort(cycles, k, sizeof(double), cmp);
        qsort(ns, k, sizeof(double), cmp);
        printf("%-18s in the kernel: median %.0f cycles (p99 %.0f), %.0f ns by %%globaltimer (%d rounds)\n", "",
               pct(cycles, k, 0.5), pct(cycles, k, 0.99), pct(ns, k, 0.5), k);
    }
    free(t);
    free(cycles);
    free(ns);
    vkgdr_ring_destroy(ring);
    vkgdr_close(g);
    return 0;
}
