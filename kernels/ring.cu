// Test consumers for the vkgdr ring buffer (CPU producers, GPU consumer).
//
// The wire format and every constant below mirror src/ring/layout.rs; keep them in sync.
// Build: nvcc -ptx -arch=compute_75 kernels/ring.cu -o ring.ptx   (CUDA 12 and 13; CUDA 13
// dropped compute_70)
//
// Record: 16-byte aligned position, header { u32 len; u32 kind; u64 seq } (little-endian), then
// `len` payload bytes, the whole padded to 16. Wrap PAD records (seq = ~0) run exactly to the end
// of the data region; PAD records with another seq are abandoned reservations and keep their seq.
// A mirrored ring (WrapMode::Mirrored) writes no wrap PADs: its records may run past the end of
// the region, which is mapped a second time right after itself, so `data + off` is readable for
// a whole record. The *_mirrored kernels accept such records; the others reject them.
// Test payload: u64 seq, u64 checksum of the rest, then the body.
//
// Launch the consumers with ONE block whose blockDim is a multiple of 32 (up to 1024; another
// size adds one error and does nothing else): warp 0 walks the records and checksums small
// payloads, the whole block helps with large ones (128 or 256 threads are good choices).
// `data` must be 16-byte aligned (cuMemAlloc gives 256). Result words: see RING_RESULT_*.
//
// Checked on an H100 (CUDA 13.0, driver 580) against the Rust reference
// (layout::verify_records) on ring images, with live CPU producers, and under compute-sanitizer
// memcheck, synccheck and racecheck.

#define RING_MIN_CAPACITY 4096ull
#define RING_RECORD_ALIGN 16ull
#define RING_HEADER_LEN 16ull
#define RING_KIND_DATA 1u
#define RING_KIND_PAD 2u
#define RING_WRAP_PAD_SEQ 0xFFFFFFFFFFFFFFFFull
#define RING_TEST_PREFIX_LEN 16ull
#define RING_CHECKSUM_MUL 0x9E3779B97F4A7C15ull
#define RING_CHECKSUM_SHIFT 29
#define RING_BLOCK_BODY_MIN 4096ull // bodies this long are checksummed by the whole block
#define RING_FULL_WARP 0xFFFFFFFFu
#define RING_WALK_DONE 0  // reached `to` or the soft limit
#define RING_WALK_FATAL 1 // broken chain
#define RING_WALK_BIG 2   // a body for the whole block

#define RING_RESULT_RECORDS 0      // DATA records seen
#define RING_RESULT_CHECKSUM_SUM 1 // wrapping sum of computed payload checksums
#define RING_RESULT_ERRORS 2       // errors of any kind
#define RING_RESULT_NEXT_SEQ 3     // next expected seq (last seq seen + 1)
#define RING_RESULT_POS 4          // position reached
#define RING_RESULT_WORDS 8        // words to allocate
#define RING_SEQ_FROM_RESULT 0xFFFFFFFFFFFFFFFFull

typedef unsigned long long ull;

// Accumulators of a walk. Only thread 0's copy is meaningful.
typedef struct {
    ull records;
    ull sum;
    ull errors;
    ull next_seq;
} RingWalk;

// One term of the test checksum: sum over i of mix((i << 8) | body[i]).
__device__ __forceinline__ ull ring_checksum_term(ull index, unsigned int byte)
{
    ull x = ((index << 8) | (ull)byte) + 1ull;
    x *= RING_CHECKSUM_MUL;
    return x ^ (x >> RING_CHECKSUM_SHIFT);
}

__device__ __forceinline__ int ring_capacity_ok(ull capacity)
{
    return capacity >= RING_MIN_CAPACITY && (capacity & (capacity - 1ull)) == 0ull;
}

// Checksum terms of body chunk `cu` (bytes 16*cu .. 16*cu+15 of an `n`-byte body).
__device__ __forceinline__ ull ring_chunk_terms(uint4 v, ull cu, ull n)
{
    const unsigned int words[4] = { v.x, v.y, v.z, v.w };
    ull part = 0ull;
#pragma unroll
    for (int k = 0; k < 16; ++k) {
        const ull i = cu * 16ull + (ull)k;
        if (i < n) {
            part += ring_checksum_term(i, (words[k >> 2] >> ((k & 3) * 8)) & 0xFFu);
        }
    }
    return part;
}

