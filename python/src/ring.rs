//! `DeviceRing` and `RingProducer`: thin wrappers of [`vkgdr::ring::DeviceRing`] and
//! [`vkgdr::ring::OwnedProducer`] (records from Python producers to a persistent GPU kernel).

use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use vkgdr::ring::core::RingError;
use vkgdr::ring::layout::WrapMode;
use vkgdr::ring::{CopyEngine, OwnedProducer, RingOptions};

use crate::device::gpu_of;
use crate::errors::{invalid_argument, to_py, vkgdr_error};
use crate::interface;
use crate::stream::stream_arg;
use crate::thread_slot::{Peek, ThreadSlot};

/// How long one GIL-free wait for ring space lasts before Python signals are checked.
const WAIT_SLICE: Duration = Duration::from_millis(50);

/// A ring buffer in BAR-mapped GPU memory that streams records to a running kernel (the
/// consumers of ``kernels/ring.cu``, or your own on its wire format).
///
/// ``DeviceRing(owner, capacity, *, mirrored=False, lanes=1, copy_engine=None,
/// copy_engine_split=False, shareable=False)``: ``capacity`` is a power of two of at least 4096
/// bytes per lane (for ``mirrored``, a multiple of the VMM granularity, 2 MiB on the H100).
/// ``lanes`` (1 to 64) are independent sub-rings, each with its own tail, head and sequence
/// numbers. ``push(data)`` appends one record from any thread
/// (on the calling thread's lane); ``producer()`` claims a lane for one thread (the fast path:
/// no locks, batches published at once, large records by a copy engine: those of at least
/// ``copy_engine`` bytes with their 16-byte header, 0 for never). ``copy_engine=None`` (the
/// default) lets the ring choose: on a ring of two lanes or more, lanes 0, 3 and 6 of each
/// eight stage records of 8 KiB and more and the others records of 1 KiB and more, once a
/// producer's batch has 64 KiB pending before them (unless the lanes' pinned staging copies
/// would hold more than 256 MiB in all); a one-lane ring keeps the BAR. ``device_view``
/// has the addresses the kernel needs (and keeps the ring alive). Call ``stop()`` to let a
/// persistent consumer exit.
///
/// ``copy_engine_split=True`` (with a positive ``copy_engine``) splits the lanes between the
/// two paths: three lanes in eight (those whose index modulo 8 is 0, 3 or 6) write records below
/// 8 KiB through the BAR, the others stage records of at least ``copy_engine`` bytes for the
/// copy engine: eight producers of 1 and 2 KiB records then drive both paths at once (figures:
/// BENCHMARKS.md, 'Lanes split between the BAR and the copy engine'). Producers claim lanes in
/// order: a ring's first producer takes the BAR, its second and third the copy engine.
/// The options are checked before ``owner`` is looked at.
///
/// Register the consumer with ``watch_consumer(stream)`` right after launching it: producers
/// then get an error instead of waiting forever once it exits, and dropping (collecting) the
/// ring tells the kernel to stop and keeps the ring's memory until the kernel has exited,
/// without waiting for it. Without that, the memory goes back once the work queued on the
/// legacy default stream (every blocking stream's too) has completed, which does not include a
/// consumer on a non-blocking stream: keep the ring until such a kernel has exited.
///
/// ``shareable=True`` makes a ring whose lanes ``ShareServer.share_ring`` lends to producers
/// in other processes (``vkgdr.Peer(path).attach_lane(name)``), one lane each: every lane's
/// region is an allocation of its own (rounded up to the VMM granularity), so a producer
/// reaches no other lane's records. Such a ring is padded and has no copy-engine path
/// (``mirrored``, ``copy_engine`` and ``copy_engine_split`` are refused); its consumers are the
/// same kernels, and this process's own producers take the lanes no peer holds. A ``ShareServer`` that shares the
/// ring keeps it alive until the server is closed.
#[pyclass(module = "vkgdr", name = "DeviceRing", frozen)]
pub struct DeviceRing {
    /// Shared with the ring's producers, which keep it alive.
    pub(crate) ring: Arc<vkgdr::ring::DeviceRing>,
    /// Made with `shareable=True` (its lanes can be lent).
    pub(crate) shareable: bool,
}

