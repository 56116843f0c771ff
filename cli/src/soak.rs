//! `vkgdr soak [--seconds N] [--threads N] [--exhaust-every S]`: everything at once for a long
//! time (issue 19 #5), then proof that nothing stayed behind.
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
//! when a figure did not come back, a check found wrong data, or a worker failed.

use std::ffi::c_void;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use vkgdr::cuda_objects::{LaunchConfig, Module, Stream};
use vkgdr::ring::layout::{self, seal_test_payload, WrapMode};
use vkgdr::ring::{DeviceRing, RingDeviceView};
use vkgdr::{Arena, Error, Gpu, Mapping, Pool, PoolConfig};

/// One line of usage text.
pub const USAGE: &str = "vkgdr soak [--seconds N (600)] [--threads N (8)] [--exhaust-every S (30)]";

const RING_PTX: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels/ring.ptx"));
const RING_LANES: u32 = 4;
const RING_LANE_BYTES: u64 = 4 << 20;
const ARENA_CHUNKS: u64 = 32;
const EXHAUST_STEP: u64 = 1 << 30;
const STATUS_EVERY: Duration = Duration::from_secs(30);
/// Seconds of the warm-up before the figures are first taken.
const WARM_UP_SECONDS: u64 = 8;

struct Options {
    seconds: u64,
    threads: usize,
    exhaust_every: u64,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        seconds: 600,
        threads: 8,
        exhaust_every: 30,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| format!("{flag} needs a number"))?;
        match flag.as_str() {
            "--seconds" => o.seconds = value,
            "--threads" => o.threads = value.max(1) as usize,
            "--exhaust-every" => o.exhaust_every = value.max(1),
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(o)
}

/// `vkgdr soak ...`.
pub fn main(args: &[String]) -> ExitCode {
    let options = match parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}\nusage: {USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&options) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("SOAK FAILED: {e}");
            ExitCode::FAILURE
        }
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
}

impl Counters {
    fn fail(&self, what: String) {
        eprintln!("SOAK ERROR: {what}");
        self.failures.fetch_add(1, Ordering::Relaxed);
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
            println!("soak: arena skipped: {why}");
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
    println!(
        "soak: BAR exhausted after {} of raw allocations (BAR1 used {bar1}): {refusal}",
        mib(bytes)
    );
    std::thread::sleep(Duration::from_secs(1));
    drop(held);
}

/// Everything together for `seconds` (0: one short pass of each, the warm-up).
fn soak(gpu: &Gpu, options: &Options, seconds: u64, c: &Counters) -> vkgdr::Result<()> {
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs(seconds.max(2));
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
                println!(
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
            std::thread::sleep(Duration::from_millis(100));
            if c.failures.load(Ordering::Relaxed) > 100 {
                stop.store(true, Ordering::Relaxed);
                break;
            }
        }
    });
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

fn run(options: &Options) -> vkgdr::Result<bool> {
    let gpu = Gpu::open(0)?;
    println!(
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
    )?;
    let before = figures(&gpu)?;
    println!("soak: before: {before}");
    let c = Counters::default();
    let t0 = Instant::now();
    soak(&gpu, options, options.seconds, &c)?;
    let after = figures(&gpu)?;
    println!("soak: after {} s: {after}", t0.elapsed().as_secs());
    println!(
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
            println!("SOAK: {what} did not come back: changed by {change} ({before} before, {after} after)");
            ok = false;
        }
    }
    println!("SOAK {}", if ok { "PASSED" } else { "FAILED" });
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse() {
        let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        let o = parse(&args("")).unwrap();
        assert_eq!((o.seconds, o.threads, o.exhaust_every), (600, 8, 30));
        let o = parse(&args("--seconds 60 --threads 4 --exhaust-every 10")).unwrap();
        assert_eq!((o.seconds, o.threads, o.exhaust_every), (60, 4, 10));
        assert!(parse(&args("--seconds")).is_err());
        assert!(parse(&args("--minutes 3")).is_err());
    }
}