// Sum of the checksum terms of a body's 16-byte chunks first, first + stride, ... (`n` body
// bytes, 16-byte aligned; the record's padding makes whole chunks readable). Four loads are issued
// before their bytes are summed, to overlap their latency.
__device__ __forceinline__ ull ring_body_part(const unsigned char* body, ull n, ull first,
                                              ull stride)
{
    const ull chunks = (n + 15ull) / 16ull;
    ull part = 0ull;
    for (ull c = first; c < chunks; c += 4ull * stride) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const ull cu = c + (ull)u * stride;
            if (cu < chunks) {
                v[u] = __ldcg((const uint4*)(body + cu * 16ull));
            } else {
                v[u] = make_uint4(0u, 0u, 0u, 0u);
            }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            part += ring_chunk_terms(v[u], c + (ull)u * stride, n);
        }
    }
    return part;
}

// Block barrier. The warp is reconverged first: __syncthreads() compiles to an aligned barrier
// (bar.sync), which misbehaves when a warp reaches it split (seen on H100 with a 64-bit shared
// atomic in front of it, whose retry loop split the warps).
__device__ __forceinline__ void ring_block_sync()
{
    __syncwarp();
    __syncthreads();
}

// Sum over the 32 lanes of a warp; every lane must call it.
__device__ __forceinline__ ull ring_warp_sum(ull v)
{
    for (int d = 16; d > 0; d >>= 1) {
        v += __shfl_xor_sync(RING_FULL_WARP, v, d);
    }
    return v;
}

