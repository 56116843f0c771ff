// vkgdr ring buffers: the device side. Include this in a kernel that consumes a
// vkgdr::ring::DeviceRing (CPU producers, GPU consumer).
//
//   #include "vkgdr/ring.cuh"
//
//   extern "C" __global__ void my_consumer(vkgdr_ring_view view)   // one block per lane
//   {
//       __shared__ vkgdr::ReaderShared<256> smem;                  // blockDim.x == 256
//       if (blockIdx.x >= view.lanes) return;
//       vkgdr::BlockReader<256> reader(vkgdr::ring_lane(view, blockIdx.x), smem);
//       while (reader.wait()) {                                    // records published, or stop
//           vkgdr::Record rec;
//           const unsigned n = reader.next(rec);                   // up to 256, in order
//           if (threadIdx.x < n && rec.kind == VKGDR_RING_KIND_DATA) {
//               /* thread i processes record i: rec.payload[0 .. rec.len) */
//           }
//           reader.release();                                      // publishes the head when due
//       }
//   }
//
// The device API lives in namespace vkgdr_device; vkgdr:: is its short name. In a file that also
// includes vkgdr.h (the host API), include vkgdr.h first and write vkgdr_device::, since vkgdr.h's
// handle type is vkgdr 0.1's `struct vkgdr` and C++ allows no namespace of the same name beside
// it (define VKGDR_RING_NO_SHORT_NAME to leave the short name out anywhere).
//
// Pass the view by value: on the Rust side `ring.device_view()` is a #[repr(C)] struct of the
// same layout (64 bytes). Launch `view.lanes` blocks of exactly THREADS threads (a multiple of
// 32). Everything here mirrors src/core/ring/layout.rs and src/ring/device/; keep them in sync.
//
// Wire format. A lane's data region is `capacity` bytes (a power of two). Positions are u64 byte
// counters that only grow; position p lives at offset p & (capacity - 1). A record starts at a
// 16-byte aligned position with a header { u32 len; u32 kind; u64 seq } (little-endian) and `len`
// payload bytes, the whole padded to 16. kind DATA carries payload; kind PAD is skipped: a wrap
// PAD (seq = ~0) fills the rest of a padded region so no record straddles its end, any other PAD
// is an abandoned reservation that keeps its seq (seqs of DATA and abandoned PADs together count
// 0, 1, 2, ... per lane). In a mirrored ring (wrap = VKGDR_RING_MIRRORED) records run past the
// end: the region is mapped a second time right after itself, so `data + offset` is readable for
// a whole record.
//
// Head/tail protocol, per lane:
//   tail  u64, GPU memory, written by the CPU: the end of the published records. The CPU writes
//         the records, sfence, then stores the tail (one 8-byte store), sfence.
//   head  u64, pinned host memory, written by the GPU: the end of the consumed records; the CPU
//         reuses space below it. Published after a block barrier, once every value the block
//         read from those records is in its registers or shared memory, with a relaxed store at
//         system scope (st.relaxed.sys): a load whose value is in hand cannot see a later write,
//         so nothing is left for a release to order (NCCL's receivers publish their step the
//         same way), and a release waits for the thread's earlier stores over PCIe.
//   stop  u32, GPU memory, one per ring: the CPU's request to exit once everything published is
//         consumed (it stores its last tail first).
// The reader polls the tail with acquire loads at system scope (ld.acquire.sys), warp 0 at once
// (one load for the warp), so no record load is satisfied before the tail load; the stop word is
// read relaxed beside it, and a fence (__threadfence_system) comes only once stop is seen, before
// the tail is read a last time.
// Records are loaded with ld.global.cg (L2, not L1): a line cached on an earlier lap of the ring
// is never reused.
//
// Block-cooperative, in-order consumption. Two readers, both one block per lane:
// - BlockReader (the example above): `next()` loads the next 16 * THREADS bytes of the lane into
//   shared memory (one coalesced 16-byte load per thread), every thread decodes the chunk it
//   loaded as if it were a header, and one thread follows the chain through those links. Thread i
//   then gets record i; payloads are read from global memory by whoever processes them
//   (`record(k)` gives any record of the group to every thread).
// - WindowReader (the fast one; see its comment for an example): a window of CPT chunks per
//   thread (16 KiB for 512 threads and 2 chunks each), the chain resolved in parallel, every
//   record that lies wholly in the window handed out with its payload in shared memory, a record
//   longer than the window as a group of its own, and the next window loaded while the caller
//   works on this one. The checking consumers of kernels/ring.cu are built on it: a header per
//   thread, and the body chunks of the window's longer records spread over the whole block.
//
// Checked with nvcc 13.0 (-arch=compute_75; the acquire and release forms need sm_70).

#ifndef VKGDR_RING_CUH
#define VKGDR_RING_CUH

#include "ordering.cuh"

#define VKGDR_RING_MIN_CAPACITY 4096ull
#define VKGDR_RING_RECORD_ALIGN 16ull
#define VKGDR_RING_HEADER_LEN 16ull
#define VKGDR_RING_KIND_DATA 1u
#define VKGDR_RING_KIND_PAD 2u
#define VKGDR_RING_WRAP_PAD_SEQ 0xFFFFFFFFFFFFFFFFull
#define VKGDR_RING_TAIL_STRIDE 128ull // bytes between two lanes' tail words
#define VKGDR_RING_HOST_STRIDE 256ull // bytes between two lanes' head (and result) words
#define VKGDR_RING_PADDED 0u
#define VKGDR_RING_MIRRORED 1u

// The readers' error() values.
#define VKGDR_RING_OK 0
#define VKGDR_RING_BROKEN 1   // a record header is invalid (kind, size, crossing the end/tail)
#define VKGDR_RING_BAD_TAIL 2 // the tail went backwards, ran more than a capacity ahead, or is
                              // misaligned

