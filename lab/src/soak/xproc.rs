//! `vkgdr soak --xproc`: a second ring on each device, made shareable and shared through a
//! [`ShareServer`], whose lanes are fed by producer processes (`vkgdr bench-child soak-producer`,
//! no CUDA) of sealed records that its checking kernel verifies; every `--kill-every` seconds, at
//! a random moment of the period, one producer is killed with SIGKILL (often in the middle of a
//! record or a batch) and, once the owner has seen it go ([`ShareEvent::Gone`]: its lane back at
//! the last accepted record), a new one is started, which attaches the free lane and goes on from
//! there.
//!
//! What is checked at the end: every producer still running is told to stop, publishes what it
//! wrote and says where the owner accepted it to; the kernel must then have checked exactly the
//! records accepted on each lane (its count and its next sequence number equal the lane's
//! accepted sequence number: no record lost, none torn, none twice), with no error; the owner must
//! have refused no tail (lane faults) and seen no peer break the protocol. The accounting of the
//! lanes ([`Ledger`]) is pure and tested here.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use vkgdr::cuda_objects::{Module, Stream};
use vkgdr::ring::layout;
use vkgdr::ring::DeviceRing;
use vkgdr::share::{ShareEvent, ShareOptions, ShareServer};
use vkgdr::Gpu;

use super::counters::Counters;
use super::workers::launch_checker;
use crate::child::process::{socket_path, ChildProcess, Spawn};
use crate::child::protocol::Line;

/// The name the ring is shared under.
const RING: &str = "soak";
/// Each lane of the shared ring.
const LANE_BYTES: u64 = 4 << 20;
/// How long a new producer may take to attach (a Vulkan instance and device; longer while the
/// BAR is exhausted).
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the owner may take to see a killed producer go.
const GONE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a producer told to stop may take to say `done`, and to exit.
const DONE_TIMEOUT: Duration = Duration::from_secs(30);

/// What `--xproc` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct XprocOptions {
    /// Producer processes (and lanes) per device.
    pub(super) producers: u32,
    /// Seconds between kills.
    pub(super) kill_every: u64,
}

/// Where each lane of the shared ring stands, as the producers' reports tell it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Ledger {
    lanes: Vec<LaneBook>,
}

/// One lane's account.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct LaneBook {
    /// The producer process holding it now.
    pub(super) holder: Option<u32>,
    /// The owner's accepted end and next sequence number, as last reported.
    pub(super) tail: u64,
    pub(super) seq: u64,
    /// Producers that held it.
    pub(super) producers: u64,
}

impl Ledger {
    /// `lanes` lanes, nothing accepted yet.
    pub(super) fn new(lanes: u32) -> Ledger {
        Ledger {
            lanes: vec![LaneBook::default(); lanes as usize],
        }
    }

    /// `pid` attached `lane`, starting at `(tail, seq)`: the lane must be free, and the start at
    /// or past what its last producer reported (the owner may have accepted more after its last
    /// report, never less).
    pub(super) fn attached(
        &mut self,
        pid: u32,
        lane: u64,
        tail: u64,
        seq: u64,
    ) -> Result<(), String> {
        if self.lane_of(pid).is_some() {
            return Err(format!(
                "producer pid {pid} attached a second lane ({lane})"
            ));
        }
        let book = usize::try_from(lane)
            .ok()
            .and_then(|l| self.lanes.get_mut(l))
            .ok_or_else(|| {
                format!("producer pid {pid} was lent lane {lane}, which the ring lacks")
            })?;
        if let Some(other) = book.holder {
            return Err(format!(
                "producer pid {pid} was lent lane {lane}, which pid {other} holds"
            ));
        }
        if tail < book.tail || seq < book.seq {
            return Err(format!(
                "lane {lane} restarted at tail {tail} seq {seq}, behind the accepted tail {} seq {}",
                book.tail, book.seq
            ));
        }
        *book = LaneBook {
            holder: Some(pid),
            tail,
            seq,
            producers: book.producers + 1,
        };
        Ok(())
    }

