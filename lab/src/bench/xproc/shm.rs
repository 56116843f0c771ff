//! The anchor the ring lanes replace: a shared-memory queue of fixed-size records that producer
//! processes write and the owner drains into device memory with `cuMemcpyHtoDAsync`
//! ([`crate::child::shm`] has the layout and the producers). The owner's drain thread polls every
//! lane's tail, copies what is new (one copy per lane and wrap), synchronises the stream once and
//! then publishes each lane's head: the acknowledgement producers wait on. The mapping is
//! registered with `cuMemHostRegister`, so the copy engine reads the producers' records where
//! they wrote them; where the driver refuses that, the drain copies them into pinned staging
//! first (the note says which ran).

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use vkgdr::cuda_objects::{DeviceBuffer, Stream};
use vkgdr::Gpu;

use super::{child_error, DONE_TIMEOUT, FINISH_TIMEOUT, READY_TIMEOUT};
use crate::bench::error::{BenchError, BenchResult};
use crate::bench::host_pinned::HostPinned;
use crate::child::process::{ChildProcess, Spawn};
use crate::child::shm::{spans, ShmQueue};
use crate::child::Rtt;

/// How the drain read the producers' records.
pub(super) const REGISTERED: &str =
    "the queue's memfd mapping registered with cuMemHostRegister: the copies read it directly";
/// ... or, where registration was refused, through pinned staging.
pub(super) const STAGED: &str = "the queue's memfd mapping could not be registered";

/// What the drain thread did, and how.
#[derive(Default)]
struct DrainState {
    /// Why it stopped early.
    failed: Option<String>,
    /// How it read the records ([`REGISTERED`], or [`STAGED`] with the driver's refusal).
    path: Option<String>,
}

/// Drains `queue` into `dst` (lane `i` at `i * capacity`) until `stop`.
fn drain(
    gpu: &Gpu,
    queue: &ShmQueue,
    dst: u64,
    stop: &AtomicBool,
    state: &Mutex<DrainState>,
) -> BenchResult<()> {
    let _ctx = gpu.bind()?;
    let driver = gpu.driver();
    let stream = Stream::new(gpu)?;
    let (base, len) = queue.mapping();
    // SAFETY: the mapping is `len` bytes of this process, alive until after the unregistration
    // below (the queue outlives this function).
    let registered = unsafe { driver.cu_mem_host_register(base.cast(), len, 0) };
    let cap = queue.capacity();
    let staging = match &registered {
        Ok(()) => {
            lock(state).path = Some(REGISTERED.into());
            None
        }
        Err(e) => {
            lock(state).path = Some(format!(
                "{STAGED} ({e}): each batch is copied into cuMemHostAlloc staging, then by cuMemcpyHtoDAsync"
            ));
            Some(HostPinned::new(
                gpu,
                (u64::from(queue.lanes()) * cap) as usize,
            )?)
        }
    };
    let lanes = queue.lanes();
    let mut copied: Vec<u64> = (0..lanes)
        .map(|l| queue.head(l).load(Ordering::Acquire))
        .collect();
    let mut moved = vec![0u64; lanes as usize];
    let result = (|| -> BenchResult<()> {
        while !stop.load(Ordering::Relaxed) {
            let mut any = false;
            for l in 0..lanes {
                let i = l as usize;
                let tail = queue.tail(l).load(Ordering::Acquire);
                if tail <= copied[i] {
                    continue;
                }
                if tail - copied[i] > cap {
                    return Err(BenchError::Check(format!(
                        "shared-memory lane {l}: tail {tail} more than a capacity past {}",
                        copied[i]
                    )));
                }
                for (off, n) in spans(copied[i], tail, cap) {
                    let src = queue.at(l, off);
                    let src = match &staging {
                        None => src,
                        Some(s) => {
                            let at = s.as_ptr().wrapping_add((u64::from(l) * cap + off) as usize);
                            // SAFETY: `n` bytes of the lane's records (published by its tail)
                            // into the lane's part of the staging buffer, which no copy reads
                            // now (the last one was synchronised).
                            unsafe { std::ptr::copy_nonoverlapping(src, at, n as usize) };
                            at
                        }
                    };
                    // SAFETY: `n` bytes inside lane `l`'s part of `dst` (8 × capacity) from
                    // memory that stays valid and unchanged until the synchronisation below (the
                    // producer does not reuse it before the head passes it).
                    unsafe {
                        driver.cu_memcpy_htod_async(
                            dst + u64::from(l) * cap + off,
                            src.cast(),
                            n as usize,
                            stream.raw(),
                        )
                    }?;
                }
                moved[i] = tail;
                any = true;
            }
            if any {
                stream.synchronize()?;
                for l in 0..lanes {
                    let i = l as usize;
                    if moved[i] > copied[i] {
                        copied[i] = moved[i];
                        queue.head(l).store(copied[i], Ordering::Release);
                    }
                }
            } else {
                std::hint::spin_loop();
            }
        }
        Ok(())
    })();
    if registered.is_ok() {
        // SAFETY: registered above; no copy from it is in flight (each was synchronised).
        let _ = unsafe { driver.cu_mem_host_unregister(base.cast()) };
    }
    drop(staging);
    result
}

