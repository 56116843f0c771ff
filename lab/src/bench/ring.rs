//! `ring`: records streamed from CPU producer threads into a ring in GPU memory, consumed by a
//! resident kernel, next to the same records sent with `cuMemcpyHtoDAsync` batches.
//!
//! Producers: each thread owns a lane (`DeviceRing::producer`) and publishes batches of up to
//! 64 KiB with one fence and one tail store (`push_batch`); beside them one record per
//! publication (`push`) and the shared path (`reserve`/`commit` from 4 threads on one lane).
//! Consumers: `ring_ack_lanes` acknowledges whatever is published without reading it (the
//! transport rate into GPU memory), `ring_check_lanes` (the device API of
//! `include/vkgdr/ring.cuh`, one block per lane) reads and verifies every record. Latency is the
//! round trip "publish a record → the kernel publishes a head past it → the CPU sees that head",
//! so commit→seen is at most that.
//!
//! `ring-wrap` puts a padded and a mirrored ring of the same small size side by side with records
//! that are a large share of it: the padded ring wastes the bytes before the end on every lap,
//! the mirrored one lets records run over the end.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use vkgdr::cuda_objects::{LaunchConfig, Module, Stream};
use vkgdr::ring::core::{Producer, RingSink};
use vkgdr::ring::layout::{self, seal_test_payload, WrapMode, HEADER_LEN};
use vkgdr::ring::{BarSink, CopyEngine, DeviceRing, RingDeviceView, RingOptions};
use vkgdr::{Gpu, OpenOptions};

use super::error::{BenchError, BenchResult};
use super::host_pinned::HostPinned;
use super::measure::{open_gpu, Stats};
use super::options::Options;
use super::raw_bar::Gang;
use super::report::format::fmt_size;
use super::report::model::{Figure, Report, Unit};
use crate::ui;

/// The ring kernels (`ring_ack`, `ring_ack_lanes`, `ring_ack_load_lanes`, `ring_check_lanes`).
pub(super) const PTX: &str =
    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels/ring.ptx"));
const PRODUCERS: usize = 4;
const RING_BYTES: u64 = 64 << 20;
/// Each lane of a multi-lane ring.
const LANE_BYTES: u64 = 16 << 20;
/// Record sizes including the 16-byte header, for the `cuMemcpyHtoDAsync` rows: every size of
/// the eight-producer rows.
const SIZES: [u64; 8] = [64, 512, 1024, 2048, 4096, 64 << 10, 256 << 10, 1 << 20];
/// The `cuMemcpyHtoDAsync` rows' buffers (pinned source, device destination): 256 records of
/// the largest size in one copy.
const COPY_BYTES: u64 = 256 << 20;
/// Bytes per `push_batch` (records of one size), at least...
const BATCH_BYTES: u64 = 64 << 10;
/// ... this many records, as the batched `cuMemcpyHtoDAsync` row copies, and at most a quarter
/// of a lane.
const BATCH_RECORDS: u64 = 256;

/// A batch of 1 to 64 records of 16 to 4080 payload bytes, sealed from `first` on (the checking
/// kernel verifies each one's seq and checksum): what a soak's ring producers push, in threads
/// and in other processes alike.
pub fn random_batch(rng: &mut impl rand::Rng, first: u64) -> Vec<Vec<u8>> {
    let n = rng.gen_range(1..=64);
    (0..n)
        .map(|k| {
            let mut r = vec![0u8; rng.gen_range(16..=4080)];
            seal_test_payload(&mut r, first + k);
            r
        })
        .collect()
}

/// Records per `push_batch` of `size`-byte records.
pub(crate) fn batch_records(size: u64) -> u64 {
    (BATCH_BYTES / size)
        .max(BATCH_RECORDS)
        .min(LANE_BYTES / 4 / size)
        .max(1)
}
/// The padded-versus-mirrored comparison: a ring of one VMM granule (2 MiB on the H100) and records
/// (header included) from small to most of it.
const WRAP_RING_BYTES: u64 = 2 << 20;
const WRAP_SIZES: [u64; 4] = [4096, 192 << 10, 768 << 10, 1536 << 10];

/// Which kernel consumes the ring.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Consumer {
    /// `ring_ack` on lane 0: head = tail, reading nothing.
    Ack,
    /// `ring_ack_lanes`: the same on every lane.
    AckLanes,
    /// `ring_ack_load_lanes`: on every lane, head = tail once the first record's header is read
    /// (the least a consumer that looks at a record pays).
    AckLoadLanes,
    /// `ring_check_lanes`: every record read and verified (the device API).
    Check,
}

/// How producers write.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Produce {
    /// `reserve`/`commit` through `&DeviceRing` (one shared lane).
    Shared,
    /// Each thread owns a lane, one publication per record.
    Push,
    /// Each thread owns a lane, `push_batch` of up to `BATCH_BYTES`.
    Batch,
    /// The same with every large record staged, each batch's first included
    /// (`Producer::set_stage_after(0)`).
    BatchStagedFromFirst,
}

impl Produce {
    /// Whether each thread pushes batches through a lane of its own.
    fn batches(self) -> bool {
        matches!(self, Produce::Batch | Produce::BatchStagedFromFirst)
    }
}

/// Launches `consumer` on `ring` and watches it.
pub(super) fn launch_consumer(
    module: &Module,
    ring: &DeviceRing,
    stream: &Stream,
    consumer: Consumer,
) -> BenchResult<()> {
    let mut v = ring.device_view();
    let (mut t, mut s, mut h) = (v.tail, v.stop, v.head);
    let mut view = [(&mut v as *mut RingDeviceView).cast::<c_void>()];
    let mut ack = [&mut t as *mut u64, &mut s, &mut h].map(|p| p.cast::<c_void>());
    let (name, params, blocks, threads): (_, &mut [*mut c_void], _, _) = match consumer {
        Consumer::Ack => ("ring_ack", &mut ack, 1, 1),
        Consumer::AckLanes => ("ring_ack_lanes", &mut view, v.lanes, 32),
        Consumer::AckLoadLanes => ("ring_ack_load_lanes", &mut view, v.lanes, 32),
        Consumer::Check => (
            "ring_check_lanes",
            &mut view,
            v.lanes,
            layout::CHECK_THREADS,
        ),
    };
    let f = module.function(name)?;
    // SAFETY: ring_ack(u64*, u32*, u64*) takes three 8-byte parameters, ring_ack_lanes,
    // ring_ack_load_lanes and ring_check_lanes the 64-byte #[repr(C)] view by value; the ring is
    // watched below, so it stops and waits for the kernel before its memory is freed.
    unsafe { f.launch(LaunchConfig::linear(blocks, threads), Some(stream), params)? };
    ring.watch_consumer(stream)?;
    Ok(())
}

/// Stops the ring's consumer and waits for it (20 s at most).
pub(super) fn finish(ring: &DeviceRing) -> BenchResult<()> {
    ring.stop_and_wait(Duration::from_secs(20))
        .map_err(|e| BenchError::KernelStuck(format!("ring consumer did not stop: {e}")))
}

/// A payload of `size - 16` bytes whose test prefix the checking kernel accepts for any seq: the
/// body is fixed, so its checksum is computed once and each record only stamps its seq.
pub(crate) struct Payload {
    buf: Vec<u8>,
}

