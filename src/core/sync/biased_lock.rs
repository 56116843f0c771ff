//! [`BiasedLock`]: a mutex that the thread taking it most (its owner) takes and releases with
//! plain stores and a compiler fence, and that any other thread takes as a spin lock after
//! revoking that bias — the pool's shard locks, each taken almost only by the thread that
//! allocates from its shard.
//!
//! Why: an uncontended spin lock still pays an atomic read-modify-write per lock (`xchg`, a full
//! barrier on x86 that waits for every earlier store to reach the cache). On the H100 hosts two
//! such sections cost 21–30 ns, a third of the pool's allocation and free pair without a thread
//! cache.
//!
//! # The protocol
//!
//! Unbiased, the lock is a test-and-test-and-set spin lock (`locked`; unlock is a release store).
//! A holder that has taken it `bias_after` times in a row (counted under `locked`) makes itself
//! the owner (`owner` = its [`thread_id`]) before unlocking. From then on the owner takes the
//! lock with the handshake of [`OwnerCell`](super::OwnerCell):
//!
//! | step | owner, every lock | another thread, revoking |
//! |---|---|---|
//! | 1 | `busy = true` (plain store) | take `locked`; `owner = 0` |
//! | 2 | light barrier | heavy barrier |
//! | 3 | `owner` not ours any more? then `busy = false` and take `locked` instead | wait until `busy == false` (acquire) |
//! | 4 | use the data; `busy = false` (release) | use the data; `locked = false` (release) |
//!
//! Each side stores, then reads the other's flag across the barrier pair ([`barrier`]), so at
//! least one sees the other: the revoker waits for the owner's section to end, or the owner
//! finds itself revoked and queues on the spin lock. With `membarrier` the owner's barrier is a
//! compiler fence and a revocation costs one system call that interrupts this process's running
//! threads (microseconds); without it both are `fence(SeqCst)` and the bias gains nothing, but
//! stays correct (Miri and loom check that mode).
//!
//! A revocation lasts until a thread earns the bias again, and each one doubles the streak that
//! earns it (up to [`MAX_BIAS_AFTER`]): a lock that threads keep sharing settles as a plain spin
//! lock after a handful of heavy barriers, one used by one thread stays biased.
//!
//! `tests` below run under Miri; `loom_model` explores every interleaving of an owner and a
//! revoker (the `loom` feature), including a variant without the owner's barrier that loom must
//! catch.

use std::ops::{Deref, DerefMut};

use crate::core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::core::sync::barrier;
use crate::core::sync::cell::{MutPtr, UnsafeCell};
use crate::core::sync::{thread_id, Backoff};

/// Locks in a row by one thread that bias an unbiased lock to it, at first.
pub(crate) const BIAS_AFTER: u32 = 64;
/// The most a streak must reach after revocations: a heavy barrier per million locks at worst.
pub(crate) const MAX_BIAS_AFTER: u32 = 1 << 20;

/// A mutex biased to the thread that takes it most; see the module docs.
pub(crate) struct BiasedLock<T> {
    /// The spin lock: every holder but the owner on its fast path.
    locked: AtomicBool,
    /// The owner is inside a section taken on its fast path.
    busy: AtomicBool,
    /// Whether this process pairs a compiler fence (owner) with `membarrier` (revoker).
    asymmetric: bool,
    /// The owner's `thread_id`, 0 when unbiased; changed only under `locked`.
    owner: AtomicU64,
    /// Under `locked`: who took the lock last, how often in a row, and the streak that biases.
    streak: UnsafeCell<Streak>,
    data: UnsafeCell<T>,
}

struct Streak {
    holder: u64,
    count: u32,
    bias_after: u32,
}

// SAFETY: the data is used by one thread at a time — the owner on its fast path, or the holder of
// `locked` after the handshake — ordered by the release/acquire pairs on `busy` and `locked`;
// moving `T` between threads that way needs `T: Send` only. `streak` is used under `locked` only.
unsafe impl<T: Send> Sync for BiasedLock<T> {}

impl<T> BiasedLock<T> {
    /// An unbiased lock holding `value`.
    pub(crate) fn new(value: T) -> Self {
        Self::with_bias_after(value, BIAS_AFTER)
    }

    /// An unbiased lock that biases after `bias_after` (at least 1) locks in a row by one thread.
    pub(crate) fn with_bias_after(value: T, bias_after: u32) -> Self {
        BiasedLock {
            locked: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            asymmetric: barrier::asymmetric(),
            owner: AtomicU64::new(0),
            streak: UnsafeCell::new(Streak {
                holder: 0,
                count: 0,
                bias_after: bias_after.clamp(1, MAX_BIAS_AFTER),
            }),
            data: UnsafeCell::new(value),
        }
    }

