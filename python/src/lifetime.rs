//! When may vkgdr 0.1's `free()` hand memory back at once? When nothing but the caller refers to
//! the object.
//!
//! This rule serves vkgdr 0.1's two classes only: `vkgdr.RawMemory` and `vkgdr.pycuda.Memory`
//! ([`crate::compat`]). The package's own classes count their exports exactly
//! ([`crate::exports`]): `Block.free()`, and the sharing classes' `AttachedMemory.detach()` and
//! `SharedBlock.release()` ([`crate::peer`]). (`VulkanMemory` has no `free()`: its memory goes
//! with the object, which its views hold.)
//!
//! ## Why 0.1's classes cannot count their exports
//!
//! An exact count needs every consumer to hold something the allocation hands out per export (an
//! owner object, a buffer export, a DLPack context), so that its end is seen. Every consumer of
//! vkgdr 0.1's classes holds the very object the program holds instead:
//!
//! - NumPy. vkgdr 0.1 sets `__array_interface__ = dict(shape=(size,), typestr="|V1",
//!   data=(host_ptr, False), version=3)`, and 0.1 programs may read `['data'][0]` for the
//!   address, so `data` stays that tuple. With a tuple `data`, NumPy makes the array's `base`
//!   the object whose interface it read (only a buffer `data` becomes the base itself: what
//!   `Block` uses); NumPy 1.24 on Python 3.8 and NumPy 2.4 on Python 3.11 both do, as does a
//!   tuple subclass. NumPy asks for the buffer protocol before the interface, but a plain
//!   Python class (which `RawMemory` must be, so that programs derive from it and
//!   `vkgdr.pycuda.Memory` combines it with PyCUDA's `PointerHolderBase`) can offer that only
//!   from Python 3.12 (`__buffer__`), not on the 3.8 to 3.11 the package supports.
//! - The CUDA array interface (`cupy.asarray(mem)`, Numba, `torch.as_tensor(mem)`): its `data`
//!   is an integer, and consumers keep the object (CuPy's `UnownedMemory` owner).
//! - PyCUDA: `GPUArray(gpudata=mem)` holds `mem`, and every kernel call with `mem` as an
//!   argument reads `get_pointer()`.
//!
//! So whether a view is alive is whether anything but the caller refers to the object, and its
//! reference count is the only witness. Pinning, as `Block` does once its CUDA array interface
//! was read (the memory waits for the object's collection), would be exact but would break the
//! drop-in: a `mem.free()` after any PyCUDA kernel launch over `mem`, or after a
//! `cupy.asarray(mem)` long gone, would no longer give the memory back at once, as vkgdr 0.1
//! does and this rule does when no view is left.
//!
//! ## The rule
//!
//! Views made through the array protocols hold a reference to the object whose interface they
//! read, and keep using its address. So `free()` on memory whose interfaces were read releases
//! it at once only when its reference count is fully explained by the caller: the caller's own
//! local variables holding it, and the reference the call itself holds (on the caller's stack,
//! or in a bound method). Otherwise the memory is marked freed and released when the object is
//! deallocated: when the last view (and the caller's last reference) is gone.
//!
//! What a call itself holds differs between Python versions (3.14 borrows references of local
//! variables on the stack) and between a function's locals and module-level names, so it is
//! measured at import with a probe object ([`measure`]): `baseline` = the count a method sees on
//! entry when exactly one local variable (or one module-level name) refers to its object, which
//! is `1 + probe_stack + fixed` (`probe_stack`: what the cheapest call shape keeps on the
//! caller's stack; `fixed`: what the method call itself adds). A call then sees
//! `refs = held + others + views + stack + fixed`, where `held` counts the caller's variables
//! referring to the object (read from its frame) and `stack >= probe_stack`. So
//! `refs < held + baseline` proves `others + views = 0`. Anything unexplained, references that
//! are not views included (a list holding the object), keeps the memory until the object goes:
//! safe, and only later.
//!
//! Before Python 3.13, reading a function frame's `f_locals` copies its locals into a dict kept
//! on the frame (a snapshot): its references are subtracted, and the snapshot is emptied
//! afterwards so that it keeps neither the object nor its views alive (it is rebuilt whenever it
//! is read again).
//!
//! `vkgdr.RawMemory` is a plain Python class, so that programs may derive classes from it as in
//! vkgdr 0.1. A Python function as `free` would see a different count for each call shape
//! (`m.free(**kw)` and `f = m.free; f()` hold one more than `m.free()` from Python 3.11 on), so
//! that `free` is a descriptor written in Rust ([`crate::compat`]) whose bound object holds the
//! receiver exactly once, whatever the shape; its baselines are measured on a class whose `free`
//! is that descriptor, probing.

use pyo3::exceptions::PyRuntimeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};