/// The device addresses a consumer kernel takes (``DeviceRing.device_view``). It keeps its ring
/// alive: while a view exists, the ring's memory does too.
#[pyclass(module = "vkgdr", name = "RingDeviceView", frozen, get_all)]
pub struct RingDeviceView {
    /// The ring these addresses belong to.
    ring: Py<DeviceRing>,
    /// Device address of the data region.
    data: u64,
    /// Capacity of the data region in bytes.
    capacity: u64,
    /// Device address of ``tail`` (u64, written by the host).
    tail: u64,
    /// Device address of ``stop`` (u32, written by the host).
    stop: u64,
    /// Device address of ``head`` (u64 in pinned host memory, written by the kernel).
    head: u64,
    /// Device address of the 8 result words (pinned host memory).
    result: u64,
    /// Whether records may run past the end of the region (use the ``_mirrored`` kernels).
    mirrored: bool,
    /// Number of lanes. ``data``, ``tail``, ``head`` and ``result`` are lane 0's; lane ``i``'s
    /// tail is at ``tail + 128 * i``, its head at ``head + 256 * i``, its results at
    /// ``result + 256 * i``.
    lanes: u32,
    /// Device address of a table of ``lanes`` u64s: each lane's data region.
    lane_data: u64,
}

#[pymethods]
impl RingDeviceView {
    /// ``(data, capacity, tail, stop, head, result)``: the arguments of
    /// ``ring_consume_persistent`` in that order.
    fn kernel_args(&self) -> (u64, u64, u64, u64, u64, u64) {
        (
            self.data,
            self.capacity,
            self.tail,
            self.stop,
            self.head,
            self.result,
        )
    }

    /// The 64 bytes of ``vkgdr_ring_view`` (``include/vkgdr/ring.cuh``), for kernels that take
    /// the view by value, such as ``ring_check_lanes`` (one block per lane): pass it as one
    /// kernel parameter.
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let mut out = Vec::with_capacity(64);
        for word in [
            self.data,
            self.capacity,
            self.tail,
            self.stop,
            self.head,
            self.result,
            self.lane_data,
        ] {
            out.extend_from_slice(&word.to_le_bytes());
        }
        out.extend_from_slice(&self.lanes.to_le_bytes());
        let wrap = if self.mirrored {
            WrapMode::Mirrored
        } else {
            WrapMode::Padded
        };
        out.extend_from_slice(&(wrap as u32).to_le_bytes());
        debug_assert_eq!(
            out.len(),
            std::mem::size_of::<vkgdr::ring::RingDeviceView>()
        );
        PyBytes::new(py, &out)
    }

    fn __repr__(&self) -> String {
        format!(
            "<vkgdr.RingDeviceView data={:#x} capacity={} tail={:#x} stop={:#x} head={:#x} \
             result={:#x} lanes={}{}>",
            self.data,
            self.capacity,
            self.tail,
            self.stop,
            self.head,
            self.result,
            self.lanes,
            if self.mirrored { " mirrored" } else { "" }
        )
    }
}

/// The deadline of a ``timeout`` argument in seconds (None: no limit).
fn deadline(timeout: Option<f64>) -> PyResult<Option<Instant>> {
    match timeout {
        None => Ok(None),
        Some(t) if t.is_finite() && t >= 0.0 => {
            Ok(Some(Instant::now() + Duration::from_secs_f64(t.min(1e9))))
        }
        Some(t) => Err(invalid_argument(format!("timeout {t} is not >= 0"))),
    }
}

/// How long the next GIL-free wait may last: a slice, or what is left before `deadline`
/// (`None` once it has passed).
fn next_slice(deadline: Option<Instant>) -> Option<Duration> {
    match deadline {
        None => Some(WAIT_SLICE),
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            (!left.is_zero()).then(|| left.min(WAIT_SLICE))
        }
    }
}

