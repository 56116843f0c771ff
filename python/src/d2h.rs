//! `DeviceToHostRing`, `DeviceToHostView`, `LaneConsumer` and `LaneRecord`: thin wrappers of
//! [`vkgdr::ring::DeviceToHostRing`] and its [`LaneConsumer`] (records from kernels to Python
//! threads, one consumer per lane).

use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use vkgdr::ring::core::d2h::{LaneConsumer as Consumer, LaneShape, Poll, SlotFormat};
use vkgdr::ring::D2hLane;

use crate::device::gpu_of;
use crate::errors::{invalid_argument, to_py};
use crate::thread_slot::{Peek, ThreadSlot};

/// How long one GIL-free wait for a record lasts before Python signals are checked.
const WAIT_SLICE: Duration = Duration::from_millis(50);

/// A ring whose records go from kernels to Python threads: kernels publish fixed-size records
/// with ``include/vkgdr/ring_d2h.cuh`` into ``device_view``; one ``LaneConsumer`` per lane
/// (``consumer(lane)``) takes them in order.
///
/// ``DeviceToHostRing(owner, slots, stride, *, lanes=1, spin_limit=1000000,
/// format="committed")``: ``lanes`` (1 to 1024) lanes of ``slots`` slots (a power of two, 2 to
/// 2**24) of ``stride`` bytes (a power of two, 32 to 65536; a record carries up to ``stride -
/// 16`` payload bytes). ``format="tagged"``: every 8-byte word of a slot carries four bytes and
/// its record's tag, so a record needs no fence before it counts and reaches the CPU a PCIe
/// round trip sooner, at ``stride // 2 - 8`` payload bytes (for status words, completion
/// notices and release tokens; the kernels need no change). The warp calls of
/// ``ring_d2h.cuh`` reserve up to 32 slots at once: give a lane at least 32. A kernel's
/// publication into a full lane gives up (``VKGDR_D2H_STALLED``) after ``spin_limit`` looks at
/// a head that does not move (each a read of GPU memory and a nap of up to about 4 µs).
///
/// Tell the consumers that the producing kernels are done with ``finish()`` once their stream
/// was synchronised: a lane whose records were all taken then ends (its iterator stops) instead
/// of waiting. ``restart()`` clears that before the next launch. ``close()`` closes every lane:
/// kernels waiting for room give up with ``VKGDR_D2H_CLOSED``.
#[pyclass(module = "vkgdr", name = "DeviceToHostRing", frozen)]
pub struct DeviceToHostRing {
    /// Shared with nothing else: the consumers keep the ring's memory alive through their own
    /// reference, and this object through `LaneConsumer::ring`.
    ring: Arc<vkgdr::ring::DeviceToHostRing>,
}

/// What a producing kernel takes (``DeviceToHostRing.device_view``): the fields of
/// ``vkgdr_d2h_view`` (``include/vkgdr/ring_d2h.cuh``) as ints, and ``to_bytes()``, its 48
/// bytes to pass as one kernel parameter. It keeps its ring alive.
#[pyclass(module = "vkgdr", name = "DeviceToHostView", frozen, get_all)]
pub struct DeviceToHostView {
    /// The ring these addresses belong to.
    ring: Py<DeviceToHostRing>,
    /// Device address of lane 0's slots; lane ``i``'s are ``i * slots_per_lane * stride``
    /// bytes further.
    slots: u64,
    /// Device address of lane 0's control block (``head``, ``closed``); lane ``i``'s is
    /// ``128 * i`` bytes further.
    control: u64,
    /// Device address of lane 0's device state; lane ``i``'s is ``128 * i`` bytes further.
    device: u64,
    /// Slots per lane.
    slots_per_lane: u32,
    /// Bytes per slot.
    stride: u32,
    /// Number of lanes.
    lanes: u32,
    /// Looks at a full lane's unmoving head before a publication gives up.
    spin_limit: u32,
    /// How the slots carry their records: 0 committed, 1 tagged (``VKGDR_D2H_FORMAT_*``).
    format: u32,
}

