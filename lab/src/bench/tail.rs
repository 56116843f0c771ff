//! `tail`: a lone record's round trip while the ring's other lanes stream: its median, p99 and
//! p99.9 through three kernels, with the other lanes idle and beside seven loads.
//!
//! One thread pushes a 64-byte record (header included) on its own lane of an eight-lane ring
//! and waits until the kernel's head passes it, then pushes the next. Three kernels consume
//! every lane, one block per lane ([`Kernel`]): the ack kernel (`ring_ack_lanes`: head = tail,
//! reading nothing), the loading ack kernel (`ring_ack_load_lanes`: head = tail once the first
//! record's header is read, the least a consumer that looks at a record pays) and the checking
//! kernel (`ring_check_lanes`: the device API's `WindowReader`, every record's seq and checksum
//! verified). Each runs with the other seven lanes idle and beside each [`Load`]: 1, 3 and 7
//! producer threads streaming 4 KiB records in batches of 64 through the BAR; 7 through the copy
//! engine (`CopyEngine::FromRecord(4096)`: the lone record stays on the BAR); the same 7 held to
//! 25 GB/s in all (a heavy load that leaves the link some room, where the row before takes all
//! it can); the same with every streaming producer told `set_stage_after(0)` (each batch staged
//! from its first record: nothing of the streams through the BAR); and 7 on a ring of the
//! default options (`CopyEngine::Auto`).
//!
//! A row is one ring with its kernel and its streams: the streams run a moment, a tenth of a
//! window of round trips warms up (left out), then the round trips run in windows. Each window
//! gives its median, p99 and p99.9, and the streams' rate over it; a report's figure is the
//! median over the windows, with their p10 and p90 (how far the statistic moves from window to
//! window). Each loaded row is anchored to its kernel's idle row: the ratio is what the load
//! adds.
//!
//! What the rows check, failing the benchmark otherwise: every push and every round trip ends
//! within 10 s and no streaming producer fails; the checking kernel reports no error on any lane
//! and every lone record on its lane; where the copy engine serves the streams it carried some
//! of their bytes and nothing of the lone record's lane; told to stage from a batch's first
//! record, the streams sent every byte through it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use vkgdr::cuda_objects::{Module, Stream};
use vkgdr::ring::core::{Producer, RingSink};
use vkgdr::ring::layout::{self, WrapMode};
use vkgdr::ring::{CopyEngine, DeviceRing, RingOptions};
use vkgdr::{Gpu, OpenOptions};

use super::error::{BenchError, BenchResult};
use super::measure::{open_gpu, percentile, Stats};
use super::options::Options;
use super::report::model::{Figure, Report, Unit};
use super::ring::{
    finish, lane_of, launch_consumer, wait_for_head, Consumer, Payload, PTX, ROUND_TRIP_LIMIT,
};
use crate::ui;

/// Lanes of the ring: the lone record's and seven to stream on.
const LANES: u32 = 8;
/// Bytes of each lane.
const LANE_BYTES: u64 = 4 << 20;
/// The lone record, header included.
const LONE_SIZE: u64 = 64;
/// Each streamed record, header included.
const STREAM_SIZE: u64 = 4096;
/// Records per streamed batch (one `push_batch`).
const STREAM_BATCH: usize = 64;
/// The streams' rate in all in the paced rows.
const PACED_GB_PER_S: f64 = 25.0;
/// The longest a push or a round trip may take before the row fails.
const LIMIT: Duration = ROUND_TRIP_LIMIT;
/// How long the streams run before the first round trip.
const STREAMS_LEAD: Duration = Duration::from_millis(100);

/// The rows the registry names: each kernel's idle row (the anchor of its loaded rows) and the
/// start every row of a kernel shares.
pub mod rows {
    /// The ack kernel's rows start so.
    pub const ACK: &str = "ack kernel, ";
    /// The loading ack kernel's rows start so.
    pub const LOADING_ACK: &str = "loading ack kernel, ";
    /// The checking kernel's rows start so.
    pub const CHECKING: &str = "checking kernel, ";
    /// The ack kernel with the other lanes idle.
    pub const ACK_IDLE: &str = "ack kernel, other lanes idle";
    /// The loading ack kernel with the other lanes idle.
    pub const LOADING_ACK_IDLE: &str = "loading ack kernel, other lanes idle";
    /// The checking kernel with the other lanes idle.
    pub const CHECKING_IDLE: &str = "checking kernel, other lanes idle";
}

