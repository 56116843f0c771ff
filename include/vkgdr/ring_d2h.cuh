// vkgdr device -> host rings: the device side. Include this in a kernel that publishes records
// to CPU threads (GPU producers, CPU consumers), or that gives pool blocks back with
// vkgdr_release_token.
//
//   #include "vkgdr/ring_d2h.cuh"
//
//   extern "C" __global__ void my_producer(vkgdr_d2h_view view, const float* results, int n)
//   {
//       const int i = blockIdx.x * blockDim.x + threadIdx.x;   // blockDim.x: a multiple of 32
//       const unsigned int callers = __ballot_sync(0xFFFFFFFFu, i < n);
//       if (i >= n) return;
//       __syncwarp(callers);                   // the callers converged (see "Warp calls" below)
//       const vkgdr::D2hLane lane = vkgdr::d2h_lane(view, blockIdx.x % view.lanes);
//       // Every active thread publishes its own record; one reservation per warp.
//       const int status = vkgdr::d2h_publish_each(lane, 1u, &results[i], sizeof(float));
//       if (status != VKGDR_D2H_OK) { /* the consumer closed the lane or stalled */ }
//   }
//
// Everything here mirrors src/core/ring/d2h/ (layout.rs, producer.rs: the same protocol in Rust,
// model-checked with loom); keep them in sync. The namespace is ring.cuh's (vkgdr_device, short
// name vkgdr:: unless vkgdr.h came first or VKGDR_RING_NO_SHORT_NAME is defined).
//
// Wire format. A lane is `slots` slots (a power of two) of `stride` bytes (a power of two, 32 to
// 65536) in host memory mapped into the device's address space. Record `seq` (the lane's
// reservation count) goes to slot seq % slots. A ring's slots have one of two formats
// (view.format). VKGDR_D2H_FORMAT_COMMITTED, the default:
//   word 0  commit   seq + 1 once the record is complete (0: never written), stored last
//   word 1  meta     payload length (low 32 bits) | kind (high 32 bits)
//   16..    payload  up to stride - 16 bytes
// VKGDR_D2H_FORMAT_TAGGED (NCCL's low-latency protocol, device to host): every 8-byte word is
// four data bytes (low half) | the record's tag (u32)(seq + 1) (high half), stored with one
// 8-byte store each (PCIe delivers it whole), so every word proves its own arrival and no fence
// or commit is needed; half the payload per slot:
//   word 0  payload length | tag
//   word 1  kind | tag
//   word 2+ payload bytes 4 (i - 2) .. 4 (i - 1) - 1, little-endian, zero-padded | tag;
//           up to stride / 2 - 8 bytes
// Per lane, in a control block the CPU writes (VKGDR_D2H_CONTROL_STRIDE apart; in GPU memory
// the CPU stores to through the BAR, or in host memory): `head` (u64, records the CPU has taken)
// and `closed` (u64, non-zero once the consumer is gone); in device memory
// (VKGDR_D2H_DEVICE_STRIDE apart, zeroed at creation): `reserve` (records reserved), `head_cache`
// (the highest head a producer read) and `gave_up` (publications refused).
//
// Protocol. Reserve n slots with one compare-and-swap of `reserve`, taken only when
// reserve + n <= head_cache + slots (a failed one is retried with the value it returned); when
// the lane looks full, read `closed` (set: give up, VKGDR_D2H_CLOSED) and the consumer's `head`
// (moved: raise head_cache, retry), and after view.spin_limit looks at a head that did not move
// give up (VKGDR_D2H_STALLED). A refusal reserves nothing, so no slot is owed and the consumer
// never waits for a producer that gave up.
// Then write meta and payload, a release fence at system scope (fence.acq_rel.sys, or the
// commit's st.release.sys) in every writing thread, and store the commit word (one aligned
// 8-byte store). A writer may store the commit word's present value (the previous lap's commit,
// or 0) with the rest of the slot before that: the consumer sees no change. Between reserving
// and committing nothing waits. In a tagged lane, store every word of the record (tagged) and
// nothing more: the fence before a commit waits for the payload's stores to be acknowledged
// from host memory, a PCIe round trip on a lone record's way.
// Records of one lane reach the CPU in reservation order; lanes are independent.
//
// Warp calls (d2h_publish_each, d2h_publish_warp, release_token) use __activemask() or expect
// the whole warp, and reserve up to 32 slots at once: give the lane at least 32 slots. Call them
// with the calling threads converged (after a __syncwarp(mask) of exactly those threads, as
// kernels/release.cu does): a test kernel whose threads each left a polling loop at their own
// time and called release_token while so diverged faulted with CUDA_ERROR_ILLEGAL_ADDRESS on an
// H200 after 1,000 to 7,000 releases (not under compute-sanitizer); the converged form ran
// 32,768 releases clean. Until that is understood, treat converged calls as the rule.
//
// Checked with nvcc 13.0 (-arch=compute_75: __nanosleep needs sm_70).

