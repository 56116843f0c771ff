//! The relay: the owner's thread that passes each lent lane's tail on to its consumer once
//! [`check_advance`] accepted it, and mirrors the consumer's head back to the producer.
//!
//! Per lane, two shared pages (see [`SharedPage`]):
//!
//! | page | written by | words |
//! |------|-----------|-------|
//! | producer page | the remote producer | `[0]` seqlock version (odd while writing), `[1]` tail, `[2]` next seq |
//! | owner page (read-only for the producer) | the relay | `[0]` head, `[1]` state, `[2]` accepted tail, `[3]` accepted seq |
//!
//! States: [`ACTIVE`], [`REVOKED`] (the owner took the lane back), [`CONSUMER_GONE`] (the ring
//! stopped or its consumer exited), [`FAULTED`] (the producer published a tail the owner
//! refused). In any state but active the relay passes nothing on; the lane goes back to its
//! ring only when the producer has detached or died, so nothing it may still write can land
//! under another producer's records.
//!
//! The relay polls: it spins while tails or heads move (a lone record costs the hand-over
//! between two cores, not a wake-up), sleeps
//! [`ShareOptions::relay_idle_poll`](super::ShareOptions::relay_idle_poll) between polls once
//! nothing has moved for [`ShareOptions::relay_spin`](super::ShareOptions::relay_spin), and a
//! millisecond once nothing has moved for a second (a lane that starts again after a pause then
//! waits up to that long for its first tail to pass).

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::os::fd::OwnedFd;

use crate::core::ring::layout::WrapMode;
use crate::core::share::lane::{check_advance, LanePosition};
use crate::error::Result;
use crate::ring::{DeviceRing, LentLane};

use super::event::{PeerId, ShareEvent};
use super::page::SharedPage;

/// A lane that a remote producer may borrow: what the relay needs of it. The share layer
/// implements it for a lane of a [`DeviceRing::new_shareable`] ring ([`LentLane`]); tests and
/// other consumers can implement it over any memory a peer can import.
pub trait LaneTarget: Send {
    /// The lane's number in its ring.
    fn lane(&self) -> u32;
    /// Its region size (a power of two).
    fn capacity(&self) -> u64;
    /// How records meet the end of the region.
    fn wrap(&self) -> WrapMode;
    /// Where the borrower starts.
    fn start(&self) -> LanePosition;
    /// The consumer's head (cheap: called on every poll).
    fn head(&self) -> u64;
    /// Whether the consumer stopped for good.
    fn consumer_gone(&self) -> bool;
    /// Publishes the borrower's records up to `to` (already checked by
    /// [`check_advance`](crate::share::lane::check_advance)).
    fn publish(&self, to: LanePosition) -> Result<()>;
    /// A new fd of the lane's data allocation, its size and the region's offset in it.
    fn export_data(&self) -> Result<(OwnedFd, u64, u64)>;
}

/// Where lanes come from: a ring shared under a name.
pub trait LaneSource: Send + Sync {
    /// Lends a free lane ([`RefusalCode::Busy`](super::RefusalCode::Busy) to the peer when none is).
    fn lend(&self) -> Result<Box<dyn LaneTarget>>;
}

impl LaneTarget for LentLane {
    fn lane(&self) -> u32 {
        LentLane::lane(self) as u32
    }
    fn capacity(&self) -> u64 {
        LentLane::capacity(self)
    }
    fn wrap(&self) -> WrapMode {
        LentLane::wrap(self)
    }
    fn start(&self) -> LanePosition {
        let (tail, seq) = LentLane::start(self);
        LanePosition { tail, seq }
    }
    fn head(&self) -> u64 {
        LentLane::head(self)
    }
    fn consumer_gone(&self) -> bool {
        LentLane::consumer_gone(self)
    }
    fn publish(&self, to: LanePosition) -> Result<()> {
        LentLane::publish(self, to.tail, to.seq)
    }
    fn export_data(&self) -> Result<(OwnedFd, u64, u64)> {
        LentLane::export_data(self)
    }
}

impl LaneSource for Arc<DeviceRing> {
    fn lend(&self) -> Result<Box<dyn LaneTarget>> {
        Ok(Box::new(self.lend_lane()?))
    }
}