#[pymethods]
impl DeviceToHostView {
    /// The 48 bytes of ``vkgdr_d2h_view``, for the kernel's by-value parameter.
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let view = vkgdr::ring::core::d2h::D2hDeviceView {
            slots_addr: self.slots,
            control_addr: self.control,
            device_addr: self.device,
            slots: self.slots_per_lane,
            stride: self.stride,
            lanes: self.lanes,
            spin_limit: self.spin_limit,
            format: self.format,
            reserved: 0,
        };
        PyBytes::new(py, &view.to_bytes())
    }

    fn __repr__(&self) -> String {
        format!(
            "<vkgdr.DeviceToHostView slots={:#x} control={:#x} device={:#x} {} lanes of {} x \
             {} bytes>",
            self.slots, self.control, self.device, self.lanes, self.slots_per_lane, self.stride
        )
    }
}

impl DeviceToHostRing {
    /// The library's ring (for `Pool.set_release_feed`).
    pub(crate) fn library(&self) -> &vkgdr::ring::DeviceToHostRing {
        &self.ring
    }
}

#[pymethods]
impl DeviceToHostRing {
    #[new]
    #[pyo3(signature = (owner, slots, stride, *, lanes = 1, spin_limit = 1_000_000, format = "committed"))]
    fn new(
        py: Python<'_>,
        owner: &Bound<'_, PyAny>,
        slots: u32,
        stride: u32,
        lanes: u32,
        spin_limit: u32,
        format: &str,
    ) -> PyResult<Self> {
        // The shape and format are checked before the owner is looked at.
        let format = match format {
            "committed" => SlotFormat::Committed,
            "tagged" => SlotFormat::Tagged,
            other => {
                return Err(invalid_argument(format!(
                    "format {other:?}: \"committed\" or \"tagged\""
                )))
            }
        };
        let shape = LaneShape::new(slots, stride)
            .map_err(|e| to_py(e.into()))?
            .with_format(format);
        let gpu = gpu_of(owner)?;
        let ring = py
            .detach(|| vkgdr::ring::DeviceToHostRing::new(&gpu, lanes, shape, spin_limit))
            .map_err(to_py)?;
        Ok(DeviceToHostRing {
            ring: Arc::new(ring),
        })
    }

    /// The consumer of lane ``lane`` (a ``LaneConsumer``), resuming where the lane's last one
    /// stopped; one at a time per lane (``VkgdrError`` while the lane has one: close it first).
    fn consumer(slf: &Bound<'_, Self>, lane: u32) -> PyResult<LaneConsumer> {
        let ring = &slf.get().ring;
        let n = ring.lanes();
        if lane >= n {
            return Err(invalid_argument(format!(
                "lane {lane} does not exist (the ring has {n})"
            )));
        }
        let consumer = ring.consumer(lane).map_err(to_py)?;
        Ok(LaneConsumer {
            ring: slf.clone().unbind(),
            lane,
            state: ThreadSlot::new("LaneConsumer", consumer),
        })
    }

    /// What a producing kernel takes (a view that keeps this ring alive).
    #[getter]
    fn device_view(slf: &Bound<'_, Self>) -> DeviceToHostView {
        let v = slf.get().ring.device_view();
        DeviceToHostView {
            ring: slf.clone().unbind(),
            slots: v.slots_addr,
            control: v.control_addr,
            device: v.device_addr,
            slots_per_lane: v.slots,
            stride: v.stride,
            lanes: v.lanes,
            spin_limit: v.spin_limit,
            format: v.format,
        }
    }

    /// Number of lanes.
    #[getter]
    fn lanes(&self) -> u32 {
        self.ring.lanes()
    }

    /// Slots per lane.
    #[getter]
    fn slots(&self) -> u32 {
        self.ring.shape().slots()
    }

    /// Bytes per slot.
    #[getter]
    fn stride(&self) -> u32 {
        self.ring.shape().stride()
    }

    /// The largest payload a record carries (``stride - 16``; tagged: ``stride // 2 - 8``).
    #[getter]
    fn max_payload(&self) -> u32 {
        self.ring.shape().max_payload()
    }

