//! `d2h`: records from a kernel to CPU consumer threads through a
//! [`DeviceToHostRing`](vkgdr::ring::DeviceToHostRing), beside the same bytes copied out of
//! device memory with batched `cuMemcpyDtoHAsync`; and a lone record's latency beside a kernel's
//! write seen through `cuStreamSynchronize` or an event poll.
//!
//! Throughput: a grid of two blocks of 256 threads per SM publishes records of 64 bytes (every
//! thread its own, `d2h_publish_each`: one reservation per warp) or of 4 KiB (a whole warp per
//! record, `d2h_publish_warp`) into 8 lanes, one CPU thread per lane draining them
//! ([`LaneConsumer::drain`](vkgdr::ring::core::d2h::LaneConsumer::drain): each record checked and
//! copied out). GB/s is slot bytes (header included) over the time from the launch to the last
//! record taken. The copy rows move the same bytes from device memory into `cuMemHostAlloc`
//! memory, 256 records per copy, on one stream.
//!
//! Latency: a resident kernel (`d2h_ping`) waits for a word the CPU stores through the BAR and
//! then publishes one record; the row is the CPU's store → the CPU sees the record (so the
//! host → device hop is inside it). Beside it, from the launch: a kernel that publishes one record
//! until the CPU sees it, and a kernel that writes one word until `cuStreamSynchronize` returns,
//! or until an event recorded after it reads complete.

use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use vkgdr::cuda_objects::{DeviceBuffer, Event, LaunchConfig, Module, PinnedBuffer, Stream};
use vkgdr::ring::core::d2h::{D2hDeviceView, LaneConsumer, LaneShape, Poll, SlotFormat, STATUS_OK};
use vkgdr::ring::{D2hLane, DeviceToHostRing};
use vkgdr::{Gpu, Mapping, OpenOptions};

use super::error::{BenchError, BenchResult};
use super::host_pinned::HostPinned;
use super::measure::open_gpu;
use super::options::Options;
use super::report::format::fmt_size;
use super::report::model::{Figure, Report, Unit};
use super::stats::{percentile, Stats};
use crate::ui;

/// The device → host test kernels (`kernels/ring_d2h.cu`).
const PTX: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../kernels/ring_d2h.ptx"
));
/// Lanes, and CPU consumer threads, of the throughput rows.
const LANES: [u32; 2] = [8, 16];
/// Blocks of 256 threads: two per SM of the largest GPUs we know (132 SMs).
const BLOCKS: u32 = 264;
const THREADS: u32 = 256;
/// Records per copy of the `cuMemcpyDtoHAsync` rows.
const COPY_RECORDS: u64 = 256;
/// A full lane's producers give up after this many looks at a head that does not move (seconds).
const SPIN_LIMIT: u32 = 20_000_000;

/// The rows the registry names.
pub mod rows {
    /// `d2h-throughput`: the ring, 8 lanes drained by 8 CPU threads.
    pub const RING_8: &str = "ring: kernel → 8 lanes → 8 CPU consumer threads";
    /// `d2h-throughput`: 16 lanes, 16 CPU threads.
    pub const RING_16: &str = "ring: kernel → 16 lanes → 16 CPU consumer threads";
    /// `d2h-throughput`: 16 lanes of tagged slots (half the payload per slot), 16 CPU threads.
    pub const RING_16_TAGGED: &str = "ring, tagged slots: kernel → 16 lanes → 16 CPU threads";
    /// `d2h-throughput`: the same bytes by `cuMemcpyDtoHAsync`, device → pinned host memory.
    pub const DTOH_256: &str = "cuMemcpyDtoHAsync device → pinned, 256 records per copy";
    /// `d2h-latency`: CPU store → resident kernel publishes one record → the CPU sees it.
    pub const PING: &str = "ring: CPU store → resident kernel publishes → CPU sees the record";
    /// `d2h-latency`: the same through a ring of tagged slots (no fence before the record
    /// counts).
    pub const PING_TAGGED: &str =
        "ring, tagged slots: CPU store → resident kernel publishes → CPU sees the record";
    /// `d2h-latency`: the same round trip with a plain word instead of a record: the machine's.
    pub const PONG_WORD: &str =
        "CPU store → resident kernel writes a word into pinned memory → CPU sees it";
    /// `d2h-latency`: launch of a kernel that publishes one record → the CPU sees it.
    pub const LAUNCH_LONE: &str = "ring: launch → lone record seen by a polling CPU";
    /// `d2h-latency`: launch of a kernel that writes one word → `cuStreamSynchronize` returns.
    pub const WRITE_SYNC: &str = "launch → kernel write → cuStreamSynchronize";
    /// `d2h-latency`: the same, waiting by polling an event recorded after the kernel.
    pub const WRITE_EVENT: &str = "launch → kernel write → event poll";
}

