/* Helpers of the GPU test programs (C, CUDA driver API): checked driver calls, PTX loading,
 * context creation across CUDA 12 and 13, the host-written word pattern of kernels/mapping.cu. */
#ifndef VKGDR_TEST_GPU_UTIL_H
#define VKGDR_TEST_GPU_UTIL_H

#include <cuda.h>
#include <stdint.h>

#include "check.h"

/* A driver call that must succeed; counts as a check. */
#define CU_OK(call)                                                                        \
    do {                                                                                   \
        CUresult r_ = (call);                                                              \
        const char *n_ = "?";                                                              \
        if (r_ != CUDA_SUCCESS) {                                                          \
            cuGetErrorName(r_, &n_);                                                       \
        }                                                                                  \
        CHECK(r_ == CUDA_SUCCESS, "%s returned %s", #call, n_);                            \
    } while (0)

static inline char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    long n;
    char *text = NULL;
    if (f == NULL) {
        fprintf(stderr, "cannot open %s\n", path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    text = malloc((size_t)n + 1);
    if (text == NULL || fread(text, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(2);
    }
    text[n] = '\0';
    fclose(f);
    return text;
}

/* The text of the PTX file named by argv[1]; exits with a usage message without one. */
static inline char *ptx_argument(int argc, char **argv, const char *which)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s path/to/kernels/%s\n", argv[0], which);
        exit(2);
    }
    return read_text(argv[1]);
}

/* cuInit, device 0, and its primary context (what the CUDA runtime uses) retained and current. */
static inline CUdevice enter_primary_context(void)
{
    CUdevice dev = 0;
    CUcontext primary;
    CU_OK(cuInit(0));
    CU_OK(cuDeviceGet(&dev, 0));
    CU_OK(cuDevicePrimaryCtxRetain(&primary, dev));
    CU_OK(cuCtxSetCurrent(primary));
    return dev;
}

/* Undoes enter_primary_context. */
static inline void leave_primary_context(CUdevice dev)
{
    CU_OK(cuCtxSetCurrent(NULL));
    CU_OK(cuDevicePrimaryCtxRelease(dev));
}

/* Loads `ptx` into the current context and returns `name` from it. */
static inline CUfunction load_kernel(const char *ptx, const char *name, CUmodule *module)
{
    CUfunction f = NULL;
    CU_OK(cuModuleLoadData(module, ptx));
    CU_OK(cuModuleGetFunction(&f, *module, name));
    return f;
}

/* A new (non-primary) context, made current: what PyCUDA's make_default_context does. */
static inline CUresult create_context(CUcontext *ctx, CUdevice dev)
{
#if CUDA_VERSION >= 13000
    return cuCtxCreate(ctx, NULL, 0, dev);
#else
    return cuCtxCreate(ctx, 0, dev);
#endif
}

/* Byte j of a block tagged `tag`, what check_tagged_blocks of kernels/mapping.cu expects: the top
 * byte of tag * 2654435761 (which every bit of the tag moves) plus j, mod 256. */
static inline unsigned char tag_byte(unsigned int tag, size_t j)
{
    return (unsigned char)(((tag * 2654435761u) >> 24) + (unsigned int)j);
}

/* The word kernels/mapping.cu's check_and_transform expects at index i. */
static inline unsigned int pattern(unsigned long long i, unsigned int seed)
{
    return (unsigned int)(i * 2654435761ull) ^ seed;
}

/* One term of the test checksum (ring::layout::test_checksum): the body's 32-bit little-endian
 * word `w` at word index `i`. */
static inline uint64_t test_term(uint64_t i, uint32_t w)
{
    uint64_t x = ((i << 32) | w) + 1;
    x *= 0x9E3779B97F4A7C15ull;
    return x ^ (x >> 29);
}

/* Fills a test payload of `len` bytes (at least 16) for record `seq`, as the checking kernels of
 * kernels/ring.cu verify it (ring::layout::seal_test_payload); returns its checksum (a term per
 * 32-bit word of the body, the last word zero-filled). */
static inline uint64_t make_test_payload(unsigned char *p, size_t len, uint64_t seq)
{
    uint64_t sum = 0;
    size_t j;
    for (j = 16; j < len; j++) {
        p[j] = (unsigned char)(seq * 31u + j);
    }
    for (j = 16; j < len; j += 4) {
        uint32_t w = 0;
        size_t k;
        for (k = 0; k < 4 && j + k < len; k++) {
            w |= (uint32_t)p[j + k] << (8 * k);
        }
        sum += test_term((j - 16) / 4, w);
    }
    memcpy(p, &seq, 8); /* little-endian, as the format says (x86-64) */
    memcpy(p + 8, &sum, 8);
    return sum;
}

#if defined(_POSIX_C_SOURCE) && _POSIX_C_SOURCE >= 199309L
#include <time.h>

/* Waits up to `seconds` for the stream, polling it every millisecond; returns whether it
 * finished. (For programs that define _POSIX_C_SOURCE, for nanosleep.) */
static inline int wait_stream(CUstream s, int seconds)
{
    time_t start = time(NULL);
    CUresult r;
    while ((r = cuStreamQuery(s)) == CUDA_ERROR_NOT_READY && time(NULL) - start < seconds) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    return r == CUDA_SUCCESS;
}
#endif

#endif
