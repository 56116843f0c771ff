//! The soak's device → host workers: kernels publishing checked records to CPU consumers
//! ([`d2h_rounds`]), and kernels giving pool blocks back with their release tokens, hostile
//! tokens among them ([`release_rounds`]). Each round is a finite kernel: its records are all
//! checked, or its blocks all back, before the next one starts.
//!
//! Their modules are loaded, and each kernel launched once, before the soak's persistent
//! checking kernel starts ([`D2hKernels::load`]): loading a module, and the first launch of a
//! kernel under CUDA's lazy loading, wait for running kernels (docs/RELIABILITY.md), and the
//! persistent one ends only with the soak.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use vkgdr::cuda_objects::{LaunchConfig, Module, Stream};
use vkgdr::ring::core::d2h::{
    D2hDeviceView, LaneShape, Poll, ReleaseToken, SlotFormat, TestLaneChecker, MAX_ENTRIES,
};
use vkgdr::ring::DeviceToHostRing;
use vkgdr::{Block, Gpu, Mapping, Pool, PoolConfig, RawMemory};

use super::counters::Counters;

const D2H_PTX: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../kernels/ring_d2h.ptx"
));
const RELEASE_PTX: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../kernels/release.ptx"
));

/// How long a round may take before it counts as hung.
const ROUND_LIMIT: Duration = Duration::from_secs(60);
/// Looks at a head that does not move before a full lane's producer gives up (each look a read
/// and a nap of up to about 4 µs: well under a second).
const SPIN_LIMIT: u32 = 100_000;

/// The workers' kernels, loaded and each launched once.
pub(super) struct D2hKernels {
    d2h: Module,
    release: Module,
}

impl D2hKernels {
    /// Loads both modules and launches each kernel the workers use once with nothing to do, then
    /// waits for them: call it before any persistent kernel runs on `gpu`, and drop the value
    /// only after such kernels ended (a module's unloading waits for running kernels too).
    pub(super) fn load(gpu: &Gpu) -> vkgdr::Result<D2hKernels> {
        let kernels = D2hKernels {
            d2h: Module::load_ptx(gpu, D2H_PTX)?,
            release: Module::load_ptx(gpu, RELEASE_PTX)?,
        };
        let stream = Stream::new(gpu)?;
        let ring = DeviceToHostRing::new(gpu, 1, LaneShape::new(64, 64)?, SPIN_LIMIT)?;
        let result = results(gpu)?;
        let (mut view, mut zero, mut len, mut ptr, mut res) = (
            ring.device_view(),
            0u32,
            8u32,
            result.device_ptr(),
            result.device_ptr(),
        );
        for (module, name) in [
            (&kernels.d2h, "d2h_produce_check"),
            (&kernels.d2h, "d2h_produce_warp_check"),
            (&kernels.release, "release_tokens"),
        ] {
            let f = module.function(name)?;
            let mut params: [*mut std::ffi::c_void; 4] = if name == "release_tokens" {
                [
                    (&mut view as *mut D2hDeviceView).cast(),
                    (&mut ptr as *mut u64).cast(),
                    (&mut zero as *mut u32).cast(),
                    (&mut res as *mut u64).cast(),
                ]
            } else {
                [
                    (&mut view as *mut D2hDeviceView).cast(),
                    (&mut zero as *mut u32).cast(),
                    (&mut len as *mut u32).cast(),
                    (&mut res as *mut u64).cast(),
                ]
            };
            // SAFETY: the parameters each kernel takes (a view by value, then u32, u32, u64* for
            // the producers; const u64*, u32, u64* for release_tokens); with a count of 0 none
            // publishes, and release_tokens reads no token. Everything they use outlives them:
            // the stream is synchronised below before any of it is dropped.
            unsafe { f.launch(LaunchConfig::linear(1, 32), Some(&stream), &mut params)? };
        }
        stream.synchronize()?;
        Ok(kernels)
    }
}

/// Waits for `stream`'s work, at most [`ROUND_LIMIT`], calling `meanwhile` between looks:
/// `false` if it is still running.
fn finished(gpu: &Gpu, stream: &Stream, meanwhile: impl Fn()) -> vkgdr::Result<bool> {
    let event = vkgdr::cuda_objects::Event::new(gpu)?;
    event.record(stream)?;
    let t0 = Instant::now();
    while !event.is_complete()? {
        if t0.elapsed() > ROUND_LIMIT {
            return Ok(false);
        }
        meanwhile();
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(true)
}

/// A zeroed result array of the test kernels (8 words: refusals, then refusals by status).
fn results(gpu: &Gpu) -> vkgdr::Result<RawMemory> {
    let mut r = gpu.alloc(64)?;
    r.fill(0, 64, 0)?;
    Ok(r)
}

fn read_results(r: &RawMemory) -> vkgdr::Result<[u64; 8]> {
    let mut words = [0u64; 8];
    r.read_pod(0, &mut words)?;
    Ok(words)
}

/// What both workers start with: a stream of their own, their random choices, and the deadline
/// and stop flag that end their rounds.
struct Rounds<'a> {
    stream: Stream,
    rng: StdRng,
    until: Instant,
    stop: &'a AtomicBool,
}

