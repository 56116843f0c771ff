//! The CPU side of a lone record from another process, no GPU needed (any Vulkan driver with
//! exportable memory: lavapipe will do): a peer's producer pushes one 64-byte record into a lane
//! it attached through a [`ShareServer`], publishes `(tail, seq)` in its producer page, the
//! owner's relay checks the pair and passes the tail to the lane's target, and the peer spins on
//! the head the relay mirrors into its owner page. The target stands in for the ring: its tail
//! store is a store into host memory and an `sfence` (as the BAR sink's), and its consumer is
//! infinitely fast (the head jumps to the tail in the same store). So a round trip is the two
//! hand-overs between the peer's core and the relay's, plus the relay's own work: what a lone
//! record from a process pays beyond one from a thread of the owner (`vkgdr bench xproc`, rows
//! `lone 64 B record, process` against `..., thread`).
//!
//! Printed: the round trip's median, p10, p90 and p99 over `VKGDR_RELAY_N` round trips (20,000
//! by default, after one pass round the lane; the first tenth dropped as warm-up), then the floor of the same machine: two
//! threads handing one word back and forth through two cache lines, as the relay's two hops
//! would with nothing else to do. Run both sides of a change alternately (A B A B) on an idle
//! machine: `cargo bench --bench share_relay`.
//!
//! Not criterion: a latency's median and p99 need each round trip's own time, and criterion
//! reports means of batches.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vkgdr::ring::layout::WrapMode;
use vkgdr::share::lane::LanePosition;
use vkgdr::share::{LaneSource, LaneTarget, Peer, ShareOptions, ShareServer};
use vkgdr::vulkan::{DeviceSelector, MemoryOptions, VulkanContext, VulkanMemory};

/// Bytes of the lane.
const CAPACITY: u64 = 1 << 20;
/// How long the slow consumer takes to answer a tail: about what the ack kernel takes to see a
/// tail through the BAR and write its head into pinned memory.
const CONSUMER_DELAY: Duration = Duration::from_nanos(1500);

/// A word on a cache line of its own.
#[repr(align(128))]
#[derive(Default)]
struct Line(AtomicU64);

/// One lane and its consumer: at once, or `delay` after each tail.
struct AckLane {
    memory: VulkanMemory,
    /// The "BAR" tail word.
    tail: Line,
    /// The consumer's head, as the kernel would write it into pinned memory.
    head: Line,
    /// When the last tail was stored (ns since `epoch`).
    stored_at: Line,
    epoch: Instant,
    delay: Duration,
    lent: AtomicBool,
}

impl AckLane {
    fn new(memory: VulkanMemory, delay: Duration) -> AckLane {
        AckLane {
            memory,
            tail: Line::default(),
            head: Line::default(),
            stored_at: Line::default(),
            epoch: Instant::now(),
            delay,
            lent: AtomicBool::new(false),
        }
    }

