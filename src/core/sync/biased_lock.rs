//! [`BiasedLock`]: a mutex that the thread taking it most (its owner) takes and releases with
//! plain stores and a compiler fence, and that any other thread takes as a spin lock once the
//! owner has given the bias up or had it revoked — the pool's shard locks, each taken almost only
//! by the thread that allocates from its shard.
//!
//! Why: an uncontended spin lock still pays an atomic read-modify-write per lock (`xchg`, a full
//! barrier on x86 that waits for every earlier store to reach the cache). The pool's allocation
//! and free pair without a thread cache takes two such sections, about a third of its time
//! (figures: BENCHMARKS.md, 'The no-cache pair before the biased locks').
//!
//! # The protocol
//!
//! Unbiased, the lock is a test-and-test-and-set spin lock (`locked`; unlock is a release store).
//! A holder that has taken it `bias_after` times in a row (counted under `locked`) makes itself
//! the owner (`owner` = its token, the address of its thread's section count) before unlocking. From then on the owner takes the
//! lock with the handshake of [`OwnerCell`](super::OwnerCell), its "inside" flag being the count
//! of biased sections its thread is in ([`Sections`], one per thread, written by that thread
//! alone, so a thread that finds the bias gone can never clear another owner's flag):
//!
//! | step | owner, every lock | another thread, revoking |
//! |---|---|---|
//! | 1 | `sections += 1` (plain store) | take `locked`; `owner = 0` |
//! | 2 | light barrier | heavy barrier |
//! | 3 | `owner` not ours any more? then `sections -= 1` and take `locked` instead | wait until the owner's `sections == 0` (acquire) |
//! | 4 | use the data; `sections -= 1` (release) | use the data; `locked = false` (release) |
//!
//! Each side stores, then reads the other's flag across the barrier pair ([`barrier`]), so at
//! least one sees the other: the revoker waits for the owner's section to end, or the owner
//! finds itself revoked and queues on the spin lock. With `membarrier` the owner's barrier is a
//! compiler fence and a revocation costs one system call that interrupts this process's running
//! threads (microseconds); without it both are `fence(SeqCst)` and the bias gains nothing, but
//! stays correct (Miri and loom check that mode).
//!
//! Before revoking, a thread that holds `locked` asks (`handoff`): an owner that is locking sees
//! the request on its next lock and gives the bias up itself (releasing `owner = 0`), so the
//! common case — another thread frees a block of the owner's shard, `Pool::stats` reads it —
//! interrupts nobody. Only an owner that does not answer within [`HANDOFF_WAITS`] pauses (idle,
//! or descheduled) is revoked with the heavy barrier. A revoked owner may still be inside its
//! section: every holder of `locked` waits for its count to fall before using the data
//! ([`try_lock`](BiasedLock::try_lock) fails instead, the revocation standing).
//!
//! A lost bias stays lost until a thread earns it again, and each loss doubles the streak that
//! earns it (up to [`MAX_BIAS_AFTER`]): a lock that threads keep sharing settles as a plain spin
//! lock, one used by one thread stays biased.
//!
//! A thread inside a biased section must not wait for another lock that a thread revoking its
//! bias may hold (the revoker would wait for the section's end): the pool never nests shard locks
//! except through `try_lock`.
//!
//! `tests` below run under Miri; `loom_model` explores every interleaving of an owner and a
//! revoking thread (the `loom` feature), including a variant without the owner's barrier that
//! loom must catch.

use std::ops::{Deref, DerefMut};

use crate::core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use crate::core::sync::barrier;
#[cfg(feature = "loom")]
use crate::core::sync::cell::MutPtr;
use crate::core::sync::cell::UnsafeCell;
use crate::core::sync::{Backoff, CachePadded};

/// Locks in a row by one thread that bias an unbiased lock to it, at first.
pub(crate) const BIAS_AFTER: u32 = 64;
/// The most a streak must reach after lost biases: a heavy barrier per million locks at worst.
pub(crate) const MAX_BIAS_AFTER: u32 = 1 << 20;
/// How long a thread that wants a biased lock waits for its owner to give the bias up before
/// revoking it: pauses of ~10–140 cycles each, a few microseconds (an owner that is allocating
/// locks every ~100 ns). Under loom, a few turns.
#[cfg(not(feature = "loom"))]
const HANDOFF_WAITS: u32 = 128;
#[cfg(feature = "loom")]
const HANDOFF_WAITS: u32 = 2;

