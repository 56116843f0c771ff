// Consumers for the vkgdr ring buffer (CPU producers, GPU consumer), built on the device API in
// include/vkgdr/ring.cuh (record layout, head/tail protocol, vkgdr::WindowReader).
//
// Build: nvcc -ptx -arch=compute_75 -O3 kernels/ring.cu -o kernels/ring.ptx   (CUDA 12 and 13;
// CUDA 13 dropped compute_70)
//
// The checking consumers verify the test payload (src/core/ring/layout.rs): u64 seq, u64 checksum of
// the rest, then the body; seqs of DATA and abandoned PAD records must continue without gaps
// (after a mismatch counting resumes from the seq found). Result words: see RING_RESULT_*, the
// same numbers as layout::verify_records computes on the CPU.
//
//   ring_check_lanes(view)                      persistent, one block of 512 threads per lane
//   ring_consume_persistent[_mirrored](...)     persistent, lane 0 only (one block of 512)
//   ring_consume_batch[_mirrored](...)          one launch per published range (one block of 512)
//   ring_ack(...), ring_ack_lanes(view)         benchmark consumers: head = tail, reading nothing
//   ring_ack_load_lanes(view)                   benchmark consumer: head = tail once the first
//                                               record's header is read (the floor of a reader)
//   ring_pingpong(...)                          round-trip latency probe
//
// The checking kernels need blockDim.x == 512 (RING_THREADS; another size counts one error and does
// nothing): 16 warps, four per scheduler partition, so each thread may hold 128 registers and the
// persistent kernels keep their read-ahead in registers (at 544 threads, 17 warps, a partition
// holds five and the limit is 96: the persistent kernels spilled and checked 4 KiB records
// slower, although a 17 KiB window holds four of them where 16 KiB holds three; figures:
// BENCHMARKS.md, 'The checking kernels' block size').

#include "../include/vkgdr/ring.cuh"

#define RING_THREADS 512u
#define RING_CPT 2u // chunks per thread: a 16 KiB window
#define RING_TEST_PREFIX_LEN 16ull
#define RING_CHECKSUM_MUL 0x9E3779B97F4A7C15ull
#define RING_CHECKSUM_SHIFT 29
#define RING_THREAD_BODY_MAX 128ull // longer bodies are checksummed by the whole block
// Most records of a window with bodies longer than RING_THREAD_BODY_MAX: the window's bytes over
// the smallest such record (16 + 16 + 129 bytes, padded to 176).
#define RING_BIG_MAX (16u * RING_CPT * RING_THREADS / 176u)
#define RING_BIG_NONE 0xFFFFu // no record (a lane past the window's body chunks)

#define RING_RESULT_RECORDS 0      // DATA records seen
#define RING_RESULT_CHECKSUM_SUM 1 // wrapping sum of computed payload checksums
#define RING_RESULT_ERRORS 2       // errors of any kind
#define RING_RESULT_NEXT_SEQ 3     // next expected seq (last seq seen + 1)
#define RING_RESULT_POS 4          // position reached
#define RING_SEQ_FROM_RESULT 0xFFFFFFFFFFFFFFFFull

typedef unsigned long long ull;
typedef vkgdr::WindowReader<RING_THREADS, RING_CPT> RingReader;

// Checksum term of a body's 32-bit word `w` (little-endian), `base` = ((i << 32) + 1) * MUL for
// its index i: mix((i << 32 | w) + 1) = x ^ (x >> 29) with x = base + w * MUL, one 32-by-64-bit
// multiply-add per word.
__device__ __forceinline__ ull ring_word_term(unsigned int w, ull base)
{
    const ull x = base + (ull)w * RING_CHECKSUM_MUL;
    return x ^ (x >> RING_CHECKSUM_SHIFT);
}

