//! A running kernel never stalls the library. A persistent kernel spins on a non-blocking stream
//! of its own while eight threads churn pools (thread-cached, uncached and dedicated blocks, a
//! pool on an arena), make and free raw allocations (carved and mapped on their own), grow and
//! shrink an arena, create and drop rings, and the main thread exhausts the BAR and recovers
//! from it again and again. Everything finishes in bounded time with the kernel's heartbeat
//! advancing throughout, every byte read back is what was written, a kernel launched meanwhile
//! on another stream finds every live block intact, and once the kernel is stopped fds, free
//! VRAM and BAR1 use are back where they were. A watchdog turns a hang into a failure that
//! prints every thread's state.
//!
//! Also: what a release waits for (work queued on the legacy stream before it, or on the stream
//! it names) and what it does not (a kernel on a non-blocking stream), and an arena that takes its
//! own released chunk ahead of slow drops of others. Own binary: it counts fds.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use vkgdr::cuda_objects::{LaunchConfig, Stream};
use vkgdr::ring::{DeviceRing, LaunchRing};
use vkgdr::{Arena, Block, Error, Gpu, Mapping, Pool, PoolConfig};

/// How long the workers churn.
const CHURN: Duration = Duration::from_secs(20);
/// The first pass, whose figures are not compared: what the driver sets up once per process
/// (files it keeps open, its own bookkeeping) is not a leak. As long as the soak's warm-up, with
/// several BAR exhaustions in it.
const WARM_UP: Duration = Duration::from_secs(8);
/// The watchdog's limit for the whole test (well inside scripts/gpu-check's per-binary limit).
const LIMIT: Duration = Duration::from_secs(150);

/// A small deterministic generator (each thread its own).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Counters the threads share.
#[derive(Default)]
struct Counts {
    ops: AtomicU64,
    out_of_memory: AtomicU64,
    exhaustions: AtomicU64,
}

/// Runs `op` until the churn time is up, counting operations and tolerating out-of-memory
/// (the BAR is exhausted on purpose now and then): any other error fails the test.
fn churn(
    i: usize,
    states: &ThreadStates,
    counts: &Counts,
    end: Instant,
    mut op: impl FnMut(&mut Rng) -> vkgdr::Result<()>,
) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1).wrapping_mul(0x1234_5678_9abc));
    while Instant::now() < end {
        match op(&mut rng) {
            Ok(()) => {
                counts.ops.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) if e.is_out_of_memory() => {
                counts.out_of_memory.fetch_add(1, Ordering::Relaxed);
                states.set(i, "backing off after out-of-memory");
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!("thread {i}: {e}"),
        }
    }
    states.set(i, "done");
}

/// BAR1 bytes in use (NVML), where NVML answers.
fn bar1_used(gpu: &Gpu) -> Option<u64> {
    gpu.bar_info().ok()?.bar1.ok().map(|b| b.used)
}

/// Pool blocks that stay alive until the end, tagged, for the kernel check.
type Kept = std::sync::Mutex<Vec<(Block, u32)>>;

