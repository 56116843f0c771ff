//! `copybw`: bandwidth vs size of every way to move bytes between host and GPU memory
//! (gdrcopy's `copybw`), all into or out of the same BAR-mapped [`RawMemory`]:
//!
//! - BAR writes through [`CopyPool`]s of 1, 2, 4 and 8 threads (SIMD stores, `sfence`);
//! - BAR reads with streaming loads on 1 thread and through an 8-thread [`CopyPool`];
//! - beside each of those, at every size, the same copy as a plain loop of non-temporal stores
//!   or streaming loads on as many plain threads ([`raw_bar`]): the machine's own BAR rate; a
//!   comparison judges the library's writes against it (lent machines differ widely on it:
//!   BENCHMARKS.md, 'Machines differ more than the code moved'), the reads' plain loops scatter
//!   too much for that and are shown only;
//! - `cuMemcpyHtoD` / `cuMemcpyDtoH` from and to pinned and pageable host memory (DMA);
//! - "DMA read": `cuMemcpyDtoH` into a pinned bounce buffer, then `memcpy` to the destination
//!   — how large reads should be done if it beats streaming loads; the crossover size is
//!   reported.

use std::time::Duration;

use vkgdr::copy::{copy_from_mapping, CopyPool};
use vkgdr::{Gpu, OpenOptions, RawMemory};

use crate::ui;

use super::error::{BenchError, BenchResult};
use super::host_pinned::HostPinned;
use super::measure::{ladder, measure, open_gpu, to_bandwidth, Budget, Stats};
use super::options::Options;
use super::raw_bar::Gang;
use super::report::format::fmt_size;
use super::report::model::{Figure, Report, Unit};

/// Thread counts of the write pools; the last one also serves the pooled read.
const WRITE_THREADS: [usize; 4] = [1, 2, 4, 8];

/// One way of copying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `CopyPool::write` with `WRITE_THREADS[i]` threads.
    BarWrite(usize),
    /// The same bytes as a plain loop of non-temporal stores on `WRITE_THREADS[i]` threads.
    RawWrite(usize),
    HtodPinned,
    HtodPageable,
    /// `copy_from_mapping` on the calling thread.
    BarRead1,
    /// A plain loop of streaming loads on the calling thread.
    RawRead1,
    /// `CopyPool::read` with the largest pool.
    BarReadPool,
    /// A plain loop of streaming loads on as many threads as the largest pool.
    RawReadPool,
    DtohPinned,
    DtohPageable,
    /// `cuMemcpyDtoH` into the pinned bounce buffer, then `memcpy` to the destination.
    DmaRead,
}

impl Op {
    fn name(self) -> &'static str {
        let last = WRITE_THREADS.len() - 1;
        match self {
            Op::BarWrite(i) => rows::BAR[i],
            Op::RawWrite(i) => rows::RAW[i],
            Op::HtodPinned => rows::HTOD_PINNED,
            Op::HtodPageable => rows::HTOD_PAGEABLE,
            Op::BarRead1 => rows::BAR[0],
            Op::RawRead1 => rows::RAW[0],
            Op::BarReadPool => rows::BAR[last],
            Op::RawReadPool => rows::RAW[last],
            Op::DtohPinned => rows::DTOH_PINNED,
            Op::DtohPageable => rows::DTOH_PAGEABLE,
            Op::DmaRead => rows::DMA_READ,
        }
    }
}

/// The rows of both reports (the registry names them by these).
pub mod rows {
    /// The library's BAR copies through pools of [`WRITE_THREADS`](super::WRITE_THREADS) threads.
    pub const BAR: [&str; 4] = ["BAR 1 thr", "BAR 2 thr", "BAR 4 thr", "BAR 8 thr"];
    /// The same bytes as a plain loop on as many threads.
    pub const RAW: [&str; 4] = ["raw 1 thr", "raw 2 thr", "raw 4 thr", "raw 8 thr"];
    /// `cuMemcpyHtoD` from pinned memory.
    pub const HTOD_PINNED: &str = "HtoD pinned";
    /// `cuMemcpyHtoD` from pageable memory.
    pub const HTOD_PAGEABLE: &str = "HtoD pageable";
    /// `cuMemcpyDtoH` into pinned memory.
    pub const DTOH_PINNED: &str = "DtoH pinned";
    /// `cuMemcpyDtoH` into pageable memory.
    pub const DTOH_PAGEABLE: &str = "DtoH pageable";
    /// `cuMemcpyDtoH` into a pinned bounce buffer, then `memcpy`.
    pub const DMA_READ: &str = "DtoH+memcpy";
}

