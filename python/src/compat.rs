//! What stands behind vkgdr 0.1's `RawMemory`: `_RawMemory`, on [`vkgdr::compat`] (`_Vkgdr`,
//! behind `Vkgdr`, is in [`crate::device`]).
//!
//! `vkgdr.Vkgdr` and `vkgdr.RawMemory` themselves are plain Python classes (python/vkgdr), as in
//! vkgdr 0.1, so that programs can subclass them with `__init__`s of their own and combine them
//! with other bases: `vkgdr.pycuda.Memory` is both a PyCUDA `PointerHolderBase` and a
//! `RawMemory`, which a class defined here cannot be (two native instance layouts conflict).
//! Each Python object holds one of these in `_impl`, and nothing else refers to it; views made
//! through the array protocols refer to the Python object. So "no view is left" is "the Python
//! object is collected", which drops the `_RawMemory` and releases memory kept for views.

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};
use vkgdr::compat::Face;

use crate::device::gpu_of;
use crate::errors::{invalid_argument, to_py, vkgdr_error};
use crate::interface;
use crate::lifetime::{self, Baseline, Calibration};
use crate::pool::Pool;
use crate::stream::{optional_stream_arg, StreamArg};

/// How memory is handed back.
enum Release {
    /// Fenced on the legacy default stream (a plain drop).
    Default,
    /// At once, waiting for no GPU work.
    Now,
    /// Fenced on this stream, kept alive until then.
    After(StreamArg),
}

/// What a `_RawMemory` holds.
enum Held {
    /// A raw allocation: what every program gets.
    Raw(vkgdr::RawMemory),
    /// For the tests without a GPU only (`_RawMemory._over_pool`): a block of a pool standing in
    /// for a raw allocation, and a callable told how it was handed back.
    StandIn {
        block: vkgdr::Block,
        on_release: Py<PyAny>,
    },
}

impl Held {
    fn flush(&self, offset: u64, size: u64) -> vkgdr::Result<()> {
        match self {
            Held::Raw(memory) => memory.flush(offset, size),
            Held::StandIn { block, .. } => block.flush_range(offset, size),
        }
    }

    fn invalidate(&self, offset: u64, size: u64) -> vkgdr::Result<()> {
        match self {
            Held::Raw(memory) => memory.invalidate(offset, size),
            Held::StandIn { block, .. } => vkgdr::Mapping::before_read(block, offset, size),
        }
    }

    /// Hands the memory back as `how` says. With `detach`, without the GIL meanwhile (not from
    /// a destructor, which may run while the interpreter shuts down).
    fn release(self, py: Python<'_>, how: Release, detach: bool) -> PyResult<()> {
        match self {
            Held::Raw(memory) => {
                let run = move || match &how {
                    Release::Default => {
                        drop(memory);
                        Ok(())
                    }
                    Release::Now => {
                        memory.release_now();
                        Ok(())
                    }
                    // SAFETY: `release_after_stream` wants a live stream of the memory's device,
                    // whose context, where the driver lacks stream memory operations (an event
                    // then fences the release), stays alive until the release. A stream object
                    // is alive while `how` holds it (it drops after the call); a `RawStream`'s
                    // stream, and the context of either, are the program's promise, documented
                    // on `vkgdr.RawMemory`.
                    Release::After(stream) => unsafe { memory.release_after_stream(stream.raw()) },
                };
                if detach { py.detach(run) } else { run() }.map_err(to_py)
            }
            Held::StandIn { block, on_release } => {
                drop(block);
                let how = match how {
                    Release::Default => "default".into_pyobject(py)?.into_any(),
                    Release::Now => "now".into_pyobject(py)?.into_any(),
                    Release::After(stream) => (stream.raw() as usize).into_pyobject(py)?.into_any(),
                };
                on_release.call1(py, (how,)).map(drop)
            }
        }
    }
}

/// Where a `_RawMemory`'s memory is.
enum State {
    /// Held, until `free()`.
    Live(Held),
    /// Freed while views may use it: released as `free()` asked when this object goes (when the
    /// Python object holding it is collected), or by `release()`.
    Kept(Held, Release),
    /// Handed back.
    Released,
}

