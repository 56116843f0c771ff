// The rings' device readers without their checks, beside the consumers of kernels/ring.cu, for the
// lone-record probe (ring_lone.c) and the throughput probe (ring_tput.c): what a reader itself
// costs a record's round trip. Built against a tree's headers (`-I <tree>`), so two commits'
// readers can be compared in one run on one machine (figures: BENCHMARKS.md, "The device API's
// reader").
//
//   nvcc -cubin -arch=sm_90 -O3 -I . benches/probes/ring_lone.cu -o ring_lone.cubin
#include "kernels/ring.cu"

// The window reader alone: wait, next, release (one block of 512 per lane).
extern "C" __global__ void __launch_bounds__(512) window_min(vkgdr_ring_view view)
{
    __shared__ vkgdr::WindowShared<512, 2> smem;
    if (blockIdx.x >= view.lanes) return;
    vkgdr::WindowReader<512, 2> reader(vkgdr::ring_lane(view, blockIdx.x), smem);
    while (reader.wait()) {
        reader.next();
        if (reader.error() != VKGDR_RING_OK) reader.skip_to_tail();
        reader.release();
    }
}

// The block reader alone (one block of 512 per lane).
extern "C" __global__ void __launch_bounds__(512) block_min(vkgdr_ring_view view)
{
    __shared__ vkgdr::ReaderShared<512> smem;
    if (blockIdx.x >= view.lanes) return;
    vkgdr::BlockReader<512> reader(vkgdr::ring_lane(view, blockIdx.x), smem);
    while (reader.wait()) {
        vkgdr::Record r;
        reader.next(r);
        if (reader.error() != VKGDR_RING_OK) reader.skip_to_tail();
        reader.release();
    }
}

// --- Where a lone record's time goes inside a block reader ---------------------------------------
// Kernels that also take (ull* out, unsigned int max): thread 0 of each block writes, per round,
// the SM cycles and the %globaltimer nanoseconds of its in-kernel part into out[block][round][2]
// (ring_lone.c prints their percentiles).

