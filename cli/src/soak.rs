//! `vkgdr soak [--seconds N] [--threads N] [--exhaust-every S] [--json]`: everything at once for
//! a long time, then proof that nothing stayed behind (no leaked fds, BAR space or VRAM).
//!
//! For `--seconds` (default 600), side by side on GPU 0:
//! - **pool churn**: `--threads` threads (default 8) allocate, fill, verify and free blocks of
//!   1 B to 16 MiB (shared, thread-cached and dedicated) in one pool;
//! - **rings**: a 4-lane ring consumed by the checking kernel `ring_check_lanes` (every record
//!   verified on the GPU), fed by 4 producer threads with batches of sealed records;
//! - **arena**: a CUDA VMM arena grown and shrunk at random, each new chunk written and read back,
//!   mirrored now and then;
//! - **raw allocations**: one thread allocates, writes, reads back and frees raw memory of 4 KiB
//!   to 4 MiB (carved from shared granules and mapped on their own), freeing it by drop,
//!   `release_now` and `release_after(stream)` in turn;
//! - **BAR exhaustion**: every `--exhaust-every` seconds (default 30) raw 1 GiB allocations until
//!   the BAR refuses one, held for a second, then freed; the other workers meet
//!   `OutOfDeviceMemory` meanwhile and must carry on.
//!
//! The ring's checking kernel runs from the first second to the last: every free of every other
//! worker happens while a kernel runs.
//!
//! Before (after a warm-up that lets the driver set up what it keeps for the process) and after,
//! it takes three figures: this process's open fds, BAR1 used (NVML) and free VRAM
//! (`cuMemGetInfo`). It prints them, a status line every 30 s and the totals, and fails (exit 1)
//! when a figure did not come back, a check found wrong data, or a worker failed. On a terminal a
//! progress line shows the elapsed time and the counters between the status lines; `--json`
//! prints the figures, counters and the verdict as one document ([`SoakDocument`]).

use std::ffi::c_void;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::HumanCount;
use rand::{Rng, SeedableRng};
use vkgdr::cuda_objects::{LaunchConfig, Module, Stream};
use vkgdr::ring::layout::{self, seal_test_payload, WrapMode};
use vkgdr::ring::{DeviceRing, RingDeviceView};
use vkgdr::{Arena, Error, Gpu, Mapping, Pool, PoolConfig};

use crate::json::{
    self, About, MachineJson, SoakCheckJson, SoakCountersJson, SoakDocument, SoakFiguresJson,
    SoakOptionsJson,
};
use crate::{alert, say, status, ui};

const RING_PTX: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels/ring.ptx"));
const RING_LANES: u32 = 4;
const RING_LANE_BYTES: u64 = 4 << 20;
const ARENA_CHUNKS: u64 = 32;
const EXHAUST_STEP: u64 = 1 << 30;
const STATUS_EVERY: Duration = Duration::from_secs(30);
/// Seconds of the warm-up before the figures are first taken.
const WARM_UP_SECONDS: u64 = 8;
/// The most worker errors kept for the JSON document (all are printed).
const ERRORS_KEPT: usize = 100;

/// Exit codes, for `--help`.
const EXIT_CODES: &str = "\
Exit status:
  0  SOAK PASSED: fds, BAR1 used and free VRAM came back, every check found the right data, no
     worker failed
  1  SOAK FAILED: one of those did not hold, or the soak could not start or finish (no GPU, a
     driver call that failed)
  2  the command line is wrong";

/// `vkgdr soak`'s command line.
#[derive(Debug, Clone, clap::Args)]
#[command(display_name = "vkgdr", after_help = EXIT_CODES)]
pub struct SoakArgs {
    /// How long everything runs together, in seconds (after an 8-second warm-up)
    #[arg(long, value_name = "N", default_value_t = 600)]
    pub seconds: u64,

