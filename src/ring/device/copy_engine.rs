//! The copy-engine path of a ring lane: large records are written into a pinned host copy of the
//! lane's region (streaming stores into host memory, no PCIe on the CPU's side), and a copy
//! engine moves each publication's staged span into the region, followed by the tail, on a
//! stream of the lane's own. The host copy is `cuMemHostAlloc` memory kept by the [`Gpu`] for
//! reuse ([`CopySource`]): the GPU reads Vulkan host memory mapped through VMM stale after the
//! CPU rewrote it.
//!
//! Why: CPU stores through the BAR top out however many threads write, below what a copy engine
//! moves from pinned memory; small records keep the BAR path (a lone record is seen in about
//! 2 µs, a copy takes longer to set up than that). Figures: BENCHMARKS.md, 'Copy-engine lanes'.
//!
//! Ordering, per lane (one publisher at a time):
//! 1. the producer's stores (BAR below the staged span, staging inside it) are fenced (`sfence`)
//!    before the copy is queued, so both are in memory before the engine reads or the kernel
//!    looks;
//! 2. the stream runs the copy, then stores the tail into GPU memory (a stream memory operation
//!    carries a system-scope fence before its store);
//! 3. while a tail queued on the stream may not have landed, a publication of records written
//!    through the BAR queues its tail on the stream too, so the tail never goes backwards. Whether
//!    it has landed is read from the tail word itself, through the BAR, by the next BAR
//!    publication only (one uncached load, about a microsecond): while the stream's tails are
//!    in flight the CPU stores none, so the word holds the last queued tail exactly when every
//!    queued store has run. Once it has, the CPU stores tails itself again. (A second stream store
//!    per publication into a pinned host word would save that load, but it costs the copy engine
//!    a measurable share of its rate (figures: BENCHMARKS.md, 'Copy-engine lanes'): every
//!    publication would pay it, where the load is paid only by a BAR publication right after a
//!    staged one.)
//!
//! The staging copy is reused as the region is: bytes below the consumer's head were copied
//! (the consumer saw them only after the tail that followed their copy), so reclaiming by the
//! head covers the staging copy as well. Nothing here waits: not for the copy, not for the
//! kernel.
#![allow(unsafe_code)] // raw copies into the staging copy and driver calls on the lane's stream

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::copy::WriteKernel;
use crate::core::handle::{assert_send_sync, SendSyncPtr};
use crate::driver::cuda::CuStream;
use crate::error::{Error, Result};
use crate::mapping::cuda_objects::{Event, Stream};
use crate::mapping::gpu::Gpu;
use crate::mapping::pinned::copy_sources::CopySource;

/// Offset of a lane's stream check word from its `head` word in pinned host memory: where a
/// lane's new copy stream stores a zero to find out that the driver can store words from a
/// stream before any publication relies on it.
pub const STREAM_CHECK_OFFSET: u64 = 192;

/// The record size (header and padding included) to pass to [`CopyEngine::FromRecord`] when
/// turning the copy engine on: with eight producers in batches of 256 records, 1 KiB records
/// moved faster through the BAR and 2 KiB and more faster through the copy engine (figures:
/// BENCHMARKS.md, 'Copy-engine lanes').
pub const DEFAULT_COPY_ENGINE_RECORD: u32 = 4096;

/// A producer's large record takes the copy engine only once this many bytes are pending before
/// it in the batch: a staged publication costs microseconds (the producer's copy into pinned
/// memory, then a copy and its stream stores queued with the driver), which a lone record or a
/// short batch would not earn back (a 4 KiB record through the BAR takes under a microsecond;
/// figures: BENCHMARKS.md, 'Copy-engine lanes'). What every producer starts with;
/// [`Producer::set_stage_after`](crate::ring::core::Producer::set_stage_after) changes it for one.
pub const STAGE_AFTER_PENDING: u64 = 64 << 10;

