//! # vkgdr — CPU access to NVIDIA GPU memory through the BAR, without a kernel module
//!
//! The GPU's memory is allocated through Vulkan as `DEVICE_LOCAL | HOST_VISIBLE`, exported as an
//! opaque fd and imported into CUDA, so the same bytes have a host pointer (CPU stores land in GPU
//! memory in ~0.1 µs) and a `CUdeviceptr` kernels use. On top: a pool for many tiny buffers, ring
//! buffers that stream records to running kernels, fast copy routines.
//!
//! Layers, bottom up (ARCHITECTURE.md in the repository walks through them): the pure core —
//! [`alloc`], [`dirty`], [`range`] and the rings' protocol [`ring::core`] — with no driver and no
//! FFI; [`copy`], the fast CPU copies; the crate's [`Error`]; the drivers [`cuda`], [`vulkan`] and
//! [`nvml`], loaded at run time; the mapping layer ([`Gpu`], [`RawMemory`], [`Mapping`],
//! [`Arena`], [`chunk`]); then [`Pool`], [`ring`], [`diagnose`]; [`share`], which shares memory,
//! pool blocks and ring lanes with other processes; and the interop faces [`compat`] and `cudarc`. Each layer imports only those below it; the pool meets the drivers only through
//! [`chunk::ChunkSource`].
//!
//! ```no_run
//! use vkgdr::{Gpu, Mapping};
//! # fn main() -> vkgdr::Result<()> {
//! let gpu = Gpu::open(0)?;
//! let mut mem = gpu.alloc(64 << 10)?;
//! mem.write(0, &42u64.to_le_bytes())?; // lands in GPU memory; pass mem.device_ptr() to a kernel
//! # Ok(()) }
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, clippy::undocumented_unsafe_blocks)]

// The crate's layers, bottom up (ARCHITECTURE.md): each imports only those below it.
pub mod copy;
mod core;
pub mod diagnose;
mod driver;
mod error;
mod interop;
mod mapping;
pub mod pool;
pub mod ring;
pub mod share;

// The modules keep the public paths they had before the crate was grouped into layers.
pub use crate::core::{alloc, dirty, range};
#[cfg(feature = "failpoints")]
pub use driver::failpoint;
pub use driver::{cuda, dynlib, nvml, vulkan};
pub use interop::compat;
#[cfg(feature = "cudarc")]
pub use interop::cudarc;
pub use mapping::{arena, bar, chunk, cuda_objects, memory, retained, vmm};

pub use error::{Error, InvalidArgument, MemorySide, Result};
pub use mapping::arena::Arena;
pub use mapping::bar::BarInfo;
pub use mapping::batch::WriteBatch;
pub use mapping::gpu::{AllocationReport, Gpu, OpenOptions};
pub use mapping::memory::RawMemory;
pub use mapping::release::{ReleaseTimes, SlowRelease};
pub use mapping::retained::{Retained, RetainedItem, RetainedKind};
pub use mapping::spare::SpareLimits;
pub use mapping::Mapping;
#[cfg(feature = "gpu-alloc")]
pub use pool::GpuAllocStrategy;
pub use pool::{Backend, Block, Pool, PoolConfig, PoolStats};

/// The README's examples, compiled as doc tests so they cannot rot.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// docs/SHARING.md's examples, compiled as doc tests.
#[doc = include_str!("../docs/SHARING.md")]
#[cfg(doctest)]
pub struct SharingDoctests;

/// docs/DEVICE_TO_HOST.md's examples, compiled as doc tests.
#[doc = include_str!("../docs/DEVICE_TO_HOST.md")]
#[cfg(doctest)]
pub struct DeviceToHostDoctests;
