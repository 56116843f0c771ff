//! [`DeviceRing`]: a ring consumed by a kernel that stays resident (persistent mode), its lanes and
//! control words, and the [`RingDeviceView`] a kernel takes.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::copy::WriteKernel;
use crate::core::handle::{assert_send_sync, SendSyncPtr};
use crate::core::ring::layout::{WrapMode, MIN_CAPACITY, RESULT_WORDS};
use crate::core::ring::{Producer, Reservation, RingCore, RingError};
use crate::core::sync::lock::Mutex;
use crate::core::sync::store_fence;
use crate::driver::cuda::CuStream;
use crate::error::{InvalidArgument, Result};
use crate::mapping::arena::Arena;
use crate::mapping::cuda_objects::{Event, PinnedBuffer, Stream};
use crate::mapping::gpu::Gpu;
use crate::mapping::memory::RawMemory;

use super::copy_engine::{
    store_after_lanes, CopyEngine, CopyEngineStats, LaneCopy, LaneWords, STREAM_CHECK_OFFSET,
};
use super::sink::{BarSink, RingData, RingMemory};

/// Bytes between two lanes' `tail` words in the control allocation (own 128-byte line each).
pub const TAIL_STRIDE: u64 = 128;
/// Bytes between two lanes' `head` (and result) words in pinned host memory.
pub const HOST_STRIDE: u64 = 256;
/// Offset of a lane's result words from its `head` word.
pub const RESULT_OFFSET: u64 = 64;
/// Most lanes one ring may have.
pub const MAX_LANES: u32 = 64;
/// How often a producer waiting for space asks the driver whether the watched consumer ended.
const CONSUMER_POLL: Duration = Duration::from_micros(200);

/// What a kernel needs to consume the ring, laid out as `vkgdr_ring_view` in
/// `include/vkgdr/ring.cuh` so it can be passed to a kernel by value (64 bytes). The
/// single-lane fields (`data`, `tail`, `head`, `result`) are lane 0's, which is all the
/// single-lane consumers of `kernels/ring.cu` take.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingDeviceView {
    /// Device address of lane 0's data region. For a [`WrapMode::Mirrored`] ring the region is
    /// mapped twice back to back from here, so `data + offset` can be read for a whole record.
    pub data: u64,
    /// Capacity of each lane's data region in bytes (a power of two).
    pub capacity: u64,
    /// Device address of lane 0's `tail` word (u64, GPU memory, written by the CPU); lane `i`'s
    /// is at `tail + i * TAIL_STRIDE`.
    pub tail: u64,
    /// Device address of the `stop` word (u32, GPU memory, written by the CPU).
    pub stop: u64,
    /// Device address of lane 0's `head` word (u64, pinned host memory, written by the GPU);
    /// lane `i`'s is at `head + i * HOST_STRIDE`.
    pub head: u64,
    /// Device address of lane 0's 8 result words (pinned host memory), see `layout::RESULT_*`;
    /// lane `i`'s are at `result + i * HOST_STRIDE`.
    pub result: u64,
    /// Device address of a table of `lanes` u64s: each lane's data region.
    pub lane_data: u64,
    /// Number of lanes.
    pub lanes: u32,
    /// How records meet the end of the region: a [`WrapMode::Mirrored`] ring needs consumers
    /// that accept records crossing the end (the `_mirrored` kernels, or the device API with its
    /// `mirrored` flag, which it reads from here).
    pub wrap: WrapMode,
}

/// How a [`DeviceRing`] is made ([`DeviceRing::with_options`]).
///
/// ```
/// use vkgdr::ring::{CopyEngine, RingOptions};
/// let options = RingOptions { lanes: 8, copy_engine: CopyEngine::Off, ..Default::default() };
/// assert_eq!(options.wrap, vkgdr::ring::layout::WrapMode::Padded);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingOptions {
    /// Lanes (1 to [`MAX_LANES`]).
    pub lanes: u32,
    /// How records meet the end of a lane's region.
    pub wrap: WrapMode,
    /// Which records of an exclusive producer take the copy engine ([`CopyEngine::Auto`] by
    /// default: the ring chooses).
    pub copy_engine: CopyEngine,
}

impl Default for RingOptions {
    /// One padded lane; the copy engine chosen by the ring ([`CopyEngine::Auto`], which keeps
    /// a one-lane ring on the BAR).
    fn default() -> Self {
        RingOptions {
            lanes: 1,
            wrap: WrapMode::Padded,
            copy_engine: CopyEngine::default(),
        }
    }
}

