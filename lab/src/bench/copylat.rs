//! `copylat`: latency vs size of one host-to-GPU write (gdrcopy's `copylat`):
//!
//! - `BAR write`: [`copy_to_mapping`] (SIMD stores ending with `sfence`): the CPU is done, the
//!   data is posted on the bus;
//! - `BAR write+readback`: the same, then the last 8 bytes read back through the mapping — a
//!   read is not reordered ahead of the posted writes, so its return proves they arrived;
//! - `raw write` and `raw write+readback`: the same two as plain loops of non-temporal stores
//!   and a plain read ([`raw_bar`]), measured beside them at each size: the machine's own BAR
//!   latency, which a comparison judges the library's rows against (lent machines differ widely
//!   on it: BENCHMARKS.md, 'Machines differ more than the code moved');
//! - `cuMemcpyHtoD`: synchronous, from pinned memory;
//! - `HtoDAsync+sync`: `cuMemcpyHtoDAsync` on a stream, then `cuStreamSynchronize`.
//!
//! All of them write into the same BAR-mapped allocation.

use std::time::Duration;

use vkgdr::copy::{copy_from_mapping, copy_to_mapping};
use vkgdr::cuda_objects::Stream;
use vkgdr::OpenOptions;

use super::error::{BenchError, BenchResult};
use super::host_pinned::HostPinned;
use super::measure::{ladder, measure, open_gpu, Budget, Stats};
use super::options::Options;
use super::raw_bar;
use super::report::format::fmt_size;
use super::report::model::{Figure, Report, Unit};
use crate::ui;

/// The rows (the registry names them by these).
pub mod rows {
    /// `copy_to_mapping` and a flush.
    pub const BAR_WRITE: &str = "BAR write";
    /// The same bytes as plain stores.
    pub const RAW_WRITE: &str = "raw write";
    /// The library's write, then an 8-byte read through the BAR that confirms it.
    pub const BAR_WRITE_READBACK: &str = "BAR write+readback";
    /// The same as plain stores and a plain load.
    pub const RAW_WRITE_READBACK: &str = "raw write+readback";
    /// `cuMemcpyHtoD` from pinned memory.
    pub const CU_MEMCPY_HTOD: &str = "cuMemcpyHtoD";
    /// `cuMemcpyHtoDAsync` and a stream synchronisation.
    pub const HTOD_ASYNC_SYNC: &str = "HtoDAsync+sync";
}

/// Method names, in column order.
pub const METHODS: [&str; 6] = [
    rows::BAR_WRITE,
    rows::RAW_WRITE,
    rows::BAR_WRITE_READBACK,
    rows::RAW_WRITE_READBACK,
    rows::CU_MEMCPY_HTOD,
    rows::HTOD_ASYNC_SYNC,
];

/// Indices into [`METHODS`] measured side by side: a library write with its raw write at one
/// size, then the next size, so both see the machine in the same state.
const GROUPS: [&[usize]; 4] = [&[0, 1], &[2, 3], &[4], &[5]];

/// Runs the benchmark: one `copylat` report.
pub fn run(opts: &Options) -> BenchResult<Vec<Report>> {
    let max: u64 = 4 << 20;
    let sizes = ladder(8, max, if opts.quick { 4 } else { 2 });
    let budget = if opts.quick {
        Budget::new(Duration::from_millis(20), 20, 5_000)
    } else {
        Budget::new(Duration::from_millis(100), 50, 20_000)
    };

    let gpu = open_gpu(OpenOptions::new())?;
    let mem = gpu.alloc(max)?;
    let mut pinned = HostPinned::new(&gpu, max as usize)?;
    pinned.as_mut_slice().fill(0x42);
    let mut src = vec![0x42u8; max as usize];
    let stream = Stream::new(&gpu)?;
    let driver = gpu.driver();
    let (host, dptr) = (mem.host_ptr(), mem.device_ptr());
    let _ctx = gpu.bind()?;

    let mut report = Report::new("copylat", Unit::Nanoseconds);
    ui::phase("latency", (METHODS.len() * sizes.len()) as u64);
    let mut counter = 0u64;
    for group in GROUPS {
        for &size in &sizes {
            for &m in group {
                let name = METHODS[m];
                ui::step(format!("{name} · {}", fmt_size(size)));
                let n = size as usize;
                let samples = measure(&budget, || {
                    match m {
                        0 => {
                            // SAFETY: `host` maps `max >= n` bytes; `src` is a distinct buffer; no
                            // kernel uses `mem`.
                            unsafe { copy_to_mapping(host, &src[..n]) };
                            mem.flush(0, size)?;
                        }
                        1 => {
                            // SAFETY: as above; the mapping is page-aligned. No flush: the raw row
                            // is the stores alone.
                            unsafe { raw_bar::store(host, &src[..n]) };
                        }
                        2 | 3 => {
                            // A new value each time, so a stale read-back cannot pass the check.
                            counter += 1;
                            src[n - 8..n].copy_from_slice(&counter.to_le_bytes());
                            let mut back = [0u8; 8];
                            if m == 2 {
                                // SAFETY: as above.
                                unsafe { copy_to_mapping(host, &src[..n]) };
                                mem.flush(0, size)?;
                                mem.invalidate(size - 8, 8)?;
                                // SAFETY: `n - 8 + 8 <= max` bytes are mapped at `host`.
                                unsafe { copy_from_mapping(&mut back, host.add(n - 8)) };
                            } else {
                                // SAFETY: as for the raw write; `host + n - 8` is 8-byte aligned
                                // (sizes are powers of two from 8).
                                unsafe {
                                    raw_bar::store(host, &src[..n]);
                                    raw_bar::load(&mut back, host.add(n - 8));
                                }
                            }
                            if back != src[n - 8..n] {
                                return Err(BenchError::Check(format!(
                                    "copylat: read-back of a {n}-byte {name} returned stale data"
                                )));
                            }
                        }
                        4 => {
                            // SAFETY: the context is current (`_ctx`); `dptr` and `pinned` hold at
                            // least `n` bytes.
                            unsafe { driver.cu_memcpy_htod(dptr, pinned.as_ptr().cast(), n) }?;
                        }
                        _ => {
                            // SAFETY: as above; `stream` belongs to this context and the copy is
                            // waited for before `pinned` can be touched again.
                            unsafe {
                                driver.cu_memcpy_htod_async(
                                    dptr,
                                    pinned.as_ptr().cast(),
                                    n,
                                    stream.raw(),
                                )
                            }?;
                            // SAFETY: live stream of the current context.
                            unsafe { driver.cu_stream_synchronize(stream.raw()) }?;
                        }
                    }
                    Ok(())
                })?;
                let s = Stats::of(&samples).expect("at least one sample");
                report.figures.push(Figure::measured(name, size, &s));
            }
        }
    }
    report.notes.push(
        "operations under 1 µs are timed in back-to-back batches of ≥ 1 µs: their median and \
         p10–p90 are over batch means"
            .into(),
    );
    report.notes.push(
        "BAR write: copy_to_mapping (ends with sfence); +readback: then an 8-byte read through \
         the mapping, which returns only after the writes arrived; raw: the same as a plain loop \
         of 16-byte non-temporal stores, sfence and a plain read, beside it at each size (no \
         flush); cuMemcpy*: from pinned memory"
            .into(),
    );
    Ok(vec![report])
}