impl DeviceRing {
    /// Pushes without waiting (the library's push with a zero timeout): `Ok(None)` when the ring
    /// has no room now.
    fn try_push(&self, payload: &[u8]) -> Result<Option<u64>, vkgdr::Error> {
        match self.ring.push(payload, Some(Duration::ZERO)) {
            Ok(seq) => Ok(Some(seq)),
            Err(vkgdr::Error::Ring(RingError::Full | RingError::Timeout)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The library's choice for `DeviceRing(copy_engine=..., copy_engine_split=...)`.
fn copy_engine_of(copy_engine: Option<i64>, split: bool) -> PyResult<CopyEngine> {
    let record = match copy_engine {
        None | Some(0) if split => {
            return Err(invalid_argument(
                "copy_engine_split=True needs a copy_engine record size (4096, say)",
            ))
        }
        None => return Ok(CopyEngine::Auto),
        Some(0) => return Ok(CopyEngine::Off),
        Some(n) => u32::try_from(n).map_err(|_| {
            invalid_argument(format!(
                "copy_engine {n} is not a record size from 0 to 4294967295"
            ))
        })?,
    };
    Ok(if split {
        CopyEngine::Split(record)
    } else {
        CopyEngine::FromRecord(record)
    })
}

#[pymethods]
impl DeviceRing {
    #[new]
    #[pyo3(signature = (
        owner, capacity, *, mirrored = false, lanes = 1, copy_engine = None,
        copy_engine_split = false, shareable = false
    ))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn new(
        py: Python<'_>,
        owner: &Bound<'_, PyAny>,
        capacity: u64,
        mirrored: bool,
        lanes: u32,
        copy_engine: Option<i64>,
        copy_engine_split: bool,
        shareable: bool,
    ) -> PyResult<Self> {
        // The options first: no device is needed to refuse them.
        if shareable {
            if mirrored {
                return Err(invalid_argument(
                    "a shareable ring is padded: mirrored=True is not available for it",
                ));
            }
            if copy_engine_split {
                return Err(invalid_argument(
                    "a shareable ring has no copy-engine path: leave copy_engine_split out",
                ));
            }
            if copy_engine.is_some_and(|n| n != 0) {
                return Err(invalid_argument(
                    "a shareable ring has no copy-engine path: leave copy_engine out",
                ));
            }
        }
        let copy_engine = copy_engine_of(copy_engine, copy_engine_split)?;
        let gpu = gpu_of(owner)?;
        if shareable {
            let ring = py
                .detach(|| vkgdr::ring::DeviceRing::new_shareable(&gpu, capacity, lanes))
                .map_err(to_py)?;
            return Ok(DeviceRing {
                ring: Arc::new(ring),
                shareable: true,
            });
        }
        let options = RingOptions {
            lanes,
            wrap: if mirrored {
                WrapMode::Mirrored
            } else {
                WrapMode::Padded
            },
            copy_engine,
        };
        let ring = py
            .detach(|| vkgdr::ring::DeviceRing::with_options(&gpu, capacity, options))
            .map_err(to_py)?;
        Ok(DeviceRing {
            ring: Arc::new(ring),
            shareable: false,
        })
    }

    /// Appends one record holding the bytes of ``data`` (bytes-like, not empty); returns its
    /// sequence number. Waits for the kernel to free space up to ``timeout`` seconds (None:
    /// without limit; 0: not at all), without holding the GIL; raises ``RingFullError`` when
    /// the time is up. Ctrl-C interrupts the wait.
    #[pyo3(signature = (data, timeout = None))]
    fn push(&self, py: Python<'_>, data: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<u64> {
        let deadline = deadline(timeout)?;
        interface::with_bytes(data, |payload| -> PyResult<u64> {
            if let Some(seq) = self.try_push(payload).map_err(to_py)? {
                return Ok(seq);
            }
            loop {
                let Some(slice) = next_slice(deadline) else {
                    return Err(to_py(RingError::Full.into()));
                };
                match py.detach(|| self.ring.push(payload, Some(slice))) {
                    Ok(seq) => return Ok(seq),
                    Err(vkgdr::Error::Ring(RingError::Timeout)) => py.check_signals()?,
                    Err(e) => return Err(to_py(e)),
                }
            }
        })?
    }

    /// Claims a lane for one producer (a ``RingProducer``: records appended without locks,
    /// batches published with one fence and one tail store, records of at least ``copy_engine``
    /// bytes moved by a copy engine). Raises ``VkgdrError`` when every lane has a producer
    /// already. Close it (or leave its ``with`` block) to publish what is left and free the
    /// lane; it keeps the ring alive until then.
    fn producer(slf: &Bound<'_, Self>) -> PyResult<RingProducer> {
        let ring = &slf.get().ring;
        let producer = match ring.owned_producer() {
            Ok(p) => p,
            Err(vkgdr::Error::Ring(RingError::Claimed)) => {
                return Err(vkgdr_error(format!(
                    "every one of the ring's {} lanes has a producer: close one, or create the \
                     ring with more lanes",
                    ring.lanes()
                )))
            }
            Err(e) => return Err(to_py(e)),
        };
        Ok(RingProducer {
            ring: slf.clone().unbind(),
            producer: ThreadSlot::new("RingProducer", producer),
        })
    }

    /// The addresses a consumer kernel needs (a view that keeps this ring alive).
    #[getter]
    fn device_view(slf: &Bound<'_, Self>) -> RingDeviceView {
        let v = slf.get().ring.device_view();
        RingDeviceView {
            ring: slf.clone().unbind(),
            data: v.data,
            capacity: v.capacity,
            tail: v.tail,
            stop: v.stop,
            head: v.head,
            result: v.result,
            mirrored: v.wrap == WrapMode::Mirrored,
            lanes: v.lanes,
            lane_data: v.lane_data,
        }
    }

    /// How far the kernel has consumed (read from pinned host memory: cheap).
    #[getter]
    fn head(&self) -> u64 {
        self.ring.head()
    }

    /// The consumer's 8 result words (records, checksum sum, errors, next seq, position, ...).
    fn results(&self) -> Vec<u64> {
        self.ring.results().to_vec()
    }

    /// Number of lanes.
    #[getter]
    fn lanes(&self) -> usize {
        self.ring.lanes()
    }

    /// How far the kernel has consumed lane ``lane``.
    fn head_of(&self, lane: usize) -> PyResult<u64> {
        Ok(self.ring.head_of(self.check_lane(lane)?))
    }

    /// Lane ``lane``'s 8 result words.
    fn results_of(&self, lane: usize) -> PyResult<Vec<u64>> {
        Ok(self.ring.results_of(self.check_lane(lane)?).to_vec())
    }

    /// What the copy-engine path has done so far, over every lane: a dict of ``lanes_ready``
    /// (lanes whose staging copy and stream exist), ``copies`` (staged publications queued),
    /// ``bytes`` (bytes they copied), ``fallbacks`` (publications that went through the BAR
    /// because a copy could not be queued), ``stream_tails`` (publications through the BAR whose
    /// tail followed a copy's on the lane's stream) and ``unavailable`` (why the path could not
    /// be made, or None).
    fn copy_engine_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.ring.copy_engine_stats();
        let d = PyDict::new(py);
        d.set_item("lanes_ready", s.lanes_ready)?;
        d.set_item("copies", s.copies)?;
        d.set_item("bytes", s.bytes)?;
        d.set_item("fallbacks", s.fallbacks)?;
        d.set_item("stream_tails", s.stream_tails)?;
        d.set_item("unavailable", s.unavailable)?;
        Ok(d)
    }

    /// Asks a persistent consumer to exit once it has consumed everything published.
    fn stop(&self) {
        self.ring.stop()
    }

    /// Registers the consumer kernel just launched on ``stream`` (a CuPy, PyTorch, PyCUDA or
    /// Numba stream object, one with ``__cuda_stream__``, or a raw handle the program vouches
    /// for, ``vkgdr.RawStream(handle)``, which must name a live stream of the ring's device;
    /// ``RawStream(0)`` is the legacy default stream; a bare int raises ``TypeError``). Call it
    /// right after the launch: the ring records an event there, and its completion means the
    /// consumer has exited. Producers waiting for space then fail instead of waiting forever,
    /// and dropping the ring stops the kernel and keeps the ring's memory until it has exited,
    /// without waiting.
    fn watch_consumer(&self, py: Python<'_>, stream: &Bound<'_, PyAny>) -> PyResult<()> {
        let stream = stream_arg(stream, "watch_consumer(stream)")?;
        // SAFETY: a stream object is alive while `stream` holds it, until after the call; a
        // `RawStream` is the caller's promise (documented above); null is the legacy stream.
        py.detach(|| unsafe { self.ring.watch_consumer_stream(stream.raw()) })
            .map_err(to_py)
    }

    /// Capacity of the data region in bytes.
    #[getter]
    fn capacity(&self) -> u64 {
        self.ring.core().capacity()
    }

    /// The largest record payload this ring takes.
    #[getter]
    fn max_record(&self) -> u32 {
        self.ring.core().max_record()
    }

    /// End of the records published to the kernel (a byte position).
    #[getter]
    fn published(&self) -> u64 {
        self.ring.core().published()
    }

    /// Bytes producers may reserve now without waiting.
    #[getter]
    fn free_space(&self) -> u64 {
        self.ring.core().free_space()
    }

    /// Whether the ring was made with ``shareable=True`` (``ShareServer.share_ring`` lends
    /// its lanes).
    #[getter]
    fn is_shareable(&self) -> bool {
        self.shareable
    }

    fn __repr__(&self) -> String {
        format!(
            "<vkgdr.DeviceRing {} bytes x {} lanes, published {}, head {}{}>",
            self.ring.core().capacity(),
            self.ring.lanes(),
            self.ring.core().published(),
            self.ring.head(),
            if self.shareable { ", shareable" } else { "" }
        )
    }
}

impl DeviceRing {
    fn check_lane(&self, lane: usize) -> PyResult<usize> {
        let n = self.ring.lanes();
        if lane < n {
            Ok(lane)
        } else {
            Err(invalid_argument(format!(
                "lane {lane} does not exist (the ring has {n})"
            )))
        }
    }
}

/// The exclusive producer of one lane of a ``DeviceRing`` (``ring.producer()``): records are
/// appended without locks and published with one fence and one tail store per batch; records of
/// at least the ring's ``copy_engine`` size go through pinned memory and a copy engine. It keeps
/// the ring alive. ``close()`` (or the end of a ``with`` block) publishes what is left and hands
/// the lane back; a closed producer raises ``VkgdrError``.
///
/// For one thread at a time: a call while another thread is inside a call of the same producer
/// raises ``VkgdrError`` (give each thread its own producer). Waits for space release the GIL
/// and are interrupted by Ctrl-C.
#[pyclass(module = "vkgdr", name = "RingProducer", frozen)]
pub struct RingProducer {
    ring: Py<DeviceRing>,
    producer: ThreadSlot<OwnedProducer>,
}

/// A producer call that appends one record: [`OwnedProducer::push`] or [`OwnedProducer::write`].
type RecordOp = fn(&mut OwnedProducer, &[u8], Option<Duration>) -> Result<u64, RingError>;

impl RingProducer {
    /// Runs `f` on the open producer, or raises why it cannot.
    fn with<R>(&self, f: impl FnOnce(&mut OwnedProducer) -> PyResult<R>) -> PyResult<R> {
        self.producer
            .with("give each thread its own producer (ring.producer())", f)
    }