    /// Threads churning the pool
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = at_least_one::<usize>)]
    pub threads: usize,

    /// Seconds between BAR exhaustions (raw 1 GiB allocations until the BAR refuses one)
    #[arg(long, value_name = "S", default_value_t = 30, value_parser = at_least_one::<u64>)]
    pub exhaust_every: u64,

    /// Print one JSON document on stdout: the figures before and after, the counters, pass or
    /// fail (the status lines go to stderr)
    #[arg(long)]
    pub json: bool,
}

/// A whole number of at least 1.
fn at_least_one<T: std::str::FromStr<Err = std::num::ParseIntError> + From<u8> + PartialOrd>(
    s: &str,
) -> Result<T, String> {
    match s.parse::<T>() {
        Ok(n) if n >= T::from(1) => Ok(n),
        Ok(_) => Err("must be at least 1".into()),
        Err(e) => Err(e.to_string()),
    }
}

struct Options {
    seconds: u64,
    threads: usize,
    exhaust_every: u64,
}

impl From<&SoakArgs> for Options {
    fn from(a: &SoakArgs) -> Options {
        Options {
            seconds: a.seconds,
            threads: a.threads,
            exhaust_every: a.exhaust_every,
        }
    }
}

/// `vkgdr soak ...`.
pub fn main(args: &SoakArgs) -> ExitCode {
    let options = Options::from(args);
    let mut record = Record::default();
    let outcome = run(&options, &mut record);
    let passed = matches!(outcome, Ok(true));
    let error = match &outcome {
        Err(e) => {
            alert!("SOAK FAILED: {e}");
            Some(e.to_string())
        }
        Ok(_) => None,
    };
    if args.json {
        let doc = document(&options, &record, passed, error, MachineJson::probe());
        ui::document(&json::to_text(&doc));
    }
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// What a run leaves for its JSON document.
#[derive(Default)]
struct Record {
    gpu: Option<String>,
    before: Option<Figures>,
    after: Option<Figures>,
    seconds: f64,
    counters: SoakCountersJson,
    errors: Vec<String>,
}

fn figures_json(f: &Figures) -> SoakFiguresJson {
    SoakFiguresJson {
        open_fds: f.fds as u64,
        bar1_used_bytes: f.bar1_used,
        vram_free_bytes: f.vram_free,
    }
}

/// The soak's JSON document.
fn document(
    options: &Options,
    record: &Record,
    passed: bool,
    error: Option<String>,
    machine: MachineJson,
) -> SoakDocument {
    let mut checks = Vec::new();
    if let (Some(b), Some(a)) = (&record.before, &record.after) {
        for (figure, unit, before, after) in [
            ("open_fds", "fds", Some(b.fds as u64), Some(a.fds as u64)),
            ("bar1_used", "bytes", b.bar1_used, a.bar1_used),
            ("vram_free", "bytes", Some(b.vram_free), Some(a.vram_free)),
        ] {
            let change = match (before, after) {
                (Some(x), Some(y)) => y as i64 - x as i64,
                _ => 0,
            };
            checks.push(SoakCheckJson {
                figure: figure.into(),
                unit: unit.into(),
                before,
                after,
                change,
                came_back: change == 0,
            });
        }
    }
    SoakDocument {
        about: About::new("vkgdr-soak"),
        options: SoakOptionsJson {
            seconds: options.seconds,
            threads: options.threads,
            exhaust_every_seconds: options.exhaust_every,
        },
        passed,
        error,
        gpu: record.gpu.clone(),
        seconds: record.seconds,
        before: record.before.as_ref().map(figures_json),
        after: record.after.as_ref().map(figures_json),
        checks,
        counters: record.counters.clone(),
        errors: record.errors.clone(),
        machine,
    }
}

/// The figures that must come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Figures {
    fds: usize,
    /// NVML's BAR1 used, in bytes (`None`: no NVML).
    bar1_used: Option<u64>,
    vram_free: u64,
}

