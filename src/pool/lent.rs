//! Blocks lent to kernels ([`Block::release_on_device`](super::Block::release_on_device)):
//! the table of their release tokens, the device → host feed their releases arrive on
//! ([`ReleaseFeed`]), and the counts of everything a drain refused. Pure: no driver, no FFI; the
//! blocks are type-erased here (`Box<dyn Any + Send>`, a block's record as is, no copy), so this
//! file sits below the pool's shared state that holds it.
//!
//! # The rules
//!
//! | event | what happens to the block |
//! |:--|:--|
//! | `release_on_device` (or a batch: `Pool::release_many_on_device`, one lock) | moves into the table; its token goes to the kernel |
//! | the token arrives (a drain) | taken out of the table and freed to its shard: allocatable again (it counts as lent until that free is done) |
//! | a forged, stale or repeated token arrives | nothing; counted ([`DeviceReleaseStats`]) |
//! | a record of another kind, or a length not a multiple of 8 | nothing; counted |
//! | the lane breaks ([`D2hError`]) | the lane's later tokens never come: their blocks stay lent, the error is kept |
//! | `Pool::trim` | lent blocks keep their chunks (a chunk is freed only when empty) |
//! | the last `Pool` handle drops | the table is closed (no new lending) and drained until it is empty; its blocks and chunks stay until their tokens arrive |
//! | `Pool::reclaim_device_releases` (unsafe: the kernels are done) | every lent block freed; later tokens of them are stale |
//!
//! A block is so never reused before its token arrived, never freed twice, and never freed for
//! another block's token: [`ReleaseTokens`] gives each value back exactly once, for the token of
//! its own issue only.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::core::ring::d2h::{
    tokens_in, D2hError, LaneConsumer, LaneMemory, ReleaseToken, ReleaseTokens, TableFull,
    TokenStats, KIND_RELEASE,
};
use crate::core::sync::lock::{Condvar, Mutex, MutexGuard};

/// A block in the table: its record, type-erased.
pub(super) type LentBlock = Box<dyn Any + Send>;

/// Where a pool's device releases arrive: the device → host lanes a kernel's
/// `vkgdr_release_token` publishes into (`include/vkgdr/ring_d2h.cuh`). The pool drains it on
/// its slow path, on its drain thread and on [`Pool::drain_device_releases`](super::Pool).
///
/// Implemented for the core's [`LaneConsumer`] and a `Vec` of them (one per lane); the ring layer
/// hands its device → host rings' consumers over as such. A feed delivers each record once, in
/// its lane's order.
pub trait ReleaseFeed: Send + 'static {
    /// Takes up to `max` records that have arrived, calling `record(kind, payload)` for each,
    /// and frees their slots for the device. Returns how many were taken; on an error (a lane
    /// the device broke) the records before it were delivered, and lanes that are not broken
    /// are still drained.
    fn drain(&mut self, max: usize, record: &mut dyn FnMut(u32, &[u8])) -> Result<usize, D2hError>;
}

impl<M: LaneMemory + Send + 'static> ReleaseFeed for LaneConsumer<M> {
    fn drain(&mut self, max: usize, record: &mut dyn FnMut(u32, &[u8])) -> Result<usize, D2hError> {
        LaneConsumer::drain(self, max, |r| record(r.kind, r.payload))
    }
}

impl<F: ReleaseFeed> ReleaseFeed for Vec<F> {
    fn drain(&mut self, max: usize, record: &mut dyn FnMut(u32, &[u8])) -> Result<usize, D2hError> {
        let mut taken = 0;
        let mut first_error = None;
        for lane in self.iter_mut() {
            if taken >= max {
                break;
            }
            match lane.drain(max - taken, record) {
                Ok(n) => taken += n,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(taken),
        }
    }
}

/// Counts of a pool's device releases (a part of [`PoolStats`](super::PoolStats)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceReleaseStats {
    /// The token table's counts: issued, redeemed (blocks given back), revoked (taken back by
    /// `reclaim_device_releases`), and the tokens refused as forged, stale or repeated.
    pub tokens: TokenStats,
    /// Blocks lent now: released on the device and not back in the pool yet (their tokens not
    /// arrived, or a drain taking them back at this moment).
    pub outstanding: u64,
    /// Records on the release lanes of a kind other than `KIND_RELEASE` (ignored).
    pub foreign_records: u64,
    /// Release records whose length is not a multiple of 8 (ignored).
    pub malformed_records: u64,
    /// The first protocol error of a release lane: its later tokens never arrive.
    pub lane_error: Option<D2hError>,
}

