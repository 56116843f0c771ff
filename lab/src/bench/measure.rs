//! What every benchmark measures with: the GPU `--device` chose, opened ([`open_gpu`]); timing
//! ([`Budget`], [`measure`], [`measure_side_by_side`], [`measure_pair`]), sample statistics
//! ([`Stats`], [`percentile`]), size ladders ([`ladder`]) and bandwidth ([`to_bandwidth`]).
//!
//! Timing: [`std::time::Instant`] around each sample after a warm-up. Operations shorter than
//! [`Budget::min_sample`] are repeated back to back inside one sample (the sample is then the mean
//! of that batch), so the timer's own ~20 ns do not swamp them; medians and p10/p90 are over the
//! samples.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use vkgdr::vulkan::format_uuid;
use vkgdr::{Gpu, OpenOptions};

use super::error::BenchResult;
pub use super::stats::{percentile, Stats};
use crate::device::{self, DeviceArg, Devices, Present};

static GPU_OPENED: AtomicBool = AtomicBool::new(false);

/// The device this run measures (`--device`), and what it turned out to be once opened.
struct Chosen {
    wanted: DeviceArg,
    opened: Option<Present>,
}

static DEVICE: Mutex<Chosen> = Mutex::new(Chosen {
    wanted: DeviceArg::Ordinal(0),
    opened: None,
});

fn chosen() -> std::sync::MutexGuard<'static, Chosen> {
    DEVICE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Makes `d` the device every benchmark of this process opens (`--device`; CUDA device 0
/// unless called).
pub fn choose_device(d: DeviceArg) {
    *chosen() = Chosen {
        wanted: d,
        opened: None,
    };
}

/// Opens the chosen device for a benchmark (and remembers that the process has opened one, and
/// which device it was). The first open in the process is what `apiperf` times, so nothing is
/// asked of the driver before it; a device that is not here is named with those that are.
pub fn open_gpu(options: OpenOptions) -> BenchResult<Gpu> {
    let wanted = chosen().wanted;
    let opened = match wanted {
        DeviceArg::Ordinal(n) => Gpu::open_with(n, options),
        DeviceArg::Uuid(u) => Gpu::open_uuid_with(&format_uuid(&u), options),
    };
    let gpu = match opened {
        Ok(gpu) => gpu,
        // Said with the devices that are here, where the driver can list them.
        Err(e) => {
            return Err(match device::select(&Devices::one(wanted)) {
                Err(missing @ vkgdr::Error::NoMatchingDevice(_)) => missing,
                _ => e,
            }
            .into())
        }
    };
    GPU_OPENED.store(true, Ordering::Relaxed);
    let mut c = chosen();
    if c.opened.is_none() {
        c.opened = Some(Present {
            ordinal: vkgdr::vmm::ordinal_of(gpu.driver(), gpu.cu_device())?,
            uuid: gpu.uuid(),
            name: gpu.name().to_string(),
        });
    }
    Ok(gpu)
}

/// The CUDA ordinal of the chosen device, for another handle to the same GPU
/// (`Gpu::open(ordinal)`): known once a benchmark opened it, else looked up.
pub fn device_ordinal() -> BenchResult<i32> {
    let c = chosen();
    if let Some(p) = &c.opened {
        return Ok(p.ordinal);
    }
    let wanted = c.wanted;
    drop(c);
    match wanted {
        DeviceArg::Ordinal(n) => Ok(n),
        DeviceArg::Uuid(_) => Ok(device::select(&Devices::one(wanted))?[0].ordinal),
    }
}

/// The device the benchmarks opened (`None`: none opened yet).
pub fn opened_device() -> Option<Present> {
    chosen().opened.clone()
}

/// Whether a benchmark opened a GPU earlier in this process (driver already loaded).
pub fn gpu_opened_before() -> bool {
    GPU_OPENED.load(Ordering::Relaxed)
}

/// Sizes `start, start·factor, …` up to and including `end` (`start ≥ 1`, `factor ≥ 2`).
pub fn ladder(start: u64, end: u64, factor: u64) -> Vec<u64> {
    assert!(
        start >= 1 && factor >= 2,
        "ladder({start}, {end}, {factor})"
    );
    let mut v = Vec::new();
    let mut s = start;
    while s <= end {
        v.push(s);
        match s.checked_mul(factor) {
            Some(next) => s = next,
            None => break,
        }
    }
    v
}

/// How long and how often one measurement is repeated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Warm-up time before any sample (at least one call is always made).
    pub warmup: Duration,
    /// Target total time of the samples.
    pub target: Duration,
    /// Fewest samples, whatever the target.
    pub min_samples: usize,
    /// Most samples.
    pub max_samples: usize,
    /// Calls shorter than this are batched so one sample lasts at least this long.
    pub min_sample: Duration,
}