impl<'a> Rounds<'a> {
    /// A new stream on `gpu` (its creation the one way this fails), choices seeded with `seed`.
    fn start(gpu: &Gpu, seed: u64, until: Instant, stop: &'a AtomicBool) -> vkgdr::Result<Self> {
        Ok(Rounds {
            stream: Stream::new(gpu)?,
            rng: StdRng::seed_from_u64(seed),
            until,
            stop,
        })
    }

    /// Whether another round is due: the deadline not reached and no stop asked for.
    fn another(&self) -> bool {
        Instant::now() < self.until && !self.stop.load(Ordering::Relaxed)
    }
}

/// Rounds of device → host records until `until`: a ring of 1 to 4 lanes, a kernel whose
/// threads (64 B slots, 8 to 48 payload bytes each) or warps (4 KiB slots, up to 4080 bytes)
/// publish test records, one CPU consumer per lane checking every record's sequence, producer
/// order and bytes ([`TestLaneChecker`]), and every producer's count at the end.
pub(super) fn d2h_rounds(
    gpu: &Gpu,
    kernels: &D2hKernels,
    seed: u64,
    until: Instant,
    stop: &AtomicBool,
    c: &Counters,
) {
    let mut rounds = match Rounds::start(gpu, seed, until, stop) {
        Ok(r) => r,
        Err(e) => return c.fail(format!("d2h: a stream: {e}")),
    };
    while rounds.another() {
        if let Err(e) = d2h_round(gpu, &kernels.d2h, &rounds.stream, &mut rounds.rng, c) {
            c.fail(format!("d2h: {e}"));
            return;
        }
    }
}

fn d2h_round(
    gpu: &Gpu,
    module: &Module,
    stream: &Stream,
    rng: &mut impl Rng,
    c: &Counters,
) -> vkgdr::Result<()> {
    let lanes: u32 = rng.gen_range(1..=4);
    let per_warp_records = rng.gen_bool(0.3);
    // Half the rounds in tagged slots, whose records carry half as much.
    let format = if rng.gen_bool(0.5) {
        SlotFormat::Tagged
    } else {
        SlotFormat::Committed
    };
    let (blocks, threads) = (rng.gen_range(1..=8u32) * lanes, 128u32);
    let (kernel, kind, stride, slots, producers, rounds) = if per_warp_records {
        let warps = blocks * threads / 32;
        (
            "d2h_produce_warp_check",
            2,
            4096,
            1 << rng.gen_range(4..=8),
            warps,
            rng.gen_range(1..=64u32),
        )
    } else {
        (
            "d2h_produce_check",
            1,
            64,
            1 << rng.gen_range(6..=10),
            blocks * threads,
            rng.gen_range(1..=128u32),
        )
    };
    let shape = LaneShape::new(slots, stride)?.with_format(format);
    // Any length the slot carries: whole 16-byte pieces for a warp's record, 8-byte steps for
    // a thread's.
    let max = shape.max_payload();
    let len = if per_warp_records {
        16 * rng.gen_range(1..=max / 16)
    } else {
        8 * rng.gen_range(1..=max / 8)
    };
    let ring = DeviceToHostRing::new(gpu, lanes, shape, SPIN_LIMIT)?;
    let result = results(gpu)?;
    let consumers = ring.consumers()?;
    let checking: Vec<_> = consumers
        .into_iter()
        .enumerate()
        .map(|(lane, mut consumer)| {
            let lane = lane as u32;
            let lane_of = move |p: u32| {
                if per_warp_records {
                    p % lanes
                } else {
                    (p / threads) % lanes
                }
            };
            let mut check = TestLaneChecker::new(lane, kind, len as usize, lane_of);
            std::thread::spawn(move || -> Result<u64, String> {
                let t0 = Instant::now();
                loop {
                    match consumer.next_timeout(Duration::from_millis(100)) {
                        Ok(Poll::Record(rec)) => check.check(&rec).map_err(|e| e.to_string())?,
                        Ok(Poll::Pending) if t0.elapsed() > ROUND_LIMIT => {
                            return Err(format!("lane {lane}: no end after {ROUND_LIMIT:?}"))
                        }
                        Ok(Poll::Pending) => {}
                        Ok(Poll::Ended) => break,
                        Err(e) => return Err(format!("lane {lane}: {e}")),
                    }
                }
                check
                    .all_rounds(producers, rounds)
                    .map_err(|e| e.to_string())?;
                Ok(check.count())
            })
        })
        .collect();
    let f = module.function(kernel)?;
    let (mut view, mut per, mut len_arg, mut res) =
        (ring.device_view(), rounds, len, result.device_ptr());
    // SAFETY: both kernels take (vkgdr_d2h_view by value, u32, u32, u64*); the ring and the
    // result memory outlive the kernel: the round waits for the stream below before dropping
    // them (and their drops never free memory a queued kernel uses).
    unsafe {
        f.launch(
            LaunchConfig::linear(blocks, threads),
            Some(stream),
            &mut [
                (&mut view as *mut D2hDeviceView).cast(),
                (&mut per as *mut u32).cast(),
                (&mut len_arg as *mut u32).cast(),
                (&mut res as *mut u64).cast(),
            ],
        )?
    };
    ring.finish_after(stream)?;
    let mut checked = 0;
    for (lane, t) in checking.into_iter().enumerate() {
        match t.join() {
            Ok(Ok(n)) => checked += n,
            Ok(Err(e)) => c.fail(format!("d2h ({kernel}, {len} B): {e}")),
            Err(_) => c.fail(format!("d2h: the consumer of lane {lane} panicked")),
        }
    }
    if !finished(gpu, stream, || {})? {
        return Err(vkgdr::Error::Unsupported(format!(
            "{kernel} still running {ROUND_LIMIT:?} after its consumers ended"
        )));
    }
    let refused = read_results(&result)?;
    if refused[0] != 0 {
        c.fail(format!("d2h ({kernel}): producers refused {refused:?}"));
    }
    let want = u64::from(producers) * u64::from(rounds);
    if checked != want {
        c.fail(format!(
            "d2h ({kernel}): {checked} records checked of {want} published"
        ));
    }
    c.d2h_records.fetch_add(checked, Ordering::Relaxed);
    Ok(())
}