/// One raw allocation in the calling thread's current CUDA context: what a `vkgdr.RawMemory`
/// holds (see its docs in python/vkgdr/__init__.py for `free()` and views).
#[pyclass(module = "vkgdr._vkgdr", name = "_RawMemory")]
pub struct RawMemory {
    state: State,
    /// How many times an array interface or the exported device pointer was read (views may
    /// exist once it is not 0). Atomic so that reading one needs no exclusive borrow; a count,
    /// not a flag, so that `free()` sees exports made after its caller measured the references.
    exports: AtomicU64,
    size: u64,
    host_ptr: usize,
    device_ptr: u64,
    coherent: bool,
    atom: u64,
}

impl RawMemory {
    fn live(&self) -> PyResult<&Held> {
        match &self.state {
            State::Live(memory) => Ok(memory),
            _ => Err(vkgdr_error("the memory has been freed")),
        }
    }

    /// Frees the memory on behalf of `owner`, the Python object holding this one, for its `free`
    /// called from the innermost Python frame: at once unless views may use it, else kept until
    /// this object goes or `release()`. `refs` is `owner`'s reference count when its `free` was
    /// entered, `exports` the export count read before it, `baseline` what that `free` sees of a
    /// plain call. A second call changes nothing.
    fn free_for(
        slf: &Bound<'_, Self>,
        owner: &Bound<'_, PyAny>,
        refs: isize,
        exports: u64,
        baseline: Baseline,
        after: Option<&Bound<'_, PyAny>>,
        now: bool,
    ) -> PyResult<()> {
        let py = slf.py();
        if after.is_some() && now {
            return Err(invalid_argument(
                "free() takes after= or now=True, not both",
            ));
        }
        // The arguments first: reading a stream object may run Python code.
        let how = match optional_stream_arg(after, "free(after=...)")? {
            Some(stream) => Release::After(stream),
            None if now => Release::Now,
            None => Release::Default,
        };
        // Freed from here on: no view can be made any more.
        let (memory, exported_now) = {
            let mut this = slf.try_borrow_mut().map_err(|_| {
                vkgdr_error(
                    "the memory is in use by another thread (flush or invalidate): free it \
                     after that",
                )
            })?;
            match std::mem::replace(&mut this.state, State::Released) {
                State::Live(memory) => (memory, this.exports.load(Ordering::Relaxed)),
                freed => {
                    this.state = freed;
                    return Ok(());
                }
            }
        };
        // An export since the caller counted the references (another thread's) may be a view
        // that count missed. A failure to inspect the caller leaves the views' possibility open.
        let views = exported_now != 0
            && (exported_now != exports
                || !lifetime::only_callers(owner, refs, baseline).unwrap_or(false));
        if !views {
            return memory.release(py, how, true);
        }
        // Kernels launched through the views may use it until the last view goes: `now=True`
        // gets the default fence then.
        let how = match how {
            Release::Now => Release::Default,
            how => how,
        };
        match slf.try_borrow_mut() {
            Ok(mut this) => this.state = State::Kept(memory, how),
            // Cannot happen: every other method fails at once on freed memory, holding the GIL
            // as this one does. Were it to, keeping the memory forever is safe.
            Err(_) => std::mem::forget((memory, how)),
        }
        Ok(())
    }

    /// The raw allocation, for `ShareServer.share_memory`.
    pub(crate) fn raw(&self) -> PyResult<&vkgdr::RawMemory> {
        match self.live()? {
            Held::Raw(memory) => Ok(memory),
            Held::StandIn { .. } => Err(invalid_argument(
                "this RawMemory stands on a pool block (the tests' stand-in): it cannot be shared",
            )),
        }
    }

    /// [`live`](Self::live), noting that a view may be made.
    fn export(&self) -> PyResult<&Held> {
        let held = self.live()?;
        self.exports.fetch_add(1, Ordering::Relaxed);
        Ok(held)
    }

    /// Hands back whatever is still held: live memory as a plain drop would, memory kept for
    /// views as `free()` asked.
    fn release_held(&mut self, py: Python<'_>, detach: bool) -> PyResult<()> {
        match std::mem::replace(&mut self.state, State::Released) {
            State::Live(memory) => memory.release(py, Release::Default, detach),
            State::Kept(memory, how) => memory.release(py, how, detach),
            State::Released => Ok(()),
        }
    }
}