// Walks the records in [pos, to), stopping early at the first record boundary at or past
// `soft_limit`. Called by every thread of the block (blockDim.x a multiple of 32) with the same
// arguments; returns the position reached (the same in every thread). `*fatal` is set when the
// chain is broken (misaligned position, unknown kind, record crossing `to`, or the region's end
// unless `mirrored`):
// the walk stops there with one error counted. The caller checks the capacity.
//
// Warp 0 walks the chain: lane 0 loads each header and the payload's prefix while every lane
// loads one 16-byte chunk of the body speculatively (its address does not depend on the header),
// the header is broadcast by shuffle and the warp checksums the body. A body of
// RING_BLOCK_BODY_MIN bytes or more is handed to the whole block. Record bytes are read with
// ld.global.cg (L2, not L1), so a line cached on an earlier lap of the ring is never reused.
// Only thread 0 updates `w`.
__device__ ull ring_walk(const unsigned char* data, ull capacity, int mirrored, ull pos, ull to,
                         ull soft_limit, RingWalk* w, int* fatal)
{
    __shared__ ull s_pos;           // where warp 0 stopped
    __shared__ int s_state;         // RING_WALK_*
    __shared__ ull s_size;          // RING_WALK_BIG: the record's size,
    __shared__ ull s_len;           //   payload length,
    __shared__ int s_dup_ok;        //   whether the payload's seq copy matches,
    __shared__ ull s_stored;        //   the checksum stored in the payload,
    __shared__ ull s_warp_sum[32];  //   and each warp's share of the checksum

    const ull mask = capacity - 1ull;
    const unsigned int tid = threadIdx.x;
    const unsigned int lane = tid & 31u;
    const int block_helps = blockDim.x > 32u;
    *fatal = 0;
    for (;;) {
        if (tid < 32u) {
            // Every value below is the same in all 32 lanes, so the loop stays converged.
            int state = RING_WALK_DONE;
            ull size = 0ull, len = 0ull, stored = 0ull;
            int dup_ok = 0;
            while (pos < to && pos < soft_limit) {
                if ((pos & (RING_RECORD_ALIGN - 1ull)) != 0ull) {
                    state = RING_WALK_FATAL;
                    break;
                }
                const ull off = pos & mask;
                ull hx = 0ull, hy = 0ull, px = 0ull, py = 0ull;
                if (lane == 0u) {
                    // The prefix address wraps so it stays inside the region for a record
                    // that ends the region (its value is then unused).
                    const ulonglong2 h = __ldcg((const ulonglong2*)(data + off));
                    const ulonglong2 p =
                        __ldcg((const ulonglong2*)(data + ((off + RING_HEADER_LEN) & mask)));
                    hx = h.x;
                    hy = h.y;
                    px = p.x;
                    py = p.y;
                }
                // Body chunk `lane`, loaded before the header is known; wrapped to stay in the
                // region, and only used when it lies inside the record.
                const uint4 spec = __ldcg((const uint4*)(
                    data + ((off + RING_HEADER_LEN + RING_TEST_PREFIX_LEN + 16ull * lane) & mask)));
                hx = __shfl_sync(RING_FULL_WARP, hx, 0);
                hy = __shfl_sync(RING_FULL_WARP, hy, 0);
                px = __shfl_sync(RING_FULL_WARP, px, 0);
                py = __shfl_sync(RING_FULL_WARP, py, 0);
                const unsigned int rlen = (unsigned int)(hx & 0xFFFFFFFFull);
                const unsigned int kind = (unsigned int)(hx >> 32);
                const ull seq = hy;
                const ull rsize = (RING_HEADER_LEN + (ull)rlen + RING_RECORD_ALIGN - 1ull)
                                  & ~(RING_RECORD_ALIGN - 1ull);
                if ((kind != RING_KIND_DATA && kind != RING_KIND_PAD)
                    || (!mirrored && off + rsize > capacity) || rsize > to - pos) {
                    state = RING_WALK_FATAL;
                    break;
                }
                if (kind == RING_KIND_PAD && seq == RING_WRAP_PAD_SEQ) {
                    if (lane == 0u && off + rsize != capacity) {
                        w->errors += 1ull;
                    }
                } else {
                    if (lane == 0u) {
                        if (seq != w->next_seq) {
                            w->errors += 1ull;
                        }
                        w->next_seq = seq + 1ull;
                    }
                    if (kind == RING_KIND_DATA) {
                        if (lane == 0u) {
                            w->records += 1ull;
                        }
                        if ((ull)rlen < RING_TEST_PREFIX_LEN) {
                            if (lane == 0u) {
                                w->errors += 1ull;
                            }
                        } else {
                            const ull n = (ull)rlen - RING_TEST_PREFIX_LEN;
                            if (block_helps && n >= RING_BLOCK_BODY_MIN) {
                                state = RING_WALK_BIG;
                                size = rsize;
                                len = (ull)rlen;
                                stored = py;
                                dup_ok = (px == seq) ? 1 : 0;
                                break; // pos stays at this record
                            }
                            const ull chunks = (n + 15ull) / 16ull;
                            ull part = 0ull;
                            if ((ull)lane < chunks) {
                                part = ring_chunk_terms(spec, (ull)lane, n);
                            }
                            if (chunks > 32ull) {
                                const unsigned char* body =
                                    data + off + RING_HEADER_LEN + RING_TEST_PREFIX_LEN;
                                part += ring_body_part(body, n, 32ull + lane, 32ull);
                            }
                            const ull sum = ring_warp_sum(part);
                            if (lane == 0u) {
                                w->sum += sum;
                                if (px != seq || sum != py) {
                                    w->errors += 1ull;
                                }
                            }
                        }
                    }
                }
                pos += rsize;
            }
            if (lane == 0u) {
                if (state == RING_WALK_FATAL) {
                    w->errors += 1ull;
                }
                s_pos = pos;
                s_state = state;
                s_size = size;
                s_len = len;
                s_dup_ok = dup_ok;
                s_stored = stored;
            }
        }
        ring_block_sync();
        // Copy the shared values before the next barrier: thread 0 rewrites them afterwards.
        pos = s_pos;
        const int state = s_state;
        const ull size = s_size;
        const ull len = s_len;
        if (state != RING_WALK_BIG) {
            *fatal = (state == RING_WALK_FATAL) ? 1 : 0;
            break; // uniform: every thread read the same state
        }
        const unsigned char* body =
            data + (pos & mask) + RING_HEADER_LEN + RING_TEST_PREFIX_LEN;
        // Reduce by shuffles within each warp, then across warps in shared memory (no shared
        // atomics: see ring_block_sync).
        const ull wsum =
            ring_warp_sum(ring_body_part(body, len - RING_TEST_PREFIX_LEN, tid, blockDim.x));
        if (lane == 0u) {
            s_warp_sum[tid >> 5] = wsum;
        }
        ring_block_sync();
        if (tid == 0u) {
            ull sum = 0ull;
            for (unsigned int q = 0; q < (blockDim.x >> 5); ++q) {
                sum += s_warp_sum[q];
            }
            w->sum += sum;
            if (!s_dup_ok || sum != s_stored) {
                w->errors += 1ull;
            }
        }
        pos += size;
    }
    ring_block_sync();
    return pos;
}