/// On the lanes that [`CopyEngine::Split`] and [`CopyEngine::Auto`] keep on the BAR, the record
/// size (header and padding included) from which records take the copy engine all the same:
/// eight producers of records this large move more through the copy engine alone than through
/// the two paths at once, and a lone producer about as much (figures: BENCHMARKS.md, 'Lanes
/// split between the BAR and the copy engine', 'Large records on every lane').
pub const SPLIT_BAR_LANE_RECORD: u32 = 8 << 10;

/// The record size (header and padding included) from which the lanes that
/// [`CopyEngine::Auto`] gives the copy engine stage records: with eight producers, 1 KiB records
/// split between the two paths passed batched `cuMemcpyHtoDAsync`, and 512-byte records moved
/// faster through the BAR alone (figures: BENCHMARKS.md, 'Lanes split between the BAR and the
/// copy engine').
pub const AUTO_COPY_ENGINE_RECORD: u32 = 1024;

/// The most pinned host memory the lanes of one [`CopyEngine::Auto`] ring may hold in all (each
/// lane's staging copy is as large as the lane, and on a ring of two lanes or more every lane may
/// stage): a ring whose would be larger keeps every lane on the BAR unless its options ask for
/// the copy engine.
pub const AUTO_MAX_STAGING_BYTES: u64 = 256 << 20;

