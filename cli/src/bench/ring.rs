//! `ring`: records streamed from 4 CPU producer threads into a ring in GPU memory, consumed by a
//! resident kernel, next to the same records sent with `cuMemcpyHtoDAsync` batches.
//!
//! Two consumers: `ring_ack` acknowledges whatever is published without reading it (the transport
//! rate into GPU memory), `ring_consume_persistent` walks and checks every record (a sequential
//! walk: its speed, not the ring's, limits small records). Latency is the round trip "commit a
//! record → the kernel publishes a head past it → the CPU sees that head", so commit→seen is at
//! most that.
//!
//! `ring-wrap` puts a padded and a mirrored ring of the same small size side by side with records
//! that are a large share of it: the padded ring wastes the bytes before the end on every lap,
//! the mirrored one lets records run over the end.

use std::ffi::c_void;
use std::time::{Duration, Instant};

use vkgdr::cuda_objects::{Event, Function, LaunchConfig, Module, PinnedBuffer, Stream};
use vkgdr::ring::layout::{self, seal_test_payload, WrapMode, HEADER_LEN};
use vkgdr::ring::DeviceRing;
use vkgdr::{Gpu, OpenOptions};

use super::{cu, open_gpu, BenchError, BenchResult, Options, Report, Row, Stats, Unit};

const PTX: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels/ring.ptx"));
const PRODUCERS: usize = 4;
const RING_BYTES: u64 = 64 << 20;
/// Record sizes including the 16-byte header.
const SIZES: [u64; 2] = [64, 4096];
/// The padded-versus-mirrored comparison: a ring of one VMM granule (2 MiB on the H100) and records
/// (header included) from small to most of it.
const WRAP_RING_BYTES: u64 = 2 << 20;
const WRAP_SIZES: [u64; 4] = [4096, 192 << 10, 768 << 10, 1536 << 10];

fn launch_consumer(
    f: &Function<'_>,
    ring: &DeviceRing,
    stream: &Stream,
    checking: bool,
) -> BenchResult<Event> {
    let v = ring.device_view();
    let (mut d, mut c, mut t, mut s, mut h, mut r) =
        (v.data, v.capacity, v.tail, v.stop, v.head, v.result);
    let mut full =
        [&mut d as *mut u64, &mut c, &mut t, &mut s, &mut h, &mut r].map(|p| p.cast::<c_void>());
    let mut ack = [&mut t as *mut u64, &mut s, &mut h].map(|p| p.cast::<c_void>());
    let params: &mut [*mut c_void] = if checking { &mut full } else { &mut ack };
    let threads = if checking { 256 } else { 1 };
    // SAFETY: ring_consume_persistent(u8*, u64, u64*, u32*, u64*, u64*) and ring_ack(u64*, u32*,
    // u64*) take 8-byte parameters matching `params`; the ring outlives the kernel (callers stop it
    // and wait for the returned event before dropping the ring).
    unsafe { f.launch(LaunchConfig::linear(1, threads), Some(stream), params)? };
    let done = Event::new(ring.gpu())?;
    done.record(stream)?;
    Ok(done)
}