// Checksum terms of body chunk `cu` (bytes 16*cu .. 16*cu+15 of an `n`-byte body, cu*16 < n):
// words 4*cu .. 4*cu+3. Only a body's last chunk may be partial: its words past the body are
// left out, the bytes past the body of its last word count as zero.
__device__ __forceinline__ ull ring_chunk_terms(uint4 v, ull cu, ull n)
{
    const ull base = ((cu << 34) | 1ull) * RING_CHECKSUM_MUL;
    const ull step = RING_CHECKSUM_MUL << 32; // the next word's index
    const ull left = n - cu * 16ull;
    if (left >= 16ull) {
        return (ring_word_term(v.x, base) + ring_word_term(v.y, base + step))
               + (ring_word_term(v.z, base + 2ull * step) + ring_word_term(v.w, base + 3ull * step));
    }
    const unsigned int words[4] = { v.x, v.y, v.z, v.w };
    ull part = 0ull;
#pragma unroll
    for (unsigned int j = 0; j < 4u; ++j) {
        const ull at = 4ull * j;
        if (at < left) {
            const unsigned int keep =
                left - at >= 4ull ? 0xFFFFFFFFu : (1u << (8u * (unsigned int)(left - at))) - 1u;
            part += ring_word_term(words[j] & keep, base + (ull)j * step);
        }
    }
    return part;
}

// Sum of the checksum terms of a body's 16-byte chunks first, first + stride, ... read from
// global memory (`n` body bytes, 16-byte aligned; the record's padding makes whole chunks
// readable). Eight loads are issued before their bytes are summed, to overlap their latency.
__device__ __forceinline__ ull ring_body_part(const unsigned char* body, ull n, ull first,
                                              ull stride)
{
    const ull chunks = (n + 15ull) / 16ull;
    ull part = 0ull;
    for (ull c = first; c < chunks; c += 8ull * stride) {
        uint4 v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const ull cu = c + (ull)u * stride;
            if (cu < chunks) {
                v[u] = __ldcg((const uint4*)(body + cu * 16ull));
            }
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const ull cu = c + (ull)u * stride;
            if (cu < chunks) {
                part += ring_chunk_terms(v[u], cu, n);
            }
        }
    }
    return part;
}

// A checking consumer's running totals. Each thread adds its own records; `next_seq` and
// `parity` are the same in every thread.
typedef struct {
    ull records;
    ull sum;
    ull errors;
    ull next_seq;
    unsigned int parity; // which big_count this window uses
} RingCheck;

// Shared memory of a checking consumer.
typedef struct {
    vkgdr::WindowShared<RING_THREADS, RING_CPT> reader;
    unsigned short big[RING_BIG_MAX]; // header chunks of the window's records with long bodies
    unsigned short first[RING_THREADS / 32][RING_BIG_MAX + 1]; // per warp: big[e]'s first chunk
                                                               // in the flattened body chunks
    ull big_sum[RING_BIG_MAX];  // big[e]'s checksum, summed by atomics (zero between windows)
    unsigned int big_count[2]; // alternate windows: one is counted while the other is reset
    ull scratch[RING_THREADS / 32];
} RingCheckShared;

// Whether a test payload's prefix (seq copy, stored checksum) disagrees with the record.
__device__ __forceinline__ bool ring_prefix_bad(uint4 prefix, ull seq, ull sum)
{
    const ull seq_copy = (ull)prefix.x | ((ull)prefix.y << 32);
    const ull stored = (ull)prefix.z | ((ull)prefix.w << 32);
    return seq_copy != seq || stored != sum;
}

// Adds each lane's `part` to big_sum[key] (key RING_BIG_NONE: nothing). Keys do not decrease
// from lane to lane, so equal keys are neighbours: a segmented sum over the warp, then one
// shared atomic per distinct key. Every lane of the warp calls it.
__device__ __forceinline__ void ring_flush_big(unsigned int key, ull part, ull* big_sum)
{
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned int prev = __shfl_up_sync(0xFFFFFFFFu, key, 1);
    const bool head = lane == 0u || prev != key;
    const unsigned int heads = __ballot_sync(0xFFFFFFFFu, head);
    const unsigned int above = heads & (0xFFFFFFFEu << lane);
    const unsigned int end = above != 0u ? (unsigned int)__ffs(above) - 1u : 32u; // next segment
#pragma unroll
    for (unsigned int d = 1; d < 32u; d <<= 1) {
        const ull y = __shfl_down_sync(0xFFFFFFFFu, part, d);
        if (lane + d < end) {
            part += y;
        }
    }
    if (head && key != RING_BIG_NONE) {
        atomicAdd(&big_sum[key], part);
    }
}