impl Payload {
    /// A record of `size` bytes, header included.
    pub(crate) fn new(size: u64) -> Self {
        let mut buf = vec![0x5au8; (size - HEADER_LEN) as usize];
        seal_test_payload(&mut buf, 0);
        Payload { buf }
    }

    /// The payload with `seq` stamped into it.
    pub(crate) fn stamped(&mut self, seq: u64) -> &[u8] {
        if self.buf.len() >= layout::TEST_PREFIX_LEN {
            self.buf[..8].copy_from_slice(&seq.to_le_bytes());
        }
        &self.buf
    }

    /// The payload as last stamped.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf
    }
}

/// Streams `per_thread` records of `size` bytes from each of `producers` threads; returns GB/s
/// of record bytes delivered (every lane's head past its records).
pub(super) fn stream_records(
    ring: &DeviceRing,
    size: u64,
    producers: usize,
    per_thread: u64,
    how: Produce,
) -> BenchResult<f64> {
    let limit = Some(Duration::from_secs(10));
    if how != Produce::Shared {
        // Claim every lane once before the clock starts: a lane's first claim makes its
        // copy-engine staging (a pinned allocation), which is set-up, not streaming.
        for _ in 0..ring.lanes() {
            drop(ring.producer()?);
        }
    }
    // Every producer's record buffers, made (written and checksummed) before the clock starts.
    let payloads: Vec<Vec<Payload>> = (0..producers)
        .map(|_| {
            if how.batches() {
                batch_payloads(size)
            } else {
                vec![Payload::new(size)]
            }
        })
        .collect();
    let t0 = Instant::now();
    on_threads(payloads, |mut bufs| {
        if how.batches() {
            let mut p = ring.producer()?;
            if how == Produce::BatchStagedFromFirst {
                p.set_stage_after(0);
            }
            return push_batches(&mut p, &mut bufs, per_thread, limit);
        }
        let payload = &mut bufs[0];
        if how == Produce::Shared {
            for _ in 0..per_thread {
                let mut r = ring.reserve(payload.buf.len() as u32, limit)?;
                r.write(0, payload.stamped(r.seq()))?;
                r.commit();
            }
            return Ok(());
        }
        let mut p = ring.producer()?;
        for _ in 0..per_thread {
            let seq = p.next_seq();
            p.push(payload.stamped(seq), limit)?;
        }
        Ok(())
    })?;
    // Wait until the consumer has everything (so the time covers delivery, not just commits).
    for lane in 0..ring.lanes() {
        let end = ring.lane(lane).expect("lane").committed();
        while ring.head_of(lane) < end {
            std::hint::spin_loop();
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok((size * per_thread * producers as u64) as f64 / secs / 1e9)
}

/// Runs `work` on a thread per state, all at once; the first error any of them returned.
fn on_threads<T: Send>(
    states: Vec<T>,
    work: impl Fn(T) -> vkgdr::Result<()> + Sync,
) -> BenchResult<()> {
    let failed = std::thread::scope(|s| {
        let work = &work;
        let hs: Vec<_> = states
            .into_iter()
            .map(|state| s.spawn(move || work(state)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("producer"))
            .find_map(|r| r.err())
    });
    failed.map_or(Ok(()), |e| Err(e.into()))
}

/// The buffers of a batch of `size`-byte records ([`batch_records`] of them). Making them writes
/// and checksums every byte: make them before a clock starts.
pub(crate) fn batch_payloads(size: u64) -> Vec<Payload> {
    (0..batch_records(size))
        .map(|_| Payload::new(size))
        .collect()
}

/// Pushes `records` records through `p` in batches of `bufs.len()` (from [`batch_payloads`]),
/// each record stamped with its seq.
pub(crate) fn push_batches<S: RingSink>(
    p: &mut Producer<'_, S>,
    bufs: &mut [Payload],
    records: u64,
    limit: Option<Duration>,
) -> vkgdr::Result<()> {
    let batch = bufs.len() as u64;
    let mut left = records;
    while left > 0 {
        let k = left.min(batch) as usize;
        let first = p.next_seq();
        for (i, b) in bufs[..k].iter_mut().enumerate() {
            b.stamped(first + i as u64);
        }
        p.push_batch(bufs[..k].iter().map(Payload::bytes), limit)?;
        left -= k as u64;
    }
    Ok(())
}

/// The checking kernel on its own: every lane filled to three quarters first (no consumer
/// running, so no producer waits), the ring stopped, then `ring_check_lanes` launched; GB/s of
/// record bytes from the launch to the kernel's end. Beside the streaming rows it separates the
/// consumer's own cost from what sharing the ring with producers adds.
fn consumer_alone(
    gpu: &Gpu,
    module: &Module,
    stream: &Stream,
    size: u64,
    lanes: u32,
) -> BenchResult<f64> {
    let options = RingOptions {
        lanes,
        wrap: WrapMode::Padded,
        copy_engine: CopyEngine::Off,
    };
    let ring = DeviceRing::with_options(gpu, LANE_BYTES, options)?;
    let per_lane = LANE_BYTES * 3 / 4 / size;
    let limit = Some(Duration::from_secs(10));
    let payloads = (0..lanes).map(|_| batch_payloads(size)).collect();
    on_threads(payloads, |mut bufs| {
        push_batches(&mut ring.producer()?, &mut bufs, per_lane, limit)
    })?;
    ring.stop();
    let t0 = Instant::now();
    launch_consumer(module, &ring, stream, Consumer::Check)?;
    stream.synchronize()?;
    let secs = t0.elapsed().as_secs_f64();
    for lane in 0..ring.lanes() {
        let res = ring.results_of(lane);
        if res[layout::RESULT_ERRORS] != 0 || res[layout::RESULT_RECORDS] != per_lane {
            return Err(BenchError::Check(format!(
                "checking kernel alone, lane {lane} of {lanes}: {} records expected, {res:?}",
                per_lane
            )));
        }
    }
    Ok((size * per_lane * lanes as u64) as f64 / secs / 1e9)
}

/// How a lone record is published in [`round_trips`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Lone {
    /// `reserve`/`commit` through `&DeviceRing` (lane 0).
    Shared,
    /// A lane's producer, `push`.
    Push,
    /// A lane's producer told `set_stage_after(0)`, `push`: a large record is staged.
    PushStaged,
}

/// The longest a lone record's push and round trip may take before the benchmark fails.
pub(super) const ROUND_TRIP_LIMIT: Duration = Duration::from_secs(10);

/// The lane of `ring` that `p` owns.
pub(super) fn lane_of(ring: &DeviceRing, p: &Producer<'_, BarSink>) -> BenchResult<usize> {
    (0..ring.lanes())
        .find(|&i| ring.lane(i).is_some_and(|c| std::ptr::eq(c, p.core())))
        .ok_or_else(|| BenchError::Check("the producer's lane is not the ring's".into()))
}

/// Waits until `lane`'s head reaches `end` (a record published at `t`); returns the round trip
/// in nanoseconds, or fails once [`ROUND_TRIP_LIMIT`] has passed.
pub(super) fn wait_for_head(
    ring: &DeviceRing,
    lane: usize,
    end: u64,
    t: Instant,
) -> BenchResult<f64> {
    while ring.head_of(lane) < end {
        if t.elapsed() > ROUND_TRIP_LIMIT {
            return Err(BenchError::KernelStuck(format!(
                "lane {lane}'s head stayed below {end} for {ROUND_TRIP_LIMIT:?}"
            )));
        }
        std::hint::spin_loop();
    }
    Ok(t.elapsed().as_nanos() as f64)
}

/// Round trips of one record of `size` bytes: published alone, then waited for until the
/// kernel's head passes it ([`ROUND_TRIP_LIMIT`] at most).
pub(super) fn round_trips(
    ring: &DeviceRing,
    size: u64,
    n: usize,
    how: Lone,
) -> BenchResult<Vec<f64>> {
    let mut payload = Payload::new(size);
    let mut out = Vec::with_capacity(n);
    let mut producer = if how == Lone::Shared {
        None
    } else {
        Some(ring.producer()?)
    };
    if let Some(p) = producer.as_mut().filter(|_| how == Lone::PushStaged) {
        p.set_stage_after(0);
    }
    let lane = match &producer {
        None => 0,
        Some(p) => lane_of(ring, p)?,
    };
    for _ in 0..n {
        let t = Instant::now();
        let end = match producer.as_mut() {
            Some(p) => {
                let seq = p.next_seq();
                p.push(payload.stamped(seq), Some(ROUND_TRIP_LIMIT))
                    .map_err(vkgdr::Error::from)?;
                p.core().committed()
            }
            None => {
                let mut r = ring.reserve(payload.buf.len() as u32, Some(ROUND_TRIP_LIMIT))?;
                r.write(0, payload.stamped(r.seq()))
                    .map_err(vkgdr::Error::from)?;
                r.commit();
                ring.core().committed()
            }
        };
        out.push(wait_for_head(ring, lane, end, t)?);
    }
    Ok(out)
}

/// The same bytes through `cuMemcpyHtoDAsync` from pinned memory, `batch` records per copy, copies
/// issued back to back on one stream, synchronised at the end. Returns GB/s.
fn memcpy_batches(
    gpu: &Gpu,
    dst: u64,
    size: u64,
    records: u64,
    batch: u64,
    staging: &HostPinned,
    stream: &Stream,
) -> BenchResult<f64> {
    let driver = gpu.driver();
    let bytes = size * batch;
    let copies = records / batch;
    let cap = staging.len() as u64 / bytes * bytes;
    if cap == 0 {
        return Err(BenchError::Check(format!(
            "a {bytes}-byte copy does not fit the {}-byte buffers",
            staging.len()
        )));
    }
    let t0 = Instant::now();
    let mut off = 0u64;
    for _ in 0..copies {
        if off + bytes > cap {
            off = 0;
        }
        // SAFETY: `dst` has as many bytes as the staging buffer and `off + bytes <= cap <=
        // staging.len()`; the staging buffer outlives the synchronisation below.
        unsafe {
            driver.cu_memcpy_htod_async(
                dst + off,
                staging.as_ptr().add(off as usize).cast(),
                bytes as usize,
                stream.raw(),
            )
        }?;
        off += bytes;
    }
    stream.synchronize()?;
    Ok((bytes * copies) as f64 / t0.elapsed().as_secs_f64() / 1e9)
}

/// Sizes of the lone large records of `ring-latency`, each through the BAR and staged, beside
/// `cuMemcpyHtoDAsync` + sync of the same size.
const LONE_LARGE_SIZES: [u64; 2] = [64 << 10, 1 << 20];

/// Streams of the copy-engine lane pattern: one per producer of the eight-producer rows.
const PATTERN_STREAMS: usize = 8;
/// Record sizes of the pattern rows: the ring rows' sizes the copy engine serves, from 2 KiB
/// (below it a ring passes batched DMA with the lanes split between the two paths).
const PATTERN_SIZES: [u64; 5] = [2048, 4096, 64 << 10, 256 << 10, 1 << 20];

/// The rows the registry names.
pub mod rows {
    /// `ring-throughput`: the same records by `cuMemcpyHtoDAsync`, one per copy.
    pub const COPY_1: &str = "cuMemcpyHtoDAsync, 1 per copy";
    /// `ring-throughput`: 256 records per copy.
    pub const COPY_256: &str = "cuMemcpyHtoDAsync, 256 per copy";
    /// `ring-throughput`: the copy-engine lanes' pattern alone.
    pub const PATTERN_COPIES: &str = "cuMemcpyHtoDAsync on 8 streams, one copy per publication";
    /// `ring-throughput`: the same with the tail store after each copy.
    pub const PATTERN_TAIL: &str =
        "cuMemcpyHtoDAsync on 8 streams, one copy per publication + tail store";
    /// `ring-throughput`: the same, each publication first written into the staging buffer by
    /// its own thread (the producers' share of the host's memory).
    pub const PATTERN_STAGED: &str =
        "8 threads stage each publication in pinned memory, then copy + tail store";
    /// `ring-throughput`: every row of the driver's copies alone.
    pub const DRIVER_COPIES: [&str; 5] = [
        COPY_1,
        COPY_256,
        PATTERN_COPIES,
        PATTERN_TAIL,
        PATTERN_STAGED,
    ];
    /// `ring-throughput`: CPU stores into the BAR from 8 threads, nothing else on the link.
    pub const BAR_ALONE: &str = "BAR stores, 8 threads, alone";
    /// `ring-throughput`: the same stores while the copy pattern (with tail stores) runs.
    pub const BAR_BESIDE_COPIES: &str = "BAR stores, 8 threads, beside the copy pattern";
    /// `ring-throughput`: the copy pattern (with tail stores) while the BAR stores run.
    pub const COPIES_BESIDE_BAR: &str = "copy pattern + tail store, beside the BAR stores";
    /// `ring-throughput`: what the two paths carried together over the same interval.
    pub const BOTH_PATHS: &str = "BAR stores + copy pattern at once, total";
    /// `ring-throughput`: the host-to-device link's rows (machine rows: no library code).
    pub const LINK: [&str; 4] = [BAR_ALONE, BAR_BESIDE_COPIES, COPIES_BESIDE_BAR, BOTH_PATHS];
    /// `ring-latency`: a record pushed alone by a lane's producer, to the ack kernel.
    pub const PUSH_ACK: &str = "ring push → ack kernel → CPU";
    /// `ring-latency`: the same, the producer told to stage large records from the first.
    pub const PUSH_STAGED_ACK: &str = "ring push staged from the first record → ack kernel → CPU";
    /// `ring-latency`: one record by `cuMemcpyHtoDAsync` and a synchronisation.
    pub const COPY_SYNC: &str = "cuMemcpyHtoDAsync + sync";
    /// `ring-latency`: the same, the record first copied into the pinned buffer from memory of
    /// the caller's (what a ring producer's push includes: writing the record).
    pub const MEMCPY_COPY_SYNC: &str = "memcpy into pinned memory + cuMemcpyHtoDAsync + sync";
    /// `ring-wrap`: a padded ring.
    pub const PADDED: &str = "padded ring (wrap PAD at the end)";
    /// `ring-wrap`: a mirrored ring.
    pub const MIRRORED: &str = "mirrored ring (records run over the end)";
}
use rows::{PATTERN_COPIES, PATTERN_TAIL};

/// Where the lane pattern copies and stores: `PATTERN_STREAMS` regions of the first `len` bytes
/// of `dst` and `staging` (one per stream), and a tail word per stream at `tails` (GPU memory).
struct PatternTargets<'a> {
    dst: u64,
    staging: &'a HostPinned,
    /// At most the staging buffer's length and `dst`'s.
    len: u64,
    tails: u64,
}

/// The copy-engine lanes' queue work for `records` records of `size` bytes: publications of
/// [`batch_records`] records, each one `cuMemcpyHtoDAsync` from stream `i`'s region of the
/// staging buffer into its region of `dst`, issued on the streams in turn, followed (when
/// `tail`) by the lane's `cuStreamWriteValue64` of its tail (flags 0: a memory barrier before
/// it). Synchronised at the end. Returns GB/s.
fn lane_pattern(
    gpu: &Gpu,
    to: &PatternTargets,
    streams: &[Stream],
    size: u64,
    records: u64,
    tail: bool,
) -> BenchResult<f64> {
    let driver = gpu.driver();
    let bytes = size * batch_records(size);
    let region = to.len / streams.len() as u64;
    let per_region = region / bytes;
    if per_region == 0 {
        return Err(BenchError::Check(format!(
            "a {bytes}-byte publication does not fit a {region}-byte region"
        )));
    }
    let copies = records * size / bytes;
    let _ctx = gpu.bind()?;
    let t0 = Instant::now();
    for k in 0..copies {
        let lane = (k % streams.len() as u64) as usize;
        let slot = (k / streams.len() as u64) % per_region;
        let off = lane as u64 * region + slot * bytes;
        let stream = streams[lane].raw();
        // SAFETY: `off + bytes <= streams.len() * region <= len`, within staging and `dst`; the
        // staging buffer, `dst` and the tail words outlive the synchronisation below; each tail
        // word is an aligned u64 of their buffer (8 bytes per stream).
        unsafe {
            driver.cu_memcpy_htod_async(
                to.dst + off,
                to.staging.as_ptr().add(off as usize).cast(),
                bytes as usize,
                stream,
            )?;
            if tail {
                driver.cu_stream_write_value64(stream, to.tails + 8 * lane as u64, k + 1, 0)?;
            }
        }
    }
    for s in streams {
        s.synchronize()?;
    }
    Ok((bytes * copies) as f64 / t0.elapsed().as_secs_f64() / 1e9)
}

/// The copy-engine lanes' whole work without the ring: [`PATTERN_STREAMS`] threads, each with
/// its own stream and region of the staging buffer, write each publication ([`batch_records`]
/// records of `size` bytes, each from its own buffer as the ring rows' producers write them,
/// with the streaming stores a staging producer uses), fence, and queue its copy and tail
/// store as [`lane_pattern`] does. A slot of the region is written again only after the event
/// recorded behind its last copy has completed (the ring reuses its staging copy once the
/// consumer's head has passed, which is later). The ceiling of a ring whose producers stage:
/// what the host's memory gives the copy engine while the producers write. Returns GB/s.
fn staged_pattern(
    gpu: &Gpu,
    to: &PatternTargets,
    streams: &[Stream],
    size: u64,
    records: u64,
) -> BenchResult<f64> {
    let driver = gpu.driver();
    let batch = batch_records(size);
    let bytes = size * batch;
    let region = to.len / streams.len() as u64;
    let per_region = region / bytes;
    if per_region == 0 {
        return Err(BenchError::Check(format!(
            "a {bytes}-byte publication does not fit a {region}-byte region"
        )));
    }
    let per_thread = records * size / bytes / streams.len() as u64;
    let kernel = vkgdr::copy::WriteKernel::detected();
    // The staging buffer's address, shared by the threads as an integer: each writes only its
    // own region.
    let base = to.staging.as_ptr() as usize;
    let (dst_base, tails) = (to.dst, to.tails);
    // A buffer per record of a publication, as the ring rows' producers have (`push_batches`):
    // at 64 KiB, 4 MiB a thread, read from memory. Made before the clock starts.
    let sources: Vec<Vec<Vec<u8>>> = (0..streams.len())
        .map(|lane| {
            (0..batch)
                .map(|r| vec![(r as u8) ^ (lane as u8); size as usize])
                .collect()
        })
        .collect();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        let threads: Vec<_> = streams
            .iter()
            .zip(sources)
            .enumerate()
            .map(|(lane, (stream, sources))| {
                s.spawn(move || -> BenchResult<()> {
                    let _ctx = gpu.bind()?;
                    let events: Vec<vkgdr::cuda_objects::Event> = (0..per_region)
                        .map(|_| vkgdr::cuda_objects::Event::new(gpu))
                        .collect::<vkgdr::Result<_>>()?;
                    for k in 0..per_thread {
                        let slot = k % per_region;
                        if k >= per_region {
                            events[slot as usize].synchronize()?;
                        }
                        let off = lane as u64 * region + slot * bytes;
                        let dst = (base + off as usize) as *mut u8;
                        for (r, source) in sources.iter().enumerate() {
                            // SAFETY: `off + bytes <= streams.len() * region <= len`;
                            // this thread alone writes its region, and the event above says
                            // the slot's last copy has read it.
                            unsafe { kernel.write_unfenced(dst.add(r * size as usize), source) };
                        }
                        // The streaming stores reach memory before the copy is queued.
                        std::sync::atomic::fence(Ordering::SeqCst);
                        // SAFETY: as in `lane_pattern`; the slot is not written again before
                        // its event completes.
                        unsafe {
                            driver.cu_memcpy_htod_async(
                                dst_base + off,
                                dst.cast_const().cast(),
                                bytes as usize,
                                stream.raw(),
                            )?;
                            driver.cu_stream_write_value64(
                                stream.raw(),
                                tails + 8 * lane as u64,
                                k + 1,
                                0,
                            )?;
                        }
                        events[slot as usize].record(stream)?;
                    }
                    stream.synchronize()?;
                    Ok(())
                })
            })
            .collect();
        for t in threads {
            t.join().expect("a staging thread")?;
        }
        Ok::<(), BenchError>(())
    })?;
    let total = per_thread * streams.len() as u64 * bytes;
    Ok(total as f64 / t0.elapsed().as_secs_f64() / 1e9)
}

