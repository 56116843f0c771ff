//! [`OwnerCell`]: data one thread (its owner) uses constantly without any atomic
//! read-modify-write or memory fence, and that any other thread (a visitor) can still take
//! exclusively — the pool's per-thread caches, which `trim` and a pool's drop empty from
//! whichever thread calls them.
//!
//! # The protocol (an asymmetric Dekker handshake)
//!
//! | step | owner, every access | visitor, rarely |
//! |---|---|---|
//! | 1 | `busy = true` (plain store) | take the visitors' lock; `claimed = true` |
//! | 2 | light barrier | heavy barrier |
//! | 3 | `claimed`? then `busy = false` and wait for the visitors' lock instead | wait until `busy == false` (acquire) |
//! | 4 | use the data; `busy = false` (release) | use the data; `claimed = false` (release); unlock |
//!
//! Each side stores its flag, then reads the other's. Store→load ordering needs a full barrier
//! on *both* sides, or both could miss each other; with one, at least one side sees the other:
//! either the visitor sees `busy` and waits for the access to end, or the owner sees `claimed`
//! and queues behind the visitor. The asymmetry is where the barriers cost: the owner's light
//! barrier is only a compiler fence when the visitor's heavy barrier is Linux's
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, which runs a full memory barrier on every CPU
//! currently running a thread of this process (and threads not running passed one when they were
//! switched out) — so it is as if every owner had executed a full barrier at that point of its
//! program. Without `membarrier` (other systems, a kernel without it, Miri, loom) both barriers
//! are `fence(SeqCst)`, the textbook Dekker, which costs the owner ~10 ns per access instead of
//! nothing. The choice is made once per process, before the first cell exists.
//!
//! The owner never blocks on its fast path and never waits for a visitor there; a visitor waits
//! at most for one owner access in progress (tens of nanoseconds of the owner's own work). The
//! owner's data accesses must therefore not block or call back into a visit.
//!
//! `tests` below run under Miri (fence mode); `loom_model` explores every interleaving under
//! the `loom` feature (scripts/test), including a variant without the owner's barrier, which loom must
//! catch.

use std::fmt;
use std::ops::{Deref, DerefMut};

use crate::core::sync::atomic::{AtomicBool, Ordering};
use crate::core::sync::barrier;
use crate::core::sync::cell::{MutPtr, UnsafeCell};
use crate::core::sync::{Backoff, Mutex};

/// Data owned by one thread, reachable by others through a handshake (see the module docs).
pub(crate) struct OwnerCell<T> {
    /// The owner is inside [`OwnerCell::with_owner`]'s fast path.
    busy: AtomicBool,
    /// A visitor holds (or is taking) the data: the owner must queue on `visitors`.
    claimed: AtomicBool,
    /// Held by a visitor from setting `claimed` to clearing it; the owner's slow path takes it.
    visitors: Mutex<()>,
    /// Whether this process pairs a compiler fence (owner) with `membarrier` (visitor).
    asymmetric: bool,
    data: UnsafeCell<T>,
}

// SAFETY: the data is accessed by one thread at a time — the owner inside its handshake, or a
// visitor holding `visitors` after its handshake — and the accesses are ordered by the
// release/acquire pairs on `busy`, `claimed` and the lock; moving `T` between threads that way
// needs `T: Send` only.
unsafe impl<T: Send> Sync for OwnerCell<T> {}

impl<T> OwnerCell<T> {
    /// A cell holding `value`, owned by whichever single thread will call
    /// [`with_owner`](Self::with_owner).
    pub(crate) fn new(value: T) -> Self {
        OwnerCell {
            busy: AtomicBool::new(false),
            claimed: AtomicBool::new(false),
            visitors: Mutex::new(()),
            asymmetric: barrier::asymmetric(),
            data: UnsafeCell::new(value),
        }
    }

