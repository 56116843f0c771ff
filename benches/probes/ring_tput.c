// The checking consumer's throughput in a ring of 8 lanes: P producer threads (one lane each) push
// batches of BATCH test records (64 unless given) of REC bytes (header included) for SECS seconds
// while ring_check_lanes from CUBIN (a build of ring_lone.cu against some tree) consumes, in lanes
// of CAPACITY bytes (4 MiB unless given); prints GB/s and the problems seen (push failures,
// checking errors, records missing). Small batches into small lanes (e.g. 64 4 2 1.5 4 65536)
// give the reader windows of a few records and wrap the lanes often.
//
//   cc -O2 -std=c11 -pthread -I bundle/capi/include -I <cuda>/include benches/probes/ring_tput.c \
//       -o ring_tput -L bundle/capi/lib -lvkgdr -Wl,-rpath,bundle/capi/lib -lcuda
//   ./ring_tput CUBIN REC P SECS [BATCH [CAPACITY]]    (e.g. ring_lone.cubin 4096 8 1.5)
#define _GNU_SOURCE
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vkgdr.h"

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char* n_; cuGetErrorName(r_, &n_); fprintf(stderr, "%s: %s\n", #x, n_); exit(1);} } while (0)
typedef struct { unsigned long long data, capacity, tail, stop, head, result, lane_data; unsigned int lanes, wrap; } view_t;

static double now_s(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec + ts.tv_nsec * 1e-9; }
static uint64_t term(uint64_t i, uint32_t w) { uint64_t x = (((i << 32) | w) + 1) * 0x9E3779B97F4A7C15ull; return x ^ (x >> 29); }

static vkgdr_ring_t ring;
static size_t plen;
static double deadline;
static int batch = 64;
typedef struct { unsigned long long bytes, pushed; unsigned lane; int err; } worker_t;

static void* work(void* arg)
{
    worker_t* w = arg;
    vkgdr_ring_producer_t p = vkgdr_ring_producer_create(ring);
    if (!p) { w->err = 1; return NULL; }
    w->lane = vkgdr_ring_producer_get_lane(p);
    unsigned char* bufs = malloc(64 * plen);
    const void* ptrs[64]; size_t sizes[64];
    uint64_t sum = 0;
    for (size_t i = 0; 16 + 4 * i < plen; i++) {
        uint32_t wv = 0; size_t k = plen - 16 - 4 * i < 4 ? plen - 16 - 4 * i : 4;
        unsigned char b[4] = {0}; memset(b, 0x5a, k); memcpy(&wv, b, 4); sum += term(i, wv);
    }
    for (int i = 0; i < 64; i++) { memset(bufs + i * plen, 0x5a, plen); memcpy(bufs + i * plen + 8, &sum, 8); ptrs[i] = bufs + i * plen; sizes[i] = plen; }
    while (now_s() < deadline) {
        uint64_t first = vkgdr_ring_producer_get_next_seq(p);
        for (int i = 0; i < batch; i++) { uint64_t s = first + i; memcpy(bufs + i * plen, &s, 8); }
        size_t written = 0;
        if (vkgdr_ring_producer_push_batch(p, ptrs, sizes, batch, 10000000000ll, &written) || written != (size_t)batch) { fprintf(stderr, "push: %s\n", vkgdr_last_error()); w->err = 1; break; }
        w->bytes += (unsigned long long)batch * (plen + 16);
        w->pushed += batch;
    }
    vkgdr_ring_producer_destroy(p);
    return NULL;
}

int main(int argc, char** argv)
{
    const char* cubin = argv[1];
    size_t rec = atoi(argv[2]);
    int np = atoi(argv[3]);
    double secs = atof(argv[4]);
    plen = rec - 16;
    batch = argc > 5 ? atoi(argv[5]) : 64;
    if (batch < 1 || batch > 64) { fprintf(stderr, "BATCH: 1 to 64 records\n"); return 2; }
    size_t cap = argc > 6 ? (size_t)atol(argv[6]) : (4u << 20);
    CK(cuInit(0)); CUdevice dev; CK(cuDeviceGet(&dev, 0)); CUcontext ctx; CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
    vkgdr_t g = vkgdr_open(dev, VKGDR_OPEN_CURRENT_CONTEXT_BIT);
    CUmodule mod; CK(cuModuleLoad(&mod, cubin)); CUfunction f; CK(cuModuleGetFunction(&f, mod, "ring_check_lanes"));
    vkgdr_ring_options o; vkgdr_ring_options_init(&o, sizeof o); o.lanes = 8;
    ring = vkgdr_ring_create_with_options(g, cap, &o);
    if (!ring) { fprintf(stderr, "ring: %s\n", vkgdr_last_error()); return 1; }
    vkgdr_ring_device_view v; v.struct_size = sizeof v; vkgdr_ring_get_device_view(ring, &v);
    view_t a = { v.data, v.capacity, v.tail, v.stop, v.head, v.result, v.lane_data, v.lanes, v.mirrored };
    void* args[] = { &a };
    CUstream s; CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuLaunchKernel(f, 8, 1, 1, 512, 1, 1, 0, s, args, NULL));
    vkgdr_ring_watch_consumer(ring, s);
    worker_t w[16] = {0}; pthread_t th[16];
    double t0 = now_s(); deadline = t0 + secs;
    for (int i = 0; i < np; i++) pthread_create(&th[i], NULL, work, &w[i]);
    for (int i = 0; i < np; i++) pthread_join(th[i], NULL);
    double t1 = now_s();
    vkgdr_ring_stop(ring);
    CK(cuStreamSynchronize(s));
    unsigned long long bytes = 0, bad = 0;
    for (int i = 0; i < np; i++) {
        uint64_t res[5] = {0};
        vkgdr_ring_get_lane_results(ring, w[i].lane, res, 5);
        bytes += w[i].bytes;
        bad += w[i].err + res[2] + (res[0] != w[i].pushed);
    }
    printf("%-10s %5zu B, batch %d, %d producers: %6.2f GB/s (checked, problems %llu)\n", cubin, rec, batch, np, bytes / (t1 - t0) / 1e9, bad);
    vkgdr_ring_destroy(ring); vkgdr_close(g);
    return 0;
}
