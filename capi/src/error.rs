//! The calling thread's last error, and the guard every entry point runs its body in.
//!
//! Every exported function except [`vkgdr_last_error`] goes through [`guard`]: on failure it
//! stores the message and returns the function's error value, and a Rust panic is caught there
//! (it never unwinds into C) and reported the same way. Success leaves the last error alone, as
//! in vkgdr 0.1: only `vkgdr_open`, `vkgdr_open_vulkan` and `vkgdr_memory_alloc` clear it, when
//! they start ([`clear_last_error`]).

use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use vkgdr::range::RangeError;

use crate::handles::{BadHandle, Tag};

thread_local! {
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

extern "C" {
    /// The C library's allocator: `vkgdr_last_error`'s result is freed with `free`.
    fn malloc(size: usize) -> *mut c_void;
}

/// Why a call failed.
#[derive(Debug)]
pub enum Failure {
    /// The library's error, worded as vkgdr 0.1 words it ([`vkgdr::compat::message`]).
    Library(vkgdr::Error),
    /// A misuse of the C API (bad handle, NULL pointer, bad struct size), worded for C.
    Api(String),
}

impl From<vkgdr::Error> for Failure {
    fn from(e: vkgdr::Error) -> Self {
        match e {
            // A range outside the memory is the C caller's misuse of the call, worded as the
            // others are: "vkgdr_block_write: range 8+2 is outside the 9-byte allocation".
            vkgdr::Error::InvalidArgument(vkgdr::InvalidArgument::Range(
                range @ (RangeError::OutOfBounds { .. } | RangeError::OffsetPastEnd { .. }),
            )) => Failure::Api(range.to_string()),
            e => Failure::Library(e),
        }
    }
}

impl Failure {
    /// A refused handle of type `tag`.
    pub fn handle(tag: Tag, why: BadHandle) -> Self {
        Failure::Api(match why {
            BadHandle::Null => format!("the {} handle is NULL", tag.type_name()),
            BadHandle::Invalid => format!(
                "invalid {} handle (already freed, or not a {0} at all)",
                tag.type_name()
            ),
        })
    }

    /// The text `vkgdr_last_error` returns. Driver failures read exactly as in vkgdr 0.1
    /// (`"cuDeviceGetUuid failed (CUDA_ERROR_INVALID_DEVICE)"`); misuses name the function.
    fn message(&self, function: &str) -> String {
        match self {
            Failure::Library(e) => vkgdr::compat::message(e),
            Failure::Api(m) => format!("{function}: {m}"),
        }
    }
}

/// `Result` of an entry point's body.
pub type CResult<T> = Result<T, Failure>;

fn store(message: Option<String>) {
    let message = message.map(|m| {
        // A C string cannot hold NUL bytes; no message of ours has one, but never fail here.
        CString::new(m.replace('\0', "\\0")).unwrap_or_default()
    });
    // During thread teardown the slot may be gone: then there is no one left to read it.
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = message);
}

fn panic_text(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// Runs an entry point's body: on failure (or panic) stores the message and returns `on_error`.
/// Success does not touch the last error.
#[inline]
pub fn guard<R>(function: &'static str, on_error: R, body: impl FnOnce() -> CResult<R>) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => value,
        Ok(Err(failure)) => {
            store(Some(failure.message(function)));
            on_error
        }
        Err(payload) => {
            store(Some(format!(
                "{function}: internal error (Rust panic: {})",
                panic_text(&*payload)
            )));
            // Dropping a payload could itself panic: never let that escape either (its own
            // payload is leaked, the lesser evil).
            if let Err(again) = catch_unwind(AssertUnwindSafe(|| drop(payload))) {
                std::mem::forget(again);
            }
            on_error
        }
    }
}

/// Clears the calling thread's last error: what vkgdr 0.1's `vkgdr_open` and
/// `vkgdr_memory_alloc` do first, so that after one of them `vkgdr_last_error()` is `NULL` exactly
/// when it succeeded. Besides them only `vkgdr_open_vulkan` calls it (0.1 programs read the error
/// after those two, and a successful call must not erase an earlier failure).
#[inline]
pub fn clear_last_error() {
    let _ = LAST_ERROR.try_with(|e| {
        if let Ok(mut e) = e.try_borrow_mut() {
            if e.is_some() {
                *e = None;
            }
        }
    });
}

/// A `malloc`'d copy of `bytes` (NULL if the allocation fails), for C to `free()`.
fn malloc_copy(bytes: &[u8]) -> *mut c_char {
    // SAFETY: plain C allocation of the bytes' length.
    let out = unsafe { malloc(bytes.len()) }.cast::<u8>();
    if !out.is_null() {
        // SAFETY: `out` has room for `bytes.len()` bytes and is a new allocation.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out, bytes.len()) };
    }
    out.cast::<c_char>()
}

