// A lone record's round trip through a ring of 8 lanes, for any consumer kernel of a cubin that
// takes the ring's view by value (ring_lone.cu's, kernels/ring.cu's): one thread pushes one 64-byte
// record (a test payload the checking kernel accepts) and waits until the lane's head passes it,
// N times; prints the median and percentiles, and the lane's result words (records, errors).
// Every kernel gets two more arguments, which kernels of the view alone ignore: a device buffer of
// N (cycles, ns) pairs per lane and N; where the kernel wrote its in-kernel times there
// (ring_lone.cu's block_floor and window_timed kernels), their percentiles are printed too.
//
//   cc -O2 -std=c11 -I bundle/capi/include -I <cuda>/include benches/probes/ring_lone.c \
//       -o ring_lone -L bundle/capi/lib -lvkgdr -Wl,-rpath,bundle/capi/lib -lcuda -lm
//   taskset -c 2 ./ring_lone KERNEL N THREADS CUBIN    (e.g. ring_check_lanes 20000 512 x.cubin)
#define _GNU_SOURCE
#include <cuda.h>
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
    vkgdr_ring_t ring = vkgdr_ring_create_with_options(g, 4u << 20, &o);
    if (!ring) { fprintf(stderr, "ring: %s\n", vkgdr_last_error()); return 1; }
    vkgdr_ring_device_view v;
    v.struct_size = sizeof v;
    vkgdr_ring_get_device_view(ring, &v);
    view_t a = { v.data, v.capacity, v.tail, v.stop, v.head, v.result, v.lane_data, v.lanes, v.mirrored };
    vkgdr_ring_producer_t p = vkgdr_ring_producer_create(ring);
    unsigned lane = vkgdr_ring_producer_get_lane(p);
    unsigned int max = (unsigned int)n;
    CUdeviceptr times;
    CK(cuMemAlloc(&times, (size_t)LANES * max * 16));
    CK(cuMemsetD8(times, 0, (size_t)LANES * max * 16));
    void* args[] = { &a, &times, &max };
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuLaunchKernel(f, LANES, 1, 1, threads, 1, 1, 0, s, args, NULL));
    vkgdr_ring_watch_consumer(ring, s);
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
    vkgdr_ring_producer_destroy(p);
    vkgdr_ring_stop(ring);
    CK(cuStreamSynchronize(s));
    uint64_t res[5] = {0};
    vkgdr_ring_get_lane_results(ring, lane, res, 5);
    qsort(rtt, n, sizeof(double), cmp);
    printf("%-18s thr %3d: median %6.0f ns p10 %6.0f p90 %6.0f p99 %6.0f  (results rec %llu err %llu)\n", kname, threads,
           pct(rtt, n, 0.5), pct(rtt, n, 0.1), pct(rtt, n, 0.9), pct(rtt, n, 0.99),
           (unsigned long long)res[0], (unsigned long long)res[2]);
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