/// The kernel that consumes every lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// `ring_ack_lanes`: head = tail, reading nothing.
    Ack,
    /// `ring_ack_load_lanes`: head = tail once the first record's header is read.
    LoadingAck,
    /// `ring_check_lanes`: the device API's window reader, every record verified.
    Checking,
}

impl Kernel {
    /// Every kernel, in the order the rows run.
    pub const ALL: [Kernel; 3] = [Kernel::Ack, Kernel::LoadingAck, Kernel::Checking];

    /// The start of its rows' names.
    fn rows(self) -> &'static str {
        match self {
            Kernel::Ack => rows::ACK,
            Kernel::LoadingAck => rows::LOADING_ACK,
            Kernel::Checking => rows::CHECKING,
        }
    }

    fn consumer(self) -> Consumer {
        match self {
            Kernel::Ack => Consumer::AckLanes,
            Kernel::LoadingAck => Consumer::AckLoadLanes,
            Kernel::Checking => Consumer::Check,
        }
    }
}

/// What the other lanes do while the lone record makes its round trips.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// Nothing.
    Idle,
    /// This many producer threads stream through the BAR.
    Bar(u32),
    /// This many stream through the copy engine.
    CopyEngine(u32),
    /// This many stream through the copy engine, [`PACED_GB_PER_S`] in all.
    CopyEnginePaced(u32),
    /// The same, each producer staging its batches from their first record
    /// (`Producer::set_stage_after(0)`).
    CopyEngineStaged(u32),
    /// This many stream on a ring of the default options: some lanes through the BAR, the
    /// others through the copy engine.
    Default(u32),
}

impl Load {
    /// Every load, in the order the rows run.
    pub const ALL: [Load; 8] = [
        Load::Idle,
        Load::Bar(1),
        Load::Bar(3),
        Load::Bar(LANES - 1),
        Load::CopyEngine(LANES - 1),
        Load::CopyEnginePaced(LANES - 1),
        Load::CopyEngineStaged(LANES - 1),
        Load::Default(LANES - 1),
    ];

    /// How many lanes stream.
    pub fn streams(self) -> u32 {
        match self {
            Load::Idle => 0,
            Load::Bar(n)
            | Load::CopyEngine(n)
            | Load::CopyEnginePaced(n)
            | Load::CopyEngineStaged(n)
            | Load::Default(n) => n,
        }
    }

    /// Whether the streams are held to [`PACED_GB_PER_S`].
    fn paced(self) -> bool {
        matches!(self, Load::CopyEnginePaced(_) | Load::CopyEngineStaged(_))
    }

    /// How long one streaming thread's batch takes at its share of the paced rate, if paced.
    fn batch_period(self) -> Option<Duration> {
        self.paced().then(|| {
            let per_thread = PACED_GB_PER_S * 1e9 / f64::from(self.streams());
            Duration::from_secs_f64((STREAM_SIZE * STREAM_BATCH as u64) as f64 / per_thread)
        })
    }

    fn copy_engine(self) -> CopyEngine {
        match self {
            Load::Idle | Load::Bar(_) => CopyEngine::Off,
            Load::CopyEngine(_) | Load::CopyEnginePaced(_) | Load::CopyEngineStaged(_) => {
                CopyEngine::FromRecord(STREAM_SIZE as u32)
            }
            Load::Default(_) => CopyEngine::default(),
        }
    }

    /// Its part of a row's name.
    pub fn name(self) -> String {
        let n = self.streams();
        let lanes = if n == 1 { "lane" } else { "lanes" };
        match self {
            Load::Idle => "other lanes idle".to_string(),
            Load::Bar(_) => format!("{n} {lanes} streaming through the BAR"),
            Load::CopyEngine(_) => format!("{n} {lanes} streaming through the copy engine"),
            Load::CopyEnginePaced(_) => {
                format!("{n} {lanes} through the copy engine, {PACED_GB_PER_S} GB/s in all")
            }
            Load::CopyEngineStaged(_) => format!(
                "{n} {lanes} through the copy engine, {PACED_GB_PER_S} GB/s in all, staged from \
                 each batch's first record"
            ),
            Load::Default(_) => format!("{n} {lanes} streaming on the default options"),
        }
    }
}

/// The name of `kernel`'s row beside `load`.
pub fn row_name(kernel: Kernel, load: Load) -> String {
    format!("{}{}", kernel.rows(), load.name())
}

/// How many round trips a row makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Plan {
    /// Windows of round trips, each giving one sample of each statistic.
    windows: usize,
    /// Round trips per window (a tenth of it warms up first).
    per_window: usize,
}