/// A ring whose consumer is a kernel that stays resident and polls `tail` (persistent mode).
///
/// A ring has one or more **lanes**: independent sub-rings, each with its own region, `tail` and
/// `head`, numbered and ordered on its own. The consumer (one thread block per lane, say) reads
/// each lane in order; records of different lanes are not ordered with each other.
///
/// Two ways to produce:
/// * [`producer`](Self::producer) claims a lane for one thread: records are appended with no lock
///   and no atomic read-modify-write, and [`Producer::push_batch`] (or a
///   [`FlushPolicy`](crate::ring::core::FlushPolicy)) publishes a whole batch with one fence and
///   one tail store. This is the fast path: give each producer thread its own lane. On a ring
///   of several lanes (by default, [`CopyEngine::Auto`]), records of 1 KiB and more in large
///   batches on some of the lanes, and of 8 KiB and more on all of them, are written into
///   pinned host memory and moved by a copy engine, which with the BAR lanes beside it outruns
///   CPU stores through the BAR alone when several producers stream them; the consumer cannot
///   tell the difference.
/// * [`reserve`](Self::reserve) / [`push`](Self::push) from any thread, through `&self`: the
///   calling thread's lane (thread index modulo the lane count; lane 0 of a one-lane ring) is
///   shared by every thread that maps to it, with per-record commits in any order.
///
/// The kernel publishes how far it has consumed into pinned host memory (`head`); producers
/// reclaim from it when a lane is full — the CPU never reads BAR memory. See the
/// [module docs](crate::ring) for the memory-ordering story.
///
/// **Stopping.** [`stop`](Self::stop) asks a persistent consumer to exit once it has consumed
/// everything published; afterwards new records are refused with [`RingError::Stopped`]. Register
/// the consumer with [`watch_consumer`](Self::watch_consumer) right after launching it: then a
/// producer waiting for space gets `Stopped` (instead of waiting forever) once the kernel has
/// exited or died, and dropping the ring stops the kernel and frees the ring's memory only once
/// the kernel has exited — without waiting for it: the drop returns at once, and the memory goes
/// through the release queue (it stays in use, and counted, for as long as the kernel runs).
/// Without a watched consumer, dropping the ring still stops it, and its memory goes back once
/// the GPU work queued before the drop on the legacy and blocking streams is done: a consumer on
/// a non-blocking stream must be watched (or stopped and waited for with
/// [`stop_and_wait`](Self::stop_and_wait)) so that it never reads freed memory.
///
/// ```no_run
/// use std::time::Duration;
/// use vkgdr::ring::DeviceRing;
/// # fn main() -> vkgdr::Result<()> {
/// let gpu = vkgdr::Gpu::open(0)?;
/// let ring = DeviceRing::with_lanes(&gpu, 1 << 20, 4, Default::default())?;
/// // ... launch a consumer with `ring.device_view()` on `stream`, then:
/// // ring.watch_consumer(&stream)?;
/// std::thread::scope(|s| {
///     for _ in 0..4 {
///         s.spawn(|| -> vkgdr::Result<()> {
///             let mut producer = ring.producer()?; // this thread's own lane
///             let records: Vec<[u8; 48]> = vec![[7; 48]; 256];
///             producer.push_batch(records.iter().map(|r| &r[..]), Some(Duration::from_secs(1)))?;
///             Ok(())
///         });
///     }
/// });
/// ring.stop_and_wait(Duration::from_secs(1))?;
/// # Ok(()) }
/// ```
pub struct DeviceRing {
    lanes: Box<[RingCore<BarSink>]>,
    pub(super) memory: Arc<RingMemory>,
    /// The watched consumer's completion event, and when (and what) it was last asked.
    consumer: Mutex<Option<Watched>>,
    /// Set by `stop`: no new records, waits end with `Stopped`.
    stopping: AtomicBool,
    /// Where `producer` starts looking for a free lane (rotates so producers spread out).
    next_lane: AtomicUsize,
    /// Why the copy-engine path could not be made, if it could not.
    copy_unavailable: std::sync::OnceLock<String>,
    /// The copy-engine choice as made for this ring ([`CopyEngine::for_ring`]).
    copy_engine: CopyEngine,
    pub(super) gpu: Gpu,
    /// Made by [`new_shareable`](Self::new_shareable): every lane's region is its own allocation.
    pub(super) shareable: bool,
}
// `Send + Sync` by its fields, as the compiler checks here.
const _: () = assert_send_sync::<DeviceRing>();

