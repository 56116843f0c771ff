//! How each call is made and timed ([`Probe::call`]): on a worker thread, with the kernel running
//! when the [`Condition`] says so; a call that has not returned within the patience window is
//! recorded as one that waits, the kernel is stopped with a plain store to let it return, and
//! another thread tries an allocation meanwhile to see whether it is held up too.

use std::ffi::c_void;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use vkgdr::cuda::{
    CuMemHandle, Driver, MemAccessDesc, MemLocation, CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
};
use vkgdr::Gpu;

use super::spinner::Spinner;
use crate::bench::error::{BenchError, BenchResult};
use crate::ui;

/// Bytes of each allocation the calls make (a multiple of the VMM granularity).
pub(super) const SIZE: u64 = 2 << 20;
/// Offset of the completion word the legacy stream writes (u32).
const WORD: usize = 128;

/// Where the persistent kernel runs while the calls are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Condition {
    /// No kernel runs.
    Idle,
    /// The kernel runs on a non-blocking stream of its own.
    OwnStream,
    /// The kernel runs on the legacy default stream.
    LegacyStream,
}

impl Condition {
    /// The report of the calls made under this condition.
    pub(super) fn report_name(self) -> &'static str {
        match self {
            Condition::Idle => "waits-idle",
            Condition::OwnStream => "waits-own-stream",
            Condition::LegacyStream => "waits-legacy-stream",
        }
    }
}

/// One timed call's samples under one condition.
pub(super) struct Sample {
    pub(super) call: String,
    pub(super) ns: Vec<f64>,
    pub(super) waited: bool,
}

/// Makes the calls of one condition, timing each on a worker thread.
pub(super) struct Probe<'a> {
    pub(super) spinner: &'a mut Spinner,
    pub(super) condition: Condition,
    pub(super) patience: Duration,
    pub(super) samples: Vec<Sample>,
    /// Set when a call of the current scenario waited: its other repetitions are skipped.
    pub(super) scenario_waited: bool,
    /// What the calls showed besides their time (distinct lines).
    pub(super) observations: Vec<String>,
    /// The last value written to the completion word.
    pub(super) ticket: u32,
}

impl Probe<'_> {
    /// The device and host address of the completion word in the spinner's allocation.
    pub(super) fn word(&self) -> (u64, Handle) {
        (
            self.spinner.flags.device_ptr() + WORD as u64,
            // SAFETY: inside the 4 KiB allocation.
            Handle::of(unsafe { self.spinner.flags.host_ptr().add(WORD) }.cast()),
        )
    }

    /// The next value for the completion word.
    pub(super) fn next_ticket(&mut self) -> u32 {
        self.ticket += 1;
        self.ticket
    }

    /// Notes what a call showed besides its time (once).
    pub(super) fn observe(&mut self, line: String) {
        if !self.observations.contains(&line) {
            self.observations.push(line);
        }
    }

    /// Makes `f` on a worker thread, with the kernel running when the condition says so.
    pub(super) fn call<T: Send>(
        &mut self,
        name: &str,
        f: impl FnOnce() -> vkgdr::Result<T> + Send,
    ) -> BenchResult<T> {
        ui::step(name.to_string());
        match self.condition {
            Condition::Idle => {}
            c if !self.spinner.running => self.spinner.launch(c == Condition::LegacyStream)?,
            _ => {}
        }
        let (tx, rx) = mpsc::channel();
        let spinner = &*self.spinner;
        let patience = self.patience;
        let (result, elapsed, waited, bystander) = std::thread::scope(|s| {
            let worker = s.spawn(move || {
                let t = Instant::now();
                let r = f();
                let elapsed = t.elapsed();
                let _ = tx.send(());
                (r, elapsed)
            });
            let waited = rx.recv_timeout(patience).is_err();
            let mut bystander = None;
            if waited {
                // Does the stuck call hold up other threads? One allocation the non-waiting path
                // makes (Vulkan memory, fd, VMM import), from a third thread.
                let (btx, brx) = mpsc::channel();
                let gpu = &spinner.gpu;
                s.spawn(move || {
                    let t = Instant::now();
                    let r = bystander_allocation(gpu);
                    let _ = btx.send((r.is_ok(), t.elapsed()));
                });
                bystander = Some(brx.recv_timeout(patience));
                spinner.signal_stop();
            }
            let (r, elapsed) = worker.join().expect("a probed call panicked");
            (r, elapsed, waited, bystander)
        });
        match bystander {
            Some(Ok((ok, t))) => self.observe(format!(
                "while {name} waited, another thread allocated (Vulkan + VMM import) in {} µs{}",
                t.as_micros(),
                if ok { "" } else { " (and failed)" }
            )),
            Some(Err(_)) => self.observe(format!(
                "while {name} waited, another thread's allocation (Vulkan + VMM import) was held up too"
            )),
            None => {}
        }
        if waited {
            // The stop word is set: let the kernel finish, so the next call relaunches it.
            self.spinner.stop()?;
            self.scenario_waited = true;
        }
        let ns = elapsed.as_nanos() as f64;
        match self.samples.iter_mut().find(|s| s.call == name) {
            Some(s) => {
                s.ns.push(ns);
                s.waited |= waited;
            }
            None => self.samples.push(Sample {
                call: name.to_string(),
                ns: vec![ns],
                waited,
            }),
        }
        result.map_err(BenchError::from)
    }
}

/// What the non-waiting allocation path does, made while another call is stuck: Vulkan memory,
/// its fd, a VMM import of it, released again.
fn bystander_allocation(gpu: &Gpu) -> vkgdr::Result<()> {
    let d = gpu.driver();
    let mem = gpu.vulkan().allocate(SIZE)?;
    let fd = mem.export_fd()?;
    let _c = gpu.bind()?;
    let handle = import_fd(d, &fd)?;
    // SAFETY: ours, never mapped.
    unsafe { d.cu_mem_release(handle) }
}

/// A raw handle carried to a worker thread (driver handles are process-wide values).
#[derive(Clone, Copy)]
pub(super) struct Handle(u64);

impl Handle {
    /// The pointer it carries.
    pub(super) fn ptr(self) -> *mut c_void {
        self.0 as usize as *mut c_void
    }
    /// Carries `p`.
    pub(super) fn of(p: *mut c_void) -> Handle {
        Handle(p as usize as u64)
    }
}

/// Imports the Vulkan memory behind `fd` as a VMM allocation handle (the fd stays ours: the call
/// does not keep it).
pub(super) fn import_fd(d: &Driver, fd: &OwnedFd) -> vkgdr::Result<CuMemHandle> {
    // SAFETY: a live opaque fd (borrowed for the call) passed as the handle value; the call does
    // not keep it.
    unsafe {
        d.cu_mem_import_from_shareable_handle(
            fd.as_raw_fd() as isize as *mut c_void,
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        )
    }
}

/// Read-write access for the device of CUDA ordinal `ordinal`, for `cuMemSetAccess`.
pub(super) fn rw_access(ordinal: i32) -> MemAccessDesc {
    MemAccessDesc {
        location: MemLocation::device(ordinal),
        flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    }
}