/// What one window of round trips gave.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    /// Median round trip, nanoseconds.
    pub median: f64,
    /// 99th percentile, nanoseconds.
    pub p99: f64,
    /// 99.9th percentile, nanoseconds.
    pub p999: f64,
    /// What the other lanes streamed meanwhile, GB/s.
    pub streams: f64,
}

impl Window {
    /// The window of round trips `samples` (nanoseconds, not empty; sorted here) while the
    /// streams carried `streams` GB/s.
    pub fn of(samples: &mut [f64], streams: f64) -> Window {
        samples.sort_by(f64::total_cmp);
        Window {
            median: percentile(samples, 0.5),
            p99: percentile(samples, 0.99),
            p999: percentile(samples, 0.999),
            streams,
        }
    }
}

/// One statistic's figure over a row's windows, of records of `size` bytes.
fn figure(method: &str, size: u64, windows: &[Window], stat: impl Fn(&Window) -> f64) -> Figure {
    let values: Vec<f64> = windows.iter().map(stat).collect();
    Figure::measured(method, size, &Stats::of(&values).expect("windows"))
}

/// The reports the benchmark writes, in order: `tail-median`, `tail-p99`, `tail-p999` (ns) and
/// `tail-streams` (GB/s).
pub const REPORTS: [&str; 4] = ["tail-median", "tail-p99", "tail-p999", "tail-streams"];

/// Runs every kernel beside every load.
pub fn run(opts: &Options) -> BenchResult<Vec<Report>> {
    let gpu = open_gpu(OpenOptions::new())?;
    let module = Module::load_ptx(&gpu, PTX)?;
    let stream = Stream::new(&gpu)?;
    let _ctx = gpu.bind()?;
    let plan = if opts.quick {
        Plan {
            windows: 3,
            per_window: 4_000,
        }
    } else {
        Plan {
            windows: 7,
            per_window: 20_000,
        }
    };
    let [mut median, mut p99, mut p999] =
        [REPORTS[0], REPORTS[1], REPORTS[2]].map(|name| Report::new(name, Unit::Nanoseconds));
    let mut streams = Report::new(REPORTS[3], Unit::GigabytesPerSecond);
    let mut short = Vec::new();
    ui::phase(
        "a lone record beside streaming lanes",
        (Kernel::ALL.len() * Load::ALL.len()) as u64,
    );
    for kernel in Kernel::ALL {
        for load in Load::ALL {
            let name = row_name(kernel, load);
            ui::step(name.clone());
            let windows = one_row(&gpu, &module, &stream, kernel, load, plan)?;
            median
                .figures
                .push(figure(&name, LONE_SIZE, &windows, |w| w.median));
            p99.figures
                .push(figure(&name, LONE_SIZE, &windows, |w| w.p99));
            p999.figures
                .push(figure(&name, LONE_SIZE, &windows, |w| w.p999));
            if load != Load::Idle {
                let rate = figure(&name, STREAM_SIZE, &windows, |w| w.streams);
                if load.paced() && rate.median < 0.9 * PACED_GB_PER_S {
                    short.push(format!("{name}: {:.1} GB/s", rate.median));
                }
                streams.figures.push(rate);
            }
        }
    }
    let how = format!(
        "a {LONE_SIZE}-byte record pushed alone on lane 0 of a ring of {LANES} lanes of {} MiB, \
         the CPU waiting until the kernel's head passes it; the streams push {STREAM_SIZE}-byte \
         records in batches of {STREAM_BATCH} on the other lanes; each row runs {} windows of {} \
         round trips (after {} of warm-up), the figure is the median over the windows of the \
         window's statistic, p10 and p90 over the windows too",
        LANE_BYTES >> 20,
        plan.windows,
        plan.per_window,
        plan.per_window / 10
    );
    for r in [&mut median, &mut p99, &mut p999] {
        r.notes.push(how.clone());
        r.notes.push(
            "kernels: the ack kernel (ring_ack_lanes) stores head = tail and reads nothing; the \
             loading ack kernel (ring_ack_load_lanes) reads the record's header first; the \
             checking kernel (ring_check_lanes, the device API's WindowReader) verifies every \
             record's seq and checksum; each loaded row is compared with its kernel's idle row"
                .into(),
        );
    }
    streams.notes.push(format!(
        "the other lanes' rate during the lone record's round trips (bytes of their \
         {STREAM_SIZE}-byte records pushed per second, median over the windows)"
    ));
    if !short.is_empty() {
        streams.notes.push(format!(
            "paced rows below 90 % of {PACED_GB_PER_S} GB/s (the link or the producers could not \
             carry more here): {}",
            short.join("; ")
        ));
    }
    Ok(vec![median, p99, p999, streams])
}