/// The write report's methods, in groups measured side by side: each library copy with its raw
/// copy at one size, then the next size, so both see the machine in the same state.
const WRITE_OPS: [&[Op]; 6] = [
    &[Op::BarWrite(0), Op::RawWrite(0)],
    &[Op::BarWrite(1), Op::RawWrite(1)],
    &[Op::BarWrite(2), Op::RawWrite(2)],
    &[Op::BarWrite(3), Op::RawWrite(3)],
    &[Op::HtodPinned],
    &[Op::HtodPageable],
];

/// The read report's methods, grouped as [`WRITE_OPS`].
const READ_OPS: [&[Op]; 5] = [
    &[Op::BarRead1, Op::RawRead1],
    &[Op::BarReadPool, Op::RawReadPool],
    &[Op::DtohPinned],
    &[Op::DtohPageable],
    &[Op::DmaRead],
];

/// The methods of report `name` (`copybw-write` or `copybw-read`), in measuring order (the
/// checks of the published results in xtask/ hold the registry's rows against them).
pub fn methods(name: &str) -> Vec<String> {
    let groups: &[&[Op]] = match name {
        "copybw-write" => &WRITE_OPS,
        "copybw-read" => &READ_OPS,
        _ => &[],
    };
    groups
        .iter()
        .flat_map(|g| g.iter().map(|o| o.name().to_string()))
        .collect()
}

/// Everything the copies use, sized for the largest copy.
struct Kit<'g> {
    gpu: &'g Gpu,
    mem: RawMemory,
    pinned: HostPinned,
    src: Vec<u8>,
    dst: Vec<u8>,
    pools: Vec<CopyPool>,
    /// Plain threads for the raw rows, one gang per entry of `WRITE_THREADS`.
    gangs: Vec<Gang>,
}