impl DeviceReleaseStats {
    /// Tokens and records refused, of every kind: non-zero means a kernel sent what no block
    /// of this pool was lent for.
    pub fn refused(&self) -> u64 {
        self.tokens.refused() + self.foreign_records + self.malformed_records
    }
}

/// Why [`Block::release_on_device`](super::Block::release_on_device) gave the block back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RefusedReason {
    /// The pool has no release feed ([`Pool::set_release_feed`](super::Pool::set_release_feed)):
    /// no token could ever arrive.
    #[error("the pool has no release feed")]
    NoFeed,
    /// The pool's last handle is gone: nothing will drain new tokens.
    #[error("the pool is closed")]
    Closed,
    /// `max` blocks are lent already.
    #[error("{max} blocks are lent to kernels already")]
    TableFull {
        /// The table's entries.
        max: u32,
    },
    /// The block is another pool's
    /// ([`Pool::release_many_on_device`](super::Pool::release_many_on_device) lends the pool's
    /// own blocks only).
    #[error("the block belongs to another pool")]
    OtherPool,
}

/// What the lock guards.
struct State {
    tokens: ReleaseTokens<LentBlock>,
    feed: Option<Box<dyn ReleaseFeed>>,
    foreign_records: u64,
    malformed_records: u64,
    lane_error: Option<D2hError>,
    /// The last pool handle is gone: no new lending.
    closed: bool,
}

/// A pool's lent blocks and release feed. One lock; the counts that the hot paths read are
/// atomics beside it.
pub(super) struct Lent {
    state: Mutex<State>,
    /// Blocks lent now (a copy of the table's figure, read without the lock).
    outstanding: AtomicU64,
    /// Blocks a drain took out of the table and has not freed yet ([`InHand`]): still lent, for
    /// [`lent_now`](Self::lent_now).
    in_hand: AtomicU64,
    /// Set while some thread drains: the slow path passes instead of waiting.
    draining: AtomicBool,
    /// Wakes the drain thread when blocks are lent, or the pool closes.
    wake: Condvar,
    /// The drain thread, once started (`pool/drain.rs`).
    pub(super) thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// Records a drain takes at most at once (slots freed for the device in between).
pub(super) const DRAIN_BATCH: usize = 256;

impl Lent {
    /// An empty table of `max_entries` entries (the table's own limit at most), no feed.
    pub(super) fn new(max_entries: u32) -> Self {
        let tag = ReleaseTokens::<()>::new().tag();
        Lent {
            state: Mutex::new(State {
                tokens: ReleaseTokens::with_tag(tag, max_entries),
                feed: None,
                foreign_records: 0,
                malformed_records: 0,
                lane_error: None,
                closed: false,
            }),
            outstanding: AtomicU64::new(0),
            in_hand: AtomicU64::new(0),
            draining: AtomicBool::new(false),
            wake: Condvar::new(),
            thread: Mutex::new(None),
        }
    }

    /// Sets the feed, once: `Err(feed)` if there is one.
    pub(super) fn set_feed<F: ReleaseFeed>(&self, feed: F) -> Result<(), F> {
        let mut s = self.state.lock();
        if s.feed.is_some() {
            return Err(feed);
        }
        s.feed = Some(Box::new(feed));
        Ok(())
    }

    /// Caps the table at `max` entries (tests: a full table without a million blocks); the
    /// table must be empty.
    #[cfg(all(test, not(feature = "loom")))]
    pub(super) fn set_max_entries(&self, max: u32) {
        let mut s = self.state.lock();
        assert_eq!(s.tokens.stats().issued, 0, "a table in use");
        s.tokens = ReleaseTokens::with_tag(s.tokens.tag(), max);
    }