    /// `pid`'s report of the owner's accepted position on its lane: its end and its sequence
    /// number each only move forward. (Not always together: a wrap pad moves the end alone, and a
    /// report read while the owner moved on may pair the old end with the new number.)
    pub(super) fn accepted(&mut self, pid: u32, tail: u64, seq: u64) -> Result<(), String> {
        let lane = self
            .lane_of(pid)
            .ok_or_else(|| format!("producer pid {pid} reported records without a lane"))?;
        let book = &mut self.lanes[lane];
        if tail < book.tail || seq < book.seq {
            return Err(format!(
                "lane {lane}: the accepted position went from tail {} seq {} to tail {tail} seq {seq}",
                book.tail, book.seq
            ));
        }
        book.tail = tail;
        book.seq = seq;
        Ok(())
    }

    /// `pid` is gone (killed, or exited): its lane is free, at the position last reported.
    pub(super) fn released(&mut self, pid: u32) {
        if let Some(l) = self.lane_of(pid) {
            self.lanes[l].holder = None;
        }
    }

    /// The lane `pid` holds.
    pub(super) fn lane_of(&self, pid: u32) -> Option<usize> {
        self.lanes.iter().position(|b| b.holder == Some(pid))
    }

    /// Each lane's account.
    pub(super) fn lanes(&self) -> &[LaneBook] {
        &self.lanes
    }

    /// Records accepted on every lane.
    pub(super) fn total(&self) -> u64 {
        self.lanes.iter().map(|b| b.seq).sum()
    }
}

/// The next kill: a random moment of the period that starts at `period`.
pub(super) fn kill_moment(period: Instant, every: Duration, rng: &mut impl Rng) -> Instant {
    let ms = every.as_millis().max(1) as u64;
    period + Duration::from_millis(rng.gen_range(0..ms))
}

/// One producer process.
struct Producer {
    process: ChildProcess,
    started: Instant,
    ready: bool,
}

/// The shared ring of one device, its kernel and its server.
pub(super) struct XprocSoak {
    ring: Arc<DeviceRing>,
    stream: Stream,
    server: ShareServer,
    options: XprocOptions,
    /// Producers started so far on this device (names and seeds).
    serial: AtomicU64,
}

/// What [`XprocSoak::drive`] leaves for [`XprocSoak::finish`].
pub(super) struct Driven {
    ledger: Ledger,
    pids: Vec<u32>,
}

impl XprocSoak {
    /// The shared ring with its checking kernel running, and the server sharing it.
    pub(super) fn start(
        gpu: &Gpu,
        module: &Module,
        options: XprocOptions,
    ) -> vkgdr::Result<XprocSoak> {
        let ring = Arc::new(DeviceRing::new_shareable(
            gpu,
            LANE_BYTES,
            options.producers,
        )?);
        let stream = Stream::new(gpu)?;
        launch_checker(module, &ring, &stream)?;
        let server = ShareServer::bind(socket_path("soak"), gpu.vulkan(), ShareOptions::default())?;
        server.share_ring(RING, &ring)?;
        Ok(XprocSoak {
            ring,
            stream,
            server,
            options,
            serial: AtomicU64::new(0),
        })
    }

    fn spawn(&self, c: &Counters) -> Option<Producer> {
        let n = self.serial.fetch_add(1, Ordering::Relaxed);
        let spawned = ChildProcess::spawn(Spawn {
            name: format!("{} producer process {n}", c.soak()),
            args: vec![
                "soak-producer".into(),
                format!("--socket={}", self.server.path().display()),
                format!("--ring={RING}"),
                format!("--seed={}", 1000 + n),
            ],
            no_cuda: true,
            keep_fd: None,
        });
        match spawned {
            Ok(process) => {
                c.xproc_started.fetch_add(1, Ordering::Relaxed);
                Some(Producer {
                    process,
                    started: Instant::now(),
                    ready: false,
                })
            }
            Err(e) => {
                c.fail(e.to_string());
                None
            }
        }
    }

