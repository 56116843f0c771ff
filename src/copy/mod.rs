//! Fast copies into and out of a CPU mapping of GPU memory (the PCIe BAR).
//!
//! The mapping is write-combined (WC) on NVIDIA's driver, which shapes both directions:
//!
//! * **Writes** ([`copy_to_mapping`]) are fast as long as whole aligned lines are stored; the
//!   kernels store naturally aligned pieces up to the vector width, then full-width
//!   non-temporal stores (AVX-512: one 64-byte WC line per instruction), and end with `sfence`
//!   so the data has left the WC buffers before the caller publishes a "ready" flag.
//! * **Reads** ([`copy_from_mapping`]) are uncached: a plain load is a full PCIe round trip
//!   (about 0.03 GB/s). Streaming loads (`movntdqa`) fetch a whole line into a streaming-load
//!   buffer and serve the rest of the line from it, an order of magnitude faster, so the bulk
//!   uses them, four blocks in flight per loop iteration (figures: BENCHMARKS.md, 'CPU copies
//!   through the BAR').
//!
//! The instruction set is picked at run time ([`simd_level`], detected once and cached). Every
//! kernel touches each byte of the mapping range exactly once, with naturally aligned accesses
//! only, and never a byte outside the range — not even inside the same aligned block, so the
//! functions are also sound on ordinary host memory of any length and alignment.
//!
//! Large copies can be spread over a persistent [`CopyPool`] of worker threads: eight threads
//! write about three times what one writes into the BAR; reads scale per thread as well
//! (figures: BENCHMARKS.md, 'CPU copies through the BAR').
//!
//! On targets other than x86_64 the portable kernel (aligned 8-byte volatile accesses) is used,
//! followed (writes) or preceded (reads) by `fence(SeqCst)`. It is the same kernel that
//! [`SimdLevel::Scalar`] selects on x86_64, so it is tested everywhere.

mod error;
mod kernels;
mod pool;
mod simd;
#[cfg(test)]
mod tests;
mod warm;

use error::check_lengths;
pub use error::CopyError;
pub use simd::{simd_level, SimdLevel};
pub(crate) use warm::warm_up;

pub use pool::{
    CopyPool, DEFAULT_PARALLEL_THRESHOLD, DEFAULT_PART_SIZE, MAX_PARTS_PER_THREAD, MAX_THREADS,
    THREADS_ENV,
};

/// Copies `src` into a CPU mapping of device memory at `dst`, then fences (`sfence`), so that a
/// store the caller makes afterwards (a "ready" flag) cannot overtake the data.
///
/// Uses the kernel of [`simd_level`]. Each byte of `[dst, dst + src.len())` is stored exactly
/// once with a naturally aligned store; no byte outside that range is touched.
///
/// # Safety
///
/// * `dst` is valid for writes of `src.len()` bytes (any pointer when `src` is empty);
/// * `[dst, dst + src.len())` does not overlap `src`;
/// * no other thread reads or writes that range during the call (device accesses are the
///   caller's protocol, as with any shared memory).
///
/// ```
/// let src = [7u8; 100];
/// let mut mapping = vec![0u8; 128]; // stands in for a device mapping
/// // SAFETY: `mapping[3..103]` is valid, distinct from `src` and not shared.
/// unsafe { vkgdr::copy::copy_to_mapping(mapping.as_mut_ptr().add(3), &src) };
/// assert_eq!(&mapping[3..103], &src[..]);
/// assert_eq!(mapping[103], 0);
/// ```
pub unsafe fn copy_to_mapping(dst: *mut u8, src: &[u8]) {
    // SAFETY: the pointer obligations are the caller's; `simd_level` only returns supported
    // levels.
    unsafe { kernels::write(simd_level(), dst, src.as_ptr(), src.len(), true) }
}