impl Budget {
    /// A budget with `target` sample time, `min..=max` samples, 10 ms warm-up, 1 µs samples.
    pub fn new(target: Duration, min_samples: usize, max_samples: usize) -> Budget {
        Budget {
            warmup: Duration::from_millis(10),
            target,
            min_samples,
            max_samples,
            min_sample: Duration::from_micros(1),
        }
    }

    /// `(calls per sample, samples)` for an operation estimated to take `est_ns` per call.
    pub fn plan(&self, est_ns: f64) -> (usize, usize) {
        let est = est_ns.max(1.0);
        let batch = (self.min_sample.as_nanos() as f64 / est).ceil().max(1.0);
        let samples = (self.target.as_nanos() as f64 / (est * batch)).floor();
        let samples = (samples.min(self.max_samples as f64) as usize)
            .max(self.min_samples)
            .max(1);
        (batch as usize, samples)
    }
}

/// Times `f`: warm-up, then samples per [`Budget::plan`]. Returns nanoseconds per call, one value
/// per sample (the mean over the sample's batch).
pub fn measure(budget: &Budget, f: impl FnMut() -> BenchResult<()>) -> BenchResult<Vec<f64>> {
    let mut ns = measure_side_by_side(budget, &mut [Timed::new(f)])?;
    Ok(ns.swap_remove(0))
}

/// Warms `call` up for the budget's warm-up (at least two calls) and returns its estimated
/// nanoseconds per call. The first call is left out of the estimate: it may pay a one-time cost
/// (a pool's first chunk, a page fault) of thousands of calls, and a plan made from it would time
/// each call alone, the timer's own nanoseconds included.
fn estimate(budget: &Budget, mut call: impl FnMut() -> BenchResult<()>) -> BenchResult<f64> {
    call()?;
    let start = Instant::now();
    let mut calls = 0u32;
    loop {
        call()?;
        calls += 1;
        if start.elapsed() >= budget.warmup {
            break;
        }
    }
    Ok(start.elapsed().as_nanos() as f64 / f64::from(calls))
}

/// One operation for [`measure_side_by_side`]: the operation and the loop that repeats it back to
/// back for a sample's batch, compiled together (one indirect call per batch, none per call).
pub struct Timed<'a>(Box<dyn FnMut(usize) -> BenchResult<()> + 'a>);

