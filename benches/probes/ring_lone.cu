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
