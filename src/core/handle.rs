//! [`SendSyncPtr`]: a raw pointer or driver handle that may cross threads, so the types holding
//! one get `Send` and `Sync` from the compiler, which still checks every other field
//! (gpu-allocator's `SendSyncPtr` idea), instead of an `unsafe impl` for the whole type.
//!
//! What it wraps, and why moving or sharing that value between threads is sound, is said where
//! each field is declared: host mappings are plain memory whose safe access the owning type
//! guards (`&mut self` for writes, bounds checks), and CUDA handles (contexts, modules, streams,
//! events, external memory) may be used from any thread by the driver API's rules.

use std::fmt;
use std::ptr::NonNull;

/// A raw pointer marked `Send + Sync` on its own. It gives no access by itself: every
/// dereference, and every driver call with it, is an `unsafe` operation at its use.
#[repr(transparent)]
pub(crate) struct SendSyncPtr<T: ?Sized>(*mut T);

// SAFETY: a `SendSyncPtr` is an address; moving it to another thread gives that thread no access
// it could use without `unsafe` (see the module doc for what the holders guarantee).
unsafe impl<T: ?Sized> Send for SendSyncPtr<T> {}
// SAFETY: as for `Send`: `&SendSyncPtr` only yields a copy of the address.
unsafe impl<T: ?Sized> Sync for SendSyncPtr<T> {}

impl<T: ?Sized> SendSyncPtr<T> {
    /// Wraps `ptr`.
    pub(crate) const fn new(ptr: *mut T) -> Self {
        SendSyncPtr(ptr)
    }

    /// The pointer. A method (not a field) so that closures capture the whole wrapper, which is
    /// `Sync`, and not the bare pointer (edition 2021 closures capture disjoint fields).
    pub(crate) const fn get(self) -> *mut T {
        self.0
    }
}

impl<T: ?Sized> From<NonNull<T>> for SendSyncPtr<T> {
    fn from(p: NonNull<T>) -> Self {
        SendSyncPtr(p.as_ptr())
    }
}

/// Compiles only for a `Send + Sync` type. A type that holds a [`SendSyncPtr`] states it beside its
/// definition (`const _: () = assert_send_sync::<T>();`), so the compiler checks there that every
/// other field of it is thread-safe too.
pub(crate) const fn assert_send_sync<T: Send + Sync + ?Sized>() {}

impl<T: ?Sized> Clone for SendSyncPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: ?Sized> Copy for SendSyncPtr<T> {}

impl<T: ?Sized> PartialEq for SendSyncPtr<T> {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::addr_eq(self.0, other.0)
    }
}

impl<T: ?Sized> Eq for SendSyncPtr<T> {}

impl<T: ?Sized> fmt::Debug for SendSyncPtr<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Pointer::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_and_returns_the_same_address() {
        let mut x = 7u64;
        let p = SendSyncPtr::new(&mut x as *mut u64);
        let q = p;
        assert_eq!(p, q);
        assert_eq!(p.get(), &mut x as *mut u64);
        assert_eq!(SendSyncPtr::from(NonNull::from(&mut x)).get(), p.get());
        // A closure that captures it may run on another thread.
        let addr = std::thread::scope(|s| s.spawn(move || q.get() as usize).join().unwrap());
        assert_eq!(addr, p.get() as usize);
        const _: () = assert_send_sync::<SendSyncPtr<std::ffi::c_void>>();
    }
}
