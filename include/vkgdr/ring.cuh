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
//         reuses space below it. Published after the block's reads are done, with
//         __threadfence_system() before and after the store.
//   stop  u32, GPU memory, one per ring: the CPU's request to exit once everything published is
//         consumed (it stores its last tail first).
// The reader polls the tail with volatile loads and fences (__threadfence_system) before it
// reads records, so no record load is satisfied before the tail load. Records are loaded with
// ld.global.cg (L2, not L1): a line cached on an earlier lap of the ring is never reused.
//
// Block-cooperative, in-order consumption (BlockReader): `next()` loads the next 16 * THREADS
// bytes of the lane into shared memory (one coalesced 16-byte load per thread), every thread
// decodes the chunk it loaded as if it were a header, and one thread follows the chain through
// those decoded links (one shared-memory load per record). Thread i then gets record i. A record
// whose header is in the window may be longer than the window: its payload is read from global
// memory by whoever processes it (`record(k)` gives any record of the group to every thread, for
// processing a large record with the whole block).
//
// Checked with nvcc 13.0 (-arch=compute_75); the consumers in kernels/ring.cu are built on it.

#ifndef VKGDR_RING_CUH
#define VKGDR_RING_CUH

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

// BlockReader::error() values.
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

// Consumes one lane in order with a block of THREADS threads (a multiple of 32, at most 1024;
// every call is made by all threads of the block with the same arguments).
template <unsigned int THREADS> class BlockReader {
  public:
    // Starts at the head the lane's head word holds (0 for a new ring; where the last consumer
    // stopped otherwise).
    __device__ BlockReader(const RingLane& lane, ReaderShared<THREADS>& s)
        : lane_(lane), s_(s), mask_(lane.capacity - 1ull), err_(VKGDR_RING_OK)
    {
        static_assert(THREADS % 32 == 0 && THREADS <= 1024, "THREADS: a multiple of 32");
        if (threadIdx.x == 0) {
            s_.word = *lane_.head;
        }
        block_sync();
        pos_ = s_.word;
        block_sync();
        tail_ = pos_;
        released_ = pos_;
    }

    // A reader over the fixed range [from, to) (batch mode: no tail, head or stop words).
    __device__ BlockReader(const unsigned char* data, u64 capacity, int mirrored, u64 from, u64 to,
                           ReaderShared<THREADS>& s)
        : s_(s), mask_(capacity - 1ull), err_(VKGDR_RING_OK)
    {
        lane_.data = data;
        lane_.capacity = capacity;
        lane_.mirrored = mirrored;
        lane_.tail = 0;
        lane_.stop = 0;
        lane_.head = 0;
        lane_.result = 0;
        pos_ = from;
        tail_ = to;
        released_ = from;
        if (capacity < VKGDR_RING_MIN_CAPACITY || (capacity & mask_) != 0ull || to < from
            || to - from > capacity || (from & (VKGDR_RING_RECORD_ALIGN - 1ull)) != 0ull) {
            err_ = VKGDR_RING_BAD_TAIL;
            tail_ = from;
        }
    }

    // Waits until records are published past the current position (true), or until the ring is
    // stopped with everything consumed, or the tail is invalid (false: leave the loop). Publishes
    // the head first if the reader has caught up.
    __device__ bool wait()
    {
        if (pos_ != tail_) {
            return true;
        }
        release(true);
        if (threadIdx.x == 0) {
            int done = 0;
            u64 t;
            for (;;) {
                t = *lane_.tail;
                if (t != pos_) {
                    break;
                }
                if (*lane_.stop != 0u) {
                    // The CPU stores stop after its last tail: fence, then look at the tail again.
                    __threadfence_system();
                    t = *lane_.tail;
                    done = t == pos_;
                    break;
                }
            }
            // Acquire: no record load below may be satisfied before the tail load above.
            __threadfence_system();
            if (!done && (t < pos_ || t - pos_ > lane_.capacity
                          || (t & (VKGDR_RING_RECORD_ALIGN - 1ull)) != 0ull)) {
                done = 2;
            }
            s_.word = t;
            s_.flag = done;
        }
        block_sync();
        const u64 t = s_.word;
        const int done = s_.flag;
        block_sync();
        if (done == 2) {
            err_ = VKGDR_RING_BAD_TAIL;
        }
        if (done) {
            return false;
        }
        tail_ = t;
        return true;
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

    // Call after the block has finished with the current group (every thread, also those without
    // a record): publishes the head when the reader has caught up with the tail, when a quarter
    // of the ring was consumed since the last publication, or when `force` is set.
    __device__ void release(bool force = false)
    {
        block_sync(); // every thread's reads of the group are done
        if (lane_.head == 0 || pos_ == released_) {
            return;
        }
        if (force || pos_ == tail_ || pos_ - released_ >= lane_.capacity / 4ull) {
            if (threadIdx.x == 0) {
                // The block's reads (ordered by the barrier above) before the head store.
                __threadfence_system();
                *lane_.head = pos_;
                __threadfence_system();
            }
            released_ = pos_;
        }
    }

    // After a broken chain: counts as handled and moves to the tail (always a record boundary).
    __device__ void skip_to_tail()
    {
        pos_ = tail_;
        if (err_ == VKGDR_RING_BROKEN) {
            err_ = VKGDR_RING_OK;
        }
    }

    __device__ u64 position() const { return pos_; }
    __device__ u64 tail() const { return tail_; }
    __device__ int error() const { return err_; }
    __device__ const RingLane& lane() const { return lane_; }

  private:
    RingLane lane_;
    ReaderShared<THREADS>& s_;
    u64 mask_;
    u64 pos_;       // consumed (or being consumed) up to here
    u64 group_pos_; // where the current group's window starts
    u64 tail_;      // the last tail seen
    u64 released_;  // the last head published
    int err_;
};

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