/// Threads that store into the BAR in the link rows (as many as the ring rows' producers).
const LINK_THREADS: usize = 8;
/// Bytes of one gang store in the link rows: short enough that the last one ends soon after the
/// copies, long enough that the gang's barriers cost nothing beside it.
const LINK_STORE_BYTES: usize = 8 << 20;

/// What the BAR stores of the link rows write into: a BAR mapping, a source, the gang.
struct BarStores {
    memory: vkgdr::RawMemory,
    src: Vec<u8>,
    gang: Gang,
}

impl BarStores {
    fn new(gpu: &Gpu) -> BenchResult<BarStores> {
        Ok(BarStores {
            memory: gpu.alloc(LINK_STORE_BYTES as u64)?,
            src: (0..LINK_STORE_BYTES).map(|i| i as u8).collect(),
            gang: Gang::new(LINK_THREADS),
        })
    }

    /// Stores [`LINK_STORE_BYTES`] at a time until `stop` is set (checked between stores);
    /// returns the bytes stored and the seconds from the first store's start to the last one's end.
    fn until(&self, stop: &AtomicBool) -> (u64, f64) {
        let t0 = Instant::now();
        let mut bytes = 0u64;
        while !stop.load(Ordering::Relaxed) {
            // SAFETY: the mapping holds `LINK_STORE_BYTES` bytes, no kernel touches it, and
            // `src` is a distinct host buffer of that length.
            unsafe { self.gang.store(self.memory.host_ptr(), &self.src) };
            bytes += LINK_STORE_BYTES as u64;
        }
        (bytes, t0.elapsed().as_secs_f64())
    }