fn figures(gpu: &Gpu) -> vkgdr::Result<Figures> {
    let bar = gpu.bar_info()?;
    Ok(Figures {
        fds: std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count()),
        bar1_used: bar.bar1.ok().map(|b| b.used),
        vram_free: gpu.mem_info()?.0,
    })
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "fds {}, BAR1 used {}, free VRAM {}",
            self.fds,
            self.bar1_used.map_or("n/a (no NVML)".into(), mib),
            mib(self.vram_free)
        )
    }
}

/// What the workers did.
#[derive(Default)]
struct Counters {
    pool_ops: AtomicU64,
    pool_oom: AtomicU64,
    ring_records: AtomicU64,
    ring_full_waits: AtomicU64,
    arena_cycles: AtomicU64,
    arena_oom: AtomicU64,
    raw_ops: AtomicU64,
    raw_oom: AtomicU64,
    exhaustions: AtomicU64,
    /// The most bytes raw allocations held when the BAR refused the next one.
    exhausted_at: AtomicU64,
    /// Wrong data found, or a worker's unexpected error: each one is printed.
    failures: AtomicU64,
    /// The first [`ERRORS_KEPT`] of them, for the JSON document.
    messages: Mutex<Vec<String>>,
}

impl Counters {
    fn fail(&self, what: String) {
        alert!("SOAK ERROR: {what}");
        self.failures.fetch_add(1, Ordering::Relaxed);
        let mut kept = self.messages.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() < ERRORS_KEPT {
            kept.push(what);
        }
    }

    /// The counters as the JSON document has them.
    fn json(&self, warm_up_errors: u64) -> SoakCountersJson {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SoakCountersJson {
            pool_ops: n(&self.pool_ops),
            pool_out_of_memory: n(&self.pool_oom),
            ring_records: n(&self.ring_records),
            ring_full_waits: n(&self.ring_full_waits),
            arena_cycles: n(&self.arena_cycles),
            arena_out_of_memory: n(&self.arena_oom),
            raw_allocations: n(&self.raw_ops),
            raw_out_of_memory: n(&self.raw_oom),
            bar_exhaustions: n(&self.exhaustions),
            most_held_at_exhaustion_bytes: n(&self.exhausted_at),
            errors: n(&self.failures),
            warm_up_errors,
        }
    }

    /// One line for the progress bar.
    fn progress_line(&self) -> String {
        let n = |a: &AtomicU64| HumanCount(a.load(Ordering::Relaxed));
        format!(
            "pool {} ops · ring {} records · arena {} cycles · raw {} · {} exhaustions · {} errors",
            n(&self.pool_ops),
            n(&self.ring_records),
            n(&self.arena_cycles),
            n(&self.raw_ops),
            n(&self.exhaustions),
            n(&self.failures),
        )
    }
}

/// The bytes a block tagged `tag` holds.
fn tag_byte(tag: u64, i: usize) -> u8 {
    (tag.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8 ^ (i as u8)
}

fn pool_churn(pool: &Pool, seed: u64, until: Instant, stop: &AtomicBool, c: &Counters) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut live: Vec<(vkgdr::Block, u64)> = Vec::new();
    let check = |b: &vkgdr::Block, tag: u64, c: &Counters| {
        // Whole small blocks; the first and last KiB of large ones.
        let len = b.size() as usize;
        let spans = if len <= 8192 {
            vec![(0, len)]
        } else {
            vec![(0, 1024), (len - 1024, 1024)]
        };
        for (at, n) in spans {
            match b.read_vec(at as u64, n) {
                Ok(got) => {
                    if got
                        .iter()
                        .enumerate()
                        .any(|(i, &x)| x != tag_byte(tag, at + i))
                    {
                        c.fail(format!("pool block {tag} ({len} bytes) lost its bytes"));
                    }
                }
                Err(e) => c.fail(format!("reading pool block {tag}: {e}")),
            }
        }
    };
    let mut tag = seed << 40;
    while Instant::now() < until && !stop.load(Ordering::Relaxed) {
        if live.len() < 256 && (live.is_empty() || rng.gen_bool(0.55)) {
            let size = match rng.gen_range(0..1000) {
                0..=799 => rng.gen_range(1..=4096),
                800..=989 => rng.gen_range(4097..=256 << 10),
                _ => rng.gen_range(8 << 20..=16 << 20),
            };
            match pool.alloc(size, 1 << rng.gen_range(0..=8)) {
                Ok(mut b) => {
                    tag += 1;
                    let bytes: Vec<u8> = (0..size as usize).map(|i| tag_byte(tag, i)).collect();
                    if let Err(e) = b.write(0, &bytes).and_then(|()| b.flush()) {
                        c.fail(format!("writing a {size}-byte block: {e}"));
                    }
                    live.push((b, tag));
                }
                Err(e) if e.is_out_of_memory() => {
                    c.pool_oom.fetch_add(1, Ordering::Relaxed);
                    live.truncate(live.len() / 2);
                }
                Err(e) => c.fail(format!("pool alloc of {size} bytes: {e}")),
            }
        } else {
            let (b, t) = live.swap_remove(rng.gen_range(0..live.len()));
            check(&b, t, c);
        }
        c.pool_ops.fetch_add(1, Ordering::Relaxed);
    }
    for (b, t) in &live {
        check(b, *t, c);
    }
    drop(live);
    vkgdr::pool::magazine::release_thread_cache();
}