impl Drop for RawMemory {
    fn drop(&mut self) {
        if let State::Released = self.state {
            return;
        }
        // Collected without `free()` (a plain drop, as in vkgdr 0.1), or freed while views could
        // use it and now the last is gone. A destructor has no one to report an error to: on
        // one the memory went back as a plain drop gives it back. It may run while an exception
        // propagates (values on the stack are dropped then), which the Python code an error or
        // the tests' stand-in runs must neither see nor clear.
        Python::attach(|py| {
            let pending = PyErr::take(py);
            let _ = self.release_held(py, false);
            if let Some(pending) = pending {
                pending.restore(py);
            }
        });
    }
}

#[pymethods]
impl RawMemory {
    #[new]
    #[pyo3(signature = (owner, size, flags = 0, *, shareable = false))]
    fn new(
        py: Python<'_>,
        owner: &Bound<'_, PyAny>,
        size: u64,
        flags: u32,
        shareable: bool,
    ) -> PyResult<Self> {
        let gpu = gpu_of(owner)?;
        let memory = if shareable {
            // An allocation of its own in the handle's context (no current one needed), so
            // that its fd reaches these bytes and no others.
            py.detach(|| gpu.alloc_shareable(size)).map_err(to_py)?
        } else {
            // SAFETY: vkgdr 0.1's contract, documented on `vkgdr.RawMemory`: the current context
            // outlives the memory. `detach` runs the closure on this thread, so "current" is
            // unchanged. With none current the library's error says how to make one current.
            py.detach(|| unsafe { vkgdr::compat::alloc(&gpu, size, flags, Face::Python) })
                .map_err(to_py)?
        };
        Ok(RawMemory {
            size: memory.size(),
            host_ptr: memory.host_ptr() as usize,
            device_ptr: memory.device_ptr(),
            coherent: memory.is_coherent(),
            atom: memory.non_coherent_atom_size(),
            state: State::Live(Held::Raw(memory)),
            exports: AtomicU64::new(0),
        })
    }

    /// For the tests without a GPU only: ``size`` bytes of a block of ``pool`` (a coherent one,
    /// such as ``Pool.vulkan_only()`` over Mesa's lavapipe) standing in for a raw allocation, so
    /// that ``vkgdr.RawMemory``'s Python half runs over real mapped memory. ``device_ptr`` is 0.
    /// ``on_release(how)`` is called when the memory is handed back: ``"default"``, ``"now"``,
    /// or the stream handle ``after=`` named.
    #[staticmethod]
    #[pyo3(name = "_over_pool")]
    fn over_pool(
        py: Python<'_>,
        pool: &Bound<'_, Pool>,
        size: u64,
        on_release: Py<PyAny>,
    ) -> PyResult<Self> {
        let pool = &pool.get().pool;
        if pool.is_non_coherent() {
            return Err(invalid_argument(
                "a stand-in raw allocation needs a coherent pool",
            ));
        }
        crate::thread_exit::return_cache_at_exit(py);
        let block = py.detach(|| pool.alloc(size, 64)).map_err(to_py)?;
        Ok(RawMemory {
            size: block.size(),
            host_ptr: block.host_ptr() as usize,
            device_ptr: block.device_ptr().unwrap_or(0),
            coherent: true,
            atom: 1,
            state: State::Live(Held::StandIn { block, on_release }),
            exports: AtomicU64::new(0),
        })
    }

    /// Hands back now whatever is still held: memory never freed as a plain drop would, memory
    /// kept for views with the fence ``free()`` asked for. For a destructor that knows no view is
    /// left (``vkgdr.pycuda.Memory.__del__``, with its context pushed), so the GIL is kept: it
    /// may run while the interpreter shuts down.
    fn release(&mut self, py: Python<'_>) -> PyResult<()> {
        self.release_held(py, false)
    }

    /// How many times an array interface or ``exported_device_ptr()`` was read.
    #[getter]
    fn exports(&self) -> u64 {
        self.exports.load(Ordering::Relaxed)
    }