// What a consumer needs, as DeviceRing::device_view() returns it (RingDeviceView).
typedef struct vkgdr_ring_view {
    unsigned long long data;      // lane 0's data region
    unsigned long long capacity;  // bytes per lane (a power of two)
    unsigned long long tail;      // lane 0's tail word; lane i: tail + i * VKGDR_RING_TAIL_STRIDE
    unsigned long long stop;      // the stop word (u32)
    unsigned long long head;      // lane 0's head word; lane i: head + i * VKGDR_RING_HOST_STRIDE
    unsigned long long result;    // lane 0's 8 result words; lane i: + i * VKGDR_RING_HOST_STRIDE
    unsigned long long lane_data; // u64[lanes]: each lane's data region
    unsigned int lanes;
    unsigned int wrap; // VKGDR_RING_PADDED or VKGDR_RING_MIRRORED
} vkgdr_ring_view;

static_assert(sizeof(vkgdr_ring_view) == 64, "vkgdr_ring_view must match RingDeviceView");

namespace vkgdr_device {

typedef unsigned long long u64;

// Memory ordering: ordering.cuh (acquire loads, release stores and fences; needs sm_70).

// One lane, as the reader needs it.
struct RingLane {
    const unsigned char* data;
    u64 capacity;
    int mirrored;
    volatile u64* tail;
    volatile unsigned int* stop;
    volatile u64* head;
    u64* result; // 8 words of pinned host memory for the consumer's own use
};

// Lane `lane` of a ring (lane < view.lanes).
__device__ __forceinline__ RingLane ring_lane(const vkgdr_ring_view& v, unsigned int lane)
{
    RingLane l;
    l.data = (const unsigned char*)((const u64*)v.lane_data)[lane];
    l.capacity = v.capacity;
    l.mirrored = v.wrap == VKGDR_RING_MIRRORED;
    l.tail = (volatile u64*)(v.tail + (u64)lane * VKGDR_RING_TAIL_STRIDE);
    l.stop = (volatile unsigned int*)v.stop;
    l.head = (volatile u64*)(v.head + (u64)lane * VKGDR_RING_HOST_STRIDE);
    l.result = (u64*)(v.result + (u64)lane * VKGDR_RING_HOST_STRIDE);
    return l;
}

// One record of a group. Wrap PADs are never handed out.
struct Record {
    const unsigned char* payload; // device address of the payload (contiguous, 16-byte aligned)
    u64 pos;                      // position of the header
    u64 seq;
    unsigned int len;  // payload bytes
    unsigned int kind; // VKGDR_RING_KIND_DATA, or VKGDR_RING_KIND_PAD for an abandoned reservation
};

// Size in the ring of a record with a `len`-byte payload.
__device__ __forceinline__ u64 record_size(unsigned int len)
{
    return (VKGDR_RING_HEADER_LEN + (u64)len + VKGDR_RING_RECORD_ALIGN - 1ull)
           & ~(VKGDR_RING_RECORD_ALIGN - 1ull);
}

// Block barrier. The warp is reconverged first: __syncthreads() compiles to an aligned barrier
// (bar.sync), which misbehaves when a warp reaches it split (seen on an H100 after a shared
// atomic whose retry loop split the warps).
__device__ __forceinline__ void block_sync()
{
    __syncwarp();
    __syncthreads();
}

// Shared memory of one BlockReader; declare it __shared__ in the kernel.
template <unsigned int THREADS> struct ReaderShared {
    uint4 window[THREADS];      // 16 * THREADS bytes of the lane from the current position
    unsigned int link[THREADS]; // chunk i read as a header: the chunk of the next header
    unsigned int start[THREADS]; // chunk of record k's header in the current group
    u64 word;                   // a broadcast value
    unsigned int count;
    unsigned int end;   // chunk where the walk stopped
    int flag;
};

#define VKGDR_RING_LINK_BAD 0xFFFFFFFFu
#define VKGDR_RING_LINK_WRAP 0x80000000u // the chunk is a wrap PAD's header

// Publishes the head of a reader at `pos` (every thread calls it, after the group is done):
// when the reader has caught up with `tail`, when a quarter of the ring was consumed since
// `released`, or when `force` is set. Every thread has its values of the group's bytes in hand
// when it reaches the barrier, so the head store after it needs no release (see the protocol
// above); loads a reader made ahead lie at or above the new head. The barrier is taken only
// when the head is published (the condition is the same in every thread): between two groups
// the readers' next() has its own, and a barrier per group slowed the checking consumers
// (figures: BENCHMARKS.md, 'The checking consumer').
__device__ __forceinline__ void publish_head(const RingLane& lane, u64 pos, u64 tail,
                                             u64& released, bool force)
{
    if (lane.head == 0 || pos == released) {
        return;
    }
    if (force || pos == tail || pos - released >= lane.capacity / 4ull) {
        block_sync(); // every thread's reads of the group are done
        if (threadIdx.x == 0) {
            // No fence before or after it: a release here cost much of a lone record's round
            // trip, and a fence after it kept thread 0 from polling the tail again for a PCIe
            // round trip (figures: BENCHMARKS.md, 'The device API's reader').
            store_relaxed_sys(lane.head, pos);
        }
        released = pos;
    }
}

// Inclusive prefix sum over a warp (every lane calls it with its value).
__device__ __forceinline__ unsigned int warp_inclusive_sum(unsigned int v)
{
    const unsigned int lane = threadIdx.x & 31u;
#pragma unroll
    for (unsigned int d = 1; d < 32u; d <<= 1) {
        const unsigned int y = __shfl_up_sync(0xFFFFFFFFu, v, d);
        if (lane >= d) {
            v += y;
        }
    }
    return v;
}

// Warp 0 polls the tail until it moves past `pos` or the ring is stopped with nothing left (its
// lanes load the same word: one load per poll, and warp 0, which reads a small window alone, is
// awake when the rest of the block learns the tail); the block learns the result through `word`
// and `flag` (shared memory). True with `tail` set: records to read. False: stopped, or the tail
// is invalid (`err` = VKGDR_RING_BAD_TAIL). Every thread calls it.
__device__ __forceinline__ bool poll_tail(const RingLane& lane, u64 pos, u64& word, int& flag,
                                          u64& tail, int& err)
{
    if (threadIdx.x < 32u) {
        int done = 0;
        u64 t;
        for (;;) {
            // Both loads in flight at once: a poll costs one memory round trip, not two. The
            // stop word first (relaxed), then the tail with acquire: no record load below (in
            // any thread: the barrier orders theirs after this one) may be satisfied before the
            // tail load, and no fence is paid on the way from the tail to the records.
            const unsigned int stopped = *lane.stop;
            t = load_acquire_sys(lane.tail);
            if (t != pos) {
                break;
            }
            if (stopped != 0u) {
                // The CPU stores stop after its last tail: fence, then look at the tail again.
                __threadfence_system();
                t = load_acquire_sys(lane.tail);
                done = t == pos;
                break;
            }
        }
        if (!done && (t < pos || t - pos > lane.capacity
                      || (t & (VKGDR_RING_RECORD_ALIGN - 1ull)) != 0ull)) {
            done = 2;
        }
        if (threadIdx.x == 0) {
            word = t;
            flag = done;
        }
    }
    block_sync();
    // No barrier after these reads where the lane has a head word: thread 0 writes `word` and
    // `flag` again only in a later poll or, for `flag`, in BlockReader::next() after its own
    // barriers, and wait() polls again only after the position moved: by next(), which begins
    // with a barrier, or by skip_to_tail(), after which wait()'s publish_head takes one. A lane
    // without a head word publishes nothing, so it keeps the barrier.
    const u64 t = word;
    const int done = flag;
    if (lane.head == 0) {
        block_sync();
    }
    if (done == 2) {
        err = VKGDR_RING_BAD_TAIL;
    }
    if (done) {
        return false;
    }
    tail = t;
    return true;
}

// What both readers do with their lane's position, tail, head and error: the start, waiting for
// the tail, publishing the head, skipping to the tail. A base of the reader (Reader: the reader
// itself, which befriends it) without fields of its own: the fields stay in the reader, in its
// order, because the generated code follows that order (a base holding them renumbered the
// checking kernels' registers). For the same reason each method casts `this` itself: a helper
// that did so changed ring_stream's code.
template <class Reader> class LaneCursor {
  public:
    // Waits until records are published past the current position (true), or until the ring is
    // stopped with everything consumed, or the tail is invalid (false: leave the loop). Publishes
    // the head first if the reader has caught up.
    __device__ bool wait()
    {
        Reader& r = static_cast<Reader&>(*this);
        if (r.pos_ != r.tail_) {
            return true;
        }
        release(true);
        return poll_tail(r.lane_, r.pos_, r.s_.word, r.s_.flag, r.tail_, r.err_);
    }

    // Call after the block has finished with the current group (every thread, also those without
    // a record), that is once every value a thread read from the group's records has been used
    // (is in its registers or shared memory): the head store after the barrier is not ordered
    // after loads still in flight, and the CPU may overwrite the records as soon as it sees the
    // head. Publishes the head when the reader has caught up with the tail, when a quarter
    // of the ring was consumed since the last publication, or when `force` is set. It
    // synchronizes the block only when it publishes: a caller that reuses its own shared memory
    // between groups needs a barrier of its own (next() begins with one).
    __device__ void release(bool force = false)
    {
        Reader& r = static_cast<Reader&>(*this);
        publish_head(r.lane_, r.pos_, r.tail_, r.released_, force);
    }

    // After a broken chain: counts as handled and moves to the tail (always a record boundary).
    __device__ void skip_to_tail()
    {
        Reader& r = static_cast<Reader&>(*this);
        r.pos_ = r.tail_;
        if (r.err_ == VKGDR_RING_BROKEN) {
            r.err_ = VKGDR_RING_OK;
        }
    }

    __device__ u64 position() const { return static_cast<const Reader&>(*this).pos_; }
    __device__ u64 tail() const { return static_cast<const Reader&>(*this).tail_; }
    __device__ int error() const { return static_cast<const Reader&>(*this).err_; }
    __device__ const RingLane& lane() const { return static_cast<const Reader&>(*this).lane_; }

  protected:
    // Starts at the head the lane's head word holds (0 for a new ring; where the last consumer
    // stopped otherwise).
    __device__ void start(const RingLane& lane)
    {
        Reader& r = static_cast<Reader&>(*this);
        r.lane_ = lane;
        r.mask_ = lane.capacity - 1ull;
        r.err_ = VKGDR_RING_OK;
        if (threadIdx.x == 0) {
            r.s_.word = *r.lane_.head;
        }
        block_sync();
        r.pos_ = r.s_.word;
        block_sync();
        r.tail_ = r.pos_;
        r.released_ = r.pos_;
    }

    // The fixed range [from, to) (batch mode: no tail, head or stop words).
    __device__ void start(const unsigned char* data, u64 capacity, int mirrored, u64 from, u64 to)
    {
        Reader& r = static_cast<Reader&>(*this);
        r.mask_ = capacity - 1ull;
        r.err_ = VKGDR_RING_OK;
        r.lane_.data = data;
        r.lane_.capacity = capacity;
        r.lane_.mirrored = mirrored;
        r.lane_.tail = 0;
        r.lane_.stop = 0;
        r.lane_.head = 0;
        r.lane_.result = 0;
        r.pos_ = from;
        r.tail_ = to;
        r.released_ = from;
        if (capacity < VKGDR_RING_MIN_CAPACITY || (capacity & r.mask_) != 0ull || to < from
            || to - from > capacity || (from & (VKGDR_RING_RECORD_ALIGN - 1ull)) != 0ull) {
            r.err_ = VKGDR_RING_BAD_TAIL;
            r.tail_ = from;
        }
    }
};

// Consumes one lane in order with a block of THREADS threads (a multiple of 32, at most 1024;
// every call is made by all threads of the block with the same arguments).
template <unsigned int THREADS> class BlockReader : public LaneCursor<BlockReader<THREADS>> {
  public:
    // Starts at the head the lane's head word holds (0 for a new ring; where the last consumer
    // stopped otherwise).
    __device__ BlockReader(const RingLane& lane, ReaderShared<THREADS>& s) : s_(s)
    {
        static_assert(THREADS % 32 == 0 && THREADS <= 1024, "THREADS: a multiple of 32");
        this->start(lane);
    }

    // A reader over the fixed range [from, to) (batch mode: no tail, head or stop words).
    __device__ BlockReader(const unsigned char* data, u64 capacity, int mirrored, u64 from, u64 to,
                           ReaderShared<THREADS>& s)
        : s_(s)
    {
        this->start(data, capacity, mirrored, from, to);
    }

    // The next group of records in order, at most THREADS: thread i < count gets record i in
    // `mine`. Returns the count (the same in every thread). 0 with the position moved means a
    // wrap PAD was stepped over; 0 at the tail means nothing is left. A broken chain returns the
    // records before the bad one and sets error() = VKGDR_RING_BROKEN; the position stays at the
    // bad record (skip_to_tail() moves on).
    __device__ unsigned int next(Record& mine)
    {
        const unsigned int tid = threadIdx.x;
        block_sync(); // the last group's shared memory is no longer read
        if (pos_ == tail_ || err_ == VKGDR_RING_BROKEN) {
            return 0u;
        }
        const u64 avail = tail_ - pos_;
        const u64 window = (u64)THREADS * 16ull;
        const unsigned int chunks = (unsigned int)((avail < window ? avail : window) / 16ull);
        const u64 base = pos_ & mask_;
        if (tid < chunks) {
            // Padded rings wrap the window at the end of the region (records do not cross it);
            // mirrored rings read on into the mirror.
            const u64 off = lane_.mirrored ? base + 16ull * tid : (base + 16ull * tid) & mask_;
            const uint4 v = __ldcg((const uint4*)(lane_.data + off));
            s_.window[tid] = v;
            const u64 size = record_size(v.x);
            const u64 seq = (u64)v.z | ((u64)v.w << 32);
            const u64 here = (base + 16ull * tid) & mask_;
            unsigned int link = VKGDR_RING_LINK_BAD;
            const int kind_ok = v.y == VKGDR_RING_KIND_DATA || v.y == VKGDR_RING_KIND_PAD;
            const int fits = size <= avail - 16ull * tid
                             && (lane_.mirrored || here + size <= lane_.capacity);
            if (kind_ok && fits) {
                link = tid + (unsigned int)(size / 16ull);
                if (v.y == VKGDR_RING_KIND_PAD && seq == VKGDR_RING_WRAP_PAD_SEQ) {
                    // A wrap PAD must end exactly at the end of the region.
                    link = here + size == lane_.capacity ? (link | VKGDR_RING_LINK_WRAP)
                                                         : VKGDR_RING_LINK_BAD;
                }
            }
            s_.link[tid] = link;
        }
        block_sync();
        if (tid == 0) {
            unsigned int c = 0, n = 0;
            int broken = 0;
            while (c < chunks && n < THREADS) {
                const unsigned int l = s_.link[c];
                if (l == VKGDR_RING_LINK_BAD) {
                    broken = 1;
                    break;
                }
                if ((l & VKGDR_RING_LINK_WRAP) == 0u) {
                    s_.start[n++] = c;
                }
                c = l & ~VKGDR_RING_LINK_WRAP;
            }
            s_.count = n;
            s_.end = c;
            s_.flag = broken;
        }
        block_sync();
        const unsigned int n = s_.count;
        group_pos_ = pos_;
        pos_ += 16ull * (u64)s_.end;
        if (s_.flag) {
            err_ = VKGDR_RING_BROKEN;
        }
        if (tid < n) {
            mine = record(tid);
        }
        return n;
    }

    // Record k (< the count next() returned) of the current group, in any thread: for
    // processing one record with the whole block. Valid until the next call of next().
    __device__ Record record(unsigned int k) const
    {
        const unsigned int c = s_.start[k];
        const uint4 v = s_.window[c];
        Record r;
        r.pos = group_pos_ + 16ull * c;
        r.payload = lane_.data + (r.pos & mask_) + VKGDR_RING_HEADER_LEN;
        r.len = v.x;
        r.kind = v.y;
        r.seq = (u64)v.z | ((u64)v.w << 32);
        return r;
    }

  private:
    friend class LaneCursor<BlockReader>;

    RingLane lane_;
    ReaderShared<THREADS>& s_;
    u64 mask_;
    u64 pos_;       // consumed (or being consumed) up to here
    u64 group_pos_; // where the current group's window starts
    u64 tail_;      // the last tail seen
    u64 released_;  // the last head published
    int err_;
};

// Shared memory of one WindowReader; declare it __shared__ in the kernel (about 24 KiB for a
// 16 KiB window).
template <unsigned int THREADS, unsigned int CPT> struct WindowShared {
    uint4 window[THREADS * CPT];                 // the lane from the current position
    unsigned int path[THREADS * CPT];            // chain chunks from chunk c to its segment's end
    unsigned short exit[THREADS * CPT];          // where the chain from chunk c leaves its segment
    unsigned short start[THREADS * CPT];         // chunk of record k's header in the window
    unsigned char entry[CPT * (THREADS / 32)];   // where the chain enters segment s (or none)
    unsigned int counts[CPT * (THREADS / 32)];   // records per (slice, warp), for the ranks
                                                 // ([0]: the group's count in next_small)
    u64 word;                                    // a broadcast value
    unsigned int last;                           // the chain's last header
    unsigned int term;                           // where the chain leaves the window
    int flag;
};

#define VKGDR_RING_JUMP_BEYOND 0xFFFEu // a valid record that ends beyond the window
#define VKGDR_RING_JUMP_BAD 0xFFFFu    // not a valid header

// Consumes one lane in order with a block of THREADS threads, a window of 16 * CPT * THREADS
// bytes at a time. Every call is made by all threads of the block with the same arguments.
// Choosing the size: registers first. Keep the read-ahead (CPT uint4 per thread) and the caller's
// own state in registers: 512 threads (four warps per scheduler partition) may use 128 registers
// each; 544 (17 warps: one partition holds five) only 96, and there a persistent consumer spilled
// and checked 4 KiB records slower, although its 17 KiB window holds four of them where 16 KiB
// holds three (figures: BENCHMARKS.md, 'The checking kernels' block size'). Use
// __launch_bounds__(THREADS). Per window:
// - each thread loads CPT 16-byte chunks (coalesced) into shared memory and decodes each as if it
//   were a header: the chunk of the next header, or "bad", or "ends beyond the window";
// - the chain from chunk 0 is resolved per segment of 32 chunks (one warp's chunks of a slice):
//   where the chain from each chunk leaves its segment, and which chunks it passes, by pointer
//   jumping over shuffles (5 rounds, no barrier); then one thread follows the chain from segment
//   to segment (a hop per segment it enters); the records on it are ranked with ballots and one
//   warp scan;
// - the group is every record of the chain that lies wholly in the window (up to CPT * THREADS),
//   their payloads readable from shared memory (shared_payload(k)), or, when the first record is
//   longer than the window, that record alone (large(): its payload is read from global memory);
// - the next window is loaded into registers before next() returns (when it lies below the tail
//   already seen), so its latency overlaps the caller's work on this group. A caller that reads
//   the group's headers first calls defer_read_ahead() once and read_ahead() (every thread)
//   after that pass: the window's global loads then no longer queue ahead of the pass's
//   shared-memory reads (figures for the checking consumers of kernels/ring.cu: BENCHMARKS.md,
//   'The checking consumer'). A reader whose read_ahead() was not called loads the window in
//   next(), as one without read-ahead.
// wait() polls the tail only once everything below the last tail seen is consumed; release()
// publishes the head when caught up or every quarter ring, as BlockReader does. Unless large(),
// a group's bytes are all in shared memory once next() returns, so a caller that reads them only
// through shared_payload() may call release() right after next(): the head then travels to the
// CPU while the block works on the group (a lone record's round trip no longer waits for its
// processing). Such a caller may go one step further with release_early(): next() then
// publishes the head itself when a group of at most 512 bytes takes the reader to the tail (a
// lone record's case), as soon as warp 0 has read the group and before the block learns of it
// (the checking consumers of kernels/ring.cu do; figures: BENCHMARKS.md, 'What a block reader
// costs a lone record').
//
//   extern "C" __global__ void __launch_bounds__(512)
//   my_consumer(vkgdr_ring_view view)                              // one block of 512 per lane
//   {
//       __shared__ vkgdr::WindowShared<512, 2> smem;
//       if (blockIdx.x >= view.lanes) return;
//       vkgdr::WindowReader<512, 2> reader(vkgdr::ring_lane(view, blockIdx.x), smem);
//       while (reader.wait()) {
//           const unsigned n = reader.next();                      // up to 1024 records
//           for (unsigned k = threadIdx.x; k < n; k += 512) {
//               const vkgdr::Record rec = reader.record(k);
//               const uint4* p = reader.shared_payload(k);         // null when reader.large()
//               /* rec.len payload bytes at p (shared) or rec.payload (global) */
//           }
//           if (reader.error() != VKGDR_RING_OK) reader.skip_to_tail();
//           reader.release();
//       }
//   }
template <unsigned int THREADS, unsigned int CPT = 4>
class WindowReader : public LaneCursor<WindowReader<THREADS, CPT>> {
  public:
    static constexpr unsigned int CHUNKS = THREADS * CPT;
    static constexpr u64 WINDOW = 16ull * CHUNKS;