fn pool_churn(
    i: usize,
    pool: &Pool,
    states: &ThreadStates,
    counts: &Counts,
    end: Instant,
    kept: &Kept,
    sizes: (u64, u64),
) {
    let mut live: std::collections::VecDeque<(Block, u32)> = Default::default();
    let mut tag = (i as u32) << 24;
    churn(i, states, counts, end, |rng| {
        states.set(i, "pool alloc");
        let len = sizes.0 + rng.below(sizes.1 - sizes.0);
        let mut b = pool.alloc(len, 16)?;
        tag = tag.wrapping_add(1);
        let bytes = tag_bytes(tag, len as usize);
        states.set(i, "pool write");
        b.write(0, &bytes)?;
        b.flush()?;
        let mut head = vec![0u8; (len as usize).min(256)];
        b.read(0, &mut head)?;
        assert_eq!(head, bytes[..head.len()], "thread {i}: block read back");
        live.push_back((b, tag));
        if live.len() > 64 {
            states.set(i, "pool free");
            drop(live.pop_front());
        }
        Ok(())
    });
    let mut k = kept.lock().unwrap();
    k.extend(live.into_iter().take(32));
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn eight_threads_and_bar_exhaustion_beside_a_persistent_kernel() {
    let gpu = open(false);
    let states = ThreadStates::new(9);
    let done = Arc::new(AtomicBool::new(false));
    let dog = watchdog("the coexistence test", LIMIT, states.clone(), done.clone());
    // check_tagged_blocks (ptrs, lens, tags, count, bad) runs beside the persistent kernel at
    // the end of each pass: its first launch must come before (lazy loading waits for running
    // kernels).
    let mut kernel = PersistentKernel::start(&gpu, false, &[("check_tagged_blocks", 5)]);
    // A first pass whose figures are not compared (see `WARM_UP`).
    churn_beside(&gpu, &kernel, &states, WARM_UP);
    settle(&gpu);
    gpu.trim();
    // NVML opens its device files (nvidiactl, nvidia0, nvidia-uvm, the caps, an eventfd) on
    // first use and keeps them: read BAR1 before the fds are counted, or they look like a leak.
    let (free_before, _) = gpu.mem_info().unwrap();
    let bar_before = bar1_used(&gpu);
    let fd_targets = open_fd_targets();
    let fds = fd_targets.len();
    churn_beside(&gpu, &kernel, &states, CHURN);
    // The figures with the kernel still running, as at the start.
    settle(&gpu);
    gpu.trim();
    let fd_targets_after = open_fd_targets();
    let (fds_after, free_after, bar_after) = (
        fd_targets_after.len(),
        gpu.mem_info().unwrap().0,
        bar1_used(&gpu),
    );
    if fds_after != fds {
        println!(
            "coexistence: fds {fds} after the warm-up, {fds_after} after the churn:\n{}",
            fd_changes(&fd_targets, &fd_targets_after)
        );
    }
    kernel.stop();
    done.store(true, Ordering::Release);
    dog.join().unwrap();
    assert_eq!(fds_after, fds, "fds left behind");
    let bar = bar_before.zip(bar_after);
    if let Some((before, after)) = bar {
        println!("coexistence: BAR1 used {before} bytes before, {after} after");
    }
    if under_sanitizer() {
        // compute-sanitizer maps device memory of its own as the run goes on (figures:
        // docs/RELIABILITY.md): the library's leaks are the plain run's to find.
        println!(
            "coexistence: free VRAM {free_before} -> {free_after} bytes (BAR1 and VRAM not \
             compared under compute-sanitizer)"
        );
    } else {
        assert_eq!(free_after, free_before, "device memory left behind");
        if let Some((before, after)) = bar {
            assert_eq!(after, before, "BAR1 use left behind");
        }
    }
    drop(kernel);
    settle(&gpu);
    assert_eq!(gpu.allocations().len(), 0, "{:?}", gpu.allocations());
}

/// One pass: eight threads and the BAR exhaustion for `churn_for` beside the running `kernel`,
/// then a kernel on another stream checks the blocks kept alive.
fn churn_beside(gpu: &Gpu, kernel: &PersistentKernel, states: &ThreadStates, churn_for: Duration) {
    let beats_start = kernel.beats();
    let counts = Counts::default();
    let kept: Kept = Default::default();
    let end = Instant::now() + churn_for;

    let cached = Pool::new(gpu.clone(), PoolConfig::default()).unwrap();
    let uncached = Pool::new(
        gpu.clone(),
        PoolConfig {
            thread_cache: 0,
            ..Default::default()
        },
    )
    .unwrap();
    let on_arena = Pool::on_arena(gpu, 256 << 20, 2 << 20, PoolConfig::default()).unwrap();

    std::thread::scope(|s| {
        let (counts, kept) = (&counts, &kept);
        let on_arena = &on_arena;
        for i in 0..2 {
            let pool = &cached;
            s.spawn(move || pool_churn(i, pool, states, counts, end, kept, (16, 64 << 10)));
        }
        s.spawn(|| pool_churn(2, &uncached, states, counts, end, kept, (16, 4096)));
        // Dedicated blocks (8 MiB and more each get a chunk of their own).
        s.spawn(|| {
            churn(3, states, counts, end, |rng| {
                states.set(3, "dedicated block alloc");
                let len = (8 << 20) + rng.below(16 << 20);
                let mut b = cached.alloc(len, 256)?;
                assert!(b.is_dedicated());
                states.set(3, "dedicated block write");
                b.write(len - 8, &len.to_le_bytes())?;
                let mut back = [0u8; 8];
                b.read(len - 8, &mut back)?;
                assert_eq!(back, len.to_le_bytes());
                states.set(3, "dedicated block free");
                Ok(())
            })
        });
        // Raw allocations: carved (up to 1 MiB) and mapped on their own, freed every way.
        for i in 4..6 {
            s.spawn(move || {
                let stream = Stream::new(gpu).unwrap();
                churn(i, states, counts, end, |rng| {
                    states.set(i, "raw alloc");
                    let len = 4096 << rng.below(11);
                    let mut m = gpu.alloc(len)?;
                    let stamp = rng.next().to_le_bytes();
                    m.write(len - 8, &stamp)?;
                    let mut back = [0u8; 8];
                    m.read(len - 8, &mut back)?;
                    assert_eq!(back, stamp, "thread {i}: raw read back");
                    states.set(i, "raw free");
                    match rng.below(3) {
                        0 => drop(m),
                        1 => m.release_now(),
                        _ => m.release_after(&stream)?,
                    }
                    Ok(())
                })
            });
        }
        // An arena growing and shrinking, and a pool on another one.
        s.spawn(move || {
            let mut arena = Arena::new(gpu, 64 << 20, 2 << 20).unwrap();
            let mut blocks = Vec::new();
            churn(6, states, counts, end, |rng| {
                if rng.below(2) == 0 && arena.len() < arena.capacity() {
                    states.set(6, "arena grow");
                    match arena.grow() {
                        // A slot still being released is the arena's out-of-memory too.
                        Err(Error::OutOfDeviceMemory { .. }) | Ok(_) => {}
                        Err(e) => return Err(e),
                    }
                } else {
                    states.set(6, "arena shrink");
                    arena.shrink(1)?;
                }
                states.set(6, "pool on arena");
                blocks.push(on_arena.alloc(1 + rng.below(1 << 20), 64)?);
                if blocks.len() > 16 {
                    blocks.remove(0);
                }
                Ok(())
            });
        });
        // Rings made and dropped (their memory is pinned host memory and BAR memory).
        s.spawn(move || {
            churn(7, states, counts, end, |rng| {
                states.set(7, "ring create");
                let ring = DeviceRing::new(gpu, 64 << 10)?;
                for _ in 0..rng.below(16) {
                    ring.push(&[7; 100], Some(Duration::ZERO))?;
                }
                states.set(7, "ring drop");
                drop(ring);
                states.set(7, "launch ring create");
                let launch = LaunchRing::new(gpu, 64 << 10)?;
                launch.ring().push(&[1; 64], Some(Duration::ZERO))?;
                states.set(7, "launch ring drop");
                drop(launch);
                Ok(())
            })
        });
        // The main thread: exhaust the BAR, hold it, free it, allocate again.
        let mut round = 0;
        while Instant::now() < end {
            round += 1;
            states.set(8, &format!("exhausting the BAR (round {round})"));
            let mut held = Vec::new();
            let err = loop {
                match gpu.alloc(1 << 30) {
                    Ok(m) => held.push(m),
                    Err(e) => break e,
                }
                assert!(held.len() < 200, "never ran out");
            };
            assert!(err.is_out_of_memory(), "{err}");
            counts.exhaustions.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(200));
            states.set(8, &format!("freeing {} GiB (round {round})", held.len()));
            let n = held.len();
            drop(held);
            states.set(
                8,
                &format!("allocating again after exhaustion (round {round})"),
            );
            // The BAR is free again (other threads take bits of it meanwhile).
            let again = gpu.alloc(1 << 30);
            assert!(
                again.is_ok(),
                "round {round}: after freeing {n} GiB: {:?}",
                again.err()
            );
            drop(again);
            std::thread::sleep(Duration::from_millis(300));
        }
        states.set(8, "waiting for the workers");
    });
    assert!(
        kernel.is_alive(),
        "the kernel stopped while the library was used"
    );
    let beats_end = kernel.beats();
    println!(
        "coexistence: {} operations, {} out-of-memory answers, {} BAR exhaustions; kernel \
         heartbeat {beats_start} -> {beats_end}",
        counts.ops.load(Ordering::Relaxed),
        counts.out_of_memory.load(Ordering::Relaxed),
        counts.exhaustions.load(Ordering::Relaxed),
    );
    assert!(counts.exhaustions.load(Ordering::Relaxed) >= 1);
    assert!(counts.ops.load(Ordering::Relaxed) > 1_000);

    let kept = kept.into_inner().unwrap();
    if under_sanitizer() {
        // A second kernel would wait for the persistent one forever: the CPU checks instead.
        states.set(8, "checking the kept blocks on the CPU");
        for (i, (b, tag)) in kept.iter().enumerate() {
            let mut back = vec![0u8; b.size() as usize];
            b.read(0, &mut back).unwrap();
            assert!(
                back == tag_bytes(*tag, back.len()),
                "kept block {i} changed"
            );
        }
        println!(
            "coexistence: {} kept blocks checked by the CPU (under compute-sanitizer kernels run one at a time)",
            kept.len()
        );
        drop((kept, cached, uncached, on_arena));
        return;
    }
    // With the kernel still running, another kernel on another stream checks every kept block.
    states.set(8, "checking the kept blocks with a second kernel");
    let check = Stream::new(gpu).unwrap();
    let n = kept.len();
    let mut table = gpu.alloc(16 * n as u64 + 8).unwrap();
    let ptrs: Vec<u64> = kept.iter().map(|(b, _)| b.device_ptr().unwrap()).collect();
    let lens: Vec<u32> = kept.iter().map(|(b, _)| b.size() as u32).collect();
    let tags: Vec<u32> = kept.iter().map(|(_, t)| *t).collect();
    table.write_pod(0, &ptrs).unwrap();
    table.write_pod(8 * n as u64, &lens).unwrap();
    table.write_pod(12 * n as u64, &tags).unwrap();
    table.write_pod(16 * n as u64, &[0u64]).unwrap();
    let f = kernel.module.function("check_tagged_blocks").unwrap();
    let base = table.device_ptr();
    let (mut p, mut l, mut t, mut c, mut bad) = (
        base,
        base + 8 * n as u64,
        base + 12 * n as u64,
        n as u64,
        base + 16 * n as u64,
    );
    let mut params = [
        arg(&mut p),
        arg(&mut l),
        arg(&mut t),
        arg(&mut c),
        arg(&mut bad),
    ];
    // SAFETY: five parameters as the kernel declares; every pointer stays alive until the
    // stream is synchronised below.
    unsafe { f.launch(LaunchConfig::linear(8, 256), Some(&check), &mut params) }.unwrap();
    check.synchronize().unwrap();
    let mut bad_blocks = [0u64];
    table.read_pod(16 * n as u64, &mut bad_blocks).unwrap();
    assert_eq!(
        bad_blocks[0], 0,
        "{} of {n} kept blocks changed",
        bad_blocks[0]
    );
    println!("coexistence: {n} kept blocks checked by a kernel beside the persistent one");
    drop((kept, table, check, cached, uncached, on_arena));
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn releases_wait_for_legacy_stream_work_and_named_streams_only() {
    let gpu = open(false);
    drop(gpu.alloc(4 << 20).unwrap());
    settle(&gpu);

    // A kernel on the legacy stream: a drop returns at once, the memory waits for the kernel.
    let mut kernel = PersistentKernel::start(&gpu, true, &[]);
    let t = Instant::now();
    drop(gpu.alloc(4 << 20).unwrap());
    drop(gpu.alloc(64 << 10).unwrap());
    let dropped = Instant::now();
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        gpu.pending_releases(),
        2,
        "the releases wait for the legacy stream"
    );
    assert!(!gpu.wait_for_releases(Duration::from_millis(100)));
    // The release times say so: the memory's backing has waited since its drop, none is in a
    // drop, and none has waited before.
    let times = gpu.release_times();
    let oldest = times.oldest_waiting.expect("two releases wait");
    assert_eq!(times.waiting, 2);
    assert_eq!(oldest.what(), "Backing", "{oldest:?}");
    assert!(oldest.time >= Duration::from_millis(150), "{oldest}");
    assert_eq!(times.longest_dropping, None);
    let held = dropped.elapsed();
    kernel.stop();
    settle(&gpu);
    drop(kernel);
    let times = gpu.release_times();
    let waited = times.longest_wait.expect("the releases waited");
    assert_eq!(waited.what(), "Backing");
    assert!(waited.time >= held, "{waited} < {held:?}");
    assert_eq!((times.waiting, times.oldest_waiting), (0, None));
    println!("coexistence: a release held by a legacy-stream kernel waited {waited}");

    // A kernel on its own non-blocking stream: the default release does not wait for it...
    let mut kernel = PersistentKernel::start(&gpu, false, &[]);
    drop(gpu.alloc(4 << 20).unwrap());
    assert!(gpu.wait_for_releases(Duration::from_secs(2)));
    // ... a release after its stream does, and the caller still does not.
    let t = Instant::now();
    gpu.alloc(4 << 20)
        .unwrap()
        .release_after(&kernel.stream)
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(1));
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(gpu.pending_releases(), 1);
    // A ring whose watched consumer keeps running: dropping it returns at once, its memory
    // waits for the consumer.
    let ring = DeviceRing::new(&gpu, 64 << 10).unwrap();
    ring.watch_consumer(&kernel.stream).unwrap();
    let t = Instant::now();
    drop(ring);
    assert!(t.elapsed() < Duration::from_secs(1));
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        gpu.pending_releases(),
        2,
        "the ring's memory waits for its consumer"
    );
    assert!(kernel.is_alive());
    kernel.stop();
    settle(&gpu);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn an_arena_grows_into_its_released_slot_ahead_of_slow_drops_of_others() {
    let gpu = open(false);
    let chunk = vkgdr::arena::granularity(gpu.driver(), 0)
        .unwrap()
        .max(2 << 20);
    let mut arena = Arena::new(&gpu, 8 * chunk, chunk).unwrap();
    arena.grow().unwrap();
    arena.grow().unwrap();
    settle(&gpu);
    // Everything below waits for a kernel on the legacy stream: 8 GiB of raw memory, then the
    // arena's last chunk.
    let mut kernel = PersistentKernel::start(&gpu, true, &[]);
    let big: Vec<_> = (0..8).map(|_| gpu.alloc(1 << 30).unwrap()).collect();
    drop(big);
    arena.shrink(1).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        gpu.pending_releases(),
        9,
        "the releases wait for the kernel"
    );
    assert!(arena.grow().is_err(), "the slot is still being released");
    // The kernel ends: the queue's thread starts on 8 GiB of drops (about 0.1 s each); the
    // arena takes its own chunk ahead of them and grows into the slot again.
    kernel.stop();
    let t = Instant::now();
    let grown = loop {
        match arena.grow() {
            Ok(_) => break Some(t.elapsed()),
            Err(e) if e.is_out_of_memory() && t.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(_) => break None,
        }
    };
    let left = gpu.pending_releases();
    settle(&gpu);
    drop(kernel);
    let times = gpu.release_times();
    let took = grown.expect("the arena grew again");
    let drop_time = times.longest_drop.expect("the drops were timed");
    println!(
        "coexistence: the arena grew back {took:?} after the kernel ended, {left} of 8 GiB \
         drops still waiting; the longest drop {drop_time}, the longest turn {}",
        times.longest_turn.map_or("-".into(), |t| t.to_string())
    );
    assert!(
        left >= 6,
        "the arena's chunk went back only after every other drop ({took:?})"
    );
    assert_eq!(arena.chunk_count(), 2);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn external_memory_import_still_works_where_vmm_is_not_used() {
    let gpu = Gpu::open_with(0, vkgdr::OpenOptions::new().external_memory_import(true)).unwrap();
    assert!(gpu.vmm_status().is_err());
    assert!(gpu.vmm_status().is_err());
    let mut m = gpu.alloc(4097).unwrap();
    m.write(4089, b"imported").unwrap();
    let mut back = [0u8; 8];
    // SAFETY: inside the live allocation.
    unsafe { gpu.memcpy_dtoh(&mut back, m.device_ptr() + 4089) }.unwrap();
    assert_eq!(&back, b"imported");
    assert_eq!((m.size(), m.allocation_size()), (4097, 8192));
    drop(m);
    assert_eq!(gpu.pending_releases(), 0, "that path frees at once");
}