    /// Runs `f` on the data as its owner: on the fast path two plain stores, a load and a
    /// compiler fence around `f` (with `membarrier`), or a `fence(SeqCst)` more (without).
    ///
    /// # Safety
    /// - Only one thread, the owner, ever calls this on a given cell.
    /// - `f` does not call `with_owner` on this cell, does not block, and does not visit.
    #[inline]
    pub(crate) unsafe fn with_owner<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        // SAFETY: forwarded to our caller.
        match unsafe { self.try_enter() } {
            Some(mut access) => f(&mut access),
            // SAFETY: forwarded to our caller.
            None => unsafe { self.with_owner_queued(f) },
        }
    }

    /// The owner's fast path as a guard rather than a closure: the data while no visitor is in,
    /// `None` when one is (or was) — then [`with_owner_queued`](Self::with_owner_queued) waits
    /// for it. For hot paths whose values should stay in registers: a closure handed to the
    /// queued path must be built in memory.
    ///
    /// # Safety
    /// - Only one thread, the owner, ever calls this (or `with_owner`) on a given cell.
    /// - While the access lives, the owner does not enter the cell again, block, or visit.
    #[inline(always)]
    pub(crate) unsafe fn try_enter(&self) -> Option<OwnerAccess<'_, T>> {
        self.busy.store(true, Ordering::Relaxed);
        barrier::light(self.asymmetric);
        // Acquire: a visitor's changes to the data (released with `claimed = false`) are
        // visible to the access below.
        if self.claimed.load(Ordering::Acquire) {
            self.busy.store(false, Ordering::Release);
            return None;
        }
        // The handshake: we set `busy` before reading `claimed == false` across the barrier
        // pair, so any visitor that has claimed the cell sees `busy` and waits until the access
        // clears it (release, also on unwind); no other owner exists (caller's obligation).
        Some(OwnerAccess {
            data: self.data.get_mut(),
            _busy: Busy(&self.busy),
        })
    }

    /// The owner's slow path: a visitor is (or was) inside; wait for it on its lock.
    ///
    /// # Safety
    /// As [`with_owner`](Self::with_owner).
    #[cold]
    #[inline(never)]
    pub(crate) unsafe fn with_owner_queued<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let _visitors = self.visitors.lock();
        // SAFETY: visitors touch the data only while holding `visitors`, which we hold now; no
        // other owner exists (caller's obligation).
        self.data.with_mut(|data| f(unsafe { &mut *data }))
    }

    /// Runs `f` on the data of every cell in `cells`, each exclusively, from any thread that is
    /// not inside `with_owner` of one of them: one heavy barrier for all. Owners that access
    /// their cell meanwhile wait on its lock (at most until this returns).
    ///
    /// Returns `false`, without running `f`, if the heavy barrier failed (a `membarrier` error
    /// the kernel should never return once registered): the data is then left alone.
    pub(crate) fn visit_all(cells: &[&Self], mut f: impl FnMut(&mut T)) -> bool {
        // One lock order (by address) for every visitor, so two visits of overlapping sets of
        // cells cannot deadlock.
        #[cfg(test)]
        VISITS_BY_THIS_THREAD.with(|v| v.set(v.get() + 1));
        let mut cells = cells.to_vec();
        cells.sort_by_key(|c| std::ptr::from_ref::<Self>(c) as usize);
        cells.dedup_by_key(|c| std::ptr::from_ref::<Self>(c) as usize);
        let guards: Vec<_> = cells.iter().map(|c| c.visitors.lock()).collect();
        for c in &cells {
            c.claimed.store(true, Ordering::Relaxed);
        }
        let fenced = barrier::heavy(cells.iter().any(|c| c.asymmetric));
        for c in &cells {
            if fenced {
                let mut backoff = Backoff::new();
                // Acquire: the owner's last access (released with `busy = false`) happens before
                // ours.
                while c.busy.load(Ordering::Acquire) {
                    backoff.snooze();
                }
                // SAFETY: the handshake: after our heavy barrier the owner either is seen busy
                // (we waited for it to finish) or will see `claimed` and queue on the lock we
                // hold; other visitors need that lock too.
                c.data.with_mut(|data| f(unsafe { &mut *data }));
            }
            c.claimed.store(false, Ordering::Release);
        }
        drop(guards);
        fenced
    }

    /// The data, for a test holding the only reference.
    #[cfg(test)]
    pub(crate) fn get_mut(&mut self) -> &mut T {
        // SAFETY: `&mut self` excludes every other access.
        self.data.with_mut(|data| unsafe { &mut *data })
    }
}

