//! The workers that run side by side: pool churn ([`pool_churn`]), ring producers
//! ([`ring_producer`]) feeding the checking kernel ([`launch_checker`]), arena grow/shrink
//! ([`arena_cycles`]), raw allocations freed every way ([`raw_churn`]) and BAR exhaustion
//! ([`exhaust`]). Each counts what it did and reports what went wrong in the [`Counters`].

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use vkgdr::cuda_objects::{LaunchConfig, Module, Stream};

use vkgdr::ring::{DeviceRing, RingDeviceView};
use vkgdr::{Arena, Error, Gpu, Mapping, Pool};

use super::counters::Counters;
use super::figures::mib;
use crate::bench::ring::random_batch;
use crate::ui::status;

const ARENA_CHUNKS: u64 = 32;
const EXHAUST_STEP: u64 = 1 << 30;

/// The bytes a block tagged `tag` holds.
pub(super) fn tag_byte(tag: u64, i: usize) -> u8 {
    (tag.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8 ^ (i as u8)
}

/// A pool churned from one thread: blocks of 1 B to 16 MiB allocated, filled, verified and
/// freed.
pub(super) fn pool_churn(pool: &Pool, seed: u64, until: Instant, stop: &AtomicBool, c: &Counters) {
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
pub(super) fn launch_checker(
    module: &Module,
    ring: &DeviceRing,
    stream: &Stream,
) -> vkgdr::Result<()> {
    let mut view = ring.device_view();
    let mut params = [(&mut view as *mut RingDeviceView).cast::<c_void>()];
    let f = module.function("ring_check_lanes")?;
    // SAFETY: ring_check_lanes takes the 64-byte #[repr(C)] view by value; the ring is watched
    // right after, so it stops and waits for the kernel before its memory goes.
    unsafe {
        f.launch(
            LaunchConfig::linear(view.lanes, vkgdr::ring::layout::CHECK_THREADS),
            Some(stream),
            &mut params,
        )?
    };
    ring.watch_consumer(stream)
}

/// One producer: claims a lane and pushes batches of sealed records until told to stop.
pub(super) fn ring_producer(
    ring: &DeviceRing,
    seed: u64,
    until: Instant,
    stop: &AtomicBool,
    c: &Counters,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut p = match ring.producer() {
        Ok(p) => p,
        Err(e) => return c.fail(format!("claiming a ring lane: {e}")),
    };
    while Instant::now() < until && !stop.load(Ordering::Relaxed) {
        let first = p.next_seq();
        let records = random_batch(&mut rng, first);
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

/// An arena grown and shrunk at random, each new chunk written and read back, mirrored now
/// and then.
pub(super) fn arena_cycles(gpu: &Gpu, until: Instant, stop: &AtomicBool, c: &Counters) {
    let chunk = match vkgdr::arena::granularity(gpu.driver(), 0) {
        Ok(g) => g.max(2 << 20),
        Err(e) => return c.fail(format!("VMM granularity: {e}")),
    };
    let mut arena = match Arena::new(gpu, ARENA_CHUNKS * chunk, chunk) {
        Ok(a) => a,
        Err(Error::Unsupported(why)) => {
            status!("{}: arena skipped: {why}", c.soak());
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
                    *c.arena_refused_by
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry(e.driver_call().unwrap_or("a limit").to_string())
                        .or_default() += 1;
                    // As the raw allocations do: a refusal waits a little before the next try,
                    // so a slot whose release lags is not asked for again at once, thousands of
                    // times a second.
                    std::thread::sleep(Duration::from_millis(1));
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
pub(super) fn raw_churn(gpu: &Gpu, until: Instant, stop: &AtomicBool, c: &Counters) {
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
pub(super) fn exhaust(gpu: &Gpu, c: &Counters) {
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
    *c.refused_by
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(refusal.driver_call().unwrap_or("a limit").to_string())
        .or_default() += 1;
    c.exhausted_at.fetch_max(bytes, Ordering::Relaxed);
    let bar1 = gpu
        .bar_info()
        .ok()
        .and_then(|b| b.bar1.ok())
        .map_or("n/a".into(), |b| mib(b.used));
    status!(
        "{}: BAR exhausted after {} of raw allocations (BAR1 used {bar1}): {refusal}",
        c.soak(),
        mib(bytes)
    );
    std::thread::sleep(Duration::from_secs(1));
    drop(held);
}