/// A mutex biased to the thread that takes it most; see the module docs.
pub(crate) struct BiasedLock<T> {
    /// The spin lock: every holder but the owner on its fast path.
    locked: AtomicBool,
    /// Whether this process pairs a compiler fence (owner) with `membarrier` (revoker).
    asymmetric: bool,
    /// A holder of `locked` asks the owner to give the bias up on its next lock.
    handoff: AtomicBool,
    /// Pauses an asking holder waits for the owner's answer ([`HANDOFF_WAITS`]).
    handoff_waits: u32,
    /// Heavy revocations so far (tests tell them from handoffs).
    #[cfg(all(test, not(feature = "loom")))]
    revocations: std::sync::atomic::AtomicU32,
    /// The owner's token ([`Sections::token`]), 0 when unbiased; set and revoked under
    /// `locked`, and cleared by the owner itself when asked.
    owner: AtomicU64,
    /// Under `locked`: the bias's bookkeeping.
    bias: UnsafeCell<Bias>,
    data: UnsafeCell<T>,
}

/// Who took the lock last, how often in a row, the streak that biases, and the owner's section
/// count (what a revocation waits on).
struct Bias {
    holder: u64,
    count: u32,
    bias_after: u32,
    owner_sections: Option<&'static Sections>,
}

// SAFETY: the data is used by one thread at a time — the owner on its fast path, or the holder of
// `locked` after the handshake — ordered by the release/acquire pairs on the owner's section
// count, `owner` and `locked`; moving `T` between threads that way needs `T: Send` only. `bias`
// is used under `locked` only, and the `Sections` it names are shared atomics.
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
            asymmetric: barrier::asymmetric(),
            handoff: AtomicBool::new(false),
            handoff_waits: HANDOFF_WAITS,
            #[cfg(all(test, not(feature = "loom")))]
            revocations: std::sync::atomic::AtomicU32::new(0),
            owner: AtomicU64::new(0),
            bias: UnsafeCell::new(Bias {
                holder: 0,
                count: 0,
                bias_after: bias_after.clamp(1, MAX_BIAS_AFTER),
                owner_sections: None,
            }),
            data: UnsafeCell::new(value),
        }
    }

    /// Locks: the owner's fast path (no atomic read-modify-write), or the spin lock, after the
    /// owner of a bias gave it up or had it revoked.
    #[inline]
    pub(crate) fn lock(&self) -> BiasedGuard<'_, T> {
        let Some(sections) = Sections::mine() else {
            return self.lock_shared(NO_TOKEN);
        };
        let me = sections.token();
        if self.owner.load(Ordering::Relaxed) == me {
            if let Some(guard) = self.enter_owned(sections, me) {
                return guard;
            }
        }
        self.lock_shared(me)
    }

    /// Locks if that needs no waiting for another holder: `None` while the spin lock is held
    /// or an owner is inside its section (its bias then revoked all the same).
    pub(crate) fn try_lock(&self) -> Option<BiasedGuard<'_, T>> {
        let sections = Sections::mine();
        let me = sections.map_or(NO_TOKEN, Sections::token);
        if let Some(sections) = sections.filter(|_| self.owner.load(Ordering::Relaxed) == me) {
            if let Some(guard) = self.enter_owned(sections, me) {
                return Some(guard);
            }
        }
        if self.locked.load(Ordering::Relaxed) || self.locked.swap(true, Ordering::Acquire) {
            return None;
        }
        if self.settle(me, false) {
            Some(self.guard(None))
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
        Sections::mine().is_some_and(|s| self.owner.load(Ordering::Relaxed) == s.token())
    }

    /// The owner's fast path (`sections` is the calling thread's, `me` its token), `None` when
    /// the bias was revoked or asked for meanwhile.
    #[inline(always)]
    fn enter_owned(&self, sections: &'static Sections, me: u64) -> Option<BiasedGuard<'_, T>> {
        let depth = sections.depth.load(Ordering::Relaxed);
        sections.depth.store(depth + 1, Ordering::Relaxed);
        barrier::light(self.asymmetric);
        // The handshake: our count was raised before this load across the barrier pair, so a
        // revoker that cleared `owner` before we read it either sees the count (and waits for
        // our release) or we see its 0 here. Only we ever set `owner` to our id (under `locked`,
        // which we acquired then, with every earlier holder's changes), and a revoker's changes
        // reach us through `locked` after a revocation.
        if self.owner.load(Ordering::Relaxed) == me {
            if !watch(&self.handoff, Ordering::Relaxed) {
                return Some(self.guard(Some(sections)));
            }
            // A holder of `locked` asks for the bias: give it up. Our count goes back first
            // (release), then `owner` (release, and only if still ours: a revoker may have
            // cleared it and biased the lock to itself since), so the asker, acquiring
            // `owner == 0`, finds every section of ours over.
            set_depth(sections, depth);
            let _ = self
                .owner
                .compare_exchange(me, 0, Ordering::Release, Ordering::Relaxed);
            return None;
        }
        set_depth(sections, depth);
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
        self.guard(None)
    }

    /// With `locked` held: ends another thread's bias (asking first, revoking if unanswered),
    /// waits for a revoked owner's section in progress (or returns `false` at once when not
    /// `wait`, the revocation standing), counts this thread's streak, and biases the lock to it
    /// when the streak is long enough (from its next lock on).
    fn settle(&self, me: u64, wait: bool) -> bool {
        let owner = self.owner.load(Ordering::Relaxed);
        self.bias.with_mut(|bias| {
            // SAFETY: `bias` is only used with `locked` held, as now.
            let bias = unsafe { &mut *bias };
            // Never ours: our fast path takes our own bias, and gives it up only by clearing it.
            debug_assert_ne!(owner, me);
            if owner != 0 {
                // An owner that is locking gives the bias up on its next lock (no barrier, no
                // other thread interrupted): its sections are then over. One that is idle or
                // slow to answer is revoked, and may still be inside.
                if self.ask_owner() {
                    bias.owner_sections = None;
                } else {
                    self.revoke();
                }
                bias.bias_after = bias.bias_after.saturating_mul(2).min(MAX_BIAS_AFTER);
                bias.count = 0;
            }
            // A revoked owner (now or by an earlier holder that could not wait) may still be in
            // its section: every other holder waits for its count to fall first (the former
            // owner itself is in none of this lock's sections now, whatever its count says of
            // other locks'). Acquire: the owner's sections (released with its count) happen
            // before ours.
            if let Some(sections) = bias.owner_sections.filter(|s| s.token() != me) {
                let mut backoff = Backoff::new();
                while watch_depth(sections) != 0 {
                    if !wait {
                        return false;
                    }
                    backoff.snooze();
                }
                bias.owner_sections = None;
            }
            if bias.holder == me {
                bias.count += 1;
            } else {
                bias.holder = me;
                bias.count = 1;
            }
            if bias.count >= bias.bias_after {
                bias.count = 0;
                if let Some(sections) = Sections::mine().filter(|s| s.token() == me) {
                    bias.owner_sections = Some(sections);
                    self.owner.store(me, Ordering::Relaxed);
                }
            }
            true
        })
    }

    /// With `locked` held: asks the owner to give its bias up on its next lock and waits a
    /// little for it; `true` once it has (its sections are then over and happen before ours),
    /// `false` if it did not answer in time (the bias stays).
    fn ask_owner(&self) -> bool {
        set(&self.handoff, true);
        let mut answered = false;
        for _ in 0..self.handoff_waits {
            // Acquire: pairs with the owner's release of `owner = 0` in `enter_owned`.
            if self.owner.load(Ordering::Acquire) == 0 {
                answered = true;
                break;
            }
            #[cfg(feature = "loom")]
            loom::thread::yield_now();
            #[cfg(not(feature = "loom"))]
            std::hint::spin_loop();
        }
        set(&self.handoff, false);
        answered
    }

    /// With `locked` held: takes the bias away from an owner that did not give it up: clears
    /// `owner` and runs the heavy barrier; the owner's section in progress, if any, is then
    /// waited for through `Bias::owner_sections`.
    fn revoke(&self) {
        #[cfg(all(test, not(feature = "loom")))]
        self.revocations.fetch_add(1, Ordering::Relaxed);
        self.owner.store(0, Ordering::Relaxed);
        if !barrier::heavy(self.asymmetric) {
            // The kernel promises this cannot happen once registered; without the barrier the
            // owner could run its section beside ours.
            eprintln!("vkgdr: membarrier failed after registration; aborting");
            std::process::abort();
        }
    }

    /// The guard of a section: the owner's (`owned`, its thread's count), or the spin lock's.
    #[inline(always)]
    fn guard(&self, owned: Option<&'static Sections>) -> BiasedGuard<'_, T> {
        BiasedGuard {
            #[cfg(feature = "loom")]
            data: self.data.get_mut(),
            release: Release { lock: self, owned },
        }
    }
}

/// How many biased sections one thread is inside (over every lock biased to it), where threads
/// revoking a bias can read it. Only its thread writes it. Never freed: a thread's count goes
/// back to a list of spares when it exits, for the next thread (a lock still naming it then
/// waits, at worst, for the next thread's short sections).
struct Sections {
    depth: CachePadded<AtomicU32>,
}

/// The token of a thread with no section count (its thread-locals are being destroyed): never
/// an owner (counts are aligned, so no count's address is odd).
const NO_TOKEN: u64 = 1;

impl Sections {
    /// The token that names the count's thread as a lock's owner: its address. A count passes
    /// to another thread only after its thread exited (outside every section), through the
    /// spares' mutex, which orders the exited thread's sections before the next thread's: the
    /// next thread may then take over its biases as they stand.
    #[inline(always)]
    fn token(&self) -> u64 {
        std::ptr::from_ref(self) as u64
    }

    fn new() -> Self {
        Sections {
            depth: CachePadded(AtomicU32::new(0)),
        }
    }

    /// The calling thread's count; `None` once its thread-locals are being destroyed.
    #[cfg(not(feature = "loom"))]
    #[inline(always)]
    fn mine() -> Option<&'static Sections> {
        THREAD_SECTIONS.try_with(|s| s.0).ok()
    }

    /// The calling thread's count (one per loom thread, leaked: a model is short).
    #[cfg(feature = "loom")]
    fn mine() -> Option<&'static Sections> {
        loom::thread_local!(static MINE: &'static Sections = Box::leak(Box::new(Sections::new())));
        Some(MINE.with(|s| *s))
    }
}

