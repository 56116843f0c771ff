//! The library's fast paths through the default API, each beside this machine's limit in the same
//! run (criterion's side of `vkgdr bench fastpath`; the pool rows live in `benches/pool.rs`):
//!
//! - `write_256MiB`: `RawMemory::write` of a `Vec` / `CopyPool::new(8)` / `cuMemcpyHtoD` pinned;
//! - `read_256MiB`: `Mapping::read` into a `Vec` / `cuMemcpyDtoH` pageable / pinned;
//! - `small_write_64B`: `Block::write` / the raw store + `sfence` on the same block; sixteen
//!   blocks written one by one / through one `WriteBatch`;
//! - `first_write`: the first `RawMemory::write` of `examples/hello`'s 35 bytes in a fresh
//!   process (this binary re-run as a child), against the second one.
//!
//! Needs an NVIDIA GPU; without one it says so and measures nothing. On the GPU machine
//! `scripts/gpu-check run` runs it (`CRITERION_BENCHES` lists it).

use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{black_box, Criterion, SamplingMode, Throughput};
use vkgdr::copy::{copy_to_mapping, CopyPool};
use vkgdr::{Gpu, Mapping, Pool, PoolConfig, WriteBatch};

/// Set in the environment of the first-write child.
const CHILD_ENV: &str = "VKGDR_BENCH_FIRST_WRITE_CHILD";
const HELLO: &[u8] = b"hello from the CPU, through the BAR";
const LARGE: usize = 256 << 20;

fn gpu() -> Option<Gpu> {
    match Gpu::open(0) {
        Ok(g) => Some(g),
        Err(e) => {
            println!("fastpath benches: no GPU here ({e}); skipped");
            None
        }
    }
}

fn large(c: &mut Criterion, gpu: &Gpu) {
    let mut mem = gpu.alloc(LARGE as u64).expect("256 MiB of BAR memory");
    let src: Vec<u8> = (0..LARGE).map(|i| (i % 251) as u8).collect();
    let mut dst = vec![0u8; LARGE];
    let pool8 = CopyPool::new(8);
    let driver = gpu.driver();
    let (host, dptr) = (mem.host_ptr(), mem.device_ptr());
    let _ctx = gpu.bind().expect("context");
    // `cuMemHostAlloc` memory, what a CUDA user copies from (the library's `PinnedBuffer` is
    // VMM-mapped memory whose host pointer CUDA copies as pageable).
    let pinned = driver
        .cu_mem_alloc_host(LARGE, 0)
        .expect("256 MiB of cuMemHostAlloc memory")
        .cast::<u8>();

    let mut g = c.benchmark_group("write_256MiB");
    g.throughput(Throughput::Bytes(LARGE as u64));
    g.sample_size(10);
    g.bench_function("RawMemory::write (default API)", |b| {
        b.iter(|| mem.write(0, black_box(&src)).unwrap())
    });
    g.bench_function("CopyPool::new(8)", |b| {
        // SAFETY: `host` maps LARGE bytes; `src` is a distinct buffer; no kernel uses `mem`.
        b.iter(|| unsafe { pool8.write(host, black_box(&src)) })
    });
    g.bench_function("cuMemcpyHtoD pinned (DMA limit)", |b| {
        // SAFETY: the context is current; both buffers hold LARGE bytes.
        b.iter(|| unsafe { driver.cu_memcpy_htod(dptr, pinned.cast(), LARGE) }.unwrap())
    });
    g.finish();
    // The DMA row left the pinned buffer's bytes there: the reads below must return `src`.
    mem.write(0, &src).expect("write");

    let mut g = c.benchmark_group("read_256MiB");
    g.throughput(Throughput::Bytes(LARGE as u64));
    g.sample_size(10);
    g.bench_function("Mapping::read (default API)", |b| {
        b.iter(|| mem.read(0, black_box(&mut dst)).unwrap())
    });
    g.bench_function("cuMemcpyDtoH pageable", |b| {
        // SAFETY: the context is current; `dst` and `mem` hold LARGE bytes.
        b.iter(|| unsafe { driver.cu_memcpy_dtoh(dst.as_mut_ptr().cast(), dptr, LARGE) }.unwrap())
    });
    g.bench_function("cuMemcpyDtoH pinned (DMA limit)", |b| {
        // SAFETY: as above, into the pinned buffer.
        b.iter(|| unsafe { driver.cu_memcpy_dtoh(pinned.cast(), dptr, LARGE) }.unwrap())
    });
    g.finish();
    // SAFETY: our allocation; every copy into or out of it was synchronous.
    unsafe { driver.cu_mem_free_host(pinned.cast()) }.expect("cuMemFreeHost");
    assert!(dst == src, "the reads returned what the writes stored");
}

