//! The crate's synchronisation primitives in one place: cache-line padding, spin-then-yield
//! backoff, the write-combining store fence, the owner/visitor handshake of the pool's thread
//! caches ([`OwnerCell`]), the shard lock biased to the thread that takes it most
//! ([`BiasedLock`]), the barrier pair both stand on, and a shim over the atomics, the mutex and
//! `UnsafeCell` so the ring core and the handshakes can be model-checked with loom (the `loom`
//! feature; see `tests/loom_ring.rs` and the `loom_model`s of `owner_cell` and `biased_lock`).
//!
//! With the `loom` feature [`atomic`], [`Mutex`] and [`Backoff`] come from loom, whose scheduler then
//! explores every interleaving of the code that uses them.

use std::ops::{Deref, DerefMut};

mod barrier;
mod biased_lock;
pub(crate) mod lock;
mod owner_cell;
pub(crate) use biased_lock::{BiasedGuard, BiasedLock};
pub(crate) use owner_cell::OwnerCell;
#[cfg(test)]
pub(crate) use owner_cell::VISITS_BY_THIS_THREAD;
pub use owner_cell::{handshake, Handshake};

/// Atomics: `std`'s, or loom's with the `loom` feature.
pub(crate) mod atomic {
    #[cfg(feature = "loom")]
    pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8};
    #[cfg(not(feature = "loom"))]
    pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8};

    pub(crate) use std::sync::atomic::Ordering;
}

/// `UnsafeCell` with loom's closure API (`with_mut`), so that with the `loom` feature loom checks that
/// no two threads ever access the contents at once.
pub(crate) mod cell {
    #[cfg(feature = "loom")]
    pub(crate) use loom::cell::UnsafeCell;

    /// `std`'s `UnsafeCell` behind loom's API.
    #[cfg(not(feature = "loom"))]
    #[derive(Debug, Default)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    #[cfg(not(feature = "loom"))]
    impl<T> UnsafeCell<T> {
        pub(crate) const fn new(value: T) -> Self {
            UnsafeCell(std::cell::UnsafeCell::new(value))
        }

        /// Calls `f` with a pointer to the contents; dereferencing it is the caller's
        /// (unsafe) business.
        #[inline(always)]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }

        /// A pointer to the contents for an access that outlives a closure (loom's `get_mut`,
        /// whose pointer tracks the access until it drops).
        #[inline(always)]
        pub(crate) fn get_mut(&self) -> MutPtr<T> {
            MutPtr(self.0.get())
        }
    }

    /// `std`'s stand-in for loom's `MutPtr`: the raw pointer.
    #[cfg(not(feature = "loom"))]
    pub(crate) struct MutPtr<T>(*mut T);

    #[cfg(not(feature = "loom"))]
    impl<T> MutPtr<T> {
        /// The contents.
        ///
        /// # Safety
        /// - No other reference to the contents is used while the returned one lives.
        #[inline(always)]
        #[allow(clippy::mut_from_ref)] // a raw pointer's target, as loom's `MutPtr::deref`
        pub(crate) unsafe fn deref(&self) -> &mut T {
            // SAFETY: the caller's contract.
            unsafe { &mut *self.0 }
        }
    }

    #[cfg(feature = "loom")]
    pub(crate) use loom::cell::MutPtr;
}

/// Spins of a waiting loop before it starts yielding the CPU.
#[cfg_attr(feature = "loom", allow(dead_code))]
pub(crate) const SPINS_BEFORE_YIELD: u32 = 64;

/// Keeps a hot atomic on its own cache line (128 bytes: adjacent-line prefetch pairs lines).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct CachePadded<T>(pub(crate) T);

impl<T> Deref for CachePadded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> DerefMut for CachePadded<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

/// A waiting loop's pause: a short spin, then yielding the CPU so a preempted thread that holds
/// what we wait for can run. Under loom every pause yields (loom's scheduler needs it to make
/// progress in a spin loop).
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    #[cfg_attr(feature = "loom", allow(dead_code))]
    spins: u32,
}

impl Backoff {
    /// A fresh backoff: the first pauses spin.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Pauses once.
    pub(crate) fn snooze(&mut self) {
        #[cfg(feature = "loom")]
        loom::thread::yield_now();
        #[cfg(not(feature = "loom"))]
        if self.spins < SPINS_BEFORE_YIELD {
            self.spins += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Orders this thread's earlier stores to write-combined memory (a BAR mapping) before its later
/// stores: `sfence` drains the core's write-combining buffers, which ordinary fences do not
/// order. Miri and other targets get `fence(SeqCst)`, their closest model.
#[inline(always)]
pub(crate) fn store_fence() {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: `sfence` has no memory-safety preconditions (SSE is baseline on x86_64).
    unsafe {
        core::arch::x86_64::_mm_sfence()
    };
    #[cfg(any(not(target_arch = "x86_64"), miri))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// A small number naming the calling thread (never 0), for telling "the thread that holds this"
/// apart cheaply: one thread-local read after the first call.
pub(crate) fn thread_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    #[cfg(not(feature = "loom"))]
    std::thread_local!(static ID: u64 = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    // loom runs its threads on one OS thread: its own thread-locals tell them apart.
    #[cfg(feature = "loom")]
    loom::thread_local!(static ID: u64 = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    ID.with(|id| *id)
}

/// A mutex: [`lock::Mutex`] (`parking_lot`'s), or loom's under `cfg(feature = "loom")`. Only what
/// the crate uses.
#[derive(Debug, Default)]
pub(crate) struct Mutex<T> {
    #[cfg(not(feature = "loom"))]
    inner: lock::Mutex<T>,
    #[cfg(feature = "loom")]
    inner: loom::sync::Mutex<T>,
}

/// The guard of a locked [`Mutex`].
#[cfg(not(feature = "loom"))]
pub(crate) type MutexGuard<'a, T> = lock::MutexGuard<'a, T>;
/// The guard of a locked [`Mutex`].
#[cfg(feature = "loom")]
pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Self {
            #[cfg(not(feature = "loom"))]
            inner: lock::Mutex::new(value),
            #[cfg(feature = "loom")]
            inner: loom::sync::Mutex::new(value),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        #[cfg(not(feature = "loom"))]
        return self.inner.lock();
        // A panic while holding the lock cannot leave the protected counters half-changed.
        #[cfg(feature = "loom")]
        return self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn padding_and_backoff() {
        assert_eq!(std::mem::align_of::<CachePadded<u8>>(), 128);
        let mut p = CachePadded(1u32);
        *p += 1;
        assert_eq!(*p, 2);
        let mut backoff = Backoff::new();
        for _ in 0..SPINS_BEFORE_YIELD + 5 {
            backoff.snooze(); // past the spins, into the yields
        }
        assert_eq!(backoff.spins, SPINS_BEFORE_YIELD);
        store_fence();
        let me = thread_id();
        assert_ne!(me, 0);
        assert_eq!(thread_id(), me);
        assert_ne!(std::thread::spawn(thread_id).join().unwrap(), me);
        let m = Mutex::new(3);
        *m.lock() += 1;
        assert_eq!(*m.lock(), 4);
    }
}
