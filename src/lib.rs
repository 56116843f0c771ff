//! # vkgdr — CPU access to NVIDIA GPU memory through the BAR, without a kernel module
//!
//! The GPU's memory is allocated through Vulkan as `DEVICE_LOCAL | HOST_VISIBLE`, exported as an
//! opaque fd and imported into CUDA, so the same bytes have a host pointer (CPU stores land in GPU
//! memory in ~0.1 µs) and a `CUdeviceptr` kernels use. On top: a pool for many tiny buffers, ring
//! buffers that stream records to running kernels, fast copy routines.
//!
//! Layers, bottom up: [`cuda`] (driver symbols loaded at run time) and [`vulkan`] (instance,
//! device, exportable memory) → [`Gpu`] and [`RawMemory`] (the mapping layer) → [`alloc`] (pure
//! allocator core) and [`dirty`] (pure range tracker) → [`Pool`] → [`ring`]. The pool meets the
//! drivers only through [`chunk`] (the `ChunkSource` seam, which imports no driver: each source
//! is implemented beside its type); [`range`]'s pure bounds and atom arithmetic serves them all.
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

pub mod alloc;
pub mod arena;
pub mod bar;
mod batch;
mod carve;
pub mod chunk;
pub mod compat;
pub mod copy;
pub mod cuda;
pub mod cuda_objects;
#[cfg(feature = "cudarc")]
pub mod cudarc;
pub mod diagnose;
pub mod dirty;
pub mod dynlib;
mod error;
#[cfg(feature = "failpoints")]
pub mod failpoint;
#[cfg(not(feature = "failpoints"))]
mod failpoint;
mod gpu;
mod handle;
mod isolation;
mod mapping;
pub mod memory;
pub mod nvml;
pub mod pool;
pub mod range;
mod release;
pub mod ring;
mod staging;
mod sync;
pub mod vmm;
pub mod vulkan;

pub use arena::Arena;
pub use bar::BarInfo;
pub use batch::WriteBatch;
pub use error::{Error, MemorySide, Result};
pub use gpu::{AllocationReport, Gpu, OpenOptions};
pub use mapping::Mapping;
pub use memory::RawMemory;
#[cfg(feature = "gpu-alloc")]
pub use pool::GpuAllocStrategy;
pub use pool::{Backend, Block, Pool, PoolConfig, PoolStats};

/// The README's examples, compiled as doc tests so they cannot rot.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
