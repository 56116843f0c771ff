//! The soak itself ([`run`]): on every device named at once, a warm-up, then every worker
//! together for `--seconds` ([`soak`]) with a status line every 30 s; then each device's figures
//! taken before and after judged ([`judge`]), the process's fds held side by side, and one
//! verdict.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use vkgdr::cuda_objects::{Module, Stream};
use vkgdr::ring::layout::{self, WrapMode};
use vkgdr::ring::DeviceRing;
use vkgdr::{Gpu, Pool, PoolConfig};

use super::command_line::Options;
use super::counters::{Counters, ERRORS_KEPT};
use super::d2h::{d2h_rounds, release_rounds, D2hKernels};
use super::document::{DeviceRecord, Record};
use super::figures::{fds_check, holdings, mib, open_fds, snapshot};
use super::verdict::judge;
use super::workers::{arena_cycles, exhaust, launch_checker, pool_churn, raw_churn, ring_producer};
use super::xproc::XprocSoak;
use crate::device::{self, Present};
use crate::ui::{self, alert, say, status};

const RING_PTX: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels/ring.ptx"));
const RING_LANES: u32 = 4;
const RING_LANE_BYTES: u64 = 4 << 20;
const STATUS_EVERY: Duration = Duration::from_secs(30);
/// Seconds of the warm-up before the figures are first taken.
const WARM_UP_SECONDS: u64 = 8;

/// Everything together on one device for `seconds` (0: one short pass of each, the warm-up);
/// `label` names the part on the progress bar.
pub(super) fn soak(
    gpu: &Gpu,
    options: &Options,
    seconds: u64,
    c: &Counters,
    label: String,
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
    // Before the persistent kernel: loading modules and first launches wait for running kernels.
    let d2h_kernels = options.d2h.then(|| D2hKernels::load(gpu)).transpose()?;
    launch_checker(&module, &ring, &stream)?;
    // The shared ring and its producer processes (`--xproc`).
    let xproc = match options.xproc {
        Some(x) => Some(XprocSoak::start(gpu, &module, x)?),
        None => None,
    };
    let records_before = c.ring_records.load(Ordering::Relaxed);
    let driven = std::thread::scope(|s| {
        for t in 0..options.threads {
            let (pool, stop) = (&pool, &stop);
            s.spawn(move || pool_churn(pool, t as u64 + 1, until, stop, c));
        }
        for lane in 0..RING_LANES {
            let (ring, stop) = (&ring, &stop);
            s.spawn(move || ring_producer(ring, 100 + u64::from(lane), until, stop, c));
        }
        s.spawn(|| arena_cycles(gpu, until, &stop, c));
        if let Some(k) = &d2h_kernels {
            let stop = &stop;
            s.spawn(move || d2h_rounds(gpu, k, 7, until, stop, c));
            // Two release workers: seed 11's ring has tagged slots, seed 12's committed ones.
            s.spawn(move || release_rounds(gpu, k, 11, until, stop, c));
            s.spawn(move || release_rounds(gpu, k, 12, until, stop, c));
        }
        s.spawn(|| raw_churn(gpu, until, &stop, c));
        // The processes it starts die with this thread (PR_SET_PDEATHSIG): it outlives them.
        let producers = xproc.as_ref().map(|x| {
            let stop = &stop;
            s.spawn(move || x.drive(until, stop, c))
        });
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
                let now = snapshot(gpu).map_or_else(|e| e.to_string(), |f| f.to_string());
                let releases = gpu.release_times();
                let oldest = releases
                    .oldest_waiting
                    .map_or(String::new(), |o| format!(" (the oldest for {o})"));
                status!(
                    "{} {:>4} s: {} pool ops ({} OOM), {} ring records, {} d2h records, \
                     {} device releases ({} hostile tokens refused), {} arena cycles, \
                     {} raw allocations, {} exhaustions, {} releases waiting{oldest}; {now}",
                    c.soak(),
                    t0.elapsed().as_secs(),
                    c.pool_ops.load(Ordering::Relaxed),
                    c.pool_oom.load(Ordering::Relaxed),
                    c.ring_records.load(Ordering::Relaxed),
                    c.d2h_records.load(Ordering::Relaxed),
                    c.device_releases.load(Ordering::Relaxed),
                    c.hostile_tokens.load(Ordering::Relaxed),
                    c.arena_cycles.load(Ordering::Relaxed),
                    c.raw_ops.load(Ordering::Relaxed),
                    c.exhaustions.load(Ordering::Relaxed),
                    releases.waiting,
                );
                if xproc.is_some() {
                    status!(
                        "{} {:>4} s: xproc: {}",
                        c.soak(),
                        t0.elapsed().as_secs(),
                        c.xproc_line()
                    );
                }
            }
            bar.set_position(t0.elapsed().as_secs().min(seconds.max(2)));
            bar.set_message(c.progress_line());
            std::thread::sleep(Duration::from_millis(100));
            if c.failures.load(Ordering::Relaxed) > 100 {
                stop.store(true, Ordering::Relaxed);
                break;
            }
        }
        producers.map(|p| p.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
    });
    if let (Some(x), Some(driven)) = (xproc, driven) {
        bar.set_message("stopping the shared ring's kernel, checking its producers' records");
        x.finish(driven, gpu, c);
    }
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
    // The ring's default choice stages large batches on some lanes: say what the copy engine
    // carried, and fail where it could not carry what it took.
    let copies = ring.copy_engine_stats();
    status!(
        "{} ring ({:?}): {} staged publications, {} bytes, {} tails on the lanes' streams",
        c.soak(),
        ring.copy_engine(),
        copies.copies,
        copies.bytes,
        copies.stream_tails
    );
    if copies.fallbacks != 0 || copies.unavailable.is_some() {
        c.fail(format!("ring: the copy-engine path failed: {copies:?}"));
    }
    drop((ring, stream, module, d2h_kernels));
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
        let t = gpu.release_times();
        let oldest = t
            .oldest_waiting
            .map_or(String::new(), |o| format!(", the oldest for {o}"));
        let dropping = t
            .longest_dropping
            .map_or(String::new(), |d| format!(", a drop under way for {d}"));
        c.fail(format!(
            "{} releases still waiting 30 s after the kernels stopped{oldest}{dropping}",
            t.waiting
        ));
    }
    gpu.trim();
    Ok(())
}