    /// Starts producers until there is one per lane (a device that cannot start them gives up
    /// after 10 failures, each said).
    fn top_up(
        &self,
        producers: &mut Vec<Producer>,
        pids: &mut Vec<u32>,
        gone: &mut BTreeSet<u32>,
        failures: &mut u32,
        c: &Counters,
    ) {
        while producers.len() < self.options.producers as usize && *failures < 10 {
            match self.spawn(c) {
                Some(p) => {
                    // A pid the kernel gave again is a new process, not yet gone.
                    gone.remove(&p.process.pid());
                    pids.push(p.process.pid());
                    producers.push(p);
                }
                None => *failures += 1,
            }
        }
    }

    /// Files what `p` said; false once it failed (said an error, or broke the ledger).
    fn file(p: &mut Producer, ledger: &mut Ledger, c: &Counters) -> bool {
        let pid = p.process.pid();
        loop {
            let line: Line = match p.process.next_line() {
                Ok(Some(l)) => l,
                Ok(None) => break,
                Err(e) => {
                    c.fail(e.to_string());
                    return false;
                }
            };
            let filed = match line.kind.as_str() {
                "ready" => (|| {
                    ledger.attached(pid, line.u64("lane")?, line.u64("tail")?, line.u64("seq")?)
                })()
                .map(|()| p.ready = true),
                "accepted" | "done" => {
                    (|| ledger.accepted(pid, line.u64("tail")?, line.u64("seq")?))()
                }
                _ => Ok(()),
            };
            if let Err(e) = filed {
                c.fail(format!("{}: {e}", p.process.who()));
                return false;
            }
        }
        true
    }

    /// [`file`](Self::file)s what `p` said, and checks that it still runs and has attached in
    /// time; false once it failed.
    fn hear(p: &mut Producer, ledger: &mut Ledger, c: &Counters) -> bool {
        if !Self::file(p, ledger, c) {
            return false;
        }
        if let Some(status) = p.process.has_exited() {
            c.fail(format!(
                "{} exited ({status}) while producing",
                p.process.who()
            ));
            return false;
        }
        if !p.ready && p.started.elapsed() > READY_TIMEOUT {
            c.fail(format!(
                "{} attached no lane within {} s",
                p.process.who(),
                READY_TIMEOUT.as_secs()
            ));
            return false;
        }
        true
    }

    /// The owner's events: refused tails and broken protocol are failures; the pids seen to go
    /// are added to `gone`.
    fn events(&self, gone: &mut BTreeSet<u32>, c: &Counters) {
        while let Some(e) = self.server.next_event(Duration::ZERO) {
            match e {
                ShareEvent::Gone { pid, .. } => {
                    gone.insert(pid as u32);
                }
                ShareEvent::LaneFault { peer, lane, error } => c.fail(format!(
                    "xproc: the owner refused a tail of peer {peer} on lane {lane}: {error}"
                )),
                ShareEvent::Misbehaved { peer, error } => {
                    c.fail(format!("xproc: peer {peer} broke the protocol: {error}"))
                }
                _ => {}
            }
        }
    }