/// How a ring's lanes carry the records an exclusive [`Producer`](crate::ring::core::Producer)
/// writes.
///
/// ```
/// use vkgdr::ring::CopyEngine;
/// // Three lanes in eight (0, 3 and 6) keep 1 KiB records on the BAR; the others stage them.
/// let split = CopyEngine::Split(1024);
/// let bar_lanes: Vec<u32> = (0..8).filter(|&l| split.threshold_for_lane(l) != Some(1024)).collect();
/// assert_eq!(bar_lanes, [0, 3, 6]);
/// assert_eq!(split.threshold_for_lane(8), Some(8192));
/// assert_eq!(CopyEngine::FromRecord(4096).threshold_for_lane(2), Some(4096));
/// // The default: lanes 0, 3 and 6 of each eight stage only records of 8 KiB and more, the
/// // others records of 1 KiB and more (as `Split(1024)`); a lone lane, or a ring that may be
/// // lent to other processes, all on the BAR.
/// assert_eq!(CopyEngine::default(), CopyEngine::Auto);
/// assert_eq!(CopyEngine::Auto.threshold_for_lane(0), Some(8192));
/// assert_eq!(CopyEngine::Auto.threshold_for_lane(1), Some(1024));
/// assert_eq!(CopyEngine::Auto.for_ring(1, 1 << 20, false), CopyEngine::Off);
/// assert_eq!(CopyEngine::Auto.for_ring(8, 1 << 20, false), CopyEngine::Auto);
/// assert_eq!(CopyEngine::Auto.for_ring(8, 1 << 20, true), CopyEngine::Off);
/// // Eight lanes of 32 MiB pin 256 MiB: allowed; of 64 MiB, 512 MiB: past the limit.
/// assert_eq!(CopyEngine::Auto.for_ring(8, 32 << 20, false), CopyEngine::Auto);
/// assert_eq!(CopyEngine::Auto.for_ring(8, 64 << 20, false), CopyEngine::Off);
/// assert_eq!(CopyEngine::Auto.for_ring(2, 128 << 20, false), CopyEngine::Auto);
/// assert_eq!(CopyEngine::Auto.for_ring(2, 256 << 20, false), CopyEngine::Off);
/// let asked = CopyEngine::FromRecord(4096);
/// assert_eq!(asked.for_ring(1, 1 << 20, true), asked); // only `Auto` is resolved
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyEngine {
    /// The default: the ring chooses by measured cost when it is made
    /// ([`for_ring`](Self::for_ring)). On a ring of two lanes or more it splits the lanes as
    /// `Split(AUTO_COPY_ENGINE_RECORD)` does: three lanes in eight (the first lane a producer
    /// claims is one) write records below [`SPLIT_BAR_LANE_RECORD`] through the BAR, the others
    /// stage records of [`AUTO_COPY_ENGINE_RECORD`] bytes and more, each once a batch has
    /// [`STAGE_AFTER_PENDING`] bytes pending before them. So small records, lone records and
    /// short batches take the BAR exactly as with [`Off`](Self::Off); several producers
    /// streaming records of 1 KiB and more use both paths at once (eight producers of 1 KiB
    /// records passed batched `cuMemcpyHtoDAsync`; BENCHMARKS.md, 'Lanes split between the BAR
    /// and the copy engine'); and records of 8 KiB and more take the copy engine on every lane.
    /// Pinned memory is taken for a lane when a producer first claims it; when the ring goes it
    /// stays with the [`Gpu`] for the next lane of its size (freeing it would wait for running
    /// kernels), until the `Gpu`'s last handle goes ([`Gpu::retained`] lists it). A ring whose
    /// lanes would hold more than [`AUTO_MAX_STAGING_BYTES`] in all, a one-lane ring and a
    /// shareable ring take the BAR on every lane. A lone latency-critical record beside bulk
    /// producers waits behind the BAR lanes' stores: for that, [`FromRecord`](Self::FromRecord)
    /// puts the bulk on the copy engine (BENCHMARKS.md, 'The default: the ring chooses'), and
    /// [`Producer::set_stage_after(0)`](crate::ring::core::Producer::set_stage_after) on the
    /// bulk producers their batches' first 64 KiB too (BENCHMARKS.md, 'A lone record beside
    /// bulk producers').
    Auto,
    /// Every record through the BAR, by CPU stores.
    Off,
    /// Records of at least this many bytes in the ring (16-byte header and padding included)
    /// go through pinned staging and a copy engine once a batch has
    /// [`STAGE_AFTER_PENDING`] bytes pending before them (a producer's
    /// [`set_stage_after`](crate::ring::core::Producer::set_stage_after) changes that); smaller
    /// ones, lone ones and short batches through the BAR. Shared
    /// reservations ([`DeviceRing::reserve`](super::DeviceRing::reserve),
    /// [`DeviceRing::push`](super::DeviceRing::push)) always take the BAR.
    FromRecord(u32),
    /// Both paths at once, split by lane: three lanes in eight (those whose index modulo 8 is 0,
    /// 3 or 6) write records below [`SPLIT_BAR_LANE_RECORD`] through the BAR, the others stage
    /// records of at least this many bytes as [`FromRecord`](Self::FromRecord) does. CPU stores
    /// through the BAR come near their limit with three threads, and the copy-engine lanes'
    /// staging writes share the host's memory with the engine's reads, so eight producers of 1
    /// and 2 KiB records move more with some lanes on each path than with every lane on either
    /// (figures: BENCHMARKS.md, 'Lanes split between the BAR and the copy engine'). Producers
    /// claim lanes in order, so a ring's first producer takes the BAR (a lone producer of 1 and
    /// 2 KiB records moves more through it), its second and third the copy engine.
    Split(u32),
}

impl Default for CopyEngine {
    /// [`CopyEngine::Auto`].
    fn default() -> Self {
        CopyEngine::Auto
    }
}

impl CopyEngine {
    /// The record size from which records are staged on the lanes that stage (`None`: off).
    pub fn threshold(self) -> Option<u64> {
        match self {
            CopyEngine::Off => None,
            CopyEngine::Auto => Some(u64::from(AUTO_COPY_ENGINE_RECORD)),
            CopyEngine::FromRecord(n) | CopyEngine::Split(n) => Some(u64::from(n.max(1))),
        }
    }

    /// The record size from which lane `lane`'s records are staged (`None`: off).
    pub fn threshold_for_lane(self, lane: u32) -> Option<u64> {
        match self {
            CopyEngine::Auto | CopyEngine::Split(_) if Self::keeps_bar(lane) => self
                .threshold()
                .map(|t| t.max(u64::from(SPLIT_BAR_LANE_RECORD))),
            _ => self.threshold(),
        }
    }

