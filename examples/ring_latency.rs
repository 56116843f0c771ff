//! A lone record's round trip through a [`DeviceRing`], idle and while other lanes stream.
//!
//! One thread pushes a 64-byte record (header included) on its own lane and waits until the
//! kernel's head passes it; then the next. Each kernel consumes all 8 lanes, one block per lane:
//! the ack kernel (`ring_ack_lanes`: head = tail, reading nothing), the loading ack kernel
//! (`ring_ack_load_lanes`: head = tail once the first record's header is read, the least any
//! consumer that looks at a record pays) and the checking kernel (`ring_check_lanes`: the device
//! API's `WindowReader`, every record's seq and checksum verified). Each runs with the other 7
//! lanes idle, then with 1, 3 and 7 producer threads streaming 4 KiB records into other lanes in
//! batches through the BAR, then with 7 streaming through the copy engine
//! (`CopyEngine::FromRecord(4096)`: the lone record stays on the BAR), then with the same 7 held to
//! 25 GB/s in all (each thread waits for its share of the rate before each batch: a heavy load that
//! leaves the link some room, where the row before takes all it can), then the same with every
//! streaming producer told `set_stage_after(0)` (each batch staged from its first record: nothing
//! of the streams through the BAR, where by default each batch's first 64 KiB is), then with 7
//! streaming on a ring of the default options (`CopyEngine::Auto`: the lone record's lane 0 and the
//! streams' lanes 3 and 6 on the BAR, the other five staging); the streams' measured rate is
//! printed beside the figures. Whether the lone record's tail grows with the load on the link, and
//! with which path carries it, says where its time goes. The first tenth of each row's round trips
//! is left out (warm-up).
//!
//! Prints, per row, the median, p99 and p99.9 in nanoseconds and the streams' GB/s; exits
//! non-zero if the checking kernel reports an error or misses a record, or a push fails.
//!
//! Run on a machine with an NVIDIA GPU: `cargo run --release --example ring_latency`
//! (`-- N` for N round trips per row, 20,000 by default).

use std::ffi::c_void;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use vkgdr::cuda_objects::{LaunchConfig, Module, Stream};
use vkgdr::ring::layout::{self, seal_test_payload, WrapMode};
use vkgdr::ring::{CopyEngine, DeviceRing, RingDeviceView, RingOptions};
use vkgdr::Gpu;

const PTX: &str = include_str!("../kernels/ring.ptx");
const LANES: u32 = 8;
const LANE_BYTES: u64 = 4 << 20;
const LONE_SIZE: usize = 64;
const STREAM_SIZE: usize = 4096;
const STREAM_BATCH: usize = 64;
const HEADER_LEN: usize = 16;
const LIMIT: Option<Duration> = Some(Duration::from_secs(10));
/// The streams' rate in all in the paced row (BENCHMARKS.md reports the lone record's tail at it).
const PACED_GB_PER_S: f64 = 25.0;

/// What the other lanes do while the lone record makes its round trips.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Load {
    Idle,
    /// This many producer threads stream through the BAR.
    Bar(u32),
    /// This many stream through the copy engine.
    CopyEngine(u32),
    /// This many stream through the copy engine, `PACED_GB_PER_S` in all.
    CopyEnginePaced(u32),
    /// The same, each producer staging its batches from their first record
    /// (`Producer::set_stage_after(0)`).
    CopyEngineStaged(u32),
    /// This many stream on a ring of the default options: some lanes through the BAR, the others
    /// through the copy engine.
    Default(u32),
}

impl Load {
    const ROWS: [Load; 8] = [
        Load::Idle,
        Load::Bar(1),
        Load::Bar(3),
        Load::Bar(LANES - 1),
        Load::CopyEngine(LANES - 1),
        Load::CopyEnginePaced(LANES - 1),
        Load::CopyEngineStaged(LANES - 1),
        Load::Default(LANES - 1),
    ];

    fn streams(self) -> u32 {
        match self {
            Load::Idle => 0,
            Load::Bar(n)
            | Load::CopyEngine(n)
            | Load::CopyEnginePaced(n)
            | Load::CopyEngineStaged(n)
            | Load::Default(n) => n,
        }
    }

    /// How long one streaming thread's batch takes at its share of the paced rate, if paced.
    fn batch_period(self) -> Option<Duration> {
        let (Load::CopyEnginePaced(n) | Load::CopyEngineStaged(n)) = self else {
            return None;
        };
        let per_thread = PACED_GB_PER_S * 1e9 / f64::from(n);
        Some(Duration::from_secs_f64(
            (STREAM_SIZE * STREAM_BATCH) as f64 / per_thread,
        ))
    }

    fn copy_engine(self) -> CopyEngine {
        match self {
            Load::CopyEngine(_) | Load::CopyEnginePaced(_) | Load::CopyEngineStaged(_) => {
                CopyEngine::FromRecord(STREAM_SIZE as u32)
            }
            Load::Default(_) => CopyEngine::default(),
            _ => CopyEngine::Off,
        }
    }

