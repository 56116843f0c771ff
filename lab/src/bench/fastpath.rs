//! `fastpath`: every fast path of the library as a user calls it (default API), beside the limit of
//! this machine measured in the same run:
//!
//! - `fastpath-write`: `RawMemory::write` of a `Vec` (default API) against explicit copy pools
//!   (thread counts, splitting) and `cuMemcpyHtoD` from pinned memory; plus the same write from a
//!   source whose pages were never touched (page faults in the copy);
//! - `fastpath-read`: `Mapping::read` into a `Vec` (the staged pipeline) against a plain
//!   `cuMemcpyDtoH` into the same pageable `Vec`, registering the destination
//!   (`cuMemHostRegister`) for one DMA, and `cuMemcpyDtoH` into pinned memory;
//! - `fastpath-small`: the first write of a fresh process (child processes running `examples/hello`'s
//!   write), 64-byte `Block::write` against the raw store + `sfence` on the same block, and
//!   sixteen 64-byte writes with sixteen fences against one `WriteBatch`;
//! - `fastpath-pool`: 256-byte alloc+free pairs with the default `PoolConfig` (thread cache on)
//!   and with `thread_cache = 0`, on one thread, eight and sixteen, beside the C library's
//!   `malloc`+`free` (this CPU's scale).

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use vkgdr::copy::{copy_to_mapping, CopyPool};
use vkgdr::{Block, Gpu, Mapping, OpenOptions, Pool, PoolConfig, RawMemory, WriteBatch};

use super::error::{BenchError, BenchResult};
use super::host_pinned::HostPinned;
use super::measure::{
    device_ordinal, measure, measure_side_by_side, open_gpu, to_bandwidth, Budget, Stats, Timed,
};
use super::options::Options;
use super::report::format::fmt_size;
use super::report::model::{Figure, Report, Unit};
use crate::ui;

/// The hidden argument that makes `vkgdr bench` the child of the first-write row.
pub const CHILD_ARG: &str = "--first-write-child";

/// The rows the registry names.
pub mod rows {
    /// `fastpath-write`: the driver's copy from pinned memory, the limit.
    pub const HTOD_PINNED: &str = "cuMemcpyHtoD pinned (DMA limit)";
    /// `fastpath-read`: the driver's copy into pinned memory, the limit.
    pub const DTOH_PINNED: &str = "cuMemcpyDtoH pinned (DMA limit)";
    /// `fastpath-read`: the driver's copy into pageable memory.
    pub const DTOH_PAGEABLE: &str = "cuMemcpyDtoH pageable";
    /// `fastpath-read`: registering the destination for one driver copy.
    pub const DTOH_REGISTERED: &str = "cuMemHostRegister + DtoH + unregister";
    /// `fastpath-small`: the first write of a fresh process.
    pub const FIRST_WRITE: &str = "first write in a process (fresh child)";
    /// `fastpath-small`: the next write of that process.
    pub const SECOND_WRITE: &str = "second write, same process";
    /// `fastpath-small`: `Block::write` of 64 bytes.
    pub const BLOCK_WRITE: &str = "Block::write (default API)";
    /// `fastpath-small`: the same 64-byte store and `sfence`, without the library.
    pub const RAW_STORE: &str = "raw store + sfence, same block (limit)";
    /// `fastpath-small`: `RawMemory::write` of 64 bytes.
    pub const RAW_MEMORY_WRITE: &str = "RawMemory::write (default API)";
    /// `fastpath-small`: 16 blocks written each on its own.
    pub const BLOCKS_EACH: &str = "16 blocks: Block::write each";
    /// `fastpath-small`: 16 blocks written in one `WriteBatch`.
    pub const BLOCKS_BATCH: &str = "16 blocks: one WriteBatch";
    /// `fastpath-pool`: a pair on one thread with the default thread cache.
    pub const POOL_1_DEFAULT: &str = "alloc+free, 1 thread, default PoolConfig";
    /// `fastpath-pool`: a pair on one thread without it.
    pub const POOL_1_NO_CACHE: &str = "alloc+free, 1 thread, thread_cache = 0 (opt-out)";
    /// `fastpath-pool`: per pair, 8 threads, with the default thread cache.
    pub const POOL_8_DEFAULT: &str = "alloc+free, 8 threads, per pair, default PoolConfig";
    /// `fastpath-pool`: per pair, 8 threads, without it.
    pub const POOL_8_NO_CACHE: &str = "alloc+free, 8 threads, per pair, thread_cache = 0 (opt-out)";
    /// `fastpath-pool`: per pair, 16 threads, with the default thread cache.
    pub const POOL_16_DEFAULT: &str = "alloc+free, 16 threads, per pair, default PoolConfig";
    /// `fastpath-pool`: per pair, 16 threads, without it.
    pub const POOL_16_NO_CACHE: &str =
        "alloc+free, 16 threads, per pair, thread_cache = 0 (opt-out)";
    /// `fastpath-pool`: the C library's allocator (a machine row).
    pub const MALLOC_PAIR: &str = "malloc+free, 1 thread, the C library";
    /// `fastpath-pool`: the C library's allocator, per pair, 8 threads (a machine row).
    pub const MALLOC_PAIR_8: &str = "malloc+free, 8 threads, per pair, the C library";
    /// `fastpath-pool`: the C library's allocator, per pair, 16 threads (a machine row).
    pub const MALLOC_PAIR_16: &str = "malloc+free, 16 threads, per pair, the C library";
}
use rows::MALLOC_PAIR;