    // Starts at the head the lane's head word holds (0 for a new ring).
    __device__ WindowReader(const RingLane& lane, WindowShared<THREADS, CPT>& s) : s_(s)
    {
        check_shape();
        this->start(lane);
        init();
    }

    // A reader over the fixed range [from, to) (batch mode: no tail, head or stop words).
    __device__ WindowReader(const unsigned char* data, u64 capacity, int mirrored, u64 from,
                            u64 to, WindowShared<THREADS, CPT>& s)
        : s_(s)
    {
        check_shape();
        this->start(data, capacity, mirrored, from, to);
        init();
    }

    // The next group in order; returns its record count (the same in every thread). 0 with the
    // position moved means only wrap PADs were stepped over; 0 at the tail means nothing is
    // left. A broken chain returns the records before the bad one and sets error() =
    // VKGDR_RING_BROKEN; the position stays at the bad record (skip_to_tail() moves on).
    __device__ unsigned int next()
    {
        const unsigned int tid = threadIdx.x;
        block_sync(); // the last group's shared memory is no longer read
        const bool prefetched = pre_pos_ == pos_;
        pre_pos_ = NO_PREFETCH;
        large_ = false;
        if (pos_ == tail_ || err_ == VKGDR_RING_BROKEN) {
            return 0u;
        }
        const u64 avail = tail_ - pos_;
        const unsigned int n = (unsigned int)((avail < WINDOW ? avail : WINDOW) / 16ull);
        const u64 base = pos_ & mask_;
        if (n <= 32u) {
            return next_small(base, avail, n, prefetched);
        }
        unsigned int link[CPT];
        unsigned int path[CPT];
        unsigned int wrap = 0u; // bit i: chunk i of this thread is a wrap PAD's header
        const unsigned int lane = tid & 31u;
        const unsigned int warp = tid >> 5;
#pragma unroll
        for (unsigned int i = 0; i < CPT; ++i) {
            const unsigned int c = tid + i * THREADS;
            link[i] = VKGDR_RING_JUMP_BAD;
            if (c < n) {
                const uint4 v = prefetched && c < pre_n_ ? pre_[i] : load(base, c);
                s_.window[c] = v;
                link[i] = decode(v, base, c, avail, n);
                if (v.y == VKGDR_RING_KIND_PAD && v.z == 0xFFFFFFFFu && v.w == 0xFFFFFFFFu) {
                    wrap |= 1u << i;
                }
            }
            // Segment c / 32 (the warp's 32 chunks of slice i, those below n): after round r,
            // `to` is where 2^r steps from c lead, or where the chain left the segment, and `on`
            // the segment's chunks on the way (bit j: chunk c - lane + j). Links only go
            // forward, so 32 steps leave any segment.
            const unsigned int seg_base = c - lane;
            const unsigned int width = n > seg_base ? min(n - seg_base, 32u) : 0u;
            unsigned int to = link[i];
            unsigned int on = 1u << lane;
#pragma unroll
            for (unsigned int r = 0; r < 5u; ++r) {
                const bool inside = to - seg_base < width;
                const unsigned int from = inside ? to - seg_base : lane;
                const unsigned int to_next = __shfl_sync(0xFFFFFFFFu, to, from);
                const unsigned int on_next = __shfl_sync(0xFFFFFFFFu, on, from);
                if (inside) {
                    to = to_next;
                    on |= on_next;
                }
            }
            path[i] = on;
            s_.path[c] = on;
            s_.exit[c] = (unsigned short)to;
        }
        if (tid < SLOTS) {
            s_.entry[tid] = NO_ENTRY;
        }
        block_sync();
        // The chain from segment to segment, from chunk 0; `term` is where it leaves the window
        // (n, BEYOND or BAD), `last` the chain's last header in the window.
        if (tid == 0u) {
            unsigned int cur = 0u;
            unsigned int at;
            for (;;) {
                s_.entry[cur >> 5] = (unsigned char)(cur & 31u);
                at = s_.exit[cur];
                if (at >= n) {
                    break;
                }
                cur = at;
            }
            s_.term = at;
            s_.last = (cur & ~31u) + 31u - __clz(s_.path[cur]);
        }
        block_sync();
        const unsigned int term = s_.term;
        // Ranks: records of the chain in chunk order. Slice i holds chunks [i, i + 1) * THREADS,
        // warp w of it 32 of them; a warp scan over the (slice, warp) counts gives the offsets.
        unsigned int ballot[CPT];
#pragma unroll
        for (unsigned int i = 0; i < CPT; ++i) {
            // On the chain: the chain enters this chunk's segment at `entry`, and passes it.
            const unsigned int entry = s_.entry[i * (THREADS / 32u) + warp];
            const unsigned int entered = __shfl_sync(0xFFFFFFFFu, path[i], entry & 31u);
            const bool on = entry != NO_ENTRY && ((entered >> lane) & 1u) != 0u;
            const bool rec = on && link[i] < VKGDR_RING_JUMP_BEYOND && (wrap & (1u << i)) == 0u;
            ballot[i] = __ballot_sync(0xFFFFFFFFu, rec);
            if (lane == 0u) {
                s_.counts[i * (THREADS / 32u) + warp] = __popc(ballot[i]);
            }
        }
        block_sync();
        // Lane l scans slots [l, l + 1) * PER.
        unsigned int mine = 0u;
#pragma unroll
        for (unsigned int q = 0; q < PER; ++q) {
            mine += lane * PER + q < SLOTS ? s_.counts[lane * PER + q] : 0u;
        }
        const unsigned int incl = warp_inclusive_sum(mine);
        unsigned int count = __shfl_sync(0xFFFFFFFFu, incl, 31);
#pragma unroll
        for (unsigned int i = 0; i < CPT; ++i) {
            const unsigned int slot = i * (THREADS / 32u) + warp;
            unsigned int off = __shfl_sync(0xFFFFFFFFu, incl - mine, slot / PER);
            for (unsigned int q = slot - slot % PER; q < slot; ++q) {
                off += s_.counts[q];
            }
            if ((ballot[i] >> lane) & 1u) {
                s_.start[off + __popc(ballot[i] & ((1u << lane) - 1u))] =
                    (unsigned short)(tid + i * THREADS);
            }
        }
        count = end_group(term, s_.last, count, n);
        block_sync(); // start[] is complete
        return count;
    }

