// Consumers for the vkgdr ring buffer (CPU producers, GPU consumer), built on the device API in
// include/vkgdr/ring.cuh (record layout, head/tail protocol, block-cooperative reader).
//
// Build: nvcc -ptx -arch=compute_75 -O3 kernels/ring.cu -o kernels/ring.ptx   (CUDA 12 and 13;
// CUDA 13 dropped compute_70)
//
// The checking consumers verify the test payload (src/core/ring/layout.rs): u64 seq, u64 checksum of
// the rest, then the body; seqs of DATA and abandoned PAD records must continue without gaps
// (after a mismatch counting resumes from the seq found). Result words: see RING_RESULT_*, the
// same numbers as layout::verify_records computes on the CPU.
//
//   ring_check_lanes(view)                      persistent, one block of 256 threads per lane
//   ring_consume_persistent[_mirrored](...)     persistent, lane 0 only (one block of 256)
//   ring_consume_batch[_mirrored](...)          one launch per published range (one block of 256)
//   ring_ack(...), ring_ack_lanes(view)         benchmark consumers: head = tail, reading nothing
//   ring_pingpong(...)                          round-trip latency probe
//
// The checking kernels need blockDim.x == 256 (another size counts one error and does nothing).

#include "../include/vkgdr/ring.cuh"

#define RING_THREADS 256u
#define RING_TEST_PREFIX_LEN 16ull
#define RING_CHECKSUM_MUL 0x9E3779B97F4A7C15ull
#define RING_CHECKSUM_SHIFT 29
#define RING_THREAD_BODY_MAX 256ull // longer bodies are checksummed by the whole block

#define RING_RESULT_RECORDS 0      // DATA records seen
#define RING_RESULT_CHECKSUM_SUM 1 // wrapping sum of computed payload checksums
#define RING_RESULT_ERRORS 2       // errors of any kind
#define RING_RESULT_NEXT_SEQ 3     // next expected seq (last seq seen + 1)
#define RING_RESULT_POS 4          // position reached
#define RING_SEQ_FROM_RESULT 0xFFFFFFFFFFFFFFFFull

typedef unsigned long long ull;