/// One malloc(256)/free pair (the C library's allocator: this CPU's scale).
fn malloc_pair() {
    let size = std::hint::black_box(256);
    // SAFETY: a plain malloc/free pair; the pointer is freed once and never dereferenced.
    unsafe { libc::free(std::hint::black_box(libc::malloc(size))) };
}

/// Pairs a worker runs between two looks at the stop flag (a few microseconds of pairs).
const PAIRS_PER_LOOK: u64 = 256;

/// `threads` threads each running `pair` for as long as `window` lasts, started together,
/// `samples` times: wall time per pair of the whole machine (ns, the window over every thread's
/// pairs), one figure per sample.
///
/// A fixed window rather than a fixed count of pairs per thread, so that every thread runs for
/// the whole of what is timed: with a fixed count the wall also holds the threads' staggered
/// wake-ups and the idle tail while the last one finishes (BENCHMARKS.md, "The pool: a vCPU's
/// neighbours, threads over a window, shards"). Each thread first runs a few pairs outside the
/// window: its shard's first chunk (milliseconds on the BAR) is set up then.
fn per_pair_on(
    threads: usize,
    window: Duration,
    samples: usize,
    pair: impl Fn() -> vkgdr::Result<()> + Sync,
) -> BenchResult<Vec<f64>> {
    let mut ns = Vec::with_capacity(samples);
    for _ in 0..samples {
        let start = Barrier::new(threads + 1);
        let stop = AtomicBool::new(false);
        let (wall, pairs) = std::thread::scope(|s| -> BenchResult<(Duration, u64)> {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| -> vkgdr::Result<u64> {
                        // Warm: the shard's chunk and the thread's cache, before the window.
                        let warm = (0..PAIRS_PER_LOOK).try_for_each(|_| pair());
                        start.wait();
                        warm?;
                        let mut done = 0;
                        while !stop.load(Ordering::Relaxed) {
                            for _ in 0..PAIRS_PER_LOOK {
                                pair()?;
                            }
                            done += PAIRS_PER_LOOK;
                        }
                        Ok(done)
                    })
                })
                .collect();
            start.wait();
            let t = Instant::now();
            std::thread::sleep(window);
            stop.store(true, Ordering::Relaxed);
            let wall = t.elapsed();
            let mut pairs = 0;
            for w in workers {
                pairs += w.join().expect("worker panicked")?;
            }
            Ok((wall, pairs))
        })?;
        if pairs == 0 {
            return Err(BenchError::Check(format!(
                "{threads} threads ran no pair in {window:?}"
            )));
        }
        ns.push(wall.as_nanos() as f64 / pairs as f64);
    }
    Ok(ns)
}

