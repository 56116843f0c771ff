// The host API's device -> host rings (vkgdr.h) and their device API (vkgdr/ring_d2h.cuh) in one
// CUDA file: vkgdr.h first, the device API as vkgdr_device::. The host's view struct must be the
// kernel's parameter byte for byte: the same size and every field at the same offset. Compiled
// (not run) by `scripts/nvcc check`.
#include <cstddef>
#include <cstring>

#include "../../../include/vkgdr.h"
#include "../../../include/vkgdr/ring_d2h.cuh"

#define SAME_FIELD(host, device)                                                                 \
    static_assert(offsetof(vkgdr_d2h_ring_device_view, host) == offsetof(vkgdr_d2h_view, device), \
                  #host " is not where vkgdr_d2h_view has " #device)
static_assert(sizeof(vkgdr_d2h_ring_device_view) == sizeof(vkgdr_d2h_view),
              "the host's view is the kernel's parameter");
SAME_FIELD(slots, slots);
SAME_FIELD(control, control);
SAME_FIELD(device, device);
SAME_FIELD(slots_per_lane, slots_per_lane);
SAME_FIELD(stride, stride);
SAME_FIELD(lanes, lanes);
SAME_FIELD(spin_limit, spin_limit);
SAME_FIELD(reserved, reserved);
static_assert(VKGDR_D2H_RING_EMPTY != VKGDR_SUCCESS && VKGDR_D2H_RING_ENDED != VKGDR_SUCCESS,
              "the take statuses are not success");

// Every thread publishes its index; blocks it was lent go back with their tokens.
extern "C" __global__ void publish_and_release(vkgdr_d2h_view view, const unsigned long long* tokens)
{
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    const vkgdr_device::D2hLane lane = vkgdr_device::d2h_lane(view, blockIdx.x % view.lanes);
    vkgdr_device::d2h_publish_each(lane, 1u, &i, sizeof i);
    vkgdr_release_token(view, tokens[i]);
}

// The host side: the view a kernel takes, from the C API.
int view_for_kernel(vkgdr_d2h_ring_t ring, vkgdr_d2h_view* out)
{
    vkgdr_d2h_ring_device_view v;
    if (vkgdr_d2h_ring_get_device_view(ring, &v) != VKGDR_SUCCESS) {
        return 1;
    }
    std::memcpy(out, &v, sizeof v);
    return 0;
}
