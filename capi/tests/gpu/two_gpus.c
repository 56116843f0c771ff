/* Two GPUs from C, in one process: both devices opened through vkgdr_open, raw memory and a pool
 * on each written with patterns and tags of their own, checked through the C API
 * (vkgdr_memory_read, vkgdr_block_read) and by a kernel on each device (count_mismatches and
 * check_tagged_blocks of kernels/mapping.ptx, loaded into each device's primary context). Then
 * isolation: rewriting one device's memory never shows on the other. Every check is shown able
 * to fail: each device's memory checked against the other's pattern and tags is wrong
 * everywhere; the other device's tags written into a few blocks are found, exactly those, until
 * restored; a raw allocation for one device with the other's context current is refused.
 *
 * The rounds' tags are r << 28: their first bytes (tag_byte) differ by 16 r, so two rounds
 * differ in every byte of every block (checked on the CPU first).
 *
 * On a machine with fewer than two GPUs it prints "SKIPPED: needs two GPUs" and exits with
 * SKIP_EXIT (77), which scripts/gpu-check counts as skipped, not passed.
 *
 * Usage: two_gpus path/to/kernels/mapping.ptx */
#include <stdint.h>

#include "gpu_util.h"

#define SKIP_EXIT 77
#define BLOCKS 1000
/* Raw memory per device: 1 MiB and one word, so the last granule is partly used. */
#define WORDS ((1u << 18) + 1u)
#define ROUND(r) ((unsigned int)(r) << 28)

static const int aliased[3] = {3, 500, BLOCKS - 1};
#define ALIASED ((int)(sizeof aliased / sizeof aliased[0]))

static size_t block_size(int k) { return (size_t)(1 + (k * 37) % 200); }

typedef struct {
    int index;
    CUdevice dev;
    CUcontext ctx; /* the device's primary context, current while the side is used */
    vkgdr_t g;
    CUmodule module;
    CUfunction count, check;
    vkgdr_memory_t mem; /* WORDS words of pattern(i, seed) */
    unsigned int seed;
    vkgdr_pool_t pool;
    vkgdr_block_t blocks[BLOCKS];
    unsigned long long ptrs[BLOCKS];
    unsigned int lens[BLOCKS], tags[BLOCKS]; /* tags[k]: what block k holds now */
    CUdeviceptr d_ptrs, d_lens, d_tags, d_count; /* kernel arguments, cuMemAlloc'd */
} side;

static side sides[2];
static unsigned char scratch[256];
static unsigned int words[WORDS];

static void enter(side *s) { CU_OK(cuCtxSetCurrent(s->ctx)); }

static void open_side(side *s, int index, const char *ptx)
{
    int k;
    s->index = index;
    CU_OK(cuDeviceGet(&s->dev, index));
    CU_OK(cuDevicePrimaryCtxRetain(&s->ctx, s->dev));
    enter(s);
    /* No CURRENT_CONTEXT bit: the pool uses the device's primary context, raw allocations the
     * context current when they are made (this device's, made current above). */
    s->g = vkgdr_open(s->dev, 0);
    CHECK(s->g != NULL, "device %d: vkgdr_open", index);
    if (s->g == NULL) {
        exit(CHECK_SUMMARY("two_gpus"));
    }
    s->count = load_kernel(ptx, "count_mismatches", &s->module);
    CU_OK(cuModuleGetFunction(&s->check, s->module, "check_tagged_blocks"));
    s->mem = vkgdr_memory_alloc(s->g, (size_t)WORDS * 4, 0);
    CHECK(s->mem != NULL && no_last_error(), "device %d: vkgdr_memory_alloc", index);
    s->pool = vkgdr_pool_create(s->g, NULL);
    CHECK(s->pool != NULL, "device %d: vkgdr_pool_create", index);
    if (s->mem == NULL || s->pool == NULL) {
        exit(CHECK_SUMMARY("two_gpus"));
    }
    for (k = 0; k < BLOCKS; k++) {
        s->blocks[k] = vkgdr_pool_alloc(s->pool, block_size(k), 8);
        CHECK(s->blocks[k] != NULL, "device %d: block %d", index, k);
        if (s->blocks[k] == NULL) {
            exit(CHECK_SUMMARY("two_gpus"));
        }
        s->ptrs[k] = vkgdr_block_get_device_ptr(s->blocks[k]);
        s->lens[k] = (unsigned int)block_size(k);
    }
    CU_OK(cuMemAlloc(&s->d_ptrs, sizeof s->ptrs));
    CU_OK(cuMemAlloc(&s->d_lens, sizeof s->lens));
    CU_OK(cuMemAlloc(&s->d_tags, sizeof s->tags));
    CU_OK(cuMemAlloc(&s->d_count, sizeof(unsigned long long)));
    CU_OK(cuMemcpyHtoD(s->d_ptrs, s->ptrs, sizeof s->ptrs));
    CU_OK(cuMemcpyHtoD(s->d_lens, s->lens, sizeof s->lens));
}