    // From now on next() leaves reading ahead to the caller's read_ahead() (see above).
    __device__ void defer_read_ahead() { defer_ = true; }

    // From now on next() publishes the head itself when a group of at most 512 bytes (32
    // chunks) takes the reader to the tail, before it returns; release() then has nothing left to
    // publish for that group. Only for a caller that reads every group's records through
    // shared_payload() and the Record fields alone, never through Record::payload (global
    // memory: the producer may overwrite those bytes as soon as the head has passed them). Every
    // thread calls it, before its first next().
    __device__ void release_early() { early_ = true; }

    // Loads the window after the current group into registers (when it lies below the tail
    // already seen), for the next call of next(); every thread calls it, after next() and before
    // skip_to_tail() or the next wait(). Reads global memory only.
    __device__ void read_ahead()
    {
        if (err_ == VKGDR_RING_BROKEN || pos_ == tail_ || pre_pos_ == pos_) {
            return;
        }
        const u64 ahead = tail_ - pos_;
        pre_n_ = (unsigned int)((ahead < WINDOW ? ahead : WINDOW) / 16ull);
        const u64 next_base = pos_ & mask_;
#pragma unroll
        for (unsigned int i = 0; i < CPT; ++i) {
            const unsigned int c = threadIdx.x + i * THREADS;
            if (c < pre_n_) {
                pre_[i] = load(next_base, c);
            }
        }
        pre_pos_ = pos_;
    }

