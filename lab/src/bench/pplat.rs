//! `pplat`: round trips between the CPU and a running kernel (gdrcopy's ping-pong test).
//!
//! The `pingpong` kernel (`kernels/mapping.cu`) runs once for many iterations: for i = 1..=N it
//! waits until the 64-bit word `*in >= i`, then writes `*out = i` into pinned host memory. The
//! CPU times each exchange: it sends `size` bytes whose last word is `i`, then spins on the
//! pinned word until it reads `i`.
//!
//! - `BAR write`: the message goes through the mapping ([`copy_to_mapping`], `sfence`) into a
//!   [`RawMemory`] the kernel polls.
//! - `HtoDAsync+sync`: the message goes by `cuMemcpyHtoDAsync` (from pinned memory) on a second
//!   non-blocking stream into a `cuMemAlloc` buffer the kernel polls, then
//!   `cuStreamSynchronize` of that stream.
//!
//! The kernel must always end before its memory is freed: on any failure the CPU writes
//! `u64::MAX` into the polled word (which satisfies every remaining wait) and waits for the
//! kernel; if it still does not end, the memory is leaked on purpose and
//! [`BenchError::KernelStuck`] returned.

use std::ffi::c_void;
use std::time::{Duration, Instant};

use vkgdr::copy::copy_to_mapping;
use vkgdr::cuda_objects::{
    DeviceBuffer, Event, Function, LaunchConfig, Module, PinnedBuffer, Stream,
};
use vkgdr::{Gpu, OpenOptions, RawMemory};

use super::error::{BenchError, BenchResult};
use super::host_pinned::HostPinned;
use super::measure::{open_gpu, Stats};
use super::options::Options;
use super::report::format::fmt_size;
use super::report::model::{Figure, Report, Unit};
use crate::ui;

/// The PTX holding `pingpong`.
const PTX: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../kernels/mapping.ptx"
));

/// How long the CPU waits for one answer before declaring the kernel lost.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the CPU waits for the kernel to end.
const END_TIMEOUT: Duration = Duration::from_secs(10);

/// Method names, in column order.
pub const METHODS: [&str; 3] = ["BAR write", "BAR write, lean kernel", HTOD_ASYNC_SYNC];

/// The driver's round trip (`cuMemcpyHtoDAsync` and a synchronisation), the anchor of the others.
pub const HTOD_ASYNC_SYNC: &str = "HtoDAsync+sync";

/// Message sizes of the full and the quick run; the 8-byte one is the classic ping-pong.
pub fn sizes(quick: bool) -> Vec<u64> {
    if quick {
        vec![8, 512, 32 << 10]
    } else {
        vec![8, 64, 512, 4 << 10, 32 << 10, 256 << 10]
    }
}

/// Round trips per kernel launch at `size`: `base` up to 4 KiB, fewer for larger messages
/// (proportionally, at least `base / 64`), never below 2 × the warm-up.
pub fn iterations(base: u64, size: u64) -> u64 {
    let scaled = if size <= 4096 {
        base
    } else {
        (base * 4096 / size).max(base / 64)
    };
    scaled.max(2 * warmup(scaled)).max(2)
}

/// Leading round trips discarded as warm-up: 10 %, at most 1000.
pub fn warmup(iters: u64) -> u64 {
    (iters / 10).min(1000)
}

/// Where the kernel's `in` word lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    Bar,
    /// The BAR path answered by `pingpong_lean` (no `__threadfence_system` around the answer).
    BarLean,
    Memcpy,
}

/// Everything one run of ping-pongs needs.
struct Kit<'a> {
    gpu: &'a Gpu,
    func: Function<'a>,
    func_lean: Function<'a>,
    kernel_stream: Stream,
    copy_stream: Stream,
    /// The kernel's `out` word (and nothing else).
    answer: PinnedBuffer,
    /// The BAR-mapped `in` region.
    bar: RawMemory,
    /// The `cuMemAlloc` `in` region.
    dev: DeviceBuffer,
    /// Source of the `cuMemcpyHtoDAsync` messages.
    staging: HostPinned,
    /// Source of the BAR messages.
    message: Vec<u8>,
}