/// The message `examples/hello` writes.
const HELLO: &[u8] = b"hello from the CPU, through the BAR";

fn push(report: &mut Report, method: &str, size: u64, samples: &[f64]) {
    let s = Stats::of(samples).expect("at least one sample");
    report.figures.push(Figure::measured(method, size, &s));
}

fn push_bw(report: &mut Report, method: &str, size: u64, ns: &[f64]) {
    push(report, method, size, &to_bandwidth(size, ns));
}

/// Runs the benchmark: four reports.
pub fn run(opts: &Options) -> BenchResult<Vec<Report>> {
    let gpu = open_gpu(OpenOptions::new())?;
    let mut reports = vec![small(&gpu, opts)?, pool(&gpu, opts)?];
    let sizes: &[u64] = if opts.quick {
        &[64 << 20]
    } else {
        &[16 << 20, 256 << 20]
    };
    let max = *sizes.last().expect("sizes");
    let mem = gpu.alloc(max)?;
    let mut pinned = HostPinned::new(&gpu, max as usize)?;
    pinned.as_mut_slice().fill(0x3c);
    reports.insert(0, write(&gpu, mem, &pinned, sizes, opts)?);
    let mem = gpu.alloc(max)?;
    reports.insert(1, read(&gpu, mem, &pinned, sizes, opts)?);
    Ok(reports)
}

fn large_budget(opts: &Options) -> Budget {
    if opts.quick {
        Budget::new(Duration::from_millis(100), 3, 50)
    } else {
        Budget::new(Duration::from_millis(600), 5, 200)
    }
}

fn write(
    gpu: &Gpu,
    mut mem: RawMemory,
    pinned: &HostPinned,
    sizes: &[u64],
    opts: &Options,
) -> BenchResult<Report> {
    let budget = large_budget(opts);
    let mut report = Report::new("fastpath-write", Unit::GigabytesPerSecond);
    let max = *sizes.last().expect("sizes") as usize;
    // Filled, so no page fault lands in a timed copy (except in the row that wants them).
    let src: Vec<u8> = (0..max).map(|i| (i % 251) as u8).collect();
    mem.write(0, &src)?;
    let mut back = vec![0u8; 1 << 20];
    mem.read_dma((max - back.len()) as u64, &mut back)?;
    if back[..] != src[max - back.len()..] {
        return Err(BenchError::Check(
            "fastpath: RawMemory::write did not read back".into(),
        ));
    }
    let host = mem.host_ptr();
    let pools: Vec<(String, CopyPool)> = [4usize, 8, 12, 16]
        .iter()
        .map(|&t| (format!("CopyPool::new({t})"), CopyPool::new(t)))
        .chain(std::iter::once((
            "CopyPool::new(8), one part per thread".to_string(),
            CopyPool::new(8).with_part_size(0),
        )))
        .collect();
    let _ctx = gpu.bind()?;
    ui::phase("large writes", (sizes.len() * (pools.len() + 3)) as u64);
    for &size in sizes {
        let n = size as usize;
        let at = fmt_size(size);
        ui::step(format!("RawMemory::write · {at}"));
        let ns = measure(&budget, || Ok(mem.write(0, &src[..n])?))?;
        push_bw(&mut report, "RawMemory::write (default API)", size, &ns);
        for (name, pool) in &pools {
            ui::step(format!("{name} · {at}"));
            let ns = measure(&budget, || {
                // SAFETY: `host` maps at least `max >= n` bytes; `src` is a distinct buffer; no
                // kernel uses `mem`.
                unsafe { pool.write(host, &src[..n]) };
                Ok(())
            })?;
            push_bw(&mut report, name, size, &ns);
        }
        ui::step(format!("cuMemcpyHtoD pinned · {at}"));
        let ns = measure(&budget, || {
            // SAFETY: the context is current; `mem` and `pinned` hold at least `n` bytes.
            unsafe {
                gpu.driver()
                    .cu_memcpy_htod(mem.device_ptr(), pinned.as_ptr().cast(), n)
            }?;
            Ok(())
        })?;
        push_bw(&mut report, rows::HTOD_PINNED, size, &ns);
        // A source no one has touched: every 4 KiB page faults in during the copy.
        ui::step(format!("RawMemory::write, untouched source · {at}"));
        let samples = budget.min_samples.max(3);
        let mut ns = Vec::with_capacity(samples);
        for _ in 0..samples {
            let fresh = vec![0u8; n];
            let t = Instant::now();
            mem.write(0, &fresh)?;
            ns.push(t.elapsed().as_nanos() as f64);
        }
        push_bw(&mut report, "RawMemory::write, untouched source", size, &ns);
    }
    report.notes.push(format!(
        "default API: RawMemory::write (Mapping::write) of a filled Vec: the global CopyPool, \
         {} threads, parts of {} MiB; CopyPool::new(n): the same kernels on an explicit pool of n \
         threads; one part per thread: how copies were split before fixed-size parts",
        CopyPool::global().threads(),
        CopyPool::global().part_size() >> 20
    ));
    report.notes.push(
        "untouched source: a fresh vec![0; n] per sample, so the copy also takes its page faults"
            .into(),
    );
    Ok(report)
}