    /// One record through `op` (push or write): a try that does not wait, with the GIL held
    /// (the common case: one library call), then waits in GIL-free slices until `timeout`.
    fn record(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        op: RecordOp,
    ) -> PyResult<u64> {
        let deadline = deadline(timeout)?;
        self.with(|p| {
            interface::with_bytes(data, |payload| -> PyResult<u64> {
                match op(p, payload, Some(Duration::ZERO)) {
                    Ok(seq) => return Ok(seq),
                    Err(RingError::Full | RingError::Timeout) => {}
                    Err(e) => return Err(to_py(e.into())),
                }
                loop {
                    let Some(slice) = next_slice(deadline) else {
                        return Err(to_py(RingError::Full.into()));
                    };
                    match py.detach(|| op(p, payload, Some(slice))) {
                        Ok(seq) => return Ok(seq),
                        Err(RingError::Full | RingError::Timeout) => py.check_signals()?,
                        Err(e) => return Err(to_py(e.into())),
                    }
                }
            })?
        })
    }
}

#[pymethods]
impl RingProducer {
    /// Appends one record holding the bytes of ``data`` (bytes-like, not empty) and publishes
    /// it at once, with anything written before; returns its sequence number in the lane.
    /// Waits for space up to ``timeout`` seconds (None: without limit; 0: not at all) without
    /// the GIL; raises ``RingFullError`` when the time is up. Ctrl-C interrupts the wait.
    #[pyo3(signature = (data, timeout = None))]
    fn push(&self, py: Python<'_>, data: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<u64> {
        self.record(py, data, timeout, OwnedProducer::push)
    }