impl Kit<'_> {
    /// Performs one `size`-byte copy. The caller keeps the GPU's context current.
    fn exec(&mut self, op: Op, size: usize) -> BenchResult<()> {
        let driver = self.gpu.driver();
        let dptr = self.mem.device_ptr();
        let host = self.mem.host_ptr();
        match op {
            Op::BarWrite(i) => {
                // SAFETY: `host` maps `mem.size() >= size` bytes (sizes never exceed the
                // allocation); `src` is a distinct host buffer; no kernel touches `mem`.
                unsafe { self.pools[i].write(host, &self.src[..size]) };
                self.mem.flush(0, size as u64)?;
            }
            Op::RawWrite(i) => {
                // SAFETY: as for `BarWrite`; the mapping is page-aligned. No flush: the raw row
                // is the stores alone.
                unsafe { self.gangs[i].store(host, &self.src[..size]) };
            }
            Op::RawRead1 | Op::RawReadPool => {
                let gang = match op {
                    Op::RawRead1 => &self.gangs[0],
                    _ => &self.gangs[self.gangs.len() - 1],
                };
                // SAFETY: as for `BarRead1`; the mapping is page-aligned.
                unsafe { gang.load(&mut self.dst[..size], host) };
            }
            Op::BarRead1 => {
                self.mem.invalidate(0, size as u64)?;
                // SAFETY: as above, `size` readable bytes at `host`; `dst` is a distinct buffer.
                unsafe { copy_from_mapping(&mut self.dst[..size], host) };
            }
            Op::BarReadPool => {
                self.mem.invalidate(0, size as u64)?;
                let pool = &self.pools[self.pools.len() - 1];
                // SAFETY: as for `BarRead1`.
                unsafe { pool.read(&mut self.dst[..size], host) };
            }
            Op::HtodPinned | Op::HtodPageable => {
                let src = match op {
                    Op::HtodPinned => self.pinned.as_ptr().cast_const(),
                    _ => self.src.as_ptr(),
                };
                // SAFETY: the context is current (caller); `dptr` has at least `size` bytes (the
                // allocation) and `src` points to a host buffer of at least `size` bytes.
                unsafe { driver.cu_memcpy_htod(dptr, src.cast(), size) }?;
            }
            Op::DtohPinned | Op::DtohPageable => {
                let dst = match op {
                    Op::DtohPinned => self.pinned.as_ptr(),
                    _ => self.dst.as_mut_ptr(),
                };
                // SAFETY: as for HtoD, with `dst` a host buffer of at least `size` bytes that
                // nothing else accesses during the call.
                unsafe { driver.cu_memcpy_dtoh(dst.cast(), dptr, size) }?;
            }
            Op::DmaRead => {
                self.exec(Op::DtohPinned, size)?;
                // SAFETY: the synchronous cuMemcpyDtoH above has finished and no GPU work that
                // writes `pinned` is queued while the slice lives.
                self.dst[..size].copy_from_slice(&self.pinned.as_slice()[..size]);
            }
        }
        Ok(())
    }

    /// Proves the paths move the right bytes before timing them: a BAR write (the library's,
    /// then the raw one) read back by DMA, and a DMA write read back through the BAR (likewise).
    fn verify(&mut self, size: usize) -> BenchResult<()> {
        let last = WRITE_THREADS.len() - 1;
        for (round, (write, read)) in [
            (Op::BarWrite(0), Op::BarRead1),
            (Op::RawWrite(last), Op::RawReadPool),
        ]
        .into_iter()
        .enumerate()
        {
            for (i, b) in self.src[..size].iter_mut().enumerate() {
                *b = (i as u32 + round as u32)
                    .wrapping_mul(2_654_435_761)
                    .to_le_bytes()[1];
            }
            self.exec(write, size)?;
            self.exec(Op::DtohPageable, size)?;
            if self.dst[..size] != self.src[..size] {
                return Err(BenchError::Check(format!(
                    "copybw: a BAR write ({}) did not read back through cuMemcpyDtoH",
                    write.name()
                )));
            }
            let inverted: Vec<u8> = self.src[..size].iter().map(|s| !s).collect();
            self.pinned.as_mut_slice()[..inverted.len()].copy_from_slice(&inverted);
            self.exec(Op::HtodPinned, size)?;
            self.dst[..size].fill(0);
            self.exec(read, size)?;
            if self.dst[..size] != inverted[..] {
                return Err(BenchError::Check(format!(
                    "copybw: a cuMemcpyHtoD did not read back through the BAR ({})",
                    read.name()
                )));
            }
        }
        Ok(())
    }
}