// Checks the `n` records of the reader's current group. Every thread calls it.
// - Headers (seq, kind, length): one thread per record. A short body (up to RING_THREAD_BODY_MAX
//   bytes) is checksummed by the same thread, from shared memory.
// - Longer bodies (the group's "big" records, in big[]): their 16-byte body chunks are numbered
//   one after the other (first[e]: big[e]'s first, a prefix sum each warp computes for itself)
//   and split over the block: warp w takes a span of 32 * steps consecutive chunks, lane l the
//   chunks w * span + l + 32 * j. A lane finds its record by binary search, then walks forward;
//   the lanes keep per-record partial sums in registers and flush them (a segmented warp sum,
//   a shared atomic per record) when a lane's record changes. Then one thread per big record
//   compares its total with the stored checksum.
// - A record longer than the window: the whole block, from global memory.
// The totals are sums, so the order does not matter; seqs are compared with the previous record
// of the group (or the last group's).
__device__ __forceinline__ void ring_check_window(RingReader& rd, unsigned int n,
                                                  RingCheck* c, RingCheckShared* sh)
{
    const unsigned int tid = threadIdx.x;
    const unsigned int lane = tid & 31u;
    const bool large = rd.large();
    unsigned int* big_count = &sh->big_count[c->parity];
    for (unsigned int k = tid; k < n; k += RING_THREADS) {
        const vkgdr::Record r = rd.record(k);
        const ull expected = k == 0u ? c->next_seq : rd.record(k - 1u).seq + 1ull;
        if (r.seq != expected) {
            c->errors += 1ull;
        }
        if (r.kind != VKGDR_RING_KIND_DATA) {
            continue;
        }
        c->records += 1ull;
        if ((ull)r.len < RING_TEST_PREFIX_LEN) {
            c->errors += 1ull;
        } else if (large) {
            // Below, by the whole block.
        } else if ((ull)r.len - RING_TEST_PREFIX_LEN > RING_THREAD_BODY_MAX) {
            sh->big[atomicAdd(big_count, 1u)] =
                (unsigned short)((r.pos - rd.record(0u).pos) / 16ull); // chunk from record 0
        } else {
            const uint4* p = rd.shared_payload(k);
            const ull body = (ull)r.len - RING_TEST_PREFIX_LEN;
            const unsigned int chunks = (unsigned int)((body + 15ull) / 16ull);
            ull sum = 0ull;
            for (unsigned int q = 0; q < chunks; ++q) {
                sum += ring_chunk_terms(p[1u + q], q, body);
            }
            c->sum += sum;
            if (ring_prefix_bad(p[0], r.seq, sum)) {
                c->errors += 1ull;
            }
        }
    }
    if (tid == 0u) {
        sh->big_count[c->parity ^ 1u] = 0u; // last read a window ago, next counted in the next
    }
    vkgdr::block_sync();
    // The headers are read: the next window's loads go out now (the reader defers them), so they
    // overlap the work below without delaying the shared-memory reads above.
    rd.read_ahead();
    const unsigned int big = *big_count;
    if (big != 0u) {
        const uint4* window = rd.shared_payload(0u) - 1u; // the group's window: record 0 at 0
        const unsigned int warp = tid >> 5;
        unsigned short* first = sh->first[warp];
        // This warp's copy of the prefix sum of the big records' body chunk counts.
        unsigned int total = 0u;
        for (unsigned int e0 = 0; e0 < big; e0 += 32u) {
            const unsigned int e = e0 + lane;
            unsigned int cnt = 0u;
            if (e < big) {
                const unsigned int len = window[sh->big[e]].x;
                cnt = (len - (unsigned int)RING_TEST_PREFIX_LEN + 15u) / 16u;
            }
            const unsigned int incl = vkgdr::warp_inclusive_sum(cnt);
            if (e < big) {
                first[e + 1u] = (unsigned short)(total + incl);
            }
            total += __shfl_sync(0xFFFFFFFFu, incl, 31);
        }
        if (lane == 0u) {
            first[0] = 0u;
        }
        __syncwarp();
        const unsigned int steps = (total + RING_THREADS - 1u) / RING_THREADS;
        unsigned int g = warp * steps * 32u + lane; // this lane's next flattened chunk
        unsigned int e = 0u;                        // its record: first[e] <= g < first[e + 1]
        if (g < total) {
            unsigned int hi = big;
            while (hi - e > 1u) {
                const unsigned int mid = (e + hi) / 2u;
                if (first[mid] <= g) {
                    e = mid;
                } else {
                    hi = mid;
                }
            }
        }
        // First every step's chunk is found and loaded, then summed: the shared-memory lookups
        // of all steps overlap (steps <= RING_CPT: the big records' bodies fit the window).
        unsigned int cur = RING_BIG_NONE; // the record of `hdr` and `body`
        unsigned int hdr = 0u, body = 0u;
        uint4 chunk[RING_CPT];
        unsigned int chunk_cu[RING_CPT], chunk_body[RING_CPT], chunk_key[RING_CPT];
#pragma unroll
        for (unsigned int j = 0; j < RING_CPT; ++j, g += 32u) {
            chunk_key[j] = RING_BIG_NONE;
            if (j < steps && g < total) {
                while (first[e + 1u] <= g) {
                    ++e;
                }
                if (e != cur) {
                    cur = e;
                    hdr = sh->big[e];
                    body = window[hdr].x - (unsigned int)RING_TEST_PREFIX_LEN;
                }
                chunk_cu[j] = g - first[e];
                chunk_body[j] = body;
                chunk_key[j] = e;
                chunk[j] = window[hdr + 2u + chunk_cu[j]];
            }
        }
        unsigned int key = RING_BIG_NONE; // the record `part` belongs to
        ull part = 0ull;
#pragma unroll
        for (unsigned int j = 0; j < RING_CPT; ++j) {
            if (j < steps) {
                const unsigned int now = chunk_key[j];
                const ull t = now != RING_BIG_NONE
                                  ? ring_chunk_terms(chunk[j], chunk_cu[j], chunk_body[j])
                                  : 0ull;
                if (j == 0u || __all_sync(0xFFFFFFFFu, now == key)) {
                    part += t;
                } else {
                    ring_flush_big(key, part, sh->big_sum);
                    part = t;
                }
                key = now;
            }
        }
        ring_flush_big(key, part, sh->big_sum);
        vkgdr::block_sync();
        for (unsigned int i = tid; i < big; i += RING_THREADS) {
            const unsigned int h = sh->big[i];
            const uint4 hv = window[h];
            const ull seq = (ull)hv.z | ((ull)hv.w << 32);
            const ull sum = sh->big_sum[i];
            sh->big_sum[i] = 0ull; // for the next window (read after its barriers)
            c->sum += sum;
            if (ring_prefix_bad(window[h + 1u], seq, sum)) {
                c->errors += 1ull;
            }
        }
    }
    if (large && n == 1u) {
        const vkgdr::Record r = rd.record(0u);
        if (r.kind == VKGDR_RING_KIND_DATA && (ull)r.len >= RING_TEST_PREFIX_LEN) {
            const ull body = (ull)r.len - RING_TEST_PREFIX_LEN;
            const ull sum = vkgdr::block_sum<RING_THREADS>(
                ring_body_part(r.payload + RING_TEST_PREFIX_LEN, body, tid, RING_THREADS),
                sh->scratch);
            if (tid == 0u) {
                c->sum += sum;
                if (ring_prefix_bad(__ldcg((const uint4*)r.payload), r.seq, sum)) {
                    c->errors += 1ull;
                }
            }
        }
    }
    c->parity ^= 1u;
    if (n > 0u) {
        c->next_seq = rd.record(n - 1u).seq + 1ull;
    }
}