    /// Appends one record like ``push``, but publishes it only by the flush policy (once 64 KiB
    /// of records wait by default, ``set_flush_policy``), or at the next ``push``,
    /// ``push_batch``, ``flush``, wait for space or ``close``: many records for one fence and
    /// one tail store. Call ``flush()`` when a burst ends.
    #[pyo3(signature = (data, timeout = None))]
    fn write(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<u64> {
        self.record(py, data, timeout, OwnedProducer::write)
    }

    /// Appends every record of ``records`` (an iterable of bytes-like objects, none empty) and
    /// publishes them with one fence and one tail store (in pieces, while waiting, when they do
    /// not fit at once). Returns how many were written; their sequence numbers are
    /// ``next_seq`` (before the call) onwards. Waits as ``push`` does, without the GIL; on an
    /// error the records before the failing one are published.
    #[pyo3(signature = (records, timeout = None))]
    fn push_batch(
        &self,
        py: Python<'_>,
        records: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<u64> {
        let deadline = deadline(timeout)?;
        // `bytes` objects are taken as they are; other bytes-like objects are copied once.
        let objects = records
            .try_iter()?
            .map(|r| interface::to_bytes(&r?))
            .collect::<PyResult<Vec<_>>>()?;
        let payloads: Vec<&[u8]> = objects.iter().map(|b| b.as_bytes()).collect();
        self.with(|p| {
            let first = p.next_seq();
            let mut done = 0usize;
            // The first try waits what is left of the timeout's first slice (or not at all).
            let mut slice = next_slice(deadline).unwrap_or(Duration::ZERO);
            loop {
                let rest = &payloads[done..];
                let result = py.detach(|| p.push_batch(rest.iter().copied(), Some(slice)));
                // Each record takes one sequence number: how far the batch got.
                done = (p.next_seq() - first) as usize;
                match result {
                    Ok(_) => return Ok(done as u64),
                    Err(RingError::Full | RingError::Timeout) => {
                        py.check_signals()?;
                        slice =
                            next_slice(deadline).ok_or_else(|| to_py(RingError::Full.into()))?;
                    }
                    Err(e) => return Err(to_py(e.into())),
                }
            }
        })
    }

    /// Publishes every record written and not yet published.
    fn flush(&self) -> PyResult<()> {
        self.with(|p| {
            p.flush();
            Ok(())
        })
    }

    /// When ``write`` publishes on its own: once ``max_pending_bytes`` (records with headers)
    /// wait, or once the oldest has waited ``max_delay`` seconds (checked on each write; None:
    /// no bound). Records of 4 KiB and more take the copy engine only in a batch that has 64 KiB
    /// pending before them, so raise the byte bound (e.g. to 1 MiB) for streams of large records.
    #[pyo3(signature = (max_pending_bytes, max_delay = None))]
    fn set_flush_policy(&self, max_pending_bytes: u64, max_delay: Option<f64>) -> PyResult<()> {
        let max_delay = match max_delay {
            None => None,
            Some(t) if t.is_finite() && t >= 0.0 => Some(Duration::from_secs_f64(t.min(1e9))),
            Some(t) => return Err(invalid_argument(format!("max_delay {t} is not >= 0"))),
        };
        self.with(|p| {
            p.set_policy(vkgdr::ring::core::FlushPolicy {
                max_pending_bytes,
                max_delay,
            });
            Ok(())
        })
    }

    /// Bytes of a batch not yet published that this producer writes through the BAR before it
    /// stages a record of the ring's copy-engine size for the copy engine (64 KiB at first, so
    /// that a lone large record or a short batch keeps the BAR, which is quicker for it). Set it
    /// to 0 on producers that stream large records beside a lane whose lone records must arrive
    /// quickly: those records otherwise wait behind the BAR stores of each batch's first 64 KiB.
    /// Takes effect from the next record; no effect on a lane whose records all take the BAR.
    #[getter]
    fn stage_after(&self) -> PyResult<u64> {
        self.with(|p| Ok(p.stage_after()))
    }

    #[setter]
    fn set_stage_after(&self, bytes: &Bound<'_, PyAny>) -> PyResult<()> {
        let bytes: u64 = bytes.extract().map_err(|_| {
            invalid_argument(format!(
                "stage_after {bytes} is not a byte count from 0 to 18446744073709551615"
            ))
        })?;
        self.with(|p| {
            p.set_stage_after(bytes);
            Ok(())
        })
    }

    /// The sequence number the next record gets (in this producer's lane).
    #[getter]
    fn next_seq(&self) -> PyResult<u64> {
        self.with(|p| Ok(p.next_seq()))
    }

    /// The lane this producer owns (``ring.head_of(lane)``, ``ring.results_of(lane)``).
    #[getter]
    fn lane(&self) -> PyResult<usize> {
        self.with(|p| Ok(p.lane()))
    }

    /// The ring this producer writes.
    #[getter]
    fn ring(&self, py: Python<'_>) -> Py<DeviceRing> {
        self.ring.clone_ref(py)
    }

    /// Whether ``close()`` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.producer.is_closed()
    }

    /// Publishes what is left and hands the lane back. Closing twice does nothing.
    fn close(&self) -> PyResult<()> {
        self.producer.close()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close()?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        match self
            .producer
            .peek(|p| (p.lane(), p.next_seq(), p.pending()))
        {
            Peek::Open((lane, seq, pending)) => {
                format!("<vkgdr.RingProducer lane {lane}, next seq {seq}, {pending} bytes pending>")
            }
            Peek::Closed => "<vkgdr.RingProducer closed>".to_string(),
            Peek::InUse => "<vkgdr.RingProducer in use>".to_string(),
        }
    }
}