fn finish(ring: &DeviceRing, done: &Event) -> BenchResult<()> {
    ring.stop();
    let t = Instant::now();
    while !done.is_complete()? {
        if t.elapsed() > Duration::from_secs(20) {
            // Never free memory under a running kernel.
            return Err(BenchError::KernelStuck("ring consumer did not stop".into()));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// Streams `per_thread` records of `size` bytes from each producer; returns GB/s of record bytes.
/// `seal`: fill in the test prefix (seq + checksum) the checking kernel verifies; the ack kernel
/// reads nothing, so the producers skip the checksum there (it costs ~1 ns per byte).
fn stream_records(
    ring: &DeviceRing,
    size: u64,
    producers: usize,
    per_thread: u64,
    seal: bool,
) -> BenchResult<f64> {
    let payload = (size - HEADER_LEN) as u32;
    let t0 = Instant::now();
    let failed = std::thread::scope(|s| {
        let hs: Vec<_> = (0..producers)
            .map(|_| {
                s.spawn(|| -> vkgdr::Result<()> {
                    let mut buf = vec![0x5au8; payload as usize];
                    for _ in 0..per_thread {
                        let mut r = ring.reserve(payload, Some(Duration::from_secs(10)))?;
                        if seal {
                            seal_test_payload(&mut buf, r.seq());
                        }
                        r.write(0, &buf)?;
                        r.commit();
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("producer"))
            .find_map(|r| r.err())
    });
    if let Some(e) = failed {
        return Err(e.into());
    }
    // Wait until the consumer has everything (so the time covers delivery, not just commits).
    let end = ring.core().committed();
    while ring.head() < end {
        std::hint::spin_loop();
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok((size * per_thread * producers as u64) as f64 / secs / 1e9)
}

fn round_trips(ring: &DeviceRing, size: u64, n: usize) -> BenchResult<Vec<f64>> {
    let payload = vec![0x11u8; (size - HEADER_LEN) as usize];
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        ring.push(&payload, Some(Duration::from_secs(10)))?;
        let end = ring.core().committed();
        while ring.head() < end {
            std::hint::spin_loop();
        }
        out.push(t.elapsed().as_nanos() as f64);
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
    staging: &PinnedBuffer,
    stream: &Stream,
) -> BenchResult<f64> {
    let driver = gpu.driver();
    let bytes = size * batch;
    let copies = records / batch;
    let cap = staging.len() as u64 / bytes * bytes;
    let t0 = Instant::now();
    let mut off = 0u64;
    for _ in 0..copies {
        if off + bytes > cap {
            off = 0;
        }
        // SAFETY: `dst` has RING_BYTES bytes and `off + bytes <= cap <= RING_BYTES`; the staging
        // buffer outlives the synchronisation below.
        let r = unsafe {
            (driver.cu_memcpy_htod_async)(
                dst + off,
                staging.as_ptr().add(off as usize).cast(),
                bytes as usize,
                stream.raw(),
            )
        };
        cu(gpu, "cuMemcpyHtoDAsync_v2", r)?;
        off += bytes;
    }
    stream.synchronize()?;
    Ok((bytes * copies) as f64 / t0.elapsed().as_secs_f64() / 1e9)
}

fn memcpy_latency(
    gpu: &Gpu,
    dst: u64,
    size: u64,
    staging: &PinnedBuffer,
    stream: &Stream,
    n: usize,
) -> BenchResult<Vec<f64>> {
    let driver = gpu.driver();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        // SAFETY: as in `memcpy_batches`.
        let r = unsafe {
            (driver.cu_memcpy_htod_async)(dst, staging.as_ptr().cast(), size as usize, stream.raw())
        };
        cu(gpu, "cuMemcpyHtoDAsync_v2", r)?;
        stream.synchronize()?;
        out.push(t.elapsed().as_nanos() as f64);
    }
    Ok(out)
}

/// Runs the ring benchmark.
pub fn run(opts: &Options) -> BenchResult<Vec<Report>> {
    let gpu = open_gpu(OpenOptions::new())?;
    let module = Module::load_ptx(&gpu, PTX)?;
    let ack = module.function("ring_ack")?;
    let checking = module.function("ring_consume_persistent")?;
    let stream = Stream::new(&gpu)?;
    let copy_stream = Stream::new(&gpu)?;
    let _ctx = gpu.bind()?;
    let reps = if opts.quick { 3 } else { 7 };
    let bytes_per_run: u64 = if opts.quick { 256 << 20 } else { 1 << 30 };

    let mut bw = Report::new("ring-throughput", Unit::GigabytesPerSecond);
    let mut lat = Report::new("ring-latency", Unit::Nanoseconds);
    // 1 and 8 producers next to the usual 4 show how much the shared reservation and publication
    // cost as producers are added.
    for (consumer, producers, name) in [
        (false, 1, "ring, 1 producer, ack kernel"),
        (false, PRODUCERS, "ring, 4 producers, ack kernel"),
        (false, 8, "ring, 8 producers, ack kernel"),
        (true, PRODUCERS, "ring, 4 producers, checking kernel"),
    ] {
        for size in SIZES {
            // The checking walker does ~1.3 M records/s: give it fewer records.
            let total = if consumer {
                (bytes_per_run / size).min(400_000)
            } else {
                bytes_per_run / size
            };
            let mut samples = Vec::new();
            for _ in 0..reps {
                let ring = DeviceRing::new(&gpu, RING_BYTES)?;
                let f = if consumer { &checking } else { &ack };
                let done = launch_consumer(f, &ring, &stream, consumer)?;
                let r = stream_records(&ring, size, producers, total / producers as u64, consumer);
                finish(&ring, &done)?;
                samples.push(r?);
                if consumer && ring.results()[layout::RESULT_ERRORS] != 0 {
                    return Err(BenchError::Check(format!(
                        "checking kernel reported errors: {:?}",
                        ring.results()
                    )));
                }
            }
            bw.rows.push(Row::measured(
                name,
                size,
                &Stats::of(&samples).expect("samples"),
            ));
        }
    }
    for (consumer, name) in [
        (false, "ring commit → ack kernel → CPU"),
        (true, "ring commit → checking kernel → CPU"),
    ] {
        let ring = DeviceRing::new(&gpu, 1 << 20)?;
        let f = if consumer { &checking } else { &ack };
        let done = launch_consumer(f, &ring, &stream, consumer)?;
        let n = if opts.quick { 2_000 } else { 20_000 };
        let r = round_trips(&ring, 64, n);
        finish(&ring, &done)?;
        let mut t = r?;
        t.drain(..n / 10);
        lat.rows
            .push(Row::measured(name, 64, &Stats::of(&t).expect("samples")));
    }

    let wrap = wrap_modes(&gpu, &ack, &stream, reps, bytes_per_run)?;

    let dev = vkgdr::cuda_objects::DeviceBuffer::new(&gpu, RING_BYTES as usize)?;
    let staging = PinnedBuffer::new(&gpu, RING_BYTES as usize)?;
    for size in SIZES {
        for batch in [1u64, 256] {
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
            bw.rows.push(Row::measured(
                format!("cuMemcpyHtoDAsync, {batch} per copy"),
                size,
                &Stats::of(&samples).expect("samples"),
            ));
        }
    }
    let n = if opts.quick { 2_000 } else { 20_000 };
    let mut t = memcpy_latency(&gpu, dev.device_ptr(), 64, &staging, &copy_stream, n)?;
    t.drain(..n / 10);
    lat.rows.push(Row::measured(
        "cuMemcpyHtoDAsync + sync",
        64,
        &Stats::of(&t).expect("samples"),
    ));

    bw.notes.push(format!(
        "records include their 16-byte header; producer threads reserve/write/commit; ring {} MiB; GB/s = record bytes delivered (head past them) per second",
        RING_BYTES >> 20
    ));
    bw.notes.push("ack kernel: publishes head = tail without reading the records (transport rate); checking kernel: walks and verifies every record (seq + checksum), one record at a time".into());
    bw.notes.push("cuMemcpyHtoDAsync: the same bytes from pinned memory into cuMemAlloc memory, back to back on one stream".into());
    lat.notes.push("round trip of one 64-byte record: push (reserve, write, commit) → kernel publishes head into pinned memory → CPU sees it; commit→seen is below this".into());
    Ok(vec![bw, lat, wrap])
}

/// Padded and mirrored rings of [`WRAP_RING_BYTES`] side by side, ack kernel, 4 producers.
fn wrap_modes(
    gpu: &Gpu,
    ack: &Function<'_>,
    stream: &Stream,
    reps: usize,
    bytes_per_run: u64,
) -> BenchResult<Report> {
    let mut report = Report::new("ring-wrap", Unit::GigabytesPerSecond);
    for (mode, name) in [
        (WrapMode::Padded, "padded ring (wrap PAD at the end)"),
        (
            WrapMode::Mirrored,
            "mirrored ring (records run over the end)",
        ),
    ] {
        for size in WRAP_SIZES {
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
                let done = launch_consumer(ack, &ring, stream, false)?;
                let r = stream_records(&ring, size, PRODUCERS, per_thread, false);
                finish(&ring, &done)?;
                samples.push(r?);
            }
            report.rows.push(Row::measured(
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
