//! vkgdr 0.1's Python API: `Vkgdr` and `RawMemory`, on [`vkgdr::compat`].

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyType};

use crate::errors::{to_py, vkgdr_error};
use crate::interface;

/// Handle to a CUDA device opened for BAR mappings (vkgdr 0.1's `Vkgdr`).
///
/// `Vkgdr(device, flags=0)`: `device` is a CUDA device handle (`CUdevice`, the ordinal for
/// every device the driver shows) and no CUDA context is created. With
/// `OpenFlags.CURRENT_CONTEXT_BIT` the device is ignored and the calling thread's current context
/// is used: it must stay alive as long as this handle and its memory (as in vkgdr 0.1).
#[pyclass(module = "vkgdr", name = "Vkgdr", subclass, frozen)]
pub struct Vkgdr {
    pub(crate) gpu: vkgdr::Gpu,
}

#[pymethods]
impl Vkgdr {
    #[new]
    #[pyo3(signature = (device, flags = 0))]
    fn new(py: Python<'_>, device: i32, flags: u32) -> PyResult<Self> {
        // SAFETY: vkgdr 0.1's contract, which this class documents: a current context that is
        // not a primary one must outlive the handle and its memory.
        let gpu = py
            .detach(|| unsafe { vkgdr::compat::open(device, flags) })
            .map_err(to_py)?;
        Ok(Vkgdr { gpu })
    }

    /// Opens the device of the calling thread's current CUDA context (any context, including
    /// PyCUDA's ``make_default_context()``): ``cls(0, flags | OpenFlags.CURRENT_CONTEXT_BIT)``.
    #[classmethod]
    #[pyo3(signature = (flags = 0))]
    fn open_current_context<'py>(
        cls: &Bound<'py, PyType>,
        flags: u32,
    ) -> PyResult<Bound<'py, PyAny>> {
        cls.call1((0, flags | vkgdr::compat::OPEN_CURRENT_CONTEXT_BIT))
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

    fn __repr__(&self) -> String {
        format!(
            "<vkgdr.Vkgdr {} (device {}, {})>",
            self.gpu.name(),
            self.gpu.cu_device(),
            if self.gpu.is_non_coherent() {
                "non-coherent"
            } else {
                "coherent"
            }
        )
    }
}

/// One raw allocation in the calling thread's current CUDA context (vkgdr 0.1's `RawMemory`).
///
/// `RawMemory(owner, size, flags=0)`: `size` bytes (`len()` reports exactly that) with a host
/// mapping (``np.asarray(mem)`` is a writable view, ``__array_interface__``) and a device pointer
/// (``device_ptr``, ``__cuda_array_interface__``). The context current at allocation must stay
/// alive until the memory is freed; it is made current again to free it. Memory is freed by
/// ``free()`` (safe to call twice) or when the object is collected. Views taken before
/// ``free()`` must not be used after it, as in vkgdr 0.1.
#[pyclass(module = "vkgdr", name = "RawMemory", subclass)]
pub struct RawMemory {
    memory: Option<vkgdr::RawMemory>,
    size: u64,
    host_ptr: usize,
    device_ptr: u64,
    coherent: bool,
    atom: u64,
}

impl RawMemory {
    fn live(&self) -> PyResult<&vkgdr::RawMemory> {
        self.memory
            .as_ref()
            .ok_or_else(|| vkgdr_error("the memory has been freed"))
    }
}

#[pymethods]
impl RawMemory {
    #[new]
    #[pyo3(signature = (owner, size, flags = 0))]
    fn new(py: Python<'_>, owner: PyRef<'_, Vkgdr>, size: u64, flags: u32) -> PyResult<Self> {
        let gpu = owner.gpu.clone();
        // SAFETY: vkgdr 0.1's contract, documented on this class: the current context outlives
        // the memory. `detach` runs the closure on this thread, so "current" is unchanged.
        let memory = py
            .detach(|| unsafe { vkgdr::compat::alloc(&gpu, size, flags) })
            .map_err(to_py)?;
        Ok(RawMemory {
            size: memory.size(),
            host_ptr: memory.host_ptr() as usize,
            device_ptr: memory.device_ptr(),
            coherent: memory.is_coherent(),
            atom: memory.non_coherent_atom_size(),
            memory: Some(memory),
        })
    }

    /// Frees the memory now (making its context current for the call). Safe to call twice.
    fn free(&mut self, py: Python<'_>) {
        if let Some(memory) = self.memory.take() {
            py.detach(move || drop(memory));
        }
    }

    /// The CUDA device pointer (``CUdeviceptr``) of the first byte.
    #[getter]
    fn device_ptr(&self) -> PyResult<u64> {
        self.live()?;
        Ok(self.device_ptr)
    }

    /// The host address of the first byte.
    #[getter]
    fn host_ptr(&self) -> PyResult<usize> {
        self.live()?;
        Ok(self.host_ptr)
    }

    fn __len__(&self) -> usize {
        self.size as usize
    }

    /// Whether host writes are visible to the device without ``flush`` (and device writes to
    /// the host without ``invalidate``).
    #[getter]
    fn is_coherent(&self) -> bool {
        self.coherent
    }

    /// The granularity of ``flush`` and ``invalidate`` (1 on coherent memory).
    #[getter]
    fn non_coherent_atom_size(&self) -> u64 {
        self.atom
    }

    /// Makes host writes in ``[offset, offset + size)`` visible to the device (rounded out to
    /// whole atoms inside the allocation; on coherent memory only a store fence).
    fn flush(&self, py: Python<'_>, offset: u64, size: u64) -> PyResult<()> {
        let memory = self.live()?;
        interface::range(offset, Some(size), self.size)?;
        interface::drain_host_writes();
        py.detach(|| memory.flush(offset, size)).map_err(to_py)
    }

    /// Makes device writes in ``[offset, offset + size)`` visible to host reads.
    fn invalidate(&self, py: Python<'_>, offset: u64, size: u64) -> PyResult<()> {
        let memory = self.live()?;
        interface::range(offset, Some(size), self.size)?;
        py.detach(|| memory.invalidate(offset, size)).map_err(to_py)
    }

    /// NumPy's array interface: ``size`` writable bytes of type ``|V1`` (as vkgdr 0.1).
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.live()?;
        interface::array_interface(py, self.host_ptr, self.size, "|V1")
    }

    /// The CUDA array interface (v3): ``size`` bytes of ``uint8`` at ``device_ptr``.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.live()?;
        interface::cuda_array_interface(py, self.device_ptr, self.size)
    }

    fn __repr__(&self) -> String {
        match self.memory {
            Some(_) => format!(
                "<vkgdr.RawMemory {} bytes at device {:#x}>",
                self.size, self.device_ptr
            ),
            None => format!("<vkgdr.RawMemory {} bytes, freed>", self.size),
        }
    }
}