#ifndef VKGDR_RING_D2H_CUH
#define VKGDR_RING_D2H_CUH

#include "ordering.cuh"

#define VKGDR_D2H_SLOT_HEADER_LEN 16u
#define VKGDR_D2H_CONTROL_STRIDE 128ull // bytes between two lanes' host control blocks
#define VKGDR_D2H_CONTROL_HEAD 0ull     // byte offset of `head` in a control block
#define VKGDR_D2H_CONTROL_CLOSED 8ull   // byte offset of `closed`
#define VKGDR_D2H_DEVICE_STRIDE 128ull  // bytes between two lanes' device states
#define VKGDR_D2H_KIND_RESERVED 0x80000000u // kinds from here up are the library's
#define VKGDR_D2H_KIND_RELEASE 0x80000001u  // payload: u64 release tokens
#define VKGDR_D2H_FORMAT_COMMITTED 0 // view.format: a commit word after a fence (the default)
#define VKGDR_D2H_FORMAT_TAGGED 1    // view.format: every word tagged with its record (vkgdr.h has both)

// Publication status.
#define VKGDR_D2H_OK 0
#define VKGDR_D2H_CLOSED 1    // the consumer closed the lane
#define VKGDR_D2H_STALLED 2   // the lane stayed full and its head did not move for spin_limit looks
#define VKGDR_D2H_TOO_LARGE 3 // payload beyond the slot, or more records than the lane's slots

// What a producer needs, as the host's D2hDeviceView (48 bytes), passed by value.
typedef struct vkgdr_d2h_view {
    unsigned long long slots;   // lane 0's slot region; lane i: + i * slots_per_lane * stride
    unsigned long long control; // lane 0's control block; lane i: + i * VKGDR_D2H_CONTROL_STRIDE
    unsigned long long device;  // lane 0's device state; lane i: + i * VKGDR_D2H_DEVICE_STRIDE
    unsigned int slots_per_lane;
    unsigned int stride;
    unsigned int lanes;
    unsigned int spin_limit;
    unsigned int format;   // VKGDR_D2H_FORMAT_COMMITTED or VKGDR_D2H_FORMAT_TAGGED
    unsigned int reserved; // zero
} vkgdr_d2h_view;

static_assert(sizeof(vkgdr_d2h_view) == 48, "vkgdr_d2h_view must match D2hDeviceView");

