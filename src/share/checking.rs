//! [`CheckingLanes`]: lanes in Vulkan memory whose consumer is a thread of this process that
//! checks every record — an owner without a GPU kernel (a CPU-only owner, the tests of the
//! sharing path on any Vulkan driver) lends them as it would a ring's lanes.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::core::ring::layout::{
    verify_records, RingSource, WrapMode, MIN_CAPACITY, RESULT_CHECKSUM_SUM, RESULT_ERRORS,
    RESULT_NEXT_SEQ, RESULT_POS, RESULT_RECORDS, RESULT_WORDS,
};
use crate::core::ring::RingError;
use crate::core::share::lane::LanePosition;
use crate::driver::vulkan::{VulkanContext, VulkanMemory};
use crate::error::{Error, InvalidArgument, Result};
use crate::mapping::Mapping;

use super::relay::{LaneSource, LaneTarget};

/// Most lanes of one set, as a ring has ([`MAX_LANES`](crate::ring::device::MAX_LANES)).
const MAX_LANES: u32 = 64;
/// The consumer's pause between passes.
const PASS: Duration = Duration::from_micros(200);

/// One lane: its own allocation (a borrower maps it and nothing else), the tail the relay
/// publishes, the head the consumer moves, and the consumer's result words.
struct Lane {
    index: u32,
    memory: VulkanMemory,
    tail: AtomicU64,
    seq: AtomicU64,
    head: AtomicU64,
    lent: AtomicBool,
    results: Mutex<[u64; RESULT_WORDS]>,
}

/// What the lanes and their consumer thread share.
struct Lanes {
    lanes: Vec<Arc<Lane>>,
    stopped: AtomicBool,
}

/// Lanes of `capacity` bytes in Vulkan memory of one device, lent to producers in other
/// processes ([`ShareServer::share_lanes`](super::ShareServer::share_lanes)) and consumed by a
/// thread of this process that checks every record as the ring's checking kernels do
/// (`ring_check_lanes` of `kernels/ring.cu`): each record a sealed test payload
/// ([`seal_test_payload`](crate::ring::layout::seal_test_payload)), numbered from 0 in each
/// lane. [`results_of`](Self::results_of) gives its result words, numbered as
/// [`DeviceRing::results_of`](crate::ring::DeviceRing::results_of)'s.
///
/// For owners with no GPU kernel to consume: CPU-only owners, and the tests of the sharing path
/// on any Vulkan driver (Mesa's lavapipe on CI).
///
/// ```no_run
/// use vkgdr::share::{CheckingLanes, ShareOptions, ShareServer};
/// use vkgdr::vulkan::{DeviceSelector, MemoryOptions, VulkanContext};
/// # fn main() -> vkgdr::Result<()> {
/// let ctx = VulkanContext::new(DeviceSelector::FirstSuitable, MemoryOptions::default())?;
/// let lanes = CheckingLanes::new(&ctx, 1 << 16, 4)?;
/// let server = ShareServer::bind("/tmp/lanes.sock", &ctx, ShareOptions::default())?;
/// server.share_lanes("in", lanes.clone())?;
/// // ... producer processes attach "in" and push; then:
/// lanes.stop();
/// assert_eq!(lanes.results_of(0).unwrap()[vkgdr::ring::layout::RESULT_ERRORS], 0);
/// # Ok(()) }
/// ```
pub struct CheckingLanes {
    shared: Arc<Lanes>,
    consumer: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for CheckingLanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckingLanes")
            .field("lanes", &self.shared.lanes.len())
            .finish_non_exhaustive()
    }
}