/// Rounds of device-side releases until `until`: 1 to 256 blocks of a pool lent with
/// `Pool::release_many_on_device`, an allocation beside them that must not overlap any of them
/// (nothing can have come back before the kernel runs), a kernel that releases their tokens
/// (and, every third round, the previous round's spent tokens and a forged one), and then every
/// block back, each redeemed once, the hostile tokens counted as refused and nothing freed by
/// them.
pub(super) fn release_rounds(
    gpu: &Gpu,
    kernels: &D2hKernels,
    seed: u64,
    until: Instant,
    stop: &AtomicBool,
    c: &Counters,
) {
    let run = || -> vkgdr::Result<()> {
        let mut rounds = Rounds::start(gpu, seed, until, stop)?;
        let pool = Pool::new(gpu.clone(), PoolConfig::default())?;
        // Workers of odd seeds release through tagged slots.
        let format = if seed % 2 == 1 {
            SlotFormat::Tagged
        } else {
            SlotFormat::Committed
        };
        let shape = LaneShape::new(256, 64)?.with_format(format);
        let ring = DeviceToHostRing::new(gpu, 2, shape, SPIN_LIMIT)?;
        if pool.set_release_feed(ring.consumers()?).is_err() {
            return Err(vkgdr::Error::Unsupported(
                "a new pool refused its release feed".into(),
            ));
        }
        let mut spent: Vec<u64> = Vec::new();
        let mut round = 0u64;
        while rounds.another() {
            round += 1;
            let hostile = round.is_multiple_of(3);
            spent = release_round(
                gpu,
                &kernels.release,
                &rounds.stream,
                &pool,
                &ring,
                &mut rounds.rng,
                hostile.then_some(&spent[..]),
                c,
            )?;
        }
        Ok(())
    };
    if let Err(e) = run() {
        c.fail(format!("device releases: {e}"));
    }
}

/// A block's device address and size.
fn span(b: &Block) -> vkgdr::Result<(u64, u64)> {
    let at = b.device_ptr().ok_or_else(|| {
        vkgdr::Error::Unsupported("a block of a GPU pool without a device address".into())
    })?;
    Ok((at, b.size()))
}

