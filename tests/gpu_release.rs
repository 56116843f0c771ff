//! Pool blocks released on the device (`Block::release_on_device`, `vkgdr_release_token`, the
//! kernels of `kernels/release.cu`): a persistent kernel releases thousands of blocks while CPU
//! threads allocate them again from a pool that holds a few hundred, and a stamp in every block
//! shows any reuse before its release on either side (the kernel finds another item's stamp,
//! or the CPU finds the block's last kernel not done); and a kernel that sends hostile tokens
//! (forged, stale, repeated, another pool's) and a record of a foreign kind, which are counted
//! and free nothing.
// The loom feature swaps the core's atomics for loom's, which work only inside a model.
#![cfg(not(feature = "loom"))]

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use vkgdr::cuda_objects::{Event, LaunchConfig, Module, Stream};
use vkgdr::ring::core::d2h::{LaneShape, ReleaseToken, SlotFormat};
use vkgdr::ring::DeviceToHostRing;
use vkgdr::{Block, Gpu, Mapping, Pool, PoolConfig, RawMemory};

const RELEASE_PTX: &str = include_str!("../kernels/release.ptx");
const D2H_PTX: &str = include_str!("../kernels/ring_d2h.ptx");

/// Bytes of a test block: 512 of them fill the pool's one chunk.
const BLOCK: u64 = 4096;
/// The pool's one chunk.
const CHUNK: u64 = 2 << 20;

/// A pool of one 2 MiB chunk (the limit), no thread caches: blocks must be reused.
fn small_pool(gpu: &Gpu) -> Pool {
    let cfg = PoolConfig {
        chunk_size: CHUNK,
        max_chunk_size: CHUNK,
        max_bytes: CHUNK,
        shards: 1,
        thread_cache: 0,
        ..Default::default()
    };
    Pool::new(gpu.clone(), cfg).unwrap()
}

/// The kernels' result words (zeroed): [refusals, one per status (4), stamp mismatches, items
/// served, -].
struct Results(RawMemory);

impl Results {
    fn new(gpu: &Gpu) -> Results {
        let mut m = gpu.alloc(64).unwrap();
        m.fill(0, 64, 0).unwrap();
        Results(m)
    }
    fn read(&self) -> [u64; 8] {
        let mut out = [0u64; 8];
        self.0.read_pod(0, &mut out).unwrap();
        out
    }
}

/// The mailbox the CPU lends blocks through (`ReleaseSlot` of `kernels/release.cu`: check, ptr,
/// token, item; 32 bytes each), and the kernel's stop word after the slots.
struct Mailbox {
    mem: RawMemory,
    items: u32,
}

// SAFETY (for the threads that post): each slot is stored by one thread only, through volatile
// stores into the live BAR mapping.
impl Mailbox {
    fn new(gpu: &Gpu, items: u32) -> Mailbox {
        let len = (u64::from(items) + 1) * 32;
        let mut mem = gpu.alloc(len).unwrap();
        mem.fill(0, len, 0).unwrap();
        Mailbox { mem, items }
    }

    fn word(&self, index: u64) -> *mut u64 {
        assert!(index < (u64::from(self.items) + 1) * 4);
        // SAFETY: inside the allocation (checked above), 8-byte aligned.
        unsafe { self.mem.host_ptr().cast::<u64>().add(index as usize) }
    }

    /// Lends block `ptr` to the kernel for slot `i`: its words, then (fenced) their check
    /// (`RELEASE_CHECK` of `kernels/release.cu`).
    fn post(&self, i: u32, ptr: u64, token: u64, item: u64) {
        const RELEASE_CHECK: u64 = 0x9E37_79B9_7F4A_7C15;
        let base = u64::from(i) * 4;
        // SAFETY: slot `i`'s words, stored by this thread only; the kernel takes them once
        // the check agrees.
        unsafe {
            self.word(base + 1).write_volatile(ptr);
            self.word(base + 2).write_volatile(token);
            self.word(base + 3).write_volatile(item);
            // The write-combined stores out, in order, before the check (mfence drains them).
            std::sync::atomic::fence(Ordering::SeqCst);
            self.word(base)
                .write_volatile(ptr ^ token ^ item ^ RELEASE_CHECK);
            std::sync::atomic::fence(Ordering::SeqCst);
        }
    }

