//! `_Vkgdr`, what a `vkgdr.Vkgdr` holds (an open device, on [`vkgdr::compat::open`]), and the
//! one reading of the `owner` argument that `RawMemory`, `Pool` and `DeviceRing` take.

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
    /// raw allocations are carved from, and the mappings freed allocations of up to 32 MiB left
    /// for the next allocation of their size (64 MiB in all). Returns how many it gave back.
    fn trim(&self, py: Python<'_>) -> usize {
        py.detach(|| self.gpu.trim())
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