/// One row: `plan`'s round trips of a lone record on one lane while the other lanes do what
/// `load` says, consumed by `kernel`; the row's checks (module docs).
fn one_row(
    gpu: &Gpu,
    module: &Module,
    stream: &Stream,
    kernel: Kernel,
    load: Load,
    plan: Plan,
) -> BenchResult<Vec<Window>> {
    let options = RingOptions {
        lanes: LANES,
        wrap: WrapMode::Padded,
        copy_engine: load.copy_engine(),
    };
    let ring = DeviceRing::with_options(gpu, LANE_BYTES, options)?;
    launch_consumer(module, &ring, stream, kernel.consumer())?;
    let done = AtomicBool::new(false);
    let streamed = AtomicU64::new(0);
    let mut lone = ring.producer()?;
    let lane = lane_of(&ring, &lone)?;
    let windows = std::thread::scope(|s| {
        let streamers: Vec<_> = (0..load.streams())
            .map(|_| s.spawn(|| stream_batches(&ring, load, &done, &streamed)))
            .collect();
        if load != Load::Idle {
            std::thread::sleep(STREAMS_LEAD);
        }
        let mut windows = lone_windows(&ring, &mut lone, lane, &streamed, plan);
        done.store(true, Ordering::Relaxed);
        for h in streamers {
            let joined = h
                .join()
                .unwrap_or_else(|_| Err(BenchError::Check("a streaming thread panicked".into())));
            windows = windows.and_then(|w| joined.map(|()| w));
        }
        windows
    });
    let lone_records = lone.next_seq();
    drop(lone);
    finish(&ring)?;
    let windows = windows?;
    if kernel == Kernel::Checking {
        for i in 0..ring.lanes() {
            let res = ring.results_of(i);
            if res[layout::RESULT_ERRORS] != 0 {
                return Err(BenchError::Check(format!(
                    "checking kernel: errors on lane {i}: {res:?}"
                )));
            }
            if i == lane && res[layout::RESULT_RECORDS] != lone_records {
                return Err(BenchError::Check(format!(
                    "checking kernel: {lone_records} lone records pushed on lane {i}, {res:?}"
                )));
            }
        }
    }
    if load.copy_engine() != CopyEngine::Off {
        let stats = ring.copy_engine_stats();
        if stats.copies == 0 {
            return Err(BenchError::Check(format!(
                "{}: the copy engine carried nothing: {stats:?}",
                load.name()
            )));
        }
        let own = ring.lane_copy_engine_stats(lane).unwrap_or_default();
        if own.copies != 0 {
            return Err(BenchError::Check(format!(
                "the lone record's lane {lane} staged: {own:?}"
            )));
        }
        // Told to stage from the first record, the streams wrote nothing through the BAR.
        let streamed = streamed.into_inner();
        if matches!(load, Load::CopyEngineStaged(_)) && stats.bytes != streamed {
            return Err(BenchError::Check(format!(
                "{streamed} bytes streamed, {} of them staged: {stats:?}",
                stats.bytes
            )));
        }
    }
    Ok(windows)
}

/// One streaming producer: batches of [`STREAM_BATCH`] records on its own lane until `done`,
/// each batch's bytes added to `streamed` once pushed; paced when the load says so.
fn stream_batches(
    ring: &DeviceRing,
    load: Load,
    done: &AtomicBool,
    streamed: &AtomicU64,
) -> BenchResult<()> {
    let mut p = ring.producer()?;
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
            // The next batch's turn; a thread that fell behind makes up for one batch at most.
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
        p.push_batch(bufs.iter().map(Payload::bytes), Some(LIMIT))
            .map_err(vkgdr::Error::from)?;
        streamed.fetch_add(STREAM_SIZE * STREAM_BATCH as u64, Ordering::Relaxed);
    }
    Ok(())
}