    /// Whether ``free()`` was called (the memory may still wait for its views).
    #[getter]
    fn is_freed(&self) -> bool {
        !matches!(self.state, State::Live(_))
    }

    /// Whether nothing is held any more: freed, and not kept for views.
    #[getter]
    fn is_released(&self) -> bool {
        matches!(self.state, State::Released)
    }

    /// The CUDA device pointer (``CUdeviceptr``) of the first byte.
    #[getter]
    fn device_ptr(&self) -> PyResult<u64> {
        self.live()?;
        Ok(self.device_ptr)
    }

    /// The device pointer, for a consumer that keeps using it (PyCUDA's ``get_pointer``): views
    /// may exist from here on.
    fn exported_device_ptr(&self) -> PyResult<u64> {
        self.export()?;
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

    /// Whether host writes need no ``flush`` (nor device writes an ``invalidate``).
    #[getter]
    fn is_coherent(&self) -> bool {
        self.coherent
    }

    /// The granularity of ``flush`` and ``invalidate`` (1 on coherent memory).
    #[getter]
    fn non_coherent_atom_size(&self) -> u64 {
        self.atom
    }

    /// Makes host writes in ``[offset, offset + size)`` visible to the device.
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
        self.export()?;
        interface::array_interface(py, self.host_ptr, self.size, "|V1")
    }

    /// The CUDA array interface (v3): ``size`` bytes of ``uint8`` at ``device_ptr``.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.export()?;
        interface::cuda_array_interface(py, self.device_ptr, self.size)
    }

    /// The memory's state in words, for the Python object's `repr`.
    fn describe(&self) -> String {
        match self.state {
            State::Live(_) => format!("{} bytes at device {:#x}", self.size, self.device_ptr),
            State::Kept(..) => format!(
                "{} bytes, freed (released when its views are gone)",
                self.size
            ),
            State::Released => format!("{} bytes, freed", self.size),
        }
    }

    fn __repr__(&self) -> String {
        format!("<vkgdr._vkgdr._RawMemory {}>", self.describe())
    }
}

/// The baselines of [`FreeMethod`], measured at import with a probe class.
static FREE_BASELINES: PyOnceLock<Calibration> = PyOnceLock::new();

/// Measures the baselines of `vkgdr.RawMemory.free` once (at import), on a class whose `free` is
/// a probing [`FreeMethod`].
pub fn init(py: Python<'_>) -> PyResult<()> {
    let namespace = PyDict::new(py);
    namespace.set_item("free", FreeMethod { probe: true })?;
    let probe = py.import("builtins")?.getattr("type")?.call1((
        "_FreeProbe",
        PyTuple::empty(py),
        namespace,
    ))?;
    let calibration = lifetime::measure(probe.cast()?)?;
    let _ = FREE_BASELINES.set(py, calibration);
    Ok(())
}

/// ``vkgdr.RawMemory.free(*, after=None, now=False)``: frees the memory without waiting for the
/// GPU. ``after`` names the stream whose queued work the release waits for, ``now=True`` waits for
/// none, and memory that views may still use is released when the last one is gone (see
/// ``vkgdr.RawMemory``). Safe to call twice; a second call changes nothing.
///
/// A descriptor rather than a Python function: its bound object holds the receiver exactly once
/// whatever the call's shape, which the reference count that finds views relies on.
#[pyclass(module = "vkgdr._vkgdr", name = "_FreeMethod", frozen)]
pub struct FreeMethod {
    /// For the calibration: calls return the receiver's reference count and free nothing.
    probe: bool,
}

/// ``free`` bound to a ``vkgdr.RawMemory``: ``mem.free(*, after=None, now=False)``.
#[pyclass(module = "vkgdr._vkgdr", name = "_BoundFree")]
pub struct BoundFree {
    probe: bool,
    /// The object; `None` only once the garbage collector has broken a cycle through it (an
    /// object holding its own bound `free`).
    receiver: Option<Py<PyAny>>,
}

