/* A program written only against vkgdr 0.1's documented C API (vkgdr.h of vkgdr 0.1: the opaque
 * handles, enum vkgdr_open_flags, vkgdr_last_error, vkgdr_open/close, vkgdr_memory_*): it must
 * build against this library's header unchanged. It reaches the CUDA driver through dlopen, so it
 * links on machines without one.
 *
 * Without libcuda.so.1 it checks that vkgdr_open fails and names the missing library. With it, it
 * runs vkgdr's documented flow on the primary context for no flags, REQUIRE_COHERENT and
 * FORCE_NON_COHERENT: open on the current context, allocate (an odd size), write from the host,
 * flush, a kernel (check_and_transform of kernels/mapping.ptx, the path given as argv[1])
 * checks and transforms the words in place, invalidate, compare.
 *
 * And vkgdr 0.1's letter where its implementation defines what its header leaves open: the last
 * error belongs to the last vkgdr_open or vkgdr_memory_alloc (they clear it, nothing else does);
 * unknown open flag bits and allocation flags are ignored; a flush or invalidate of SIZE_MAX
 * bytes (VK_WHOLE_SIZE) reaches to the end of the allocation.
 *
 * Usage: compat_v0_1 [path/to/mapping.ptx] */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vkgdr.h"

static int failures;

#define EXPECT(cond, what)                                                                 \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            char *msg_ = vkgdr_last_error();                                               \
            fprintf(stderr, "FAIL %s:%d: %s (last error: %s)\n", __FILE__, __LINE__, what, \
                    msg_ ? msg_ : "none");                                                 \
            free(msg_);                                                                    \
            failures++;                                                                    \
        }                                                                                  \
    } while (0)

typedef CUresult (*init_fn)(unsigned int);
typedef CUresult (*device_get_fn)(CUdevice *, int);
typedef CUresult (*primary_retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*primary_release_fn)(CUdevice);
typedef CUresult (*ctx_set_current_fn)(CUcontext);
typedef CUresult (*module_load_data_fn)(CUmodule *, const void *);
typedef CUresult (*module_get_function_fn)(CUfunction *, CUmodule, const char *);
typedef CUresult (*module_unload_fn)(CUmodule);
typedef CUresult (*launch_fn)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                              unsigned int, unsigned int, unsigned int, CUstream, void **,
                              void **);
typedef CUresult (*ctx_synchronize_fn)(void);

static struct {
    init_fn init;
    device_get_fn device_get;
    primary_retain_fn primary_retain;
    primary_release_fn primary_release;
    ctx_set_current_fn ctx_set_current;
    module_load_data_fn module_load_data;
    module_get_function_fn module_get_function;
    module_unload_fn module_unload;
    launch_fn launch;
    ctx_synchronize_fn ctx_synchronize;
} cu;