fn lock(m: &Mutex<DrainState>) -> std::sync::MutexGuard<'_, DrainState> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What one use of the queue measured.
pub(super) enum ShmRun {
    /// Throughput samples, GB/s of records in device memory.
    Rates(Vec<f64>),
    /// A lone record's round trips.
    Latency(Rtt),
}

/// Runs `lanes` producer processes against a queue drained by a thread of this process:
/// `reps` timed rounds of `records` records of `size` bytes per producer, or (with `lone`)
/// `records` round trips of one producer. Returns the figures and how the drain read.
pub(super) fn run(
    gpu: &Gpu,
    lanes: u32,
    capacity: u64,
    size: u64,
    records: u64,
    reps: u64,
    lone: bool,
) -> BenchResult<(ShmRun, String)> {
    let (queue, fd) = ShmQueue::create(lanes, capacity).map_err(BenchError::Check)?;
    let dst = DeviceBuffer::new(gpu, (u64::from(lanes) * capacity) as usize)?;
    let stop = AtomicBool::new(false);
    let state = Mutex::new(DrainState::default());
    let outcome = std::thread::scope(|s| {
        let drainer = std::thread::Builder::new()
            .name("vkgdr-shm-drain".into())
            .spawn_scoped(s, || {
                let r = drain(gpu, &queue, dst.device_ptr(), &stop, &state);
                if let Err(e) = &r {
                    lock(&state).failed = Some(e.to_string());
                }
                r
            })
            .map_err(|e| BenchError::Check(format!("a thread to drain the queue: {e}")))?;
        let measured = measure(
            gpu,
            &queue,
            fd.as_raw_fd(),
            dst.device_ptr(),
            &state,
            size,
            records,
            reps,
            lone,
        );
        stop.store(true, Ordering::Relaxed);
        let drained = drainer
            .join()
            .unwrap_or_else(|_| Err(BenchError::Check("the drain thread panicked".into())));
        let figures = measured?;
        drained?;
        Ok::<_, BenchError>(figures)
    })?;
    let path = lock(&state).path.clone().unwrap_or_default();
    Ok((outcome, path))
}