// One term of the test checksum: sum over i of mix((i << 8) | body[i]).
__device__ __forceinline__ ull ring_checksum_term(ull index, unsigned int byte)
{
    ull x = ((index << 8) | (ull)byte) + 1ull;
    x *= RING_CHECKSUM_MUL;
    return x ^ (x >> RING_CHECKSUM_SHIFT);
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

// A checking consumer's running totals. Each thread adds its own records; `next_seq` is the same
// in every thread.
typedef struct {
    ull records;
    ull sum;
    ull errors;
    ull next_seq;
} RingCheck;

// Shared memory of a checking consumer.
typedef struct {
    vkgdr::ReaderShared<RING_THREADS> reader;
    unsigned int big[RING_THREADS]; // records of the group with long bodies
    unsigned int big_count;
    ull scratch[RING_THREADS / 32];
} RingCheckShared;

// Checks one group of `n` records (thread i holds record i in `mine`). Every thread calls it.
__device__ void ring_check_group(vkgdr::BlockReader<RING_THREADS>& rd, unsigned int n,
                                 const vkgdr::Record& mine, RingCheck* c, RingCheckShared* sh)
{
    const unsigned int tid = threadIdx.x;
    if (tid == 0) {
        sh->big_count = 0u;
    }
    vkgdr::block_sync();
    if (tid < n) {
        const ull expected = tid == 0 ? c->next_seq : rd.record(tid - 1).seq + 1ull;
        if (mine.seq != expected) {
            c->errors += 1ull;
        }
        if (mine.kind == VKGDR_RING_KIND_DATA) {
            c->records += 1ull;
            if ((ull)mine.len < RING_TEST_PREFIX_LEN) {
                c->errors += 1ull;
            } else if ((ull)mine.len - RING_TEST_PREFIX_LEN > RING_THREAD_BODY_MAX) {
                sh->big[atomicAdd(&sh->big_count, 1u)] = tid;
            } else {
                const uint4 prefix = __ldcg((const uint4*)mine.payload);
                const ull body = (ull)mine.len - RING_TEST_PREFIX_LEN;
                const ull sum = ring_body_part(mine.payload + RING_TEST_PREFIX_LEN, body, 0ull, 1ull);
                c->sum += sum;
                const ull seq_copy = (ull)prefix.x | ((ull)prefix.y << 32);
                const ull stored = (ull)prefix.z | ((ull)prefix.w << 32);
                if (seq_copy != mine.seq || stored != sum) {
                    c->errors += 1ull;
                }
            }
        }
    }
    vkgdr::block_sync();
    const unsigned int big = sh->big_count;
    // Long bodies: the whole block on each, in any order (the totals are sums).
    for (unsigned int k = 0; k < big; ++k) {
        const vkgdr::Record r = rd.record(sh->big[k]);
        const ull body = (ull)r.len - RING_TEST_PREFIX_LEN;
        const ull sum = vkgdr::block_sum<RING_THREADS>(
            ring_body_part(r.payload + RING_TEST_PREFIX_LEN, body, tid, RING_THREADS), sh->scratch);
        if (tid == 0) {
            const uint4 prefix = __ldcg((const uint4*)r.payload);
            c->sum += sum;
            const ull seq_copy = (ull)prefix.x | ((ull)prefix.y << 32);
            const ull stored = (ull)prefix.z | ((ull)prefix.w << 32);
            if (seq_copy != r.seq || stored != sum) {
                c->errors += 1ull;
            }
        }
    }
    if (n > 0u) {
        c->next_seq = rd.record(n - 1u).seq + 1ull;
    }
}

// Adds the block's totals to result[0..2] and stores next_seq and pos.
__device__ void ring_store_result(ull* result, RingCheck* c, ull pos, RingCheckShared* sh)
{
    const ull records = vkgdr::block_sum<RING_THREADS>(c->records, sh->scratch);
    const ull sum = vkgdr::block_sum<RING_THREADS>(c->sum, sh->scratch);
    const ull errors = vkgdr::block_sum<RING_THREADS>(c->errors, sh->scratch);
    if (threadIdx.x == 0) {
        result[RING_RESULT_RECORDS] += records;
        result[RING_RESULT_CHECKSUM_SUM] += sum;
        result[RING_RESULT_ERRORS] += errors;
        result[RING_RESULT_NEXT_SEQ] = c->next_seq;
        result[RING_RESULT_POS] = pos;
    }
    c->records = 0ull;
    c->sum = 0ull;
    c->errors = 0ull;
}

// Whether this block takes part (a block of RING_THREADS threads; another size counts one error
// in result[2] and does nothing). Uniform within a block.
__device__ __forceinline__ int ring_block_ok(ull* result)
{
    if (blockDim.x != RING_THREADS) {
        if (threadIdx.x == 0) {
            result[RING_RESULT_ERRORS] += 1ull;
        }
        return 0;
    }
    return 1;
}

// Persistent checking consumer of one lane: starts at the lane's head and at seq result[3],
// consumes until stop is set and everything published is consumed, and adds its totals to the
// lane's result words at exit. A broken chain counts one error and skips to the tail; a
// nonsensical tail counts one error and ends the kernel.
__device__ void ring_check_lane(const vkgdr::RingLane& lane, RingCheckShared* sh)
{
    vkgdr::BlockReader<RING_THREADS> rd(lane, sh->reader);
    RingCheck c = { 0ull, 0ull, 0ull, lane.result[RING_RESULT_NEXT_SEQ] };
    while (rd.wait()) {
        vkgdr::Record mine;
        const unsigned int n = rd.next(mine);
        ring_check_group(rd, n, mine, &c, sh);
        if (rd.error() == VKGDR_RING_BROKEN) {
            c.errors += threadIdx.x == 0 ? 1ull : 0ull;
            rd.skip_to_tail();
        }
        rd.release();
    }
    if (rd.error() == VKGDR_RING_BAD_TAIL) {
        c.errors += threadIdx.x == 0 ? 1ull : 0ull;
    }
    rd.release(true);
    ring_store_result(lane.result, &c, rd.position(), sh);
}

// Persistent checking consumer of every lane: launch view.lanes blocks of 256 threads.
extern "C" __global__ void ring_check_lanes(vkgdr_ring_view view)
{
    __shared__ RingCheckShared sh;
    if (blockIdx.x >= view.lanes) {
        return;
    }
    const vkgdr::RingLane lane = vkgdr::ring_lane(view, blockIdx.x);
    if (!ring_block_ok(lane.result)) {
        return;
    }
    ring_check_lane(lane, &sh);
}

__device__ void ring_consume_persistent_impl(const unsigned char* data, ull capacity,
                                             int mirrored, volatile ull* tail,
                                             volatile unsigned int* stop, volatile ull* head_out,
                                             ull* result)
{
    __shared__ RingCheckShared sh;
    if (blockIdx.x != 0 || !ring_block_ok(result)) {
        return;
    }
    vkgdr::RingLane lane;
    lane.data = data;
    lane.capacity = capacity;
    lane.mirrored = mirrored;
    lane.tail = tail;
    lane.stop = stop;
    lane.head = head_out;
    lane.result = result;
    if (capacity < VKGDR_RING_MIN_CAPACITY || (capacity & (capacity - 1ull)) != 0ull) {
        if (threadIdx.x == 0) {
            result[RING_RESULT_ERRORS] += 1ull;
        }
        return;
    }
    ring_check_lane(lane, &sh);
}

// Persistent mode, lane 0 of a ring (the single-lane consumer): starts at *head_out (0 for a new
// ring) and at seq result[3]; polls *tail; verifies the records up to it; publishes *head_out
// when caught up and at least every capacity/4 bytes; exits when *stop is set and everything
// published is consumed, adding its totals to result[] then.
//
// CPU side: publish records, sfence, store tail, sfence; to finish: final tail, sfence, stop = 1.
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

// Batch mode: verifies the records in [from, to) (to = a published tail). Adds to result[0..2],
// sets result[3] (next expected seq) and result[4] (position reached; == to when the chain is
// intact). expected_seq_start = RING_SEQ_FROM_RESULT continues from result[3], so batches
// launched back to back on one stream need no host round trip. Zero `result` before the first.
__device__ void ring_consume_batch_impl(const unsigned char* data, ull capacity, int mirrored,
                                        ull from, ull to, ull* result, ull expected_seq_start)
{
    __shared__ RingCheckShared sh;
    if (blockIdx.x != 0 || !ring_block_ok(result)) {
        return;
    }
    vkgdr::BlockReader<RING_THREADS> rd(data, capacity, mirrored, from, to, sh.reader);
    RingCheck c = { 0ull, 0ull, 0ull,
                    expected_seq_start == RING_SEQ_FROM_RESULT ? result[RING_RESULT_NEXT_SEQ]
                                                               : expected_seq_start };
    if (rd.error() != VKGDR_RING_OK) {
        c.errors += threadIdx.x == 0 ? 1ull : 0ull;
    }
    while (rd.position() != rd.tail()) {
        vkgdr::Record mine;
        const unsigned int n = rd.next(mine);
        ring_check_group(rd, n, mine, &c, &sh);
        if (rd.error() == VKGDR_RING_BROKEN) {
            c.errors += threadIdx.x == 0 ? 1ull : 0ull;
            break; // the position stays at the bad record
        }
        rd.release();
    }
    ring_store_result(result, &c, rd.position(), &sh);
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

// Acknowledges everything published on one lane without reading it (head = tail), until stop is
// set and nothing new was published: the producers' transport rate into GPU memory.
__device__ void ring_ack_lane(volatile ull* tail, volatile unsigned int* stop,
                              volatile ull* head_out)
{
    ull last = *head_out;
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

// Benchmark consumer of lane 0, launched <<<1, 1>>>.
extern "C" __global__ void ring_ack(volatile ull* tail, volatile unsigned int* stop,
                                    volatile ull* head_out)
{
    if (blockIdx.x != 0 || threadIdx.x != 0) {
        return;
    }
    ring_ack_lane(tail, stop, head_out);
}

// Benchmark consumer of every lane: launch view.lanes blocks of 32 threads (thread 0 works).
extern "C" __global__ void ring_ack_lanes(vkgdr_ring_view view)
{
    if (blockIdx.x >= view.lanes || threadIdx.x != 0) {
        return;
    }
    const vkgdr::RingLane lane = vkgdr::ring_lane(view, blockIdx.x);
    ring_ack_lane(lane.tail, lane.stop, lane.head);
}