/// The lane shape of the throughput rows for `size`-byte slots: 1 MiB of 64-byte slots or
/// 2 MiB of 4 KiB ones per lane.
fn shape(size: u64, format: SlotFormat) -> BenchResult<LaneShape> {
    let slots = if size <= 64 { 16384 } else { 512 };
    Ok(LaneShape::new(slots, size as u32)
        .map_err(vkgdr::Error::from)?
        .with_format(format))
}

/// One throughput run: `records` records of `size`-byte slots of `format` from the kernel to
/// the consumer threads, each record as long as a slot carries (a multiple of 16 bytes for the
/// whole-warp records). Returns GB/s of slot bytes.
fn ring_rate(
    gpu: &Gpu,
    module: &Module,
    (size, format): (u64, SlotFormat),
    records: u64,
    lanes: u32,
) -> BenchResult<f64> {
    let shape = shape(size, format)?;
    // A quarter of a lane per head store: the producers refill the rest meanwhile.
    let batch = shape.slots() as usize / 4;
    let ring = DeviceToHostRing::new(gpu, lanes, shape, SPIN_LIMIT)?;
    let stream = Stream::new(gpu)?;
    let mut result = gpu.alloc(64)?;
    result.fill(0, 64, 0)?;
    let consumers = ring.consumers()?;
    let (kernel, per, len) = if size <= 64 {
        let per_thread = (records / u64::from(BLOCKS * THREADS)).max(1) as u32;
        ("d2h_produce_check", per_thread, shape.max_payload())
    } else {
        let per_warp = (records / u64::from(BLOCKS * THREADS / 32)).max(1) as u32;
        (
            "d2h_produce_warp_check",
            per_warp,
            shape.max_payload() / 16 * 16,
        )
    };
    let expected = if size <= 64 {
        u64::from(per) * u64::from(BLOCKS * THREADS)
    } else {
        u64::from(per) * u64::from(BLOCKS * THREADS / 32)
    };
    let t0 = Instant::now();
    let threads: Vec<_> = consumers
        .into_iter()
        .map(|mut c| {
            std::thread::spawn(move || -> BenchResult<(u64, Instant)> {
                let (mut taken, mut last) = (0u64, Instant::now());
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    let n = c.drain(batch, |_| {}).map_err(vkgdr::Error::from)?;
                    if n > 0 {
                        taken += n as u64;
                        last = Instant::now();
                        continue;
                    }
                    match c.poll().map_err(vkgdr::Error::from)? {
                        Poll::Record(_) => {
                            taken += 1;
                            last = Instant::now();
                        }
                        Poll::Pending if Instant::now() > deadline => {
                            return Err(BenchError::KernelStuck(
                                "device-to-host producers still running after 60 s".into(),
                            ))
                        }
                        Poll::Pending => std::hint::spin_loop(),
                        Poll::Ended => return Ok((taken, last)),
                    }
                }
            })
        })
        .collect();
    let f = module.function(kernel)?;
    let mut view = ring.device_view();
    let (mut per, mut len, mut res) = (per, len, result.device_ptr());
    // SAFETY: both kernels take (vkgdr_d2h_view by value, u32, u32, u64*); the ring and the result
    // memory are dropped only after the stream is synchronised below (and their drops never free
    // memory a queued kernel uses).
    unsafe {
        f.launch(
            LaunchConfig::linear(BLOCKS, THREADS),
            Some(&stream),
            &mut [
                (&mut view as *mut D2hDeviceView).cast(),
                (&mut per as *mut u32).cast(),
                (&mut len as *mut u32).cast(),
                (&mut res as *mut u64).cast(),
            ],
        )?
    };
    ring.finish_after(&stream)?;
    let mut taken = 0;
    let mut end = t0;
    let mut failure = None;
    for t in threads {
        match t.join().expect("consumer thread") {
            Ok((n, last)) => {
                taken += n;
                end = end.max(last);
            }
            Err(e) => {
                failure.get_or_insert(e);
            }
        }
    }
    if let Some(e) = failure {
        ring.close();
        return Err(e);
    }
    stream.synchronize()?;
    let mut refused = [0u64; 5];
    result.read_pod(0, &mut refused)?;
    if refused[0] != 0 || taken != expected {
        return Err(BenchError::Check(format!(
            "{} of {expected} records taken; refusals by status {refused:?} (OK = {STATUS_OK})",
            taken
        )));
    }
    Ok((taken * size) as f64 / (end - t0).as_secs_f64() / 1e9)
}