    /// `bytes` (rounded up to whole stores) alone; returns GB/s.
    fn alone(&self, bytes: u64) -> f64 {
        let n = bytes.div_ceil(LINK_STORE_BYTES as u64);
        let t0 = Instant::now();
        for _ in 0..n {
            // SAFETY: as in `until`.
            unsafe { self.gang.store(self.memory.host_ptr(), &self.src) };
        }
        (n * LINK_STORE_BYTES as u64) as f64 / t0.elapsed().as_secs_f64() / 1e9
    }
}

/// The BAR's stores and the copy-engine lanes' pattern (with tail stores) at once, over the same
/// link: the stores start first and stop once the copies are done; the stores' rate counts
/// their own interval (at most one store past the copies' end). Returns (BAR, copies) in GB/s.
fn both_paths(
    gpu: &Gpu,
    to: &PatternTargets,
    streams: &[Stream],
    bar: &BarStores,
    size: u64,
    records: u64,
) -> BenchResult<(f64, f64)> {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let stores = s.spawn(|| bar.until(&stop));
        let copies = lane_pattern(gpu, to, streams, size, records, true);
        stop.store(true, Ordering::Relaxed);
        let (bytes, secs) = stores.join().expect("BAR stores");
        Ok((bytes as f64 / secs / 1e9, copies?))
    })
}