static void close_side(side *s)
{
    int k;
    enter(s);
    /* Frees report failure only through the last error, which a success leaves alone. */
    mark_last_error();
    for (k = 0; k < BLOCKS; k++) {
        vkgdr_block_free(s->blocks[k]);
    }
    vkgdr_pool_destroy(s->pool);
    vkgdr_memory_free(s->mem);
    CHECK(still_marked(), "device %d: frees", s->index);
    CHECK(vkgdr_wait_for_releases(s->g, 30000000000ll) == 0, "device %d: releases", s->index);
    vkgdr_close(s->g);
    cuMemFree(s->d_ptrs);
    cuMemFree(s->d_lens);
    cuMemFree(s->d_tags);
    cuMemFree(s->d_count);
    CU_OK(cuModuleUnload(s->module));
    CU_OK(cuCtxSetCurrent(NULL));
    CU_OK(cuDevicePrimaryCtxRelease(s->dev));
}

/* Raw memory: word i = pattern(i, seed), written through the C API. */
static void write_words(side *s, unsigned int seed)
{
    unsigned int i;
    for (i = 0; i < WORDS; i++) {
        words[i] = pattern(i, seed);
    }
    CHECK(vkgdr_memory_write(s->mem, 0, words, sizeof words) == VKGDR_SUCCESS,
          "device %d: vkgdr_memory_write", s->index);
    s->seed = seed;
}

