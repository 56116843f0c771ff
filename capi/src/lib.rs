//! # vkgdr's C library
//!
//! `libvkgdr.so` / `libvkgdr.a` with the header `include/vkgdr.h` (generated from this crate by
//! cbindgen; `tests/header.rs` fails when the committed copy differs). It is a drop-in for
//! vkgdr 0.1's C API — same names, values, signatures and error texts, built on
//! [`vkgdr::compat`] — and adds the pool ([`pool`]), copies ([`copy`]), rings ([`ring`]),
//! their exclusive producers ([`producer`]), device → host rings ([`d2h`]) with blocks that
//! kernels release ([`device_release`]) and sharing with other processes (the owner's
//! side in [`share`], the attaching side in [`peer`]) in the same style.
//!
//! Conventions every function follows:
//! - it never lets a Rust panic unwind into C ([`error::guard`]);
//! - on failure it returns `NULL`, 0, `false` or -1 (as its documentation says) and sets the
//!   calling thread's last error (`vkgdr_last_error`); success leaves it alone, as in vkgdr 0.1
//!   (only `vkgdr_open`, `vkgdr_open_vulkan` and `vkgdr_memory_alloc` clear it, first thing);
//! - handles are checked tokens, not pointers ([`handles`]): `NULL`, a freed handle or a handle of
//!   another type is an error, never a crash. Destructors accept `NULL` and do nothing, like
//!   `free(NULL)`.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, clippy::undocumented_unsafe_blocks)]
// The C names are the API.
#![allow(non_camel_case_types)]

pub mod copy;
pub mod d2h;
pub mod device;
pub mod device_release;
pub mod error;
pub mod handles;
pub mod memory;
pub mod peer;
pub mod pool;
pub mod producer;
pub mod ring;
pub mod share;
mod versioned;

use std::ffi::{c_char, c_int, c_ulonglong};

use error::{CResult, Failure};
use handles::HandleTable;

/// CUDA's device handle, `CUdevice` from `<cuda.h>` (not redefined in the header).
pub type CUdevice = c_int;
/// CUDA's device pointer, `CUdeviceptr` from `<cuda.h>` (`unsigned long long` on 64-bit Linux;
/// not redefined in the header).
pub type CUdeviceptr = c_ulonglong;

/// The struct behind CUDA's `CUstream` (declared by `<cuda.h>`, never defined).
pub struct CUstream_st {
    _private: [u8; 0],
}

/// CUDA's stream handle, `CUstream` from `<cuda.h>` (not redefined in the header). The runtime's
/// `cudaStream_t` is the same pointer.
pub type CUstream = *mut CUstream_st;

/// `CU_STREAM_LEGACY` of `<cuda.h>`: the legacy default stream, as NULL is in the driver API.
pub(crate) const CU_STREAM_LEGACY: usize = 0x1;

/// `text` into `buf`, NUL-terminated, cut at a character boundary when it does not fit (a NUL
/// inside ends it early, as C reads it).
pub(crate) fn copy_text(buf: &mut [c_char], text: &str) {
    let mut end = text.len().min(buf.len() - 1);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    for (dst, &b) in buf.iter_mut().zip(&text.as_bytes()[..end]) {
        *dst = b as c_char;
    }
    buf[end] = 0;
}

/// Whether `stream` names the legacy default stream (NULL or `CU_STREAM_LEGACY`), which every
/// release already waits for.
pub(crate) fn is_legacy_stream(stream: CUstream) -> bool {
    stream.is_null() || stream.addr() == CU_STREAM_LEGACY
}

/// Stores `value` at `out` unless `out` is NULL: the C API's optional out-parameters (a count
/// of what went back, a sequence number, a token), which a caller that does not want them
/// passes as NULL.
///
/// # Safety
/// - `out` is NULL or valid for a write of a `T` (aligned, writable).
pub(crate) unsafe fn write_optional<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: not NULL, so writable and aligned (our caller's promise).
        unsafe { out.write(value) };
    }
}

/// Returned by functions that report success as an `int`.
pub const VKGDR_SUCCESS: c_int = 0;
/// Returned by functions that report failure as an `int`; the reason is in `vkgdr_last_error()`.
pub const VKGDR_ERROR: c_int = -1;

/// Converts between a table token and the opaque pointer type C sees.
pub(crate) trait Handle: Sized {
    fn token(self) -> u64;
    fn from_token(token: u64) -> Self;
}

impl<T> Handle for *mut T {
    fn token(self) -> u64 {
        self.addr() as u64
    }
    fn from_token(token: u64) -> Self {
        // A token is never dereferenced: an address without provenance is exactly right.
        std::ptr::without_provenance_mut(token as usize)
    }
}

/// The object behind handle `h` of `table`, or the C-facing error.
///
/// # Safety
/// - No thread frees `h` while the returned reference is in use (the C caller's obligation,
///   stated on every function).
#[inline]
unsafe fn lookup<T>(table: &HandleTable<T>, h: impl Handle) -> CResult<&T> {
    // SAFETY: forwarded to our caller.
    unsafe { table.get(h.token()) }.map_err(|why| Failure::handle(table.tag(), why))
}

/// Stores `value` in `table` and returns its handle.
#[inline]
fn register<T, H: Handle>(table: &HandleTable<T>, value: T) -> CResult<H> {
    table.insert(value).map(H::from_token).map_err(|_| {
        Failure::Api(format!(
            "too many live {} handles ({})",
            table.tag().type_name(),
            handles::MAX_SLOTS
        ))
    })
}

/// Removes handle `h` from `table` and drops its object; `NULL` does nothing.
#[inline]
fn release<T>(table: &HandleTable<T>, h: impl Handle) -> CResult<()> {
    match table.free(h.token()) {
        Ok(()) | Err(handles::BadHandle::Null) => Ok(()),
        Err(why) => Err(Failure::handle(table.tag(), why)),
    }
}