#[cfg(test)]
thread_local! {
    /// How many visits (heavy barriers) the current thread made: tests of code that must not
    /// interrupt other threads count with it.
    pub(crate) static VISITS_BY_THIS_THREAD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How other threads (a trim, a pool's drop) get exclusive access to a thread's cache: the
/// barrier pair of the handshake, chosen once per process. The owner's cost per cached
/// allocation and free depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Handshake {
    /// Linux's `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` on the visitor's side: the owner
    /// pays only a compiler fence.
    Membarrier,
    /// A `SeqCst` fence on both sides, where `membarrier`'s private expedited command cannot be
    /// used (another system, an old or restricted kernel): about 10 ns more per cached
    /// allocation and per cached free.
    Fence,
}

impl Handshake {
    /// A short name for machine-readable output: `"membarrier"` or `"fence"`.
    pub fn name(self) -> &'static str {
        match self {
            Handshake::Membarrier => "membarrier",
            Handshake::Fence => "fence",
        }
    }
}

impl fmt::Display for Handshake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Handshake::Membarrier => "membarrier (private expedited): no barrier for the owner",
            Handshake::Fence => "SeqCst fences (membarrier unavailable): a full barrier per access",
        })
    }
}

/// The handshake this process's thread caches use (decided on first use, then fixed).
///
/// ```
/// use vkgdr::chunk::HostMemorySource;
/// use vkgdr::pool::magazine::{handshake, Handshake};
/// use vkgdr::{Pool, PoolConfig};
///
/// // Linux with membarrier (since 4.14, where no seccomp policy forbids it) takes the cheap path.
/// if handshake() == Handshake::Fence {
///     eprintln!("thread caches pay a full barrier per access here");
/// }
/// // Every pool with a thread cache reports the process's handshake.
/// let pool = Pool::new(HostMemorySource, PoolConfig::default())?;
/// assert_eq!(pool.thread_cache().map(|t| t.handshake), Some(handshake()));
/// # Ok::<(), vkgdr::Error>(())
/// ```
pub fn handshake() -> Handshake {
    if barrier::asymmetric() {
        Handshake::Membarrier
    } else {
        Handshake::Fence
    }
}

/// The owner's access to a cell's data on the fast path ([`OwnerCell::try_enter`]); ends (clears
/// `busy`) when dropped.
pub(crate) struct OwnerAccess<'a, T> {
    // Declared first, so dropped first: loom's record of the access ends before `busy` clears
    // and lets a visitor in.
    data: MutPtr<T>,
    _busy: Busy<'a>,
}

impl<T> Deref for OwnerAccess<'_, T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        // SAFETY: `try_enter`'s handshake gave this access the data alone until it drops.
        unsafe { self.data.deref() }
    }
}

impl<T> DerefMut for OwnerAccess<'_, T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` keeps this the only reference the access hands out.
        unsafe { self.data.deref() }
    }
}

/// Clears the owner's `busy` flag when its access ends (also on unwind).
struct Busy<'a>(&'a AtomicBool);