    /// What this choice comes to on a ring of `lanes` lanes of `capacity` bytes each
    /// (`shareable`: made to lend its lanes to other processes): [`Auto`](Self::Auto) becomes
    /// [`Off`](Self::Off) on one lane, where the lanes' staging copies would hold more than
    /// [`AUTO_MAX_STAGING_BYTES`] of pinned memory in all, and on a shareable ring (whose
    /// producers are other processes); every other choice stays as asked.
    pub fn for_ring(self, lanes: u32, capacity: u64, shareable: bool) -> CopyEngine {
        if self != CopyEngine::Auto {
            return self;
        }
        // Every lane of a ring of two lanes or more may stage (the BAR lanes from
        // SPLIT_BAR_LANE_RECORD bytes), so each takes a staging copy when first claimed.
        let staging = u64::from(lanes).saturating_mul(capacity);
        if shareable || lanes < 2 || staging > AUTO_MAX_STAGING_BYTES {
            CopyEngine::Off
        } else {
            CopyEngine::Auto
        }
    }

    /// Whether [`Split`](Self::Split) and [`Auto`](Self::Auto) keep lane `lane`'s records below
    /// [`SPLIT_BAR_LANE_RECORD`] on the BAR: three lanes in eight, spread so that the first lanes
    /// claimed have their share.
    fn keeps_bar(lane: u32) -> bool {
        matches!(lane % 8, 0 | 3 | 6)
    }
}

/// What the copy-engine path of a ring's lanes has done so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CopyEngineStats {
    /// Lanes whose staging copy and stream exist (made when a producer first claims the lane).
    pub lanes_ready: usize,
    /// Staged publications queued on the lanes' streams.
    pub copies: u64,
    /// Bytes those publications copied.
    pub bytes: u64,
    /// Publications whose copy could not be queued (a driver error): their staged bytes went
    /// through the BAR instead.
    pub fallbacks: u64,
    /// Publications of records written through the BAR whose tail went through the lane's
    /// stream, behind a staged publication's tail that had not landed yet (each one a driver
    /// call instead of a store: many of them mean small records keep following large ones
    /// closely).
    pub stream_tails: u64,
    /// Why the path is not available, where making it failed (the lanes then use the BAR).
    pub unavailable: Option<String>,
}

/// Where a lane's copies and stream stores go.
pub(super) struct LaneWords {
    /// Device address of the lane's data region.
    pub(super) region_dev: u64,
    /// Device address of the lane's tail word (GPU memory).
    pub(super) tail_dev: u64,
    /// Device address of the lane's stream check word (pinned host memory).
    pub(super) check_dev: u64,
}

/// The tails a lane's copy stream stores: the last one queued (0: none) and the last one known to
/// have landed in the tail word. Only the lane's publisher uses them (atomics only so that the
/// lane can be shared with other threads).
#[derive(Default)]
struct StreamTails {
    queued: AtomicU64,
    landed: AtomicU64,
}

impl StreamTails {
    /// Records `tail` as queued on the stream (after the driver accepted its store).
    fn queue(&self, tail: u64) {
        self.queued.store(tail, Ordering::Relaxed);
    }

    /// Whether a tail queued on the stream has not shown in the tail word yet, for any thread:
    /// reads what the publisher recorded and changes nothing. `read_tail` is called only while
    /// a queued tail is not known to have landed.
    fn pending(&self, read_tail: impl FnOnce() -> u64) -> bool {
        let queued = self.queued.load(Ordering::Relaxed);
        queued > self.landed.load(Ordering::Relaxed) && read_tail() < queued
    }