    /// Blocks whose tokens have not arrived.
    #[inline]
    pub(super) fn outstanding(&self) -> u64 {
        self.outstanding.load(Ordering::Acquire)
    }

    /// Blocks lent now: tokens not arrived, or taken by a drain that has not freed them yet. Never
    /// less than the truth: the count a drain takes out of the table is added to `in_hand`
    /// before `outstanding` drops (both under the lock), and this reads `outstanding` first.
    pub(super) fn lent_now(&self) -> u64 {
        let outstanding = self.outstanding.load(Ordering::Acquire);
        outstanding + self.in_hand.load(Ordering::Acquire)
    }

    /// Waits until no drain holds blocks it took out of the table (each frees them right after,
    /// outside every lock of this table).
    pub(super) fn wait_for_frees(&self) {
        while self.in_hand.load(Ordering::Acquire) > 0 {
            std::thread::yield_now();
        }
    }

    /// Lends `block`: its token, or the block and why not.
    pub(super) fn lend(
        &self,
        block: LentBlock,
    ) -> Result<ReleaseToken, (LentBlock, RefusedReason)> {
        match self.lender() {
            Ok(mut lender) => lender.lend(block),
            Err(why) => Err((block, why)),
        }
    }

    /// Takes the table's lock for lending one block or many ([`Lender`]), or why no block can
    /// be lent now (no feed, closed).
    pub(super) fn lender(&self) -> Result<Lender<'_>, RefusedReason> {
        let s = self.state.lock();
        if s.closed {
            return Err(RefusedReason::Closed);
        }
        if s.feed.is_none() {
            return Err(RefusedReason::NoFeed);
        }
        Ok(Lender { lent: self, s })
    }

    /// Copies the table's outstanding count out; returns the one before. Only holders of the
    /// lock store it, so a load and a store do (no read-modify-write), and only a change.
    #[inline]
    fn publish(&self, s: &State) -> u64 {
        let before = self.outstanding.load(Ordering::Relaxed);
        let now = s.tokens.stats().outstanding();
        if now != before {
            self.outstanding.store(now, Ordering::Release);
        }
        before
    }

    /// Takes what arrived (up to [`DRAIN_BATCH`] records) and moves the blocks whose tokens
    /// came into `out`, to be freed by the caller outside the lock. Returns the records taken.
    /// With `wait_for_others` false, passes (0) when another thread is draining.
    /// The blocks put into `out` count as lent until the returned [`InHand`] drops: the caller
    /// frees them, then drops it.
    pub(super) fn drain(
        &self,
        out: &mut Vec<LentBlock>,
        wait_for_others: bool,
    ) -> (usize, InHand<'_>) {
        let mine = self
            .draining
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok();
        if !mine && !wait_for_others {
            return (0, InHand { lent: self, n: 0 });
        }
        let before = out.len();
        let mut s = self.state.lock();
        let taken = Self::drain_locked(&mut s, out);
        let in_hand = self.take_in_hand((out.len() - before) as u64);
        self.publish(&s);
        drop(s);
        if mine {
            self.draining.store(false, Ordering::Release);
        }
        (taken, in_hand)
    }