/* count_mismatches on the side's device: words of its raw memory that are not pattern(i, seed). */
static unsigned long long mismatched_words(side *s, unsigned int seed)
{
    CUdeviceptr d = vkgdr_memory_get_device_ptr(s->mem);
    unsigned long long n = WORDS, first = 0, bad = ~0ull;
    void *args[5] = {&d, &n, &first, &seed, &s->d_count};
    enter(s);
    CU_OK(cuMemsetD8(s->d_count, 0, sizeof bad));
    CU_OK(cuLaunchKernel(s->count, 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    CU_OK(cuCtxSynchronize());
    CU_OK(cuMemcpyDtoH(&bad, s->d_count, sizeof bad));
    return bad;
}

static void write_block(side *s, int k, unsigned int tag)
{
    size_t j;
    for (j = 0; j < s->lens[k]; j++) {
        scratch[j] = tag_byte(tag, j);
    }
    CHECK(vkgdr_block_write(s->blocks[k], 0, scratch, s->lens[k]) == VKGDR_SUCCESS,
          "device %d: vkgdr_block_write %d", s->index, k);
    s->tags[k] = tag;
}

/* Block k gets tag round + k. */
static void write_round(side *s, unsigned int round)
{
    int k;
    for (k = 0; k < BLOCKS; k++) {
        write_block(s, k, round + (unsigned int)k);
    }
    CHECK(vkgdr_pool_flush(s->pool) == VKGDR_SUCCESS, "device %d: flush", s->index);
}

/* check_tagged_blocks on the side's device with expect[k] expected of block k: blocks wrong. */
static unsigned long long bad_blocks_against(side *s, const unsigned int *expect)
{
    unsigned long long n = BLOCKS, bad = ~0ull;
    void *args[5] = {&s->d_ptrs, &s->d_lens, &s->d_tags, &n, &s->d_count};
    enter(s);
    CHECK(vkgdr_pool_flush(s->pool) == VKGDR_SUCCESS, "device %d: flush", s->index);
    CU_OK(cuMemcpyHtoD(s->d_tags, expect, sizeof s->tags));
    CU_OK(cuMemsetD8(s->d_count, 0, sizeof bad));
    CU_OK(cuLaunchKernel(s->check, 64, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    CU_OK(cuCtxSynchronize());
    CU_OK(cuMemcpyDtoH(&bad, s->d_count, sizeof bad));
    return bad;
}

static unsigned long long bad_blocks(side *s, unsigned int round)
{
    unsigned int expect[BLOCKS];
    int k;
    for (k = 0; k < BLOCKS; k++) {
        expect[k] = round + (unsigned int)k;
    }
    return bad_blocks_against(s, expect);
}

/* Through the C API's reads: blocks not holding their tag, plus raw words not their pattern. */
static unsigned long long cpu_mismatches(side *s)
{
    unsigned long long wrong = 0;
    unsigned int i;
    int k;
    size_t j;
    for (k = 0; k < BLOCKS; k++) {
        int ok = vkgdr_block_read(s->blocks[k], 0, scratch, s->lens[k]) == VKGDR_SUCCESS;
        for (j = 0; ok && j < s->lens[k]; j++) {
            ok = scratch[j] == tag_byte(s->tags[k], j);
        }
        wrong += !ok;
    }
    CHECK(vkgdr_memory_read(s->mem, 0, words, sizeof words) == VKGDR_SUCCESS,
          "device %d: vkgdr_memory_read", s->index);
    for (i = 0; i < WORDS; i++) {
        wrong += words[i] != pattern(i, s->seed);
    }
    return wrong;
}

/* The premise: rounds a and b write different bytes at every index of every block. */
static int rounds_differ_everywhere(unsigned int a, unsigned int b)
{
    int k;
    size_t j;
    for (k = 0; k < BLOCKS; k++) {
        for (j = 0; j < block_size(k); j++) {
            if (tag_byte(a + (unsigned int)k, j) == tag_byte(b + (unsigned int)k, j)) {
                return 0;
            }
        }
    }
    return 1;
}

/* No device address range of one side overlaps one of the other. */
static int disjoint(const side *a, const side *b)
{
    unsigned long long a0 = vkgdr_memory_get_device_ptr(a->mem);
    unsigned long long b0 = vkgdr_memory_get_device_ptr(b->mem);
    unsigned long long n = (unsigned long long)WORDS * 4;
    int i, k;
    if (a0 < b0 + n && b0 < a0 + n) {
        return 0;
    }
    for (i = 0; i < BLOCKS; i++) {
        for (k = 0; k < BLOCKS; k++) {
            if (a->ptrs[i] < b->ptrs[k] + b->lens[k] && b->ptrs[k] < a->ptrs[i] + a->lens[i]) {
                return 0;
            }
        }
    }
    return 1;
}

int main(int argc, char **argv)
{
    char *ptx = ptx_argument(argc, argv, "mapping.ptx");
    side *s0 = &sides[0], *s1 = &sides[1];
    unsigned int expect[BLOCKS];
    CUuuid u0, u1;
    int n = 0, i, r;

    CU_OK(cuInit(0));
    CU_OK(cuDeviceGetCount(&n));
    if (n < 2) {
        printf("SKIPPED: needs two GPUs (this machine has %d)\n", n);
        free(ptx);
        return SKIP_EXIT;
    }
    for (r = 1; r <= 4; r++) {
        for (i = r + 1; i <= 4; i++) {
            CHECK(rounds_differ_everywhere(ROUND(r), ROUND(i)), "rounds %d and %d share a byte",
                  r, i);
        }
    }
    /* The premise check can fail: tags one inverse of 2654435761 apart have products one apart. */
    CHECK(!rounds_differ_everywhere(ROUND(1), ROUND(1) + 0x0e8b2f51u),
          "the premise check cannot fail");

    open_side(s0, 0, ptx);
    open_side(s1, 1, ptx);
    CU_OK(cuDeviceGetUuid(&u0, s0->dev));
    CU_OK(cuDeviceGetUuid(&u1, s1->dev));
    CHECK(memcmp(u0.bytes, u1.bytes, sizeof u0.bytes) != 0, "two devices, two UUIDs");
    CHECK(disjoint(s0, s1), "the two devices' memory shares device addresses");

    /* Raw memory for device 1 with device 0's context current is refused, and nothing leaks. */
    enter(s0);
    CHECK(vkgdr_memory_alloc(s1->g, 4096, 0) == NULL, "device 1's memory in device 0's context");
    CHECK(last_error_contains("belongs to device"), "the refusal says why");

    /* Raw memory: each device's kernel sees its own pattern, and not the other's. */
    write_words(s0, 0xC0DE0000u);
    write_words(s1, 0xC0DE1111u);
    CHECK(mismatched_words(s0, s0->seed) == 0, "device 0's kernel on its raw memory");
    CHECK(mismatched_words(s1, s1->seed) == 0, "device 1's kernel on its raw memory");
    CHECK(mismatched_words(s1, s0->seed) == WORDS, "device 1's words, device 0's pattern");
    CHECK(mismatched_words(s0, s1->seed) == WORDS, "device 0's words, device 1's pattern");

    /* Pools: each device's kernel sees its own tags; the other's tag table fails every block. */
    write_round(s0, ROUND(1));
    write_round(s1, ROUND(2));
    CHECK(bad_blocks(s0, ROUND(1)) == 0, "device 0's kernel on its blocks");
    CHECK(bad_blocks(s1, ROUND(2)) == 0, "device 1's kernel on its blocks");
    CHECK(bad_blocks(s1, ROUND(1)) == BLOCKS, "device 1's blocks against device 0's tags");
    CHECK(bad_blocks(s0, ROUND(2)) == BLOCKS, "device 0's blocks against device 1's tags");

    /* Aliasing control: device 0's round in a few blocks of device 1 is found, exactly there. */
    for (i = 0; i < ALIASED; i++) {
        write_block(s1, aliased[i], ROUND(1) + (unsigned int)aliased[i]);
    }
    CHECK(bad_blocks(s1, ROUND(2)) == ALIASED, "device 0's bytes in device 1's blocks");
    for (i = 0; i < BLOCKS; i++) {
        expect[i] = ROUND(2) + (unsigned int)i;
    }
    for (i = 0; i < ALIASED; i++) {
        expect[aliased[i]] = ROUND(1) + (unsigned int)aliased[i];
    }
    CHECK(bad_blocks_against(s1, expect) == 0, "the aliased blocks are exactly those");
    for (i = 0; i < ALIASED; i++) {
        write_block(s1, aliased[i], ROUND(2) + (unsigned int)aliased[i]);
    }
    CHECK(bad_blocks(s1, ROUND(2)) == 0, "device 1 restored");

    /* Isolation: rewriting device 0 leaves device 1 as it was, and the other way round. */
    write_words(s0, 0xC0DE2222u);
    write_round(s0, ROUND(3));
    CHECK(bad_blocks(s0, ROUND(3)) == 0 && mismatched_words(s0, s0->seed) == 0,
          "device 0 rewritten");
    CHECK(bad_blocks(s0, ROUND(1)) == BLOCKS && mismatched_words(s0, 0xC0DE0000u) == WORDS,
          "device 0's kernel still sees what was there before");
    CHECK(bad_blocks(s1, ROUND(2)) == 0 && mismatched_words(s1, s1->seed) == 0,
          "a write to device 0 showed up on device 1");
    write_words(s1, 0xC0DE3333u);
    write_round(s1, ROUND(4));
    CHECK(bad_blocks(s1, ROUND(4)) == 0 && mismatched_words(s1, s1->seed) == 0,
          "device 1 rewritten");
    CHECK(bad_blocks(s0, ROUND(3)) == 0 && mismatched_words(s0, s0->seed) == 0,
          "a write to device 1 showed up on device 0");
    /* The same control in this direction: device 1's round aliased into device 0. */
    for (i = 0; i < ALIASED; i++) {
        write_block(s0, aliased[i], ROUND(4) + (unsigned int)aliased[i]);
    }
    CHECK(bad_blocks(s0, ROUND(3)) == ALIASED, "device 1's bytes in device 0's blocks");
    for (i = 0; i < ALIASED; i++) {
        write_block(s0, aliased[i], ROUND(3) + (unsigned int)aliased[i]);
    }
    CHECK(bad_blocks(s0, ROUND(3)) == 0, "device 0 restored");
    CHECK(cpu_mismatches(s0) == 0, "device 0 read back through the C API");
    CHECK(cpu_mismatches(s1) == 0, "device 1 read back through the C API");
    printf("two devices: %d blocks and %u words each, 4 rounds, isolation and aliasing checked by "
           "both kernels\n",
           BLOCKS, WORDS);

    close_side(s1);
    close_side(s0);
    free(ptx);
    return CHECK_SUMMARY("two_gpus");
}
