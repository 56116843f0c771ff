//! vkgdr 0.1's Python API: `Vkgdr` and `RawMemory`, on [`vkgdr::compat`].

use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyType};

use crate::errors::{invalid_argument, to_py, vkgdr_error};
use crate::interface;
use crate::lifetime;
use crate::stream::{stream_arg, StreamArg};

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

    /// Releases of memory allocated through this handle (raw memory, pools, rings) that still
    /// wait for GPU work queued before them; that memory still counts as in use. Frees never
    /// wait for a running kernel: memory goes back once the work queued before the free on the
    /// legacy default stream (every blocking stream's too), or on the stream named with
    /// ``free(after=stream)``, has completed.
    fn pending_releases(&self) -> usize {
        self.gpu.pending_releases()
    }

    /// Waits up to ``timeout`` seconds (without holding the GIL) until no release of this
    /// handle's memory is pending; returns whether none is left. Only a kernel still running on
    /// the legacy or a blocking stream, or on a stream named in ``free(after=...)``, keeps one
    /// waiting. For tests and orderly shutdown.
    #[pyo3(signature = (timeout = 30.0))]
    fn wait_for_releases(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        if !(timeout.is_finite() && timeout >= 0.0) {
            return Err(crate::errors::invalid_argument(format!(
                "timeout {timeout} is not >= 0"
            )));
        }
        let timeout = std::time::Duration::from_secs_f64(timeout.min(1e9));
        Ok(py.detach(|| self.gpu.wait_for_releases(timeout)))
    }

    /// Gives back to the driver what the handle keeps for later small raw allocations (the
    /// empty shared granule they are carved from); returns how many granules went back.
    fn trim(&self, py: Python<'_>) -> usize {
        py.detach(|| self.gpu.trim())
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

/// How memory freed while views may still use it is released once the last view is gone.
enum Deferred {
    /// The default: fenced on the legacy default stream.
    Default,
    /// Fenced on this stream, kept alive until then.
    After(StreamArg),
}

/// One raw allocation in the calling thread's current CUDA context (vkgdr 0.1's `RawMemory`).
///
/// `RawMemory(owner, size, flags=0)`: `size` bytes (`len()` reports exactly that) with a host
/// mapping (``np.asarray(mem)`` is a writable view, ``__array_interface__``) and a device pointer
/// (``device_ptr``, ``__cuda_array_interface__``). The context current at allocation must stay
/// alive until the memory is released (see below: with views alive at ``free()``, until the last
/// is gone); the release needs no current context.
///
/// ``free(*, after=None, now=False)`` frees it (safe to call twice; collecting the object frees
/// it too). It never waits for a kernel: the memory goes back once the GPU work queued before
/// the free on the legacy default stream, and so on every blocking stream (the default of CUDA
/// C, CuPy, PyTorch and PyCUDA), has completed. ``after=stream`` waits for the work queued on
/// that stream instead (a CUDA stream: an int ``CUstream``, or a CuPy, PyTorch, PyCUDA or Numba
/// stream object, which is kept alive until then): use it for memory a kernel on a non-blocking
/// stream may still use. ``now=True`` releases without waiting for any GPU work, for callers who
/// know none uses the memory. An int handle must name a live stream of this memory's device.
///
/// **Views keep the memory.** Once ``__array_interface__`` or ``__cuda_array_interface__`` has
/// been read (``np.asarray(mem)``, ``cupy.asarray(mem)``, Numba, PyTorch), ``free()`` releases
/// the memory at once only if nothing but the caller's variables refers to the object. If
/// something else does (a view, whose ``base`` or owner is this object, or any other
/// reference), the object is marked freed at once (its attributes raise ``VkgdrError``, as after
/// any free) and the memory is released when the object is deallocated, i.e. when the last view
/// (and the caller's last reference) is gone, fenced then on the stream named by ``after`` (which
/// must still be alive: objects are kept, int handles are the caller's) or on the legacy stream
/// (``now=True`` then gets that default fence).
/// Views therefore never touch memory that was handed back, and kernels launched through them
/// before the release on a blocking stream, or on the ``after`` stream, are waited for. Memory
/// whose interfaces were never read is released at once, as in vkgdr 0.1. Addresses taken as
/// integers (``host_ptr``, ``device_ptr``, the interfaces' ``data``) are the caller's to stop
/// using, as in C.
#[pyclass(module = "vkgdr", name = "RawMemory", subclass)]
pub struct RawMemory {
    /// The memory, until `free()`.
    memory: Option<vkgdr::RawMemory>,
    /// Memory freed while views may use it, released when this object goes.
    deferred: Option<(vkgdr::RawMemory, Deferred)>,
    /// Whether an array interface was read (views may exist). Atomic so that reading one needs
    /// no exclusive borrow.
    exported: AtomicBool,
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

impl Drop for RawMemory {
    fn drop(&mut self) {
        // Collected without `free()`: a plain drop (the default fence), as in vkgdr 0.1.
        drop(self.memory.take());
        match self.deferred.take() {
            None => {}
            Some((memory, Deferred::Default)) => drop(memory),
            Some((memory, Deferred::After(stream))) => {
                // SAFETY: the stream object is still held (`stream` drops after the call), so
                // a stream given as an object is alive; an int handle is the caller's promise,
                // documented on `free`. On an error the memory is released as a plain drop
                // would be, and a destructor has no one to tell.
                let _ = unsafe { memory.release_after_stream(stream.raw()) };
                drop(stream);
            }
        }
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
            deferred: None,
            exported: AtomicBool::new(false),
        })
    }

    /// Frees the memory without waiting for the GPU (see the class docs: ``after`` names the
    /// stream whose queued work the release waits for, ``now=True`` waits for none, and memory
    /// that views may still use is released when the last one is gone). Safe to call twice; a
    /// second call changes nothing.
    #[pyo3(signature = (*, after = None, now = false))]
    fn free(slf: &Bound<'_, Self>, after: Option<&Bound<'_, PyAny>>, now: bool) -> PyResult<()> {
        let py = slf.py();
        // The arguments first: reading a stream object may run Python code.
        let after = match after {
            Some(_) if now => {
                return Err(invalid_argument(
                    "free() takes after= or now=True, not both",
                ))
            }
            Some(a) => Some(stream_arg(a)?).filter(|s| !s.is_null()),
            None => None,
        };
        // Freed from here on: no view can be made any more.
        let (memory, exported) = {
            let mut this = slf.try_borrow_mut().map_err(|_| {
                vkgdr_error(
                    "the memory is in use by another thread (flush or invalidate): free it \
                     after that",
                )
            })?;
            let Some(memory) = this.memory.take() else {
                return Ok(());
            };
            (memory, this.exported.load(Ordering::Relaxed))
        };
        // What the caller and the views hold; no reference of ours is taken now.
        let refs = lifetime::refcount(slf.as_any());
        // A failure to inspect the caller leaves the views' possibility open.
        let views =
            exported && !lifetime::only_callers_of_rust_free(slf.as_any(), refs).unwrap_or(false);
        if views {
            let how = after.map_or(Deferred::Default, Deferred::After);
            match slf.try_borrow_mut() {
                Ok(mut this) => this.deferred = Some((memory, how)),
                // Cannot happen: every other method fails at once on freed memory, holding the
                // GIL as this one does. Were it to, keeping the memory forever is safe.
                Err(_) => std::mem::forget((memory, how)),
            }
            return Ok(());
        }
        match after {
            // SAFETY: a stream object is alive while `stream` holds it; an int handle is the
            // caller's promise (documented on the class).
            Some(stream) => py
                .detach(|| unsafe { memory.release_after_stream(stream.raw()) })
                .map_err(to_py),
            None if now => {
                py.detach(|| memory.release_now());
                Ok(())
            }
            None => {
                py.detach(move || drop(memory));
                Ok(())
            }
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

    /// Whether ``free()`` was called (the memory may still wait for its views).
    #[getter]
    fn is_freed(&self) -> bool {
        self.memory.is_none()
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

    /// NumPy's array interface: ``size`` writable bytes of type ``|V1`` (as vkgdr 0.1). Views
    /// made from it keep the memory (see the class docs).
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.live()?;
        self.exported.store(true, Ordering::Relaxed);
        interface::array_interface(py, self.host_ptr, self.size, "|V1")
    }

    /// The CUDA array interface (v3): ``size`` bytes of ``uint8`` at ``device_ptr``. Arrays
    /// made from it keep the memory (see the class docs).
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.live()?;
        self.exported.store(true, Ordering::Relaxed);
        interface::cuda_array_interface(py, self.device_ptr, self.size)
    }

    fn __repr__(&self) -> String {
        match (&self.memory, &self.deferred) {
            (Some(_), _) => format!(
                "<vkgdr.RawMemory {} bytes at device {:#x}>",
                self.size, self.device_ptr
            ),
            (None, Some(_)) => format!(
                "<vkgdr.RawMemory {} bytes, freed (released when its views are gone)>",
                self.size
            ),
            (None, None) => format!("<vkgdr.RawMemory {} bytes, freed>", self.size),
        }
    }
}