    fn slots_ptr(&self) -> u64 {
        self.mem.device_ptr()
    }

    fn stop_ptr(&self) -> u64 {
        self.mem.device_ptr() + u64::from(self.items) * 32
    }

    fn stop(&self) {
        // SAFETY: the stop word, after the slots.
        unsafe { self.word(u64::from(self.items) * 4).write_volatile(1) };
        std::sync::atomic::fence(Ordering::SeqCst);
    }
}

/// Allocates a test block, draining device releases while the pool is full.
fn alloc_again(pool: &Pool, deadline: Instant) -> Block {
    loop {
        match pool.alloc(BLOCK, 64) {
            Ok(b) => return b,
            Err(e) if e.is_out_of_memory() => {
                assert!(
                    Instant::now() < deadline,
                    "the pool stayed full: {} blocks lent, {:?}",
                    pool.lent_blocks(),
                    pool.stats().device_releases
                );
                pool.drain_device_releases();
                std::hint::spin_loop();
            }
            Err(e) => panic!("alloc: {e}"),
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn a_persistent_kernel_releases_blocks_that_cpu_threads_allocate_again() {
    let items: u32 = if under_sanitizer() { 2048 } else { 32768 };
    const CPU_THREADS: usize = 4;
    let done = Arc::new(AtomicBool::new(false));
    let states = ThreadStates::new(CPU_THREADS);
    watchdog(
        "persistent release",
        Duration::from_secs(300),
        states.clone(),
        done.clone(),
    );
    let gpu = open(false);
    let module = Module::load_ptx(&gpu, RELEASE_PTX).unwrap();
    let pool = small_pool(&gpu);
    // Small lanes (64 slots of 6 tokens): they wrap hundreds of times and fill when the CPU
    // lags, so the drain thread and the slow path's drains both take part.
    let ring = DeviceToHostRing::new(&gpu, 4, LaneShape::new(64, 64).unwrap(), 1_000_000).unwrap();
    pool.set_release_feed(ring.consumers().unwrap())
        .map_err(|_| "a feed already")
        .unwrap();
    // Every block of the chunk starts with a zero stamp: never lent.
    let all: Vec<Block> = (0..CHUNK / BLOCK)
        .map(|_| pool.alloc(BLOCK, 64).unwrap())
        .collect();
    for mut b in all {
        b.fill(0, 16, 0).unwrap();
    }
    assert!(pool.alloc(BLOCK, 64).is_ok(), "the chunk is free again");
    let mailbox = Mailbox::new(&gpu, items);
    let results = Results::new(&gpu);
    let stream = Stream::new(&gpu).unwrap();
    // Blocks and threads (a multiple of 32) of the worker (VKGDR_RELEASE_GRID="blocks,threads"
    // to try another).
    let grid: (u32, u32) = std::env::var("VKGDR_RELEASE_GRID")
        .ok()
        .and_then(|v| {
            let (b, t) = v.split_once(',')?;
            Some((b.parse().ok()?, t.parse().ok()?))
        })
        .unwrap_or((8, 64));
    {
        let f = module.function("release_worker").unwrap();
        let (mut view, mut slots, mut n, mut stop, mut res) = (
            ring.device_view(),
            mailbox.slots_ptr(),
            items,
            mailbox.stop_ptr(),
            results.0.device_ptr(),
        );
        // SAFETY: (vkgdr_d2h_view, const ReleaseSlot*, u32, const u64*, u64*) as the kernel
        // takes them; the ring, the mailbox and the results outlive it (waited for below).
        unsafe {
            f.launch(
                LaunchConfig::linear(grid.0, grid.1),
                Some(&stream),
                &mut [
                    arg(&mut view),
                    arg(&mut slots),
                    arg(&mut n),
                    arg(&mut stop),
                    arg(&mut res),
                ],
            )
            .unwrap();
        }
    }
    let next = AtomicU32::new(0);
    let early = AtomicU64::new(0);
    let deadline = Instant::now() + Duration::from_secs(30);
    let places: Vec<Vec<u64>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..CPU_THREADS)
            .map(|t| {
                let (pool, mailbox, next, early, states) =
                    (&pool, &mailbox, &next, &early, &states);
                s.spawn(move || {
                    let mut places = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= items {
                            return places;
                        }
                        states.set(t, &format!("item {i}"));
                        let item = u64::from(i) + 1;
                        let mut block = alloc_again(pool, deadline);
                        let mut stamp = [0u64; 2];
                        block.read_pod(0, &mut stamp).unwrap();
                        // Lent before: its kernel must have marked it done.
                        if stamp[0] != 0 && stamp[1] != stamp[0] {
                            early.fetch_add(1, Ordering::Relaxed);
                        }
                        block.write_pod(0, &[item, 0u64]).unwrap();
                        let ptr = block.device_ptr().unwrap();
                        places.push(ptr);
                        let token = block.release_on_device().expect("lent");
                        mailbox.post(i, ptr, token.to_bits(), item);
                    }
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let finished = wait_for(&gpu, &stream, Duration::from_secs(60));
    if !finished {
        mailbox.stop();
    }
    assert!(finished, "release_worker did not end: {:?}", results.read());
    let r = results.read();
    println!(
        "mailbox checks the kernel saw before the words they cover: {}",
        r[7]
    );
    assert_eq!(
        (r[0], r[5], r[6]),
        (0, 0, u64::from(items)),
        "refusals, stamp mismatches, items served: {r:?}"
    );
    assert_eq!(early.load(Ordering::Relaxed), 0, "a block reused early");
    let t = Instant::now();
    while pool.lent_blocks() > 0 && t.elapsed() < Duration::from_secs(10) {
        pool.drain_device_releases();
        std::thread::sleep(Duration::from_millis(1));
    }
    let stats = pool.stats();
    let d = &stats.device_releases;
    assert_eq!(
        (
            d.outstanding,
            d.tokens.issued,
            d.tokens.redeemed,
            d.refused()
        ),
        (0, u64::from(items), u64::from(items), 0),
        "{d:?}"
    );
    assert!(d.lane_error.is_none(), "{d:?}");
    assert_eq!(stats.bytes_in_use, 0);
    let mut distinct: Vec<u64> = places.into_iter().flatten().collect();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(
        distinct.len() as u64 <= CHUNK / BLOCK,
        "{} places in a chunk of {} blocks",
        distinct.len(),
        CHUNK / BLOCK
    );
    println!(
        "{items} blocks released on the device into {} places, each reused about {} times",
        distinct.len(),
        u64::from(items) / distinct.len() as u64
    );
    done.store(true, Ordering::Release);
}

/// Launches `release_tokens` over `tokens` (one thread each, one warp) and waits for it.
fn release_tokens(gpu: &Gpu, module: &Module, ring: &DeviceToHostRing, tokens: &[u64]) -> [u64; 8] {
    let results = Results::new(gpu);
    let mut list = gpu.alloc(tokens.len() as u64 * 8).unwrap();
    list.write_pod(0, tokens).unwrap();
    let f = module.function("release_tokens").unwrap();
    let (mut view, mut ptr, mut n, mut res) = (
        ring.device_view(),
        list.device_ptr(),
        tokens.len() as u32,
        results.0.device_ptr(),
    );
    let stream = Stream::new(gpu).unwrap();
    // SAFETY: (vkgdr_d2h_view, const u64*, u32, u64*) as the kernel takes them; everything it
    // uses outlives it (waited for below).
    unsafe {
        f.launch(
            LaunchConfig::linear(1, 32),
            Some(&stream),
            &mut [arg(&mut view), arg(&mut ptr), arg(&mut n), arg(&mut res)],
        )
        .unwrap();
    }
    assert!(
        wait_for(gpu, &stream, Duration::from_secs(30)),
        "release_tokens ended"
    );
    results.read()
}

/// Drains `pool` until `lent` blocks are lent (boundedly).
fn until_lent(pool: &Pool, lent: u64) {
    let t = Instant::now();
    while pool.lent_blocks() != lent && t.elapsed() < Duration::from_secs(10) {
        pool.drain_device_releases();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        pool.lent_blocks(),
        lent,
        "{:?}",
        pool.stats().device_releases
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn hostile_tokens_from_a_kernel_are_counted_and_free_nothing() {
    let gpu = open(false);
    let module = Module::load_ptx(&gpu, RELEASE_PTX).unwrap();
    let pool = small_pool(&gpu);
    let other = small_pool(&gpu);
    let ring = DeviceToHostRing::new(&gpu, 1, LaneShape::new(64, 64).unwrap(), 1_000_000).unwrap();
    let other_ring =
        DeviceToHostRing::new(&gpu, 1, LaneShape::new(64, 64).unwrap(), 1_000_000).unwrap();
    pool.set_release_feed(ring.consumers().unwrap())
        .map_err(|_| "a feed already")
        .unwrap();
    other
        .set_release_feed(other_ring.consumers().unwrap())
        .map_err(|_| "a feed already")
        .unwrap();
    let lend = |p: &Pool| p.alloc(BLOCK, 64).unwrap().release_on_device().unwrap();
    let a = lend(&pool);
    let b = lend(&pool);
    let c = lend(&pool);
    let x = lend(&other);
    assert_eq!(release_tokens(&gpu, &module, &ring, &[b.to_bits()]), [0; 8]);
    until_lent(&pool, 2);
    // `b`'s entry is issued again (oldest free entry first): `b`'s token is stale now.
    let d = lend(&pool);
    assert_eq!((d.entry(), d.generation()), (b.entry(), b.generation() + 1));
    let forged = ReleaseToken::new(a.tag(), 1000, 1).to_bits();
    let hostile = [
        x.to_bits(), // another pool's: forged here
        forged,      // an entry never issued
        0xdead_beef, // tag 0
        b.to_bits(), // stale
        c.to_bits(), // good
        c.to_bits(), // repeated
    ];
    assert_eq!(release_tokens(&gpu, &module, &ring, &hostile), [0; 8]);
    // A record of a kernel's own kind on the release lane: counted, ignored.
    let d2h = Module::load_ptx(&gpu, D2H_PTX).unwrap();
    let results = Results::new(&gpu);
    let stream = Stream::new(&gpu).unwrap();
    {
        let f = d2h.function("d2h_produce_test").unwrap();
        let (mut view, mut per, mut len, mut res) =
            (ring.device_view(), 1u32, 8u32, results.0.device_ptr());
        // SAFETY: (vkgdr_d2h_view, u32, u32, u64*) as the kernel takes them; waited for below.
        unsafe {
            f.launch(
                LaunchConfig::linear(1, 1),
                Some(&stream),
                &mut [arg(&mut view), arg(&mut per), arg(&mut len), arg(&mut res)],
            )
            .unwrap();
        }
    }
    assert!(wait_for(&gpu, &stream, Duration::from_secs(30)));
    let t = Instant::now();
    while pool.stats().device_releases.foreign_records == 0 && t.elapsed() < Duration::from_secs(10)
    {
        pool.drain_device_releases();
        std::thread::sleep(Duration::from_millis(1));
    }
    until_lent(&pool, 2); // a and d
    let s = pool.stats().device_releases;
    assert_eq!(
        (
            s.tokens.forged,
            s.tokens.stale,
            s.tokens.repeated,
            s.foreign_records
        ),
        (3, 1, 1, 1),
        "{s:?}"
    );
    assert_eq!((s.tokens.redeemed, s.malformed_records), (2, 0));
    assert_eq!(other.lent_blocks(), 1, "another pool's block stays lent");
    assert_eq!(other.stats().device_releases.refused(), 0);
    // The blocks still lent come back with their own tokens.
    assert_eq!(
        release_tokens(&gpu, &module, &ring, &[a.to_bits(), d.to_bits()]),
        [0; 8]
    );
    until_lent(&pool, 0);
    assert_eq!(
        release_tokens(&gpu, &module, &other_ring, &[x.to_bits()]),
        [0; 8]
    );
    until_lent(&other, 0);
    assert_eq!(pool.stats().bytes_in_use, 0);
}

// ---- Figures: device release -> block allocatable again, and the CPU cost per block, beside
// a CUDA event per block, an event per batch of 64 and cuLaunchHostFunc. Printed, not
// asserted (BENCHMARKS.md keeps them). ----

/// Sorted samples' median and 99th percentile.
fn median_p99(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (v[v.len() / 2], v[(v.len() * 99 / 100).min(v.len() - 1)])
}

/// This process's CPU time so far (every thread: the drain thread's and the driver's too).
fn cpu_time() -> Duration {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// A pool with room for exactly one more `size`-byte block: the rest of its one chunk is held
/// by the returned fillers.
fn pool_of_one(gpu: &Gpu, size: u64) -> (Pool, Vec<Block>) {
    let pool = small_pool(gpu);
    let mut held = Vec::new();
    while let Ok(b) = pool.alloc(size, 64) {
        held.push(b);
    }
    held.pop().expect("room for one block");
    (pool, held)
}

/// Launches the empty `release_tokens` (n = 0): a kernel that does nothing, for the fences.
fn launch_empty(module: &Module, ring: &DeviceToHostRing, stream: &Stream) {
    let f = module.function("release_tokens").unwrap();
    let (mut view, mut ptr, mut n, mut res) = (ring.device_view(), 0u64, 0u32, 0u64);
    // SAFETY: the kernel's parameters; with n = 0 it reads and writes nothing.
    unsafe {
        f.launch(
            LaunchConfig::linear(1, 32),
            Some(stream),
            &mut [arg(&mut view), arg(&mut ptr), arg(&mut n), arg(&mut res)],
        )
        .unwrap();
    }
}

unsafe extern "C" fn set_flag(flag: *mut std::ffi::c_void) {
    // SAFETY: the flag outlives the stream's work (the caller waits for it).
    unsafe { &*(flag as *const AtomicBool) }.store(true, Ordering::Release);
}

unsafe extern "C" fn drop_block(block: *mut std::ffi::c_void) {
    // SAFETY: a Box<Block> given up to this callback, once.
    drop(unsafe { Box::from_raw(block.cast::<Block>()) });
}

/// Enqueues `f(data)` on `stream` with cuLaunchHostFunc (through cudarc's driver bindings).
fn host_func(
    stream: &Stream,
    f: unsafe extern "C" fn(*mut std::ffi::c_void),
    data: *mut std::ffi::c_void,
) {
    // SAFETY: a live stream of the current context; `f` takes `data` as the caller arranged.
    let r = unsafe { cudarc::driver::sys::cuLaunchHostFunc(stream.raw().cast(), Some(f), data) };
    assert_eq!(r, cudarc::driver::sys::cudaError_enum::CUDA_SUCCESS);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn release_latency_and_cpu_cost_are_measured() {
    let done = Arc::new(AtomicBool::new(false));
    watchdog(
        "release figures",
        Duration::from_secs(300),
        ThreadStates::new(0),
        done.clone(),
    );
    let n: u32 = if under_sanitizer() { 50 } else { 2000 };
    let gpu = open(false);
    let module = Module::load_ptx(&gpu, RELEASE_PTX).unwrap();
    let stream = Stream::new(&gpu).unwrap();
    const BIG: u64 = 256 << 10;
    let mut rows = Vec::new();

    // Device release: the CPU lends the pool's last block to a persistent kernel, which
    // releases it as soon as the mailbox says so; the CPU allocates until it gets it back.
    // Through a release ring of each slot format.
    for (format, row) in [
        (
            SlotFormat::Committed,
            "device release (vkgdr_release_token)",
        ),
        (SlotFormat::Tagged, "device release, tagged slots"),
    ] {
        let (pool, _held) = pool_of_one(&gpu, BIG);
        let shape = LaneShape::new(64, 64).unwrap().with_format(format);
        let ring = DeviceToHostRing::new(&gpu, 1, shape, 1_000_000).unwrap();
        pool.set_release_feed(ring.consumers().unwrap())
            .map_err(|_| "a feed already")
            .unwrap();
        let mailbox = Mailbox::new(&gpu, n);
        let results = Results::new(&gpu);
        let worker_stream = Stream::new(&gpu).unwrap();
        let f = module.function("release_worker").unwrap();
        let (mut view, mut slots, mut items, mut stop, mut res) = (
            ring.device_view(),
            mailbox.slots_ptr(),
            n,
            mailbox.stop_ptr(),
            results.0.device_ptr(),
        );
        // SAFETY: the kernel's parameters; everything outlives it (waited for below).
        unsafe {
            f.launch(
                LaunchConfig::linear(1, 1), // one thread alone: each release goes at once
                Some(&worker_stream),
                &mut [
                    arg(&mut view),
                    arg(&mut slots),
                    arg(&mut items),
                    arg(&mut stop),
                    arg(&mut res),
                ],
            )
            .unwrap();
        }
        let mut block = pool.alloc(BIG, 64).unwrap();
        let mut trips = Vec::new();
        for i in 0..n {
            let item = u64::from(i) + 1;
            block.write_pod(0, &[item, 0u64]).unwrap();
            let ptr = block.device_ptr().unwrap();
            let token = block.release_on_device().unwrap();
            assert!(
                pool.alloc(BIG, 64).is_err(),
                "the pool is full while it is lent"
            );
            let t = Instant::now();
            mailbox.post(i, ptr, token.to_bits(), item);
            block = loop {
                if let Ok(b) = pool.alloc(BIG, 64) {
                    break b;
                }
                if t.elapsed() > Duration::from_secs(10) {
                    mailbox.stop();
                    panic!("release {i} never came: {:?}", results.read());
                }
            };
            trips.push(t.elapsed());
        }
        assert!(wait_for(&gpu, &worker_stream, Duration::from_secs(10)));
        let r = results.read();
        assert_eq!((r[0], r[5]), (0, 0), "{r:?}");
        rows.push((row, median_p99(trips)));
    }

    // A CUDA event per block: record after the kernel, poll, then free.
    {
        let (pool, _held) = pool_of_one(&gpu, BIG);
        let ring =
            DeviceToHostRing::new(&gpu, 1, LaneShape::new(64, 64).unwrap(), 1_000_000).unwrap();
        let event = Event::new(&gpu).unwrap();
        let mut trips = Vec::new();
        let mut block = pool.alloc(BIG, 64).unwrap();
        for _ in 0..n {
            launch_empty(&module, &ring, &stream);
            let t = Instant::now();
            event.record(&stream).unwrap();
            while !event.is_complete().unwrap() {}
            drop(block);
            block = pool.alloc(BIG, 64).unwrap();
            trips.push(t.elapsed());
        }
        rows.push(("CUDA event per block (record + query)", median_p99(trips)));
    }

    // cuLaunchHostFunc after the kernel: the driver's thread runs the callback.
    {
        let (pool, _held) = pool_of_one(&gpu, BIG);
        let ring =
            DeviceToHostRing::new(&gpu, 1, LaneShape::new(64, 64).unwrap(), 1_000_000).unwrap();
        let flag = AtomicBool::new(false);
        let mut trips = Vec::new();
        let mut block = pool.alloc(BIG, 64).unwrap();
        for _ in 0..n {
            flag.store(false, Ordering::Relaxed);
            launch_empty(&module, &ring, &stream);
            let t = Instant::now();
            host_func(
                &stream,
                set_flag,
                (&flag as *const AtomicBool).cast_mut().cast(),
            );
            while !flag.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
            drop(block);
            block = pool.alloc(BIG, 64).unwrap();
            trips.push(t.elapsed());
        }
        stream.synchronize().unwrap();
        rows.push(("cuLaunchHostFunc", median_p99(trips)));
    }
    for (what, (median, p99)) in &rows {
        println!("release -> allocatable again, {what}: median {median:?}, p99 {p99:?}");
    }

    // CPU per block, every thread of the process counted (the drain thread, the driver's):
    // the median of `rounds` rounds (a round's CPU time moves with how the drain thread's naps
    // fall against the kernel's releases).
    let blocks: u32 = if under_sanitizer() { 1024 } else { 65536 };
    let rounds = if under_sanitizer() { 1 } else { 7 };
    // A pool without thread caches whose release feed is an 8-lane ring of `format`.
    let fed_pool = |format: SlotFormat| {
        let config = PoolConfig {
            thread_cache: 0,
            ..Default::default()
        };
        let pool = Pool::new(gpu.clone(), config).unwrap();
        let shape = LaneShape::new(1024, 512).unwrap().with_format(format);
        let ring = DeviceToHostRing::new(&gpu, 8, shape, 1_000_000).unwrap();
        pool.set_release_feed(ring.consumers().unwrap())
            .map_err(|_| "a feed already")
            .unwrap();
        (pool, ring)
    };
    let (big_pool, ring) = fed_pool(SlotFormat::Committed);
    let fresh =
        |k: u32| -> Vec<Block> { (0..k).map(|_| big_pool.alloc(64, 64).unwrap()).collect() };
    let mut costs = Vec::new();
    // The batch again through a pool whose release ring has tagged slots (31 tokens a record
    // where a committed slot carries 62; its token table grows in that round).
    let (tagged_pool, tagged_ring) = fed_pool(SlotFormat::Tagged);
    // One block at a time (`release_on_device`), then the batch form (`release_many_on_device`,
    // one lock for all), each over fresh blocks; the batch reuses the table entries the first
    // round made (the first round grows the table).
    for (batch, tagged) in [(false, false), (true, false), (true, true)] {
        let (big_pool, ring) = if tagged {
            (&tagged_pool, &tagged_ring)
        } else {
            (&big_pool, &ring)
        };
        // Rounds over fresh blocks each; the medians of the round's two parts and of its sum.
        let (mut lends, mut backs, mut alls) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let mut all: Vec<Block> = (0..blocks)
                .map(|_| big_pool.alloc(64, 64).unwrap())
                .collect();
            let mut list = gpu.alloc(u64::from(blocks) * 8).unwrap();
            let c0 = cpu_time();
            let tokens: Vec<u64> = if batch {
                let mut lent = Vec::new();
                big_pool
                    .release_many_on_device(&mut all, &mut lent)
                    .unwrap();
                lent.into_iter().map(|t| t.to_bits()).collect()
            } else {
                all.into_iter()
                    .map(|b| b.release_on_device().unwrap().to_bits())
                    .collect()
            };
            let lend = cpu_time() - c0;
            assert_eq!(tokens.len(), blocks as usize);
            list.write_pod(0, &tokens).unwrap();
            let results = Results::new(&gpu);
            let f = module.function("release_tokens").unwrap();
            let (mut view, mut ptr, mut k, mut res) = (
                ring.device_view(),
                list.device_ptr(),
                blocks,
                results.0.device_ptr(),
            );
            let c1 = cpu_time();
            // SAFETY: the kernel's parameters; everything outlives it (waited for below).
            unsafe {
                f.launch(
                    LaunchConfig::linear(blocks.div_ceil(256), 256),
                    Some(&stream),
                    &mut [arg(&mut view), arg(&mut ptr), arg(&mut k), arg(&mut res)],
                )
                .unwrap();
            }
            let t = Instant::now();
            while big_pool.lent_blocks() > 0 && t.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_micros(200));
            }
            let back = cpu_time() - c1;
            assert_eq!(
                big_pool.lent_blocks(),
                0,
                "{:?}",
                big_pool.stats().device_releases
            );
            assert_eq!(results.read()[0], 0);
            lends.push(lend);
            backs.push(back);
            alls.push(lend + back);
        }
        let (lend, back, all) = (median_p99(lends).0, median_p99(backs).0, median_p99(alls).0);
        let (lend_row, all_row) = if tagged {
            (
                "device release: release_many_on_device (one batch), tagged slots",
                "device release in one batch, tagged slots, in all",
            )
        } else if batch {
            (
                "device release: release_many_on_device (one batch)",
                "device release in one batch, in all",
            )
        } else {
            (
                "device release: release_on_device",
                "device release, in all",
            )
        };
        costs.push((lend_row, lend / blocks));
        costs.push((
            "device release: launch + drain thread + free",
            back / blocks,
        ));
        costs.push((all_row, all / blocks));
    }
    for (what, per) in [
        ("CUDA event per block", 1u32),
        ("CUDA event per batch of 64", 64),
    ] {
        let event = Event::new(&gpu).unwrap();
        let mut all = fresh(blocks);
        launch_empty(
            &module,
            &DeviceToHostRing::new(&gpu, 1, LaneShape::new(64, 64).unwrap(), 1).unwrap(),
            &stream,
        );
        stream.synchronize().unwrap();
        let c0 = cpu_time();
        while !all.is_empty() {
            event.record(&stream).unwrap();
            while !event.is_complete().unwrap() {}
            let keep = all.len().saturating_sub(per as usize);
            all.truncate(keep);
        }
        costs.push((what, (cpu_time() - c0) / blocks));
    }
    {
        let all = fresh(blocks);
        let c0 = cpu_time();
        for b in all {
            host_func(&stream, drop_block, Box::into_raw(Box::new(b)).cast());
        }
        stream.synchronize().unwrap();
        costs.push(("cuLaunchHostFunc", (cpu_time() - c0) / blocks));
    }
    for (what, per_block) in &costs {
        println!("CPU per released block, {what}: {per_block:?}");
    }
    done.store(true, Ordering::Release);
}