/// After this long with nothing moving, the relay polls every [`IDLE_POLL`] instead of every
/// `relay_idle_poll`.
const IDLE_AFTER: Duration = Duration::from_secs(1);
/// The relay's poll interval once idle for [`IDLE_AFTER`].
const IDLE_POLL: Duration = Duration::from_millis(1);

/// Producer page words.
pub(crate) const P_VERSION: usize = 0;
pub(crate) const P_TAIL: usize = 1;
pub(crate) const P_SEQ: usize = 2;
/// Owner page words.
pub(crate) const O_HEAD: usize = 0;
pub(crate) const O_STATE: usize = 1;
pub(crate) const O_TAIL: usize = 2;
pub(crate) const O_SEQ: usize = 3;

/// The lane is served.
pub const ACTIVE: u64 = 0;
/// The owner revoked the lane.
pub const REVOKED: u64 = 1;
/// The ring was stopped or its consumer exited.
pub const CONSUMER_GONE: u64 = 2;
/// The producer published a tail the owner refused.
pub const FAULTED: u64 = 3;

/// Reads the producer's `(tail, seq)` pair consistently (a seqlock: `None` while the producer is
/// between its two stores, or if it never finishes one).
pub(crate) fn read_position(page: &SharedPage) -> Option<LanePosition> {
    for _ in 0..4 {
        let v1 = page.word(P_VERSION).load(Ordering::Acquire);
        if v1 & 1 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let tail = page.word(P_TAIL).load(Ordering::Relaxed);
        let seq = page.word(P_SEQ).load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if page.word(P_VERSION).load(Ordering::Relaxed) == v1 {
            return Some(LanePosition { tail, seq });
        }
    }
    None
}

/// Writes `(tail, seq)` as the producer (the only writer of its page).
pub(crate) fn write_position(page: &SharedPage, at: LanePosition) {
    let version = page.word(P_VERSION);
    let v = version.load(Ordering::Relaxed);
    version.store(v.wrapping_add(1) | 1, Ordering::Relaxed);
    fence(Ordering::Release);
    page.word(P_TAIL).store(at.tail, Ordering::Relaxed);
    page.word(P_SEQ).store(at.seq, Ordering::Relaxed);
    version.store((v | 1).wrapping_add(1), Ordering::Release);
}

/// One lent lane as the relay serves it.
pub(crate) struct RelayLane {
    pub(crate) peer: PeerId,
    pub(crate) attachment: u32,
    pub(crate) target: Box<dyn LaneTarget>,
    pub(crate) producer: SharedPage,
    pub(crate) owner: SharedPage,
    published: LanePosition,
    head: u64,
    state: u64,
}

impl RelayLane {
    pub(crate) fn new(
        peer: PeerId,
        attachment: u32,
        target: Box<dyn LaneTarget>,
        producer: SharedPage,
        owner: SharedPage,
    ) -> RelayLane {
        let start = target.start();
        let head = target.head();
        write_position(&producer, start);
        owner.word(O_HEAD).store(head, Ordering::Release);
        owner.word(O_TAIL).store(start.tail, Ordering::Release);
        owner.word(O_SEQ).store(start.seq, Ordering::Release);
        owner.word(O_STATE).store(ACTIVE, Ordering::Release);
        RelayLane {
            peer,
            attachment,
            target,
            producer,
            owner,
            published: start,
            head,
            state: ACTIVE,
        }
    }

    /// One look at the lane: passes an accepted tail on, mirrors the head. True if anything
    /// moved.
    fn serve(&mut self, faults: &AtomicU64, events: &dyn Fn(ShareEvent)) -> bool {
        let mut moved = false;
        if self.state == ACTIVE {
            if let Some(proposed) = read_position(&self.producer) {
                let head = self.target.head();
                match check_advance(self.target.capacity(), head, self.published, proposed) {
                    Ok(false) => {}
                    Ok(true) => match self.target.publish(proposed) {
                        Ok(()) => {
                            self.published = proposed;
                            self.owner
                                .word(O_SEQ)
                                .store(proposed.seq, Ordering::Release);
                            self.owner
                                .word(O_TAIL)
                                .store(proposed.tail, Ordering::Release);
                            moved = true;
                        }
                        Err(e) => self.fault(e.to_string(), faults, events),
                    },
                    Err(bad) => self.fault(bad.to_string(), faults, events),
                }
            }
            if self.state == ACTIVE && self.target.consumer_gone() {
                self.set_state(CONSUMER_GONE);
            }
        }
        let head = self.target.head();
        if head != self.head {
            self.head = head;
            self.owner.word(O_HEAD).store(head, Ordering::Release);
            moved = true;
        }
        moved
    }

