//! `_Vkgdr`, what a `vkgdr.Vkgdr` holds (an open device, on [`vkgdr::compat::open`]), the
//! one reading of the `owner` argument that `RawMemory`, `Pool` and `DeviceRing` take, and
//! `ReleaseTimes` and `SlowRelease`, how the device's releases went ([`vkgdr::ReleaseTimes`]).

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::{invalid_argument, to_py};
use crate::interface::type_name;

/// An open device: what a `vkgdr.Vkgdr` holds (see its docs in python/vkgdr/__init__.py).
#[pyclass(module = "vkgdr._vkgdr", name = "_Vkgdr", frozen)]
pub struct Vkgdr {
    pub(crate) gpu: vkgdr::Gpu,
}

/// The device handle behind an `owner` argument (`RawMemory(owner, ...)`, `Pool(owner)`,
/// `DeviceRing(owner, ...)`): a `vkgdr.Vkgdr` of any class derived from it, or its `_Vkgdr`.
pub(crate) fn gpu_of(owner: &Bound<'_, PyAny>) -> PyResult<vkgdr::Gpu> {
    if let Ok(handle) = owner.cast::<Vkgdr>() {
        return Ok(handle.get().gpu.clone());
    }
    let py = owner.py();
    let handle = owner.getattr(intern!(py, "_impl")).ok();
    if let Some(handle) = handle.as_ref().and_then(|h| h.cast::<Vkgdr>().ok()) {
        return Ok(handle.get().gpu.clone());
    }
    let name = type_name(owner);
    let unopened = handle.is_some_and(|h| h.is_none())
        && py
            .import("vkgdr")
            .and_then(|m| m.getattr("Vkgdr"))
            .and_then(|class| owner.is_instance(&class))
            .unwrap_or(false);
    if unopened {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "the owner (a {name}) has no open device: the __init__ of a class derived from \
             vkgdr.Vkgdr must call vkgdr.Vkgdr.__init__"
        )));
    }
    Err(not_a_handle(&name))
}

fn not_a_handle(type_name: &str) -> PyErr {
    pyo3::exceptions::PyTypeError::new_err(format!(
        "the owner must be a vkgdr.Vkgdr, not {type_name}"
    ))
}

#[pymethods]
impl Vkgdr {
    #[new]
    #[pyo3(signature = (device, flags = 0))]
    fn new(py: Python<'_>, device: i32, flags: u32) -> PyResult<Self> {
        // SAFETY: vkgdr 0.1's contract, which `vkgdr.Vkgdr` documents: a current context that
        // is not a primary one must outlive the handle and its memory.
        let gpu = py
            .detach(|| unsafe { vkgdr::compat::open(device, flags) })
            .map_err(to_py)?;
        Ok(Vkgdr { gpu })
    }

    /// The device's name, as CUDA reports it.
    #[getter]
    fn name(&self) -> &str {
        self.gpu.name()
    }

    /// The 16-byte device UUID shared by CUDA and Vulkan.
    #[getter]
    fn uuid<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.gpu.uuid())
    }

    /// The ``CUdevice`` handle (the CUDA device ordinal).
    #[getter]
    fn device(&self) -> i32 {
        self.gpu.cu_device()
    }

    /// Whether memory of this handle needs no flush or invalidate.
    #[getter]
    fn is_coherent(&self) -> bool {
        !self.gpu.is_non_coherent()
    }

    /// Releases of this handle's memory still waiting for GPU work queued before them.
    fn pending_releases(&self) -> usize {
        self.gpu.pending_releases()
    }

    /// How the releases of this handle's memory went: those waiting now, and the slowest so far.
    fn release_times(&self, py: Python<'_>) -> PyResult<ReleaseTimes> {
        ReleaseTimes::of(py, self.gpu.release_times())
    }

    /// Waits up to ``timeout`` seconds without the GIL until no release is pending.
    #[pyo3(signature = (timeout = 30.0))]
    fn wait_for_releases(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        if !(timeout.is_finite() && timeout >= 0.0) {
            return Err(invalid_argument(format!("timeout {timeout} is not >= 0")));
        }
        let timeout = std::time::Duration::from_secs_f64(timeout.min(1e9));
        Ok(py.detach(|| self.gpu.wait_for_releases(timeout)))
    }

    /// Gives back what this handle keeps for later allocations: the empty shared granule small
    /// raw allocations are carved from, and the mappings freed allocations left for the next
    /// allocation of their size (within `spare_limits`). Returns how many it gave back.
    fn trim(&self, py: Python<'_>) -> usize {
        py.detach(|| self.gpu.trim())
    }

    /// The largest mapping of a freed allocation kept for the next one of its size, and the
    /// bytes kept in all (`vkgdr::SpareLimits`).
    #[getter]
    fn spare_limits(&self) -> (u64, u64) {
        let limits = self.gpu.spare_limits();
        (limits.each, limits.total)
    }

    /// Keeps those mappings within new limits from now on; returns how many kept beyond them
    /// went back to the driver.
    fn set_spare_limits(&self, py: Python<'_>, each: u64, total: u64) -> usize {
        py.detach(|| {
            self.gpu
                .set_spare_limits(vkgdr::SpareLimits { each, total })
        })
    }

    /// The device in words, for the Python object's `repr`.
    fn describe(&self) -> String {
        format!(
            "{} (device {}, {})",
            self.gpu.name(),
            self.gpu.cu_device(),
            if self.gpu.is_non_coherent() {
                "non-coherent"
            } else {
                "coherent"
            }
        )
    }

    fn __repr__(&self) -> String {
        format!("<vkgdr._vkgdr._Vkgdr {}>", self.describe())
    }
}

