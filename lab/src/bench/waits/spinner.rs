//! The persistent kernel the calls run beside ([`Spinner`]): `spin_until_stopped` (in
//! kernels/mapping.cu) spins on a stop word in BAR memory and beats a heartbeat there, so the CPU
//! can see it run and stop it with a plain store, without a driver call.

use std::ffi::c_void;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use vkgdr::cuda_objects::{LaunchConfig, Module, Stream};
use vkgdr::{Gpu, RawMemory};

use crate::bench::error::{BenchError, BenchResult};

pub(super) const PTX: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../kernels/mapping.ptx"
));

/// Offsets of the kernel's stop word (u32) and heartbeat (u64) in its BAR allocation.
const STOP: usize = 0;
const BEATS: usize = 64;

/// The persistent kernel and the BAR words that steer it.
pub(super) struct Spinner {
    pub(super) gpu: Gpu,
    pub(super) module: Module,
    pub(super) flags: RawMemory,
    pub(super) stream: Stream,
    pub(super) running: bool,
    pub(super) on_legacy: bool,
}

impl Spinner {
    /// Loads the kernel and allocates its BAR words; nothing runs yet.
    pub(super) fn new(gpu: &Gpu) -> BenchResult<Spinner> {
        Ok(Spinner {
            gpu: gpu.clone(),
            module: Module::load_ptx(gpu, PTX)?,
            flags: gpu.alloc(4096)?,
            stream: Stream::new(gpu)?,
            running: false,
            on_legacy: false,
        })
    }

    fn stop_word(&self) -> &AtomicU32 {
        // SAFETY: an aligned u32 inside the 4 KiB allocation, alive as long as `self`; the host
        // touches it only through this atomic, the kernel with volatile loads.
        unsafe { AtomicU32::from_ptr(self.flags.host_ptr().add(STOP).cast()) }
    }

    fn beats(&self) -> u64 {
        // SAFETY: an aligned u64 inside the allocation; the kernel writes it with volatile
        // stores, the host only reads it.
        unsafe { std::ptr::read_volatile(self.flags.host_ptr().add(BEATS).cast::<u64>()) }
    }

    /// Launches the kernel and waits until its heartbeat shows it running.
    pub(super) fn launch(&mut self, on_legacy: bool) -> BenchResult<()> {
        self.stop_word().store(0, Ordering::Relaxed);
        // SAFETY: as in `beats`; the kernel is not running, so the host may write the word.
        unsafe { std::ptr::write_volatile(self.flags.host_ptr().add(BEATS).cast::<u64>(), 0) };
        fence(Ordering::SeqCst);
        self.flags.flush(0, 128)?;
        let f = self.module.function("spin_until_stopped")?;
        let (mut stop, mut beats) = (
            self.flags.device_ptr() + STOP as u64,
            self.flags.device_ptr() + BEATS as u64,
        );
        let mut params = [
            &mut stop as *mut u64 as *mut c_void,
            &mut beats as *mut u64 as *mut c_void,
        ];
        let stream = (!on_legacy).then_some(&self.stream);
        // SAFETY: two pointer parameters, as the kernel declares; both point into `flags`, which
        // outlives every launch (the kernel is stopped and waited for before `flags` drops).
        unsafe { f.launch(LaunchConfig::linear(1, 1), stream, &mut params) }?;
        self.running = true;
        self.on_legacy = on_legacy;
        let t = Instant::now();
        while self.beats() == 0 {
            if t.elapsed() > Duration::from_secs(10) {
                return Err(BenchError::KernelStuck(
                    "spin_until_stopped showed no heartbeat within 10 s".into(),
                ));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }

    /// Asks the kernel to stop with a plain store: safe to call while another thread is stuck
    /// in the driver.
    pub(super) fn signal_stop(&self) {
        self.stop_word().store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Stops the kernel and waits until it has exited (its last heartbeat is odd).
    pub(super) fn stop(&mut self) -> BenchResult<()> {
        if !self.running {
            return Ok(());
        }
        self.signal_stop();
        let t = Instant::now();
        while self.beats() & 1 == 0 {
            if t.elapsed() > Duration::from_secs(10) {
                return Err(BenchError::KernelStuck(
                    "spin_until_stopped did not exit within 10 s of its stop word".into(),
                ));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        if self.on_legacy {
            self.gpu.synchronize()?;
        } else {
            self.stream.synchronize()?;
        }
        self.running = false;
        Ok(())
    }

    /// Whether the heartbeat still advances (the kernel really runs beside the calls).
    pub(super) fn alive(&self) -> bool {
        let a = self.beats();
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(200) {
            if self.beats() != a {
                return true;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        false
    }
}
