//! Blocking locks: `parking_lot`'s, or under Miri thin wrappers over `std`'s with the same API.
//!
//! Why: Miri type-checks the variadic arguments of `syscall` since nightly 2026-09-11
//! (rust-lang/rust#161734), and `parking_lot_core` 0.9.12 passes `&AtomicI32` to
//! `syscall(SYS_futex, …)` where a `*mut u32` belongs, so Miri stops with "Undefined Behavior"
//! whenever a thread parks on a contended lock — in `parking_lot`, not in this crate. `std`'s own
//! futex calls were fixed with the check, so under Miri our locks run on `std`'s. Real builds keep
//! `parking_lot` (no poisoning, smaller, faster uncontended).

// (With the `loom` feature the crate's mutex is loom's and the guard goes unused here.)
#[cfg(not(miri))]
#[cfg_attr(feature = "loom", allow(unused_imports))]
pub(crate) use parking_lot::{Condvar, Mutex, MutexGuard};

#[cfg(miri)]
#[cfg_attr(feature = "loom", allow(unused_imports))]
pub(crate) use std_backed::{Condvar, Mutex, MutexGuard};

#[cfg(miri)]
mod std_backed {
    use std::ops::{Deref, DerefMut};
    use std::sync::PoisonError;

    /// `std::sync::Mutex` with `parking_lot`'s API (no poisoning: a panic while the lock is held
    /// leaves the data as the panicking thread left it, as with `parking_lot`).
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T: ?Sized>(std::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) const fn new(value: T) -> Self {
            Mutex(std::sync::Mutex::new(value))
        }
    }

    impl<T: ?Sized> Mutex<T> {
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard(Some(self.0.lock().unwrap_or_else(PoisonError::into_inner)))
        }

        pub(crate) fn get_mut(&mut self) -> &mut T {
            self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
        }
    }

    /// The guard of a locked [`Mutex`]; `None` only inside [`Condvar::wait`].
    pub(crate) struct MutexGuard<'a, T: ?Sized>(Option<std::sync::MutexGuard<'a, T>>);

    impl<T: ?Sized> Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.0
                .as_deref()
                .expect("a guard is only empty inside Condvar::wait")
        }
    }

    impl<T: ?Sized> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.0
                .as_deref_mut()
                .expect("a guard is only empty inside Condvar::wait")
        }
    }

    /// `std::sync::Condvar` with `parking_lot`'s API (`wait` takes the guard by `&mut`).
    #[derive(Debug, Default)]
    pub(crate) struct Condvar(std::sync::Condvar);

    impl Condvar {
        pub(crate) const fn new() -> Self {
            Condvar(std::sync::Condvar::new())
        }

        pub(crate) fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            let inner = guard
                .0
                .take()
                .expect("a guard is only empty inside Condvar::wait");
            guard.0 = Some(self.0.wait(inner).unwrap_or_else(PoisonError::into_inner));
        }

        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }

        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Whichever implementation is in use: a contended lock and a condition variable hand a
    /// counter between threads (under Miri this parks threads on `std`'s futex calls).
    #[test]
    fn contended_lock_and_condvar() {
        let shared = Arc::new((Mutex::new(0u32), Condvar::new()));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let shared = shared.clone();
                std::thread::spawn(move || {
                    for _ in 0..5 {
                        *shared.0.lock() += 1;
                        shared.1.notify_all();
                    }
                })
            })
            .collect();
        let mut count = shared.0.lock();
        while *count < 15 {
            shared.1.wait(&mut count);
        }
        drop(count);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*shared.0.lock(), 15);
    }
}
