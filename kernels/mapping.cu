// Kernels for vkgdr's GPU tests, examples and benchmarks (mapping layer, pool, benchmarks).
// Compiled once on the GPU machine: nvcc -ptx -arch=compute_75 mapping.cu -o mapping.ptx
// (scripts/gpu-check ptx). The PTX text is committed and loaded with cuModuleLoadData.

// The word the CPU writes at index i for a given seed (also used by the Rust side).
__device__ __forceinline__ unsigned int pattern(unsigned long long i, unsigned int seed) {
    return (unsigned int)(i * 2654435761ull) ^ seed;
}

// Reads n host-written words, counts mismatches against pattern(i, seed), and writes
// out[i] = in[i] * 3 + 1 for the CPU to check.
extern "C" __global__ void check_and_transform(const unsigned int* in, unsigned int* out,
                                               unsigned long long n, unsigned int seed,
                                               unsigned long long* errors) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long bad = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned int v = in[i];
        if (v != pattern(i, seed)) bad++;
        out[i] = v * 3u + 1u;
    }
    if (bad) atomicAdd(errors, bad);
}

// Counts words that differ from pattern(first_index + i, seed) (reads across arbitrary ranges,
// e.g. the whole of an arena across chunk boundaries).
extern "C" __global__ void count_mismatches(const unsigned int* p, unsigned long long n,
                                            unsigned long long first_index, unsigned int seed,
                                            unsigned long long* errors) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long bad = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (p[i] != pattern(first_index + i, seed)) bad++;
    }
    if (bad) atomicAdd(errors, bad);
}

// Byte 0 of a block tagged `tag` (byte j is tag_base(tag) + j, mod 256; also written by the Rust,
// C and Python tests): the top byte of tag * 2654435761 (Fibonacci hashing), which every bit of
// the tag moves. Flipping any one bit of a tag changes every byte of its block, consecutive tags
// differ in every byte, and so do tags (r << 28) + k for different r < 16 (their first bytes
// differ by 16 * r): what the two-GPU tests' rounds use.
__device__ __forceinline__ unsigned int tag_base(unsigned int tag) {
    return (tag * 2654435761u) >> 24;
}

// Pool test: block k (device pointer ptrs[k], lens[k] bytes) must hold bytes
// (tag_base(tags[k]) + j) & 0xff. One thread per block; counts blocks with any wrong byte.
extern "C" __global__ void check_tagged_blocks(const unsigned long long* ptrs, const unsigned int* lens,
                                               const unsigned int* tags, unsigned long long n,
                                               unsigned long long* bad_blocks) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long k = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += stride) {
        const unsigned char* p = (const unsigned char*)ptrs[k];
        unsigned int len = lens[k];
        unsigned int base = tag_base(tags[k]);
        int ok = 1;
        for (unsigned int j = 0; j < len; j++) {
            if (p[j] != (unsigned char)((base + j) & 0xffu)) { ok = 0; break; }
        }
        if (!ok) atomicAdd(bad_blocks, 1ull);
    }
}

// Ping-pong: for i in 1..=iters wait until *in == i (polled with volatile loads from the BAR
// mapping or from cuMemAlloc memory), then write *out = i into pinned host memory.
extern "C" __global__ void pingpong(volatile unsigned long long* in, volatile unsigned long long* out,
                                    unsigned long long iters) {
    for (unsigned long long i = 1; i <= iters; i++) {
        while (*in < i) { }
        __threadfence_system();
        *out = i;
        __threadfence_system();
    }
}

// Sums n words (used by the "read a whole arena" benchmark and the example).
extern "C" __global__ void sum_words(const unsigned int* p, unsigned long long n, unsigned long long* out) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long s = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        s += p[i];
    }
    atomicAdd(out, s);
}

// Ping-pong without system fences: the answer is one volatile store into pinned host memory,
// which leaves the SM as a posted PCIe write on its own; nothing after it needs ordering.
extern "C" __global__ void pingpong_lean(volatile unsigned long long* in, volatile unsigned long long* out,
                                         unsigned long long iters) {
    for (unsigned long long i = 1; i <= iters; i++) {
        while (*in < i) { }
        *out = i;
    }
}

// vkgdr 0.1's test kernel: doubles n bytes in place. The Python drop-in's tests launch it through
// the driver API in contexts of their own (cuCtxCreate), where CuPy's module cache cannot follow.
extern "C" __global__ void double_bytes(unsigned char* data, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] = (unsigned char)(data[i] * 2);
}

// A persistent kernel: runs until *stop becomes non-zero, storing its loop count into *beats every
// 4096 polls (and once more at the end), so the host can see that it is alive. The kernel that
// runs beside every call of the coexistence tests and of `vkgdr bench waits`; launch it with one
// thread on a stream of its own.
extern "C" __global__ void spin_until_stopped(volatile unsigned int* stop, volatile unsigned long long* beats) {
    unsigned long long n = 0;
    while (*stop == 0) {
        n++;
        if ((n & 0xfffull) == 0) *beats = n;
    }
    *beats = n | 1ull;
}