/// Round trips of one `size`-byte copy from pinned memory and a synchronisation; with `from`,
/// the bytes are first copied (`memcpy`) from it into the pinned buffer, as a user whose record
/// is in memory of their own does.
fn memcpy_latency(
    gpu: &Gpu,
    dst: u64,
    size: u64,
    staging: &mut HostPinned,
    from: Option<&[u8]>,
    stream: &Stream,
    n: usize,
) -> BenchResult<Vec<f64>> {
    let driver = gpu.driver();
    if size as usize > staging.len() {
        return Err(BenchError::Check(format!(
            "a {size}-byte copy does not fit the {}-byte buffers",
            staging.len()
        )));
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        if let Some(from) = from {
            staging.as_mut_slice()[..from.len()].copy_from_slice(from);
        }
        // SAFETY: `size <= staging.len()`, checked above, and `dst` is as large; the staging
        // buffer outlives the synchronisation below.
        unsafe {
            driver.cu_memcpy_htod_async(dst, staging.as_ptr().cast(), size as usize, stream.raw())
        }?;
        stream.synchronize()?;
        out.push(t.elapsed().as_nanos() as f64);
    }
    Ok(out)
}

/// One row of the throughput report: who produces, who consumes, which records take the copy
/// engine, at which record sizes.
struct ThroughputRow {
    consumer: Consumer,
    how: Produce,
    producers: usize,
    copy: CopyEngine,
    sizes: &'static [u64],
    name: &'static str,
}

/// Every size, for the rows with the default path choice.
const ALL_SIZES: &[u64] = &[64, 512, 1024, 2048, 4096, 64 << 10];
/// Sizes around the copy engine's threshold, for the rows that force one path.
const LARGE_SIZES: &[u64] = &[1024, 2048, 4096, 64 << 10];
/// The eight-producer ack rows beside batched DMA: every size up to records of 1 MiB, ...
const EIGHT_SIZES: &[u64] = &[64, 512, 1024, 2048, 4096, 64 << 10, 256 << 10, 1 << 20];
/// ... and those of them around and past the copy engine's threshold.
const EIGHT_LARGE_SIZES: &[u64] = &[1024, 2048, 4096, 64 << 10, 256 << 10, 1 << 20];

fn throughput_rows() -> Vec<ThroughputRow> {
    use Consumer::{Ack, AckLanes, Check};
    use Produce::{Batch, BatchStagedFromFirst, Push, Shared};
    let auto = CopyEngine::default();
    let bar = CopyEngine::Off;
    let large = CopyEngine::FromRecord(vkgdr::ring::device::DEFAULT_COPY_ENGINE_RECORD);
    // Every record (16 bytes is the smallest) through the copy engine.
    let engine = CopyEngine::FromRecord(16);
    // Three lanes in eight on the BAR, the others staging every record.
    let split = CopyEngine::Split(16);
    let row = |consumer, how, producers, copy, sizes, name| ThroughputRow {
        consumer,
        how,
        producers,
        copy,
        sizes,
        name,
    };
    vec![
        row(
            AckLanes,
            Batch,
            1,
            auto,
            ALL_SIZES,
            "ring, 1 producer, batches, ack kernel",
        ),
        row(
            AckLanes,
            Batch,
            4,
            auto,
            ALL_SIZES,
            "ring, 4 producers, batches, ack kernel",
        ),
        row(
            AckLanes,
            Batch,
            8,
            auto,
            EIGHT_SIZES,
            "ring, 8 producers, batches, ack kernel",
        ),
        row(
            AckLanes,
            BatchStagedFromFirst,
            8,
            auto,
            EIGHT_LARGE_SIZES,
            "ring, 8 producers, batches staged from the first record, ack kernel",
        ),
        row(
            AckLanes,
            Batch,
            1,
            bar,
            LARGE_SIZES,
            "ring, 1 producer, batches, BAR only, ack kernel",
        ),
        row(
            AckLanes,
            Batch,
            8,
            bar,
            EIGHT_LARGE_SIZES,
            "ring, 8 producers, batches, BAR only, ack kernel",
        ),
        row(
            AckLanes,
            Batch,
            1,
            engine,
            LARGE_SIZES,
            "ring, 1 producer, batches, copy engine only, ack kernel",
        ),
        row(
            AckLanes,
            Batch,
            8,
            engine,
            EIGHT_LARGE_SIZES,
            "ring, 8 producers, batches, copy engine only, ack kernel",
        ),
        row(
            AckLanes,
            Batch,
            8,
            large,
            ALL_SIZES,
            "ring, 8 producers, batches, copy engine from 4 KiB, ack kernel",
        ),
        row(
            Check,
            Batch,
            8,
            large,
            &[4096, 64 << 10],
            "ring, 8 producers, batches, copy engine from 4 KiB, checking kernel",
        ),
        row(
            AckLanes,
            Batch,
            8,
            split,
            LARGE_SIZES,
            "ring, 8 producers, batches, lanes split between BAR and copy engine, ack kernel",
        ),
        row(
            Check,
            Batch,
            8,
            split,
            &[1024, 2048],
            "ring, 8 producers, batches, lanes split between BAR and copy engine, checking kernel",
        ),
        row(
            AckLanes,
            Push,
            4,
            auto,
            ALL_SIZES,
            "ring, 4 producers, push per record, ack kernel",
        ),
        row(
            Ack,
            Shared,
            4,
            auto,
            &[64, 512, 4096],
            "ring, 4 threads sharing 1 lane, ack kernel",
        ),
        row(
            Check,
            Batch,
            1,
            auto,
            ALL_SIZES,
            "ring, 1 producer, batches, checking kernel",
        ),
        row(
            Check,
            Batch,
            4,
            auto,
            ALL_SIZES,
            "ring, 4 producers, batches, checking kernel",
        ),
        row(
            Check,
            Batch,
            8,
            auto,
            ALL_SIZES,
            "ring, 8 producers, batches, checking kernel",
        ),
        row(
            Check,
            Batch,
            8,
            bar,
            &[4096, 64 << 10],
            "ring, 8 producers, batches, BAR only, checking kernel",
        ),
        row(
            Check,
            Push,
            4,
            auto,
            &[64, 512, 4096],
            "ring, 4 producers, push per record, checking kernel",
        ),
        row(
            Check,
            Shared,
            4,
            auto,
            &[64, 512, 4096],
            "ring, 4 threads sharing 1 lane, checking kernel",
        ),
    ]
}

