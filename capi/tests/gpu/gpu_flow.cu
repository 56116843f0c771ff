// vkgdr's documented flow from CUDA C++ (nvcc, runtime API), as vkgdr 0.1's example does it:
// the runtime's primary context and a cuCtxCreate context made current, open on the current
// context, allocate, write from the host, flush, a kernel transforms the data, invalidate,
// compare; for no flags, REQUIRE_COHERENT and FORCE_NON_COHERENT. And the no-context error, and a
// free ordered after a runtime stream (cudaStream_t passed as CUstream).
//
// Build: nvcc -o gpu_flow_cu gpu_flow.cu -I<vkgdr include> -L<vkgdr lib> -lvkgdr -lcuda
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "vkgdr.h"

static int passed, failed;

static void check(bool ok, const char* what)
{
    if (ok) {
        passed++;
        return;
    }
    failed++;
    char* msg = vkgdr_last_error();
    std::fprintf(stderr, "FAIL %s (last error: %s)\n", what, msg ? msg : "none");
    std::free(msg);
}

static bool last_error_has(const char* needle)
{
    char* msg = vkgdr_last_error();
    bool ok = msg != nullptr && std::strstr(msg, needle) != nullptr;
    std::free(msg);
    return ok;
}

__global__ void scale_and_offset(float* data, size_t n, float scale, float offset)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        data[i] = data[i] * scale + offset;
    }
}

static void flow(unsigned int flags, const char* what)
{
    const size_t n = 1 << 16;
    vkgdr_t g = vkgdr_open(0, VKGDR_OPEN_CURRENT_CONTEXT_BIT | flags);
    check(g != nullptr, what);
    if (g == nullptr) {
        return;
    }
    vkgdr_memory_t mem = vkgdr_memory_alloc(g, n * sizeof(float), 0);
    check(mem != nullptr, what);
    if (mem == nullptr) {
        vkgdr_close(g);
        return;
    }
    float* h = static_cast<float*>(vkgdr_memory_get_host_ptr(mem));
    float* d = reinterpret_cast<float*>(vkgdr_memory_get_device_ptr(mem));
    for (size_t i = 0; i < n; i++) {
        h[i] = static_cast<float>(i % 1000);
    }
    vkgdr_memory_flush(mem, 0, n * sizeof(float));
    scale_and_offset<<<128, 256>>>(d, n, 2.0f, 0.5f);
    check(cudaDeviceSynchronize() == cudaSuccess, "kernel");
    vkgdr_memory_invalidate(mem, 0, n * sizeof(float));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        bad += h[i] != static_cast<float>(i % 1000) * 2.0f + 0.5f;
    }
    check(bad == 0, what);
    std::printf("%s: %zu floats transformed by a kernel, %zu wrong\n", what, n, bad);

    // A runtime stream is a CUstream: free memory that a kernel on a non-blocking stream still
    // uses once that stream has passed it (returns at once, never waits).
    cudaStream_t s;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    scale_and_offset<<<128, 256, 0, s>>>(d, n, 1.0f, 0.0f);
    check(vkgdr_memory_free_after(mem, s) == VKGDR_SUCCESS, "vkgdr_memory_free_after(cudaStream_t)");
    check(cudaStreamSynchronize(s) == cudaSuccess, "kernel after the free");
    check(vkgdr_wait_for_releases(g, 10000000000ll) == 0, "released once the stream passed");
    check(cudaStreamDestroy(s) == cudaSuccess, "stream destroyed");
    vkgdr_close(g);
}

static void flows(const char* context)
{
    const unsigned int flags[] = {0, VKGDR_OPEN_REQUIRE_COHERENT_BIT,
                                  VKGDR_OPEN_FORCE_NON_COHERENT_BIT};
    const char* names[] = {"no flags", "REQUIRE_COHERENT", "FORCE_NON_COHERENT"};
    for (int f = 0; f < 3; f++) {
        char what[128];
        std::snprintf(what, sizeof what, "CUDA C++, %s context, %s", context, names[f]);
        flow(flags[f], what);
    }
}

int main()
{
    // Before anything made a context current.
    check(vkgdr_open(0, VKGDR_OPEN_CURRENT_CONTEXT_BIT) == nullptr, "no context: NULL");
    check(last_error_has("CUDA_ERROR_INVALID_CONTEXT"), "no context: result name");

    // The runtime initialises the device's primary context and makes it current.
    check(cudaFree(nullptr) == cudaSuccess, "runtime init");
    flows("primary");

    // A context of our own: the runtime uses whatever context is current.
    CUdevice dev;
    CUcontext ctx;
    check(cuDeviceGet(&dev, 0) == CUDA_SUCCESS, "cuDeviceGet");
#if CUDA_VERSION >= 13000
    check(cuCtxCreate(&ctx, nullptr, 0, dev) == CUDA_SUCCESS, "cuCtxCreate");
#else
    check(cuCtxCreate(&ctx, 0, dev) == CUDA_SUCCESS, "cuCtxCreate");
#endif
    flows("cuCtxCreate");
    check(cuCtxDestroy(ctx) == CUDA_SUCCESS, "cuCtxDestroy");

    std::printf("gpu_flow_cu: %d passed, %d failed\n", passed, failed);
    return failed == 0 && passed > 0 ? 0 : 1;
}
