// What a device-to-host record's commit costs, and whether it can go without its fence: a probe
// behind the design of include/vkgdr/ring_d2h.cuh (figures: BENCHMARKS.md, "Figures behind the
// design", "A record's commit from the device").
//
// The CPU stores go = i into GPU memory through the BAR (vkgdr's mapping); one kernel thread
// waits for it and answers into pinned host memory in one of several ways; the CPU waits until
// slot word 0 == i and then reads the payload word (slot word 2), which must be 3 i. Per way:
// the round trip's median and percentiles, and how often the CPU saw the commit before the
// payload. The "no fence" ways are measurements, not protocols: they show what the fence costs
// and that the ordering it buys is needed.
//
// Build and run on a machine with an NVIDIA GPU, against the C library (a `scripts/gpu-check
// build` bundle unpacked on the GPU machine has it under bundle/capi):
//   nvcc -O3 -arch=sm_90 -I bundle/capi/include benches/probes/d2h_commit.cu -o d2h_commit \
//       -L bundle/capi/lib -lvkgdr -Xlinker -rpath,bundle/capi/lib -lcuda
//   taskset -c 2 ./d2h_commit 20000
#include <cuda.h>
#include <cuda_runtime.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

#include "vkgdr.h"
#include "../../include/vkgdr/ordering.cuh"

typedef unsigned long long ull;

using vkgdr_device::fence_release_sys;
using vkgdr_device::load_acquire_gpu;
using vkgdr_device::load_acquire_sys;
using vkgdr_device::store_relaxed_sys;
using vkgdr_device::store_release_sys;

// V: 0 the commit word alone (no payload: the floor); 1 payload + release commit; 2 CAS
// reservation (in device memory) + payload + release commit; 3 atomicAdd reservation + payload +
// fence.acq_rel.sys + relaxed commit; 4 CAS + payload + relaxed commit (no fence); 5 payload +
// relaxed commit (no fence, no reservation); 6 the library's reservation loads (volatile
// reserve, acquire.gpu head cache) + CAS + payload + release commit, as ring_d2h.cuh does.
template <int V>
__device__ void pong(const volatile ull* go, volatile ull* slot, ull* state, ull iters, ull* bad)
{
    if (threadIdx.x != 0) return;
    ull errs = 0;
    for (ull i = 1; i <= iters; ++i) {
        while (load_acquire_sys(go) < i) {
        }
        if (V == 0) {
            store_relaxed_sys(slot, i);
        } else if (V == 1) {
            slot[2] = i * 3;
            store_release_sys(slot, i);
        } else if (V == 2 || V == 6) {
            ull r = i - 1;
            if (V == 6) {
                r = *(volatile ull*)&state[0];
                const ull h = load_acquire_gpu((volatile ull*)&state[1]);
                errs += h > r;
            }
            const ull seen = atomicCAS(&state[0], r, r + 1);
            errs += seen != i - 1;
            slot[2] = i * 3;
            store_release_sys(slot, i);
        } else if (V == 3) {
            const ull seen = atomicAdd(&state[0], 1ull);
            errs += seen != i - 1;
            slot[2] = i * 3;
            fence_release_sys();
            store_relaxed_sys(slot, i);
        } else if (V == 4) {
            const ull seen = atomicCAS(&state[0], i - 1, i);
            errs += seen != i - 1;
            slot[2] = i * 3;
            store_relaxed_sys(slot, i);
        } else {
            slot[2] = i * 3;
            store_relaxed_sys(slot, i);
        }
    }
    *bad = errs;
}

#define K(V) extern "C" __global__ void pong##V(const volatile ull* go, volatile ull* slot, ull* state, ull iters, ull* bad) { pong<V>(go, slot, state, iters, bad); }
K(0) K(1) K(2) K(3) K(4) K(5) K(6)

static double now_ns()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char** argv)
{
    const int n = argc > 1 ? atoi(argv[1]) : 20000;
    cudaFree(nullptr);
    vkgdr_t g = vkgdr_open(0, VKGDR_OPEN_CURRENT_CONTEXT_BIT);
    if (!g) { std::printf("open: %s\n", vkgdr_last_error()); return 1; }
    vkgdr_memory_t mem = vkgdr_memory_alloc(g, 4096, 0);
    volatile ull* go_h = (volatile ull*)vkgdr_memory_get_host_ptr(mem);
    const ull* go_d = (const ull*)vkgdr_memory_get_device_ptr(mem);
    void* slot_h;
    cudaHostAlloc(&slot_h, 4096, cudaHostAllocMapped);
    void* slot_d;
    cudaHostGetDevicePointer(&slot_d, slot_h, 0);
    ull *state, *bad;
    cudaMalloc(&state, 4096);
    cudaMalloc(&bad, 8);
    void (*ks[])(const volatile ull*, volatile ull*, ull*, ull, ull*) = { pong0, pong1, pong2, pong3,
                                                                          pong4, pong5, pong6 };
    const char* names[] = { "commit word alone",
                            "payload + release commit",
                            "CAS + payload + release commit",
                            "atomicAdd + payload + fence.acq_rel.sys + commit",
                            "CAS + payload + commit, no fence",
                            "payload + commit, no fence",
                            "ring_d2h.cuh's reservation + payload + release commit" };
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    for (int rep = 0; rep < 2; ++rep) {
        for (int v = 0; v < 7; ++v) {
            *go_h = 0;
            _mm_sfence();
            std::memset(slot_h, 0, 4096);
            cudaMemset(state, 0, 4096);
            cudaDeviceSynchronize();
            ks[v]<<<1, 32, 0, s>>>(go_d, (volatile ull*)slot_d, state, (ull)n, bad);
            volatile ull* slot = (volatile ull*)slot_h;
            std::vector<double> rtt(n);
            int fail = 0;
            long early = 0; // the commit seen before the payload
            for (int i = 1; i <= n; ++i) {
                const double t0 = now_ns();
                *go_h = (ull)i;
                _mm_sfence();
                while (slot[0] != (ull)i) {
                    if (now_ns() - t0 > 2e9) { fail = 1; break; }
                }
                if (fail) break;
                early += v >= 1 && slot[2] != (ull)i * 3;
                rtt[i - 1] = now_ns() - t0;
            }
            cudaStreamSynchronize(s);
            ull b = 0;
            cudaMemcpy(&b, bad, 8, cudaMemcpyDeviceToHost);
            if (fail) {
                std::printf("%-55s no answer within 2 s\n", names[v]);
                return 1;
            }
            std::sort(rtt.begin(), rtt.end());
            std::printf("%-55s median %6.0f ns p10 %6.0f p90 %6.0f p99 %6.0f; commit before "
                        "payload %ld of %d; reservation errors %llu\n",
                        names[v], rtt[n / 2], rtt[n / 10], rtt[n * 9 / 10], rtt[n * 99 / 100],
                        early, n, b);
        }
    }
    vkgdr_memory_free(mem);
    vkgdr_close(g);
    return 0;
}
