//! Where a pool's chunks come from: the seam between the pool and the drivers.
//!
//! [`ChunkSource`] is the only thing the pool asks of the mapping layer: allocate a mapped chunk,
//! flush or invalidate ranges of it. A [`Gpu`](crate::Gpu) provides CUDA-imported chunks with
//! device pointers (`memory.rs`, beside [`RawMemory`](crate::RawMemory)), an
//! [`ArenaSource`](crate::arena::ArenaSource) the chunks of one contiguous CUDA VMM range
//! (`arena.rs`). Here: an `Arc<`[`VulkanContext`](crate::vulkan::VulkanContext)`>` provides
//! Vulkan-only chunks (CI runs the pool on lavapipe through them; the driver layer knows no
//! chunks, so the implementation lives with the trait), and [`HostMemorySource`] plain host memory
//! for allocator benchmarks and tests.

use std::alloc::Layout;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::core::handle::SendSyncPtr;
use crate::driver::vulkan::{VulkanContext, VulkanMemory};
use crate::error::{Error, InvalidArgument, MemorySide, Result};
use crate::mapping::gpu::Gpu;

/// A mapped chunk of memory owned by a pool. Freed when dropped.
///
/// # Safety
///
/// The pool carves blocks out of `[host_ptr(), host_ptr() + size())` and hands them to safe code,
/// which writes and reads them through [`Mapping`](crate::Mapping). An implementation promises:
/// - `host_ptr()` is non-null and valid for reads and writes of `size()` bytes from the moment
///   the chunk is returned by [`ChunkSource::allocate_chunk`] until it is dropped, and the range
///   does not wrap around the address space;
/// - `host_ptr()`, `size()` and `device_ptr()` return the same values on every call;
/// - nothing but the chunk's owner touches those bytes while the chunk lives: no other chunk, no
///   Rust reference, no other code of the implementation (the device and the calls below
///   excepted); `flush_ranges` and `invalidate_ranges` only make the device's and the CPU's views
///   agree, and `read_dma` writes nothing but `dst`;
/// - dropping the chunk is the only thing that unmaps the memory.
pub unsafe trait ChunkMemory: Send + Sync {
    /// Base of the host mapping.
    fn host_ptr(&self) -> *mut u8;
    /// Device address of the base, if the chunk is imported into CUDA.
    fn device_ptr(&self) -> Option<u64>;
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Flushes the given in-bounds `(offset, len)` ranges in one driver call (no-op if coherent).
    fn flush_ranges(&self, ranges: &[(u64, u64)]) -> Result<()>;
    /// Invalidates the given in-bounds ranges in one driver call (no-op if coherent).
    fn invalidate_ranges(&self, ranges: &[(u64, u64)]) -> Result<()>;
    /// Reads `[offset, offset + dst.len())` with a DMA engine when the chunk has one and the read
    /// is large enough to gain from it; `None` means "use CPU loads" (the default: no engine).
    ///
    /// The caller has bounds-checked the range and pushed pending CPU writes in it to the device.
    fn read_dma(&self, _offset: u64, _dst: &mut [u8]) -> Option<Result<()>> {
        None
    }
    /// A new opaque fd of the chunk's memory and the size of the allocation behind it, for
    /// another process to import (the [`share`](crate::share) layer); `None` (the default) for
    /// memory that cannot be exported (plain host memory, an arena's chunks).
    fn export_fd(&self) -> Option<Result<(OwnedFd, u64)>> {
        None
    }

    /// Lets kernels on `peer`, another GPU, read and write the whole chunk through its device
    /// address ([`RawMemory::grant_peer_access`](crate::RawMemory::grant_peer_access) for the
    /// chunks a [`Gpu`] allocates). The default: [`Error::Unsupported`], for chunks that cannot be
    /// shared so (Vulkan-only and host chunks, an arena's).
    fn grant_peer_access(&self, _peer: &Gpu) -> Result<()> {
        Err(Error::Unsupported(
            "this pool's chunks cannot be shared with another GPU (chunks a Gpu allocates can)"
                .into(),
        ))
    }
}

/// A provider of chunks for a [`Pool`](crate::Pool).
///
/// # Safety
///
/// An implementation promises:
/// - every chunk [`allocate_chunk`](Self::allocate_chunk) returns is at least `size` bytes long
///   and overlaps no other live chunk of any source (the pool checks the size too, and refuses a
///   short chunk with [`Error::Internal`]);
/// - [`atom_size`](Self::atom_size) is a non-zero power of two, the same on every call (checked
///   by [`Pool::new`](crate::Pool::new) too).
///
/// The chunks themselves carry [`ChunkMemory`]'s obligations.
pub unsafe trait ChunkSource: Send + Sync {
    /// Allocates a chunk of at least `size` bytes. Out of memory must be reported as
    /// [`Error::OutOfDeviceMemory`].
    fn allocate_chunk(&self, size: u64) -> Result<Box<dyn ChunkMemory>>;
    /// `nonCoherentAtomSize` of the memory.
    fn atom_size(&self) -> u64;
    /// Whether writes must be flushed and reads invalidated.
    fn is_non_coherent(&self) -> bool;
    /// `(base, len)` of one device address range every chunk of this source lies in, for sources
    /// that guarantee one (an arena); `None` (the default) where chunks are separate.
    fn device_range(&self) -> Option<(u64, u64)> {
        None
    }
}