/// A watched consumer kernel.
struct Watched {
    done: Event,
    checked: Instant,
    /// Whether the kernel has exited (or the context died) when last checked.
    gone: bool,
}

impl DeviceRing {
    /// A one-lane ring of `capacity` bytes (a power of two, at least 4 KiB) in BAR-mapped GPU
    /// memory.
    pub fn new(gpu: &Gpu, capacity: u64) -> Result<DeviceRing> {
        Self::with_lanes(gpu, capacity, 1, WrapMode::Padded)
    }

    /// A one-lane ring in [`WrapMode::Mirrored`]: its data region is a one-chunk CUDA VMM
    /// [`Arena`] whose chunk is mapped a second time right after itself, so a record that runs
    /// past the end of the region is still contiguous for the GPU and no wrap PAD is ever written
    /// (a record may be as large as the whole region from any position). `capacity` must be a
    /// power of two and a multiple of the VMM granularity (2 MiB on the H100).
    ///
    /// Consumers read each record at `data + (pos & (capacity - 1))` for its whole length: use the
    /// `_mirrored` kernels of `kernels/ring.cu`. Fails with
    /// [`Error::Unsupported`](crate::Error::Unsupported) where the device or driver lacks VMM (fall
    /// back to [`DeviceRing::new`]).
    pub fn new_mirrored(gpu: &Gpu, capacity: u64) -> Result<DeviceRing> {
        Self::with_lanes(gpu, capacity, 1, WrapMode::Mirrored)
    }

    /// A ring of `lanes` lanes (1 to [`MAX_LANES`]) of `capacity` bytes each, in `wrap` mode
    /// (a mirrored ring puts each lane on its own one-chunk arena, see
    /// [`new_mirrored`](Self::new_mirrored)).
    pub fn with_lanes(gpu: &Gpu, capacity: u64, lanes: u32, wrap: WrapMode) -> Result<DeviceRing> {
        Self::with_options(
            gpu,
            capacity,
            RingOptions {
                lanes,
                wrap,
                ..Default::default()
            },
        )
    }

    /// A ring of `capacity` bytes per lane, made as `options` say.
    pub fn with_options(gpu: &Gpu, capacity: u64, options: RingOptions) -> Result<DeviceRing> {
        Self::build(gpu, capacity, options, false)
    }

    /// A padded ring of `lanes` lanes whose lanes can be lent to producers in other processes
    /// ([`lend_lane`](Self::lend_lane), the [`share`](crate::share) layer): each lane's region
    /// is an allocation of its own ([`Gpu::alloc_shareable`](crate::Gpu::alloc_shareable),
    /// rounded up to the VMM granularity), so a producer sent one lane's memory reaches no other
    /// lane's records. The control words (tails, stop, the lane table) and the consumer's heads
    /// are never sent: the owner passes each lent lane's tail on after checking it. Consumers
    /// are the same kernels as for [`with_lanes`](Self::with_lanes).
    pub fn new_shareable(gpu: &Gpu, capacity: u64, lanes: u32) -> Result<DeviceRing> {
        let options = RingOptions {
            lanes,
            ..Default::default()
        };
        Self::build(gpu, capacity, options, true)
    }