// Whether this thread takes part: block 0 only, and a block of whole warps (another size counts
// one error and does nothing else). Uniform within a block.
__device__ __forceinline__ int ring_launch_ok(ull* result)
{
    if (blockIdx.x != 0) {
        return 0;
    }
    if ((blockDim.x & 31u) != 0u) {
        if (threadIdx.x == 0) {
            result[RING_RESULT_ERRORS] += 1ull;
        }
        return 0;
    }
    return 1;
}

__device__ __forceinline__ void ring_load_result(const ull* result, RingWalk* w)
{
    w->records = result[RING_RESULT_RECORDS];
    w->sum = result[RING_RESULT_CHECKSUM_SUM];
    w->errors = result[RING_RESULT_ERRORS];
    w->next_seq = result[RING_RESULT_NEXT_SEQ];
}

__device__ __forceinline__ void ring_store_result(ull* result, const RingWalk* w, ull pos)
{
    result[RING_RESULT_RECORDS] = w->records;
    result[RING_RESULT_CHECKSUM_SUM] = w->sum;
    result[RING_RESULT_ERRORS] = w->errors;
    result[RING_RESULT_NEXT_SEQ] = w->next_seq;
    result[RING_RESULT_POS] = pos;
}

// Batch mode: verifies the records in [from, to) (to = a published tail). Adds to result[0..2],
// sets result[3] (next expected seq) and result[4] (position reached; == to when the chain is
// intact). expected_seq_start = RING_SEQ_FROM_RESULT continues from result[3], so batches
// launched back to back on one stream need no host round trip. Zero `result` before the first.
__device__ __forceinline__ void ring_consume_batch_impl(const unsigned char* data, ull capacity,
                                                        int mirrored, ull from, ull to,
                                                        ull* result, ull expected_seq_start)
{
    if (!ring_launch_ok(result)) {
        return;
    }
    RingWalk w = { 0ull, 0ull, 0ull, 0ull };
    if (threadIdx.x == 0) {
        ring_load_result(result, &w);
        if (expected_seq_start != RING_SEQ_FROM_RESULT) {
            w.next_seq = expected_seq_start;
        }
    }
    __syncwarp();
    ull pos = from;
    if (!ring_capacity_ok(capacity) || to < from || to - from > capacity) {
        if (threadIdx.x == 0) {
            w.errors += 1ull;
        }
    } else {
        int fatal = 0;
        pos = ring_walk(data, capacity, mirrored, from, to, to, &w, &fatal);
    }
    if (threadIdx.x == 0) {
        ring_store_result(result, &w, pos);
    }
}

extern "C" __global__ void ring_consume_batch(const unsigned char* data, ull capacity, ull from,
                                              ull to, ull* result, ull expected_seq_start)
{
    ring_consume_batch_impl(data, capacity, 0, from, to, result, expected_seq_start);
}

// ring_consume_batch for a mirrored ring: records may cross the end of the region.
extern "C" __global__ void ring_consume_batch_mirrored(const unsigned char* data, ull capacity,
                                                       ull from, ull to, ull* result,
                                                       ull expected_seq_start)
{
    ring_consume_batch_impl(data, capacity, 1, from, to, result, expected_seq_start);
}

