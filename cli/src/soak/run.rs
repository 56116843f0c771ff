//! The soak itself ([`run`]): a warm-up, then every worker together for `--seconds` ([`soak`])
//! with a status line every 30 s, then the figures taken before and after held side by side.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use vkgdr::cuda_objects::{Module, Stream};
use vkgdr::ring::layout::{self, WrapMode};
use vkgdr::ring::DeviceRing;
use vkgdr::{Gpu, Pool, PoolConfig};

use super::command_line::Options;
use super::counters::{Counters, ERRORS_KEPT};
use super::document::Record;
use super::figures::{checks, figures, mib};
use super::workers::{arena_cycles, exhaust, launch_checker, pool_churn, raw_churn, ring_producer};
use crate::ui::{self, say, status};

const RING_PTX: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels/ring.ptx"));
const RING_LANES: u32 = 4;
const RING_LANE_BYTES: u64 = 4 << 20;
const STATUS_EVERY: Duration = Duration::from_secs(30);
/// Seconds of the warm-up before the figures are first taken.
const WARM_UP_SECONDS: u64 = 8;

/// Everything together for `seconds` (0: one short pass of each, the warm-up); `label` names the
/// part on the progress bar.
pub(super) fn soak(
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
pub(super) fn run(options: &Options, record: &mut Record) -> vkgdr::Result<bool> {
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
    for c in checks(&before, &after) {
        if !c.came_back() {
            say!(
                "SOAK: {} did not come back: changed by {} ({before} before, {after} after)",
                c.what,
                c.change
            );
            ok = false;
        }
    }
    say!("SOAK {}", if ok { "PASSED" } else { "FAILED" });
    Ok(ok)
}
