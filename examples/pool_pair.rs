//! The pool's cached alloc+free pair in a loop, alone: the program to profile the thread-cache
//! fast path with (the criterion benchmark's harness adds its own instructions around it).
//!
//! `cargo build --release --example pool_pair`, then for instructions per pair:
//! `valgrind --tool=callgrind --toggle-collect='pool_pair::pairs' target/release/examples/pool_pair 1000000`
//! (divide the total by the count), or `perf record` it with a larger count.

use std::hint::black_box;

use vkgdr::chunk::HostMemorySource;
use vkgdr::{Pool, PoolConfig};

/// `n` alloc+free pairs of `size` bytes; apart so a profiler can count it alone.
#[inline(never)]
fn pairs(pool: &Pool, n: u64, size: u64) -> vkgdr::Result<()> {
    for _ in 0..n {
        let b = pool.alloc(black_box(size), 16)?;
        drop(black_box(b));
    }
    Ok(())
}

fn main() -> vkgdr::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000_000);
    let size: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(256);
    let pool = Pool::new(HostMemorySource, PoolConfig::default())?;
    // One block kept alive, so the chunk stays: the steady state the benchmark measures.
    let _keep = pool.alloc(size, 16)?;
    // Warm the thread cache (first use creates it and makes it serve the pool).
    pairs(&pool, 2, size)?;
    let t = std::time::Instant::now();
    pairs(&pool, n, size)?;
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    println!("{n} pairs of {size} bytes: {ns:.2} ns per pair");
    Ok(())
}