namespace vkgdr_device {

typedef unsigned long long u64;

// Memory ordering: ordering.cuh (acquire loads, release stores and fences; needs sm_70).

// A lane's words in device memory.
struct D2hLaneState {
    u64 reserve;
    u64 head_cache;
    u64 gave_up;
};

// One lane, as a producer needs it.
struct D2hLane {
    unsigned char* slots;
    volatile u64* head;
    volatile u64* closed;
    D2hLaneState* state;
    u64 count; // slots
    unsigned int stride;
    unsigned int spin_limit;
    bool tagged; // VKGDR_D2H_FORMAT_TAGGED
};

// Lane `lane` of a ring (lane < view.lanes).
__device__ __forceinline__ D2hLane d2h_lane(const vkgdr_d2h_view& v, unsigned int lane)
{
    D2hLane l;
    l.count = v.slots_per_lane;
    l.stride = v.stride;
    l.spin_limit = v.spin_limit;
    l.tagged = v.format == VKGDR_D2H_FORMAT_TAGGED;
    l.slots = (unsigned char*)(v.slots + (u64)lane * l.count * v.stride);
    const u64 control = v.control + (u64)lane * VKGDR_D2H_CONTROL_STRIDE;
    l.head = (volatile u64*)(control + VKGDR_D2H_CONTROL_HEAD);
    l.closed = (volatile u64*)(control + VKGDR_D2H_CONTROL_CLOSED);
    l.state = (D2hLaneState*)(v.device + (u64)lane * VKGDR_D2H_DEVICE_STRIDE);
    return l;
}

// The largest payload of a lane's records.
__device__ __forceinline__ unsigned int d2h_max_payload(const D2hLane& l)
{
    return l.tagged ? (l.stride - VKGDR_D2H_SLOT_HEADER_LEN) / 2u
                    : l.stride - VKGDR_D2H_SLOT_HEADER_LEN;
}

// The slot of record `seq`.
__device__ __forceinline__ unsigned char* d2h_slot(const D2hLane& l, u64 seq)
{
    return l.slots + (seq & (l.count - 1ull)) * l.stride;
}

// Word `data` of record `seq` in a tagged slot: the data in the low half, the tag in the high.
__device__ __forceinline__ u64 d2h_tagged_word(u64 seq, unsigned int data)
{
    return (u64)data | ((u64)(unsigned int)(seq + 1ull) << 32);
}

// Stores two tagged words at a 16-byte aligned `at` with one instruction whose two 8-byte
// elements are each a single relaxed system-scope store (st.volatile): each reaches host memory
// whole, in no particular order, which is all a tagged slot needs.
__device__ __forceinline__ void d2h_store_tagged_pair(unsigned char* at, u64 a, u64 b)
{
    asm volatile("st.volatile.v2.u64 [%0], {%1, %2};" ::"l"(at), "l"(a), "l"(b) : "memory");
}

// Stores a tagged slot's header (words 0 and 1: the length and the kind) with one instruction.
__device__ __forceinline__ void d2h_store_tagged_header(unsigned char* slot, u64 seq,
                                                        unsigned int len, unsigned int kind)
{
    d2h_store_tagged_pair(slot, d2h_tagged_word(seq, len), d2h_tagged_word(seq, kind));
}

// Bytes 4 i .. 4 i + 3 of a payload of `len` bytes as a little-endian word, zero past `len`
// (only bytes below `len` are read; a 4-byte aligned payload a word at a time).
__device__ __forceinline__ unsigned int d2h_payload_u32(const void* payload, unsigned int len,
                                                        unsigned int i)
{
    const unsigned int from = 4u * i;
    if (from >= len) {
        return 0u;
    }
    const unsigned char* src = (const unsigned char*)payload;
    const unsigned int k = len - from < 4u ? len - from : 4u;
    if (k == 4u && ((unsigned long long)payload & 3ull) == 0ull) {
        return *(const unsigned int*)(src + from);
    }
    unsigned int w = 0u;
    for (unsigned int b = 0; b < k; ++b) {
        w |= (unsigned int)src[from + b] << (8u * b);
    }
    return w;
}

// Word `i` of record `seq` in a tagged slot: the length, the kind, then the payload.
__device__ __forceinline__ u64 d2h_tagged_slot_word(u64 seq, unsigned int kind,
                                                    const void* payload, unsigned int len,
                                                    unsigned int i)
{
    const unsigned int data =
        i == 0u ? len : (i == 1u ? kind : d2h_payload_u32(payload, len, i - 2u));
    return d2h_tagged_word(seq, data);
}

// Writes record `seq` whole into its tagged slot from one thread, two words per store: it is
// published once the last of them lands.
__device__ __forceinline__ void d2h_write_tagged(const D2hLane& l, u64 seq, unsigned int kind,
                                                 const void* payload, unsigned int len)
{
    unsigned char* slot = d2h_slot(l, seq);
    const unsigned int words = 2u + (len + 3u) / 4u;
    for (unsigned int i = 0; i < words; i += 2u) {
        d2h_store_tagged_pair(slot + 8u * i, d2h_tagged_slot_word(seq, kind, payload, len, i),
                              d2h_tagged_slot_word(seq, kind, payload, len, i + 1u));
    }
}

// Reserves `n` consecutive records (1 <= n <= slots) for the calling thread: VKGDR_D2H_OK with
// the first one's seq in `first`, or a refusal with nothing reserved (counted in gave_up).
__device__ __forceinline__ int d2h_reserve(const D2hLane& l, unsigned int n, u64& first)
{
    if (n == 0u || n > l.count) {
        return VKGDR_D2H_TOO_LARGE;
    }
    unsigned int spins = 0u;
    unsigned int nap = 32u;
    for (;;) {
        // Both loads in flight at once. Acquire on the cached head: the slot writes after the
        // reservation come after its load (and so after the consumer's reads of those slots),
        // with no fence: a fence.sc.gpu here waited for the thread's last commit store to
        // reach host memory.
        u64 r = *(volatile u64*)&l.state->reserve;
        const u64 head = load_acquire_gpu(&l.state->head_cache);
        // While there is room, compare-and-swap; a failed one returns the value to try next
        // (under contention one round trip per try, where loading `reserve` again made two).
        bool tried = false;
        while (r + n <= head + l.count) {
            const u64 seen = atomicCAS(&l.state->reserve, r, r + n);
            if (seen == r) {
                first = r;
                return VKGDR_D2H_OK;
            }
            r = seen;
            tried = true;
        }
        if (tried) {
            continue; // full by the cached head after others reserved: read the cache again
        }
        // Both loads in flight at once (over PCIe, where the control block is in host memory).
        const u64 closed = *l.closed;
        const u64 host = *l.head;
        __threadfence_system();
        if (closed != 0ull) {
            atomicAdd(&l.state->gave_up, 1ull);
            return VKGDR_D2H_CLOSED;
        }
        if (host > head) {
            atomicMax(&l.state->head_cache, host);
            spins = 0u;
            nap = 32u;
            continue;
        }
        if (++spins > l.spin_limit) {
            atomicAdd(&l.state->gave_up, 1ull);
            return VKGDR_D2H_STALLED;
        }
        __nanosleep(nap);
        nap = nap < 4096u ? nap * 2u : nap;
    }
}

// Copies `len` bytes into a slot's payload with 8-byte stores (any source alignment; an 8-byte
// aligned source is read a word at a time, which keeps a payload that lives in registers there).
__device__ __forceinline__ void d2h_copy(unsigned char* slot, const void* payload, unsigned int len)
{
    const unsigned char* src = (const unsigned char*)payload;
    u64* dst = (u64*)(slot + VKGDR_D2H_SLOT_HEADER_LEN);
    if (((unsigned long long)payload & 7ull) == 0ull) {
        const unsigned int whole = len / 8u;
        for (unsigned int i = 0; i < whole; ++i) {
            dst[i] = ((const u64*)payload)[i];
        }
        if (len % 8u != 0u) {
            u64 w = 0ull;
            for (unsigned int b = 0; b < len % 8u; ++b) {
                w |= (u64)src[whole * 8u + b] << (8u * b);
            }
            dst[whole] = w;
        }
        return;
    }
    for (unsigned int i = 0; i < len; i += 8u) {
        u64 w = 0ull;
        const unsigned int k = len - i < 8u ? len - i : 8u;
        for (unsigned int b = 0; b < k; ++b) {
            w |= (u64)src[i + b] << (8u * b);
        }
        dst[i / 8u] = w;
    }
}

// The meta word of a slot.
__device__ __forceinline__ void d2h_write_meta(unsigned char* slot, unsigned int len,
                                               unsigned int kind)
{
    ((volatile u64*)slot)[1] = (u64)len | ((u64)kind << 32);
}

// Commits record `seq` (after this thread's writes are fenced, or after the warp's barrier that
// follows its writers' fences).
__device__ __forceinline__ void d2h_commit(const D2hLane& l, u64 seq)
{
    ((volatile u64*)d2h_slot(l, seq))[0] = seq + 1ull;
}

// Commits record `seq` with a release store: this thread's writes of the slot come first.
__device__ __forceinline__ void d2h_commit_release(const D2hLane& l, u64 seq)
{
    store_release_sys((volatile u64*)d2h_slot(l, seq), seq + 1ull);
}

// The commit word a slot holds while record `seq` is not yet committed: the previous lap's
// commit (0 on the first lap). The consumer takes either this value or seq + 1 as "not yet" and
// "ready"; storing it again changes nothing it can see.
__device__ __forceinline__ u64 d2h_commit_before(const D2hLane& l, u64 seq)
{
    return seq < l.count ? 0ull : seq + 1ull - l.count;
}

// 16-byte piece q of record `seq`'s slot as the calling thread would write it: q = 0 the commit
// word's present value (d2h_commit_before) and the meta word; q >= 1 payload bytes
// 16 (q - 1) .. 16 q - 1, zero past `len` (only bytes below `len` are read; an 8-byte aligned
// payload a word at a time).
__device__ __forceinline__ uint4 d2h_slot_piece(const D2hLane& l, u64 seq, unsigned int kind,
                                                const void* payload, unsigned int len,
                                                unsigned int q)
{
    u64 w[2];
    if (q == 0u) {
        w[0] = d2h_commit_before(l, seq);
        w[1] = (u64)len | ((u64)kind << 32);
    } else {
        const unsigned char* src = (const unsigned char*)payload;
        const bool aligned = ((unsigned long long)payload & 7ull) == 0ull;
#pragma unroll
        for (unsigned int h = 0; h < 2u; ++h) {
            const unsigned int from = 16u * (q - 1u) + 8u * h;
            w[h] = 0ull;
            if (from < len) {
                const unsigned int k = len - from < 8u ? len - from : 8u;
                if (k == 8u && aligned) {
                    w[h] = *(const u64*)(src + from);
                } else {
                    for (unsigned int b = 0; b < k; ++b) {
                        w[h] |= (u64)src[from + b] << (8u * b);
                    }
                }
            }
        }
    }
    return make_uint4((unsigned int)w[0], (unsigned int)(w[0] >> 32), (unsigned int)w[1],
                      (unsigned int)(w[1] >> 32));
}

// One thread publishes one record of `len` bytes. Returns the status; `seq_out` (optional) gets
// the record's sequence number.
__device__ __forceinline__ int d2h_publish(const D2hLane& l, unsigned int kind, const void* payload,
                                           unsigned int len, u64* seq_out = nullptr)
{
    if (len > d2h_max_payload(l)) {
        return VKGDR_D2H_TOO_LARGE;
    }
    u64 seq;
    const int status = d2h_reserve(l, 1u, seq);
    if (status != VKGDR_D2H_OK) {
        return status;
    }
    if (l.tagged) {
        d2h_write_tagged(l, seq, kind, payload, len);
    } else {
        unsigned char* slot = d2h_slot(l, seq);
        d2h_write_meta(slot, len, kind);
        d2h_copy(slot, payload, len);
        d2h_commit_release(l, seq); // the writes above first, with no fence.sc.sys
    }
    if (seq_out) {
        *seq_out = seq;
    }
    return VKGDR_D2H_OK;
}

// The most 16-byte pieces per slot (header included) that d2h_publish_each writes with the
// warp's coalesced stores (slots up to 128 bytes); longer slots are written by their own thread.
#define VKGDR_D2H_COALESCED_PIECES 8u

// Every active thread of the warp publishes its own record, with one reservation for the warp
// (records in lane order). Returns the warp's status in every thread.
//
// Slots of up to 128 bytes are written by the warp together: the warp's records lie in
// consecutive slots, and the thread of rank i (its place among the active threads) writes
// 16-byte pieces i, i + count, i + 2 count, ... of their run (header piece included), taken
// from their owners by shuffles. One store instruction of a full warp covers 512 consecutive
// bytes, whole lines, where each thread writing its own slot stored 8 bytes 64 apart (a PCIe
// write each). The header piece carries the commit word's present value
// (d2h_commit_before), so the slot is written whole; the commit itself comes after the warp's
// release fence and barrier, as d2h_publish_warp's.
__device__ __forceinline__ int d2h_publish_each(const D2hLane& l, unsigned int kind,
                                                const void* payload, unsigned int len)
{
    const unsigned int active = __activemask();
    const unsigned int me = threadIdx.x & 31u;
    const unsigned int leader = __ffs(active) - 1u;
    const unsigned int rank = __popc(active & ((1u << me) - 1u));
    const unsigned int too_large = __any_sync(active, len > d2h_max_payload(l));
    int status = too_large ? VKGDR_D2H_TOO_LARGE : VKGDR_D2H_OK;
    u64 first = 0ull;
    if (me == leader && status == VKGDR_D2H_OK) {
        status = d2h_reserve(l, __popc(active), first);
    }
    status = __shfl_sync(active, status, leader);
    first = __shfl_sync(active, first, leader);
    if (status != VKGDR_D2H_OK) {
        return status;
    }
    // The leader's acquire (in d2h_reserve) before every thread's slot stores: a barrier orders
    // memory, a shuffle does not.
    __syncwarp(active);
    const u64 seq = first + rank;
    const unsigned int pieces = l.stride / 16u; // the same in every thread
    if (pieces > VKGDR_D2H_COALESCED_PIECES && l.tagged) {
        d2h_write_tagged(l, seq, kind, payload, len);
        return VKGDR_D2H_OK;
    }
    if (pieces > VKGDR_D2H_COALESCED_PIECES) {
        unsigned char* slot = d2h_slot(l, seq);
        d2h_write_meta(slot, len, kind);
        d2h_copy(slot, payload, len);
        d2h_commit_release(l, seq);
        return VKGDR_D2H_OK;
    }
    const unsigned int count = __popc(active);
    uint4 own[VKGDR_D2H_COALESCED_PIECES]; // this thread's slot, piece by piece
#pragma unroll
    for (unsigned int q = 0; q < VKGDR_D2H_COALESCED_PIECES; ++q) {
        if (q < pieces) {
            if (l.tagged) {
                const u64 a = d2h_tagged_slot_word(seq, kind, payload, len, 2u * q);
                const u64 b = d2h_tagged_slot_word(seq, kind, payload, len, 2u * q + 1u);
                own[q] = make_uint4((unsigned int)a, (unsigned int)(a >> 32), (unsigned int)b,
                                    (unsigned int)(b >> 32));
            } else {
                own[q] = d2h_slot_piece(l, seq, kind, payload, len, q);
            }
        }
    }
    // Round k: this thread writes piece j = k * count + rank of the run (record j / pieces,
    // piece j % pieces); every owner offers each of its pieces in turn.
    for (unsigned int k = 0; k < pieces; ++k) {
        const unsigned int j = k * count + rank;
        const unsigned int r = j / pieces;
        const unsigned int q = j - r * pieces;
        const unsigned int src = active == 0xFFFFFFFFu ? r : __fns(active, 0u, (int)r + 1);
        uint4 mine = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (unsigned int p = 0; p < VKGDR_D2H_COALESCED_PIECES; ++p) {
            if (p < pieces) {
                uint4 got;
                got.x = __shfl_sync(active, own[p].x, src);
                got.y = __shfl_sync(active, own[p].y, src);
                got.z = __shfl_sync(active, own[p].z, src);
                got.w = __shfl_sync(active, own[p].w, src);
                if (p == q) {
                    mine = got;
                }
            }
        }
        unsigned char* at = d2h_slot(l, first + r) + 16u * q;
        if (l.tagged) {
            d2h_store_tagged_pair(at, (u64)mine.x | ((u64)mine.y << 32),
                                  (u64)mine.z | ((u64)mine.w << 32));
        } else {
            *(uint4*)at = mine;
        }
    }
    if (l.tagged) {
        return VKGDR_D2H_OK; // every word tagged: published as it lands
    }
    // Every thread's pieces, then every thread's commit (as d2h_publish_warp's).
    fence_release_sys();
    __syncwarp(active);
    d2h_commit(l, seq);
    return VKGDR_D2H_OK;
}

// The whole warp (all 32 threads, converged) publishes one record of `len` bytes from a
// 16-byte aligned `payload`, each thread storing every 32nd 16-byte piece. Returns the status in
// every thread.
__device__ __forceinline__ int d2h_publish_warp(const D2hLane& l, unsigned int kind,
                                                const void* payload, unsigned int len)
{
    const unsigned int me = threadIdx.x & 31u;
    if (len > d2h_max_payload(l)) {
        return VKGDR_D2H_TOO_LARGE;
    }
    int status = VKGDR_D2H_OK;
    u64 seq = 0ull;
    if (me == 0u) {
        status = d2h_reserve(l, 1u, seq);
    }
    status = __shfl_sync(0xFFFFFFFFu, status, 0);
    seq = __shfl_sync(0xFFFFFFFFu, seq, 0);
    if (status != VKGDR_D2H_OK) {
        return status;
    }
    // Thread 0's acquire (in d2h_reserve) before every thread's slot stores.
    __syncwarp();
    unsigned char* slot = d2h_slot(l, seq);
    if (l.tagged) {
        // Payload bytes 8 j .. 8 j + 7 are words 2 + 2 j and 3 + 2 j: one store each j.
        for (unsigned int j = me; 2u * j < (len + 3u) / 4u; j += 32u) {
            d2h_store_tagged_pair(slot + 16u + 16u * j,
                                  d2h_tagged_slot_word(seq, kind, payload, len, 2u + 2u * j),
                                  d2h_tagged_slot_word(seq, kind, payload, len, 3u + 2u * j));
        }
        if (me == 0u) {
            d2h_store_tagged_header(slot, seq, len, kind);
        }
        return VKGDR_D2H_OK;
    }
    const uint4* src = (const uint4*)payload;
    uint4* dst = (uint4*)(slot + VKGDR_D2H_SLOT_HEADER_LEN);
    const unsigned int whole = len / 16u;
    for (unsigned int i = me; i < whole; i += 32u) {
        dst[i] = src[i];
    }
    if (me == 0u) {
        d2h_write_meta(slot, len, kind);
        // The tail of a payload that is not a multiple of 16.
        if (len % 16u != 0u) {
            d2h_copy(slot + whole * 16u, (const unsigned char*)payload + whole * 16u, len % 16u);
        }
    }
    fence_release_sys(); // each writer's stores, before the barrier
    __syncwarp();
    if (me == 0u) {
        d2h_commit(l, seq);
    }
    return VKGDR_D2H_OK;
}

// Gives back the pool block of `token` (Block::release_on_device's): every active thread of the
// warp releases its own token, the warp's tokens together in as few VKGDR_D2H_KIND_RELEASE
// records as the slots hold. The block is reusable once the host drained the record. Returns
// the status in every thread; on a refusal the block stays lent (retry, or let the host take it
// back), never half-released.
__device__ __forceinline__ int release_token(const D2hLane& l, u64 token)
{
    const unsigned int active = __activemask();
    const unsigned int me = threadIdx.x & 31u;
    const unsigned int leader = __ffs(active) - 1u;
    const unsigned int rank = __popc(active & ((1u << me) - 1u));
    const unsigned int count = __popc(active);
    const unsigned int per = d2h_max_payload(l) / 8u; // tokens per record
    const unsigned int records = (count + per - 1u) / per;
    int status = VKGDR_D2H_OK;
    u64 first = 0ull;
    if (me == leader) {
        status = d2h_reserve(l, records, first);
    }
    status = __shfl_sync(active, status, leader);
    first = __shfl_sync(active, first, leader);
    if (status != VKGDR_D2H_OK) {
        return status;
    }
    // The leader's acquire (in d2h_reserve) before every thread's slot stores.
    __syncwarp(active);
    const u64 seq = first + rank / per;
    const unsigned int index = rank % per;
    const unsigned int left = count - rank; // tokens from this one on
    const unsigned int len = (left < per ? left : per) * 8u;
    unsigned char* slot = d2h_slot(l, seq);
    if (l.tagged) {
        // Token `index` is payload words 2 index and 2 index + 1: slot words 2 + 2 index, ...
        d2h_store_tagged_pair(slot + 16u + 16u * index,
                              d2h_tagged_word(seq, (unsigned int)token),
                              d2h_tagged_word(seq, (unsigned int)(token >> 32)));
        if (index == 0u) {
            d2h_store_tagged_header(slot, seq, len, VKGDR_D2H_KIND_RELEASE);
        }
        return VKGDR_D2H_OK;
    }
    ((volatile u64*)(slot + VKGDR_D2H_SLOT_HEADER_LEN))[index] = token;
    if (index == 0u) {
        d2h_write_meta(slot, len, VKGDR_D2H_KIND_RELEASE);
    }
    fence_release_sys();
    __syncwarp(active);
    if (index == 0u) {
        d2h_commit(l, seq);
    }
    return VKGDR_D2H_OK;
}

} // namespace vkgdr_device

// Gives back the pool block of `token` through the pool's release ring `view` (the lane of the
// calling block): vkgdr_device::release_token, at global scope for C-style kernels.
__device__ __forceinline__ int vkgdr_release_token(const vkgdr_d2h_view& view,
                                                   unsigned long long token)
{
    const unsigned int block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    return vkgdr_device::release_token(vkgdr_device::d2h_lane(view, block % view.lanes), token);
}

// The short name, where it can be had (as in ring.cuh).
#if !defined(VKGDR_H) && !defined(VKGDR_RING_NO_SHORT_NAME)
namespace vkgdr = vkgdr_device;
#endif

#endif // VKGDR_RING_D2H_CUH
