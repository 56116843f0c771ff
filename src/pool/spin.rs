//! The shard lock: a test-and-test-and-set spin lock behind `lock_api` (the API `parking_lot`'s
//! own mutexes implement).
//!
//! Shard critical sections are tens of nanoseconds and, with one shard per thread, almost never
//! contended; a parking mutex pays an atomic read-modify-write both to lock and to unlock, this
//! lock only to lock (unlock is a plain release store). Under contention it spins briefly, then
//! yields, so a preempted holder does not burn a core.

// `std`'s atomic rather than the `crate::core::sync` shim's: `lock_api` needs a `const INIT`, and
// loom's atomics have no `const` constructor.
use std::sync::atomic::AtomicBool;

use parking_lot::lock_api::{GuardSend, RawMutex};

use crate::core::sync::{atomic::Ordering, Backoff};

/// A raw spin lock; use it through [`SpinMutex`].
pub struct RawSpinLock {
    locked: AtomicBool,
}

// SAFETY: `lock` returns only after swapping `locked` from false to true (Acquire), `unlock`
// stores false (Release): exactly one holder at a time, and the holder's writes are visible to the
// next one.
unsafe impl RawMutex for RawSpinLock {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: RawSpinLock = RawSpinLock {
        locked: AtomicBool::new(false),
    };
    type GuardMarker = GuardSend;

    fn lock(&self) {
        let mut backoff = Backoff::new();
        while self.locked.swap(true, Ordering::Acquire) {
            // Wait on a plain load so waiters do not bounce the line with writes.
            while self.locked.load(Ordering::Relaxed) {
                backoff.snooze();
            }
        }
    }

    fn try_lock(&self) -> bool {
        !self.locked.load(Ordering::Relaxed) && !self.locked.swap(true, Ordering::Acquire)
    }

    unsafe fn unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }
}

/// A mutex over [`RawSpinLock`].
pub type SpinMutex<T> = parking_lot::lock_api::Mutex<RawSpinLock, T>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excludes_and_publishes() {
        let m = SpinMutex::new(0u64);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        *m.lock() += 1;
                    }
                });
            }
        });
        assert_eq!(*m.lock(), 40_000);
        let g = m.lock();
        assert!(m.try_lock().is_none());
        drop(g);
        assert!(m.try_lock().is_some());
    }
}