    /// Waits until the owner has seen `pid` go (its lane back in the ring).
    fn wait_gone(&self, pid: u32, gone: &mut BTreeSet<u32>, c: &Counters) -> bool {
        let t = Instant::now();
        while !gone.contains(&pid) {
            if t.elapsed() > GONE_TIMEOUT {
                c.fail(format!(
                    "xproc: the owner did not see producer pid {pid} go within {} s",
                    GONE_TIMEOUT.as_secs()
                ));
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
            self.events(gone, c);
        }
        true
    }

    /// Hears every producer ([`Self::hear`]) and retires those that went.
    fn hear_all(
        &self,
        producers: &mut Vec<Producer>,
        ledger: &mut Ledger,
        gone: &mut BTreeSet<u32>,
        c: &Counters,
    ) {
        let mut i = 0;
        while i < producers.len() {
            if Self::hear(&mut producers[i], ledger, c) {
                i += 1;
            } else {
                let p = producers.swap_remove(i);
                self.retire(p, ledger, gone, c);
            }
        }
    }

    /// Takes a producer out (killed already, or failed): what it said last is filed, its lane is
    /// free once the owner saw it go.
    fn retire(&self, mut p: Producer, ledger: &mut Ledger, gone: &mut BTreeSet<u32>, c: &Counters) {
        let pid = p.process.pid();
        if let Err(e) = p.process.kill() {
            c.fail(e.to_string());
        }
        // What it said before it died stands (an attach, reports of accepted records).
        Self::file(&mut p, ledger, c);
        if p.ready {
            self.wait_gone(pid, gone, c);
        }
        ledger.released(pid);
    }

    /// The producers' life until `until` (or `stop`): started, heard, killed one per period and
    /// replaced; then each told to stop and heard to the end. Runs on a thread of its own, which
    /// outlives every process it starts.
    pub(super) fn drive(&self, until: Instant, stop: &AtomicBool, c: &Counters) -> Driven {
        let mut ledger = Ledger::new(self.options.producers);
        let mut gone = BTreeSet::new();
        let mut pids = Vec::new();
        let mut rng = rand::rngs::StdRng::seed_from_u64(u64::from(std::process::id()));
        let mut producers: Vec<Producer> = Vec::new();
        let every = Duration::from_secs(self.options.kill_every);
        let mut period = Instant::now();
        let mut kill_at = kill_moment(period, every, &mut rng);
        let mut spawn_failures = 0;
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            self.top_up(&mut producers, &mut pids, &mut gone, &mut spawn_failures, c);
            self.events(&mut gone, c);
            self.hear_all(&mut producers, &mut ledger, &mut gone, c);
            c.xproc_accepted.store(ledger.total(), Ordering::Relaxed);
            if Instant::now() >= kill_at {
                let ready: Vec<usize> = (0..producers.len())
                    .filter(|&i| producers[i].ready)
                    .collect();
                if !ready.is_empty() {
                    let p = producers.swap_remove(ready[rng.gen_range(0..ready.len())]);
                    c.xproc_killed.fetch_add(1, Ordering::Relaxed);
                    // SIGKILL wherever it is: often in the middle of a record or a batch.
                    self.retire(p, &mut ledger, &mut gone, c);
                }
                period += every;
                kill_at = kill_moment(period, every, &mut rng);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // Every lane held by a producer that has attached (a kill just before the end is
        // replaced too), so each lane ends with a clean stop and a last word.
        self.top_up(&mut producers, &mut pids, &mut gone, &mut spawn_failures, c);
        let t = Instant::now();
        while producers.iter().any(|p| !p.ready) && t.elapsed() < READY_TIMEOUT {
            self.hear_all(&mut producers, &mut ledger, &mut gone, c);
            std::thread::sleep(Duration::from_millis(5));
        }
        for p in &mut producers {
            let _ = p.process.send(crate::child::protocol::QUIT);
        }
        for mut p in producers {
            let pid = p.process.pid();
            match p.process.expect("done", DONE_TIMEOUT) {
                Ok(done) => {
                    // The `accepted` lines before it, then its last word.
                    Self::file(&mut p, &mut ledger, c);
                    let filed = (|| ledger.accepted(pid, done.u64("tail")?, done.u64("seq")?))();
                    if let Err(e) = filed {
                        c.fail(format!("{}: {e}", p.process.who()));
                    }
                    if let Err(e) = p.process.finish(DONE_TIMEOUT) {
                        c.fail(e.to_string());
                    }
                    self.wait_gone(pid, &mut gone, c);
                    ledger.released(pid);
                }
                Err(e) => {
                    c.fail(format!("{e} (told to stop)"));
                    self.retire(p, &mut ledger, &mut gone, c);
                }
            }
        }
        self.events(&mut gone, c);
        c.xproc_accepted.store(ledger.total(), Ordering::Relaxed);
        Driven { ledger, pids }
    }

    /// After [`drive`](Self::drive): the server goes (its socket with it), the kernel stops,
    /// and what it checked is held against the ledger. Then waits (10 s at most) until NVML lists
    /// none of the producers any more, so the soak's last figures do not count them.
    pub(super) fn finish(self, driven: Driven, gpu: &Gpu, c: &Counters) {
        // Each fault and misbehaving peer failed the soak as its event came (drive).
        let stats = self.server.stats();
        c.xproc_lane_faults
            .fetch_add(stats.lane_faults, Ordering::Relaxed);
        drop(self.server);
        if let Err(e) = self.ring.stop_and_wait(Duration::from_secs(30)) {
            c.fail(format!("xproc: the shared ring's kernel did not stop: {e}"));
            return;
        }
        let (mut checked, mut errors) = (0, 0);
        for (lane, book) in driven.ledger.lanes().iter().enumerate() {
            let r = self.ring.results_of(lane);
            checked += r[layout::RESULT_RECORDS];
            errors += r[layout::RESULT_ERRORS];
            if r[layout::RESULT_RECORDS] != book.seq || r[layout::RESULT_NEXT_SEQ] != book.seq {
                c.fail(format!(
                    "xproc: lane {lane}: {} records accepted from {} producers, the kernel checked {} (next seq {})",
                    book.seq,
                    book.producers,
                    r[layout::RESULT_RECORDS],
                    r[layout::RESULT_NEXT_SEQ]
                ));
            }
        }
        c.xproc_checked.fetch_add(checked, Ordering::Relaxed);
        c.xproc_accepted
            .store(driven.ledger.total(), Ordering::Relaxed);
        if errors != 0 {
            c.fail(format!(
                "xproc: the checking kernel found {errors} wrong records"
            ));
        }
        drop(self.stream);
        drop(self.ring);
        let pids: BTreeSet<u32> = driven.pids.into_iter().collect();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            match gpu.processes() {
                Ok(list) if list.iter().any(|p| pids.contains(&p.pid)) => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lane_goes_from_producer_to_producer_at_the_accepted_position() {
        let mut l = Ledger::new(2);
        l.attached(10, 0, 0, 0).unwrap();
        l.attached(11, 1, 0, 0).unwrap();
        l.accepted(10, 4096, 40).unwrap();
        l.accepted(10, 4096, 40).unwrap();
        l.accepted(11, 160, 3).unwrap();
        assert_eq!(l.total(), 43);
        // Killed: the lane is free; its successor may start past the last report (the owner
        // accepted a batch the victim never reported), never before it.
        l.released(10);
        assert_eq!(l.lane_of(10), None);
        assert!(l
            .attached(12, 0, 4000, 39)
            .unwrap_err()
            .contains("behind the accepted"));
        l.attached(12, 0, 8192, 77).unwrap();
        assert_eq!(l.lanes()[0].producers, 2);
        assert_eq!(l.lane_of(12), Some(0));
        l.accepted(12, 9000, 90).unwrap();
        assert_eq!(l.total(), 93);
    }

    #[test]
    fn the_ledger_refuses_what_cannot_happen() {
        let mut l = Ledger::new(2);
        l.attached(10, 0, 0, 0).unwrap();
        assert!(l
            .attached(11, 0, 0, 0)
            .unwrap_err()
            .contains("which pid 10 holds"));
        assert!(l
            .attached(11, 2, 0, 0)
            .unwrap_err()
            .contains("the ring lacks"));
        assert!(l
            .attached(10, 1, 0, 0)
            .unwrap_err()
            .contains("a second lane"));
        assert!(l
            .accepted(99, 16, 1)
            .unwrap_err()
            .contains("without a lane"));
        l.accepted(10, 64, 2).unwrap();
        assert!(l.accepted(10, 48, 2).unwrap_err().contains("went from"));
        assert!(l.accepted(10, 64, 1).unwrap_err().contains("went from"));
        // The end alone (a wrap pad), or the number read before the end caught up: forward.
        l.accepted(10, 96, 2).unwrap();
        l.accepted(10, 96, 3).unwrap();
        // A second release is harmless.
        l.released(10);
        l.released(10);
        assert_eq!(l.total(), 3);
    }

    #[test]
    fn each_kill_falls_inside_its_period() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let t0 = Instant::now();
        let every = Duration::from_secs(3);
        for k in 0..100u32 {
            let period = t0 + every * k;
            let at = kill_moment(period, every, &mut rng);
            assert!(at >= period && at < period + every);
        }
        // A period of 0 s still gives a moment.
        assert_eq!(kill_moment(t0, Duration::ZERO, &mut rng), t0);
    }
}
