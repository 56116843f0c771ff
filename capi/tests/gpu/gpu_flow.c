/* vkgdr's documented flow from C on the GPU machine, and its error cases by result name.
 *
 * Flow: open on the current context, allocate, write from the host, flush, a kernel
 * (check_and_transform of kernels/mapping.ptx) checks every word and transforms it in place,
 * invalidate, compare. For no flags, REQUIRE_COHERENT and FORCE_NON_COHERENT, on the primary
 * context (what the CUDA runtime uses) and on a context from cuCtxCreate (what PyCUDA makes), plus
 * a handle opened on the CUdevice allocating into the current cuCtxCreate context. Also: memory
 * freed by another thread with no context current, the bounds-checked write/read, and the limits
 * of the mappings freed allocations keep for the next of their size.
 *
 * Errors: device -1 (CUDA_ERROR_INVALID_DEVICE), CURRENT_CONTEXT with none current
 * (CUDA_ERROR_INVALID_CONTEXT), 10^15 bytes (VK_ERROR_OUT_OF_DEVICE_MEMORY), allocating with no
 * current context, a flush outside the allocation. As in vkgdr 0.1: unknown open and allocation
 * flag bits are ignored, and a flush or invalidate of SIZE_MAX bytes reaches to the end.
 *
 * Usage: gpu_flow path/to/kernels/mapping.ptx */
#include <pthread.h>

#include "gpu_util.h"

static const char *ptx;