impl Kit<'_> {
    fn answer_word(&self) -> *const u64 {
        self.answer.as_ptr().cast::<u64>()
    }

    /// Device address of the polled word: the last 8 bytes of a `size`-byte message.
    fn in_ptr(&self, via: Via, size: u64) -> u64 {
        let base = match via {
            Via::Bar | Via::BarLean => self.bar.device_ptr(),
            Via::Memcpy => self.dev.device_ptr(),
        };
        base + size - 8
    }

    /// Sends a `size`-byte message whose last word is `value`.
    fn send(&mut self, via: Via, size: usize, value: u64) -> BenchResult<()> {
        match via {
            Via::Bar | Via::BarLean => {
                self.message[size - 8..size].copy_from_slice(&value.to_le_bytes());
                // SAFETY: the mapping holds at least `size` bytes; the kernel only reads it
                // (volatile), which is the point of the exercise; `message` is a distinct buffer.
                unsafe { copy_to_mapping(self.bar.host_ptr(), &self.message[..size]) };
                self.bar.flush(0, size as u64)?;
            }
            Via::Memcpy => {
                // The last copy from `staging` was waited for, so the stores race with nothing.
                self.staging.as_mut_slice()[size - 8..size].copy_from_slice(&value.to_le_bytes());
                let driver = self.gpu.driver();
                // SAFETY: the context is current (caller); `dev` and `staging` hold at least
                // `size` bytes; the copy is synchronised below before `staging` changes again.
                unsafe {
                    driver.cu_memcpy_htod_async(
                        self.dev.device_ptr(),
                        self.staging.as_ptr().cast(),
                        size,
                        self.copy_stream.raw(),
                    )
                }?;
                // SAFETY: live stream of the current context.
                unsafe { driver.cu_stream_synchronize(self.copy_stream.raw()) }?;
            }
        }
        Ok(())
    }

    /// Spins until the kernel's answer equals `value`.
    fn wait_answer(&self, value: u64) -> BenchResult<()> {
        let word = self.answer_word();
        let start = Instant::now();
        let mut spins = 0u32;
        // SAFETY: `word` is the first, 8-aligned word of a live pinned allocation the kernel
        // writes; volatile 8-byte loads of it are atomic on x86-64 and never elided.
        while unsafe { word.read_volatile() } != value {
            spins = spins.wrapping_add(1);
            if spins & 0xfff == 0 && start.elapsed() > ANSWER_TIMEOUT {
                // SAFETY: as above.
                let seen = unsafe { word.read_volatile() };
                return Err(BenchError::KernelStuck(format!(
                    "no answer {value} within {ANSWER_TIMEOUT:?} (last answer {seen})"
                )));
            }
            std::hint::spin_loop();
        }
        Ok(())
    }

    /// One kernel launch of `iters` round trips of `size`-byte messages; returns their times
    /// in ns (warm-up included).
    fn round_trips(&mut self, via: Via, size: u64, iters: u64) -> BenchResult<Vec<f64>> {
        // Nothing runs on the device now: reset the words the kernel compares.
        match via {
            Via::Bar | Via::BarLean => {
                let word = self.bar.host_ptr().wrapping_add(size as usize - 8);
                // SAFETY: 8 bytes inside the mapping (sizes are multiples of 8, at most its size).
                unsafe { copy_to_mapping(word, &[0; 8]) };
                self.bar.flush(size - 8, 8)?;
                // Reading the word back through the mapping makes sure the reset has arrived
                // before the kernel starts (a stale count would let it run ahead).
                self.bar.invalidate(size - 8, 8)?;
                // SAFETY: as above; 8-aligned (the mapping is page-aligned).
                if unsafe { word.cast::<u64>().read_volatile() } != 0 {
                    return Err(BenchError::Check(
                        "pplat: reset of the BAR word did not read back".into(),
                    ));
                }
            }
            Via::Memcpy => {
                // SAFETY: `dev` holds at least `size` bytes, 4-aligned.
                unsafe {
                    self.gpu
                        .memset_d32(self.dev.device_ptr(), 0, size as usize / 4)?
                };
            }
        }
        self.answer.write(0, &[0; 8])?;

        let (mut p_in, mut p_out, mut p_iters) =
            (self.in_ptr(via, size), self.answer.device_ptr(), iters);
        let mut params = [
            (&mut p_in as *mut u64).cast::<c_void>(),
            (&mut p_out as *mut u64).cast::<c_void>(),
            (&mut p_iters as *mut u64).cast::<c_void>(),
        ];
        // Created before the launch: once the kernel runs, every exit goes through the release
        // and wait below.
        let done = Event::new(self.gpu)?;
        let func = if via == Via::BarLean {
            &self.func_lean
        } else {
            &self.func
        };
        // SAFETY: `pingpong`/`pingpong_lean(u64*, u64*, u64)` take three 8-byte parameters,
        // matching `params`; both pointers stay valid until the kernel ends: the end of this
        // function waits for it, and if it cannot, the caller leaks the memory.
        unsafe {
            func.launch(
                LaunchConfig::linear(1, 1),
                Some(&self.kernel_stream),
                &mut params,
            )?
        };
        let mut result = done.record(&self.kernel_stream).map_err(BenchError::from);
        let recorded = result.is_ok();

        let mut times = Vec::with_capacity(iters as usize);
        if recorded {
            for i in 1..=iters {
                let t = Instant::now();
                if let Err(e) = self
                    .send(via, size as usize, i)
                    .and_then(|()| self.wait_answer(i))
                {
                    result = Err(e);
                    break;
                }
                times.push(t.elapsed().as_nanos() as f64);
            }
        }
        if result.is_err() {
            // Release every remaining wait of the kernel.
            let _ = self.send(via, size as usize, u64::MAX);
        }
        // Whatever happened, the kernel must be seen to end before its memory may be freed.
        let ended = if recorded {
            wait_event(&done, END_TIMEOUT).map_err(|e| e.to_string())
        } else {
            Err("no completion event could be recorded".to_string())
        };
        match ended {
            Ok(true) => result.map(|()| times),
            Ok(false) => Err(BenchError::KernelStuck(format!(
                "{}the kernel did not end within {END_TIMEOUT:?}",
                result.err().map(|e| format!("{e}; ")).unwrap_or_default()
            ))),
            Err(query) => Err(BenchError::KernelStuck(format!(
                "{}cannot tell whether the kernel ended: {query}",
                result.err().map(|e| format!("{e}; ")).unwrap_or_default()
            ))),
        }
    }
}