    // Record k (< the count next() returned) of the current group, in any thread. Valid until
    // the next call of next().
    __device__ Record record(unsigned int k) const
    {
        const unsigned int c = large_ ? 0u : s_.start[k];
        const uint4 v = s_.window[c];
        Record r;
        r.pos = group_pos_ + 16ull * c;
        r.payload = lane_.data + (r.pos & mask_) + VKGDR_RING_HEADER_LEN;
        r.len = v.x;
        r.kind = v.y;
        r.seq = (u64)v.z | ((u64)v.w << 32);
        return r;
    }

    // Record k's payload in shared memory (the whole record lies in the window), or null for
    // the record of a large() group. Chunk q holds payload bytes 16q .. 16q + 15.
    __device__ const uint4* shared_payload(unsigned int k) const
    {
        return large_ ? nullptr : &s_.window[s_.start[k] + 1u];
    }

    // Whether the current group is one record longer than the window (payload in global memory).
    __device__ bool large() const { return large_; }

  private:
    friend class LaneCursor<WindowReader>;

    static constexpr unsigned int SLOTS = CPT * (THREADS / 32u); // segments of 32 chunks
    static constexpr unsigned int PER = (SLOTS + 31u) / 32u;      // slots per lane of the scan
    static constexpr u64 NO_PREFETCH = 0xFFFFFFFFFFFFFFFFull; // never a 16-aligned position
    static constexpr unsigned int NO_ENTRY = 0xFFu; // the chain does not enter the segment