static void flow(vkgdr_t g, const char *what)
{
    const unsigned long long n = 100000;
    const size_t bytes = (size_t)n * 4 + 5; /* an odd size: reported as asked */
    const unsigned int seed = 0xC0DE0000u ^ (unsigned int)strlen(what);
    vkgdr_memory_t mem = vkgdr_memory_alloc(g, bytes, 0);
    CUmodule module;
    CUfunction transform = load_kernel(ptx, "check_and_transform", &module);
    CUdeviceptr d, d_errors = 0;
    unsigned int *words, back[64];
    unsigned long long i, errors = ~0ull, bad = 0;
    void *args[5];

    CHECK(mem != NULL, "%s: alloc", what);
    if (mem == NULL) {
        cuModuleUnload(module);
        return;
    }
    CHECK(vkgdr_memory_get_size(mem) == bytes, "%s: size", what);
    words = vkgdr_memory_get_host_ptr(mem);
    d = vkgdr_memory_get_device_ptr(mem);
    CHECK(words != NULL && d != 0, "%s: pointers", what);
    for (i = 0; i < n; i++) {
        words[i] = pattern(i, seed);
    }
    /* SIZE_MAX: to the end of the allocation (vkgdr 0.1 passes it to Vulkan: VK_WHOLE_SIZE). */
    vkgdr_memory_flush(mem, 0, SIZE_MAX);
    CHECK(no_last_error(), "%s: flush", what);

    CU_OK(cuMemAlloc(&d_errors, sizeof errors));
    CU_OK(cuMemsetD8(d_errors, 0, sizeof errors));
    args[0] = &d;
    args[1] = &d;
    args[2] = (void *)&n;
    args[3] = (void *)&seed;
    args[4] = &d_errors;
    CU_OK(cuLaunchKernel(transform, 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    CU_OK(cuCtxSynchronize());
    CU_OK(cuMemcpyDtoH(&errors, d_errors, sizeof errors));
    CHECK(errors == 0, "%s: the kernel saw %llu stale words", what, errors);

    vkgdr_memory_invalidate(mem, 0, bytes);
    CHECK(no_last_error(), "%s: invalidate", what);
    for (i = 0; i < n; i++) {
        bad += words[i] != pattern(i, seed) * 3u + 1u;
    }
    CHECK(bad == 0, "%s: %llu words not transformed", what, bad);
    CHECK(vkgdr_memory_read(mem, 4 * 1000, back, sizeof back) == VKGDR_SUCCESS &&
              back[5] == pattern(1005, seed) * 3u + 1u,
          "%s: vkgdr_memory_read", what);
    printf("%s: %llu words round trip, coherent %d, atom %zu\n", what, n,
           (int)vkgdr_memory_is_coherent(mem), vkgdr_memory_non_coherent_atom_size(mem));
    cuMemFree(d_errors);
    cuModuleUnload(module);
    vkgdr_memory_free(mem);
    CHECK(no_last_error(), "%s: free", what);
}

static const uint32_t flag_sets[] = {0, VKGDR_OPEN_REQUIRE_COHERENT_BIT,
                                     VKGDR_OPEN_FORCE_NON_COHERENT_BIT};
static const char *flag_names[] = {"no flags", "REQUIRE_COHERENT", "FORCE_NON_COHERENT"};

static void flows_on_current_context(const char *context)
{
    char what[128];
    size_t f;
    for (f = 0; f < 3; f++) {
        vkgdr_t g = vkgdr_open(0, VKGDR_OPEN_CURRENT_CONTEXT_BIT | flag_sets[f]);
        snprintf(what, sizeof what, "%s context, %s", context, flag_names[f]);
        CHECK(g != NULL, "%s: open", what);
        if (g != NULL) {
            flow(g, what);
            vkgdr_close(g);
        }
    }
}

static void *free_elsewhere(void *mem)
{
    CUcontext none = NULL;
    cuCtxGetCurrent(&none);
    vkgdr_memory_free(mem);
    return none == NULL && no_last_error() ? mem : NULL;
}

#define MIB ((uint64_t)1 << 20)

/* The default limits scale with the device (a power of two of at least 32 MiB, twice that in
 * all); a freed allocation within the limits leaves its mapping for the next of its size (the same
 * device pointer), one past them does not, and lowered limits give back what they no longer
 * hold. The handle's own limits are put back at the end. */
static void spare_limits(vkgdr_t g)
{
    uint64_t each = 0, total = 0, got_each = 0, got_total = 0;
    size_t n = 99;
    vkgdr_memory_t a, past;
    CUdeviceptr at;

    CHECK(vkgdr_get_spare_limits(g, &each, &total) == VKGDR_SUCCESS, "vkgdr_get_spare_limits");
    CHECK(each >= 32 * MIB && (each & (each - 1)) == 0 && total == 2 * each,
          "the default limits: %llu each, %llu in all", (unsigned long long)each,
          (unsigned long long)total);
    CHECK(vkgdr_wait_for_releases(g, 10000000000ll) == 0 && vkgdr_trim(g, NULL) == VKGDR_SUCCESS,
          "nothing kept at the start");
    CHECK(vkgdr_set_spare_limits(g, 8 * MIB, 16 * MIB, &n) == VKGDR_SUCCESS && n == 0,
          "vkgdr_set_spare_limits: %zu given back", n);
    CHECK(vkgdr_get_spare_limits(g, &got_each, NULL) == VKGDR_SUCCESS &&
              vkgdr_get_spare_limits(g, NULL, &got_total) == VKGDR_SUCCESS &&
              got_each == 8 * MIB && got_total == 16 * MIB,
          "read back: %llu, %llu", (unsigned long long)got_each, (unsigned long long)got_total);
    a = vkgdr_memory_alloc(g, 8 * MIB, 0);
    past = vkgdr_memory_alloc(g, 8 * MIB + 4096, 0);
    CHECK(a != NULL && past != NULL, "allocations at and past the limit");
    at = vkgdr_memory_get_device_ptr(a);
    vkgdr_memory_free(a);
    vkgdr_memory_free(past);
    CHECK(vkgdr_wait_for_releases(g, 10000000000ll) == 0, "released");
    a = vkgdr_memory_alloc(g, 8 * MIB, 0);
    CHECK(a != NULL && vkgdr_memory_get_device_ptr(a) == at,
          "the next allocation of its size takes the kept mapping");
    vkgdr_memory_free(a);
    CHECK(vkgdr_wait_for_releases(g, 10000000000ll) == 0, "released again");
    CHECK(vkgdr_set_spare_limits(g, 4 * MIB, 16 * MIB, &n) == VKGDR_SUCCESS && n == 1,
          "a lower limit gives the 8 MiB mapping back, and only it: %zu", n);
    n = 99;
    CHECK(vkgdr_trim(g, &n) == VKGDR_SUCCESS && n == 0,
          "the one past the limit was never kept: %zu left to trim", n);
    CHECK(vkgdr_set_spare_limits(g, each, total, NULL) == VKGDR_SUCCESS, "limits put back");
}

int main(int argc, char **argv)
{
    CUdevice dev;
    CUcontext primary, created;
    vkgdr_t g, by_device, ignored_bits;
    vkgdr_memory_t mem, flagged;
    pthread_t t;
    void *freed = NULL;

    ptx = ptx_argument(argc, argv, "mapping.ptx");
    CU_OK(cuInit(0));
    CU_OK(cuDeviceGet(&dev, 0));

    /* Errors with no context current yet. */
    CHECK(vkgdr_open(-1, 0) == NULL, "device -1 opened");
    CHECK(last_error_contains("CUDA_ERROR_INVALID_DEVICE"), "device -1");
    CHECK(vkgdr_open(0, VKGDR_OPEN_CURRENT_CONTEXT_BIT) == NULL, "opened with no context");
    CHECK(last_error_contains("CUDA_ERROR_INVALID_CONTEXT"), "no current context");
    /* Bit 8 is no flag: ignored, as vkgdr 0.1 ignores it (this is vkgdr_open(0, 0)). */
    ignored_bits = vkgdr_open(0, 8);
    CHECK(ignored_bits != NULL && no_last_error(), "unknown open flag bit");
    vkgdr_close(ignored_bits);
    by_device = vkgdr_open(dev, 0);
    CHECK(by_device != NULL, "open on a CUdevice needs no context");
    CHECK(vkgdr_memory_alloc(by_device, 4096, 0) == NULL, "alloc with no current context");
    CHECK(last_error_contains("CUDA_ERROR_INVALID_CONTEXT"), "alloc with no context");

    /* The runtime's primary context. */
    CU_OK(cuDevicePrimaryCtxRetain(&primary, dev));
    CU_OK(cuCtxSetCurrent(primary));
    flows_on_current_context("primary");
    g = vkgdr_open(0, VKGDR_OPEN_CURRENT_CONTEXT_BIT);
    CHECK(vkgdr_memory_alloc(g, 1000000000000000ull, 0) == NULL, "10^15 bytes allocated");
    CHECK(last_error_contains("VK_ERROR_OUT_OF_DEVICE_MEMORY"), "10^15 bytes");
    flagged = vkgdr_memory_alloc(g, 4096, 1);
    CHECK(flagged != NULL && no_last_error(), "allocation flags are ignored, as in vkgdr 0.1");
    vkgdr_memory_free(flagged);
    mem = vkgdr_memory_alloc(g, 4096, 0);
    vkgdr_memory_flush(mem, 100, SIZE_MAX);
    vkgdr_memory_invalidate(mem, 4096, SIZE_MAX);
    CHECK(no_last_error(), "SIZE_MAX bytes from any offset up to the end");
    vkgdr_memory_flush(mem, 4000, 8192);
    CHECK(last_error_contains("outside the 4096-byte allocation"), "flush out of range");
    vkgdr_memory_invalidate(mem, 4097, SIZE_MAX);
    CHECK(last_error_contains("offset 4097 is past the end of the 4096-byte"), "SIZE_MAX past");
    /* Freed by a thread with no context current: the memory makes its own current. */
    pthread_create(&t, NULL, free_elsewhere, mem);
    pthread_join(t, &freed);
    CHECK(freed == mem, "free from another thread");
    spare_limits(g);
    vkgdr_close(g);
    CU_OK(cuCtxSetCurrent(NULL));

    /* A context from cuCtxCreate (not primary), as PyCUDA makes. */
    CU_OK(create_context(&created, dev));
    flows_on_current_context("cuCtxCreate");
    flow(by_device, "CUdevice handle, allocating in the cuCtxCreate context");
    vkgdr_close(by_device);
    CU_OK(cuCtxDestroy(created));
    CU_OK(cuDevicePrimaryCtxRelease(dev));
    free((void *)ptx);
    return CHECK_SUMMARY("gpu_flow");
}