impl Drop for Busy<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    #[test]
    fn owner_and_visitor_see_each_others_changes() {
        let cell = OwnerCell::new(Vec::<u32>::new());
        // SAFETY: this thread is the only owner.
        unsafe { cell.with_owner(|v| v.extend([1, 2, 3])) };
        let mut taken = Vec::new();
        assert!(OwnerCell::visit_all(&[&cell], |v| taken.append(v)));
        assert_eq!(taken, [1, 2, 3]);
        // SAFETY: as above.
        assert!(unsafe { cell.with_owner(|v| v.is_empty()) });
        let mut cell = cell;
        cell.get_mut().push(9);
        assert_eq!(cell.get_mut(), &[9]);
    }

    /// An owner moves tokens between its cell and a shared "shard" counter while visitors take
    /// the cell's tokens back: no token is lost or counted twice, and the data is never used by
    /// two threads at once (Miri checks that, with its weak-memory emulation).
    #[test]
    fn tokens_are_conserved_under_concurrent_visits() {
        let rounds = if cfg!(miri) { 200 } else { 100_000 };
        let cell = Arc::new(OwnerCell::new(Vec::<u64>::new()));
        let shard = Arc::new(AtomicUsize::new(0));
        let owner = {
            let (cell, shard) = (cell.clone(), shard.clone());
            std::thread::spawn(move || {
                for i in 0..rounds {
                    // SAFETY: this thread is the cell's only owner; the closures neither block
                    // nor visit.
                    let popped = unsafe {
                        cell.with_owner(|v| {
                            if i % 3 == 2 {
                                v.pop()
                            } else {
                                v.push(i);
                                None
                            }
                        })
                    };
                    if popped.is_some() {
                        shard.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        };
        let mut visited = 0;
        while !owner.is_finished() {
            assert!(OwnerCell::visit_all(&[&*cell], |v| {
                visited += v.len();
                v.clear();
            }));
        }
        owner.join().unwrap();
        let mut cell = Arc::into_inner(cell).unwrap();
        let left = cell.get_mut().len();
        let pushes = (0..rounds).filter(|i| i % 3 != 2).count();
        assert_eq!(left + visited + shard.load(Ordering::Relaxed), pushes);
    }
}

#[cfg(all(test, feature = "loom"))]
mod loom_model {
    //! Every interleaving of one owner and one visitor, with loom's `UnsafeCell` reporting any
    //! access of the data by both at once.
    use super::*;
    use loom::sync::Arc;

    fn model(owner_fence: bool) {
        loom::model(move || {
            let mut cell = OwnerCell::new(0u32);
            if !owner_fence {
                // The broken variant: the owner's barrier is gone (asymmetric, but nobody
                // runs the heavy side's membarrier under loom): loom must find the race.
                cell.asymmetric = true;
            }
            let cell = Arc::new(cell);
            let owner = {
                let cell = cell.clone();
                loom::thread::spawn(move || {
                    for _ in 0..2 {
                        // SAFETY: this thread is the only owner.
                        unsafe { cell.with_owner(|n| *n += 1) };
                    }
                })
            };
            let mut seen = 0;
            OwnerCell::visit_all(&[&*cell], |n| {
                seen = *n;
                *n = 100;
            });
            owner.join().unwrap();
            let cell = Arc::try_unwrap(cell).ok().unwrap();
            let mut cell = cell;
            let end = *cell.get_mut();
            // The visit happened between two owner accesses (or before or after both).
            assert!(seen <= 2);
            assert_eq!(end, 100 + 2 - seen);
        });
    }

    #[test]
    fn owner_and_visitor_never_overlap() {
        model(true);
    }

    /// Two visitors at once (a trim racing a pool's drop) over two cells with an owner each:
    /// the visitors serialise on the cells' locks, each owner's accesses stay exclusive, and
    /// every increment is either seen by a visit or left in the cell.
    #[test]
    fn two_visitors_and_two_owners_never_overlap() {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(2);
        builder.check(|| {
            let cells = Arc::new([OwnerCell::new(0u32), OwnerCell::new(0u32)]);
            let owners: Vec<_> = (0..2)
                .map(|i| {
                    let cells = cells.clone();
                    loom::thread::spawn(move || {
                        // SAFETY: thread `i` is the only owner of cell `i`.
                        unsafe { cells[i].with_owner(|n| *n += 1) };
                    })
                })
                .collect();
            let visitor = {
                let cells = cells.clone();
                loom::thread::spawn(move || {
                    let mut taken = 0;
                    OwnerCell::visit_all(&[&cells[0], &cells[1]], |n| taken += std::mem::take(n));
                    taken
                })
            };
            let mut taken = 0;
            OwnerCell::visit_all(&[&cells[1], &cells[0]], |n| taken += std::mem::take(n));
            for o in owners {
                o.join().unwrap();
            }
            taken += visitor.join().unwrap();
            let mut cells = Arc::try_unwrap(cells).ok().unwrap();
            let left: u32 = cells.iter_mut().map(|c| *c.get_mut()).sum();
            assert_eq!(taken + left, 2);
        });
    }

    #[test]
    #[should_panic(expected = "Concurrent write accesses to `UnsafeCell`")]
    fn without_the_owners_barrier_loom_finds_the_overlap() {
        model(false);
    }
}
