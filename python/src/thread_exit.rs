//! A Python thread's pool caches go back before `Thread.join()` returns.
//!
//! The library keeps small freed blocks in a per-thread cache and hands them back to their
//! shards when the thread exits, in a destructor of the thread's native storage. CPython's
//! `join()` returns once the thread's interpreter state is cleared, which comes before that:
//! a `pool.stats()` right after `join()` could find the exiting thread half-way through
//! returning its blocks. So a thread that allocates from a pool through this module keeps an
//! object in its thread-state dict (`PyThreadState_GetDict`), which CPython clears on that
//! thread, before it lets `join()` return; dropping the object returns the thread's cached
//! blocks then.

use std::cell::Cell;
use std::thread::ThreadId;

use pyo3::prelude::*;
use pyo3::types::PyDict;

thread_local! {
    /// Whether this thread's state dict holds its [`ReturnCacheAtExit`].
    static WATCHED: Cell<bool> = const { Cell::new(false) };
}

/// The key in the thread-state dict.
const KEY: &str = "vkgdr.return_thread_cache";

/// Held by a thread's state dict; dropped when CPython clears it.
#[pyclass(module = "vkgdr", name = "_ReturnCacheAtExit", frozen)]
struct ReturnCacheAtExit {
    /// The thread whose cache this returns: a dict cleared from another thread (interpreter
    /// finalization) leaves that thread's cache alone.
    thread: ThreadId,
}

impl Drop for ReturnCacheAtExit {
    fn drop(&mut self) {
        if std::thread::current().id() == self.thread {
            vkgdr::pool::magazine::release_thread_cache();
            WATCHED.with(|w| w.set(false));
        }
    }
}

/// Makes sure the calling thread returns its pool caches when CPython clears its state: call
/// before an allocation that may start the thread's cache. One thread-local load once done.
pub(crate) fn return_cache_at_exit(py: Python<'_>) {
    if WATCHED.with(Cell::get) {
        return;
    }
    // SAFETY: the GIL is held (`py`); the call returns this thread's state dict, borrowed, or
    // NULL where there is none.
    let dict = unsafe { pyo3::ffi::PyThreadState_GetDict() };
    if dict.is_null() {
        return;
    }
    // SAFETY: a borrowed reference to a live dict (CPython's own, for this thread state), used
    // while the GIL is held.
    let dict = unsafe { Bound::from_borrowed_ptr(py, dict) };
    let Ok(dict) = dict.cast_into::<PyDict>() else {
        return;
    };
    let marker = ReturnCacheAtExit {
        thread: std::thread::current().id(),
    };
    // Without the marker the cache still goes back when the native thread exits.
    if let Ok(marker) = Py::new(py, marker) {
        if dict.set_item(KEY, marker).is_ok() {
            WATCHED.with(|w| w.set(true));
        }
    }
}