#[allow(clippy::too_many_arguments)]
fn release_round(
    gpu: &Gpu,
    module: &Module,
    stream: &Stream,
    pool: &Pool,
    ring: &DeviceToHostRing,
    rng: &mut impl Rng,
    spent: Option<&[u64]>,
    c: &Counters,
) -> vkgdr::Result<Vec<u64>> {
    let n = rng.gen_range(1..=256usize);
    let mut blocks: Vec<Block> = Vec::with_capacity(n);
    for _ in 0..n {
        match pool.alloc(rng.gen_range(1..=64u64 << 10), 64) {
            Ok(b) => blocks.push(b),
            Err(e) if e.is_out_of_memory() => break,
            Err(e) => return Err(e),
        }
    }
    let lent: Vec<(u64, u64)> = blocks.iter().map(span).collect::<vkgdr::Result<_>>()?;
    let mut tokens: Vec<ReleaseToken> = Vec::with_capacity(lent.len());
    if let Err(why) = pool.release_many_on_device(&mut blocks, &mut tokens) {
        c.fail(format!(
            "device releases: lending {} blocks refused: {why}",
            lent.len()
        ));
        return Ok(Vec::new());
    }
    // Nothing can come back before the kernel runs: a block allocated now overlaps none lent.
    let beside: Vec<Block> = (0..16)
        .filter_map(|_| pool.alloc(rng.gen_range(1..=64u64 << 10), 64).ok())
        .collect();
    for b in &beside {
        let (at, size) = span(b)?;
        if let Some((p, s)) = lent.iter().find(|&&(p, s)| at < p + s && p < at + size) {
            c.fail(format!(
                "device releases: a block at {at:#x} ({size} B) was handed out over a lent one \
                 at {p:#x} ({s} B) before its token came"
            ));
        }
    }
    drop(beside);
    let bits: Vec<u64> = tokens.iter().map(|t| t.to_bits()).collect();
    let mut sent = bits.clone();
    let mut refused_due = 0;
    if let (Some(spent), Some(first)) = (spent, tokens.first()) {
        // Spent tokens (stale or repeated) and one whose entry was never issued (forged).
        sent.extend_from_slice(spent);
        sent.push(ReleaseToken::new(first.tag(), MAX_ENTRIES - 1, 1).to_bits());
        refused_due = spent.len() as u64 + 1;
    }
    let before = pool.stats().device_releases.tokens;
    let result = results(gpu)?;
    let mut list = gpu.alloc(sent.len() as u64 * 8)?;
    list.write_pod(0, &sent)?;
    let f = module.function("release_tokens")?;
    let (mut view, mut ptr, mut count, mut res) = (
        ring.device_view(),
        list.device_ptr(),
        sent.len() as u32,
        result.device_ptr(),
    );
    // SAFETY: (vkgdr_d2h_view by value, const u64*, u32, u64*) as release_tokens takes them;
    // the token list and the result memory outlive the kernel (waited for below, and their
    // drops never free memory a queued kernel uses).
    unsafe {
        f.launch(
            LaunchConfig::linear((sent.len() as u32).div_ceil(128), 128),
            Some(stream),
            &mut [
                (&mut view as *mut D2hDeviceView).cast(),
                (&mut ptr as *mut u64).cast(),
                (&mut count as *mut u32).cast(),
                (&mut res as *mut u64).cast(),
            ],
        )?
    };
    // Drained meanwhile too: once every good token came, the pool's drain thread rests, and the
    // hostile records after them must not fill a lane under the kernel.
    if !finished(gpu, stream, || {
        pool.drain_device_releases();
    })? {
        return Err(vkgdr::Error::Unsupported(format!(
            "release_tokens still running after {ROUND_LIMIT:?}"
        )));
    }
    let refusals = read_results(&result)?;
    if refusals[0] != 0 {
        c.fail(format!(
            "device releases: the kernel's releases refused {refusals:?}"
        ));
    }
    // Every block back (the drain thread, or this drain), its token redeemed once.
    let t0 = Instant::now();
    let want_refused = before.refused() + refused_due;
    loop {
        pool.drain_device_releases();
        let now = pool.stats().device_releases.tokens;
        if pool.lent_blocks() == 0 && now.refused() >= want_refused {
            break;
        }
        if t0.elapsed() > ROUND_LIMIT {
            c.fail(format!(
                "device releases: {} blocks still lent {ROUND_LIMIT:?} after their kernel \
                 ({:?})",
                pool.lent_blocks(),
                pool.stats().device_releases
            ));
            return Ok(Vec::new());
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    let after = pool.stats().device_releases.tokens;
    let redeemed = after.redeemed - before.redeemed;
    let refused = after.refused() - before.refused();
    if redeemed != bits.len() as u64 || refused != refused_due {
        c.fail(format!(
            "device releases: {} tokens and {refused_due} hostile ones sent, {redeemed} \
             redeemed and {refused} refused",
            bits.len()
        ));
    }
    c.device_releases.fetch_add(redeemed, Ordering::Relaxed);
    c.hostile_tokens.fetch_add(refused, Ordering::Relaxed);
    Ok(bits)
}
