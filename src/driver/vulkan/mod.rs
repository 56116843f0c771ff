//! The Vulkan half: instance, physical device, exportable host-visible device-local memory.
//!
//! This layer knows nothing of CUDA, so it runs (and is tested) on any Vulkan driver with
//! `VK_KHR_external_memory_fd` and a `DEVICE_LOCAL | HOST_VISIBLE` memory type — Mesa's lavapipe on
//! CI, the NVIDIA driver on the GPU machine. The loader is found at run time (`ash::Entry::load`,
//! or the file `VKGDR_VULKAN_LIBRARY` names); a machine without it gets
//! [`Error::LibraryNotFound`](crate::Error::LibraryNotFound).

mod device;
mod instance;

/// Device UUIDs, as Vulkan matches them to CUDA devices.
pub use crate::driver::uuid::{format_uuid, parse_uuid};
pub use device::{VulkanContext, VulkanMemory};
pub use instance::{
    enumerate_devices, result_name, DeviceSelector, MemoryHeapInfo, MemoryOptions, MemoryTypeInfo,
    PhysicalDeviceInfo, NVIDIA_VENDOR_ID,
};
