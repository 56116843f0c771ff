// vkgdr.h from C++: it compiles, its declarations have C linkage, and the enum keeps vkgdr 0.1's
// typedef name.
#include "vkgdr.h"

#include <cstdio>
#include <cstdlib>
#include <type_traits>

static_assert(std::is_same<decltype(&vkgdr_open), vkgdr_t (*)(CUdevice, uint32_t)>::value,
              "vkgdr_open keeps vkgdr 0.1's signature");
static_assert(std::is_same<decltype(vkgdr_memory_get_device_ptr(nullptr)), CUdeviceptr>::value,
              "device pointers are CUDA's CUdeviceptr");
static_assert(VKGDR_OPEN_REQUIRE_COHERENT_BIT == 4, "vkgdr 0.1's flag values");

int main()
{
    vkgdr_open_flags flags = VKGDR_OPEN_FORCE_NON_COHERENT_BIT;
    vkgdr_pool_config config;
    if (vkgdr_pool_config_init(&config, sizeof config) != VKGDR_SUCCESS || flags != 2) {
        return 1;
    }
    vkgdr_close(nullptr);
    char* err = vkgdr_last_error();
    std::printf("header_cxx: %d passed, %d failed\n", err == nullptr ? 1 : 0, err == nullptr ? 0 : 1);
    std::free(err);
    return err == nullptr ? 0 : 1;
}