/// [`copy_to_mapping`] without the closing `sfence`: for writers that issue one fence after
/// several copies (the ring's producers fence once, when they publish).
///
/// # Safety
///
/// As for [`copy_to_mapping`]; in addition the caller must `sfence` (or otherwise order the
/// stores) before any store that tells another agent the data is ready.
pub unsafe fn copy_to_mapping_unfenced(dst: *mut u8, src: &[u8]) {
    // SAFETY: as in `copy_to_mapping`; the fence is the caller's obligation.
    unsafe { kernels::write(simd_level(), dst, src.as_ptr(), src.len(), false) }
}

/// A write kernel picked once: [`copy_to_mapping_unfenced`] without looking up [`simd_level`]
/// and choosing the kernel on every call, for writers of many small pieces (a ring's sink keeps
/// one for its life and writes each record through it).
///
/// ```
/// use vkgdr::copy::{simd_level, WriteKernel};
/// let kernel = WriteKernel::detected();
/// assert_eq!(kernel.level(), simd_level());
/// let mut mapping = vec![0u8; 64]; // stands in for a device mapping
/// // SAFETY: `mapping[8..40]` is valid, distinct from the source and not shared; the fence the
/// // kernel leaves out is not needed for host memory read by this thread.
/// unsafe { kernel.write_unfenced(mapping.as_mut_ptr().add(8), &[9u8; 32]) };
/// assert_eq!(&mapping[8..40], &[9u8; 32]);
/// ```
#[derive(Clone, Copy)]
pub struct WriteKernel {
    level: SimdLevel,
    write: kernels::WriteFn,
}

impl WriteKernel {
    /// The kernel of [`simd_level`] (the one [`copy_to_mapping`] uses).
    pub fn detected() -> Self {
        let level = simd_level();
        WriteKernel {
            level,
            write: kernels::write_fn(level),
        }
    }

    /// The kernel of `level`.
    ///
    /// # Errors
    ///
    /// [`CopyError::Unsupported`] if the CPU lacks `level`.
    pub fn new(level: SimdLevel) -> Result<Self, CopyError> {
        if !level.is_supported() {
            return Err(CopyError::Unsupported(level));
        }
        Ok(WriteKernel {
            level,
            write: kernels::write_fn(level),
        })
    }

    /// The instruction set this kernel uses.
    pub fn level(&self) -> SimdLevel {
        self.level
    }

    /// [`copy_to_mapping_unfenced`] with this kernel.
    ///
    /// # Safety
    ///
    /// As for [`copy_to_mapping_unfenced`].
    #[inline]
    pub unsafe fn write_unfenced(&self, dst: *mut u8, src: &[u8]) {
        // SAFETY: the pointer and fence obligations are the caller's; the kernel's level was
        // checked to be supported when `self` was made.
        unsafe { (self.write)(dst, src.as_ptr(), src.len(), false) }
    }
}

impl std::fmt::Debug for WriteKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("WriteKernel").field(&self.level).finish()
    }
}

/// Copies `dst.len()` bytes from a CPU mapping of device memory at `src` into `dst`, with
/// streaming loads for the aligned bulk.
///
/// Starts with a full fence (`mfence`): loads from write-combined memory and streaming loads are
/// weakly ordered, so without it they could be satisfied before an earlier load of this thread
/// (the caller's poll of a "data ready" flag), or from a streaming-load buffer filled by an
/// earlier call. Each byte of `[src, src + dst.len())` is loaded exactly once with a naturally
/// aligned load; no byte outside that range is read.
///
/// # Safety
///
/// * `src` is valid for reads of `dst.len()` bytes (any pointer when `dst` is empty);
/// * `[src, src + dst.len())` does not overlap `dst`;
/// * no other thread writes that range during the call through Rust references (device writes
///   are the caller's protocol).
///
/// ```
/// let mapping: Vec<u8> = (0..=255).collect(); // stands in for a device mapping
/// let mut dst = [0u8; 10];
/// // SAFETY: `mapping[5..15]` is valid and distinct from `dst`.
/// unsafe { vkgdr::copy::copy_from_mapping(&mut dst, mapping.as_ptr().add(5)) };
/// assert_eq!(dst, [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]);
/// ```
pub unsafe fn copy_from_mapping(dst: &mut [u8], src: *const u8) {
    // SAFETY: the pointer obligations are the caller's; `simd_level` only returns supported
    // levels.
    unsafe { kernels::read(simd_level(), src, dst.as_mut_ptr(), dst.len()) }
}