fn read(
    gpu: &Gpu,
    mem: RawMemory,
    pinned: &HostPinned,
    sizes: &[u64],
    opts: &Options,
) -> BenchResult<Report> {
    let budget = large_budget(opts);
    let mut report = Report::new("fastpath-read", Unit::GigabytesPerSecond);
    let max = *sizes.last().expect("sizes") as usize;
    let driver = gpu.driver();
    let _ctx = gpu.bind()?;
    // A known pattern in the memory, checked through the default path.
    let pattern: Vec<u8> = (0..max)
        .map(|i| ((i as u32 * 2_654_435_761) >> 13) as u8)
        .collect();
    // SAFETY: the context is current; `mem` holds `max` bytes; `pattern` is a host buffer.
    unsafe { gpu.memcpy_htod(mem.device_ptr(), &pattern) }?;
    let mut dst = vec![0xa5u8; max];
    mem.read(0, &mut dst)?;
    if dst != pattern {
        return Err(BenchError::Check(
            "fastpath: Mapping::read returned other bytes than were written".into(),
        ));
    }
    ui::phase("large reads", (sizes.len() * 5) as u64);
    for &size in sizes {
        let n = size as usize;
        let at = fmt_size(size);
        ui::step(format!("Mapping::read · {at}"));
        let ns = measure(&budget, || Ok(mem.read(0, &mut dst[..n])?))?;
        push_bw(&mut report, "Mapping::read (default API)", size, &ns);
        ui::step(format!("Mapping::read_vec · {at}"));
        let samples = budget.min_samples.max(3);
        let mut ns = Vec::with_capacity(samples);
        for _ in 0..samples {
            let t = Instant::now();
            let v = mem.read_vec(0, n)?;
            ns.push(t.elapsed().as_nanos() as f64);
            drop(v);
        }
        push_bw(&mut report, "Mapping::read_vec (fresh Vec)", size, &ns);
        ui::step(format!("cuMemcpyDtoH pageable · {at}"));
        let ns = measure(&budget, || {
            // SAFETY: the context is current; `dst` and `mem` hold at least `n` bytes.
            unsafe { driver.cu_memcpy_dtoh(dst.as_mut_ptr().cast(), mem.device_ptr(), n) }?;
            Ok(())
        })?;
        push_bw(&mut report, rows::DTOH_PAGEABLE, size, &ns);
        ui::step(format!("cuMemHostRegister + DtoH · {at}"));
        let ns = measure(&budget, || {
            let p = dst.as_mut_ptr().cast();
            // SAFETY: `dst` is a live host buffer of at least `n` bytes, registered for this call
            // only and unregistered before anything else uses it; the context is current.
            unsafe {
                driver.cu_mem_host_register(p, n, 0)?;
                let copy = driver.cu_memcpy_dtoh(p, mem.device_ptr(), n);
                let unregister = driver.cu_mem_host_unregister(p);
                copy.and(unregister)?;
            }
            Ok(())
        })?;
        push_bw(&mut report, rows::DTOH_REGISTERED, size, &ns);
        ui::step(format!("cuMemcpyDtoH pinned · {at}"));
        let ns = measure(&budget, || {
            // SAFETY: the context is current; `pinned` and `mem` hold at least `n` bytes.
            unsafe { driver.cu_memcpy_dtoh(pinned.as_ptr().cast(), mem.device_ptr(), n) }?;
            Ok(())
        })?;
        push_bw(&mut report, rows::DTOH_PINNED, size, &ns);
    }
    report.notes.push(format!(
        "default API: RawMemory's Mapping::read into a Vec written before (no page faults): \
         from {} MiB the copy engine fills {} pinned buffers of {} MiB while the global CopyPool \
         copies them out; read_vec: a new zeroed Vec per call (its page faults included)",
        vkgdr::memory::STAGED_READ_THRESHOLD >> 20,
        vkgdr::memory::STAGING_BUFFERS,
        vkgdr::memory::STAGING_BUFFER_BYTES >> 20
    ));
    Ok(report)
}