// Zeroes both big-record counters and the big-record sums; a barrier follows before the first
// window (the persistent reader's constructor has one; batch mode adds its own).
__device__ __forceinline__ void ring_check_init(RingCheckShared* sh)
{
    if (threadIdx.x == 0u) {
        sh->big_count[0] = 0u;
        sh->big_count[1] = 0u;
    }
    for (unsigned int i = threadIdx.x; i < RING_BIG_MAX; i += RING_THREADS) {
        sh->big_sum[i] = 0ull;
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
    ring_check_init(sh);
    RingReader rd(lane, sh->reader);
    rd.defer_read_ahead(); // ring_check_window reads ahead after its header pass
    // ring_check_window reads a group's records from shared memory (global memory only for a
    // large() group, whose head release() publishes): a lone record's head may go from next().
    rd.release_early();
    RingCheck c = { 0ull, 0ull, 0ull, lane.result[RING_RESULT_NEXT_SEQ], 0u };
    while (rd.wait()) {
        const unsigned int n = rd.next();
        if (!rd.large()) {
            // The group's bytes are in shared memory (ring_check_window reads global memory only
            // for a large() group): its space goes back now, and the head's way to the CPU
            // overlaps the checks.
            rd.release();
        }
        ring_check_window(rd, n, &c, sh);
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

// Persistent checking consumer of every lane: launch view.lanes blocks of 512 threads.
extern "C" __global__ void __launch_bounds__(RING_THREADS)
ring_check_lanes(vkgdr_ring_view view)
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
extern "C" __global__ void __launch_bounds__(RING_THREADS)
ring_consume_persistent(const unsigned char* data, ull capacity, volatile ull* tail,
                        volatile unsigned int* stop, volatile ull* head_out, ull* result)
{
    ring_consume_persistent_impl(data, capacity, 0, tail, stop, head_out, result);
}

// ring_consume_persistent for a mirrored ring: records may cross the end of the region.
extern "C" __global__ void __launch_bounds__(RING_THREADS)
ring_consume_persistent_mirrored(const unsigned char* data, ull capacity, volatile ull* tail,
                                 volatile unsigned int* stop, volatile ull* head_out, ull* result)
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
    ring_check_init(&sh);
    vkgdr::block_sync();
    // The reader's default read-ahead (in next(); ring_check_window's read_ahead() is then a
    // no-op): the batch kernels keep that path under test, the persistent ones the deferred one.
    RingReader rd(data, capacity, mirrored, from, to, sh.reader);
    RingCheck c = { 0ull, 0ull, 0ull,
                    expected_seq_start == RING_SEQ_FROM_RESULT ? result[RING_RESULT_NEXT_SEQ]
                                                               : expected_seq_start,
                    0u };
    if (rd.error() != VKGDR_RING_OK) {
        c.errors += threadIdx.x == 0 ? 1ull : 0ull;
    }
    while (rd.position() != rd.tail()) {
        const unsigned int n = rd.next();
        ring_check_window(rd, n, &c, &sh);
        if (rd.error() == VKGDR_RING_BROKEN) {
            c.errors += threadIdx.x == 0 ? 1ull : 0ull;
            break; // the position stays at the bad record
        }
        rd.release();
    }
    ring_store_result(result, &c, rd.position(), &sh);
}

extern "C" __global__ void __launch_bounds__(RING_THREADS)
ring_consume_batch(const unsigned char* data, ull capacity, ull from, ull to, ull* result,
                   ull expected_seq_start)
{
    ring_consume_batch_impl(data, capacity, 0, from, to, result, expected_seq_start);
}

// ring_consume_batch for a mirrored ring: records may cross the end of the region.
extern "C" __global__ void __launch_bounds__(RING_THREADS)
ring_consume_batch_mirrored(const unsigned char* data, ull capacity, ull from, ull to, ull* result,
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
        // Both loads in flight at once: a poll costs one memory round trip, not two.
        ull t = *tail;
        const unsigned int stopped = *stop;
        if (t != last) {
            last = t;
            *head_out = t;
            continue;
        }
        if (stopped) {
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

// Benchmark consumer of every lane like ring_ack_lanes, but each published range's first record
// header (16 bytes at the old head) is read before the head moves past it, and the head store
// waits for that load: what any consumer that looks at a record pays at the least, the floor
// under a reader's lone round trip. Launch view.lanes blocks of 32 threads (thread 0 works).
extern "C" __global__ void ring_ack_load_lanes(vkgdr_ring_view view)
{
    if (blockIdx.x >= view.lanes || threadIdx.x != 0) {
        return;
    }
    const vkgdr::RingLane lane = vkgdr::ring_lane(view, blockIdx.x);
    ull last = *lane.head;
    for (;;) {
        const unsigned int stopped = *lane.stop;
        ull t = vkgdr::load_acquire_sys(lane.tail);
        if (t != last) {
            const uint4 h = __ldcg((const uint4*)(lane.data + (last & (lane.capacity - 1ull))));
            last = t;
            // No record's kind is 0xFFFFFFFF (DATA or PAD), so the head is t; the comparison
            // makes the store wait for the load.
            vkgdr::store_relaxed_sys(lane.head, h.y == 0xFFFFFFFFu ? t + 16ull : t);
            continue;
        }
        if (stopped) {
            __threadfence_system();
            t = *lane.tail;
            if (t == last) {
                return;
            }
            last = t;
            *lane.head = t;
        }
    }
}