/// The same bytes as `records` records of `size` bytes copied from device memory into pinned
/// host memory, `COPY_RECORDS` records per `cuMemcpyDtoHAsync`. Returns GB/s.
fn dtoh_rate(
    gpu: &Gpu,
    src: &DeviceBuffer,
    dst: &HostPinned,
    stream: &Stream,
    size: u64,
    records: u64,
) -> BenchResult<f64> {
    let driver = gpu.driver();
    let bytes = size * COPY_RECORDS;
    let copies = (records / COPY_RECORDS).max(1);
    let cap = (dst.len().min(src.len()) as u64) / bytes * bytes;
    let t0 = Instant::now();
    let mut off = 0u64;
    for _ in 0..copies {
        if off + bytes > cap {
            off = 0;
        }
        // SAFETY: `off + bytes <= cap`, inside both buffers; both outlive the synchronisation
        // below, and nothing else touches `dst` meanwhile.
        unsafe {
            driver.cu_memcpy_dtoh_async(
                dst.as_ptr().add(off as usize).cast(),
                src.device_ptr() + off,
                bytes as usize,
                stream.raw(),
            )
        }?;
        off += bytes;
    }
    stream.synchronize()?;
    Ok((bytes * copies) as f64 / t0.elapsed().as_secs_f64() / 1e9)
}

/// Samples in nanoseconds, the first tenth (warm-up) left out.
fn ns(mut t: Vec<Duration>) -> Vec<f64> {
    t.drain(..t.len() / 10);
    t.into_iter().map(|d| d.as_nanos() as f64).collect()
}

/// `n` round trips: the CPU stores `i + 1` into a word of GPU memory, the resident `d2h_ping`
/// publishes record `i` into a lane of `format`, the CPU sees it.
fn ping(gpu: &Gpu, module: &Module, n: u32, format: SlotFormat) -> BenchResult<Vec<f64>> {
    let shape = LaneShape::new(64, 64)
        .map_err(vkgdr::Error::from)?
        .with_format(format);
    let ring = DeviceToHostRing::new(gpu, 1, shape, SPIN_LIMIT)?;
    let stream = Stream::new(gpu)?;
    let mut go = gpu.alloc(4096)?;
    go.fill(0, 64, 0)?;
    let mut result = gpu.alloc(64)?;
    result.fill(0, 64, 0)?;
    let mut consumer = ring.consumer(0)?;
    let f = module.function("d2h_ping")?;
    let (mut view, mut go_ptr, mut count, mut res) =
        (ring.device_view(), go.device_ptr(), n, result.device_ptr());
    // SAFETY: d2h_ping takes (vkgdr_d2h_view, const u64*, u32, u64*); `go`, `result` and the ring
    // outlive it: the stream is synchronised below, and on an early return the ring's drop closes
    // lane 0, which ends the kernel.
    unsafe {
        f.launch(
            LaunchConfig::linear(1, 32),
            Some(&stream),
            &mut [
                (&mut view as *mut D2hDeviceView).cast(),
                (&mut go_ptr as *mut u64).cast(),
                (&mut count as *mut u32).cast(),
                (&mut res as *mut u64).cast(),
            ],
        )?
    };
    let word = go.host_ptr().cast::<u64>();
    let mut t = Vec::with_capacity(n as usize);
    for i in 0..u64::from(n) {
        let start = Instant::now();
        // SAFETY: an aligned u64 of the live BAR mapping `go`, which only the kernel reads.
        unsafe { word.write_volatile(i + 1) };
        // Out of the write-combining buffer now (mfence drains it as sfence does).
        fence(Ordering::SeqCst);
        await_record(&mut consumer, i, start, "d2h_ping")?;
        t.push(start.elapsed());
    }
    stream.synchronize()?;
    Ok(ns(t))
}

