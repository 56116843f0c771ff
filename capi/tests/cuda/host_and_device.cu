// The host API (vkgdr.h, vkgdr 0.1's names) and the rings' device API (vkgdr/ring.cuh) in one
// CUDA file, as a program that opens a device, makes a ring and launches its consumer is written:
// vkgdr.h first, the device API as vkgdr_device::. Compiled (not run) by `scripts/nvcc check`.
#include "../../../include/vkgdr.h"
#include "../../../include/vkgdr/ring.cuh"

#ifdef vkgdr
#error "no macro named vkgdr"
#endif

static_assert(sizeof(vkgdr_ring_view) == 64, "the view is the Rust RingDeviceView");

// Sums the payload bytes of every data record of its lane.
extern "C" __global__ void sum_payload_bytes(vkgdr_ring_view view, unsigned long long* out)
{
    __shared__ vkgdr_device::ReaderShared<128> smem;
    if (blockIdx.x >= view.lanes) {
        return;
    }
    vkgdr_device::BlockReader<128> reader(vkgdr_device::ring_lane(view, blockIdx.x), smem);
    unsigned long long bytes = 0ull;
    while (reader.wait()) {
        vkgdr_device::Record rec;
        const unsigned n = reader.next(rec);
        if (threadIdx.x < n && rec.kind == VKGDR_RING_KIND_DATA) {
            bytes += rec.len;
        }
        reader.release();
    }
    atomicAdd(out + blockIdx.x, bytes);
}

// The host side: a handle of vkgdr 0.1's type next to the device API's names.
int open_and_close(CUdevice device)
{
    vkgdr_t g = vkgdr_open(device, VKGDR_OPEN_REQUIRE_COHERENT_BIT);
    if (g == nullptr) {
        return 1;
    }
    vkgdr_close(g);
    return 0;
}