    /// Counts `n` blocks just taken out of the table as in hand (under the table's lock, before
    /// the outstanding count drops).
    fn take_in_hand(&self, n: u64) -> InHand<'_> {
        if n > 0 {
            self.in_hand.fetch_add(n, Ordering::Release);
        }
        InHand { lent: self, n }
    }

    fn drain_locked(s: &mut State, out: &mut Vec<LentBlock>) -> usize {
        let State {
            tokens,
            feed,
            foreign_records,
            malformed_records,
            lane_error,
            ..
        } = s;
        let Some(feed) = feed else { return 0 };
        let mut handle = |kind: u32, payload: &[u8]| {
            take_record(
                tokens,
                kind,
                payload,
                out,
                foreign_records,
                malformed_records,
            )
        };
        match feed.drain(DRAIN_BATCH, &mut handle) {
            Ok(n) => n,
            Err(e) => {
                lane_error.get_or_insert(e);
                0
            }
        }
    }

    /// Takes every lent block back (their tokens turn stale), into `out`; they count as lent
    /// until the returned [`InHand`] drops.
    pub(super) fn revoke_all(&self, out: &mut Vec<LentBlock>) -> InHand<'_> {
        let mut s = self.state.lock();
        let taken = s.tokens.revoke_all();
        let in_hand = self.take_in_hand(taken.len() as u64);
        out.extend(taken);
        self.publish(&s);
        in_hand
    }

    /// Closes the table (the last pool handle is gone): nothing is lent from now on.
    pub(super) fn close(&self) {
        self.state.lock().closed = true;
        self.wake.notify_all();
    }

    /// Takes the feed out once the table is closed and empty (the drain thread's end): its
    /// memory may go, no kernel holds a token of it any more.
    pub(super) fn take_feed_if_done(&self) -> Option<Box<dyn ReleaseFeed>> {
        let mut s = self.state.lock();
        if s.closed && s.tokens.stats().outstanding() == 0 {
            s.feed.take()
        } else {
            None
        }
    }

    /// Waits until blocks are lent or the table closes (the drain thread's rest).
    pub(super) fn wait_for_work(&self) {
        let mut s: MutexGuard<'_, State> = self.state.lock();
        while s.tokens.stats().outstanding() == 0 && !s.closed {
            self.wake.wait(&mut s);
        }
    }

    /// The counts.
    pub(super) fn stats(&self) -> DeviceReleaseStats {
        let s = self.state.lock();
        let tokens = s.tokens.stats();
        DeviceReleaseStats {
            tokens,
            outstanding: tokens.outstanding() + self.in_hand.load(Ordering::Acquire),
            foreign_records: s.foreign_records,
            malformed_records: s.malformed_records,
            lane_error: s.lane_error.clone(),
        }
    }
}

/// The table's lock, held for lending: one [`lend`](Self::lend) per block, the lock taken once
/// ([`Pool::release_many_on_device`](super::Pool::release_many_on_device) lends a batch so).
/// Dropping it publishes the outstanding count and wakes the drain thread if it was resting,
/// both still under the lock: a caller may not touch the pool state once the lock is released
/// (a drain may free a lent block, and with it the last reference to the pool).
pub(super) struct Lender<'a> {
    lent: &'a Lent,
    s: MutexGuard<'a, State>,
}

impl Lender<'_> {
    /// Lends `block`: its token, or the block and why not (the table is full).
    #[inline]
    pub(super) fn lend(
        &mut self,
        block: LentBlock,
    ) -> Result<ReleaseToken, (LentBlock, RefusedReason)> {
        self.s
            .tokens
            .issue(block)
            .map_err(|TableFull { value, max }| (value, RefusedReason::TableFull { max }))
    }
}

impl Drop for Lender<'_> {
    fn drop(&mut self) {
        if self.lent.publish(&self.s) == 0 && self.s.tokens.stats().outstanding() > 0 {
            self.lent.wake.notify_one();
        }
    }
}

/// Blocks a drain (or a revocation) took out of the table, still counted as lent until this
/// drops: after the caller freed them, or while it unwinds.
#[must_use = "the blocks count as lent until it drops"]
pub(super) struct InHand<'a> {
    lent: &'a Lent,
    n: u64,
}

impl InHand<'_> {
    /// Blocks it counts.
    pub(super) fn len(&self) -> usize {
        self.n as usize
    }
}

impl Drop for InHand<'_> {
    fn drop(&mut self) {
        if self.n > 0 {
            self.lent.in_hand.fetch_sub(self.n, Ordering::Release);
        }
    }
}

/// One record of a release lane: each token redeemed (its block into `out`) or refused and
/// counted by the table; a record of another kind or a torn length counted and ignored.
fn take_record(
    tokens: &mut ReleaseTokens<LentBlock>,
    kind: u32,
    payload: &[u8],
    out: &mut Vec<LentBlock>,
    foreign: &mut u64,
    malformed: &mut u64,
) {
    if kind != KIND_RELEASE {
        *foreign += 1;
        return;
    }
    let Some(each) = tokens_in(payload) else {
        *malformed += 1;
        return;
    };
    // A forged, stale or repeated token is counted by the table and frees nothing.
    out.extend(each.filter_map(|token| tokens.redeem(token).ok()));
}