    fn build(
        gpu: &Gpu,
        capacity: u64,
        options: RingOptions,
        shareable: bool,
    ) -> Result<DeviceRing> {
        let RingOptions {
            lanes,
            wrap,
            copy_engine,
        } = options;
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
        let copy_engine = copy_engine.for_ring(lanes, capacity, shareable);
        let n = u64::from(lanes);
        let data = match wrap {
            WrapMode::Padded if shareable => (0..lanes)
                .map(|_| {
                    let mut data = RawMemory::new_unshared(gpu, capacity)?;
                    data.set_label("vkgdr ring lane (shareable)");
                    Ok(RingData::Raw(data))
                })
                .collect::<Result<Vec<_>>>()?,
            WrapMode::Padded => {
                let total = capacity
                    .checked_mul(n)
                    .ok_or(InvalidArgument::RingSizeOverflow { capacity, lanes })?;
                let mut data = gpu.alloc(total)?;
                data.set_label("vkgdr ring data");
                vec![RingData::Raw(data)]
            }
            WrapMode::Mirrored => (0..lanes)
                .map(|_| {
                    // One chunk plus one chunk of address space for the mirror.
                    let mut arena = Arena::new(gpu, 2 * capacity, capacity)?;
                    arena.grow()?;
                    arena.map_mirror()?;
                    Ok(RingData::Mirrored(arena))
                })
                .collect::<Result<Vec<_>>>()?,
        };
        let lane_region = |i: u64| match wrap {
            WrapMode::Padded if shareable => (i as usize, 0),
            WrapMode::Padded => (0usize, i * capacity),
            WrapMode::Mirrored => (i as usize, 0),
        };
        let stop_offset = n * TAIL_STRIDE;
        let table_offset = stop_offset + TAIL_STRIDE;
        let control_size = (table_offset + 8 * n).next_multiple_of(4096);
        let mut control = gpu.alloc(control_size)?;
        control.set_label("vkgdr ring control");
        crate::mapping::Mapping::fill(&mut control, 0, control_size, 0)?;
        let mut table = Vec::with_capacity(8 * lanes as usize);
        for i in 0..n {
            let (index, offset) = lane_region(i);
            table.extend_from_slice(&(data[index].device_ptr() + offset).to_le_bytes());
        }
        crate::mapping::Mapping::write(&mut control, table_offset, &table)?;
        control.flush(0, control_size)?;
        let host_len = (n * HOST_STRIDE).max(4096) as usize;
        let mut host_words = PinnedBuffer::new(gpu, host_len)?;
        host_words.fill(0);
        let memory = Arc::new(RingMemory {
            data,
            control,
            host_words,
        });
        // Both kinds of region come from `gpu`'s Vulkan context, whose mode decides coherence.
        let coherent = !gpu.is_non_coherent();
        let kernel = WriteKernel::detected();
        let cores = (0..n)
            .map(|i| {
                let (data_index, data_offset) = lane_region(i);
                let base = memory.data[data_index].host_ptr()?;
                let sink = BarSink {
                    memory: Arc::clone(&memory),
                    data_index,
                    data_offset,
                    // In range: `data_offset + capacity` is within the region's mapping.
                    data: SendSyncPtr::new(base.wrapping_add(data_offset as usize)),
                    tail: SendSyncPtr::new(
                        memory
                            .control
                            .host_ptr()
                            .wrapping_add((i * TAIL_STRIDE) as usize),
                    ),
                    tail_offset: i * TAIL_STRIDE,
                    capacity,
                    kernel,
                    coherent,
                    published: AtomicU64::new(0),
                    copy_from: copy_engine.threshold_for_lane(i as u32),
                    copy: std::sync::OnceLock::new(),
                };
                Ok(RingCore::with_wrap_mode(capacity, sink, wrap)?)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DeviceRing {
            lanes: cores.into_boxed_slice(),
            memory,
            consumer: Mutex::new(None),
            stopping: AtomicBool::new(false),
            next_lane: AtomicUsize::new(0),
            copy_unavailable: std::sync::OnceLock::new(),
            copy_engine,
            gpu: gpu.clone(),
            shareable,
        })
    }

    /// Makes lane `lane`'s copy-engine path if the ring wants one and it does not exist yet.
    /// A failure leaves the lane on the BAR path and is reported by
    /// [`copy_engine_stats`](Self::copy_engine_stats).
    fn prepare_copy_engine(&self, lane: usize) {
        let sink = self.lanes[lane].sink();
        if sink.copy_from.is_none()
            || sink.copy.get().is_some()
            || self.copy_unavailable.get().is_some()
        {
            return;
        }
        // In range: the host words hold `lanes * HOST_STRIDE` bytes or more.
        let check_at = lane as u64 * HOST_STRIDE + STREAM_CHECK_OFFSET;
        let words = LaneWords {
            region_dev: sink.region_device_ptr(),
            tail_dev: self.memory.control.device_ptr() + lane as u64 * TAIL_STRIDE,
            check_dev: self.memory.host_words.device_ptr() + check_at,
        };
        let memory = Arc::clone(&self.memory);
        match LaneCopy::new(&self.gpu, memory, words, sink.capacity) {
            // Two threads may race here for one lane; the loser's copy is dropped unused.
            Ok(copy) => drop(sink.copy.set(copy)),
            Err(e) => drop(self.copy_unavailable.set(e.to_string())),
        }
    }

    /// How this ring's lanes use the copy engine: the options' choice as made for the ring
    /// ([`CopyEngine::for_ring`]: [`CopyEngine::Auto`] stays `Auto` where lanes may stage, and
    /// is [`CopyEngine::Off`] where none does).
    ///
    /// ```no_run
    /// use vkgdr::ring::{CopyEngine, DeviceRing, RingOptions};
    /// # fn main() -> vkgdr::Result<()> {
    /// let gpu = vkgdr::Gpu::open(0)?;
    /// let one = DeviceRing::new(&gpu, 1 << 20)?;
    /// assert_eq!(one.copy_engine(), CopyEngine::Off); // a lone lane keeps the BAR
    /// let options = RingOptions { lanes: 8, ..Default::default() };
    /// let eight = DeviceRing::with_options(&gpu, 1 << 20, options)?;
    /// assert_eq!(eight.copy_engine(), CopyEngine::Auto); // lanes 1, 2, 4, 5, 7 from 1 KiB
    /// # Ok(()) }
    /// ```
    pub fn copy_engine(&self) -> CopyEngine {
        self.copy_engine
    }

    /// What the copy-engine path has done so far, over every lane.
    pub fn copy_engine_stats(&self) -> CopyEngineStats {
        self.copy_engine_stats_over(self.lanes.iter())
    }

    /// What the copy-engine path has done so far on lane `lane` alone (`None`: no such lane):
    /// which lanes a [`CopyEngine::Split`] ring keeps on the BAR shows here.
    pub fn lane_copy_engine_stats(&self, lane: usize) -> Option<CopyEngineStats> {
        let core = self.lanes.get(lane)?;
        Some(self.copy_engine_stats_over(std::iter::once(core)))
    }

    fn copy_engine_stats_over<'a>(
        &self,
        lanes: impl Iterator<Item = &'a RingCore<BarSink>>,
    ) -> CopyEngineStats {
        let mut stats = CopyEngineStats {
            unavailable: self.copy_unavailable.get().cloned(),
            ..Default::default()
        };
        for lane in lanes {
            if let Some(copy) = lane.sink().copy.get() {
                copy.add_to(&mut stats);
            }
        }
        stats
    }