/// Spins on `consumer` until record `i` arrives: another record first is a broken order, and
/// nothing within 10 s of `start` a stuck `kernel`.
fn await_record(
    consumer: &mut LaneConsumer<D2hLane>,
    i: u64,
    start: Instant,
    kernel: &str,
) -> BenchResult<()> {
    loop {
        match consumer.poll().map_err(vkgdr::Error::from)? {
            Poll::Record(r) if r.seq == i => return Ok(()),
            Poll::Record(r) => {
                return Err(BenchError::Check(format!(
                    "record {} where {i} was due",
                    r.seq
                )))
            }
            _ if start.elapsed() > Duration::from_secs(10) => {
                return Err(BenchError::KernelStuck(format!(
                    "{kernel}'s record {i} never came"
                )))
            }
            _ => std::hint::spin_loop(),
        }
    }
}

/// `n` round trips of a plain word: the CPU stores `i + 1` into GPU memory, the resident
/// `d2h_pong_word` writes `i + 1` into pinned host memory, the CPU sees it.
fn pong_word(gpu: &Gpu, module: &Module, n: u32) -> BenchResult<Vec<f64>> {
    let stream = Stream::new(gpu)?;
    let mut go = gpu.alloc(4096)?;
    go.fill(0, 64, 0)?;
    let out = PinnedBuffer::new(gpu, 4096)?;
    let f = module.function("d2h_pong_word")?;
    let (mut go_ptr, mut out_ptr, mut count) = (go.device_ptr(), out.device_ptr(), n);
    // SAFETY: d2h_pong_word takes (const u64*, u64*, u32); `go` and `out` outlive it: it ends
    // after `n` answers, or at once when `go` reads ~0 (stored below on an early end), and the
    // stream is synchronised before they drop.
    unsafe {
        f.launch(
            LaunchConfig::linear(1, 32),
            Some(&stream),
            &mut [
                (&mut go_ptr as *mut u64).cast(),
                (&mut out_ptr as *mut u64).cast(),
                (&mut count as *mut u32).cast(),
            ],
        )?
    };
    let word = go.host_ptr().cast::<u64>();
    let mut t = Vec::with_capacity(n as usize);
    let mut result = Ok(());
    'trips: for i in 0..u64::from(n) {
        let start = Instant::now();
        // SAFETY: an aligned u64 of the live BAR mapping `go`, which only the kernel reads.
        unsafe { word.write_volatile(i + 1) };
        fence(Ordering::SeqCst);
        loop {
            match out.load_u64(0) {
                Ok(v) if v == i + 1 => break,
                Ok(_) if start.elapsed() > Duration::from_secs(10) => {
                    result = Err(BenchError::KernelStuck(format!(
                        "d2h_pong_word's answer {i} never came"
                    )));
                    break 'trips;
                }
                Ok(_) => std::hint::spin_loop(),
                Err(e) => {
                    result = Err(e.into());
                    break 'trips;
                }
            }
        }
        t.push(start.elapsed());
    }
    if result.is_err() {
        // SAFETY: as above.
        unsafe { word.write_volatile(u64::MAX) };
        fence(Ordering::SeqCst);
    }
    stream.synchronize()?;
    result.map(|()| ns(t))
}

