//! Objects inherited through `fork()`: the sharing classes refuse to be used in a child.
//!
//! A child forked from a process that owns a `ShareServer`, or holds a `Peer` and its
//! attachments, inherits the Python objects but not what stands behind them: the mappings are
//! `MADV_DONTFORK` (a store through one faults in the child), the server's threads do not run
//! there, and a connection is the parent's (a message the child sent or read would be taken
//! from the parent's conversation). So each object remembers the process it was made in, and in
//! any other every method raises `VkgdrError` saying so, and its destructor leaks what it holds
//! instead of detaching the parent's attachments or removing the parent's socket. A child makes
//! its own: `vkgdr.Peer(path)` connects anew.
//!
//! "This process" is a generation that python/vkgdr/__init__.py bumps in every child
//! (`os.register_at_fork(after_in_child=...)`, which `os.fork()` and `multiprocessing`'s fork
//! start method run): a check is one atomic load, where `getpid()` would be a system call.

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::prelude::*;

use crate::errors::vkgdr_error;

/// Bumped in every child forked through Python.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Called by `os.register_at_fork(after_in_child=...)` (python/vkgdr/__init__.py).
#[pyfunction]
#[pyo3(name = "_after_fork_in_child")]
pub fn after_fork_in_child() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// The process an object was made in.
#[derive(Debug, Clone, Copy)]
pub struct Home {
    generation: u64,
    pid: u32,
}

impl Home {
    /// This process.
    pub fn here() -> Home {
        Home {
            generation: GENERATION.load(Ordering::Relaxed),
            pid: std::process::id(),
        }
    }

    /// Whether the object is in the process that made it.
    pub fn is_here(&self) -> bool {
        GENERATION.load(Ordering::Relaxed) == self.generation
    }

    /// `Ok` in the process that made the object (a `what`), else the `VkgdrError` that says why
    /// it cannot be used here.
    pub fn check(&self, what: &str) -> PyResult<()> {
        if self.is_here() {
            return Ok(());
        }
        Err(vkgdr_error(format!(
            "this {what} belongs to process {} and was inherited through fork(): its mappings \
             and connection stay with that process. A forked child makes its own (vkgdr.Peer(path) \
             connects anew)",
            self.pid
        )))
    }
}

/// A value that is dropped only in the process that made it: in a child forked from that
/// process it is leaked instead (its drop would act on the parent's device, mappings or
/// connection).
pub struct HomeBound<T> {
    value: std::mem::ManuallyDrop<T>,
    home: Home,
}

impl<T> HomeBound<T> {
    /// `value`, bound to this process.
    pub fn new(value: T) -> HomeBound<T> {
        HomeBound {
            value: std::mem::ManuallyDrop::new(value),
            home: Home::here(),
        }
    }
}

impl<T> std::ops::Deref for HomeBound<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> Drop for HomeBound<T> {
    fn drop(&mut self) {
        if self.home.is_here() {
            // SAFETY: dropped once, here, and never used again.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.value) };
        }
    }
}