/// Launches the checking consumer of every lane and registers it with the ring.
fn launch_checker(module: &Module, ring: &DeviceRing, stream: &Stream) -> vkgdr::Result<()> {
    let mut view = ring.device_view();
    let mut params = [(&mut view as *mut RingDeviceView).cast::<c_void>()];
    let f = module.function("ring_check_lanes")?;
    // SAFETY: ring_check_lanes takes the 64-byte #[repr(C)] view by value; the ring is watched
    // right after, so it stops and waits for the kernel before its memory goes.
    unsafe {
        f.launch(
            LaunchConfig::linear(view.lanes, 256),
            Some(stream),
            &mut params,
        )?
    };
    ring.watch_consumer(stream)
}

/// One producer: claims a lane and pushes batches of sealed records until told to stop.
fn ring_producer(ring: &DeviceRing, seed: u64, until: Instant, stop: &AtomicBool, c: &Counters) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut p = match ring.producer() {
        Ok(p) => p,
        Err(e) => return c.fail(format!("claiming a ring lane: {e}")),
    };
    while Instant::now() < until && !stop.load(Ordering::Relaxed) {
        let n = rng.gen_range(1..=64);
        let first = p.next_seq();
        let records: Vec<Vec<u8>> = (0..n)
            .map(|k| {
                let mut r = vec![0u8; rng.gen_range(16..=4080)];
                seal_test_payload(&mut r, first + k);
                r
            })
            .collect();
        let result = p.push_batch(records.iter().map(|r| &r[..]), Some(Duration::from_secs(2)));
        // Records written before an error are published too.
        c.ring_records
            .fetch_add(p.next_seq() - first, Ordering::Relaxed);
        match result {
            Ok(_) => {}
            Err(vkgdr::ring::core::RingError::Timeout) => {
                c.ring_full_waits.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => return c.fail(format!("ring producer: {e}")),
        }
    }
}