/// `n` launches of `d2h_lone`, each timed until the CPU sees its record.
fn launch_lone(gpu: &Gpu, module: &Module, n: u32) -> BenchResult<Vec<f64>> {
    let ring = DeviceToHostRing::new(
        gpu,
        1,
        LaneShape::new(64, 64).map_err(vkgdr::Error::from)?,
        SPIN_LIMIT,
    )?;
    let stream = Stream::new(gpu)?;
    let mut consumer = ring.consumer(0)?;
    let f = module.function("d2h_lone")?;
    let mut t = Vec::with_capacity(n as usize);
    for i in 0..u64::from(n) {
        let (mut view, mut value) = (ring.device_view(), i);
        let start = Instant::now();
        // SAFETY: d2h_lone takes (vkgdr_d2h_view, u64); the ring outlives it (synchronised below).
        unsafe {
            f.launch(
                LaunchConfig::linear(1, 32),
                Some(&stream),
                &mut [
                    (&mut view as *mut D2hDeviceView).cast(),
                    (&mut value as *mut u64).cast(),
                ],
            )?
        };
        await_record(&mut consumer, i, start, "d2h_lone")?;
        t.push(start.elapsed());
    }
    stream.synchronize()?;
    Ok(ns(t))
}

/// `n` launches of `d2h_write_word`, each timed until `cuStreamSynchronize` returns (`event`:
/// until an event recorded after it reads complete, polled).
fn launch_write(gpu: &Gpu, module: &Module, n: u32, event: bool) -> BenchResult<Vec<f64>> {
    let stream = Stream::new(gpu)?;
    let word = DeviceBuffer::new(gpu, 8)?;
    let done = Event::new(gpu)?;
    let f = module.function("d2h_write_word")?;
    let mut t = Vec::with_capacity(n as usize);
    for i in 0..u64::from(n) {
        let (mut dst, mut value) = (word.device_ptr(), i);
        let start = Instant::now();
        // SAFETY: d2h_write_word takes (u64*, u64); `word` outlives it (waited for below).
        unsafe {
            f.launch(
                LaunchConfig::linear(1, 32),
                Some(&stream),
                &mut [
                    (&mut dst as *mut u64).cast(),
                    (&mut value as *mut u64).cast(),
                ],
            )?
        };
        if event {
            done.record(&stream)?;
            while !done.is_complete()? {
                std::hint::spin_loop();
            }
        } else {
            stream.synchronize()?;
        }
        t.push(start.elapsed());
    }
    Ok(ns(t))
}