    /// What the BAR sink does (fence, tail store, fence); the instant consumer answers at once.
    fn store_tail(&self, tail: u64) {
        sfence();
        self.stored_at
            .0
            .store(self.epoch.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.tail.0.store(tail, Ordering::Release);
        sfence();
        if self.delay.is_zero() {
            self.head.0.store(tail, Ordering::Release);
        }
    }

    /// The head; the slow consumer's moves to the tail once `delay` has passed since it was
    /// stored (the clock is read only while a tail waits).
    fn head(&self) -> u64 {
        let head = self.head.0.load(Ordering::Acquire);
        let tail = self.tail.0.load(Ordering::Acquire);
        if head < tail {
            let at = self.stored_at.0.load(Ordering::Relaxed);
            if self.epoch.elapsed().as_nanos() as u64 >= at + self.delay.as_nanos() as u64 {
                self.head.0.store(tail, Ordering::Release);
                return tail;
            }
        }
        head
    }
}

struct Lent(Arc<AckLane>);

fn sfence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` has no preconditions.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    }
}

impl LaneTarget for Lent {
    fn lane(&self) -> u32 {
        0
    }
    fn capacity(&self) -> u64 {
        CAPACITY
    }
    fn wrap(&self) -> WrapMode {
        WrapMode::Padded
    }
    fn start(&self) -> LanePosition {
        LanePosition::default()
    }
    fn head(&self) -> u64 {
        self.0.head()
    }
    fn consumer_gone(&self) -> bool {
        false
    }
    fn publish(&self, to: LanePosition) -> vkgdr::Result<()> {
        self.0.store_tail(to.tail);
        Ok(())
    }
    fn export_data(&self) -> vkgdr::Result<(OwnedFd, u64, u64)> {
        Ok((self.0.memory.export_fd()?, CAPACITY, 0))
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.0.lent.store(false, Ordering::Release);
    }
}

struct Source(Arc<AckLane>);

impl LaneSource for Source {
    fn lend(&self) -> vkgdr::Result<Box<dyn LaneTarget>> {
        if self.0.lent.swap(true, Ordering::AcqRel) {
            return Err(vkgdr::ring::core::RingError::Claimed.into());
        }
        Ok(Box::new(Lent(Arc::clone(&self.0))))
    }
}

/// Median, p10, p90, p99 of `samples` (ns) after dropping the first tenth.
fn summary(mut samples: Vec<f64>) -> [f64; 4] {
    samples.drain(..samples.len() / 10);
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    [at(0.5), at(0.1), at(0.9), at(0.99)]
}

fn print(row: &str, s: [f64; 4]) {
    println!(
        "{row:<48} median {:>6.0} ns  p10 {:>6.0}  p90 {:>6.0}  p99 {:>6.0}",
        s[0], s[1], s[2], s[3]
    );
}

/// Spins until `reached`, panicking after 10 s.
fn spin_until(reached: impl Fn() -> bool) {
    let t = Instant::now();
    let mut spins = 0u32;
    while !reached() {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(4096) && t.elapsed() > Duration::from_secs(10) {
            panic!("no head within 10 s");
        }
        std::hint::spin_loop();
    }
}

/// A peer of this process pushes lone records into a lane of `lane`, through the relay.
fn relay_round_trips(ctx: &Arc<VulkanContext>, lane: AckLane, n: usize) -> vkgdr::Result<Vec<f64>> {
    let path = std::env::temp_dir().join(format!("vkgdr-relay-bench-{}.sock", std::process::id()));
    let server = ShareServer::bind(&path, ctx, ShareOptions::default())?;
    server.share_lanes("lone", Arc::new(Source(Arc::new(lane))))?;
    let peer = Peer::connect(&path)?;
    let attached = peer.attach_lane("lone")?;
    let mut producer = attached.producer()?;
    let payload = [7u8; 48];
    // Once round the lane first, so that no page of it is touched for the first time while
    // timed.
    let warm_up = (CAPACITY / 64) as usize;
    let mut samples = Vec::with_capacity(warm_up + n);
    for _ in 0..warm_up + n {
        let t = Instant::now();
        producer
            .push(&payload, Some(Duration::from_secs(10)))
            .map_err(vkgdr::Error::from)?;
        let end = producer.core().published();
        spin_until(|| attached.head() >= end);
        samples.push(t.elapsed().as_nanos() as f64);
    }
    samples.drain(..warm_up);
    drop(producer);
    drop(attached);
    drop(peer);
    drop(server);
    Ok(samples)
}

/// The same lane's tail stored by this thread, as a producer thread of the owner does, and its
/// head waited for: no relay.
fn thread_round_trips(lane: &AckLane, n: usize) -> Vec<f64> {
    let mut tail = 0;
    (0..n)
        .map(|_| {
            let t = Instant::now();
            tail += 64;
            lane.store_tail(tail);
            spin_until(|| lane.head() >= tail);
            t.elapsed().as_nanos() as f64
        })
        .collect()
}

/// Two threads, two lines: one writes `ping`, the other answers on `pong`.
fn floor_round_trips(n: usize) -> Vec<f64> {
    let ping = Arc::new(Line::default());
    let pong = Arc::new(Line::default());
    let echo = {
        let (ping, pong) = (Arc::clone(&ping), Arc::clone(&pong));
        std::thread::spawn(move || {
            let mut seen = 0;
            while seen < n as u64 {
                let v = ping.0.load(Ordering::Acquire);
                if v != seen {
                    seen = v;
                    pong.0.store(v, Ordering::Release);
                }
                std::hint::spin_loop();
            }
        })
    };
    let mut samples = Vec::with_capacity(n);
    for i in 1..=n as u64 {
        let t = Instant::now();
        ping.0.store(i, Ordering::Release);
        while pong.0.load(Ordering::Acquire) != i {
            std::hint::spin_loop();
        }
        samples.push(t.elapsed().as_nanos() as f64);
    }
    echo.join().expect("echo thread");
    samples
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is taken.
    let n: usize = std::env::var("VKGDR_RELAY_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let run = || -> vkgdr::Result<()> {
        let ctx = VulkanContext::new(DeviceSelector::FirstSuitable, MemoryOptions::default())?;
        let lane = |delay| Ok::<_, vkgdr::Error>(AckLane::new(ctx.allocate(CAPACITY)?, delay));
        let instant = relay_round_trips(&ctx, lane(Duration::ZERO)?, n)?;
        print("process, relay, instant consumer", summary(instant));
        let slow = relay_round_trips(&ctx, lane(CONSUMER_DELAY)?, n)?;
        print("process, relay, consumer after 1.5 us", summary(slow));
        let thread = thread_round_trips(&lane(CONSUMER_DELAY)?, n);
        print("thread, no relay, consumer after 1.5 us", summary(thread));
        Ok(())
    };
    if let Err(e) = run() {
        eprintln!("share_relay: needs a Vulkan device with exportable memory: {e}");
        std::process::exit(1);
    }
    print(
        "floor: two hand-overs, plain words",
        summary(floor_round_trips(n)),
    );
}
