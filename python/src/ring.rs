//! `DeviceRing`: a thin wrapper of [`vkgdr::ring::DeviceRing`] (records from Python producers to
//! a persistent GPU kernel).

use std::time::{Duration, Instant};

use pyo3::prelude::*;
use vkgdr::ring::core::RingError;
use vkgdr::ring::layout::WrapMode;

use crate::device::gpu_of;
use crate::errors::{invalid_argument, to_py};
use crate::interface;
use crate::stream::stream_arg;

/// How long one GIL-free wait for ring space lasts before Python signals are checked.
const WAIT_SLICE: Duration = Duration::from_millis(50);

/// A ring buffer in BAR-mapped GPU memory that streams records to a running kernel (the
/// consumers of ``kernels/ring.cu``, or your own on its wire format).
///
/// ``DeviceRing(owner, capacity, *, mirrored=False)``: ``capacity`` is a power of two of at
/// least 4096 bytes (for ``mirrored``, a multiple of the VMM granularity, 2 MiB on the H100).
/// ``push(data)`` appends one record from any thread; ``device_view`` has the addresses the
/// kernel needs (and keeps the ring alive). Call ``stop()`` to let a persistent consumer exit.
///
/// Register the consumer with ``watch_consumer(stream)`` right after launching it: producers
/// then get an error instead of waiting forever once it exits, and dropping (collecting) the
/// ring tells the kernel to stop and keeps the ring's memory until the kernel has exited,
/// without waiting for it. Without that, the memory goes back once the work queued on the
/// legacy default stream (every blocking stream's too) has completed, which does not include a
/// consumer on a non-blocking stream: keep the ring until such a kernel has exited.
#[pyclass(module = "vkgdr", name = "DeviceRing", frozen)]
pub struct DeviceRing {
    ring: vkgdr::ring::DeviceRing,
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

    fn __repr__(&self) -> String {
        format!(
            "<vkgdr.RingDeviceView data={:#x} capacity={} tail={:#x} stop={:#x} head={:#x} \
             result={:#x}{}>",
            self.data,
            self.capacity,
            self.tail,
            self.stop,
            self.head,
            self.result,
            if self.mirrored { " mirrored" } else { "" }
        )
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

#[pymethods]
impl DeviceRing {
    #[new]
    #[pyo3(signature = (owner, capacity, *, mirrored = false))]
    fn new(
        py: Python<'_>,
        owner: &Bound<'_, PyAny>,
        capacity: u64,
        mirrored: bool,
    ) -> PyResult<Self> {
        let gpu = gpu_of(owner)?;
        let ring = py
            .detach(|| {
                if mirrored {
                    vkgdr::ring::DeviceRing::new_mirrored(&gpu, capacity)
                } else {
                    vkgdr::ring::DeviceRing::new(&gpu, capacity)
                }
            })
            .map_err(to_py)?;
        Ok(DeviceRing { ring })
    }

    /// Appends one record holding the bytes of ``data`` (bytes-like, not empty); returns its
    /// sequence number. Waits for the kernel to free space up to ``timeout`` seconds (None:
    /// without limit; 0: not at all), without holding the GIL; raises ``RingFullError`` when
    /// the time is up. Ctrl-C interrupts the wait.
    #[pyo3(signature = (data, timeout = None))]
    fn push(&self, py: Python<'_>, data: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<u64> {
        let deadline = match timeout {
            None => None,
            Some(t) if t.is_finite() && t >= 0.0 => {
                Some(Instant::now() + Duration::from_secs_f64(t.min(1e9)))
            }
            Some(t) => return Err(invalid_argument(format!("timeout {t} is not >= 0"))),
        };
        interface::with_bytes(data, |payload| -> PyResult<u64> {
            if let Some(seq) = self.try_push(payload).map_err(to_py)? {
                return Ok(seq);
            }
            loop {
                let slice = match deadline {
                    None => WAIT_SLICE,
                    Some(d) => {
                        let left = d.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            return Err(to_py(RingError::Full.into()));
                        }
                        left.min(WAIT_SLICE)
                    }
                };
                match py.detach(|| self.ring.push(payload, Some(slice))) {
                    Ok(seq) => return Ok(seq),
                    Err(vkgdr::Error::Ring(RingError::Timeout)) => py.check_signals()?,
                    Err(e) => return Err(to_py(e)),
                }
            }
        })?
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

    /// Asks a persistent consumer to exit once it has consumed everything published.
    fn stop(&self) {
        self.ring.stop()
    }

    /// Registers the consumer kernel just launched on ``stream`` (an int ``CUstream``, 0 for the
    /// legacy default stream, or a CuPy, PyTorch, PyCUDA or Numba stream object; an int must
    /// name a live stream of the ring's device). Call it right after the launch: the ring
    /// records an event there, and its completion means the consumer has exited. Producers
    /// waiting for space then fail instead of waiting forever, and dropping the ring stops the
    /// kernel and keeps the ring's memory until it has exited, without waiting.
    fn watch_consumer(&self, py: Python<'_>, stream: &Bound<'_, PyAny>) -> PyResult<()> {
        let stream = stream_arg(stream)?;
        // SAFETY: a stream object is alive while `stream` holds it, until after the call; an
        // int handle is the caller's promise (documented above); null is the legacy stream.
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

    fn __repr__(&self) -> String {
        format!(
            "<vkgdr.DeviceRing {} bytes, published {}, head {}>",
            self.ring.core().capacity(),
            self.ring.core().published(),
            self.ring.head()
        )
    }
}