    /// How the slots carry their records: ``"committed"`` or ``"tagged"``.
    #[getter]
    fn format(&self) -> &'static str {
        match self.ring.shape().format() {
            SlotFormat::Committed => "committed",
            SlotFormat::Tagged => "tagged",
        }
    }

    /// Looks at a full lane's unmoving head before a publication gives up.
    #[getter]
    fn spin_limit(&self) -> u32 {
        self.ring.spin_limit()
    }

    /// Declares the producing kernels finished (the caller synchronised their stream): a lane
    /// whose records were all taken then ends instead of waiting.
    fn finish(&self) {
        self.ring.finish()
    }

    /// Clears ``finish()`` before a new launch publishes into the ring.
    fn restart(&self) {
        self.ring.restart()
    }

    /// Whether the producers were declared finished.
    #[getter]
    fn is_finished(&self) -> bool {
        self.ring.is_finished()
    }

    /// Closes every lane: kernels waiting for room, and later publications, give up with
    /// ``VKGDR_D2H_CLOSED``. Records committed before stay to be taken.
    fn close(&self) {
        self.ring.close()
    }

    /// Lane ``lane``'s counters, a dict of ``reserved`` (records the kernels reserved),
    /// ``taken`` (records the consumers took) and ``gave_up`` (publications refused). Read
    /// through the BAR: not for a hot loop.
    fn lane_stats<'py>(&self, py: Python<'py>, lane: u32) -> PyResult<Bound<'py, PyDict>> {
        let n = self.ring.lanes();
        if lane >= n {
            return Err(invalid_argument(format!(
                "lane {lane} does not exist (the ring has {n})"
            )));
        }
        let s = self.ring.lane_stats(lane).map_err(to_py)?;
        let d = PyDict::new(py);
        d.set_item("reserved", s.reserved)?;
        d.set_item("taken", s.taken)?;
        d.set_item("gave_up", s.gave_up)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        let shape = self.ring.shape();
        format!(
            "<vkgdr.DeviceToHostRing {} lanes of {} slots x {} bytes>",
            self.ring.lanes(),
            shape.slots(),
            shape.stride()
        )
    }
}

/// One record a ``LaneConsumer`` took: its sequence number in the lane (0, 1, 2, ... in the
/// device's reservation order), its kind and a copy of its payload.
#[pyclass(module = "vkgdr", name = "LaneRecord", frozen, get_all)]
pub struct LaneRecord {
    /// Sequence number in the lane.
    seq: u64,
    /// The kind the kernel gave it.
    kind: u32,
    /// The payload (a copy: the slot is the device's again).
    payload: Py<PyBytes>,
}

#[pymethods]
impl LaneRecord {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "<vkgdr.LaneRecord seq {} kind {} {} bytes>",
            self.seq,
            self.kind,
            self.payload.bind(py).as_bytes().len()
        )
    }
}

/// What one look at a lane found, owned (so that it leaves a GIL-free closure).
enum Found {
    Record(u64, u32, Vec<u8>),
    Pending,
    Ended,
}

impl From<Poll<'_>> for Found {
    fn from(p: Poll<'_>) -> Self {
        match p {
            Poll::Record(r) => Found::Record(r.seq, r.kind, r.payload.to_vec()),
            Poll::Pending => Found::Pending,
            Poll::Ended => Found::Ended,
        }
    }
}

/// The consumer of one lane of a ``DeviceToHostRing`` (``ring.consumer(lane)``): takes the
/// lane's records in order, each checked and copied out, and hands their slots back to the
/// device. An iterator: ``for rec in consumer`` waits for records (without the GIL, Ctrl-C
/// interrupts) and stops once the ring was declared finished (``ring.finish()``) and every
/// record was taken. ``next(timeout)`` waits up to ``timeout`` seconds; ``try_next()`` does not
/// wait. It keeps the ring alive.
///
/// ``close()`` (or the end of a ``with`` block) closes the lane: kernels waiting for room give up
/// with ``VKGDR_D2H_CLOSED``, and the lane is free for a new consumer, which resumes where this
/// one stopped. A closed consumer raises ``VkgdrError``. For one thread at a time: a call while
/// another thread is inside one raises ``VkgdrError``.
#[pyclass(module = "vkgdr", name = "LaneConsumer", frozen)]
pub struct LaneConsumer {
    ring: Py<DeviceToHostRing>,
    lane: u32,
    state: ThreadSlot<Consumer<D2hLane>>,
}