// Persistent mode: starts at *head_out (the CPU sets it before launch; 0 for a new ring) and at
// seq result[3]; polls *tail; verifies the records up to it; publishes *head_out at least every
// capacity/4 bytes; exits when *stop is set and everything published is consumed. A broken chain
// counts one error and skips to the tail (always a record boundary); a nonsensical tail (behind
// the head, more than capacity ahead, misaligned) counts one error and ends the kernel.
// result[] is updated at every head publication and at exit.
//
// CPU side: publish records, sfence, store tail, sfence; to finish: final tail, sfence, stop = 1.
__device__ __forceinline__ void ring_consume_persistent_impl(const unsigned char* data,
                                                             ull capacity, int mirrored,
                                                             volatile ull* tail,
                                                             volatile unsigned int* stop,
                                                             volatile ull* head_out, ull* result)
{
    __shared__ ull s_tail;
    __shared__ int s_exit;
    if (!ring_launch_ok(result)) {
        return;
    }
    const unsigned int tid = threadIdx.x;
    RingWalk w = { 0ull, 0ull, 0ull, 0ull };
    if (tid == 0) {
        ring_load_result(result, &w);
        s_tail = *head_out;
    }
    ring_block_sync();
    ull pos = s_tail;
    ring_block_sync();
    if (!ring_capacity_ok(capacity) || (pos & (RING_RECORD_ALIGN - 1ull)) != 0ull) {
        if (tid == 0) {
            w.errors += 1ull;
            ring_store_result(result, &w, pos);
        }
        return;
    }
    const ull chunk = capacity / 4ull;
    for (;;) {
        if (tid == 0) {
            ull t;
            int ex = 0;
            for (;;) {
                t = *tail;
                if (t != pos) {
                    break;
                }
                if (*stop != 0u) {
                    // The CPU sets stop after its last tail: fence, then look at the tail again.
                    __threadfence_system();
                    t = *tail;
                    if (t == pos) {
                        ex = 1;
                    }
                    break;
                }
            }
            // Acquire: no record load below may be satisfied before the tail load above.
            __threadfence_system();
            if (!ex && (t < pos || t - pos > capacity || (t & (RING_RECORD_ALIGN - 1ull)) != 0ull)) {
                w.errors += 1ull;
                ex = 1;
            }
            s_tail = t;
            s_exit = ex;
        }
        ring_block_sync(); // thread 0 polled alone: its warp reconverges first
        const ull t = s_tail;
        const int ex = s_exit;
        ring_block_sync();
        if (ex) {
            break;
        }
        while (pos < t) {
            int fatal = 0;
            pos = ring_walk(data, capacity, mirrored, pos, t, pos + chunk, &w, &fatal);
            if (fatal) {
                pos = t;
            }
            if (tid == 0) {
                ring_store_result(result, &w, pos);
                // Every thread's reads of [old head, pos) finished before ring_walk's last
                // barrier; the fence orders them (and result[]) before the head store.
                __threadfence_system();
                *head_out = pos;
                __threadfence_system();
            }
            __syncwarp();
        }
    }
    if (tid == 0) {
        ring_store_result(result, &w, pos);
    }
}

extern "C" __global__ void ring_consume_persistent(const unsigned char* data, ull capacity,
                                                   volatile ull* tail, volatile unsigned int* stop,
                                                   volatile ull* head_out, ull* result)
{
    ring_consume_persistent_impl(data, capacity, 0, tail, stop, head_out, result);
}

// ring_consume_persistent for a mirrored ring: records may cross the end of the region.
extern "C" __global__ void ring_consume_persistent_mirrored(const unsigned char* data,
                                                            ull capacity, volatile ull* tail,
                                                            volatile unsigned int* stop,
                                                            volatile ull* head_out, ull* result)
{
    ring_consume_persistent_impl(data, capacity, 1, tail, stop, head_out, result);
}

// Round-trip latency probe, launched <<<1, 1>>>: for i = 1..iters, waits until *in_gpu >= i
// (written by the CPU), then writes *out_host = i (pinned host memory, read by the CPU).
extern "C" __global__ void ring_pingpong(volatile ull* in_gpu, volatile ull* out_host, ull iters)
{
    if (blockIdx.x != 0 || threadIdx.x != 0) {
        return;
    }
    for (ull i = 1ull; i <= iters; ++i) {
        while (*in_gpu < i) {
        }
        *out_host = i;
        __threadfence_system();
    }
}

// Benchmark consumer: acknowledges everything published without reading it (head = tail), so the
// producers' transport rate into GPU memory is measured rather than a checking walker's speed.
// Exits once stop is set and nothing new was published.
extern "C" __global__ void ring_ack(volatile ull* tail, volatile unsigned int* stop, volatile ull* head_out)
{
    ull last = 0ull;
    for (;;) {
        ull t = *tail;
        if (t != last) {
            last = t;
            *head_out = t;
            continue;
        }
        if (*stop) {
            t = *tail;
            if (t == last) {
                return;
            }
            last = t;
            *head_out = t;
        }
    }
}