    /// Locks: the owner's fast path (no atomic read-modify-write), or the spin lock, revoking
    /// another thread's bias first.
    #[inline]
    pub(crate) fn lock(&self) -> BiasedGuard<'_, T> {
        let me = thread_id();
        if self.owner.load(Ordering::Relaxed) == me {
            if let Some(guard) = self.enter_owned(me) {
                return guard;
            }
        }
        self.lock_shared(me)
    }

    /// Locks if that needs no waiting for another holder; may revoke another thread's bias (and
    /// then fail if the owner is inside, leaving the lock unbiased).
    pub(crate) fn try_lock(&self) -> Option<BiasedGuard<'_, T>> {
        let me = thread_id();
        if self.owner.load(Ordering::Relaxed) == me {
            if let Some(guard) = self.enter_owned(me) {
                return Some(guard);
            }
        }
        if self.locked.load(Ordering::Relaxed) || self.locked.swap(true, Ordering::Acquire) {
            return None;
        }
        if self.settle(me, false) {
            Some(self.guard(&self.locked))
        } else {
            clear(&self.locked);
            None
        }
    }

    /// Whether the lock is biased to some thread now (a snapshot, for tests).
    #[cfg(all(test, not(feature = "loom")))]
    pub(crate) fn is_biased(&self) -> bool {
        self.owner.load(Ordering::Relaxed) != 0
    }

    /// Whether the lock is biased to the calling thread now (for tests).
    #[cfg(test)]
    pub(crate) fn is_biased_to_me(&self) -> bool {
        self.owner.load(Ordering::Relaxed) == thread_id()
    }

    /// The owner's fast path, `None` when the bias was revoked meanwhile.
    #[inline(always)]
    fn enter_owned(&self, me: u64) -> Option<BiasedGuard<'_, T>> {
        self.busy.store(true, Ordering::Relaxed);
        barrier::light(self.asymmetric);
        // The handshake: `busy` was stored before this load across the barrier pair, so a
        // revoker that cleared `owner` before we read it either sees `busy` (and waits for our
        // release) or we see its 0 here. Only we ever set `owner` to our id (under `locked`,
        // which we acquired then, with every earlier holder's changes), and a revoker's changes
        // reach us through `locked` after a revocation.
        if self.owner.load(Ordering::Relaxed) == me {
            return Some(self.guard(&self.busy));
        }
        clear(&self.busy);
        None
    }

    /// The spin lock, then [`settle`](Self::settle).
    #[inline(never)]
    fn lock_shared(&self, me: u64) -> BiasedGuard<'_, T> {
        let mut backoff = Backoff::new();
        while self.locked.swap(true, Ordering::Acquire) {
            // Wait on a plain load so waiters do not bounce the line with writes.
            while watch(&self.locked, Ordering::Relaxed) {
                backoff.snooze();
            }
        }
        let settled = self.settle(me, true);
        debug_assert!(settled);
        self.guard(&self.locked)
    }

    /// With `locked` held: revokes another thread's bias (waiting for its section in progress,
    /// or returning `false` at once when `!wait`), counts this thread's streak, and biases the
    /// lock to it when the streak is long enough (from its next lock on).
    fn settle(&self, me: u64, wait: bool) -> bool {
        let owner = self.owner.load(Ordering::Relaxed);
        self.streak.with_mut(|streak| {
            // SAFETY: `streak` is only used with `locked` held, as now.
            let streak = unsafe { &mut *streak };
            if owner != 0 {
                // Never ours: only we set our id, and we found it gone before taking `locked`.
                debug_assert_ne!(owner, me);
                self.owner.store(0, Ordering::Relaxed);
                if !barrier::heavy(self.asymmetric) {
                    // The kernel promises this cannot happen once registered; without the
                    // barrier the owner could run its section beside ours.
                    eprintln!("vkgdr: membarrier failed after registration; aborting");
                    std::process::abort();
                }
                streak.bias_after = streak.bias_after.saturating_mul(2).min(MAX_BIAS_AFTER);
                streak.count = 0;
                let mut backoff = Backoff::new();
                // Acquire: the owner's last section (released with `busy = false`) happens
                // before ours.
                while watch(&self.busy, Ordering::Acquire) {
                    if !wait {
                        return false;
                    }
                    backoff.snooze();
                }
            }
            if streak.holder == me {
                streak.count += 1;
            } else {
                streak.holder = me;
                streak.count = 1;
            }
            if streak.count >= streak.bias_after {
                streak.count = 0;
                self.owner.store(me, Ordering::Relaxed);
            }
            true
        })
    }

    fn guard<'a>(&'a self, release: &'a AtomicBool) -> BiasedGuard<'a, T> {
        BiasedGuard {
            data: self.data.get_mut(),
            _release: Release(release),
        }
    }
}

/// Reads a flag that a waiting loop watches: a plain load, or under loom a read-modify-write,
/// which always reads the latest value (loom may serve a plain load an older one again and again,
/// so the loop would never end in its model).
#[inline(always)]
fn watch(flag: &AtomicBool, order: Ordering) -> bool {
    #[cfg(feature = "loom")]
    return flag.fetch_or(false, order);
    #[cfg(not(feature = "loom"))]
    flag.load(order)
}