impl LaneConsumer {
    /// Runs `f` on the open consumer, or raises why it cannot.
    fn with<R>(&self, f: impl FnOnce(&mut Consumer<D2hLane>) -> PyResult<R>) -> PyResult<R> {
        self.state.with("a lane has one consumer thread", f)
    }

    /// Waits for the next record up to `deadline` (None: without limit) in GIL-free slices,
    /// checking signals between them.
    fn wait(&self, py: Python<'_>, deadline: Option<Instant>) -> PyResult<Found> {
        self.with(|c| loop {
            let slice = match deadline {
                None => WAIT_SLICE,
                Some(d) => d.saturating_duration_since(Instant::now()).min(WAIT_SLICE),
            };
            let found = py
                .detach(|| c.next_timeout(slice).map(Found::from))
                .map_err(|e| to_py(e.into()))?;
            match found {
                Found::Pending if deadline.is_none_or(|d| Instant::now() < d) => {
                    py.check_signals()?
                }
                found => return Ok(found),
            }
        })
    }
}

/// A `LaneRecord` for a record found, `None` otherwise.
fn record(py: Python<'_>, found: Found) -> Option<LaneRecord> {
    match found {
        Found::Record(seq, kind, payload) => Some(LaneRecord {
            seq,
            kind,
            payload: PyBytes::new(py, &payload).unbind(),
        }),
        Found::Pending | Found::Ended => None,
    }
}

#[pymethods]
impl LaneConsumer {
    /// The next record if it has arrived, else None (without waiting).
    fn try_next(&self, py: Python<'_>) -> PyResult<Option<LaneRecord>> {
        let found = self.with(|c| c.poll().map(Found::from).map_err(|e| to_py(e.into())))?;
        Ok(record(py, found))
    }

    /// The next record, waiting up to ``timeout`` seconds (None: without limit; 0: one look)
    /// without the GIL; None when none came in time or the lane ended (``ended`` tells which).
    /// Ctrl-C interrupts the wait.
    #[pyo3(signature = (timeout = None))]
    fn next(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<LaneRecord>> {
        let deadline = match timeout {
            None => None,
            Some(t) if t.is_finite() && t >= 0.0 => {
                Some(Instant::now() + Duration::from_secs_f64(t.min(1e9)))
            }
            Some(t) => return Err(invalid_argument(format!("timeout {t} is not >= 0"))),
        };
        Ok(record(py, self.wait(py, deadline)?))
    }

    /// Hands the slots of every record taken back to the device now. A take leaves the lane's
    /// head one record behind and moves it at the consumer's next call or close (its store is
    /// then not on the record's way to Python); call this before holding on to a record a
    /// while.
    fn publish_head(&self) -> PyResult<()> {
        self.with(|c| {
            c.publish_head();
            Ok(())
        })
    }

    /// Whether the lane has ended: the ring was declared finished and every record was taken.
    #[getter]
    fn ended(&self) -> PyResult<bool> {
        let done = self.ring.get().ring.is_finished();
        self.with(|c| Ok(done && !c.is_ready()))
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<LaneRecord>> {
        // None ends the iteration (PyO3 raises StopIteration).
        Ok(record(py, self.wait(py, None)?))
    }

    /// The sequence number of the next record (= records taken from the lane).
    #[getter]
    fn next_seq(&self) -> PyResult<u64> {
        self.with(|c| Ok(c.next_seq()))
    }

    /// The lane this consumer takes from.
    #[getter]
    fn lane(&self) -> u32 {
        self.lane
    }

    /// The ring this consumer takes from.
    #[getter]
    fn ring(&self, py: Python<'_>) -> Py<DeviceToHostRing> {
        self.ring.clone_ref(py)
    }

    /// Whether ``close()`` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.state.is_closed()
    }

    /// Closes the lane and frees it for a new consumer. Closing twice does nothing.
    fn close(&self) -> PyResult<()> {
        self.state.close()
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
        match self.state.peek(|c| c.next_seq()) {
            Peek::Open(seq) => format!("<vkgdr.LaneConsumer lane {}, next seq {seq}>", self.lane),
            Peek::Closed => format!("<vkgdr.LaneConsumer lane {} closed>", self.lane),
            Peek::InUse => format!("<vkgdr.LaneConsumer lane {} in use>", self.lane),
        }
    }
}