    // next() for a window of at most 32 chunks (a lone record, or the last few of a stream):
    // warp 0 loads and decodes them and resolves the chain in its one segment with its
    // shuffles, as every warp does in next(), and ranks the records with one ballot. The other
    // warps only wait at the barrier: two barriers per group where next() takes five, and no
    // hop from segment to segment. Every thread calls it.
    __device__ unsigned int next_small(u64 base, u64 avail, unsigned int n, bool prefetched)
    {
        const unsigned int tid = threadIdx.x;
        if (tid < 32u) {
            unsigned int link = VKGDR_RING_JUMP_BAD;
            bool wrap = false;
            if (tid < n) {
                const uint4 v = prefetched && tid < pre_n_ ? pre_[0] : load(base, tid);
                s_.window[tid] = v;
                link = decode(v, base, tid, avail, n);
                wrap = v.y == VKGDR_RING_KIND_PAD && v.z == 0xFFFFFFFFu && v.w == 0xFFFFFFFFu;
            }
            // The chain from chunk 0: where it leaves the window (`term`), and the chunks it
            // passes (`chain`, bit j: chunk j).
            unsigned int term = __shfl_sync(0xFFFFFFFFu, link, 0);
            unsigned int chain = 1u;
            if (term != n) {
                // Not one record filling the window (a lone record, which needs no more): after
                // round r, `to` is where 2^r steps from chunk tid lead (or where the chain left
                // the window), `on` the chunks on the way. A chain through n chunks takes at most
                // n steps: 2^r >= n after r rounds (the same count in every lane: n is the
                // block's).
                unsigned int to = link;
                unsigned int on = 1u << tid;
#pragma unroll
                for (unsigned int r = 0; r < 5u && (1u << r) < n; ++r) {
                    const bool inside = to < n;
                    const unsigned int from = inside ? to : tid;
                    const unsigned int to_next = __shfl_sync(0xFFFFFFFFu, to, from);
                    const unsigned int on_next = __shfl_sync(0xFFFFFFFFu, on, from);
                    if (inside) {
                        to = to_next;
                        on |= on_next;
                    }
                }
                term = __shfl_sync(0xFFFFFFFFu, to, 0);
                chain = __shfl_sync(0xFFFFFFFFu, on, 0);
            }
            const bool rec = ((chain >> tid) & 1u) != 0u && link < VKGDR_RING_JUMP_BEYOND && !wrap;
            const unsigned int ballot = __ballot_sync(0xFFFFFFFFu, rec);
            if (rec) {
                s_.start[__popc(ballot & ((1u << tid) - 1u))] = (unsigned short)tid;
            }
            if (early_ && term == n && tail_ - pos_ == 16ull * n && lane_.head != 0) {
                // The group ends at the tail and every lane of this warp has its chunk in hand
                // (stored into shared memory above, which needed the loaded value): the head may
                // go now, before the block's barrier (end_group() counts it as published).
                __syncwarp();
                if (tid == 0u) {
                    store_relaxed_sys(lane_.head, pos_ + 16ull * n);
                }
            }
            if (tid == 0u) {
                s_.term = term;
                s_.last = 31u - __clz(chain);
                s_.counts[0] = __popc(ballot); // the group's record count
            }
        }
        block_sync(); // window[], start[] and the three words are complete
        // No barrier after the group's words are read: the next writer of them is the next
        // call of next(), after its own barrier.
        return end_group(s_.term, s_.last, s_.counts[0], n);
    }

