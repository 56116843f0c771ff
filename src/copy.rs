//! Copies into and out of BAR mappings (interim: replaced by the SIMD implementation).

/// Copies `src` into the mapping at `dst`.
///
/// # Safety
/// - `dst` must be valid for `src.len()` bytes of writes.
pub unsafe fn copy_to_mapping(dst: *mut u8, src: &[u8]) {
    // SAFETY: the caller guarantees `dst`.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Copies from the mapping at `src` into `dst`.
///
/// # Safety
/// - `src` must be valid for `dst.len()` bytes of reads.
pub unsafe fn copy_from_mapping(dst: &mut [u8], src: *const u8) {
    // SAFETY: the caller guarantees `src`.
    unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
}

/// The instruction set used by the copy routines.
pub fn simd_level() -> &'static str {
    "scalar"
}