/// Clears a flag with release ordering: a plain store, or under loom a swap (its model otherwise
/// lets a thread spinning with read-modify-writes keep reading the value from before a plain
/// store of another thread, and the model never ends).
#[inline(always)]
fn clear(flag: &AtomicBool) {
    #[cfg(feature = "loom")]
    flag.swap(false, Ordering::Release);
    #[cfg(not(feature = "loom"))]
    flag.store(false, Ordering::Release);
}

/// Exclusive access to a [`BiasedLock`]'s data; unlocks when dropped.
pub(crate) struct BiasedGuard<'a, T> {
    // Declared first, so dropped first: loom's record of the access ends before the flag
    // releases the lock.
    data: MutPtr<T>,
    _release: Release<'a>,
}

impl<T> Deref for BiasedGuard<'_, T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while its thread holds the lock (`lock`'s handshake).
        unsafe { self.data.deref() }
    }
}

impl<T> DerefMut for BiasedGuard<'_, T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` keeps this the only reference the guard hands out.
        unsafe { self.data.deref() }
    }
}

/// Clears the flag a guard holds the lock by (`busy` or `locked`), also on unwind.
struct Release<'a>(&'a AtomicBool);

impl Drop for Release<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        clear(self.0);
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn biases_to_a_streak_and_revokes_for_another_thread() {
        let lock = BiasedLock::with_bias_after(0u64, 4);
        for _ in 0..4 {
            *lock.lock() += 1;
        }
        assert!(lock.is_biased());
        // The owner's fast path; a try_lock by the owner needs no waiting either.
        *lock.lock() += 1;
        *lock.try_lock().unwrap() += 1;
        assert!(lock.is_biased());
        std::thread::scope(|s| {
            s.spawn(|| *lock.lock() += 10);
        });
        assert!(!lock.is_biased(), "another thread's lock revokes the bias");
        // Twice the streak to earn it back.
        for _ in 0..7 {
            *lock.lock() += 1;
        }
        assert!(!lock.is_biased());
        *lock.lock() += 1;
        assert!(lock.is_biased());
        assert_eq!(*lock.lock(), 24);
    }

    #[test]
    fn try_lock_fails_while_held_and_revokes_without_waiting() {
        let lock = BiasedLock::with_bias_after((), 1);
        drop(lock.lock());
        assert!(lock.is_biased());
        let held = lock.lock(); // the owner's fast path
        std::thread::scope(|s| {
            s.spawn(|| assert!(lock.try_lock().is_none()));
        });
        assert!(!lock.is_biased(), "the failed try_lock still revoked");
        drop(held);
        let shared = lock.lock(); // the spin lock now
        std::thread::scope(|s| {
            s.spawn(|| assert!(lock.try_lock().is_none()));
        });
        drop(shared);
        std::thread::scope(|s| {
            s.spawn(|| assert!(lock.try_lock().is_some()));
        });
    }

    /// Threads that each take the lock in long runs (so the bias moves between them) and in
    /// alternation: no increment is lost, and Miri checks that no two sections overlap.
    #[test]
    fn excludes_under_moving_bias() {
        let rounds = if cfg!(miri) { 60 } else { 20_000 };
        let lock = Arc::new(BiasedLock::with_bias_after(0u64, 2));
        let threads: Vec<_> = (0..3)
            .map(|t| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for i in 0..rounds {
                        *lock.lock() += 1;
                        if (i + t) % 17 == 0 {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*lock.lock(), 3 * rounds);
    }
}

#[cfg(all(test, feature = "loom"))]
mod loom_model {
    //! Every interleaving of an owner and a revoking thread, with loom's `UnsafeCell` reporting
    //! any access of the data by both at once.
    use super::*;
    use loom::sync::Arc;

    fn model(owner_fence: bool) {
        loom::model(move || {
            let mut lock = BiasedLock::with_bias_after(0u32, 1);
            if !owner_fence {
                // The broken variant: the owner's barrier is a compiler fence, but nobody runs
                // the heavy side's membarrier under loom: loom must find the overlap.
                lock.asymmetric = true;
            }
            let lock = Arc::new(lock);
            let owner = {
                let lock = lock.clone();
                loom::thread::spawn(move || {
                    // The first lock biases the lock to this thread, the second takes the
                    // owner's fast path (unless revoked meanwhile).
                    for _ in 0..2 {
                        *lock.lock() += 1;
                    }
                })
            };
            let seen = {
                let mut n = lock.lock();
                let seen = *n;
                *n += 100;
                seen
            };
            owner.join().unwrap();
            let end = *lock.lock();
            assert!(seen <= 2);
            assert_eq!(end, 102);
        });
    }

    #[test]
    fn owner_and_revoker_never_overlap() {
        model(true);
    }

    #[test]
    #[should_panic(expected = "Concurrent")]
    fn without_the_owners_barrier_loom_finds_the_overlap() {
        model(false);
    }
}