/// The lone record's round trips on `lane`: a tenth of a window to warm up, then `plan`'s
/// windows, each with the streams' rate over it (from `streamed`).
fn lone_windows<S: RingSink>(
    ring: &DeviceRing,
    lone: &mut Producer<'_, S>,
    lane: usize,
    streamed: &AtomicU64,
    plan: Plan,
) -> BenchResult<Vec<Window>> {
    let mut payload = Payload::new(LONE_SIZE);
    let mut round_trip = || -> BenchResult<f64> {
        let t = Instant::now();
        let seq = lone.next_seq();
        lone.push(payload.stamped(seq), Some(LIMIT))
            .map_err(vkgdr::Error::from)?;
        wait_for_head(ring, lane, lone.core().committed(), t)
    };
    for _ in 0..plan.per_window / 10 {
        round_trip()?;
    }
    let mut windows = Vec::with_capacity(plan.windows);
    let mut samples = Vec::with_capacity(plan.per_window);
    for _ in 0..plan.windows {
        samples.clear();
        let (bytes0, t0) = (streamed.load(Ordering::Relaxed), Instant::now());
        for _ in 0..plan.per_window {
            samples.push(round_trip()?);
        }
        let bytes = streamed.load(Ordering::Relaxed) - bytes0;
        let rate = bytes as f64 / t0.elapsed().as_secs_f64() / 1e9;
        windows.push(Window::of(&mut samples, rate));
    }
    Ok(windows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kernels_idle_row_is_the_registrys_and_every_row_has_its_start() {
        let idle = [rows::ACK_IDLE, rows::LOADING_ACK_IDLE, rows::CHECKING_IDLE];
        for (kernel, idle) in Kernel::ALL.into_iter().zip(idle) {
            assert_eq!(row_name(kernel, Load::Idle), idle);
            for load in Load::ALL {
                let name = row_name(kernel, load);
                assert!(name.starts_with(kernel.rows()), "{name}");
                // No other kernel's rows start so: the anchor of each row is its own kernel's.
                for other in Kernel::ALL.into_iter().filter(|&k| k != kernel) {
                    assert!(!name.starts_with(other.rows()), "{name}");
                }
            }
        }
        let mut names: Vec<String> = Kernel::ALL
            .into_iter()
            .flat_map(|k| Load::ALL.map(|l| row_name(k, l)))
            .collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Kernel::ALL.len() * Load::ALL.len());
        assert_eq!(Load::Bar(1).name(), "1 lane streaming through the BAR");
    }

    #[test]
    fn a_window_gives_its_median_and_tail() {
        // 1..=1000 ns shuffled: the median 500.5, p99 990.01, p99.9 999.001.
        let mut samples: Vec<f64> = (1..=1000)
            .map(|i| f64::from((i * 7919) % 1000 + 1))
            .collect();
        let w = Window::of(&mut samples, 24.5);
        assert!((w.median - 500.5).abs() < 1e-9, "{w:?}");
        assert!((w.p99 - 990.01).abs() < 1e-9, "{w:?}");
        assert!((w.p999 - 999.001).abs() < 1e-9, "{w:?}");
        assert_eq!(w.streams, 24.5);
        // One slow round trip in a thousand moves the p99.9, not the p99.
        samples[999] = 1e6;
        let w = Window::of(&mut samples, 0.0);
        assert!((w.p99 - 990.01).abs() < 1e-9, "{w:?}");
        assert!(w.p999 > 1000.0, "{w:?}");
    }

    #[test]
    fn a_rows_figure_is_the_median_of_its_windows_with_their_spread() {
        let windows: Vec<Window> = [3000.0, 2000.0, 9000.0, 2500.0, 2200.0]
            .map(|p99| Window {
                median: 1800.0,
                p99,
                p999: 2.0 * p99,
                streams: 25.0,
            })
            .to_vec();
        let f = figure("x", LONE_SIZE, &windows, |w| w.p99);
        assert_eq!((f.median, f.samples, f.size), (2500.0, 5, LONE_SIZE));
        assert!(f.p10 < 2200.0 && f.p90 > 3000.0, "{f:?}");
    }

    #[test]
    fn paced_loads_give_each_thread_its_share() {
        for load in Load::ALL {
            assert_eq!(load.batch_period().is_some(), load.paced(), "{load:?}");
        }
        // 7 threads at 25 GB/s in all: 256 KiB a batch every 73.4 µs each (to the nanosecond).
        let period = Load::CopyEnginePaced(7).batch_period().unwrap();
        assert_eq!(period.as_nanos(), 73_400);
        let rate = 7.0 * (STREAM_SIZE * STREAM_BATCH as u64) as f64 / period.as_secs_f64();
        assert!((rate / 1e9 / PACED_GB_PER_S - 1.0).abs() < 1e-5, "{rate}");
        assert_eq!(Load::Idle.streams(), 0);
        assert_eq!(
            Load::CopyEngineStaged(7).copy_engine(),
            CopyEngine::FromRecord(4096)
        );
    }
}