    /// Whether a queued tail may still be stored after now. `read_tail` loads the tail word; it
    /// is called only while the last queued tail is not known to have landed, and once it shows
    /// that tail, never again for it.
    fn in_flight(&self, read_tail: impl FnOnce() -> u64) -> bool {
        let queued = self.queued.load(Ordering::Relaxed);
        if self.landed.load(Ordering::Relaxed) >= queued {
            return false;
        }
        // While tails are in flight every tail goes through the stream, whose stores run in
        // order: the word holds the last one queued only once all of them have run.
        if read_tail() >= queued {
            self.landed.store(queued, Ordering::Relaxed);
            return false;
        }
        true
    }
}

/// One lane's staging copy, stream and counters.
pub(super) struct LaneCopy {
    gpu: Gpu,
    stream: SendSyncPtr<std::ffi::c_void>,
    /// Host address of the staging copy (`capacity` bytes of pinned memory, inside `keep`).
    staging: SendSyncPtr<u8>,
    /// Device addresses of the lane's region and tail word.
    region_dev: u64,
    tail_dev: u64,
    /// Which tails the stream stores and which of them have landed.
    tails: StreamTails,
    copies: AtomicU64,
    bytes: AtomicU64,
    fallbacks: AtomicU64,
    stream_tails: AtomicU64,
    /// What the queued copies read and write, kept until they have run; `None` only while
    /// dropping.
    keep: Option<(CopySource, Stream, Arc<dyn Any + Send + Sync>)>,
}
// `Send + Sync` by its fields, as the compiler checks here.
const _: () = assert_send_sync::<LaneCopy>();

impl LaneCopy {
    /// Makes a lane's staging copy (`capacity` bytes of pinned host memory from the `Gpu`'s
    /// cache, so that dropping the ring never frees it under a kernel) and its non-blocking
    /// stream, and checks that the stream can store 64-bit words (stream memory operations).
    /// `words` are the device addresses of the lane's region, tail word and stream check word,
    /// all inside `memory`, which is kept until the copies queued on the stream have run.
    pub(super) fn new(
        gpu: &Gpu,
        memory: Arc<dyn Any + Send + Sync>,
        words: LaneWords,
        capacity: u64,
    ) -> Result<LaneCopy> {
        let len = usize::try_from(capacity)
            .map_err(|_| Error::internal("ring capacity beyond the address space"))?;
        let staging = gpu.copy_source(len)?;
        let stream = Stream::new(gpu)?;
        let copy = LaneCopy {
            gpu: gpu.clone(),
            stream: SendSyncPtr::new(stream.raw()),
            staging: SendSyncPtr::new(staging.as_ptr()),
            region_dev: words.region_dev,
            tail_dev: words.tail_dev,
            tails: StreamTails::default(),
            copies: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
            stream_tails: AtomicU64::new(0),
            keep: Some((staging, stream, memory)),
        };
        // Stores 0 (what the word holds) through the stream: fails here, not in a publication,
        // where the driver lacks `cuStreamWriteValue64`.
        {
            let _ctx = gpu.bind()?;
            // SAFETY: our live stream; an aligned word of the pinned host words that nothing
            // else uses, mapped for the device and kept alive by `keep` until the stream's work
            // has run.
            unsafe {
                gpu.driver()
                    .cu_stream_write_value64(copy.raw_stream(), words.check_dev, 0, 0)
            }?;
        }
        Ok(copy)
    }

    fn raw_stream(&self) -> CuStream {
        self.stream.get()
    }

    /// Whether a tail queued on the stream may still be stored after now: a publication through
    /// the BAR must then queue its tail behind it. `read_tail` loads the lane's tail word (through
    /// the BAR); it is called only while the last queued tail is not yet known to have landed.
    /// For the lane's publisher only.
    pub(super) fn tail_in_flight(&self, read_tail: impl FnOnce() -> u64) -> bool {
        self.tails.in_flight(read_tail)
    }