/// Fails the run if a row's records did not take the path it names (a copy-engine row whose
/// lanes could not make the path, or one whose records were never copied).
fn check_copy_engine(ring: &DeviceRing, row: &ThroughputRow, size: u64) -> BenchResult<()> {
    let stats = ring.copy_engine_stats();
    // Batches reach the pending bytes the copy engine waits for; lone pushes never do. A row's
    // producers claim every lane of its ring; which of them stage is the ring's choice.
    let copy = ring.copy_engine();
    let staged = row.how.batches()
        && (0..ring.lanes() as u32).any(|l| copy.threshold_for_lane(l).is_some_and(|t| size >= t));
    if staged && (stats.copies == 0 || stats.fallbacks > 0 || stats.unavailable.is_some()) {
        return Err(BenchError::Check(format!(
            "{} · {}: the copy-engine path did not carry the records: {stats:?}",
            row.name,
            fmt_size(size)
        )));
    }
    Ok(())
}

/// Runs the ring benchmark.
pub fn run(opts: &Options) -> BenchResult<Vec<Report>> {
    let gpu = open_gpu(OpenOptions::new())?;
    let module = Module::load_ptx(&gpu, PTX)?;
    let stream = Stream::new(&gpu)?;
    let copy_stream = Stream::new(&gpu)?;
    let _ctx = gpu.bind()?;
    let reps = if opts.quick { 3 } else { 7 };
    let bytes_per_run: u64 = if opts.quick { 256 << 20 } else { 1 << 30 };

    let mut bw = Report::new("ring-throughput", Unit::GigabytesPerSecond);
    let mut lat = Report::new("ring-latency", Unit::Nanoseconds);
    let rows = throughput_rows();
    let cells: usize = rows.iter().map(|r| r.sizes.len()).sum();
    ui::phase("throughput", cells as u64);
    for row in &rows {
        for &size in row.sizes {
            ui::step(format!("{} · {}", row.name, fmt_size(size)));
            // Per-record publication and the shared lane are slow for small records: fewer.
            let total = if row.how.batches() {
                bytes_per_run / size
            } else {
                (bytes_per_run / size).min(2_000_000)
            };
            let lanes = if row.how == Produce::Shared {
                1
            } else {
                row.producers as u32
            };
            let options = RingOptions {
                lanes,
                wrap: WrapMode::Padded,
                copy_engine: row.copy,
            };
            let lane_bytes = if lanes == 1 { RING_BYTES } else { LANE_BYTES };
            let mut samples = Vec::new();
            for _ in 0..reps {
                let ring = DeviceRing::with_options(&gpu, lane_bytes, options)?;
                launch_consumer(&module, &ring, &stream, row.consumer)?;
                let r = stream_records(
                    &ring,
                    size,
                    row.producers,
                    total / row.producers as u64,
                    row.how,
                );
                finish(&ring)?;
                samples.push(r?);
                check_copy_engine(&ring, row, size)?;
                if row.consumer == Consumer::Check {
                    for lane in 0..ring.lanes() {
                        let res = ring.results_of(lane);
                        if res[layout::RESULT_ERRORS] != 0 {
                            return Err(BenchError::Check(format!(
                                "checking kernel reported errors on lane {lane}: {res:?}"
                            )));
                        }
                    }
                }
            }
            bw.figures.push(Figure::measured(
                row.name,
                size,
                &Stats::of(&samples).expect("samples"),
            ));
        }
    }
    ui::phase("checking kernel alone", 2 * ALL_SIZES.len() as u64);
    for lanes in [1u32, 8] {
        for &size in ALL_SIZES {
            let name = if lanes == 1 {
                "checking kernel alone, 1 lane filled first"
            } else {
                "checking kernel alone, 8 lanes filled first"
            };
            ui::step(format!("{name} · {}", fmt_size(size)));
            let samples: Vec<f64> = (0..reps)
                .map(|_| consumer_alone(&gpu, &module, &stream, size, lanes))
                .collect::<BenchResult<_>>()?;
            bw.figures.push(Figure::measured(
                name,
                size,
                &Stats::of(&samples).expect("samples"),
            ));
        }
    }
    ui::phase("round trips", 3 + 2 * LONE_LARGE_SIZES.len() as u64);
    for (consumer, how, name) in [
        (Consumer::AckLanes, Lone::Push, rows::PUSH_ACK),
        (
            Consumer::Ack,
            Lone::Shared,
            "ring shared reserve/commit → ack kernel → CPU",
        ),
        (
            Consumer::Check,
            Lone::Push,
            "ring push → checking kernel → CPU",
        ),
    ] {
        ui::step(name);
        let ring = DeviceRing::new(&gpu, 1 << 20)?;
        launch_consumer(&module, &ring, &stream, consumer)?;
        let n = if opts.quick { 2_000 } else { 20_000 };
        let r = round_trips(&ring, 64, n, how);
        finish(&ring)?;
        let mut t = r?;
        t.drain(..n / 10);
        lat.figures
            .push(Figure::measured(name, 64, &Stats::of(&t).expect("samples")));
    }
    // A lone large record on a lane of an eight-lane ring of the default options, through the
    // BAR (the default: nothing pending before it) and staged.
    for size in LONE_LARGE_SIZES {
        for (how, name) in [
            (Lone::Push, rows::PUSH_ACK),
            (Lone::PushStaged, rows::PUSH_STAGED_ACK),
        ] {
            ui::step(format!("{name} · {}", fmt_size(size)));
            let options = RingOptions {
                lanes: 8,
                ..RingOptions::default()
            };
            let ring = DeviceRing::with_options(&gpu, LANE_BYTES, options)?;
            launch_consumer(&module, &ring, &stream, Consumer::AckLanes)?;
            let n = if opts.quick { 500 } else { 2_000 };
            let r = round_trips(&ring, size, n, how);
            finish(&ring)?;
            let mut t = r?;
            let copies = ring.copy_engine_stats().copies;
            let expected = if how == Lone::PushStaged { n as u64 } else { 0 };
            if copies != expected {
                return Err(BenchError::Check(format!(
                    "{name} · {}: {copies} copies for {n} records, {expected} expected",
                    fmt_size(size)
                )));
            }
            t.drain(..n / 10);
            lat.figures.push(Figure::measured(
                name,
                size,
                &Stats::of(&t).expect("samples"),
            ));
        }
    }

    let wrap = wrap_modes(&gpu, &module, &stream, reps, bytes_per_run)?;

    let dev = vkgdr::cuda_objects::DeviceBuffer::new(&gpu, COPY_BYTES as usize)?;
    let mut staging = HostPinned::new(&gpu, COPY_BYTES as usize)?;
    ui::phase(
        "cuMemcpyHtoDAsync",
        (SIZES.len() + 1 + LONE_LARGE_SIZES.len()) as u64 * 2,
    );
    for size in SIZES {
        for (batch, name) in [(1u64, rows::COPY_1), (BATCH_RECORDS, rows::COPY_256)] {
            ui::step(format!("{batch} per copy · {}", fmt_size(size)));
            let records = (bytes_per_run / size).min(if batch == 1 { 50_000 } else { u64::MAX });
            let records = records / batch * batch;
            let samples: Vec<f64> = (0..reps)
                .map(|_| {
                    memcpy_batches(
                        &gpu,
                        dev.device_ptr(),
                        size,
                        records,
                        batch,
                        &staging,
                        &copy_stream,
                    )
                })
                .collect::<BenchResult<_>>()?;
            bw.figures.push(Figure::measured(
                name,
                size,
                &Stats::of(&samples).expect("samples"),
            ));
        }
    }
    // The copy-engine lanes' own pattern with nothing else running: their ceiling.
    let streams: Vec<Stream> = (0..PATTERN_STREAMS)
        .map(|_| Stream::new(&gpu))
        .collect::<vkgdr::Result<_>>()?;
    let words = vkgdr::cuda_objects::DeviceBuffer::new(&gpu, 8 * PATTERN_STREAMS)?;
    let targets = PatternTargets {
        dst: dev.device_ptr(),
        staging: &staging,
        len: RING_BYTES,
        tails: words.device_ptr(),
    };
    ui::phase("copy-engine lane pattern", 2 * PATTERN_SIZES.len() as u64);
    for size in PATTERN_SIZES {
        for (tail, name) in [(false, PATTERN_COPIES), (true, PATTERN_TAIL)] {
            ui::step(format!("{name} · {}", fmt_size(size)));
            let samples: Vec<f64> = (0..reps)
                .map(|_| lane_pattern(&gpu, &targets, &streams, size, bytes_per_run / size, tail))
                .collect::<BenchResult<_>>()?;
            bw.figures.push(Figure::measured(
                name,
                size,
                &Stats::of(&samples).expect("samples"),
            ));
        }
    }
    // The host memory's wall: the same pattern with the producers' writes into the staging
    // buffer, each thread writing and queueing its own publications.
    ui::phase("staged copy pattern", PATTERN_SIZES.len() as u64);
    for size in PATTERN_SIZES {
        ui::step(format!("{} · {}", rows::PATTERN_STAGED, fmt_size(size)));
        let samples: Vec<f64> = (0..reps)
            .map(|_| staged_pattern(&gpu, &targets, &streams, size, bytes_per_run / size))
            .collect::<BenchResult<_>>()?;
        bw.figures.push(Figure::measured(
            rows::PATTERN_STAGED,
            size,
            &Stats::of(&samples).expect("samples"),
        ));
    }
    // The link's wall: what the BAR's stores and the copy engine carry when both run at once,
    // beside each alone (the copy pattern alone is the row above).
    let bar = BarStores::new(&gpu)?;
    ui::phase("BAR stores and copies at once", PATTERN_SIZES.len() as u64);
    for size in PATTERN_SIZES {
        ui::step(format!("{} · {}", rows::BOTH_PATHS, fmt_size(size)));
        let mut alone = Vec::with_capacity(reps);
        let mut beside = [Vec::with_capacity(reps), Vec::with_capacity(reps)];
        for _ in 0..reps {
            alone.push(bar.alone(bytes_per_run / 4));
            let (b, c) = both_paths(&gpu, &targets, &streams, &bar, size, bytes_per_run / size)?;
            beside[0].push(b);
            beside[1].push(c);
        }
        let total: Vec<f64> = beside[0]
            .iter()
            .zip(&beside[1])
            .map(|(b, c)| b + c)
            .collect();
        for (name, samples) in [
            (rows::BAR_ALONE, &alone),
            (rows::BAR_BESIDE_COPIES, &beside[0]),
            (rows::COPIES_BESIDE_BAR, &beside[1]),
            (rows::BOTH_PATHS, &total),
        ] {
            bw.figures.push(Figure::measured(
                name,
                size,
                &Stats::of(samples).expect("samples"),
            ));
        }
    }
    drop(bar);
    for (size, n) in [(64, 20_000)]
        .into_iter()
        .chain(LONE_LARGE_SIZES.map(|size| (size, 2_000)))
    {
        let n = if opts.quick { n / 4 } else { n };
        let record = vec![0x5au8; size as usize];
        for (from, name) in [
            (None, rows::COPY_SYNC),
            (Some(&record[..]), rows::MEMCPY_COPY_SYNC),
        ] {
            ui::step(format!("{name} · {}", fmt_size(size)));
            let dst = dev.device_ptr();
            let mut t = memcpy_latency(&gpu, dst, size, &mut staging, from, &copy_stream, n)?;
            t.drain(..n / 10);
            lat.figures.push(Figure::measured(
                name,
                size,
                &Stats::of(&t).expect("samples"),
            ));
        }
    }

    bw.notes.push(format!(
        "records include their 16-byte header; GB/s = record bytes delivered (every lane's head past them) per second; records/s = GB/s / size (64 B: 1 GB/s = 15.6 M records/s); one lane per producer ({} MiB each), the shared rows one lane of {} MiB",
        LANE_BYTES >> 20,
        RING_BYTES >> 20
    ));
    bw.notes.push(format!("batches: Producer::push_batch of {} KiB or {BATCH_RECORDS} records, whichever is more (at most {} MiB), one publication each; push per record: one publication per record; sharing 1 lane: reserve/write/commit through &DeviceRing (commit combining)", BATCH_BYTES >> 10, LANE_BYTES >> 22));
    bw.notes.push("ack kernel: publishes head = tail without reading the records (transport rate); checking kernel: ring_check_lanes, the device API's window reader (one block of 512 threads per lane) verifying every record's seq and checksum (layout::test_checksum: a 64-bit multiply-xorshift per 32-bit word of the body)".into());
    bw.notes.push(format!("checking kernel alone: each lane filled to {} MiB by its producer with no consumer running, the ring stopped, then ring_check_lanes launched; GB/s from the launch to the kernel's end (the consumer's own rate, without producers beside it)", (LANE_BYTES * 3 / 4) >> 20));
    bw.notes.push("cuMemcpyHtoDAsync: the same bytes from pinned memory into cuMemAlloc memory, back to back on one stream".into());
    bw.notes.push(format!("{PATTERN_COPIES} / {PATTERN_TAIL}: the copy-engine lanes' work without producers, the ceiling of the 'copy engine' rows: one copy per publication (the producers' batch of records, from pinned memory filled beforehand) on each of {PATTERN_STREAMS} streams in turn, and with the stream store a lane queues after each copy (its tail into GPU memory, behind a memory barrier); the producers' own writes into the staging copy are what the ring rows add"));
    bw.notes.push(format!("{}: the same work with those writes: each of {PATTERN_STREAMS} threads writes its publications into its own region of the pinned buffer (each record from its own buffer, as the ring rows' producers hold them; streaming stores, as a staging producer does), fences, queues the copy and the tail store on its own stream, and writes a slot again once an event behind the slot's last copy has completed; the ceiling of a ring whose producers stage, where the host's memory carries both the writes and the engine's reads", rows::PATTERN_STAGED));
    bw.notes.push(format!("copy engine: the plain rows take the default, CopyEngine::Auto, which on a ring of several lanes stages records of {split} KiB and more (header included) on lanes 0, 3 and 6 of each eight and of {auto} B and more on the others, once a batch has {pending} KiB pending before them ('1 producer' rows: a one-lane ring, every record through the BAR); 'BAR only' rows take the BAR on every lane; with RingOptions::copy_engine = FromRecord({record}) a producer's records of that size and more (header included), once a batch has {pending} KiB pending before them, are written into a pinned host copy of the lane and moved by cuMemcpyHtoDAsync on the lane's stream, which then stores the tail; 'copy engine only' rows stage records of every size (after the same {pending} KiB); 'lanes split' rows (CopyEngine::Split(16)) keep records below {split} KiB on the BAR in lanes 0, 3 and 6 and stage every record in the others; 'staged from the first record' rows take the default with Producer::set_stage_after(0) on every producer, so each batch's first large record is staged too (by default a batch's records before the first {pending} KiB take the BAR: a whole record when records are that large)", auto = vkgdr::ring::device::AUTO_COPY_ENGINE_RECORD, pending = vkgdr::ring::device::STAGE_AFTER_PENDING >> 10, record = vkgdr::ring::device::DEFAULT_COPY_ENGINE_RECORD, split = vkgdr::ring::device::SPLIT_BAR_LANE_RECORD >> 10));
    bw.notes.push(format!("the link rows (their column: the copy pattern's record size): {LINK_THREADS} threads store {} MiB at a time into a BAR mapping (the raw stores of copybw); alone, then while {PATTERN_TAIL} runs, each rate over its own interval; the total is their sum, to read beside the copy pattern alone: more than it means the two paths together pass either one, no more means the host-to-device link is the wall", LINK_STORE_BYTES >> 20));
    lat.notes.push("round trip of one record: published alone (Producer::push, or the shared reserve/commit) → kernel publishes head into pinned memory → CPU sees it; commit→seen is below this".into());
    lat.notes.push(format!("64 B: a one-lane ring of 1 MiB; {}: a lane of an eight-lane ring of the default options ({} MiB lanes), pushed through the BAR (by default a record is staged only once {} KiB are pending before it) or staged (Producer::set_stage_after(0)); cuMemcpyHtoDAsync + sync: the same size from pinned memory; memcpy into pinned memory + ...: the record copied there first from a buffer of the caller's, as a producer's push writes it", LONE_LARGE_SIZES.map(fmt_size).join(", "), LANE_BYTES >> 20, vkgdr::ring::device::STAGE_AFTER_PENDING >> 10));
    Ok(vec![bw, lat, wrap])
}