fn small(gpu: &Gpu, opts: &Options) -> BenchResult<Report> {
    let mut report = Report::new("fastpath-small", Unit::Nanoseconds);
    // The first write of a process, in fresh processes (this one has written already).
    let children = if opts.quick { 3 } else { 8 };
    ui::phase("small writes", 6);
    ui::step(format!("first write in {children} fresh processes"));
    let (mut first, mut second, mut raw_page, mut new_page, mut new_chunk) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut faults = Vec::new();
    for _ in 0..children {
        let ([f, s, r, n, c], pf) = first_write_child()?;
        faults.push(pf);
        first.push(f);
        second.push(s);
        raw_page.push(r);
        new_page.push(n);
        new_chunk.push(c);
    }
    push(&mut report, rows::FIRST_WRITE, HELLO.len() as u64, &first);
    push(&mut report, rows::SECOND_WRITE, HELLO.len() as u64, &second);
    push(
        &mut report,
        "raw store + sfence into an untouched page, same process",
        1,
        &raw_page,
    );
    push(
        &mut report,
        "write into an untouched page, same process",
        HELLO.len() as u64,
        &new_page,
    );
    push(
        &mut report,
        "raw store + sfence into a new 4 MiB allocation, same process",
        1,
        &new_chunk,
    );

    let budget = if opts.quick {
        Budget::new(Duration::from_millis(30), 20, 5_000)
    } else {
        Budget::new(Duration::from_millis(150), 50, 20_000)
    };
    let pool = Pool::new(gpu.clone(), PoolConfig::default())?;
    let mut block = pool.alloc(64, 64)?;
    let data = [0x5au8; 64];
    ui::step("Block::write · 64 B");
    let ns = measure(&budget, || Ok(block.write(0, &data)?))?;
    push(&mut report, rows::BLOCK_WRITE, 64, &ns);
    let host = block.host_ptr();
    ui::step("raw store + sfence · 64 B");
    let ns = measure(&budget, || {
        // SAFETY: the block's 64 bytes at `host` are ours; `data` is a distinct buffer.
        unsafe { copy_to_mapping(host, &data) };
        Ok(())
    })?;
    push(&mut report, rows::RAW_STORE, 64, &ns);
    let mut mem = gpu.alloc(1 << 20)?;
    ui::step("RawMemory::write · 64 B");
    let ns = measure(&budget, || Ok(mem.write(4096, &data)?))?;
    push(&mut report, rows::RAW_MEMORY_WRITE, 64, &ns);

    let mut blocks: Vec<_> = (0..16)
        .map(|_| pool.alloc(64, 64))
        .collect::<Result<_, _>>()?;
    ui::step("16 blocks: Block::write each");
    let ns = measure(&budget, || {
        for b in &mut blocks {
            b.write(0, &data)?;
        }
        Ok(())
    })?;
    push(&mut report, rows::BLOCKS_EACH, 16 * 64, &ns);
    ui::step("16 blocks: one WriteBatch");
    let ns = measure(&budget, || {
        let mut batch = WriteBatch::new();
        for b in &mut blocks {
            batch.write(b, 0, &data)?;
        }
        batch.finish();
        Ok(())
    })?;
    push(&mut report, rows::BLOCKS_BATCH, 16 * 64, &ns);
    report.notes.push(format!(
        "first write: {children} child processes each open the same GPU, allocate 1 MiB and time \
         RawMemory::write of examples/hello's {} bytes (from a heap copy), then the same write again; page faults \
         during the first write: {}",
        HELLO.len(),
        faults
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    ));
    report.notes.push(
        "64 B rows: one 64-byte-aligned block of the default pool (or a raw allocation), timed in \
         batches of >= 1 us; WriteBatch: sixteen writes without fences, one sfence at the end"
            .into(),
    );
    Ok(report)
}

