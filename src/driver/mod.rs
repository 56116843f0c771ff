//! The drivers, loaded at run time: the CUDA driver API ([`cuda`]), Vulkan ([`vulkan`]) and NVML
//! ([`nvml`]), found through [`dynlib`]; with what every driver call that sets memory up shares:
//! failure injection for tests (`failpoint`) and keeping mappings and fds out of forked and
//! `exec`'d children (`isolation`), and the device UUIDs the three drivers share (`uuid`).
//!
//! Nothing here knows of mappings, pools or rings: this layer wraps driver calls, checks their
//! results and names them in the crate's [`Error`](crate::Error).

pub mod cuda;
pub mod dynlib;
pub mod failpoint;
pub(crate) mod isolation;
pub(crate) use isolation::errno_text;
pub mod nvml;
pub(crate) mod uuid;
pub mod vulkan;