/// Polls `event` until it completes (`true`) or `timeout` passes (`false`).
fn wait_event(event: &Event, timeout: Duration) -> BenchResult<bool> {
    let start = Instant::now();
    loop {
        if event.is_complete()? {
            return Ok(true);
        }
        if start.elapsed() > timeout {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Runs the benchmark: one `pplat` report.
pub fn run(opts: &Options) -> BenchResult<Vec<Report>> {
    let base: u64 = if opts.quick { 10_000 } else { 100_000 };
    let sizes = sizes(opts.quick);
    let max = *sizes.last().expect("sizes");

    let gpu = open_gpu(OpenOptions::new())?;
    let module = Module::load_ptx(&gpu, PTX)?;
    let mut kit = Kit {
        gpu: &gpu,
        func: module.function("pingpong")?,
        func_lean: module.function("pingpong_lean")?,
        kernel_stream: Stream::new(&gpu)?,
        copy_stream: Stream::new(&gpu)?,
        answer: PinnedBuffer::new(&gpu, 64)?,
        bar: gpu.alloc(max)?,
        dev: DeviceBuffer::new(&gpu, max as usize)?,
        staging: HostPinned::new(&gpu, max as usize)?,
        message: vec![0; max as usize],
    };
    let ctx = gpu.bind()?;

    let mut report = Report::new("pplat", Unit::Nanoseconds);
    let mut outcome = Ok(());
    ui::phase("round trips", (METHODS.len() * sizes.len()) as u64);
    'outer: for (via, name) in [Via::Bar, Via::BarLean, Via::Memcpy]
        .into_iter()
        .zip(METHODS)
    {
        for &size in &sizes {
            let iters = iterations(base, size);
            ui::step(format!("{name} · {} × {iters}", fmt_size(size)));
            match kit.round_trips(via, size, iters) {
                Ok(times) => {
                    let s = Stats::of(&times[warmup(iters) as usize..]).expect("samples");
                    report.figures.push(Figure::measured(name, size, &s));
                }
                Err(e) => {
                    outcome = Err(e);
                    break 'outer;
                }
            }
        }
    }
    drop(ctx);
    if let Err(e) = outcome {
        if matches!(e, BenchError::KernelStuck(_)) {
            // A kernel may still be polling this memory: never free it under the kernel.
            std::mem::forget(kit);
            std::mem::forget(module);
        }
        return Err(e);
    }
    drop(kit);
    drop(module);

    report.notes.push(format!(
        "one kernel launch per method and size with {base} round trips (fewer above 4 KiB), the \
         first 10 % (at most 1000) discarded as warm-up; every round trip timed on its own"
    ));
    report.notes.push(
        "the message's last 8 bytes carry the sequence number the kernel waits for; the kernel \
         answers in pinned host memory that the CPU polls"
            .into(),
    );
    Ok(vec![report])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iteration_counts_shrink_with_size_but_keep_samples() {
        assert_eq!(iterations(100_000, 8), 100_000);
        assert_eq!(iterations(100_000, 4096), 100_000);
        assert_eq!(iterations(100_000, 32 << 10), 12_500);
        assert_eq!(iterations(100_000, 1 << 30), 100_000 / 64);
        assert_eq!(warmup(100_000), 1000);
        assert_eq!(warmup(500), 50);
        for size in [8, 1 << 20, 1 << 40] {
            for base in [1, 10, 10_000] {
                let it = iterations(base, size);
                assert!(it > warmup(it), "base {base} size {size}");
            }
        }
    }

    #[test]
    fn sizes_hold_whole_words() {
        for q in [false, true] {
            let s = sizes(q);
            assert_eq!(s[0], 8);
            assert!(s.iter().all(|v| v & 7 == 0));
            assert!(s.windows(2).all(|w| w[0] < w[1]));
        }
    }

    #[test]
    fn the_ptx_has_the_kernel() {
        assert!(PTX.contains(".entry pingpong("));
    }
}