    // The end of next(): moves the position past the group (`term`: where the chain left the
    // window, `last` its last header in the window, `count` its records), and reads ahead.
    // Returns the group's record count.
    __device__ __forceinline__ unsigned int end_group(unsigned int term, unsigned int last,
                                                      unsigned int count, unsigned int n)
    {
        group_pos_ = pos_;
        if (term == VKGDR_RING_JUMP_BAD) {
            err_ = VKGDR_RING_BROKEN;
            pos_ += 16ull * last;
        } else if (term == VKGDR_RING_JUMP_BEYOND && last == 0u) {
            // The first record is longer than the window: the group is that record alone.
            const uint4 h = s_.window[0];
            large_ = true;
            const bool wrap_pad = h.y == VKGDR_RING_KIND_PAD && h.z == 0xFFFFFFFFu
                                  && h.w == 0xFFFFFFFFu;
            count = wrap_pad ? 0u : 1u;
            pos_ += record_size(h.x);
        } else {
            pos_ += 16ull * (term == VKGDR_RING_JUMP_BEYOND ? last : n);
            if (early_ && term == n && n <= 32u && pos_ == tail_ && lane_.head != 0) {
                released_ = pos_; // next_small() published it
            }
        }
        if (!defer_) {
            read_ahead();
        }
        return count;
    }