fn arena_cycles(gpu: &Gpu, until: Instant, stop: &AtomicBool, c: &Counters) {
    let chunk = match vkgdr::arena::granularity(gpu.driver(), 0) {
        Ok(g) => g.max(2 << 20),
        Err(e) => return c.fail(format!("VMM granularity: {e}")),
    };
    let mut arena = match Arena::new(gpu, ARENA_CHUNKS * chunk, chunk) {
        Ok(a) => a,
        Err(Error::Unsupported(why)) => {
            status!("soak: arena skipped: {why}");
            return;
        }
        Err(e) => return c.fail(format!("arena: {e}")),
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    while Instant::now() < until && !stop.load(Ordering::Relaxed) {
        let target = rng.gen_range(1..ARENA_CHUNKS - 1) as usize;
        while arena.chunk_count() < target {
            match arena.grow() {
                Ok(len) => {
                    let at = len - chunk;
                    let pattern = vec![(len / chunk) as u8; 4096];
                    let back = arena
                        .write(at, &pattern)
                        .and_then(|()| arena.write(len - 4096, &pattern))
                        .and_then(|()| {
                            let mut got = vec![0u8; 4096];
                            arena.read(len - 4096, &mut got).map(|()| got)
                        });
                    match back {
                        Ok(got) if got == pattern => {}
                        Ok(_) => c.fail(format!("arena chunk at {at} lost its bytes")),
                        Err(e) => c.fail(format!("arena write/read: {e}")),
                    }
                }
                Err(e) if e.is_out_of_memory() => {
                    c.arena_oom.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Err(e) => return c.fail(format!("arena grow: {e}")),
            }
        }
        if rng.gen_bool(0.2) && !arena.is_empty() {
            if let Err(e) = arena.map_mirror().and_then(|()| arena.unmap_mirror()) {
                if !e.is_out_of_memory() {
                    c.fail(format!("arena mirror: {e}"));
                }
            }
        }
        let n = rng.gen_range(0..=arena.chunk_count());
        if let Err(e) = arena.shrink(n) {
            return c.fail(format!("arena shrink: {e}"));
        }
        c.arena_cycles.fetch_add(1, Ordering::Relaxed);
    }
}

/// Raw allocations of 4 KiB to 4 MiB made, checked and freed every way a user can.
fn raw_churn(gpu: &Gpu, until: Instant, stop: &AtomicBool, c: &Counters) {
    let stream = match Stream::new(gpu) {
        Ok(s) => s,
        Err(e) => return c.fail(format!("stream for raw releases: {e}")),
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    while Instant::now() < until && !stop.load(Ordering::Relaxed) {
        let size = 4096u64 << rng.gen_range(0..=10);
        let mut m = match gpu.alloc(size) {
            Ok(m) => m,
            Err(e) if e.is_out_of_memory() => {
                c.raw_oom.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            Err(e) => return c.fail(format!("raw allocation of {size} bytes: {e}")),
        };
        let stamp: u64 = rng.gen();
        let mut back = [0u8; 8];
        let checked = m
            .write(size - 8, &stamp.to_le_bytes())
            .and_then(|()| m.write(0, &stamp.to_le_bytes()))
            .and_then(|()| m.read(size - 8, &mut back));
        match checked {
            Ok(()) if back == stamp.to_le_bytes() => {}
            Ok(()) => c.fail(format!("raw allocation of {size} bytes lost its bytes")),
            Err(e) => c.fail(format!("raw allocation write/read: {e}")),
        }
        match rng.gen_range(0..3) {
            0 => drop(m),
            1 => m.release_now(),
            _ => {
                if let Err(e) = m.release_after(&stream) {
                    c.fail(format!("release after a stream: {e}"));
                }
            }
        }
        c.raw_ops.fetch_add(1, Ordering::Relaxed);
    }
}

/// Raw 1 GiB allocations until the BAR refuses one; held a second, then freed.
fn exhaust(gpu: &Gpu, c: &Counters) {
    let mut held = Vec::new();
    let refusal = loop {
        match gpu.alloc(EXHAUST_STEP) {
            Ok(m) => held.push(m),
            Err(e) if e.is_out_of_memory() => break e,
            Err(e) => return c.fail(format!("raw allocation: {e}")),
        }
        if held.len() > 1024 {
            return c.fail("1 TiB mapped without a refusal".into());
        }
    };
    let bytes = held.len() as u64 * EXHAUST_STEP;
    c.exhaustions.fetch_add(1, Ordering::Relaxed);
    c.exhausted_at.fetch_max(bytes, Ordering::Relaxed);
    let bar1 = gpu
        .bar_info()
        .ok()
        .and_then(|b| b.bar1.ok())
        .map_or("n/a".into(), |b| mib(b.used));
    status!(
        "soak: BAR exhausted after {} of raw allocations (BAR1 used {bar1}): {refusal}",
        mib(bytes)
    );
    std::thread::sleep(Duration::from_secs(1));
    drop(held);
}

/// Everything together for `seconds` (0: one short pass of each, the warm-up); `label` names the
/// part on the progress bar.
fn soak(
    gpu: &Gpu,
    options: &Options,
    seconds: u64,
    c: &Counters,
    label: &'static str,
) -> vkgdr::Result<()> {
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs(seconds.max(2));
    let bar = ui::bar(
        label,
        seconds.max(2),
        Some("{spinner} {prefix:.bold} {bar:24.cyan/blue} {pos}/{len} s {wide_msg}"),
    );
    let stop = AtomicBool::new(false);
    let pool = Pool::new(
        gpu.clone(),
        PoolConfig {
            thread_cache: 32,
            ..Default::default()
        },
    )?;
    let module = Module::load_ptx(gpu, RING_PTX)?;
    let stream = Stream::new(gpu)?;
    let ring = DeviceRing::with_lanes(gpu, RING_LANE_BYTES, RING_LANES, WrapMode::Padded)?;
    launch_checker(&module, &ring, &stream)?;
    let records_before = c.ring_records.load(Ordering::Relaxed);
    std::thread::scope(|s| {
        for t in 0..options.threads {
            let (pool, stop) = (&pool, &stop);
            s.spawn(move || pool_churn(pool, t as u64 + 1, until, stop, c));
        }
        for lane in 0..RING_LANES {
            let (ring, stop) = (&ring, &stop);
            s.spawn(move || ring_producer(ring, 100 + u64::from(lane), until, stop, c));
        }
        s.spawn(|| arena_cycles(gpu, until, &stop, c));
        s.spawn(|| raw_churn(gpu, until, &stop, c));
        let mut next_exhaustion =
            t0 + Duration::from_secs(options.exhaust_every.min(seconds / 2).max(1));
        let mut next_status = t0 + STATUS_EVERY;
        while Instant::now() < until {
            if Instant::now() >= next_exhaustion {
                exhaust(gpu, c);
                next_exhaustion += Duration::from_secs(options.exhaust_every);
            }
            if Instant::now() >= next_status && seconds > 0 {
                next_status += STATUS_EVERY;
                let now = figures(gpu).map_or_else(|e| e.to_string(), |f| f.to_string());
                status!(
                    "soak {:>4} s: {} pool ops ({} OOM), {} ring records, {} arena cycles, \
                     {} raw allocations, {} exhaustions, {} releases waiting; {now}",
                    t0.elapsed().as_secs(),
                    c.pool_ops.load(Ordering::Relaxed),
                    c.pool_oom.load(Ordering::Relaxed),
                    c.ring_records.load(Ordering::Relaxed),
                    c.arena_cycles.load(Ordering::Relaxed),
                    c.raw_ops.load(Ordering::Relaxed),
                    c.exhaustions.load(Ordering::Relaxed),
                    gpu.pending_releases(),
                );
            }
            bar.set_position(t0.elapsed().as_secs().min(seconds.max(2)));
            bar.set_message(c.progress_line());
            std::thread::sleep(Duration::from_millis(100));
            if c.failures.load(Ordering::Relaxed) > 100 {
                stop.store(true, Ordering::Relaxed);
                break;
            }
        }
    });
    bar.set_message("stopping the ring's kernel, then the last releases");
    ring.stop_and_wait(Duration::from_secs(30))?;
    let produced = c.ring_records.load(Ordering::Relaxed) - records_before;
    let (mut consumed, mut errors) = (0, 0);
    for lane in 0..ring.lanes() {
        let r = ring.results_of(lane);
        consumed += r[layout::RESULT_RECORDS];
        errors += r[layout::RESULT_ERRORS];
    }
    if consumed != produced || errors != 0 {
        c.fail(format!(
            "ring: {produced} records produced, the kernel checked {consumed} with {errors} errors"
        ));
    }
    drop((ring, stream, module));
    let stats = pool.stats();
    if stats.bytes_in_use != 0 {
        c.fail(format!(
            "the pool still counts {} bytes in use",
            stats.bytes_in_use
        ));
    }
    pool.trim();
    drop(pool);
    // Frees never wait: let the last ones happen (the kernels are done) before anything counts.
    if !gpu.wait_for_releases(Duration::from_secs(30)) {
        c.fail(format!(
            "{} releases still waiting 30 s after the kernels stopped",
            gpu.pending_releases()
        ));
    }
    gpu.trim();
    Ok(())
}

/// The soak, printing as it goes; what the JSON document needs is left in `record`.
fn run(options: &Options, record: &mut Record) -> vkgdr::Result<bool> {
    let gpu = Gpu::open(0)?;
    record.gpu = Some(gpu.name().to_string());
    say!(
        "soak: {} for {} s: pool churn from {} threads, a {RING_LANES}-lane ring with its \
         checking kernel, arena grow/shrink, BAR exhaustion every {} s",
        gpu.name(),
        options.seconds,
        options.threads,
        options.exhaust_every
    );
    // The warm-up, every worker at full strength with a BAR exhaustion: what the driver sets up
    // once per process (and keeps) is not a leak.
    let warm = Counters::default();
    soak(
        &gpu,
        &Options {
            exhaust_every: 2,
            ..*options
        },
        WARM_UP_SECONDS.min(options.seconds),
        &warm,
        "soak warm-up",
    )?;
    let before = figures(&gpu)?;
    record.before = Some(before);
    say!("soak: before: {before}");
    let c = Counters::default();
    let t0 = Instant::now();
    let result = soak(&gpu, options, options.seconds, &c, "soak");
    record.seconds = t0.elapsed().as_secs_f64();
    record.counters = c.json(warm.failures.load(Ordering::Relaxed));
    record.errors = warm
        .messages
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    record.errors.extend(
        c.messages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned(),
    );
    record.errors.truncate(ERRORS_KEPT);
    result?;
    let after = figures(&gpu)?;
    record.after = Some(after);
    say!("soak: after {} s: {after}", t0.elapsed().as_secs());
    say!(
        "soak: {} pool ops ({} out of memory), {} ring records checked by the kernel ({} waits \
         for space), {} arena cycles ({} out of memory), {} raw allocations ({} out of memory), \
         {} BAR exhaustions (at most {} held), {} errors",
        c.pool_ops.load(Ordering::Relaxed),
        c.pool_oom.load(Ordering::Relaxed),
        c.ring_records.load(Ordering::Relaxed),
        c.ring_full_waits.load(Ordering::Relaxed),
        c.arena_cycles.load(Ordering::Relaxed),
        c.arena_oom.load(Ordering::Relaxed),
        c.raw_ops.load(Ordering::Relaxed),
        c.raw_oom.load(Ordering::Relaxed),
        c.exhaustions.load(Ordering::Relaxed),
        mib(c.exhausted_at.load(Ordering::Relaxed)),
        c.failures.load(Ordering::Relaxed)
    );
    let mut ok =
        c.failures.load(Ordering::Relaxed) == 0 && warm.failures.load(Ordering::Relaxed) == 0;
    let delta = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => b as i64 - a as i64,
        _ => 0,
    };
    for (what, change) in [
        ("fds", after.fds as i64 - before.fds as i64),
        (
            "BAR1 used (bytes)",
            delta(before.bar1_used, after.bar1_used),
        ),
        (
            "free VRAM (bytes)",
            after.vram_free as i64 - before.vram_free as i64,
        ),
    ] {
        if change != 0 {
            say!("SOAK: {what} did not come back: changed by {change} ({before} before, {after} after)");
            ok = false;
        }
    }
    say!("SOAK {}", if ok { "PASSED" } else { "FAILED" });
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> Options {
        Options {
            seconds: 60,
            threads: 4,
            exhaust_every: 10,
        }
    }

    fn parse(line: &str) -> Result<Options, clap::Error> {
        use clap::Parser;
        let args = ["vkgdr", "soak"].into_iter().chain(line.split_whitespace());
        match crate::Cli::try_parse_from(args)?.command {
            Some(crate::Command::Soak(a)) => Ok(Options::from(&a)),
            other => panic!("{line:?} is not a soak command: {other:?}"),
        }
    }

    #[test]
    fn options_parse() {
        let o = parse("").unwrap();
        assert_eq!((o.seconds, o.threads, o.exhaust_every), (600, 8, 30));
        let o = parse("--seconds 60 --threads 4 --exhaust-every 10").unwrap();
        assert_eq!((o.seconds, o.threads, o.exhaust_every), (60, 4, 10));
        // The warm-up alone is a valid soak.
        assert_eq!(parse("--seconds 0").unwrap().seconds, 0);
        for bad in [
            "--seconds",
            "--minutes 3",
            "--threads 0",
            "--exhaust-every 0",
            "--seconds -1",
        ] {
            let e = parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn a_passed_soak_is_a_document_that_reads_back() {
        let before = Figures {
            fds: 41,
            bar1_used: Some(4 << 20),
            vram_free: 80 << 30,
        };
        let record = Record {
            gpu: Some("NVIDIA H100 80GB HBM3".into()),
            before: Some(before),
            after: Some(before),
            seconds: 60.2,
            counters: SoakCountersJson {
                pool_ops: 1_000_000,
                ring_records: 5_000_000,
                bar_exhaustions: 6,
                most_held_at_exhaustion_bytes: 39 << 30,
                ..Default::default()
            },
            errors: Vec::new(),
        };
        let doc = document(&options(), &record, true, None, json::tests::bare_machine());
        let text = json::to_text(&doc);
        let back: SoakDocument = serde_json::from_str(&text).unwrap();
        assert_eq!(back, doc);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["format"], "vkgdr-soak");
        assert_eq!(v["passed"], true);
        assert_eq!(v["options"]["exhaust_every_seconds"], 10);
        assert_eq!(v["before"]["bar1_used_bytes"], 4 << 20);
        assert_eq!(v["counters"]["most_held_at_exhaustion_bytes"], 39u64 << 30);
        let checks = v["checks"].as_array().unwrap();
        assert_eq!(checks.len(), 3);
        assert!(checks
            .iter()
            .all(|c| c["came_back"] == true && c["change"] == 0));
    }

    #[test]
    fn a_figure_that_did_not_come_back_is_named_with_its_change() {
        let before = Figures {
            fds: 41,
            bar1_used: None,
            vram_free: 10_000,
        };
        let after = Figures {
            fds: 43,
            bar1_used: None,
            vram_free: 10_000 - 2 * 1024,
        };
        let record = Record {
            before: Some(before),
            after: Some(after),
            errors: vec!["pool block 7 (64 bytes) lost its bytes".into()],
            ..Default::default()
        };
        let doc = document(
            &options(),
            &record,
            false,
            None,
            json::tests::bare_machine(),
        );
        let by_name = |n: &str| doc.checks.iter().find(|c| c.figure == n).unwrap().clone();
        assert_eq!(by_name("open_fds").change, 2);
        assert!(!by_name("open_fds").came_back);
        assert_eq!(by_name("vram_free").change, -2048);
        // No NVML: BAR1 is unknown, which is not a failure.
        assert_eq!(by_name("bar1_used").before, None);
        assert!(by_name("bar1_used").came_back);
        assert!(!doc.passed);
        assert_eq!(doc.errors.len(), 1);
    }

    #[test]
    fn a_soak_that_could_not_start_says_why() {
        let doc = document(
            &options(),
            &Record::default(),
            false,
            Some("no CUDA driver".into()),
            json::tests::bare_machine(),
        );
        assert!(doc.checks.is_empty() && doc.before.is_none());
        let text = json::to_text(&doc);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"], "no CUDA driver");
        assert_eq!(v["passed"], false);
    }
}
