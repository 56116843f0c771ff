//! gpu-alloc as an alternative allocator behind the same [`Pool`](super::Pool) API.
//!
//! gpu-alloc's [`MemoryDevice`] trait is the seam: it asks the driver to allocate, map, flush and
//! invalidate memory. [`ChunkDevice`] implements it over any [`ChunkSource`] (our exported,
//! CUDA-imported chunks on the GPU; Vulkan-only or host chunks elsewhere), so gpu-alloc's buddy and
//! free-list allocators carve the very same memory. The pool uses them when
//! [`PoolConfig::backend`](super::PoolConfig::backend) says so; benchmarks and differential tests
//! compare them with our own allocator core.

use std::ptr::NonNull;
use std::sync::Arc;

use std::sync::atomic::{AtomicU64, Ordering};

use crate::core::sync::lock::Mutex;
pub(crate) use gpu_alloc::MemoryBlock;
use gpu_alloc::{Config, DeviceProperties, GpuAllocator, Request, UsageFlags};
use gpu_alloc_types::{
    AllocationFlags, DeviceMapError, MappedMemoryRange, MemoryDevice, MemoryHeap,
    MemoryPropertyFlags, MemoryType, OutOfMemory,
};

use super::chunk::Chunk;
use crate::error::{Error, MemorySide, Result};
use crate::mapping::chunk::ChunkSource;

/// Which gpu-alloc strategy serves shared (non-dedicated) requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuAllocStrategy {
    /// gpu-alloc's buddy allocator (sizes rounded up to powers of two).
    Buddy,
    /// gpu-alloc's free-list allocator (used by gpu-alloc for transient memory).
    FreeList,
}

/// A [`MemoryDevice`] over a [`ChunkSource`]: every gpu-alloc "device memory object" is one of our
/// chunks, already mapped.
pub(crate) struct ChunkDevice<'a> {
    pub(crate) source: &'a dyn ChunkSource,
    pub(crate) atom: u64,
    /// The pool's reserved-bytes counter and limit, kept for gpu-alloc's chunks too.
    pub(crate) reserved: &'a AtomicU64,
    pub(crate) limit: u64,
    /// Set when an allocation failed on the pool's byte limit (gpu-alloc reports every
    /// failure as "out of device memory"; this tells the limit apart from the driver).
    pub(crate) limit_hit: std::cell::Cell<bool>,
}