/// The reference count of `obj`.
pub fn refcount(obj: &Bound<'_, PyAny>) -> isize {
    // SAFETY: `obj` is a live object (we hold a reference to it) and the GIL is held.
    unsafe { ffi::Py_REFCNT(obj.as_ptr()) }
}

/// What a method's receiver count is on entry when one local variable (`function`) or one
/// module-level name (`module`) refers to the object and nothing else does.
#[derive(Debug, Clone, Copy)]
pub struct Baseline {
    pub function: isize,
    pub module: isize,
}

/// Runs every call shape of `free` on an instance of `cls` (whose `free(*, after=None,
/// now=False)` returns the receiver's count on entry), in a function and at module level, through
/// the instance (`p.free(...)`) and through the class (`cls.free(p, ...)`), and keeps the smallest
/// counts seen of each kind. Each shape is written out: a helper taking `p` would add references.
const CALIBRATION: &std::ffi::CStr = cr#"
def _in_function(cls):
    p = cls()
    bound = min(
        p.free(), p.free(after=None), p.free(now=False), p.free(after=None, now=False),
        p.free(**{}), p.free(**{"now": False}),
    )
    unbound = min(cls.free(p), cls.free(p, after=None), cls.free(p, **{}), cls.free(*(p,)))
    return bound, unbound

function, unbound_function = _in_function(cls)
p = cls()
module = min(
    p.free(), p.free(after=None), p.free(now=False), p.free(after=None, now=False),
    p.free(**{}), p.free(**{"now": False}),
)
unbound_module = min(cls.free(p), cls.free(p, after=None), cls.free(p, **{}), cls.free(*(p,)))
del p
"#;

/// The baselines of one `free`, called through the instance (`bound`) or through the class.
#[derive(Debug, Clone, Copy)]
pub struct Calibration {
    pub bound: Baseline,
    pub unbound: Baseline,
}

/// Measures the baselines of `cls`'s `free` (see the module docs).
pub fn measure(cls: &Bound<'_, PyType>) -> PyResult<Calibration> {
    let py = cls.py();
    let globals = PyDict::new(py);
    globals.set_item("__builtins__", py.import("builtins")?)?;
    globals.set_item("cls", cls)?;
    py.run(CALIBRATION, Some(&globals), None)?;
    let get = |name: &str| -> PyResult<isize> {
        globals
            .get_item(name)?
            .ok_or_else(|| PyRuntimeError::new_err(format!("calibration measured no {name}")))?
            .extract()
    };
    Ok(Calibration {
        bound: Baseline {
            function: get("function")?,
            module: get("module")?,
        },
        unbound: Baseline {
            function: get("unbound_function")?,
            module: get("unbound_module")?,
        },
    })
}

/// `CO_OPTIMIZED`: a function's code, whose locals live in fast slots.
const CO_OPTIMIZED: i64 = 1;

/// `sys._getframe`, looked up once.
static GETFRAME: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Whether the `refs` references `obj` had when a `free` method measured them (on entry, or
/// with no reference of its own taken since) are all explained by the caller (the innermost
/// Python frame: `free` is written in Rust) and the call itself, given the method's `baseline`.
/// False when the caller's frame cannot be inspected.
///
/// The caller marks the object freed first, so no view can be made while this runs: the count
/// can only drop (a view collected meanwhile), and what changes is counted.
pub fn only_callers(obj: &Bound<'_, PyAny>, refs: isize, baseline: Baseline) -> PyResult<bool> {
    let py = obj.py();
    let getframe = GETFRAME.get_or_try_init(py, || {
        Ok::<_, PyErr>(py.import("sys")?.getattr("_getframe")?.unbind())
    })?;
    let Ok(frame) = getframe.bind(py).call0() else {
        return Ok(false); // called from no Python frame (a thread's C code): assume views
    };
    let flags: i64 = frame.getattr("f_code")?.getattr("co_flags")?.extract()?;
    let snapshot = py.version_info() < (3, 13) && flags & CO_OPTIMIZED != 0;
    let before = refcount(obj);
    let locals = frame.getattr("f_locals")?;
    let globals = frame.getattr("f_globals")?;
    let mut held: isize = 0;
    for value in locals.call_method0("values")?.try_iter()? {
        if value?.is(obj) {
            held += 1;
        }
    }
    let after = refcount(obj);
    // What changed while the frame was read (a snapshot made or brought up to date; objects
    // collected meanwhile) counts, except the `held` references a snapshot holds now.
    let refs = refs + (after - before) - if snapshot { held } else { 0 };
    let base = if locals.is(&globals) {
        baseline.module
    } else {
        baseline.function
    };
    if snapshot {
        // The snapshot now holds every local, views of the object included, until the function
        // returns: emptied, it holds none. It is rebuilt from the frame's slots whenever it is
        // read again (`locals()`, `f_locals`, a tracer), so no variable changes.
        locals.cast::<PyDict>()?.clear();
    }
    Ok(refs < held + base)
}