/// Plain host memory (64 KiB-aligned) as a chunk source: for allocator benchmarks and tests that
/// should not depend on a driver. Flushes are no-ops.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostMemorySource;

/// `Send + Sync` by its fields: it exclusively owns its heap allocation, and `&self` only hands
/// out the base pointer (access discipline is the pool's).
struct HostChunk {
    ptr: SendSyncPtr<u8>,
    layout: Layout,
}

// SAFETY: the chunk exclusively owns a live heap allocation of `layout.size()` bytes at `ptr`
// (never null, freed only in Drop); its methods touch none of the bytes.
unsafe impl ChunkMemory for HostChunk {
    fn host_ptr(&self) -> *mut u8 {
        self.ptr.get()
    }
    fn device_ptr(&self) -> Option<u64> {
        None
    }
    fn size(&self) -> u64 {
        self.layout.size() as u64
    }
    fn flush_ranges(&self, _: &[(u64, u64)]) -> Result<()> {
        Ok(())
    }
    fn invalidate_ranges(&self, _: &[(u64, u64)]) -> Result<()> {
        Ok(())
    }
}

impl Drop for HostChunk {
    fn drop(&mut self) {
        // SAFETY: allocated in `allocate_chunk` with exactly this layout.
        unsafe { std::alloc::dealloc(self.ptr.get(), self.layout) };
    }
}

// SAFETY: each chunk is a fresh heap allocation of exactly `size` bytes (so no two overlap); the
// atom is the constant 64.
unsafe impl ChunkSource for HostMemorySource {
    fn allocate_chunk(&self, size: u64) -> Result<Box<dyn ChunkMemory>> {
        let layout = usize::try_from(size)
            .ok()
            .and_then(|s| Layout::from_size_align(s, 64 << 10).ok())
            .filter(|l| l.size() > 0)
            .ok_or(InvalidArgument::HostChunkSize { size })?;
        // SAFETY: the layout has a non-zero size (checked above).
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).ok_or(Error::OutOfDeviceMemory {
            side: MemorySide::Limit,
            call: "alloc_zeroed",
            size,
            result: "host allocation failed".into(),
        })?;
        Ok(Box::new(HostChunk {
            ptr: ptr.into(),
            layout,
        }))
    }
    fn atom_size(&self) -> u64 {
        64
    }
    fn is_non_coherent(&self) -> bool {
        false
    }
}

/// Vulkan-only chunks (no device pointer): CI runs the pool on lavapipe through them.
// SAFETY: the mapping covers the whole allocation (`size` bytes, mapped once in `allocate`,
// unmapped only in Drop); each allocation is its own VkDeviceMemory, so no two overlap, and
// flush/invalidate only run the driver's cache maintenance on in-bounds ranges.
unsafe impl ChunkMemory for VulkanMemory {
    fn host_ptr(&self) -> *mut u8 {
        self.as_ptr()
    }
    fn device_ptr(&self) -> Option<u64> {
        None
    }
    fn size(&self) -> u64 {
        VulkanMemory::size(self)
    }
    fn flush_ranges(&self, ranges: &[(u64, u64)]) -> Result<()> {
        VulkanMemory::flush_ranges(self, ranges.iter().copied())
    }
    fn invalidate_ranges(&self, ranges: &[(u64, u64)]) -> Result<()> {
        VulkanMemory::invalidate_ranges(self, ranges.iter().copied())
    }
    fn export_fd(&self) -> Option<Result<(OwnedFd, u64)>> {
        Some(VulkanMemory::export_fd(self).map(|fd| (fd, VulkanMemory::size(self))))
    }
}

// SAFETY: `allocate` returns a fresh allocation of `size` rounded up to 4 KiB (at least `size`
// bytes); the atom is the device's nonCoherentAtomSize, a power of two by the Vulkan spec.
unsafe impl ChunkSource for Arc<VulkanContext> {
    fn allocate_chunk(&self, size: u64) -> Result<Box<dyn ChunkMemory>> {
        Ok(Box::new(self.allocate(size)?))
    }
    fn atom_size(&self) -> u64 {
        VulkanContext::atom_size(self)
    }
    fn is_non_coherent(&self) -> bool {
        VulkanContext::is_non_coherent(self)
    }
}