    fn describe(self, gb_per_s: f64) -> String {
        let paced = format!("the copy engine (paced to {PACED_GB_PER_S} GB/s in all)");
        let staged = format!(
            "the copy engine from each batch's first record (set_stage_after(0), paced to \
             {PACED_GB_PER_S} GB/s in all)"
        );
        let path = match self {
            Load::Idle => return "other lanes idle".to_string(),
            Load::Bar(_) => "the BAR",
            Load::CopyEngine(_) => "the copy engine",
            Load::CopyEnginePaced(_) => &paced,
            Load::CopyEngineStaged(_) => &staged,
            Load::Default(_) => "the default choice (2 lanes BAR, 5 copy engine)",
        };
        let n = self.streams();
        let lanes = if n == 1 { "lane" } else { "lanes" };
        format!(
            "{n} {lanes} streaming {STREAM_SIZE} B records through {path} at {gb_per_s:.1} GB/s"
        )
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kernel {
    Ack,
    AckLoad,
    Check,
}

impl Kernel {
    fn name(self) -> &'static str {
        match self {
            Kernel::Ack => "ack kernel",
            Kernel::AckLoad => "loading ack kernel",
            Kernel::Check => "checking kernel",
        }
    }
}

fn main() -> ExitCode {
    let n = match std::env::args().nth(1).map(|a| a.parse::<usize>()) {
        None => 20_000,
        Some(Ok(n)) if n >= 10 => n,
        Some(_) => {
            eprintln!("ring_latency: the argument is the round trips per row (at least 10)");
            return ExitCode::FAILURE;
        }
    };
    match run(n) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ring_latency: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(n: usize) -> Result<(), String> {
    let gpu = Gpu::open(0).map_err(|e| e.to_string())?;
    let module = Module::load_ptx(&gpu, PTX).map_err(|e| e.to_string())?;
    let stream = Stream::new(&gpu).map_err(|e| e.to_string())?;
    for kernel in [Kernel::Ack, Kernel::AckLoad, Kernel::Check] {
        for load in Load::ROWS {
            let row = one_row(&gpu, &module, &stream, kernel, load, n)?;
            println!("{row}");
        }
    }
    Ok(())
}

/// A payload the checking kernel accepts for record `seq` (its body fixed, sealed once).
struct Payload(Vec<u8>);

impl Payload {
    fn new(record: usize) -> Self {
        let mut buf = vec![0x5au8; record - HEADER_LEN];
        seal_test_payload(&mut buf, 0);
        Payload(buf)
    }

    fn stamped(&mut self, seq: u64) -> &[u8] {
        self.0[..8].copy_from_slice(&seq.to_le_bytes());
        &self.0
    }
}

fn launch(
    module: &Module,
    ring: &DeviceRing,
    stream: &Stream,
    kernel: Kernel,
) -> Result<(), String> {
    let mut view: RingDeviceView = ring.device_view();
    let mut params = [(&mut view as *mut RingDeviceView).cast::<c_void>()];
    let (name, threads) = match kernel {
        Kernel::Ack => ("ring_ack_lanes", 32),
        Kernel::AckLoad => ("ring_ack_load_lanes", 32),
        Kernel::Check => ("ring_check_lanes", layout::CHECK_THREADS),
    };
    let f = module.function(name).map_err(|e| e.to_string())?;
    // SAFETY: the three kernels take the 64-byte #[repr(C)] view by value; the ring is watched
    // right after, so it stops and waits for the kernel before its memory goes.
    unsafe {
        f.launch(
            LaunchConfig::linear(LANES, threads),
            Some(stream),
            &mut params,
        )
    }
    .map_err(|e| e.to_string())?;
    ring.watch_consumer(stream).map_err(|e| e.to_string())
}

/// One row: `n` lone round trips on one lane while the other lanes do what `load` says.
fn one_row(
    gpu: &Gpu,
    module: &Module,
    stream: &Stream,
    kernel: Kernel,
    load: Load,
    n: usize,
) -> Result<String, String> {
    let options = RingOptions {
        lanes: LANES,
        wrap: WrapMode::Padded,
        copy_engine: load.copy_engine(),
    };
    let ring = DeviceRing::with_options(gpu, LANE_BYTES, options).map_err(|e| e.to_string())?;
    launch(module, &ring, stream, kernel)?;
    let done = AtomicBool::new(false);
    let streamed = AtomicU64::new(0);
    let mut lone = ring.producer().map_err(|e| e.to_string())?;
    let lane = (0..ring.lanes())
        .find(|&i| ring.lane(i).is_some_and(|c| std::ptr::eq(c, lone.core())))
        .ok_or("the lone producer's lane is not among the ring's")?;
    let (result, secs) = std::thread::scope(|s| {
        let streamers: Vec<_> = (0..load.streams())
            .map(|_| {
                let (ring, done, streamed) = (&ring, &done, &streamed);
                s.spawn(move || -> Result<(), String> {
                    let mut p = ring.producer().map_err(|e| e.to_string())?;
                    if let Load::CopyEngineStaged(_) = load {
                        p.set_stage_after(0);
                    }
                    let mut bufs: Vec<Payload> = (0..STREAM_BATCH)
                        .map(|_| Payload::new(STREAM_SIZE))
                        .collect();
                    let period = load.batch_period();
                    let mut due = Instant::now();
                    while !done.load(Ordering::Relaxed) {
                        if let Some(period) = period {
                            // The next batch's turn; a thread that fell behind does not make up
                            // for more than one batch at once.
                            let now = Instant::now();
                            due = (due + period).max(now.checked_sub(period).unwrap_or(now));
                            while Instant::now() < due {
                                std::hint::spin_loop();
                            }
                        }
                        let first = p.next_seq();
                        for (i, b) in bufs.iter_mut().enumerate() {
                            b.stamped(first + i as u64);
                        }
                        p.push_batch(bufs.iter().map(|b| b.0.as_slice()), LIMIT)
                            .map_err(|e| e.to_string())?;
                        streamed.fetch_add((STREAM_SIZE * STREAM_BATCH) as u64, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        // The streams run a moment before the first round trip.
        if load != Load::Idle {
            std::thread::sleep(Duration::from_millis(100));
        }
        let bytes0 = streamed.load(Ordering::Relaxed);
        let t0 = Instant::now();
        let mut payload = Payload::new(LONE_SIZE);
        let mut samples = Vec::with_capacity(n);
        let mut failed = None;
        for _ in 0..n {
            let t = Instant::now();
            let seq = lone.next_seq();
            if let Err(e) = lone.push(payload.stamped(seq), LIMIT) {
                failed = Some(e.to_string());
                break;
            }
            let end = lone.core().committed();
            while ring.head_of(lane) < end {
                if t.elapsed() > LIMIT.unwrap() {
                    failed = Some(format!("the kernel's head stayed below {end} for 10 s"));
                    break;
                }
                std::hint::spin_loop();
            }
            if failed.is_some() {
                break;
            }
            samples.push(t.elapsed().as_nanos() as f64);
        }
        let secs = t0.elapsed().as_secs_f64();
        let bytes = streamed.load(Ordering::Relaxed) - bytes0;
        done.store(true, Ordering::Relaxed);
        let mut result = failed.map_or(Ok(samples), Err);
        for h in streamers {
            if let Err(e) = h.join().expect("streaming thread") {
                result = result.and(Err(e));
            }
        }
        (result.map(|s| (s, bytes)), secs)
    });
    let streamed = streamed.into_inner();
    let lone_records = lone.next_seq();
    drop(lone);
    ring.stop_and_wait(Duration::from_secs(20))
        .map_err(|e| format!("the {} did not stop: {e}", kernel.name()))?;
    let (mut samples, bytes) = result?;
    if kernel == Kernel::Check {
        for i in 0..ring.lanes() {
            let res = ring.results_of(i);
            if res[layout::RESULT_ERRORS] != 0 {
                return Err(format!("checking kernel: errors on lane {i}: {res:?}"));
            }
            if i == lane && res[layout::RESULT_RECORDS] != lone_records {
                return Err(format!(
                    "checking kernel: {lone_records} records pushed on lane {i}, {res:?}"
                ));
            }
        }
    }
    samples.drain(..samples.len() / 10);
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    if let Load::CopyEngine(_)
    | Load::CopyEnginePaced(_)
    | Load::CopyEngineStaged(_)
    | Load::Default(_) = load
    {
        let stats = ring.copy_engine_stats();
        if stats.copies == 0 {
            return Err(format!("the copy engine carried nothing: {stats:?}"));
        }
        let own = ring.lane_copy_engine_stats(lane).unwrap_or_default();
        if own.copies != 0 {
            return Err(format!("the lone record's lane {lane} staged: {own:?}"));
        }
        // Told to stage from the first record, the streams wrote nothing through the BAR.
        if matches!(load, Load::CopyEngineStaged(_)) && stats.bytes != streamed {
            return Err(format!(
                "{streamed} bytes streamed, {} of them staged: {stats:?}",
                stats.bytes
            ));
        }
    }
    let load = load.describe(bytes as f64 / secs / 1e9);
    Ok(format!(
        "lone {LONE_SIZE} B record round trip, {}, {load}: median {:.0} ns, p99 {:.0} ns, \
         p99.9 {:.0} ns ({} round trips)",
        kernel.name(),
        at(0.5),
        at(0.99),
        at(0.999),
        samples.len()
    ))
}
