//! Know before it fails: what this machine offers vkgdr, and — when something is missing — what it
//! is and how to fix it. `vkgdr info` prints both.
//!
//! Two halves, so the logic is tested on any machine:
//! - [`Machine::probe`] gathers a description: the Vulkan devices (or why there are none), the
//!   CUDA devices with their VMM support and BAR figures, NVML, the Vulkan ICD manifests on disk
//!   and the container's NVIDIA driver capabilities. It never fails: every missing piece is part
//!   of the description.
//! - [`diagnose`] is a pure function from that description to [`Finding`]s, each naming the
//!   problem and its fix. Tests feed it machines that CI cannot be (a CUDA device without its
//!   Vulkan twin, a 256 MiB BAR, no VMM).
//!
//! The problems it names, with the one CI can make happen for real in brackets:
//! no Vulkan loader [`VKGDR_VULKAN_LIBRARY` naming a missing file]; a loader but no NVIDIA Vulkan
//! device, because the ICD manifest is missing or a container lacks the `graphics` capability
//! [lavapipe alone; `VK_DRIVER_FILES` naming a missing manifest]; no CUDA driver [CI has none;
//! `VKGDR_CUDA_LIBRARY`]; CUDA devices without a Vulkan device of the same UUID; no
//! `DEVICE_LOCAL | HOST_VISIBLE` memory type, or a small one (resizable BAR off); no
//! `VK_KHR_external_memory_fd`; no CUDA VMM; no NVML.

mod findings;
mod probe;
#[cfg(test)]
mod tests;

pub use findings::{diagnose, Finding, Problem, Severity, SMALL_BAR};
pub use probe::{CudaDeviceInfo, CudaProbe, Environment, Machine, NvmlProbe, VulkanProbe};