/// Whether a copy of `len` bytes runs on the calling thread in the crate's default paths: below
/// the global pool's threshold, or below [`DEFAULT_PARALLEL_THRESHOLD`] while no global pool
/// exists (so a small copy never starts one).
#[inline]
fn runs_inline(len: usize) -> bool {
    match CopyPool::global_if_started() {
        Some(pool) => len < pool.parallel_threshold(),
        None => len < DEFAULT_PARALLEL_THRESHOLD,
    }
}

/// The crate's default write into a mapping (what [`Mapping::write`](crate::Mapping::write)
/// does): a short copy with the calling thread's SIMD stores, a long one split over
/// [`CopyPool::global`]'s threads; `sfence`d either way. Small writes never start the pool.
///
/// # Safety
///
/// As [`copy_to_mapping`].
#[inline]
pub(crate) unsafe fn write_default(dst: *mut u8, src: &[u8]) {
    if runs_inline(src.len()) {
        // SAFETY: forwarded to our caller.
        unsafe { copy_to_mapping(dst, src) }
    } else {
        // SAFETY: forwarded to our caller.
        unsafe { write_split(dst, src) }
    }
}

/// The long half of [`write_default`], kept out of line so the short one inlines small.
///
/// # Safety
///
/// As [`copy_to_mapping`].
#[inline(never)]
unsafe fn write_split(dst: *mut u8, src: &[u8]) {
    // SAFETY: forwarded to our caller.
    unsafe { CopyPool::global().write(dst, src) }
}

/// [`write_default`] for a [`WriteBatch`](crate::WriteBatch): a short copy is left unfenced
/// (the batch fences once at its end), a long one takes the split, fenced path.
///
/// # Safety
///
/// As [`copy_to_mapping_unfenced`].
#[inline]
pub(crate) unsafe fn write_batched(dst: *mut u8, src: &[u8]) {
    if runs_inline(src.len()) {
        // SAFETY: forwarded to our caller, who fences later.
        unsafe { copy_to_mapping_unfenced(dst, src) }
    } else {
        // SAFETY: forwarded to our caller.
        unsafe { write_split(dst, src) }
    }
}

/// The crate's default CPU read from a mapping: streaming loads on the calling thread for a
/// short copy, split over [`CopyPool::global`] for a long one (uncached BAR reads scale with
/// threads; figures: BENCHMARKS.md, 'CPU copies through the BAR').
///
/// # Safety
///
/// As [`copy_from_mapping`].
pub(crate) unsafe fn read_default(dst: &mut [u8], src: *const u8) {
    if runs_inline(dst.len()) {
        // SAFETY: forwarded to our caller.
        unsafe { copy_from_mapping(dst, src) }
    } else {
        // SAFETY: forwarded to our caller.
        unsafe { CopyPool::global().read(dst, src) }
    }
}

/// Copies between two host buffers (`memcpy`), split over [`CopyPool::global`]'s threads when
/// long: the copy-out half of the staged DMA reads.
pub(crate) fn copy_host_default(dst: &mut [u8], src: &[u8]) {
    debug_assert_eq!(dst.len(), src.len());
    if runs_inline(dst.len()) {
        dst.copy_from_slice(src);
    } else {
        // Equal lengths (the callers slice both the same): cannot fail.
        let _ = CopyPool::global().copy(dst, src);
    }
}