/// Allocates the largest of `want`, `want/2`, … (not below 64 MiB) that the BAR can hold.
pub fn alloc_largest(gpu: &Gpu, want: u64) -> BenchResult<RawMemory> {
    let mut size = want;
    loop {
        match gpu.alloc(size) {
            Ok(m) => return Ok(m),
            Err(vkgdr::Error::OutOfDeviceMemory { .. }) if size > 64 << 20 => size /= 2,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Whether a method that ran at `ns_per_byte` should skip `size`: its samples (plus warm-up)
/// would take longer than `max_point`.
pub fn too_slow(ns_per_byte: f64, size: u64, min_samples: usize, max_point: Duration) -> bool {
    ns_per_byte * size as f64 * (min_samples + 1) as f64 > max_point.as_nanos() as f64
}

/// The smallest size from which method `b` has at least the bandwidth of `a` at every larger
/// size measured for both; `None` if `a` is faster at the largest common size (or there is
/// none).
pub fn crossover(report: &Report, a: &str, b: &str) -> Option<u64> {
    let common: Vec<(u64, f64, f64)> = report
        .sizes()
        .into_iter()
        .filter_map(|s| Some((s, report.get(a, s)?.median, report.get(b, s)?.median)))
        .collect();
    let mut from = None;
    for &(s, va, vb) in common.iter().rev() {
        if vb >= va {
            from = Some(s);
        } else {
            break;
        }
    }
    from
}

/// A sentence saying from which size method `b` beats method `a` (see [`crossover`]).
fn crossover_note(report: &Report, a: &str, b: &str) -> String {
    let first = report.sizes().first().copied().unwrap_or(0);
    match crossover(report, a, b) {
        Some(s) if s == first => format!("{b} beats {a} at every measured size"),
        Some(s) => format!("crossover: {b} beats {a} from {} up", fmt_size(s)),
        None => format!("{b} does not beat {a} at the largest measured size"),
    }
}

/// Runs the benchmark: two reports, `copybw-write` and `copybw-read`.
pub fn run(opts: &Options) -> BenchResult<Vec<Report>> {
    let gpu = open_gpu(OpenOptions::new())?;
    let want: u64 = if opts.quick { 64 << 20 } else { 1 << 30 };
    let mem = alloc_largest(&gpu, want)?;
    let max = mem.size().min(want);
    let budget = if opts.quick {
        Budget::new(Duration::from_millis(40), 3, 500)
    } else {
        Budget::new(Duration::from_millis(250), 3, 2000)
    };
    let max_point = Duration::from_secs(if opts.quick { 1 } else { 4 });

    let n = max as usize;
    let mut kit = Kit {
        gpu: &gpu,
        mem,
        pinned: HostPinned::new(&gpu, n)?,
        // Filled (not calloc'ed) so that no page fault lands in a timed copy.
        src: vec![0x5a; n],
        dst: vec![0xa5; n],
        // Threshold 0: split every copy, so the columns show where more threads start to pay
        // (which is what the pool's default threshold should be).
        pools: WRITE_THREADS
            .iter()
            .map(|&t| CopyPool::new(t).with_parallel_threshold(0))
            .collect(),
        gangs: WRITE_THREADS.iter().map(|&t| Gang::new(t)).collect(),
    };
    kit.pinned.as_mut_slice().fill(0x3c);
    let _ctx = gpu.bind()?;
    kit.verify(n.min(1 << 20))?;

    let sizes = ladder(4096, max, 4);
    let mut reports = Vec::new();
    for (name, groups) in [
        ("copybw-write", &WRITE_OPS[..]),
        ("copybw-read", &READ_OPS[..]),
    ] {
        let mut report = Report::new(name, Unit::GigabytesPerSecond);
        let ops = groups.iter().map(|g| g.len()).sum::<usize>();
        ui::phase(
            name.trim_start_matches("copybw-"),
            (ops * sizes.len()) as u64,
        );
        for &group in groups {
            // Per method of the group: its last rate (ns per byte), and whether it stopped.
            let mut ns_per_byte: Vec<Option<f64>> = vec![None; group.len()];
            let mut stopped = vec![false; group.len()];
            for &size in &sizes {
                for (k, &op) in group.iter().enumerate() {
                    if stopped[k] {
                        continue;
                    }
                    if let Some(npb) = ns_per_byte[k] {
                        if too_slow(npb, size, budget.min_samples, max_point) {
                            report.notes.push(format!(
                                "{}: {} and larger skipped (~{:.1} s per copy)",
                                op.name(),
                                fmt_size(size),
                                npb * size as f64 / 1e9
                            ));
                            stopped[k] = true;
                            continue;
                        }
                    }
                    ui::step(format!("{} · {}", op.name(), fmt_size(size)));
                    let ns = measure(&budget, || kit.exec(op, size as usize))?;
                    let bw = Stats::of(&to_bandwidth(size, &ns)).expect("at least one sample");
                    ns_per_byte[k] = Some(1.0 / bw.median);
                    report.figures.push(Figure::measured(op.name(), size, &bw));
                }
            }
        }
        reports.push(report);
    }

    let [write, read] = &mut reports[..] else {
        unreachable!("two reports")
    };
    write.notes.push(
        "BAR n thr: CopyPool::new(n).write into the mapping (SIMD stores, sfence); HtoD: \
         cuMemcpyHtoD from pinned (cuMemHostAlloc) or pageable (Vec) memory into the same \
         allocation's device pointer"
            .into(),
    );
    write.notes.push(
        "the pools split every copy (parallel threshold 0), to show from which size more \
         threads pay"
            .into(),
    );
    write.notes.push(
        "raw n thr: the same bytes as a plain loop of 16-byte non-temporal stores and sfence, \
         split over n plain threads, measured beside BAR n thr at each size (no flush): the \
         machine's BAR store rate, without the library's code"
            .into(),
    );
    let (one, all) = (
        Op::BarWrite(0).name(),
        Op::BarWrite(WRITE_THREADS.len() - 1).name(),
    );
    let mut pairs: Vec<(&str, &str)> = (1..WRITE_THREADS.len())
        .map(|t| (one, Op::BarWrite(t).name()))
        .collect();
    pairs.push((one, Op::HtodPinned.name()));
    pairs.push((all, Op::HtodPinned.name()));
    for (a, b) in pairs {
        let note = crossover_note(write, a, b);
        write.notes.push(note);
    }
    read.notes.push(format!(
        "BAR 1 thr: copy_from_mapping (streaming loads); BAR {} thr: CopyPool read; raw n thr: \
         a plain loop of 16-byte streaming loads on n plain threads, beside BAR n thr at each \
         size; DtoH: cuMemcpyDtoH into pinned or pageable memory; DtoH+memcpy: cuMemcpyDtoH \
         into a pinned bounce buffer, then memcpy to the pageable destination",
        WRITE_THREADS[WRITE_THREADS.len() - 1]
    ));
    let dma = Op::DmaRead.name();
    for streaming in [Op::BarRead1, Op::BarReadPool] {
        let note = crossover_note(read, streaming.name(), dma);
        read.notes.push(note);
    }
    Ok(reports)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bw(rows: &[(&str, u64, f64)]) -> Report {
        let mut r = Report::new("copybw-read", Unit::GigabytesPerSecond);
        for &(m, s, v) in rows {
            r.figures.push(Figure::reference(m, s, v));
        }
        r
    }

    #[test]
    fn crossover_is_the_start_of_the_winning_tail() {
        let r = bw(&[
            ("a", 4, 5.0),
            ("a", 16, 5.0),
            ("a", 64, 5.0),
            ("a", 256, 5.0),
            ("b", 4, 1.0),
            ("b", 16, 6.0),
            ("b", 64, 4.0),
            ("b", 256, 9.0),
        ]);
        // b wins at 16 but loses again at 64: the tail starts at 256.
        assert_eq!(crossover(&r, "a", "b"), Some(256));
        assert_eq!(crossover(&r, "b", "a"), None);
        assert_eq!(crossover(&r, "a", "a"), Some(4), "ties count as a win");
        assert_eq!(crossover(&r, "a", "missing"), None);
        assert_eq!(
            crossover_note(&r, "a", "b"),
            "crossover: b beats a from 256 B up"
        );
        assert_eq!(
            crossover_note(&r, "a", "a"),
            "a beats a at every measured size"
        );
        assert_eq!(
            crossover_note(&r, "b", "a"),
            "a does not beat b at the largest measured size"
        );
    }

    #[test]
    fn crossover_ignores_sizes_missing_for_either_method() {
        // `a` was skipped above 16 (too slow): the comparison uses common sizes only.
        let r = bw(&[
            ("a", 4, 5.0),
            ("a", 16, 5.0),
            ("b", 4, 1.0),
            ("b", 16, 6.0),
            ("b", 64, 9.0),
        ]);
        assert_eq!(crossover(&r, "a", "b"), Some(16));
    }

    #[test]
    fn slow_methods_are_skipped_by_predicted_time() {
        // 1 ns/byte (1 GB/s), 1 GiB: ~1.07 s per copy, 4 copies > 4 s.
        assert!(too_slow(1.0, 1 << 30, 3, Duration::from_secs(4)));
        assert!(!too_slow(1.0, 256 << 20, 3, Duration::from_secs(4)));
        assert!(!too_slow(0.04, 1 << 30, 3, Duration::from_secs(4)));
    }

    #[test]
    fn row_names_say_their_thread_counts() {
        for (i, t) in WRITE_THREADS.into_iter().enumerate() {
            assert_eq!(rows::BAR[i], format!("BAR {t} thr"));
            assert_eq!(rows::RAW[i], format!("raw {t} thr"));
        }
    }

    #[test]
    fn method_names_are_distinct_within_each_report() {
        for groups in [&WRITE_OPS[..], &READ_OPS[..]] {
            let ops: Vec<Op> = groups.iter().flat_map(|g| g.iter().copied()).collect();
            let mut names: Vec<&str> = ops.iter().map(|o| o.name()).collect();
            names.sort();
            names.dedup();
            assert_eq!(names.len(), ops.len());
        }
    }
}
