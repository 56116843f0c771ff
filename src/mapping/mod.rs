//! The mapping layer: GPU memory with a host pointer and a device pointer to the same bytes.
//!
//! [`Gpu`](gpu::Gpu) opens a CUDA device with its matching Vulkan device (its copies through the
//! copy engine in `gpu/copies.rs`); `vmm` maps Vulkan allocations into the device's address
//! space, `carve` cuts small allocations out of shared granules, `release` gives memory back once
//! the GPU work queued before its free has completed, `pinned` holds the pinned host buffers a
//! `Gpu` keeps for its copies (the staged-read sets, the buffers copies read from);
//! [`RawMemory`](memory::RawMemory) is one
//! allocation, [`Arena`](arena::Arena) a growable contiguous range, [`chunk`] the seam the pool
//! draws its chunks through, [`bar`] the BAR figures, `batch` many writes with one fence,
//! [`cuda_objects`] the CUDA objects (streams, events, modules) the layers above use and
//! [`retained`] what a `Gpu` holds between allocations, by name.
//!
//! [`Mapping`], here: safe, bounds-checked access to any CPU-mapped range of device memory.
//! Raw allocations, Vulkan-only allocations and pool blocks all implement it, so they share one
//! well-tested implementation of writes (with flushes on non-coherent memory) and reads (with
//! invalidates first, streaming loads for speed).

pub mod arena;
pub mod bar;
pub(crate) mod batch;
pub(crate) mod carve;
pub mod chunk;
pub mod cuda_objects;
pub(crate) mod gpu;
pub mod memory;
pub(crate) mod pinned;
pub(crate) mod release;
pub mod retained;
pub(crate) mod spare;
pub mod vmm;

use crate::core::range::check_range;
use crate::driver::vulkan::VulkanMemory;
use crate::error::{Error, InvalidArgument, Result};

/// A CPU mapping of device memory with safe, bounds-checked access.
///
/// Writing takes `&mut self`, so safe code can never race two writers on the same bytes; a
/// running kernel may still read or write the memory concurrently — synchronising with it (events,
/// flags, the [`ring`](crate::ring)) is the caller's protocol.
///
/// # Safety
///
/// The provided methods write and read through [`host_ptr`](Self::host_ptr) after checking
/// offsets against [`len`](Self::len) only, so an implementation promises:
/// - `host_ptr()` is valid for reads and writes of `len()` bytes for as long as the value lives,
///   and the range does not wrap around the address space;
/// - `host_ptr()` and `len()` return the same values on every call;
/// - nothing else touches those bytes while the value lives (no Rust reference to them, no other
///   value's mapping over them), and no `&self` method of the implementation writes them, so
///   `&mut self` really is exclusive access (the device excepted: that is the caller's protocol);
/// - methods it overrides keep the provided ones' bounds checks.
pub unsafe trait Mapping {
    /// Base of the host mapping.
    fn host_ptr(&self) -> *mut u8;
    /// Length in bytes.
    fn len(&self) -> u64;
    /// Whether the mapping is empty (never true for allocations, which reject zero sizes).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Makes CPU writes in `[offset, offset+len)` visible to the device. The implementor decides
    /// whether to flush at once or record the range for a batched flush later.
    fn after_write(&mut self, offset: u64, len: u64) -> Result<()>;
    /// Makes device writes in `[offset, offset+len)` visible to the CPU before a read.
    fn before_read(&self, offset: u64, len: u64) -> Result<()>;

    /// Copies `src` to `offset` (bounds-checked, flushed or recorded as dirty as needed) and
    /// fences (`sfence`), so a flag stored afterwards cannot overtake the data.
    ///
    /// Short copies run on the calling thread and never start a thread; copies of at least
    /// [`DEFAULT_PARALLEL_THRESHOLD`](crate::copy::DEFAULT_PARALLEL_THRESHOLD) bytes are split over
    /// the global [`CopyPool`](crate::copy::CopyPool)'s threads (eight write about three times what
    /// one does; figures: BENCHMARKS.md, 'CPU copies through the BAR'). To write many small pieces
    /// with one fence, use a [`WriteBatch`](crate::WriteBatch).
    fn write(&mut self, offset: u64, src: &[u8]) -> Result<()> {
        // SAFETY: the mapping is valid for `len()` bytes while `self` is borrowed (the trait's
        // contract), and `&mut self` excludes other safe writers and readers.
        unsafe { store(self.host_ptr(), self.len(), offset, src) }?;
        self.after_write(offset, src.len() as u64)
    }