    /// Whether a tail queued on the stream has not landed in the tail word yet. Unlike
    /// [`tail_in_flight`](Self::tail_in_flight) any thread may ask (it changes nothing);
    /// `read_tail` loads the lane's tail word.
    pub(super) fn tail_pending(&self, read_tail: impl FnOnce() -> u64) -> bool {
        self.tails.pending(read_tail)
    }

    /// The lane's stream (`None` only while dropping).
    fn stream(&self) -> Option<&Stream> {
        self.keep.as_ref().map(|(_, stream, _)| stream)
    }

    /// Copies `bytes` to `offset` of the staging copy (pinned host memory) with `kernel`'s
    /// streaming stores: the copy engine, not this CPU, reads the bytes next, so they go to
    /// memory without first reading each line into the cache, and leave the cache alone. The
    /// publication's `sfence` orders them before the copy is queued.
    ///
    /// # Safety
    /// `offset + bytes.len() <= capacity`, and no one else writes these bytes or has a copy of
    /// them queued (the ring's reclaim rule: they lie below no unconsumed record).
    pub(super) unsafe fn stage(&self, kernel: WriteKernel, offset: u64, bytes: &[u8]) {
        // SAFETY: in range and owned (the caller's contract); the staging copy lives as long as
        // `self`, and host memory never overlaps the caller's slice; the publication fences.
        unsafe { kernel.write_unfenced(self.staging.get().add(offset as usize), bytes) };
    }

    /// The staged bytes at `offset` (for the fallback through the BAR).
    ///
    /// # Safety
    /// `offset + len <= capacity`, and the bytes were staged and are not written meanwhile.
    pub(super) unsafe fn staged(&self, offset: u64, len: u64) -> &[u8] {
        // SAFETY: the caller's contract; copies only read the staging copy.
        unsafe { std::slice::from_raw_parts(self.staging.get().add(offset as usize), len as usize) }
    }