    __device__ static void check_shape()
    {
        static_assert(THREADS % 32 == 0 && THREADS <= 1024, "THREADS: a multiple of 32");
        static_assert(CPT >= 1 && CPT <= 32, "CPT: 1 to 32 chunks per thread");
        static_assert(THREADS * CPT <= 4096, "at most 4096 chunks (64 KiB) in a window");
    }

    __device__ void init()
    {
        pre_pos_ = NO_PREFETCH;
        pre_n_ = 0u;
        large_ = false;
        defer_ = false;
        early_ = false;
        group_pos_ = pos_;
#pragma unroll
        for (unsigned int i = 0; i < CPT; ++i) {
            pre_[i] = make_uint4(0u, 0u, 0u, 0u);
        }
    }

    // Chunk c of the window at region offset `base` (L2 only: lines of an earlier lap are stale).
    __device__ uint4 load(u64 base, unsigned int c) const
    {
        // Padded rings wrap the window at the end of the region (records do not cross it);
        // mirrored rings read on into the mirror (a window is at most a capacity).
        const u64 off = lane_.mirrored ? base + 16ull * c : (base + 16ull * c) & mask_;
        return __ldcg((const uint4*)(lane_.data + off));
    }

    // Chunk c read as a header: the chunk after its record (c + size / 16 <= n), BEYOND (valid,
    // ends past the window but not past the tail) or BAD (what next_record_in rejects, or a wrap
    // PAD that does not end at the region's end).
    __device__ unsigned int decode(uint4 v, u64 base, unsigned int c, u64 avail,
                                   unsigned int n) const
    {
        const u64 size = record_size(v.x);
        const u64 here = (base + 16ull * c) & mask_;
        const bool kind_ok = v.y == VKGDR_RING_KIND_DATA || v.y == VKGDR_RING_KIND_PAD;
        const bool fits = size <= avail - 16ull * c
                          && (lane_.mirrored || here + size <= lane_.capacity);
        if (!kind_ok || !fits) {
            return VKGDR_RING_JUMP_BAD;
        }
        if (v.y == VKGDR_RING_KIND_PAD && v.z == 0xFFFFFFFFu && v.w == 0xFFFFFFFFu
            && here + size != lane_.capacity) {
            return VKGDR_RING_JUMP_BAD;
        }
        const u64 to = (u64)c + size / 16ull;
        return to <= (u64)n ? (unsigned int)to : VKGDR_RING_JUMP_BEYOND;
    }

    RingLane lane_;
    WindowShared<THREADS, CPT>& s_;
    u64 mask_;
    u64 pos_;       // consumed (or being consumed) up to here
    u64 group_pos_; // where the current group's window starts
    u64 tail_;      // the last tail seen
    u64 released_;  // the last head published
    u64 pre_pos_;   // where the window in pre_ starts, or NO_PREFETCH
    uint4 pre_[CPT]; // this thread's chunks of the next window, loaded ahead
    unsigned int pre_n_;
    int err_;
    bool large_;
    bool defer_; // read_ahead() is the caller's
    bool early_; // next_small() publishes the head of a group that ends at the tail
};

// Sum over a warp (every lane calls it; the result is valid in every lane).
__device__ __forceinline__ u64 warp_sum(u64 v)
{
    for (int d = 16; d > 0; d >>= 1) {
        v += __shfl_xor_sync(0xFFFFFFFFu, v, d);
    }
    return v;
}

// Sum over the block (every thread calls it; the result is valid in every thread). `scratch`:
// THREADS / 32 words of shared memory.
template <unsigned int THREADS> __device__ __forceinline__ u64 block_sum(u64 v, u64* scratch)
{
    for (int d = 16; d > 0; d >>= 1) {
        v += __shfl_xor_sync(0xFFFFFFFFu, v, d);
    }
    if ((threadIdx.x & 31u) == 0u) {
        scratch[threadIdx.x >> 5] = v;
    }
    block_sync();
    u64 total = 0ull;
    for (unsigned int w = 0; w < THREADS / 32u; ++w) {
        total += scratch[w];
    }
    block_sync();
    return total;
}

} // namespace vkgdr_device

// The short name, where it can be had (see the top of this file).
#if !defined(VKGDR_H) && !defined(VKGDR_RING_NO_SHORT_NAME)
namespace vkgdr = vkgdr_device;
#endif

#endif // VKGDR_RING_CUH