/// A thread's section count, handed back to the spares when the thread exits.
#[cfg(not(feature = "loom"))]
struct ThreadSections(&'static Sections);

#[cfg(not(feature = "loom"))]
static SPARE_SECTIONS: std::sync::Mutex<Vec<&'static Sections>> = std::sync::Mutex::new(Vec::new());

#[cfg(not(feature = "loom"))]
impl ThreadSections {
    fn take() -> Self {
        let spare = SPARE_SECTIONS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop();
        ThreadSections(spare.unwrap_or_else(|| Box::leak(Box::new(Sections::new()))))
    }
}

#[cfg(not(feature = "loom"))]
impl Drop for ThreadSections {
    fn drop(&mut self) {
        // A count left raised (a guard outliving its thread's thread-locals, which the crate
        // never does) is not handed to another thread.
        if self.0.depth.load(Ordering::Relaxed) == 0 {
            SPARE_SECTIONS
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(self.0);
        }
    }
}

#[cfg(not(feature = "loom"))]
std::thread_local! {
    static THREAD_SECTIONS: ThreadSections = ThreadSections::take();
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

/// [`watch`] for a section count (acquire).
#[inline(always)]
fn watch_depth(sections: &Sections) -> u32 {
    #[cfg(feature = "loom")]
    return sections.depth.fetch_add(0, Ordering::Acquire);
    #[cfg(not(feature = "loom"))]
    sections.depth.load(Ordering::Acquire)
}

/// Stores a flag with release ordering: a plain store, or under loom a swap (its model otherwise
/// lets a thread spinning with read-modify-writes keep reading the value from before a plain
/// store of another thread, and the model never ends).
#[inline(always)]
fn set(flag: &AtomicBool, value: bool) {
    #[cfg(feature = "loom")]
    flag.swap(value, Ordering::Release);
    #[cfg(not(feature = "loom"))]
    flag.store(value, Ordering::Release);
}

/// [`set`] to `false`.
#[inline(always)]
fn clear(flag: &AtomicBool) {
    set(flag, false);
}

/// [`set`] for this thread's section count.
#[inline(always)]
fn set_depth(sections: &Sections, depth: u32) {
    #[cfg(feature = "loom")]
    sections.depth.swap(depth, Ordering::Release);
    #[cfg(not(feature = "loom"))]
    sections.depth.store(depth, Ordering::Release);
}

/// Lowers this thread's section count by one (release). Only this thread writes it: a load and
/// a store, no read-modify-write — but under loom a `fetch_sub`, whose read is always the latest
/// (loom may serve a plain load an older value, and does once a model panicked).
#[inline(always)]
fn leave(sections: &Sections) {
    #[cfg(feature = "loom")]
    sections.depth.fetch_sub(1, Ordering::Release);
    #[cfg(not(feature = "loom"))]
    sections.depth.store(
        sections.depth.load(Ordering::Relaxed) - 1,
        Ordering::Release,
    );
}

/// Exclusive access to a [`BiasedLock`]'s data; unlocks when dropped.
///
/// Two words without loom (the lock and how it is held; the contents are reached through the
/// lock): a guard coming back from a call, or passed to one, travels in registers, where a wider
/// one would be stored and loaded again.
pub(crate) struct BiasedGuard<'a, T> {
    // Declared first, so dropped first: loom's record of the access ends before the lock is
    // released.
    #[cfg(feature = "loom")]
    data: MutPtr<T>,
    // Under loom only dropped: the contents are reached through `data`.
    #[cfg_attr(feature = "loom", allow(dead_code))]
    release: Release<'a, T>,
}

impl<T> Deref for BiasedGuard<'_, T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while its thread holds the lock (`lock`'s handshake).
        #[cfg(feature = "loom")]
        return unsafe { self.data.deref() };
        // SAFETY: as above.
        #[cfg(not(feature = "loom"))]
        unsafe {
            &*self.release.lock.data.with_mut(|p| p)
        }
    }
}