    /// Queues the copy of positions `[from, tail)` from the staging copy into the region (none
    /// when `from == tail`), then the store of `tail` into the tail word. The caller has fenced
    /// its stores.
    ///
    /// # Safety
    /// The caller is the lane's publisher (calls serialised, `tail` growing), every byte of
    /// `[from, tail)` is staged and `tail - from <= capacity`.
    pub(super) unsafe fn queue(&self, capacity: u64, from: u64, tail: u64) -> Result<()> {
        let driver = self.gpu.driver();
        let _ctx = self.gpu.bind()?;
        let len = tail - from;
        let at = from & (capacity - 1);
        let first = len.min(capacity - at);
        // A span that runs past the end is two copies (the staging copy is mapped once).
        for (offset, n) in [(at, first), (0, len - first)] {
            if n > 0 {
                let source = self.staging.get().wrapping_add(offset as usize);
                // SAFETY: both ranges lie inside live allocations of `capacity` bytes (the
                // region and the pinned staging copy, kept by `keep` until the stream has run);
                // the stream is ours.
                unsafe {
                    driver.cu_memcpy_htod_async(
                        self.region_dev + offset,
                        source.cast(),
                        n as usize,
                        self.raw_stream(),
                    )
                }?;
            }
        }
        // SAFETY: an aligned word inside the control allocation, kept by `keep`; flags 0 put a
        // memory barrier before the store, so the tail follows the copy.
        unsafe { driver.cu_stream_write_value64(self.raw_stream(), self.tail_dev, tail, 0) }?;
        self.tails.queue(tail);
        if len > 0 {
            self.copies.fetch_add(1, Ordering::Relaxed);
            self.bytes.fetch_add(len, Ordering::Relaxed);
        } else {
            self.stream_tails.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Counts a publication that went through the BAR because its copy could not be queued.
    pub(super) fn count_fallback(&self) {
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds this lane's counters to `stats`.
    pub(super) fn add_to(&self, stats: &mut CopyEngineStats) {
        stats.lanes_ready += 1;
        stats.copies += self.copies.load(Ordering::Relaxed);
        stats.bytes += self.bytes.load(Ordering::Relaxed);
        stats.fallbacks += self.fallbacks.load(Ordering::Relaxed);
        stats.stream_tails += self.stream_tails.load(Ordering::Relaxed);
    }
}

/// Queues the store of `value` into the 32-bit device word at `word_dev` behind everything
/// queued so far on the streams of `lanes` (none: nothing is queued): on the first lane's stream,
/// after that stream waits for an event recorded on each of the others'. Never waits. The word
/// must lie in the memory the lanes' copies keep (the ring's), which the first lane's stream
/// then keeps until the store has run.
pub(super) fn store_after_lanes(lanes: &[&LaneCopy], word_dev: u64, value: u32) -> Result<()> {
    let Some((first, others)) = lanes.split_first() else {
        return Ok(());
    };
    let dropping = || Error::internal("a lane's copy stream is being dropped");
    let stream = first.stream().ok_or_else(dropping)?;
    for other in others {
        let event = Event::new(&first.gpu)?;
        event.record(other.stream().ok_or_else(dropping)?)?;
        stream.wait_for(&event)?;
    }
    let _ctx = first.gpu.bind()?;
    // SAFETY: our live stream; an aligned word of the ring's memory, which `first.keep` holds
    // until the work queued on the stream has run. Flags 0 put a memory barrier before the
    // store, so it lands after every tail queued before it.
    unsafe {
        first
            .gpu
            .driver()
            .cu_stream_write_value32(stream.raw(), word_dev, value, 0)
    }
}

impl Drop for LaneCopy {
    /// Never waits: the staging copy, the stream and the ring's memory are kept until the copies
    /// queued on the stream have run.
    fn drop(&mut self) {
        let Some(keep) = self.keep.take() else {
            return;
        };
        match keep.1.fence() {
            Ok(fence) => self.gpu.release_after(keep, fence),
            // No fence in a dead context: no copy of it runs any more.
            Err(_) => drop(keep),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::StreamTails;
    use std::cell::Cell;

    #[test]
    fn nothing_queued_is_never_in_flight_and_reads_nothing() {
        let tails = StreamTails::default();
        assert!(!tails.in_flight(|| unreachable!("no tail queued: nothing to read")));
    }

    #[test]
    fn a_queued_tail_is_in_flight_until_the_word_shows_it_then_read_no_more() {
        let tails = StreamTails::default();
        tails.queue(4096);
        let reads = Cell::new(0);
        let read = |word: u64| {
            reads.set(reads.get() + 1);
            word
        };
        // The word still holds an older tail (the stream's store has not run).
        assert!(tails.in_flight(|| read(0)));
        assert!(tails.in_flight(|| read(1024)));
        // It has run: landed, and known from now on without a load.
        assert!(!tails.in_flight(|| read(4096)));
        assert!(!tails.in_flight(|| read(0)));
        assert_eq!(reads.get(), 3);
        // A later tail queued behind it is in flight again until it shows.
        tails.queue(8192);
        assert!(tails.in_flight(|| read(4096)));
        assert!(!tails.in_flight(|| read(8192)));
        assert_eq!(reads.get(), 5);
    }

    #[test]
    fn pending_asks_the_word_only_about_a_tail_not_known_landed_and_records_nothing() {
        let tails = StreamTails::default();
        assert!(!tails.pending(|| unreachable!("no tail queued: nothing to read")));
        tails.queue(4096);
        assert!(tails.pending(|| 1024), "the word still holds an older tail");
        assert!(!tails.pending(|| 4096), "the tail has landed");
        // Asking from another thread records nothing: the publisher still reads the word once.
        let reads = Cell::new(0);
        assert!(!tails.in_flight(|| {
            reads.set(reads.get() + 1);
            4096
        }));
        assert_eq!(reads.get(), 1);
        // Once the publisher knows it landed, nobody reads the word for it again.
        assert!(!tails.pending(|| unreachable!("known to have landed")));
    }
}