/// Spawns this executable as a first-write child; returns its first write, second write, raw
/// store into an untouched page, write into another untouched page and raw store into a new
/// chunk, in ns, and the page faults the first write took.
fn first_write_child() -> BenchResult<([f64; 5], u64)> {
    let exe = std::env::current_exe().map_err(|e| BenchError::io(std::path::Path::new("."), e))?;
    let ordinal = device_ordinal()?.to_string();
    let out = Command::new(&exe)
        .args(["bench", CHILD_ARG, &ordinal])
        .output()
        .map_err(|e| BenchError::io(&exe, e))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let parsed = text
        .lines()
        .find_map(|l| l.strip_prefix("first-write-ns "))
        .and_then(|l| {
            let v: Vec<f64> = l
                .split_whitespace()
                .map(str::parse::<f64>)
                .collect::<Result<_, _>>()
                .ok()?;
            v.try_into().ok()
        });
    let faults = text
        .lines()
        .find_map(|l| l.strip_prefix("first-write-faults "))
        .and_then(|l| l.trim().parse::<u64>().ok());
    parsed.zip(faults).ok_or_else(|| {
        BenchError::Check(format!(
            "first-write child failed ({}): {}{}",
            out.status,
            text,
            String::from_utf8_lossy(&out.stderr)
        ))
    })
}