/// One release and how long it took, or has taken so far (a field of ``ReleaseTimes``):
/// ``seconds``, and ``what`` was released (the library's type name without module paths, such
/// as ``"Backing"``, ``"Arc<RingMemory>"`` or ``"ReleasedChunk"``).
#[pyclass(module = "vkgdr", name = "SlowRelease", frozen)]
pub struct SlowRelease(vkgdr::SlowRelease);

impl SlowRelease {
    fn of(py: Python<'_>, slow: Option<vkgdr::SlowRelease>) -> PyResult<Option<Py<SlowRelease>>> {
        slow.map(|s| Py::new(py, SlowRelease(s))).transpose()
    }
}

#[pymethods]
impl SlowRelease {
    /// How long, in seconds.
    #[getter]
    fn seconds(&self) -> f64 {
        self.0.time.as_secs_f64()
    }

    /// What was released.
    #[getter]
    fn what(&self) -> String {
        self.0.what()
    }

    fn __repr__(&self) -> String {
        format!("<vkgdr.SlowRelease {}>", self.0)
    }
}

/// How the releases of a ``Vkgdr``'s memory went (``Vkgdr.release_times()``): ``waiting``
/// now, and as a ``SlowRelease`` each (``None`` when there is none) the release that has waited
/// longest of those (``oldest_waiting``), the drop under way that began first
/// (``longest_dropping``), and the slowest so far: the longest wait for the GPU work queued
/// before a release (``longest_wait``), the longest a release whose work was done waited for its
/// turn (``longest_turn``), and the longest drop (``longest_drop``).
///
/// Only releases that waited in the release queue count: one whose GPU work was done when it
/// was made frees its memory at once. A queued release first waits for the GPU work queued
/// before it (on the legacy and blocking streams, or on the stream named in
/// ``free(after=...)``): one that waits for seconds names work that does not end, such as a
/// kernel there that runs on. Then it waits for its turn: the queue hands out one release at a
/// time to whichever thread polls, so a drop that takes long (unmapping a large allocation)
/// holds back the releases behind it.
#[pyclass(module = "vkgdr", name = "ReleaseTimes", frozen, get_all)]
pub struct ReleaseTimes {
    /// Releases waiting now, for their GPU work or in a drop (``Vkgdr.pending_releases()``).
    waiting: usize,
    /// The queued release that has waited longest of those waiting now, for so long so far.
    oldest_waiting: Option<Py<SlowRelease>>,
    /// The drop under way now that began first, and how long it has taken so far.
    longest_dropping: Option<Py<SlowRelease>>,
    /// The longest any release waited for the GPU work queued before it.
    longest_wait: Option<Py<SlowRelease>>,
    /// The longest a release whose GPU work was done waited for its turn to be dropped.
    longest_turn: Option<Py<SlowRelease>>,
    /// The longest the drop of released memory took.
    longest_drop: Option<Py<SlowRelease>>,
}

impl ReleaseTimes {
    fn of(py: Python<'_>, t: vkgdr::ReleaseTimes) -> PyResult<ReleaseTimes> {
        Ok(ReleaseTimes {
            waiting: t.waiting,
            oldest_waiting: SlowRelease::of(py, t.oldest_waiting)?,
            longest_dropping: SlowRelease::of(py, t.longest_dropping)?,
            longest_wait: SlowRelease::of(py, t.longest_wait)?,
            longest_turn: SlowRelease::of(py, t.longest_turn)?,
            longest_drop: SlowRelease::of(py, t.longest_drop)?,
        })
    }
}

#[pymethods]
impl ReleaseTimes {
    fn __repr__(&self, py: Python<'_>) -> String {
        let mut parts = vec![format!("waiting={}", self.waiting)];
        for (name, slow) in [
            ("oldest_waiting", &self.oldest_waiting),
            ("longest_dropping", &self.longest_dropping),
            ("longest_wait", &self.longest_wait),
            ("longest_turn", &self.longest_turn),
            ("longest_drop", &self.longest_drop),
        ] {
            if let Some(s) = slow {
                parts.push(format!("{name}={}", s.bind(py).get().0));
            }
        }
        format!("<vkgdr.ReleaseTimes {}>", parts.join(" "))
    }
}