    fn fault(&mut self, why: String, faults: &AtomicU64, events: &dyn Fn(ShareEvent)) {
        faults.fetch_add(1, Ordering::Relaxed);
        self.set_state(FAULTED);
        events(ShareEvent::LaneFault {
            peer: self.peer,
            lane: self.target.lane(),
            error: why,
        });
    }

    fn set_state(&mut self, state: u64) {
        self.state = state;
        self.owner.word(O_STATE).store(state, Ordering::Release);
    }
}

/// The relay's lanes and its thread's controls.
pub(crate) struct Relay {
    lanes: Mutex<Vec<RelayLane>>,
    stop: AtomicBool,
    pub(crate) faults: AtomicU64,
    spin: Duration,
    idle_poll: Duration,
    thread: Mutex<Option<std::thread::Thread>>,
}

impl Relay {
    pub(crate) fn new(spin: Duration, idle_poll: Duration) -> Arc<Relay> {
        Arc::new(Relay {
            lanes: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            faults: AtomicU64::new(0),
            spin,
            idle_poll,
            thread: Mutex::new(None),
        })
    }

    /// The thread's body: until [`stop`](Self::stop).
    pub(crate) fn run(&self, events: &dyn Fn(ShareEvent)) {
        *self.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::thread::current());
        let mut last_moved = Instant::now();
        while !self.stop.load(Ordering::Acquire) {
            let (moved, any) = {
                let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
                let mut moved = false;
                for lane in lanes.iter_mut() {
                    moved |= lane.serve(&self.faults, events);
                }
                (moved, !lanes.is_empty())
            };
            if moved {
                last_moved = Instant::now();
            } else if !any {
                // Nothing to serve: sleep until a lane is added (or the owner stops).
                std::thread::park_timeout(Duration::from_millis(100));
            } else if last_moved.elapsed() < self.spin {
                for _ in 0..32 {
                    std::hint::spin_loop();
                }
            } else if last_moved.elapsed() < IDLE_AFTER {
                std::thread::sleep(self.idle_poll);
            } else {
                // Long idle: a lane that starts again waits at most this long for its first tail.
                std::thread::sleep(IDLE_POLL);
            }
        }
    }

    pub(crate) fn add(&self, lane: RelayLane) {
        self.lanes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(lane);
        self.wake();
    }

    /// Takes a lane out of service after one last look (what its producer published before it
    /// detached or died is passed on, if it is valid): the caller drops it, which gives the lane
    /// back to its ring.
    pub(crate) fn remove(
        &self,
        peer: PeerId,
        attachment: u32,
        events: &dyn Fn(ShareEvent),
    ) -> Option<RelayLane> {
        let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        let i = lanes
            .iter()
            .position(|l| l.peer == peer && l.attachment == attachment)?;
        let mut lane = lanes.swap_remove(i);
        lane.serve(&self.faults, events);
        Some(lane)
    }

    /// Stops passing the lane's tails on (the producer sees [`REVOKED`]); true if it exists.
    pub(crate) fn revoke(&self, peer: PeerId, attachment: u32) -> bool {
        let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        match lanes
            .iter_mut()
            .find(|l| l.peer == peer && l.attachment == attachment)
        {
            Some(lane) => {
                if lane.state == ACTIVE {
                    lane.set_state(REVOKED);
                }
                true
            }
            None => false,
        }
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake();
    }

    fn wake(&self) {
        if let Some(t) = self
            .thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            t.unpark();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seqlock_pair_reads_back_and_an_unfinished_write_reads_as_none() {
        let page = SharedPage::create("relay-test", true).unwrap();
        assert_eq!(read_position(&page), Some(LanePosition { tail: 0, seq: 0 }));
        write_position(
            &page,
            LanePosition {
                tail: 4096,
                seq: 12,
            },
        );
        assert_eq!(
            read_position(&page),
            Some(LanePosition {
                tail: 4096,
                seq: 12
            })
        );
        assert_eq!(page.word(P_VERSION).load(Ordering::Relaxed) & 1, 0);
        // A producer stopped between its stores (killed, say): odd version, never read.
        page.word(P_VERSION).store(7, Ordering::Relaxed);
        assert_eq!(read_position(&page), None);
    }
}