__device__ __forceinline__ ull global_ns()
{
    ull t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The least a block reader does for a lone record: warp 0 polls the tail (every lane, as
// poll_tail does; thread 0 alone without WARP_POLL), the tail goes to the block through shared
// memory, warp 0 loads the window's chunks below the tail (at most 32) into shared memory, thread
// 0 stores the head once they are there. BARS of the four block barriers a reader takes per
// group (after the poll, at next()'s start, after the window is in shared memory, before the
// head store) are taken, the others are warp barriers; with BARS = 0 only warp 0 runs. Timed
// from the poll's end to the head store.
template <int BARS, bool WARP_POLL>
__device__ void block_floor(vkgdr_ring_view view, ull* out, unsigned int max)
{
    __shared__ ull word;
    __shared__ int flag;
    __shared__ uint4 window[32];
    if (blockIdx.x >= view.lanes) {
        return;
    }
    const vkgdr::RingLane lane = vkgdr::ring_lane(view, blockIdx.x);
    if (BARS == 0 && threadIdx.x >= 32u) {
        return;
    }
    ull pos = *lane.head;
    ull* mine = out + (ull)blockIdx.x * max * 2ull;
    for (unsigned int round = 0;; ++round) {
        ull t = 0;
        int done = 0;
        long long c0 = 0;
        ull g0 = 0;
        if (WARP_POLL ? threadIdx.x < 32u : threadIdx.x == 0u) {
            for (;;) {
                const unsigned int stopped = *lane.stop;
                t = vkgdr::load_acquire_sys(lane.tail);
                if (t != pos) {
                    break;
                }
                if (stopped) {
                    __threadfence_system();
                    t = vkgdr::load_acquire_sys(lane.tail);
                    done = t == pos;
                    break;
                }
            }
            c0 = clock64();
            g0 = global_ns();
            if (threadIdx.x == 0u) {
                word = t;
                flag = done;
            }
        }
        if (BARS >= 1) vkgdr::block_sync(); else __syncwarp();
        t = word;
        done = flag;
        if (done) {
            break;
        }
        if (BARS >= 2) vkgdr::block_sync();
        const ull chunks = (t - pos) / 16ull;
        const unsigned int n = (unsigned int)(chunks < 32ull ? chunks : 32ull);
        if (threadIdx.x < n) {
            window[threadIdx.x] = __ldcg(
                (const uint4*)(lane.data + ((pos + 16ull * threadIdx.x) & (lane.capacity - 1ull))));
        }
        if (BARS >= 3) vkgdr::block_sync(); else __syncwarp();
        // No record's kind is 0xFFFFFFFF: the head is t, and its store waits for the window.
        const ull head = window[0].y == 0xFFFFFFFFu ? t + 16ull : t;
        if (BARS >= 4) vkgdr::block_sync(); else __syncwarp();
        if (threadIdx.x == 0u) {
            vkgdr::store_relaxed_sys(lane.head, head);
            if (round < max) {
                mine[2 * round] = (ull)(clock64() - c0);
                mine[2 * round + 1] = global_ns() - g0;
            }
        }
        pos = head;
    }
}

#define FLOOR(name, bars, warp_poll, threads)                                                      \
    extern "C" __global__ void __launch_bounds__(threads) name(vkgdr_ring_view v, ull* o,          \
                                                                unsigned int m)                    \
    {                                                                                              \
        block_floor<bars, warp_poll>(v, o, m);                                                     \
    }
FLOOR(floor_warp, 0, true, 512)
FLOOR(floor_bar1, 1, true, 512)
FLOOR(floor_bar2, 2, true, 512)
FLOOR(floor_bar3, 3, true, 512)
FLOOR(floor_bar4, 4, true, 512)
FLOOR(floor_bar4_thread, 4, false, 512)

// The window reader as window_min runs it, timed from wait()'s return (the poll and its barrier
// done) to release()'s (the head stored), with blocks of T threads; EARLY: with
// release_early(), as the checking kernels run it.
template <unsigned int T, unsigned int CPT, bool EARLY = false>
__device__ void window_timed(vkgdr_ring_view view, ull* out, unsigned int max)
{
    __shared__ vkgdr::WindowShared<T, CPT> smem;
    if (blockIdx.x >= view.lanes) {
        return;
    }
    vkgdr::WindowReader<T, CPT> reader(vkgdr::ring_lane(view, blockIdx.x), smem);
    if (EARLY) {
        reader.release_early();
    }
    ull* mine = out + (ull)blockIdx.x * max * 2ull;
    for (unsigned int round = 0; reader.wait(); ++round) {
        const long long c0 = clock64();
        const ull g0 = global_ns();
        reader.next();
        if (reader.error() != VKGDR_RING_OK) {
            reader.skip_to_tail();
        }
        reader.release();
        if (threadIdx.x == 0u && round < max) {
            mine[2 * round] = (ull)(clock64() - c0);
            mine[2 * round + 1] = global_ns() - g0;
        }
    }
}

extern "C" __global__ void __launch_bounds__(512) window_timed512(vkgdr_ring_view v, ull* o,
                                                                  unsigned int m)
{
    window_timed<512, 2>(v, o, m);
}

extern "C" __global__ void __launch_bounds__(32) window_timed32(vkgdr_ring_view v, ull* o,
                                                                unsigned int m)
{
    window_timed<32, 16>(v, o, m);
}

extern "C" __global__ void __launch_bounds__(512) window_early512(vkgdr_ring_view v, ull* o,
                                                                  unsigned int m)
{
    window_timed<512, 2, true>(v, o, m);
}

// --- Whose work a lone record's tail waits behind under load -------------------------------------
// One kernel, two consumers: lane 0 (the lone record's, the probe's first producer) read by one
// consumer, the other lanes by the other, so that the lone lane's reader and the streaming lanes'
// readers can be swapped apart (ring_lone.c with RING_LONE_LOAD).

// Lane 0 read by one consumer, the others by the other: CHECK0, lane 0 through the checking
// kernel's reader and the others acked by one thread each; otherwise the other way round.
template <bool CHECK0> __device__ void split_consumers(vkgdr_ring_view view)
{
    __shared__ RingCheckShared sh;
    if (blockIdx.x >= view.lanes) {
        return;
    }
    const vkgdr::RingLane lane = vkgdr::ring_lane(view, blockIdx.x);
    if ((blockIdx.x == 0u) != CHECK0) {
        if (threadIdx.x == 0u) {
            ring_ack_lane(lane.tail, lane.stop, lane.head);
        }
        return;
    }
    if (ring_block_ok(lane.result)) {
        ring_check_lane(lane, &sh);
    }
}

extern "C" __global__ void __launch_bounds__(512) check0_ack_rest(vkgdr_ring_view view, ull*,
                                                                  unsigned int)
{
    split_consumers<true>(view);
}

extern "C" __global__ void __launch_bounds__(512) ack0_check_rest(vkgdr_ring_view view, ull*,
                                                                  unsigned int)
{
    split_consumers<false>(view);
}