/// Padded and mirrored rings of [`WRAP_RING_BYTES`] side by side, ack kernel, 4 producers.
fn wrap_modes(
    gpu: &Gpu,
    module: &Module,
    stream: &Stream,
    reps: usize,
    bytes_per_run: u64,
) -> BenchResult<Report> {
    let mut report = Report::new("ring-wrap", Unit::GigabytesPerSecond);
    ui::phase("wrap", 2 * WRAP_SIZES.len() as u64);
    for (mode, name) in [
        (WrapMode::Padded, rows::PADDED),
        (WrapMode::Mirrored, rows::MIRRORED),
    ] {
        for size in WRAP_SIZES {
            ui::step(format!("{name} · {}", fmt_size(size)));
            let per_thread = (bytes_per_run / size / PRODUCERS as u64).max(16);
            let mut samples = Vec::new();
            for _ in 0..reps {
                let ring = match mode {
                    WrapMode::Padded => DeviceRing::new(gpu, WRAP_RING_BYTES)?,
                    WrapMode::Mirrored => match DeviceRing::new_mirrored(gpu, WRAP_RING_BYTES) {
                        Ok(r) => r,
                        Err(vkgdr::Error::Unsupported(why)) => {
                            report
                                .notes
                                .push(format!("mirrored ring not measured: {why}"));
                            return Ok(report);
                        }
                        Err(e) => return Err(e.into()),
                    },
                };
                launch_consumer(module, &ring, stream, Consumer::Ack)?;
                let r = stream_records(&ring, size, PRODUCERS, per_thread, Produce::Shared);
                finish(&ring)?;
                samples.push(r?);
            }
            report.figures.push(Figure::measured(
                name,
                size,
                &Stats::of(&samples).expect("samples"),
            ));
        }
    }
    report.notes.push(format!(
        "{PRODUCERS} producer threads, ring of {} MiB, ack kernel; sizes include the 16-byte header; GB/s = record bytes delivered per second",
        WRAP_RING_BYTES >> 20
    ));
    report.notes.push("a padded ring fits floor(capacity / size) records per lap and pads the rest; a mirrored ring (DeviceRing::new_mirrored, a CUDA VMM arena whose chunk is mapped twice) has no padding, so more records are in flight when they are a large share of the ring".into());
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_eight_producer_row_has_its_anchors_at_each_size() {
        let rows = throughput_rows();
        let eight: Vec<&ThroughputRow> = rows
            .iter()
            .filter(|r| r.producers == 8 && r.how.batches() && r.consumer == Consumer::AckLanes)
            .collect();
        assert!(eight.iter().any(|r| r.sizes.contains(&(1 << 20))));
        for row in eight {
            for size in row.sizes {
                // Batched DMA at every size; the two walls wherever the copy engine serves.
                assert!(SIZES.contains(size), "{} · {size}: no DMA row", row.name);
                if *size >= 2048 {
                    assert!(
                        PATTERN_SIZES.contains(size),
                        "{} · {size}: no walls",
                        row.name
                    );
                }
            }
        }
    }

    #[test]
    fn every_copy_and_publication_fits_its_buffers() {
        for size in SIZES {
            assert!(
                BATCH_RECORDS * size <= COPY_BYTES,
                "{BATCH_RECORDS} records of {size} B in one copy"
            );
            // A producer's batch is at most a quarter of its lane.
            assert!(batch_records(size) * size <= LANE_BYTES / 4, "{size}");
        }
        for size in PATTERN_SIZES {
            // The lane pattern's regions hold two publications each.
            let region = RING_BYTES / PATTERN_STREAMS as u64;
            assert!(2 * batch_records(size) * size <= region, "{size}");
        }
        for size in LONE_LARGE_SIZES {
            assert!(
                size + HEADER_LEN <= LANE_BYTES && size <= COPY_BYTES,
                "{size}"
            );
        }
    }
}
