//! The pool's alloc+free pair in a loop, alone: the program to profile the pool's hot paths with
//! (the criterion benchmark's harness adds its own instructions around it).
//!
//! `pool_pair [COUNT] [SIZE] [MODE]`, MODE one of `cached` (the default: `PoolConfig::default()`,
//! thread cache on), `nocache` (`thread_cache: 0`: every pair goes to the shard), `malloc` (the
//! same loop through the C library's `malloc` and `free`: this CPU's scale), `threads=N` (N
//! threads each doing COUNT cached pairs; prints wall time per pair of the whole machine) or
//! `nocache-threads=N` (the same without the thread cache).
//! The pool's chunks are host memory; `gpu-cached` and `gpu-nocache` put it on GPU 0's BAR
//! instead, as `vkgdr bench fastpath` does (the pair itself never touches the chunk's bytes).
//! `handoff=B` (no thread cache) allocates on this thread and frees on another, in batches of B
//! blocks sent over a channel: the shard's lock moves between the two threads every batch.
//! `new=N` times one `Pool::new` of N shards and its drop, with the page faults each took: run
//! it in a fresh process, as a program that makes one pool does (COUNT and SIZE are ignored).
//!
//! `cargo build --release --example pool_pair`, then for instructions per pair:
//! `valgrind --tool=callgrind --toggle-collect='pool_pair::pairs' target/release/examples/pool_pair 1000000`
//! (divide the total by the count), or `perf record` it with a larger count.

use std::hint::black_box;

use vkgdr::chunk::HostMemorySource;
use vkgdr::{Gpu, Pool, PoolConfig};

/// `n` alloc+free pairs of `size` bytes; apart so a profiler can count it alone.
#[inline(never)]
fn pairs(pool: &Pool, n: u64, size: u64) -> vkgdr::Result<()> {
    for _ in 0..n {
        let b = pool.alloc(black_box(size), 16)?;
        drop(black_box(b));
    }
    Ok(())
}

/// `n` pairs of `malloc(size)` and `free`.
#[inline(never)]
fn malloc_pairs(n: u64, size: u64) {
    for _ in 0..n {
        // SAFETY: a plain malloc/free pair; the pointer is freed once and never dereferenced.
        unsafe { libc::free(black_box(libc::malloc(black_box(size) as usize))) };
    }
}

/// Page faults this process has taken so far (minor: no disk involved).
fn minor_faults() -> i64 {
    // SAFETY: `getrusage` fills the zeroed struct it is given and keeps no pointer to it.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage.ru_minflt
    }
}

/// One `Pool::new` of `shards` shards over host memory and its drop, timed, with their faults.
fn new_and_drop(shards: usize) -> vkgdr::Result<()> {
    let config = PoolConfig {
        shards,
        ..PoolConfig::default()
    };
    let faults = minor_faults();
    let t = std::time::Instant::now();
    let pool = Pool::new(HostMemorySource, config)?;
    let (new, new_faults) = (t.elapsed(), minor_faults() - faults);
    let t = std::time::Instant::now();
    drop(black_box(pool));
    let (dropped, drop_faults) = (t.elapsed(), minor_faults() - faults - new_faults);
    println!(
        "Pool::new of {shards} shards: {:.1} µs ({new_faults} page faults); its drop {:.1} µs ({drop_faults})",
        new.as_secs_f64() * 1e6,
        dropped.as_secs_f64() * 1e6
    );
    Ok(())
}

fn main() -> vkgdr::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000_000);
    let size: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(256);
    let mode = args.next().unwrap_or_else(|| "cached".into());
    if let Some(shards) = mode.strip_prefix("new=").and_then(|n| n.parse().ok()) {
        return new_and_drop(shards);
    }
    if mode == "malloc" {
        let t = std::time::Instant::now();
        malloc_pairs(n, size);
        let ns = t.elapsed().as_nanos() as f64 / n as f64;
        println!("{n} pairs of {size} bytes (malloc): {ns:.2} ns per pair");
        return Ok(());
    }
    let threads: usize = mode
        .trim_start_matches("nocache-")
        .strip_prefix("threads=")
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let config = match mode.as_str() {
        m if m == "nocache"
            || m == "gpu-nocache"
            || m.starts_with("handoff=")
            || m.starts_with("nocache-") =>
        {
            PoolConfig {
                thread_cache: 0,
                ..PoolConfig::default()
            }
        }
        _ => PoolConfig::default(),
    };
    let pool = if mode.starts_with("gpu-") {
        Pool::new(Gpu::open(0)?, config)?
    } else {
        Pool::new(HostMemorySource, config)?
    };
    if let Some(cache) = pool.thread_cache() {
        // Which barrier pair the thread caches pay for: it decides their cost per access.
        println!("thread cache handshake: {}", cache.handshake.name());
    }
    // One block kept alive, so the chunk stays: the steady state the benchmark measures.
    let _keep = pool.alloc(size, 16)?;
    if threads > 0 {
        let start = std::sync::Barrier::new(threads + 1);
        let t = std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    pairs(&pool, 2, size)?;
                    start.wait();
                    pairs(&pool, n, size)
                });
            }
            start.wait();
            std::time::Instant::now()
        });
        let ns = t.elapsed().as_nanos() as f64 / (n * threads as u64) as f64;
        println!("{threads} threads x {n} pairs of {size} bytes: {ns:.2} ns per pair (wall)");
        return Ok(());
    }
    if let Some(batch) = mode
        .strip_prefix("handoff=")
        .and_then(|b| b.parse::<usize>().ok())
    {
        let batch = batch.max(1);
        let (send, receive) = std::sync::mpsc::sync_channel::<Vec<vkgdr::Block>>(2);
        let t = std::time::Instant::now();
        std::thread::scope(|s| -> vkgdr::Result<()> {
            s.spawn(move || receive.iter().for_each(drop));
            let mut left = n as usize;
            while left > 0 {
                let k = batch.min(left);
                let blocks = (0..k)
                    .map(|_| pool.alloc(black_box(size), 16))
                    .collect::<vkgdr::Result<Vec<_>>>()?;
                send.send(blocks).expect("the freeing thread is alive");
                left -= k;
            }
            drop(send);
            Ok(())
        })?;
        let ns = t.elapsed().as_nanos() as f64 / n as f64;
        println!("{n} blocks of {size} bytes, freed on another thread in batches of {batch}: {ns:.2} ns per block");
        return Ok(());
    }
    // Warm the thread cache (first use creates it and makes it serve the pool).
    pairs(&pool, 2, size)?;
    let t = std::time::Instant::now();
    pairs(&pool, n, size)?;
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    println!("{n} pairs of {size} bytes ({mode}): {ns:.2} ns per pair");
    Ok(())
}
