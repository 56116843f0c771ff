//! Pinned host buffers, one kind for each direction the bytes travel. All three are page-locked
//! host memory the copy engine reaches by DMA; they differ in who writes them and in how they are
//! freed:
//!
//! | kind | written by | read by | memory | where |
//! |:---|:---|:---|:---|:---|
//! | staged-read sets | the copy engine | the CPU, copying out | Vulkan host memory mapped through VMM (freed without waiting), `cuMemHostAlloc` without VMM | `read_staging` |
//! | copy sources | the CPU | the copy engine | `cuMemHostAlloc` (read fresh on every copy), kept per [`Gpu`](crate::Gpu) and never freed under a kernel | `copy_sources` |
//! | [`PinnedBuffer`](crate::cuda_objects::PinnedBuffer) | the GPU | the CPU | as the staged-read sets | `cuda_objects` (public) |
//!
//! The first two are caches a [`Gpu`](crate::Gpu) keeps for its own copies (its copies are in
//! `mapping/gpu/copies.rs`); the third is for users, and a CUDA object among the others.

pub(crate) mod copy_sources;
pub(crate) mod read_staging;