/// The smallest device memory the library maps on `gpu`: a VMM granule, or a 4 KiB page where
/// memory is imported without VMM.
fn granule(gpu: &Gpu) -> u64 {
    gpu.vmm_status().unwrap_or(4096)
}

/// Runs `each` on every device at once, one thread per device (on this thread when there is
/// one); returns the first error once every device is done.
fn on_every_device(
    gpus: &[Gpu],
    counters: &[Counters],
    each: impl Fn(&Gpu, &Counters) -> vkgdr::Result<()> + Sync,
) -> vkgdr::Result<()> {
    if let ([gpu], [c]) = (gpus, counters) {
        return each(gpu, c);
    }
    let each = &each;
    let results: Vec<vkgdr::Result<()>> = std::thread::scope(|s| {
        let running: Vec<_> = gpus
            .iter()
            .zip(counters)
            .map(|(gpu, c)| s.spawn(move || each(gpu, c)))
            .collect();
        running
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    results.into_iter().collect()
}

/// The soak, printing as it goes; what the JSON document needs is left in `record`.
pub(super) fn run(options: &Options, record: &mut Record) -> vkgdr::Result<bool> {
    let targets: Vec<Present> = device::select(&options.devices)?;
    let gpus = targets
        .iter()
        .map(|t| Gpu::open(t.ordinal))
        .collect::<vkgdr::Result<Vec<_>>>()?;
    let several = targets.len() > 1;
    let tag = |t: &Present| {
        if several {
            format!("[{}]", t.ordinal)
        } else {
            String::new()
        }
    };
    record.devices = targets
        .iter()
        .zip(&gpus)
        .map(|(t, g)| DeviceRecord::new(t.clone(), granule(g)))
        .collect();
    say!(
        "soak: {} for {} s, each with pool churn from {} threads, a {RING_LANES}-lane ring with \
         its checking kernel, arena grow/shrink, raw allocations, BAR exhaustion every {} s{}{}",
        if several {
            format!("{} devices at once", targets.len())
        } else {
            targets[0].to_string()
        },
        options.seconds,
        options.threads,
        options.exhaust_every,
        match options.xproc {
            Some(x) => format!(
                ", a shared {}-lane ring fed by as many producer processes, one killed every {} s",
                x.producers, x.kill_every
            ),
            None => String::new(),
        },
        if options.d2h {
            ", device → host rings and blocks released by kernels"
        } else {
            ""
        }
    );
    if several {
        for t in &targets {
            say!("soak {}: {t}", tag(t));
        }
    }
    // The warm-up, every worker at full strength with a BAR exhaustion: what the driver sets up
    // once per process (and keeps) is not a leak.
    let warm: Vec<Counters> = targets.iter().map(|t| Counters::tagged(&tag(t))).collect();
    let warm_options = Options {
        exhaust_every: 2,
        ..options.clone()
    };
    on_every_device(&gpus, &warm, |gpu, c| {
        soak(
            gpu,
            &warm_options,
            WARM_UP_SECONDS.min(options.seconds),
            c,
            format!("{} warm-up", c.soak()),
        )
    })?;
    let fds_before = open_fds();
    record.fds_before = Some(fds_before);
    for ((d, gpu), c) in record.devices.iter_mut().zip(&gpus).zip(&warm) {
        let before = snapshot(gpu)?;
        say!("{}: before: {before}", c.soak());
        say!(
            "{}: the library holds: {}",
            c.soak(),
            holdings(&before.retained)
        );
        d.before = Some(before);
    }
    say!("soak: before: {fds_before} fds open");
    let counters: Vec<Counters> = targets.iter().map(|t| Counters::tagged(&tag(t))).collect();
    let t0 = Instant::now();
    let result = on_every_device(&gpus, &counters, |gpu, c| {
        soak(gpu, options, options.seconds, c, c.soak())
    });
    record.seconds = t0.elapsed().as_secs_f64();
    for ((d, c), w) in record.devices.iter_mut().zip(&counters).zip(&warm) {
        d.counters = c.json(w.failures.load(Ordering::Relaxed));
    }
    record.errors = warm
        .iter()
        .chain(&counters)
        .flat_map(Counters::kept)
        .take(ERRORS_KEPT)
        .collect();
    result?;
    let fds_after = open_fds();
    record.fds_after = Some(fds_after);
    let our_pid = std::process::id();
    let mut ok = true;
    for ((d, gpu), c) in record.devices.iter_mut().zip(&gpus).zip(&counters) {
        let after = snapshot(gpu)?;
        let soak = c.soak();
        say!("{soak}: after {} s: {after}", t0.elapsed().as_secs());
        say!("{soak}: the library holds: {}", holdings(&after.retained));
        say!(
            "{soak}: {} pool ops ({} out of memory), {} ring records checked by the kernel ({} \
             waits for space), {} arena cycles ({} out of memory), {} raw allocations ({} out of \
             memory), {} BAR exhaustions (at most {} held), {} errors",
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
        let arena_refusals = c
            .arena_refused_by
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if !arena_refusals.is_empty() {
            let by: Vec<String> = arena_refusals
                .iter()
                .map(|(call, n)| format!("{call} {n}"))
                .collect();
            say!("{soak}: arena growths refused by: {}", by.join(", "));
        }
        let none = || "none waited".to_string();
        let r = &after.releases;
        say!(
            "{soak}: releases: the longest wait for GPU work {}, for a turn behind other drops \
             {}, the longest drop {}",
            r.longest_wait.map_or_else(none, |s| s.to_string()),
            r.longest_turn.map_or_else(none, |s| s.to_string()),
            r.longest_drop.map_or_else(none, |s| s.to_string()),
        );
        if options.xproc.is_some() {
            say!("{soak}: xproc: {}", c.xproc_line());
        }
        if options.d2h {
            say!("{soak}: d2h: {}", c.d2h_line());
        }
        let before = d.before.as_ref().expect("taken after the warm-up");
        let judgement = judge(before, &after, our_pid, d.granule);
        for line in judgement.lines() {
            say!("{soak}: {line}");
        }
        d.after = Some(after);
        d.judgement = Some(judgement);
        let failures = d.failures();
        if several {
            say!(
                "{soak}: {}",
                if failures.is_empty() {
                    "passed"
                } else {
                    "FAILED"
                }
            );
        }
        ok &= failures.is_empty();
    }
    let fds = fds_check(fds_before, fds_after);
    if fds.came_back {
        say!("soak: fds {fds_before} -> {fds_after}: came back");
    } else {
        alert!(
            "SOAK: ours: {} more fds open than after the warm-up ({fds_before} -> {fds_after})",
            fds.change
        );
        ok = false;
    }
    say!("SOAK {}", if ok { "PASSED" } else { "FAILED" });
    Ok(ok)
}