/// The child: what `examples/hello` does, timing its write and a second one, then what a page
/// of the mapping costs on its own: one raw store + `sfence` into a page no one touched, a write
/// into another such page, and a raw store into a new allocation of its own chunk. Prints
/// `first-write-ns FIRST SECOND RAW_PAGE NEW_PAGE NEW_CHUNK`; fails if the write started a
/// thread. `ordinal` is the CUDA device the parent measures.
pub fn child_main(ordinal: i32) -> BenchResult<()> {
    let gpu = Gpu::open(ordinal)?;
    let mut mem = gpu.alloc(1 << 20)?;
    // The bytes come from this process's heap, as a program's data would: a constant of this
    // large executable lies in a page nothing touched yet, whose fault (microseconds; figures:
    // BENCHMARKS.md, 'First write') is the source's, not the write's.
    let hello = HELLO.to_vec();
    let faults = page_faults();
    let t = Instant::now();
    mem.write(0, &hello)?;
    let first = t.elapsed().as_nanos();
    let faults = page_faults().saturating_sub(faults);
    let t = Instant::now();
    mem.write(0, &hello)?;
    let second = t.elapsed().as_nanos();
    let byte = [0xA5u8];
    let t = Instant::now();
    // SAFETY: offset 512 KiB of the 1 MiB allocation is ours; `byte` is a distinct buffer.
    unsafe { copy_to_mapping(mem.host_ptr().add(512 << 10), &byte) };
    let raw_page = t.elapsed().as_nanos();
    let t = Instant::now();
    mem.write(768 << 10, &hello)?;
    let new_page = t.elapsed().as_nanos();
    // A chunk of its own (larger than what is carved), its first touch after the library's.
    let other = gpu.alloc(4 << 20)?;
    let t = Instant::now();
    // SAFETY: the first byte of the 4 MiB allocation is ours; `byte` is a distinct buffer.
    unsafe { copy_to_mapping(other.host_ptr(), &byte) };
    let new_chunk = t.elapsed().as_nanos();
    let mut back = vec![0u8; HELLO.len()];
    mem.read_dma(0, &mut back)?;
    if back != HELLO {
        return Err(BenchError::Check("first write did not arrive".into()));
    }
    if CopyPool::global_if_started().is_some() {
        return Err(BenchError::Check(
            "a small write started the global copy pool".into(),
        ));
    }
    println!("first-write-ns {first} {second} {raw_page} {new_page} {new_chunk}");
    println!("first-write-faults {faults}");
    Ok(())
}

/// Page faults this process has taken so far (minor and major).
fn page_faults() -> u64 {
    // SAFETY: `rusage` is plain integers, so all zeros is a valid value; `getrusage` fills the
    // struct it is given and keeps no pointer to it (for RUSAGE_SELF it cannot fail).
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    (usage.ru_minflt + usage.ru_majflt) as u64
}