/// How `free` was reached, which decides what the call itself holds of the receiver.
#[derive(Clone, Copy)]
enum Shape {
    /// `mem.free(...)`: the bound object holds it.
    Bound,
    /// `RawMemory.free(mem, ...)`: the arguments hold it.
    Unbound,
}

/// `free()` of a `vkgdr.RawMemory` object `obj`: the memory its `_impl` holds is freed on its
/// behalf, between its `_release_begin()` and `_release_end()` hooks.
fn free_object(
    obj: &Bound<'_, PyAny>,
    shape: Shape,
    probe: bool,
    after: Option<&Bound<'_, PyAny>>,
    now: bool,
) -> PyResult<Py<PyAny>> {
    let py = obj.py();
    if probe {
        return Ok(lifetime::refcount(obj)
            .into_pyobject(py)?
            .into_any()
            .unbind());
    }
    let not_memory = || {
        pyo3::exceptions::PyTypeError::new_err(format!(
            "free() needs a vkgdr.RawMemory, not {}",
            interface::type_name(obj)
        ))
    };
    let memory = obj
        .getattr(intern!(py, "_impl"))
        .map_err(|_| not_memory())?;
    if memory.is_none() {
        return Ok(py.None()); // __init__ never ran: nothing to free
    }
    let memory = memory.cast_into::<RawMemory>().map_err(|_| not_memory())?;
    // The exports first, then the references, with no Python code in between (no other thread
    // can run): an export after the count shows as a different number.
    let exports = memory.try_borrow().map_or(u64::MAX, |m| m.exports());
    let refs = lifetime::refcount(obj);
    let Some(calibration) = FREE_BASELINES.get(py) else {
        return Err(vkgdr_error("vkgdr._vkgdr was not initialised"));
    };
    let baseline = match shape {
        Shape::Bound => calibration.bound,
        Shape::Unbound => calibration.unbound,
    };
    obj.call_method0(intern!(py, "_release_begin"))?;
    // The caller of `free` is the innermost Python frame again once the hook has returned.
    let freed = RawMemory::free_for(&memory, obj, refs, exports, baseline, after, now);
    let ended = obj.call_method0(intern!(py, "_release_end"));
    freed?;
    ended?;
    Ok(py.None())
}

#[pymethods]
impl FreeMethod {
    #[new]
    fn new() -> Self {
        FreeMethod { probe: false }
    }

    fn __get__(
        slf: &Bound<'_, Self>,
        obj: Option<&Bound<'_, PyAny>>,
        _owner: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        match obj {
            Some(obj) if !obj.is_none() => Ok(Bound::new(
                py,
                BoundFree {
                    probe: slf.get().probe,
                    receiver: Some(obj.clone().unbind()),
                },
            )?
            .into_any()
            .unbind()),
            _ => Ok(slf.clone().into_any().unbind()),
        }
    }

    /// ``RawMemory.free(mem, *, after=None, now=False)``: ``mem.free(...)`` through the class.
    #[pyo3(signature = (obj, *, after = None, now = false))]
    fn __call__(
        &self,
        obj: &Bound<'_, PyAny>,
        after: Option<&Bound<'_, PyAny>>,
        now: bool,
    ) -> PyResult<Py<PyAny>> {
        free_object(obj, Shape::Unbound, self.probe, after, now)
    }
}

#[pymethods]
impl BoundFree {
    #[pyo3(signature = (*, after = None, now = false))]
    fn __call__(
        &self,
        py: Python<'_>,
        after: Option<&Bound<'_, PyAny>>,
        now: bool,
    ) -> PyResult<Py<PyAny>> {
        let receiver = self.receiver(py)?;
        free_object(receiver.bind(py), Shape::Bound, self.probe, after, now)
    }

    /// The object the method is bound to.
    #[getter]
    fn __self__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.receiver(py)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "<bound method free of {}>",
            self.receiver(py)?.bind(py).repr()?
        ))
    }

    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        if let Some(receiver) = &self.receiver {
            visit.call(receiver)?;
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.receiver = None;
    }
}

impl BoundFree {
    fn receiver(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.receiver
            .as_ref()
            .map(|r| r.clone_ref(py))
            .ok_or_else(|| vkgdr_error("this bound free() was cleared by the garbage collector"))
    }
}