impl<'a> Timed<'a> {
    /// `f` as an operation to time.
    pub fn new(mut f: impl FnMut() -> BenchResult<()> + 'a) -> Timed<'a> {
        Timed(Box::new(move |calls| (0..calls).try_for_each(|_| f())))
    }
}

/// Times several operations side by side: each is warmed up and planned by [`Budget::plan`] on
/// its own (from its calls after the first), then their samples alternate, one of each in turn,
/// as many as the operation that planned the fewest. A host whose cores run slower for a while
/// (a busy neighbour on a shared machine) then slows every operation alike, so their ratio
/// holds where two measurements taken one after the other can differ by 1.5x (BENCHMARKS.md,
/// 'Comparing with earlier runs'). Returns, per operation in order, nanoseconds per call, one
/// value per sample.
pub fn measure_side_by_side(budget: &Budget, ops: &mut [Timed<'_>]) -> BenchResult<Vec<Vec<f64>>> {
    let mut plans = Vec::with_capacity(ops.len());
    for op in ops.iter_mut() {
        plans.push(budget.plan(estimate(budget, || (op.0)(1))?));
    }
    let n = plans.iter().map(|&(_, n)| n).min().unwrap_or(0);
    let mut samples = vec![Vec::with_capacity(n); ops.len()];
    for _ in 0..n {
        for ((op, &(batch, _)), out) in ops.iter_mut().zip(&plans).zip(&mut samples) {
            let t = Instant::now();
            (op.0)(batch)?;
            out.push(t.elapsed().as_nanos() as f64 / batch as f64);
        }
    }
    Ok(samples)
}

/// Times a setup/teardown pair that cannot be batched (allocation and free): `open` returns a
/// value, `close` consumes it; both are timed separately, one sample per pair, after the
/// warm-up that [`measure`] makes. Returns `(open_ns, close_ns)`.
pub fn measure_pair<T>(
    budget: &Budget,
    mut open: impl FnMut() -> BenchResult<T>,
    mut close: impl FnMut(T),
) -> BenchResult<(Vec<f64>, Vec<f64>)> {
    let est = estimate(budget, || {
        close(open()?);
        Ok(())
    })?;
    // No batching: each pair is one sample of each.
    let n = Budget {
        min_sample: Duration::ZERO,
        ..*budget
    }
    .plan(est)
    .1;
    let (mut a, mut b) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let t0 = Instant::now();
        let v = open()?;
        let t1 = Instant::now();
        close(v);
        let t2 = Instant::now();
        a.push((t1 - t0).as_nanos() as f64);
        b.push((t2 - t1).as_nanos() as f64);
    }
    Ok((a, b))
}

/// Turns per-call times of `size`-byte copies into GB/s samples (bytes per ns = GB/s).
pub fn to_bandwidth(size: u64, ns: &[f64]) -> Vec<f64> {
    ns.iter().map(|t| size as f64 / t.max(1e-3)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::error::BenchError;

    #[test]
    fn percentile_interpolates_between_ranks() {
        let v = [10.0, 20.0, 30.0, 40.0, 50.0];
        assert_eq!(percentile(&v, 0.0), 10.0);
        assert_eq!(percentile(&v, 0.5), 30.0);
        assert_eq!(percentile(&v, 1.0), 50.0);
        assert_eq!(percentile(&v, 0.1), 14.0);
        assert_eq!(percentile(&v, 0.9), 46.0);
        assert_eq!(percentile(&[7.0], 0.9), 7.0);
        // Out-of-range quantiles clamp.
        assert_eq!(percentile(&v, 1.5), 50.0);
    }

    #[test]
    fn stats_sort_their_input_and_match_a_naive_model() {
        let s = Stats::of(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!(s.median, 2.5);
        assert_eq!(s.n, 4);
        assert!((s.p10 - 1.3).abs() < 1e-12);
        assert!((s.p90 - 3.7).abs() < 1e-12);

        // Against a naive model over many shuffled inputs: the median of 1..=n.
        for n in 1..40u32 {
            let mut v: Vec<f64> = (1..=n).map(f64::from).collect();
            v.reverse();
            v.rotate_left((n / 3) as usize);
            let s = Stats::of(&v).unwrap();
            assert_eq!(s.median, f64::from(n + 1) / 2.0, "n = {n}");
            assert!(s.p10 <= s.median && s.median <= s.p90);
        }
        assert_eq!(Stats::of(&[]), None);
        assert_eq!(Stats::of(&[1.0, f64::NAN]), None);
    }

    #[test]
    fn ladders_are_inclusive_geometric_sequences() {
        assert_eq!(ladder(4096, 1 << 30, 4).len(), 10);
        assert_eq!(ladder(4096, 1 << 30, 4).last(), Some(&(1 << 30)));
        assert_eq!(ladder(4096, 64 << 20, 4).last(), Some(&(64 << 20)));
        assert_eq!(ladder(8, 4 << 20, 2).len(), 20);
        assert_eq!(ladder(8, 100, 2), vec![8, 16, 32, 64]);
        assert_eq!(ladder(8, 7, 2), Vec::<u64>::new());
        // No overflow at the top of the range.
        assert_eq!(ladder(1 << 62, u64::MAX, 4), vec![1 << 62]);
    }

    #[test]
    fn plan_batches_short_calls_and_bounds_sample_counts() {
        let b = Budget::new(Duration::from_millis(100), 10, 1000);
        // 50 ns calls: 20 per 1 µs sample; 100 ms / 1 µs = 100k samples, capped at 1000.
        assert_eq!(b.plan(50.0), (20, 1000));
        // 1 ms calls: no batching, 100 samples.
        assert_eq!(b.plan(1e6), (1, 100));
        // 1 s calls: the minimum applies.
        assert_eq!(b.plan(1e9), (1, 10));
        // A zero estimate does not divide by zero.
        assert_eq!(b.plan(0.0).0, 1000);
    }

    #[test]
    fn a_slow_first_call_does_not_make_the_plan() {
        // The first call pays a one-time cost (20 ms, past the warm-up); the others cost next to
        // nothing, so the plan batches them into 1 µs samples, as many as the cap allows (a plan
        // made from the first call: 20 ms a call, the 10 samples of the minimum).
        let b = Budget {
            warmup: Duration::from_millis(1),
            target: Duration::from_millis(5),
            min_samples: 10,
            max_samples: 100,
            min_sample: Duration::from_micros(1),
        };
        let mut calls = 0u64;
        let s = measure(&b, || {
            calls += 1;
            if calls == 1 {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(s.len(), 100, "planned from the first call");
        assert!(
            s.iter().all(|&t| t < 1e6),
            "a sample holds the slow call: {s:?}"
        );
        // A pair that cannot be batched plans its sample count by the same rule.
        let mut opened = 0u64;
        let (a, _) = measure_pair(
            &b,
            || {
                opened += 1;
                if opened == 1 {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(())
            },
            drop,
        )
        .unwrap();
        assert_eq!(a.len(), 100, "the pair planned from its first call");
    }

    #[test]
    fn measure_calls_the_closure_batch_times_samples_plus_warmup() {
        let b = Budget {
            warmup: Duration::ZERO,
            target: Duration::ZERO,
            min_samples: 5,
            max_samples: 5,
            min_sample: Duration::ZERO,
        };
        let mut calls = 0;
        let s = measure(&b, || {
            calls += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(s.len(), 5);
        // Two warm-up calls: the first, left out of the estimate, and one timed.
        assert_eq!(calls, 7);
        assert!(s.iter().all(|v| *v >= 0.0));

        let (mut opened, mut closed) = (0, 0);
        let (a, c) = measure_pair(
            &b,
            || {
                opened += 1;
                Ok(opened)
            },
            |_| closed += 1,
        )
        .unwrap();
        // The same two warm-up pairs.
        assert_eq!((a.len(), c.len(), opened, closed), (5, 5, 7, 7));

        let err = measure(&b, || Err(BenchError::Usage("boom".into())));
        assert!(matches!(err, Err(BenchError::Usage(m)) if m == "boom"));
    }

    #[test]
    fn side_by_side_samples_alternate_and_each_keeps_its_batch() {
        // 1 µs samples: an operation of ~1 ns is batched, one that sleeps 50 µs is not.
        let b = Budget {
            warmup: Duration::from_millis(1),
            target: Duration::from_millis(2),
            min_samples: 3,
            max_samples: 1000,
            min_sample: Duration::from_micros(1),
        };
        let order = std::cell::RefCell::new(Vec::new());
        let (mut quick, mut slow) = (0u64, 0u64);
        let s = measure_side_by_side(
            &b,
            &mut [
                Timed::new(|| {
                    quick += 1;
                    let mut o = order.borrow_mut();
                    if o.last() != Some(&'q') {
                        o.push('q');
                    }
                    Ok(())
                }),
                Timed::new(|| {
                    slow += 1;
                    order.borrow_mut().push('s');
                    std::thread::sleep(Duration::from_micros(50));
                    Ok(())
                }),
            ],
        )
        .unwrap();
        // The slow one plans the fewest samples (2 ms over ≥ 50 µs: at most 40), both take as
        // many, and they take turns after the two warm-ups.
        let n = s[1].len();
        assert!((3..=40).contains(&n), "{n} samples");
        assert_eq!(s[0].len(), n);
        assert!(s[1].iter().all(|&t| t >= 50_000.0), "{:?}", s[1]);
        let order = order.into_inner();
        let turns: String = order.iter().skip_while(|&&c| c == 'q').collect();
        let after_warmup: String = turns.chars().skip_while(|&c| c == 's').collect();
        assert_eq!(after_warmup, "qs".repeat(n), "samples in turn");
        assert!(
            quick > 2 * n as u64,
            "the quick one is batched: {quick} calls"
        );
        assert_eq!(slow as usize, order.iter().filter(|&&c| c == 's').count());

        let err = measure_side_by_side(
            &b,
            &mut [
                Timed::new(|| Ok(())),
                Timed::new(|| Err(BenchError::Usage("boom".into()))),
            ],
        );
        assert!(matches!(err, Err(BenchError::Usage(m)) if m == "boom"));
    }

    #[test]
    fn bandwidth_is_bytes_per_nanosecond() {
        assert_eq!(to_bandwidth(1000, &[100.0, 50.0]), vec![10.0, 20.0]);
    }
}