fn pool(gpu: &Gpu, opts: &Options) -> BenchResult<Report> {
    let mut report = Report::new("fastpath-pool", Unit::Nanoseconds);
    let budget = if opts.quick {
        Budget::new(Duration::from_millis(50), 100, 10_000)
    } else {
        Budget::new(Duration::from_millis(300), 1_000, 100_000)
    };
    let window = Duration::from_millis(if opts.quick { 50 } else { 200 });
    ui::phase("pool", 7);
    let samples = if opts.quick { 3 } else { 7 };
    let pool_with = |thread_cache| -> BenchResult<(Pool, Block)> {
        let pool = Pool::new(
            gpu.clone(),
            PoolConfig {
                thread_cache,
                ..Default::default()
            },
        )?;
        let keep = pool.alloc(256, 16)?; // the chunk stays: steady state
        Ok((pool, keep))
    };
    let (cached, _keep_cached) = pool_with(PoolConfig::default().thread_cache)?;
    let (uncached, _keep_uncached) = pool_with(0)?;
    // One thread: both pools and the C library's pair side by side, so the ratios between them
    // hold on a host whose cores run slower for a while.
    ui::step(format!(
        "alloc+free, 1 thread, both pools and {MALLOC_PAIR}"
    ));
    let [one_cached, one_uncached, one_malloc]: [Vec<f64>; 3] = measure_side_by_side(
        &budget,
        &mut [
            Timed::new(|| {
                drop(cached.alloc(256, 16)?);
                Ok(())
            }),
            Timed::new(|| {
                drop(uncached.alloc(256, 16)?);
                Ok(())
            }),
            Timed::new(|| {
                malloc_pair();
                Ok(())
            }),
        ],
    )?
    .try_into()
    .expect("three operations, three sample lists");
    push(&mut report, rows::POOL_1_DEFAULT, 256, &one_cached);
    push(&mut report, rows::POOL_1_NO_CACHE, 256, &one_uncached);
    push(&mut report, MALLOC_PAIR, 256, &one_malloc);
    for (name, pool, many) in [
        (
            "default PoolConfig",
            &cached,
            [(8, rows::POOL_8_DEFAULT), (16, rows::POOL_16_DEFAULT)],
        ),
        (
            "thread_cache = 0 (opt-out)",
            &uncached,
            [(8, rows::POOL_8_NO_CACHE), (16, rows::POOL_16_NO_CACHE)],
        ),
    ] {
        // n threads pairing for `window`; per pair of the whole machine.
        for (threads, row) in many {
            ui::step(format!("alloc+free, {threads} threads, {name}"));
            let ns = per_pair_on(threads, window, samples, || {
                drop(pool.alloc(256, 16)?);
                Ok(())
            })?;
            push(&mut report, row, 256, &ns);
        }
    }
    // This CPU's scale on as many threads: the same pair through the C library's allocator
    // (its per-thread cache serves it with a few dozen instructions), so a pool figure that
    // moved between two lent machines can be told apart from a machine whose cores are slower.
    for (threads, row) in [(8, rows::MALLOC_PAIR_8), (16, rows::MALLOC_PAIR_16)] {
        ui::step(row);
        let ns = per_pair_on(threads, window, samples, || {
            malloc_pair();
            Ok(())
        })?;
        push(&mut report, row, 256, &ns);
    }
    report.notes.push(format!(
        "pool over CUDA-imported chunks; one pool.alloc(256, 16) and its drop per pair; 1 thread: \
             the default pool, the pool without the thread cache and malloc+free timed side by \
             side (their samples in turn); 8 and 16 threads: each pairs for a window of \
             {window:?} after a warm-up, window / all their pairs (1-thread time / this = the \
             throughput gain; 1e9 / this = pairs per second of the whole machine)"
    ));
    report.notes.push(format!(
        "{MALLOC_PAIR}: malloc(256) and free in the same loop, this CPU's scale (the machine's \
         figure, not the library's)"
    ));
    Ok(report)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;

    /// Runs `body` on a thread of its own; a run past a minute fails the test instead of hanging.
    fn within_a_minute(body: impl FnOnce() + Send + 'static) {
        let (done, finished) = std::sync::mpsc::channel();
        let worker = std::thread::spawn(move || {
            body();
            let _ = done.send(());
        });
        match finished.recv_timeout(Duration::from_secs(60)) {
            Ok(()) => worker.join().unwrap(),
            // The body panicked: its thread says how.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                std::panic::resume_unwind(worker.join().unwrap_err())
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("hung for a minute"),
        }
    }

    #[test]
    fn thread_rows_count_every_thread_and_hand_a_pairs_error_back() {
        within_a_minute(|| {
            // Every worker's pairs reach the count: the warm-up's and the window's.
            let calls = AtomicU64::new(0);
            let ns = per_pair_on(3, Duration::from_millis(5), 2, || {
                calls.fetch_add(1, Ordering::Relaxed);
                Ok(())
            })
            .unwrap();
            assert_eq!(ns.len(), 2);
            assert!(ns.iter().all(|t| t.is_finite() && *t > 0.0), "{ns:?}");
            let calls = calls.load(Ordering::Relaxed);
            assert!(
                calls >= 2 * 3 * 2 * PAIRS_PER_LOOK,
                "{calls} calls: each of 3 threads warms up and pairs in each of 2 samples"
            );
            // A pair that fails ends the row with its error, in the warm-up (the first call) or
            // in the window (after both threads' warm-ups).
            for fail_after in [0, 2 * PAIRS_PER_LOOK + 7] {
                let calls = AtomicU64::new(0);
                let err = per_pair_on(2, Duration::from_millis(5), 1, || {
                    if calls.fetch_add(1, Ordering::Relaxed) >= fail_after {
                        return Err(vkgdr::Error::Internal("a pair failed".into()));
                    }
                    Ok(())
                })
                .unwrap_err();
                assert!(err.to_string().contains("a pair failed"), "{err}");
            }
        });
    }
}