static int load_driver(void *lib)
{
    *(void **)&cu.init = dlsym(lib, "cuInit");
    *(void **)&cu.device_get = dlsym(lib, "cuDeviceGet");
    *(void **)&cu.primary_retain = dlsym(lib, "cuDevicePrimaryCtxRetain");
    *(void **)&cu.primary_release = dlsym(lib, "cuDevicePrimaryCtxRelease_v2");
    *(void **)&cu.ctx_set_current = dlsym(lib, "cuCtxSetCurrent");
    *(void **)&cu.module_load_data = dlsym(lib, "cuModuleLoadData");
    *(void **)&cu.module_get_function = dlsym(lib, "cuModuleGetFunction");
    *(void **)&cu.module_unload = dlsym(lib, "cuModuleUnload");
    *(void **)&cu.launch = dlsym(lib, "cuLaunchKernel");
    *(void **)&cu.ctx_synchronize = dlsym(lib, "cuCtxSynchronize");
    return cu.init && cu.device_get && cu.primary_retain && cu.primary_release &&
           cu.ctx_set_current && cu.module_load_data && cu.module_get_function &&
           cu.module_unload && cu.launch && cu.ctx_synchronize;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    long n;
    char *text;
    if (f == NULL) {
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    text = malloc((size_t)n + 1);
    if (text != NULL && fread(text, 1, (size_t)n, f) == (size_t)n) {
        text[n] = '\0';
    } else {
        free(text);
        text = NULL;
    }
    fclose(f);
    return text;
}

static unsigned int pattern(unsigned long long i, unsigned int seed)
{
    return (unsigned int)(i * 2654435761ull) ^ seed;
}

/* Open on the current context with `flags`, allocate, write, flush, transform, invalidate,
 * compare. */
static void flow(CUfunction transform, vkgdr_open_flags extra)
{
    const unsigned long long n = 1000;
    const size_t bytes = (size_t)n * sizeof(unsigned int) + 3; /* a size vkgdr does not round */
    const unsigned int seed = 0x5eed0000u + (unsigned int)extra;
    /* Bit 0x10 is no flag: vkgdr 0.1 ignores it. */
    vkgdr_t g = vkgdr_open(0, VKGDR_OPEN_CURRENT_CONTEXT_BIT | extra | 0x10u);
    vkgdr_memory_t data, errors, probe;
    unsigned int *words;
    unsigned long long *error_count, i, bad = 0;
    CUdeviceptr d_data, d_errors;
    char *msg;
    void *args[5];

    msg = vkgdr_last_error();
    EXPECT(g != NULL, "vkgdr_open on the current context");
    EXPECT(msg == NULL, "a successful vkgdr_open clears the last error");
    free(msg);
    if (g == NULL) {
        return;
    }
    data = vkgdr_memory_alloc(g, bytes, 0);
    /* Allocation flags are ignored, as vkgdr 0.1 ignores them. */
    errors = vkgdr_memory_alloc(g, sizeof(unsigned long long), 0x80000000u);
    EXPECT(data != NULL && errors != NULL, "vkgdr_memory_alloc");
    if (data == NULL || errors == NULL) {
        vkgdr_close(g);
        return;
    }
    EXPECT(vkgdr_memory_get_size(data) == bytes, "the size asked for");
    EXPECT(!(extra & VKGDR_OPEN_FORCE_NON_COHERENT_BIT) || !vkgdr_memory_is_coherent(data),
           "forced non-coherent");
    EXPECT(vkgdr_memory_is_coherent(data) == (vkgdr_memory_non_coherent_atom_size(data) == 1),
           "atom size 1 exactly when coherent");
    words = (unsigned int *)vkgdr_memory_get_host_ptr(data);
    error_count = (unsigned long long *)vkgdr_memory_get_host_ptr(errors);
    for (i = 0; i < n; i++) {
        words[i] = pattern(i, seed);
    }
    *error_count = 0;
    /* A failing allocation's error stays through the successful calls that follow (the flushes
     * here: SIZE_MAX is VK_WHOLE_SIZE, to the end), until the next vkgdr_memory_alloc. */
    EXPECT(vkgdr_memory_alloc(g, 1000000000000000ull, 0) == NULL, "10^15 bytes allocated");
    vkgdr_memory_flush(data, 0, SIZE_MAX);
    vkgdr_memory_flush(errors, 0, sizeof *error_count);
    EXPECT(vkgdr_memory_get_size(data) == bytes, "the size asked for, still");
    msg = vkgdr_last_error();
    EXPECT(msg != NULL && strstr(msg, "VK_ERROR_OUT_OF_DEVICE_MEMORY"),
           "the failed allocation's error outlives the successful flushes");
    free(msg);

    d_data = vkgdr_memory_get_device_ptr(data);
    d_errors = vkgdr_memory_get_device_ptr(errors);
    args[0] = &d_data;
    args[1] = &d_data;
    args[2] = (void *)&n;
    args[3] = (void *)&seed;
    args[4] = &d_errors;
    EXPECT(cu.launch(transform, 4, 1, 1, 256, 1, 1, 0, NULL, args, NULL) == CUDA_SUCCESS,
           "launch");
    EXPECT(cu.ctx_synchronize() == CUDA_SUCCESS, "kernel ran");

    vkgdr_memory_invalidate(data, 0, bytes);
    vkgdr_memory_invalidate(errors, 0, SIZE_MAX);
    EXPECT(*error_count == 0, "the kernel saw every host write");
    for (i = 0; i < n; i++) {
        bad += words[i] != pattern(i, seed) * 3u + 1u;
    }
    EXPECT(bad == 0, "the host sees every kernel write");
    printf("flow (flags %d): %llu words, %llu kernel mismatches, %llu host mismatches\n",
           (int)extra, n, *error_count, bad);

    probe = vkgdr_memory_alloc(g, 4096, 0);
    msg = vkgdr_last_error();
    EXPECT(probe != NULL && msg == NULL, "a successful vkgdr_memory_alloc clears the last error");
    free(msg);

    vkgdr_memory_free(probe);
    vkgdr_memory_free(data);
    vkgdr_memory_free(errors);
    vkgdr_close(g);
}

int main(int argc, char **argv)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    struct vkgdr *raw;
    vkgdr_t g;
    CUdevice dev;
    CUcontext ctx;
    CUmodule module;
    CUfunction transform;
    char *ptx, *msg;

    if (lib == NULL) {
        g = vkgdr_open(0, 0);
        msg = vkgdr_last_error();
        EXPECT(g == NULL && msg != NULL && strstr(msg, "libcuda.so.1") != NULL,
               "vkgdr_open names the missing driver");
        printf("no CUDA driver here: vkgdr_open said \"%s\"\n", msg ? msg : "(nothing)");
        free(msg);
        /* Unknown flag bits are no error of their own: still the missing driver. */
        g = vkgdr_open(0, 0x10u);
        msg = vkgdr_last_error();
        EXPECT(g == NULL && msg != NULL && strstr(msg, "libcuda.so.1") != NULL,
               "an unknown flag bit is ignored");
        free(msg);
        printf("compat_v0_1: %d failed\n", failures);
        return failures != 0;
    }
    if (!load_driver(lib) || argc < 2 || (ptx = read_file(argv[1])) == NULL) {
        fprintf(stderr, "usage: %s path/to/mapping.ptx (with the CUDA driver present)\n", argv[0]);
        return 2;
    }
    /* No current context yet: CURRENT_CONTEXT must fail with the driver's answer. */
    raw = vkgdr_open(0, VKGDR_OPEN_CURRENT_CONTEXT_BIT);
    msg = vkgdr_last_error();
    EXPECT(raw == NULL && msg && strstr(msg, "CUDA_ERROR_INVALID_CONTEXT"), "no context");
    free(msg);

    EXPECT(cu.init(0) == CUDA_SUCCESS && cu.device_get(&dev, 0) == CUDA_SUCCESS, "cuInit");
    EXPECT(cu.primary_retain(&ctx, dev) == CUDA_SUCCESS, "primary context");
    EXPECT(cu.ctx_set_current(ctx) == CUDA_SUCCESS, "current");
    EXPECT(cu.module_load_data(&module, ptx) == CUDA_SUCCESS, "load mapping.ptx");
    EXPECT(cu.module_get_function(&transform, module, "check_and_transform") == CUDA_SUCCESS,
           "check_and_transform");
    if (failures == 0) {
        flow(transform, (vkgdr_open_flags)0);
        flow(transform, VKGDR_OPEN_REQUIRE_COHERENT_BIT);
        flow(transform, VKGDR_OPEN_FORCE_NON_COHERENT_BIT);
    }
    cu.module_unload(module);
    cu.ctx_set_current(NULL);
    cu.primary_release(dev);
    free(ptx);
    printf("compat_v0_1: %d failed\n", failures);
    return failures != 0;
}