    /// Lane 0's producer core (positions, counters); see [`lane`](Self::lane).
    pub fn core(&self) -> &RingCore<BarSink> {
        &self.lanes[0]
    }

    /// Lane `i`'s producer core, if there is such a lane.
    pub fn lane(&self, i: usize) -> Option<&RingCore<BarSink>> {
        self.lanes.get(i)
    }

    /// Number of lanes.
    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// Whether the ring was made with [`new_shareable`](Self::new_shareable), so that its lanes
    /// can be lent ([`lend_lane`](Self::lend_lane)).
    pub fn is_shareable(&self) -> bool {
        self.shareable
    }

    /// The addresses a consumer kernel needs.
    pub fn device_view(&self) -> RingDeviceView {
        let control = self.memory.control.device_ptr();
        let host = self.memory.host_words.device_ptr();
        let n = self.lanes.len() as u64;
        let first = &self.lanes[0];
        let sink = first.sink();
        RingDeviceView {
            data: self.memory.data[sink.data_index].device_ptr() + sink.data_offset,
            capacity: first.capacity(),
            tail: control,
            stop: control + n * TAIL_STRIDE,
            head: host,
            result: host + RESULT_OFFSET,
            lane_data: control + (n + 1) * TAIL_STRIDE,
            lanes: n as u32,
            wrap: first.wrap_mode(),
        }
    }

    /// A pinned host word of the lane slot `lane`, `offset` bytes in.
    fn host_word(&self, lane: usize, offset: u64) -> &AtomicU64 {
        assert!(lane < self.lanes.len() && offset + 8 <= HOST_STRIDE);
        let at = lane as u64 * HOST_STRIDE + offset;
        // SAFETY: an aligned u64 inside the pinned buffer (checked above; the buffer has
        // `lanes * HOST_STRIDE` bytes or more, from a page-aligned base), which lives as long as
        // `self`; the host touches it only through atomics and the GPU with aligned 8-byte
        // stores.
        unsafe { AtomicU64::from_ptr(self.memory.host_words.as_ptr().add(at as usize).cast()) }
    }

    /// Lane 0's consumer head (acquire load from pinned host memory: cheap).
    pub fn head(&self) -> u64 {
        self.head_of(0)
    }