/// A zero-filled vector of `len` bytes, or `None` if the allocator cannot provide it (instead of
/// aborting the process as `vec![0; len]` does). Large zeroed allocations come straight from
/// the OS as untouched pages, so this costs no `memset`.
pub(crate) fn try_zeroed_vec(len: usize) -> Option<Vec<u8>> {
    if len == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(len).ok()?;
    // SAFETY: `layout` has a non-zero size (len > 0).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` was allocated by the global allocator with the layout of `[u8; len]`, which
    // is what a `Vec<u8>` of capacity `len` frees with; all `len` bytes are initialised (zero).
    Some(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

/// [`copy_to_mapping`] with a chosen kernel, for tests and benchmarks.
///
/// # Errors
///
/// [`CopyError::Unsupported`] if the CPU lacks `level`; nothing is copied then.
///
/// # Safety
///
/// As [`copy_to_mapping`].
#[doc(hidden)]
pub unsafe fn copy_to_mapping_with(
    level: SimdLevel,
    dst: *mut u8,
    src: &[u8],
) -> Result<(), CopyError> {
    if !level.is_supported() {
        return Err(CopyError::Unsupported(level));
    }
    // SAFETY: pointer obligations are the caller's; the level is supported (checked above).
    unsafe { kernels::write(level, dst, src.as_ptr(), src.len(), true) };
    Ok(())
}

/// [`copy_from_mapping`] with a chosen kernel, for tests and benchmarks.
///
/// # Errors
///
/// [`CopyError::Unsupported`] if the CPU lacks `level`; nothing is copied then.
///
/// # Safety
///
/// As [`copy_from_mapping`].
#[doc(hidden)]
pub unsafe fn copy_from_mapping_with(
    level: SimdLevel,
    dst: &mut [u8],
    src: *const u8,
) -> Result<(), CopyError> {
    if !level.is_supported() {
        return Err(CopyError::Unsupported(level));
    }
    // SAFETY: pointer obligations are the caller's; the level is supported (checked above).
    unsafe { kernels::read(level, src, dst.as_mut_ptr(), dst.len()) };
    Ok(())
}

/// Safe [`copy_to_mapping`] where the "mapping" is an ordinary slice (tests, benchmarks, host
/// staging buffers).
///
/// # Errors
///
/// [`CopyError::LengthMismatch`] if the slices differ in length; nothing is copied then.
///
/// ```
/// let mut dst = [0u8; 4];
/// vkgdr::copy::copy_to_slice_mapping(&mut dst, &[1, 2, 3, 4]).unwrap();
/// assert_eq!(dst, [1, 2, 3, 4]);
/// assert!(vkgdr::copy::copy_to_slice_mapping(&mut dst, &[1]).is_err());
/// ```
pub fn copy_to_slice_mapping(dst: &mut [u8], src: &[u8]) -> Result<(), CopyError> {
    check_lengths(dst.len(), src.len())?;
    // SAFETY: `dst` is a live exclusive borrow of `src.len()` bytes, so it is valid, cannot
    // overlap the shared borrow `src`, and no other thread can access it.
    unsafe { copy_to_mapping(dst.as_mut_ptr(), src) };
    Ok(())
}

/// Safe [`copy_from_mapping`] where the "mapping" is an ordinary slice.
///
/// # Errors
///
/// [`CopyError::LengthMismatch`] if the slices differ in length; nothing is copied then.
///
/// ```
/// let mut dst = [0u8; 3];
/// vkgdr::copy::copy_from_slice_mapping(&mut dst, &[9, 8, 7]).unwrap();
/// assert_eq!(dst, [9, 8, 7]);
/// ```
pub fn copy_from_slice_mapping(dst: &mut [u8], src: &[u8]) -> Result<(), CopyError> {
    check_lengths(dst.len(), src.len())?;
    // SAFETY: `src` is a live shared borrow of `dst.len()` bytes, so it is valid for reads,
    // cannot overlap the exclusive borrow `dst`, and nobody can write it meanwhile.
    unsafe { copy_from_mapping(dst, src.as_ptr()) };
    Ok(())
}
