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
//!
//! While it spins, a poll is two plain loads per lane (the producer page's seqlock version and
//! the consumer's head, each against the value last seen) and one `pause`: no lock (the lanes'
//! is held for [`CHECK_EVERY`] polls at a time), no clock, no syscall. Only a lane whose
//! version or head moved is served (the pair read under the seqlock, checked, passed on). Every
//! [`CHECK_EVERY`] polls the relay reads the clock and serves every lane in full, which also
//! asks whether the consumer is gone (a mutex and, every 200 µs, a driver call for a ring's
//! lanes). The gap between two polls is what a tail, and then the head, waits for on top of the
//! hand-overs, twice per round trip: it is kept to one `pause` (BENCHMARKS.md, "Where the lone
//! record's 0.94 µs go").

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
/// Spinning polls in one look: between two looks at the clock and two full passes (each lane
/// served whole, its consumer asked whether it is gone), a few microseconds of polls.
pub(crate) const CHECK_EVERY: u32 = 64;

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

/// Reads the producer's `(tail, seq)` pair consistently, with the (even) seqlock version it was
/// read under (`None` while the producer is between its two stores, or if it never finishes
/// one).
pub(crate) fn read_position(page: &SharedPage) -> Option<(u64, LanePosition)> {
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
            return Some((v1, LanePosition { tail, seq }));
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
    /// The producer page's seqlock version of the last pair read: a poll that finds it
    /// unchanged has nothing to read.
    version: u64,
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
        // Odd: no pair was read yet, so the first poll serves the lane whatever it finds.
        let version = 1;
        RelayLane {
            peer,
            attachment,
            target,
            producer,
            owner,
            published: start,
            version,
            head,
            state: ACTIVE,
        }
    }

    /// The spinning relay's look at the lane: two plain loads, and the lane served only if its
    /// producer page's version or its consumer's head moved. True if anything moved.
    fn poll(&mut self, faults: &AtomicU64, events: &dyn Fn(ShareEvent)) -> bool {
        let published = self.state == ACTIVE
            && self.producer.word(P_VERSION).load(Ordering::Relaxed) != self.version;
        if published || self.target.head() != self.head {
            self.serve(false, faults, events)
        } else {
            false
        }
    }

    /// One whole look at the lane: passes an accepted tail on, mirrors the head, and with
    /// `full` asks whether the consumer is gone. True if anything moved.
    fn serve(&mut self, full: bool, faults: &AtomicU64, events: &dyn Fn(ShareEvent)) -> bool {
        let mut moved = false;
        if self.state == ACTIVE {
            if let Some((version, proposed)) = read_position(&self.producer) {
                // Every outcome below deals with this pair for good (passed on, nothing new,
                // or the lane faulted): the next poll reads again only once it changes.
                self.version = version;
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
            if full && self.state == ACTIVE && self.target.consumer_gone() {
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
        let mut spinning = true;
        while !self.stop.load(Ordering::Acquire) {
            let polls = if spinning { CHECK_EVERY - 1 } else { 0 };
            let (moved, any) = self.look(polls, events);
            let now = Instant::now();
            if moved {
                last_moved = now;
            }
            let quiet = now - last_moved;
            spinning = any && quiet < self.spin;
            if !any {
                // Nothing to serve: sleep until a lane is added (or the owner stops), then spin
                // for a while, as a new producer is likely to publish soon.
                std::thread::park_timeout(Duration::from_millis(100));
                last_moved = Instant::now();
                spinning = true;
            } else if spinning {
                std::hint::spin_loop();
            } else if quiet < IDLE_AFTER {
                std::thread::sleep(self.idle_poll);
            } else {
                // Long idle: a lane that starts again waits at most this long for its first tail.
                std::thread::sleep(IDLE_POLL);
            }
        }
    }

    /// Under the lanes' lock: up to `polls` quick polls of every lane, a `pause` after each (a
    /// lane is served only if its producer page or head moved: no clock, no syscall), ending
    /// after the first poll that served one, then one full pass (each lane served whole, its
    /// consumer asked whether it is gone). Returns whether anything moved and whether there is
    /// any lane. The owner's other thread, adding, taking back or revoking a lane, waits for the
    /// end of it: a few microseconds.
    fn look(&self, polls: u32, events: &dyn Fn(ShareEvent)) -> (bool, bool) {
        let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        let mut moved = false;
        for _ in 0..polls {
            for lane in lanes.iter_mut() {
                moved |= lane.poll(&self.faults, events);
            }
            if moved {
                // Served lanes cost more than polls: the lock is held no longer than a poll of
                // them past the quiet ones.
                break;
            }
            std::hint::spin_loop();
        }
        for lane in lanes.iter_mut() {
            moved |= lane.serve(true, &self.faults, events);
        }
        (moved, !lanes.is_empty())
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
        lane.serve(true, &self.faults, events);
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
    use std::sync::atomic::AtomicBool;

    /// A lane target over plain words that counts what the relay asks of it.
    #[derive(Default)]
    struct Words {
        head: AtomicU64,
        gone: AtomicBool,
        heads_read: AtomicU64,
        gone_asked: AtomicU64,
        published: Mutex<Vec<LanePosition>>,
    }

    struct Fake(Arc<Words>);

    impl LaneTarget for Fake {
        fn lane(&self) -> u32 {
            0
        }
        fn capacity(&self) -> u64 {
            4096
        }
        fn wrap(&self) -> WrapMode {
            WrapMode::Padded
        }
        fn start(&self) -> LanePosition {
            LanePosition::default()
        }
        fn head(&self) -> u64 {
            self.0.heads_read.fetch_add(1, Ordering::Relaxed);
            self.0.head.load(Ordering::Acquire)
        }
        fn consumer_gone(&self) -> bool {
            self.0.gone_asked.fetch_add(1, Ordering::Relaxed);
            self.0.gone.load(Ordering::Acquire)
        }
        fn publish(&self, to: LanePosition) -> Result<()> {
            self.0.published.lock().unwrap().push(to);
            Ok(())
        }
        fn export_data(&self) -> Result<(OwnedFd, u64, u64)> {
            unreachable!("the relay never exports")
        }
    }

    fn lane(words: &Arc<Words>) -> RelayLane {
        RelayLane::new(
            1,
            1,
            Box::new(Fake(Arc::clone(words))),
            SharedPage::create("relay-producer", true).unwrap(),
            SharedPage::create("relay-owner", false).unwrap(),
        )
    }

    fn at(tail: u64, seq: u64) -> LanePosition {
        LanePosition { tail, seq }
    }

    #[test]
    fn a_poll_serves_a_lane_only_once_its_page_or_head_moved() {
        let words = Arc::new(Words::default());
        let mut l = lane(&words);
        let faults = AtomicU64::new(0);
        let faulted = Mutex::new(Vec::new());
        let events = |e| faulted.lock().unwrap().push(e);
        // The first poll reads the start pair: nothing new.
        assert!(!l.poll(&faults, &events));
        // Nothing moved since: one load of the head, no read of the pair, no consumer asked.
        let before = words.heads_read.load(Ordering::Relaxed);
        for _ in 0..10 {
            assert!(!l.poll(&faults, &events));
        }
        assert_eq!(words.heads_read.load(Ordering::Relaxed) - before, 10);
        // Two 32-byte records published: passed on at the next poll, once.
        write_position(&l.producer, at(64, 2));
        assert!(l.poll(&faults, &events));
        assert!(!l.poll(&faults, &events));
        assert_eq!(*words.published.lock().unwrap(), [at(64, 2)]);
        assert_eq!(l.owner.word(O_TAIL).load(Ordering::Acquire), 64);
        assert_eq!(l.owner.word(O_SEQ).load(Ordering::Acquire), 2);
        // The consumer's head moved: mirrored at the next poll.
        words.head.store(64, Ordering::Release);
        assert!(l.poll(&faults, &events));
        assert_eq!(l.owner.word(O_HEAD).load(Ordering::Acquire), 64);
        // A producer stopped in the middle of a publication (odd version) holds up nothing.
        l.producer.word(P_VERSION).store(5, Ordering::Relaxed);
        words.head.store(32 + 64, Ordering::Release);
        assert!(l.poll(&faults, &events));
        assert_eq!(l.owner.word(O_HEAD).load(Ordering::Acquire), 96);
        assert_eq!(words.published.lock().unwrap().len(), 1);
        // Polls never ask whether the consumer is gone; a full look does.
        words.gone.store(true, Ordering::Release);
        assert!(!l.poll(&faults, &events));
        assert_eq!(words.gone_asked.load(Ordering::Relaxed), 0);
        assert_eq!(l.owner.word(O_STATE).load(Ordering::Acquire), ACTIVE);
        l.serve(true, &faults, &events);
        assert_eq!(l.owner.word(O_STATE).load(Ordering::Acquire), CONSUMER_GONE);
        assert_eq!(faults.load(Ordering::Relaxed), 0);
        assert!(faulted.lock().unwrap().is_empty());
    }

    #[test]
    fn a_bad_pair_faults_the_lane_once_and_is_never_passed_on() {
        let words = Arc::new(Words::default());
        let mut l = lane(&words);
        let faults = AtomicU64::new(0);
        let seen = Mutex::new(Vec::new());
        let events = |e| seen.lock().unwrap().push(e);
        write_position(&l.producer, at(40, 1)); // not a record boundary
        l.poll(&faults, &events);
        for _ in 0..10 {
            l.poll(&faults, &events);
        }
        write_position(&l.producer, at(64, 2)); // valid, but the lane has faulted
        l.poll(&faults, &events);
        assert_eq!(faults.load(Ordering::Relaxed), 1);
        assert_eq!(seen.lock().unwrap().len(), 1);
        assert!(words.published.lock().unwrap().is_empty());
        assert_eq!(l.owner.word(O_STATE).load(Ordering::Acquire), FAULTED);
        assert_eq!(l.owner.word(O_TAIL).load(Ordering::Acquire), 0);
    }

    #[test]
    fn the_spinning_relay_passes_tails_on_and_still_sees_the_consumer_go() {
        let relay = Relay::new(Duration::from_millis(2), Duration::from_micros(20));
        let thread = {
            let relay = Arc::clone(&relay);
            std::thread::spawn(move || relay.run(&|_| {}))
        };
        let words = Arc::new(Words::default());
        let l = lane(&words);
        let producer = l.producer.fd().try_clone_to_owned().unwrap();
        let owner = l.owner.fd().try_clone_to_owned().unwrap();
        let producer = SharedPage::map_received(producer, true, "producer page").unwrap();
        let owner = SharedPage::map_received(owner, false, "owner page").unwrap();
        relay.add(l);
        let until = |what: &str, done: &dyn Fn() -> bool| {
            let t = Instant::now();
            while !done() {
                assert!(t.elapsed() < Duration::from_secs(5), "{what} within 5 s");
                std::thread::yield_now();
            }
        };
        // Records published one after another, each head mirrored back (the relay spins), then
        // a pause past the spin and the idle polls: the next tail still passes.
        for (k, pause) in [(1, 0), (2, 0), (3, 0), (4, 30), (5, 0)] {
            std::thread::sleep(Duration::from_millis(pause));
            write_position(&producer, at(32 * k, k));
            until("the tail passed on", &|| {
                owner.word(O_TAIL).load(Ordering::Acquire) == 32 * k
            });
            words.head.store(32 * k, Ordering::Release);
            until("the head mirrored", &|| {
                owner.word(O_HEAD).load(Ordering::Acquire) == 32 * k
            });
        }
        // The consumer goes while the relay spins: the producer learns it.
        words.gone.store(true, Ordering::Release);
        until("the consumer's end seen", &|| {
            owner.word(O_STATE).load(Ordering::Acquire) == CONSUMER_GONE
        });
        relay.stop();
        thread.join().unwrap();
        assert_eq!(words.published.lock().unwrap().len(), 5);
    }

    #[test]
    fn the_seqlock_pair_reads_back_and_an_unfinished_write_reads_as_none() {
        let page = SharedPage::create("relay-test", true).unwrap();
        assert_eq!(
            read_position(&page),
            Some((0, LanePosition { tail: 0, seq: 0 }))
        );
        write_position(
            &page,
            LanePosition {
                tail: 4096,
                seq: 12,
            },
        );
        assert_eq!(
            read_position(&page),
            Some((
                2,
                LanePosition {
                    tail: 4096,
                    seq: 12
                }
            ))
        );
        assert_eq!(page.word(P_VERSION).load(Ordering::Relaxed) & 1, 0);
        // A producer stopped between its stores (killed, say): odd version, never read.
        page.word(P_VERSION).store(7, Ordering::Relaxed);
        assert_eq!(read_position(&page), None);
    }
}