impl CheckingLanes {
    /// `lanes` lanes (1 to 64) of `capacity` bytes (a power of two, at least 4 KiB) on `ctx`'s
    /// device, and their consumer thread.
    pub fn new(ctx: &Arc<VulkanContext>, capacity: u64, lanes: u32) -> Result<Arc<CheckingLanes>> {
        if !capacity.is_power_of_two() || capacity < MIN_CAPACITY {
            return Err(RingError::InvalidCapacity(capacity).into());
        }
        if lanes == 0 || lanes > MAX_LANES {
            return Err(InvalidArgument::RingLanes {
                lanes,
                max: MAX_LANES,
            }
            .into());
        }
        let lanes = (0..lanes)
            .map(|index| {
                Ok(Arc::new(Lane {
                    index,
                    memory: ctx.allocate(capacity)?,
                    tail: AtomicU64::new(0),
                    seq: AtomicU64::new(0),
                    head: AtomicU64::new(0),
                    lent: AtomicBool::new(false),
                    results: Mutex::new([0; RESULT_WORDS]),
                }))
            })
            .collect::<Result<Vec<_>>>()?;
        let shared = Arc::new(Lanes {
            lanes,
            stopped: AtomicBool::new(false),
        });
        let consumer = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("vkgdr-checking".into())
                .spawn(move || loop {
                    // The flag first: the pass after it sees everything published before the stop.
                    let last = shared.stopped.load(Ordering::Acquire);
                    shared.consume();
                    if last {
                        return;
                    }
                    std::thread::sleep(PASS);
                })
                .map_err(|e| Error::System {
                    call: "pthread_create",
                    errno: e.to_string(),
                })?
        };
        Ok(Arc::new(CheckingLanes {
            shared,
            consumer: Mutex::new(Some(consumer)),
        }))
    }

    /// Number of lanes.
    pub fn lanes(&self) -> usize {
        self.shared.lanes.len()
    }

    /// Lane `lane`'s result words (`layout::RESULT_*`), `None` if there is no such lane.
    pub fn results_of(&self, lane: usize) -> Option<[u64; RESULT_WORDS]> {
        let l = self.shared.lanes.get(lane)?;
        let results = *l.results.lock().unwrap_or_else(|e| e.into_inner());
        Some(results)
    }

    /// What lane `lane`'s producers have published (tail and next sequence number).
    pub fn published(&self, lane: usize) -> Option<LanePosition> {
        let l = self.shared.lanes.get(lane)?;
        Some(LanePosition {
            tail: l.tail.load(Ordering::Acquire),
            seq: l.seq.load(Ordering::Acquire),
        })
    }

    /// How far the consumer has consumed lane `lane`.
    pub fn head(&self, lane: usize) -> Option<u64> {
        Some(self.shared.lanes.get(lane)?.head.load(Ordering::Acquire))
    }

    /// Whether lane `lane` is lent to a producer now.
    pub fn is_lent(&self, lane: usize) -> bool {
        self.shared
            .lanes
            .get(lane)
            .is_some_and(|l| l.lent.load(Ordering::Acquire))
    }

    /// Whether [`stop`](Self::stop) was called.
    pub fn is_stopped(&self) -> bool {
        self.shared.stopped.load(Ordering::Acquire)
    }

    /// Lets the consumer check what was published, then stops it and waits for it: from then on
    /// lanes are lent no more and their producers see the consumer gone. Called by drop too.
    pub fn stop(&self) {
        self.shared.stopped.store(true, Ordering::Release);
        let thread = self
            .consumer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

impl Drop for CheckingLanes {
    fn drop(&mut self) {
        self.stop();
    }
}

impl LaneSource for CheckingLanes {
    fn lend(&self) -> Result<Box<dyn LaneTarget>> {
        if self.shared.stopped.load(Ordering::Acquire) {
            return Err(RingError::Stopped.into());
        }
        for lane in &self.shared.lanes {
            if lane
                .lent
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Ok(Box::new(Lent {
                    lane: Arc::clone(lane),
                    shared: Arc::clone(&self.shared),
                }));
            }
        }
        Err(RingError::Claimed.into())
    }
}

/// A lane lent until dropped.
struct Lent {
    lane: Arc<Lane>,
    shared: Arc<Lanes>,
}

impl LaneTarget for Lent {
    fn lane(&self) -> u32 {
        self.lane.index
    }
    fn capacity(&self) -> u64 {
        self.lane.memory.size()
    }
    fn wrap(&self) -> WrapMode {
        WrapMode::Padded
    }
    fn start(&self) -> LanePosition {
        LanePosition {
            tail: self.lane.tail.load(Ordering::Acquire),
            seq: self.lane.seq.load(Ordering::Acquire),
        }
    }
    fn head(&self) -> u64 {
        self.lane.head.load(Ordering::Acquire)
    }
    fn consumer_gone(&self) -> bool {
        self.shared.stopped.load(Ordering::Acquire)
    }
    fn publish(&self, to: LanePosition) -> Result<()> {
        self.lane.seq.store(to.seq, Ordering::Release);
        self.lane.tail.store(to.tail, Ordering::Release);
        Ok(())
    }
    fn export_data(&self) -> Result<(OwnedFd, u64, u64)> {
        Ok((self.lane.memory.export_fd()?, self.lane.memory.size(), 0))
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.lane.lent.store(false, Ordering::Release);
    }
}

/// A lane's region as the consumer reads it (invalidated first on non-coherent memory).
struct Region<'a>(&'a VulkanMemory);

impl RingSource for Region<'_> {
    fn capacity(&self) -> u64 {
        self.0.size()
    }
    fn read(&self, offset: u64, out: &mut [u8]) {
        // A failed read (a lost device) leaves zeros, which the checks count as errors.
        if self.0.read(offset, out).is_err() {
            out.fill(0);
        }
    }
}

impl Lanes {
    /// Checks and consumes what was published in each lane since the last pass.
    fn consume(&self) {
        for lane in &self.lanes {
            let tail = lane.tail.load(Ordering::Acquire);
            let head = lane.head.load(Ordering::Acquire);
            if tail <= head {
                continue;
            }
            let mut results = lane.results.lock().unwrap_or_else(|e| e.into_inner());
            let r = verify_records(&Region(&lane.memory), head, tail, results[RESULT_NEXT_SEQ]);
            results[RESULT_RECORDS] += r.records;
            results[RESULT_CHECKSUM_SUM] =
                results[RESULT_CHECKSUM_SUM].wrapping_add(r.checksum_sum);
            results[RESULT_ERRORS] += r.errors;
            results[RESULT_NEXT_SEQ] = r.next_seq;
            results[RESULT_POS] = r.pos;
            // A broken chain stops short of the tail: the rest cannot be walked, so the head
            // skips to the tail (the errors are counted) and the producer is not stuck.
            let to = if r.errors > 0 { tail } else { r.pos };
            lane.head.store(to, Ordering::Release);
        }
    }
}