impl MemoryDevice<Arc<Chunk>> for ChunkDevice<'_> {
    unsafe fn allocate_memory(
        &self,
        size: u64,
        _memory_type: u32,
        _flags: AllocationFlags,
    ) -> std::result::Result<Arc<Chunk>, OutOfMemory> {
        let limit = self.limit;
        self.reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                r.checked_add(size).filter(|&n| n <= limit)
            })
            .map_err(|_| {
                self.limit_hit.set(true);
                OutOfMemory::OutOfDeviceMemory
            })?;
        let chunk = self
            .source
            .allocate_chunk(size)
            .map_err(|e| {
                if e.is_out_of_memory() {
                    OutOfMemory::OutOfDeviceMemory
                } else {
                    OutOfMemory::OutOfHostMemory
                }
            })
            // A chunk shorter than asked for would put gpu-alloc's blocks past its end.
            .and_then(|memory| {
                if memory.size() < size {
                    return Err(OutOfMemory::OutOfHostMemory);
                }
                Chunk::new(memory, self.atom).map_err(|_| OutOfMemory::OutOfHostMemory)
            });
        if chunk.is_err() {
            self.reserved.fetch_sub(size, Ordering::AcqRel);
        }
        chunk
    }

    unsafe fn deallocate_memory(&self, memory: Arc<Chunk>) {
        self.reserved
            .fetch_sub(memory.memory.size(), Ordering::AcqRel);
        drop(memory);
    }

    unsafe fn map_memory(
        &self,
        memory: &mut Arc<Chunk>,
        offset: u64,
        _size: u64,
    ) -> std::result::Result<NonNull<u8>, DeviceMapError> {
        // Chunks are mapped for their whole life; "mapping" is pointer arithmetic.
        // SAFETY: gpu-alloc only maps ranges inside the memory object it allocated.
        NonNull::new(unsafe { memory.memory.host_ptr().add(offset as usize) })
            .ok_or(DeviceMapError::MapFailed)
    }

    unsafe fn unmap_memory(&self, _memory: &mut Arc<Chunk>) {}

    unsafe fn invalidate_memory_ranges(
        &self,
        ranges: &[MappedMemoryRange<'_, Arc<Chunk>>],
    ) -> std::result::Result<(), OutOfMemory> {
        each_range(ranges, |m, r| m.invalidate_ranges(r))
    }

    unsafe fn flush_memory_ranges(
        &self,
        ranges: &[MappedMemoryRange<'_, Arc<Chunk>>],
    ) -> std::result::Result<(), OutOfMemory> {
        each_range(ranges, |m, r| m.flush_ranges(r))
    }
}

/// Applies a flush or invalidate to each of gpu-alloc's ranges (one chunk each).
fn each_range(
    ranges: &[MappedMemoryRange<'_, Arc<Chunk>>],
    op: impl Fn(&dyn crate::mapping::chunk::ChunkMemory, &[(u64, u64)]) -> Result<()>,
) -> std::result::Result<(), OutOfMemory> {
    for r in ranges {
        op(&*r.memory.memory, &[(r.offset, r.size)]).map_err(|_| OutOfMemory::OutOfHostMemory)?;
    }
    Ok(())
}

/// gpu-alloc's allocator with the parameters that mirror a [`PoolConfig`](super::PoolConfig).
pub(crate) struct GpuAllocBackend {
    allocator: Mutex<GpuAllocator<Arc<Chunk>>>,
    strategy: GpuAllocStrategy,
}

impl GpuAllocBackend {
    pub(crate) fn new(
        strategy: GpuAllocStrategy,
        chunk_size: u64,
        max_chunk_size: u64,
        dedicated_threshold: u64,
        atom: u64,
        coherent: bool,
    ) -> Self {
        let mut props = MemoryPropertyFlags::DEVICE_LOCAL | MemoryPropertyFlags::HOST_VISIBLE;
        if coherent {
            props |= MemoryPropertyFlags::HOST_COHERENT;
        }
        let config = Config {
            dedicated_threshold,
            preferred_dedicated_threshold: dedicated_threshold,
            transient_dedicated_threshold: dedicated_threshold,
            starting_free_list_chunk: chunk_size,
            final_free_list_chunk: max_chunk_size,
            minimal_buddy_size: 16,
            initial_buddy_dedicated_size: chunk_size,
        };
        let device_props = DeviceProperties {
            memory_types: vec![MemoryType { heap: 0, props }].into(),
            // A huge heap so gpu-alloc's "heap / 32" dedicated rule never kicks in before ours.
            memory_heaps: vec![MemoryHeap { size: 1 << 50 }].into(),
            max_memory_allocation_count: u32::MAX,
            max_memory_allocation_size: 1 << 48,
            non_coherent_atom_size: atom,
            buffer_device_address: false,
        };
        GpuAllocBackend {
            allocator: Mutex::new(GpuAllocator::new(config, device_props)),
            strategy,
        }
    }

    pub(crate) fn alloc(
        &self,
        device: &ChunkDevice<'_>,
        size: u64,
        align: u64,
    ) -> Result<MemoryBlock<Arc<Chunk>>> {
        let mut usage = UsageFlags::HOST_ACCESS | UsageFlags::UPLOAD;
        if self.strategy == GpuAllocStrategy::FreeList {
            usage |= UsageFlags::TRANSIENT;
        }
        let request = Request {
            size,
            align_mask: align - 1,
            usage,
            memory_types: 1,
        };
        // SAFETY: the same device (same source and atom) is used for every call on this allocator.
        unsafe { self.allocator.lock().alloc(device, request) }.map_err(|e| match e {
            gpu_alloc::AllocationError::OutOfDeviceMemory if device.limit_hit.get() => {
                Error::OutOfDeviceMemory {
                    side: MemorySide::Limit,
                    call: "Pool::alloc",
                    size,
                    result: format!("pool limit {} bytes", device.limit),
                }
            }
            gpu_alloc::AllocationError::OutOfDeviceMemory => Error::OutOfDeviceMemory {
                side: MemorySide::Vulkan,
                call: "gpu_alloc::GpuAllocator::alloc",
                size,
                result: "OutOfDeviceMemory".into(),
            },
            // Requests were validated before; the source's own failures reach gpu-alloc only as
            // "out of host memory".
            e => Error::internal(format!("gpu-alloc: {e}")),
        })
    }

    pub(crate) fn free(&self, device: &ChunkDevice<'_>, block: MemoryBlock<Arc<Chunk>>) {
        // SAFETY: the block came from this allocator with the same device.
        unsafe { self.allocator.lock().dealloc(device, block) };
    }

    pub(crate) fn cleanup(&self, device: &ChunkDevice<'_>) {
        // SAFETY: as above.
        unsafe { self.allocator.lock().cleanup(device) };
    }
}