/// Runs the device → host benchmark.
pub fn run(opts: &Options) -> BenchResult<Vec<Report>> {
    let gpu = open_gpu(OpenOptions::new())?;
    let module = Module::load_ptx(&gpu, PTX)?;
    let reps = if opts.quick { 3 } else { 7 };
    let bytes_per_run: u64 = if opts.quick { 128 << 20 } else { 512 << 20 };

    let mut bw = Report::new("d2h-throughput", Unit::GigabytesPerSecond);
    let mut lat = Report::new("d2h-latency", Unit::Nanoseconds);
    let sizes = [64u64, 4096];
    let copy_stream = Stream::new(&gpu)?;
    let src = DeviceBuffer::new(&gpu, 64 << 20)?;
    let dst = HostPinned::new(&gpu, 64 << 20)?;
    ui::phase("throughput", 4 * sizes.len() as u64);
    let mut rates = Vec::new();
    let committed = SlotFormat::Committed;
    let ways = [
        (LANES[0], committed, rows::RING_8),
        (LANES[1], committed, rows::RING_16),
        (LANES[1], SlotFormat::Tagged, rows::RING_16_TAGGED),
    ];
    for size in sizes {
        let records = bytes_per_run / size;
        let mut ring = Vec::new();
        for (lanes, format, name) in ways {
            ui::step(format!("{name} · {}", fmt_size(size)));
            let samples: Vec<f64> = (0..reps)
                .map(|_| ring_rate(&gpu, &module, (size, format), records, lanes))
                .collect::<BenchResult<_>>()?;
            let stats = Stats::of(&samples).expect("samples");
            bw.figures.push(Figure::measured(name, size, &stats));
            if format == committed {
                ring.push((lanes, stats.median));
            }
        }
        ui::step(format!("{} · {}", rows::DTOH_256, fmt_size(size)));
        let copy: Vec<f64> = (0..reps)
            .map(|_| dtoh_rate(&gpu, &src, &dst, &copy_stream, size, records))
            .collect::<BenchResult<_>>()?;
        let copy = Stats::of(&copy).expect("samples");
        for (lanes, median) in ring {
            rates.push((size, lanes, median, copy.median));
        }
        bw.figures
            .push(Figure::measured(rows::DTOH_256, size, &copy));
    }
    bw.notes.push(format!(
        "GB/s = slot bytes (16-byte header included) per second; a tagged slot carries half the payload of a committed one (24 of 64 bytes, 2,032 of 4 KiB); records: a grid of {BLOCKS} blocks of {THREADS} threads publishes into 8 or 16 lanes (1 MiB of 64 B slots or 2 MiB of 4 KiB slots each), 64 B: each thread its own record (one reservation per warp), 4 KiB: a whole warp per record; one CPU thread per lane drains and checks them; from the launch to the last record taken"
    ));
    for (size, lanes, ring, copy) in rates {
        bw.notes.push(format!(
            "{}, {lanes} lanes: ring {:.1} M records/s ({:.2}x the batched copy's {:.1} M records/s)",
            fmt_size(size),
            ring * 1e3 / size as f64,
            ring / copy,
            copy * 1e3 / size as f64
        ));
    }
    bw.notes.push(
        "targets: 64 B >= 100 M records/s and >= 2x the batched copy; 4 KiB >= 0.9x the copy"
            .into(),
    );

    let n = if opts.quick { 2_000 } else { 20_000 };
    let launches = if opts.quick { 1_000 } else { 5_000 };
    ui::phase("latency", 6);
    let mut p99 = Vec::new();
    for (name, samples) in [
        (rows::PING, {
            ui::step(rows::PING);
            ping(&gpu, &module, n, SlotFormat::Committed)?
        }),
        (rows::PING_TAGGED, {
            ui::step(rows::PING_TAGGED);
            ping(&gpu, &module, n, SlotFormat::Tagged)?
        }),
        (rows::PONG_WORD, {
            ui::step(rows::PONG_WORD);
            pong_word(&gpu, &module, n)?
        }),
        (rows::LAUNCH_LONE, {
            ui::step(rows::LAUNCH_LONE);
            launch_lone(&gpu, &module, launches)?
        }),
        (rows::WRITE_SYNC, {
            ui::step(rows::WRITE_SYNC);
            launch_write(&gpu, &module, launches, false)?
        }),
        (rows::WRITE_EVENT, {
            ui::step(rows::WRITE_EVENT);
            launch_write(&gpu, &module, launches, true)?
        }),
    ] {
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        p99.push(format!("{name}: p99 {:.0} ns", percentile(&sorted, 0.99)));
        lat.figures.push(Figure::measured(
            name,
            8,
            &Stats::of(&samples).expect("samples"),
        ));
    }
    lat.notes.push("one 8-byte record (a 64-byte slot); the ring rows poll the lane with LaneConsumer::poll; the first tenth of each row's samples is left out (warm-up)".into());
    lat.notes.extend(p99);
    lat.notes.push("the resident rows are round trips: the CPU's store reaches the kernel first (the host → device hop), then the record or word comes back; the ring row's excess over the plain word's is what a record costs beyond the machine's own write back".into());
    lat.notes
        .push("target: a lone record seen within 1.5 µs (median) of its publication".into());
    Ok(vec![bw, lat])
}