    /// Lane `lane`'s consumer head.
    ///
    /// # Panics
    /// If there is no such lane.
    pub fn head_of(&self, lane: usize) -> u64 {
        self.host_word(lane, 0).load(Ordering::Acquire)
    }

    /// Lane 0's result words (`layout::RESULT_*`), read from pinned host memory.
    pub fn results(&self) -> [u64; RESULT_WORDS] {
        self.results_of(0)
    }

    /// Lane `lane`'s result words.
    ///
    /// # Panics
    /// If there is no such lane.
    pub fn results_of(&self, lane: usize) -> [u64; RESULT_WORDS] {
        std::array::from_fn(|i| {
            self.host_word(lane, RESULT_OFFSET + 8 * i as u64)
                .load(Ordering::Acquire)
        })
    }

    /// Registers the persistent consumer: records an event on `stream`, to be called right after
    /// the kernel was launched on it. From then on a producer waiting for space learns that the
    /// kernel has exited or died ([`RingError::Stopped`]) instead of waiting forever, and
    /// dropping the ring tells the kernel to stop and keeps the ring's memory until it has
    /// exited, without waiting for it.
    pub fn watch_consumer(&self, stream: &Stream) -> Result<()> {
        let done = Event::new(&self.gpu)?;
        done.record(stream)?;
        self.watch(done);
        Ok(())
    }

    /// [`watch_consumer`](Self::watch_consumer) for a consumer launched on a raw `CUstream` (from
    /// CUDA C, cudarc, CuPy, PyTorch); null means the legacy default stream.
    ///
    /// # Safety
    /// - `stream` must be a live stream of the ring's context (or null).
    pub unsafe fn watch_consumer_stream(&self, stream: CuStream) -> Result<()> {
        let done = Event::new(&self.gpu)?;
        // SAFETY: the caller's contract.
        unsafe { done.record_raw(stream) }?;
        self.watch(done);
        Ok(())
    }

    fn watch(&self, done: Event) {
        *self.consumer.lock() = Some(Watched {
            done,
            checked: Instant::now(),
            gone: false,
        });
    }

    /// Whether the ring was stopped or its watched consumer has exited (or died), asking the
    /// driver at most every 200 µs.
    pub(super) fn consumer_gone(&self) -> bool {
        if self.stopping.load(Ordering::Acquire) {
            return true;
        }
        let mut guard = self.consumer.lock();
        let Some(w) = guard.as_mut() else {
            return false;
        };
        if !w.gone && w.checked.elapsed() >= CONSUMER_POLL {
            w.checked = Instant::now();
            // An error means a dead context: the kernel is gone too.
            w.gone = w.done.is_complete().unwrap_or(true);
        }
        w.gone
    }

    /// The head a waiting producer of `lane` sees: its head word, or `Stopped` once the consumer
    /// is gone and the head has not moved past what the lane already reclaimed.
    fn lane_head(&self, lane: usize) -> std::result::Result<u64, RingError> {
        let head = self.head_of(lane);
        if head <= self.lanes[lane].reclaimed() && self.consumer_gone() {
            return Err(RingError::Stopped);
        }
        Ok(head)
    }

    pub(super) fn check_running(&self) -> std::result::Result<(), RingError> {
        if self.stopping.load(Ordering::Acquire) {
            Err(RingError::Stopped)
        } else {
            Ok(())
        }
    }

    /// The lane the calling thread's shared reservations go to.
    fn thread_lane(&self) -> usize {
        (crate::core::sync::thread_id() % self.lanes.len() as u64) as usize
    }