fn small(c: &mut Criterion, gpu: &Gpu) {
    let pool = Pool::new(gpu.clone(), PoolConfig::default()).expect("pool");
    let mut block = pool.alloc(64, 64).expect("block");
    let data = [0x5au8; 64];
    let host = block.host_ptr();
    let mut g = c.benchmark_group("small_write_64B");
    g.bench_function("Block::write (default API)", |b| {
        b.iter(|| block.write(0, black_box(&data)).unwrap())
    });
    g.bench_function("raw store + sfence (limit)", |b| {
        // SAFETY: the block's 64 bytes at `host` are ours; `data` is a distinct buffer.
        b.iter(|| unsafe { copy_to_mapping(host, black_box(&data)) })
    });
    let mut blocks: Vec<_> = (0..16).map(|_| pool.alloc(64, 64).unwrap()).collect();
    g.bench_function("16 blocks, Block::write each", |b| {
        b.iter(|| {
            for blk in &mut blocks {
                blk.write(0, &data).unwrap();
            }
        })
    });
    g.bench_function("16 blocks, one WriteBatch", |b| {
        b.iter(|| {
            let mut batch = WriteBatch::new();
            for blk in &mut blocks {
                batch.write(blk, 0, &data).unwrap();
            }
            batch.finish();
        })
    });
    g.finish();
}

/// Runs this binary as a first-write child; returns its (first, second) write times.
fn child() -> (Duration, Duration) {
    let out = Command::new(std::env::current_exe().unwrap())
        .env(CHILD_ENV, "1")
        .output()
        .expect("spawn the first-write child");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("first-write-ns "))
        .unwrap_or_else(|| panic!("first-write child failed: {text}"));
    let mut it = line.split_whitespace().map(|v| v.parse::<u64>().unwrap());
    (
        Duration::from_nanos(it.next().unwrap()),
        Duration::from_nanos(it.next().unwrap()),
    )
}

fn first_write(c: &mut Criterion) {
    let mut g = c.benchmark_group("first_write");
    g.sampling_mode(SamplingMode::Flat);
    g.sample_size(10);
    g.bench_function("first RawMemory::write in a process", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| child().0).sum())
    });
    g.bench_function("second RawMemory::write, same process", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| child().1).sum())
    });
    g.finish();
}

/// The child: `examples/hello`'s write, timed, then again.
fn child_main() {
    let gpu = Gpu::open(0).expect("GPU");
    let mut mem = gpu.alloc(1 << 20).expect("memory");
    let t = Instant::now();
    mem.write(0, HELLO).unwrap();
    let first = t.elapsed().as_nanos();
    let t = Instant::now();
    mem.write(0, HELLO).unwrap();
    let second = t.elapsed().as_nanos();
    assert!(
        CopyPool::global_if_started().is_none(),
        "a small write started the copy pool"
    );
    println!("first-write-ns {first} {second}");
}

fn main() {
    if std::env::var_os(CHILD_ENV).is_some() {
        child_main();
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    if let Some(gpu) = gpu() {
        large(&mut c, &gpu);
        small(&mut c, &gpu);
        first_write(&mut c);
    }
    c.final_summary();
}