/// The owner's half while the drain runs: the producers started, each round timed from `go`
/// until every lane's head reached its end.
#[allow(clippy::too_many_arguments)]
fn measure(
    gpu: &Gpu,
    queue: &ShmQueue,
    fd: i32,
    dst: u64,
    state: &Mutex<DrainState>,
    size: u64,
    records: u64,
    reps: u64,
    lone: bool,
) -> BenchResult<ShmRun> {
    let drain_failed = || lock(state).failed.clone();
    // The drain says how it reads once it is ready.
    let t = Instant::now();
    while lock(state).path.is_none() {
        if let Some(e) = drain_failed() {
            return Err(BenchError::Check(format!("the drain thread: {e}")));
        }
        if t.elapsed() > Duration::from_secs(20) {
            return Err(BenchError::Check(
                "the drain thread did not start within 20 s".into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let lanes = queue.lanes();
    let cap = queue.capacity();
    let mut children = Vec::new();
    for lane in 0..lanes {
        let mut args: Vec<String> = [
            "xproc-shm".to_string(),
            format!("--fd={fd}"),
            format!("--lanes={lanes}"),
            format!("--lane={lane}"),
            format!("--capacity={cap}"),
            format!("--size={size}"),
            format!("--records={records}"),
            format!("--reps={reps}"),
        ]
        .into();
        if lone {
            args.push("--lone".into());
        }
        children.push(ChildProcess::spawn(Spawn {
            name: format!("shared-memory producer {lane}"),
            args,
            no_cuda: true,
            keep_fd: Some(fd),
        })?);
    }
    for c in &mut children {
        c.expect("ready", READY_TIMEOUT)?;
    }
    let outcome = if lone {
        children[0].go()?;
        let lat = children[0].expect("lat", DONE_TIMEOUT * 2)?;
        ShmRun::Latency(
            lat.read::<Rtt>()
                .map_err(|e| child_error(&children[0], e))?,
        )
    } else {
        let mut samples = Vec::new();
        for _ in 0..reps {
            let targets: Vec<u64> = (0..lanes)
                .map(|l| queue.tail(l).load(Ordering::Acquire) + records * size)
                .collect();
            for c in &mut children {
                c.go()?;
            }
            let t0 = Instant::now();
            let mut spins = 0u64;
            while (0..lanes).any(|l| queue.head(l).load(Ordering::Acquire) < targets[l as usize]) {
                spins += 1;
                if spins.is_multiple_of(1 << 16) {
                    if let Some(e) = drain_failed() {
                        return Err(BenchError::Check(format!("the drain thread: {e}")));
                    }
                    for c in &mut children {
                        if let Some(status) = c.has_exited() {
                            return Err(child_error(
                                c,
                                format!("exited ({status}) in the middle of a round"),
                            )
                            .into());
                        }
                    }
                    if t0.elapsed() > DONE_TIMEOUT {
                        let behind: Vec<String> = (0..lanes)
                            .map(|l| {
                                format!(
                                    "lane {l} {} of {}",
                                    queue.head(l).load(Ordering::Acquire),
                                    targets[l as usize]
                                )
                            })
                            .collect();
                        return Err(BenchError::Check(format!(
                            "shared-memory queue: not drained within {} s: {}",
                            DONE_TIMEOUT.as_secs(),
                            behind.join(", ")
                        )));
                    }
                }
                std::hint::spin_loop();
            }
            let secs = t0.elapsed().as_secs_f64();
            for c in &mut children {
                c.expect("done", DONE_TIMEOUT)?;
            }
            check_last_record(gpu, dst, cap, size, &targets)?;
            samples.push((records * size * u64::from(lanes)) as f64 / secs / 1e9);
        }
        ShmRun::Rates(samples)
    };
    for c in children {
        c.finish(FINISH_TIMEOUT)?;
    }
    Ok(outcome)
}

/// The last record of each lane, read back from device memory, carries its number.
fn check_last_record(gpu: &Gpu, dst: u64, cap: u64, size: u64, targets: &[u64]) -> BenchResult<()> {
    let _ctx = gpu.bind()?;
    for (lane, &end) in targets.iter().enumerate() {
        let at = dst + lane as u64 * cap + (end - size) % cap;
        let mut word = [0u8; 8];
        // SAFETY: 8 bytes inside lane `lane`'s part of the device buffer into a local; the copy is
        // synchronous.
        unsafe { gpu.driver().cu_memcpy_dtoh(word.as_mut_ptr().cast(), at, 8) }?;
        let got = u64::from_le_bytes(word);
        if got != end / size - 1 {
            return Err(BenchError::Check(format!(
                "shared-memory lane {lane}: the last record in device memory is number {got}, not {}",
                end / size - 1
            )));
        }
    }
    Ok(())
}