/// A NUL-terminated `malloc`'d copy of `text` for C to `free()` (a NUL byte inside becomes the
/// two characters `\0`, as in the last error), or NULL if the allocation fails.
pub fn c_string_copy(text: &str) -> *mut c_char {
    let c = CString::new(text.replace('\0', "\\0")).unwrap_or_default();
    malloc_copy(c.as_bytes_with_nul())
}

/// The calling thread's last error: a copy the caller must release with `free()`, or `NULL` if
/// no call has failed since the thread's last `vkgdr_open`, `vkgdr_open_vulkan` or
/// `vkgdr_memory_alloc` began (they clear it first, as vkgdr 0.1's `vkgdr_open` and
/// `vkgdr_memory_alloc` do), or since the thread started. Reading it does not clear it.
///
/// Every other function of the library sets it when it fails and leaves it alone when it
/// succeeds (as in vkgdr 0.1): look at a function's return value first, then read the error.
/// Messages of driver failures read `"<call> failed (<RESULT_NAME>)"`, e.g.
/// `"cuDeviceGetUuid failed (CUDA_ERROR_INVALID_DEVICE)"`. Returns `NULL` also if the copy
/// cannot be allocated.
///
/// Thread safety: any thread; each thread has its own last error.
#[no_mangle]
pub extern "C" fn vkgdr_last_error() -> *mut c_char {
    catch_unwind(|| {
        LAST_ERROR.with(|e| {
            let e = e.borrow();
            let Some(msg) = e.as_ref() else {
                return std::ptr::null_mut();
            };
            malloc_copy(msg.as_bytes_with_nul())
        })
    })
    .unwrap_or(std::ptr::null_mut())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    extern "C" {
        fn free(p: *mut c_void);
    }

    fn last() -> Option<String> {
        let p = vkgdr_last_error();
        if p.is_null() {
            return None;
        }
        // SAFETY: a NUL-terminated malloc'd copy, ours to free.
        let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
        // SAFETY: allocated with malloc by vkgdr_last_error.
        unsafe { free(p.cast()) };
        Some(s)
    }

    #[test]
    fn panics_become_errors_and_only_clearing_removes_them() {
        let r = guard("vkgdr_test", -1, || -> CResult<i32> {
            panic!("boom {}", 7)
        });
        assert_eq!(r, -1);
        let boom = Some("vkgdr_test: internal error (Rust panic: boom 7)");
        assert_eq!(last().as_deref(), boom);
        assert_eq!(last().as_deref(), boom, "reading does not clear");
        // vkgdr 0.1: a successful call leaves the error for a later read.
        assert_eq!(guard("vkgdr_test", -1, || Ok(5)), 5);
        assert_eq!(last().as_deref(), boom);
        // What vkgdr_open and vkgdr_memory_alloc do first.
        clear_last_error();
        assert_eq!(last(), None);
    }

    #[test]
    fn driver_errors_read_as_in_vkgdr_0_1_and_misuses_name_the_function() {
        guard("vkgdr_open", (), || {
            Err(Failure::Library(vkgdr::Error::Cuda {
                call: "cuDeviceGetUuid",
                code: 101,
                name: "CUDA_ERROR_INVALID_DEVICE".into(),
            }))
        });
        assert_eq!(
            last().as_deref(),
            Some("cuDeviceGetUuid failed (CUDA_ERROR_INVALID_DEVICE)")
        );
        guard("vkgdr_block_free", (), || {
            Err(Failure::handle(Tag::Block, BadHandle::Invalid))
        });
        let m = last().unwrap();
        assert!(
            m.starts_with("vkgdr_block_free: invalid vkgdr_block_t handle"),
            "{m}"
        );
        // The library checks ranges; a bad one is still the call's misuse.
        guard("vkgdr_block_write", (), || {
            let outside = RangeError::OutOfBounds {
                offset: 8,
                len: 2,
                size: 9,
            };
            Err(vkgdr::Error::from(outside).into())
        });
        assert_eq!(
            last().as_deref(),
            Some("vkgdr_block_write: range 8+2 is outside the 9-byte allocation")
        );
    }

    #[test]
    fn each_thread_has_its_own_last_error() {
        guard("vkgdr_test", (), || Err(Failure::Api("here".into())));
        let other = std::thread::spawn(last).join().unwrap();
        assert_eq!(other, None);
        assert_eq!(last().as_deref(), Some("vkgdr_test: here"));
    }
}