    /// Copies `dst.len()` bytes from `offset` into `dst` (bounds-checked, invalidated first).
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        read_with_cpu(self, offset, dst)
    }

    /// Fills `[offset, offset+len)` with `byte`.
    fn fill(&mut self, offset: u64, len: u64, byte: u8) -> Result<()> {
        check_range(offset, len, self.len())?;
        // SAFETY: in bounds (checked), exclusive through `&mut self`.
        unsafe { std::ptr::write_bytes(self.host_ptr().add(offset as usize), byte, len as usize) };
        self.after_write(offset, len)
    }

    /// Writes a slice of plain-old-data values at `offset` (which must suit `T`'s alignment).
    fn write_pod<T: bytemuck::Pod>(&mut self, offset: u64, values: &[T]) -> Result<()> {
        check_pod_offset::<T>(self.host_ptr(), offset)?;
        self.write(offset, bytemuck::cast_slice(values))
    }

    /// Reads plain-old-data values from `offset` into `out`.
    fn read_pod<T: bytemuck::Pod>(&self, offset: u64, out: &mut [T]) -> Result<()> {
        check_pod_offset::<T>(self.host_ptr(), offset)?;
        self.read(offset, bytemuck::cast_slice_mut(out))
    }

    /// Reads `len` bytes into a new vector. The range is checked before anything is allocated,
    /// and a vector the host cannot allocate is [`Error::OutOfHostMemory`], not an abort.
    fn read_vec(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        check_range(offset, len as u64, self.len())?;
        let mut v =
            crate::copy::try_zeroed_vec(len).ok_or(Error::OutOfHostMemory { size: len as u64 })?;
        self.read(offset, &mut v)?;
        Ok(v)
    }
}

/// Vulkan-only allocations (no CUDA import), flushed after each write and invalidated before
/// each read.
// SAFETY: `as_ptr` is the mapping of the whole `size`-byte allocation, alive as long as `self`;
// `&self` methods never write it.
unsafe impl Mapping for VulkanMemory {
    fn host_ptr(&self) -> *mut u8 {
        self.as_ptr()
    }
    fn len(&self) -> u64 {
        self.size()
    }
    fn after_write(&mut self, offset: u64, len: u64) -> Result<()> {
        self.flush(offset, len)
    }
    fn before_read(&self, offset: u64, len: u64) -> Result<()> {
        self.invalidate(offset, len)
    }
}

/// The CPU half of every safe write: the bounds check against the mapping's `len`, then the
/// copy of [`Mapping::write`] (inline when short, split over the global copy pool when long),
/// fenced. [`Mapping::write`] and the writes through a shared reference
/// ([`RawMemory::write_shared`](memory::RawMemory::write_shared),
/// [`Block::write_shared`](crate::Block::write_shared)) all store through it.
///
/// # Safety
/// - `base` is valid for writes of `len` bytes, and no other thread reads or writes
///   `[offset, offset + src.len())` of it during the call (nor does `src` overlap it).
pub(crate) unsafe fn store(base: *mut u8, len: u64, offset: u64, src: &[u8]) -> Result<()> {
    check_range(offset, src.len() as u64, len)?;
    // SAFETY: the range lies inside the `len` valid bytes (checked above) and is the caller's
    // alone for the call.
    unsafe { crate::copy::write_default(base.add(offset as usize), src) };
    Ok(())
}

/// The CPU read path: bounds check, invalidate, streaming loads (split over the global copy
/// pool's threads when long). Implementations that override [`Mapping::read`] with a DMA path
/// fall back to it for small reads.
pub(crate) fn read_with_cpu<M: Mapping + ?Sized>(m: &M, offset: u64, dst: &mut [u8]) -> Result<()> {
    check_range(offset, dst.len() as u64, m.len())?;
    m.before_read(offset, dst.len() as u64)?;
    // SAFETY: the range lies inside the mapping (checked above) and `dst` is a distinct host
    // buffer (it is a `&mut` borrow, so it cannot alias the mapping through safe code).
    unsafe { crate::copy::read_default(dst, m.host_ptr().add(offset as usize)) };
    Ok(())
}

pub(crate) fn check_pod_offset<T>(base: *mut u8, offset: u64) -> Result<()> {
    let addr = (base as u64).wrapping_add(offset);
    if !addr.is_multiple_of(std::mem::align_of::<T>() as u64) {
        return Err(InvalidArgument::MisalignedOffset {
            offset,
            type_name: std::any::type_name::<T>(),
            align: std::mem::align_of::<T>() as u64,
        }
        .into());
    }
    Ok(())
}