impl<T> DerefMut for BiasedGuard<'_, T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` keeps this the only reference the guard hands out.
        #[cfg(feature = "loom")]
        return unsafe { self.data.deref() };
        // SAFETY: as above.
        #[cfg(not(feature = "loom"))]
        unsafe {
            &mut *self.release.lock.data.with_mut(|p| p)
        }
    }
}

/// How a guard holds its lock, undone when it drops (also on unwind): the spin lock (`owned`
/// is `None`), or a section of the owner, `owned` its thread's count (one lower then: guards of
/// several locks may drop in any order).
struct Release<'a, T> {
    lock: &'a BiasedLock<T>,
    owned: Option<&'static Sections>,
}

impl<T> Drop for Release<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        match self.owned {
            None => clear(&self.lock.locked),
            Some(sections) => leave(sections),
        }
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

    /// An owner that keeps locking gives the bias up when another thread asks: no heavy
    /// revocation. An idle one is revoked.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "spins on another thread's progress: minutes under Miri"
    )]
    fn a_locking_owner_hands_the_bias_over_an_idle_one_is_revoked() {
        let mut lock = BiasedLock::with_bias_after(0u64, 1);
        // Long enough for an owner descheduled on a loaded machine to run again and answer
        // (about a second at most), so that the test does not depend on the machine's load.
        lock.handoff_waits = 10_000_000;
        let lock = Arc::new(lock);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let owner = {
            let (lock, stop) = (lock.clone(), stop.clone());
            std::thread::spawn(move || {
                *lock.lock() += 1; // biases the lock to this thread
                while !stop.load(Ordering::Relaxed) {
                    *lock.lock() += 1;
                }
            })
        };
        while !lock.is_biased() {
            std::hint::spin_loop();
        }
        // Ask until the owner answered (one ask is enough unless it stays descheduled).
        let mut handed_over = false;
        for _ in 0..10 {
            while !lock.is_biased() {
                std::hint::spin_loop(); // the owner earns it back (twice the streak each time)
            }
            let before = lock.revocations.load(Ordering::Relaxed);
            *lock.lock() += 1;
            if lock.revocations.load(Ordering::Relaxed) == before {
                handed_over = true;
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        owner.join().unwrap();
        assert!(handed_over, "a locking owner answers the handoff");
        // Now idle: biased to this thread after a streak, revoked by another thread.
        let lock = BiasedLock::with_bias_after(0u64, 1);
        drop(lock.lock());
        assert!(lock.is_biased_to_me());
        std::thread::scope(|s| {
            s.spawn(|| *lock.lock() += 1);
        });
        assert_eq!(lock.revocations.load(Ordering::Relaxed), 1);
        assert_eq!(*lock.lock(), 1);
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

    /// `handoff_waits`: 0 makes every other thread revoke (the heavy barrier's path); a few
    /// let the owner answer in some interleavings and not in others.
    fn model(owner_fence: bool, handoff_waits: u32) {
        loom::model(move || {
            let mut lock = BiasedLock::with_bias_after(0u32, 1);
            lock.handoff_waits = handoff_waits;
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
        model(true, 0);
    }

    #[test]
    fn owner_and_asker_never_overlap() {
        model(true, HANDOFF_WAITS);
    }

    #[test]
    #[should_panic(expected = "Concurrent")]
    fn without_the_owners_barrier_loom_finds_the_overlap() {
        model(false, 0);
    }
}