    /// Claims a lane for one producer (a lane nobody claimed and with no shared reservation in
    /// flight; the search starts where the last one left off). Fails with
    /// [`RingError::Claimed`] when every lane is taken, [`RingError::Stopped`] after
    /// [`stop`](Self::stop).
    pub fn producer(&self) -> Result<Producer<'_, BarSink>> {
        self.check_running()?;
        let n = self.lanes.len();
        let start = self.next_lane.fetch_add(1, Ordering::Relaxed);
        let mut last = RingError::Claimed;
        for k in 0..n {
            let lane = (start + k) % n;
            if !self.lanes[lane].is_claimed() {
                self.prepare_copy_engine(lane);
            }
            match self.lanes[lane].claim(move || self.lane_head(lane)) {
                Ok(p) => return Ok(p),
                Err(e) => last = e,
            }
        }
        Err(last.into())
    }

    /// Reserves a record of `len` payload bytes on the calling thread's lane, waiting up to
    /// `timeout` (`None`: until space frees, the watched consumer is gone, or the wait would
    /// depend on this thread itself) for the kernel to free space. Fails at once with
    /// `RecordTooLarge` if it can never fit. The kernel's head is read only when the lane is
    /// full, and always before the call gives up: a zero timeout takes whatever the kernel has
    /// consumed by now (see [`RingCore::reserve`]).
    pub fn reserve(&self, len: u32, timeout: Option<Duration>) -> Result<Reservation<'_, BarSink>> {
        self.check_running()?;
        let lane = self.thread_lane();
        Ok(self.lanes[lane].reserve(len, timeout, &|| self.lane_head(lane))?)
    }

    /// Reserves without waiting on the calling thread's lane: `RingError::Full` if there is no
    /// room now, counting what the kernel has consumed by now (its head is read only when the
    /// space the lane already knows of is not enough, and then once).
    pub fn try_reserve(&self, len: u32) -> Result<Reservation<'_, BarSink>> {
        self.check_running()?;
        let lane = self.thread_lane();
        let core = &self.lanes[lane];
        match core.try_reserve(len) {
            Err(RingError::Full) => {}
            other => return Ok(other?),
        }
        core.reclaim_to(self.head_of(lane))?;
        Ok(core.try_reserve(len)?)
    }

    /// Reserves, writes and commits `payload` on the calling thread's lane; returns its sequence
    /// number (in that lane). Waits as [`reserve`](Self::reserve) does.
    pub fn push(&self, payload: &[u8], timeout: Option<Duration>) -> Result<u64> {
        self.check_running()?;
        let lane = self.thread_lane();
        Ok(self.lanes[lane].push(payload, timeout, &|| self.lane_head(lane))?)
    }

    /// Asks a persistent consumer to exit once it has consumed everything published; from now
    /// on new records are refused and waits for space end with [`RingError::Stopped`]. Never
    /// waits: where records of a lane are still queued on its copy stream, the stop word is
    /// stored behind their tails on the lanes' streams.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        let control = &self.memory.control;
        let offset = self.lanes.len() as u64 * TAIL_STRIDE;
        // Records and tails first, then the stop word (the consumer re-reads the tails after it).
        store_fence();
        // A tail still queued on a lane's copy stream lands after now: the stop word then goes
        // through the streams, behind every such tail, or the consumer could exit before their
        // records. Should that fail, the store below stops the consumer all the same.
        let queued: Vec<&LaneCopy> = self
            .lanes
            .iter()
            .filter_map(|lane| {
                let sink = lane.sink();
                let copy = sink.copy.get()?;
                copy.tail_pending(|| sink.load_tail()).then_some(copy)
            })
            .collect();
        if !queued.is_empty()
            && store_after_lanes(&queued, control.device_ptr() + offset, 1).is_ok()
        {
            return;
        }
        // SAFETY: an aligned 4-byte word inside the control allocation, alive as long as `self`;
        // the host touches it only through atomics.
        let word = unsafe {
            std::sync::atomic::AtomicU32::from_ptr(
                control.host_ptr().add(offset as usize).cast::<u32>(),
            )
        };
        word.store(1, Ordering::Release);
        let _ = control.flush(offset, 4);
        store_fence();
    }

    /// [`stop`](Self::stop), then waits up to `timeout` for the watched consumer to exit.
    /// Fails with [`RingError::Timeout`] if it is still running, or with the driver's error if
    /// its context died; returns at once when no consumer is watched.
    pub fn stop_and_wait(&self, timeout: Duration) -> Result<()> {
        self.stop();
        let t = Instant::now();
        loop {
            let done = match self.consumer.lock().as_ref() {
                None => return Ok(()),
                Some(w) => w.done.is_complete()?,
            };
            if done {
                return Ok(());
            }
            if t.elapsed() >= timeout {
                return Err(RingError::Timeout.into());
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// The GPU this ring lives on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
}

impl Drop for DeviceRing {
    /// Never waits, and never frees memory under a watched consumer: the consumer is told to
    /// stop, and the ring's memory is released once its completion event has passed (the
    /// memory's own releases then wait for the legacy stream's queued work as usual).
    fn drop(&mut self) {
        self.stop();
        if let Some(w) = self.consumer.get_mut().take() {
            self.gpu
                .release_after(Arc::clone(&self.memory), Box::new(w.done));
        }
    }
}
