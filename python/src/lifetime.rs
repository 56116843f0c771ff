//! When may `free()` hand memory back at once? When nothing but the caller refers to the object.
//!
//! Views made through the array protocols (a NumPy array's `base`, a CuPy array's
//! `UnownedMemory`, Numba's and PyTorch's owners) hold a reference to the object whose interface
//! they read, and keep using its address. So `free()` on memory whose interfaces were read
//! releases it at once only when its reference count is fully explained by the caller: the
//! caller's own local variables holding it, and the reference the call itself holds (on the
//! caller's stack, or in a bound method). Otherwise the memory is marked freed and released when
//! the object is deallocated: when the last view (and the caller's last reference) is gone.
//!
//! What a call itself holds differs between Python versions (3.14 borrows references of local
//! variables on the stack) and between a function's locals and module-level names, so it is
//! measured at import with a probe object: `baseline` = the count a method sees on entry when
//! exactly one local variable (or one module-level name) refers to its object, which is
//! `1 + probe_stack + fixed` (`probe_stack`: what the cheapest call shape keeps on the caller's
//! stack; `fixed`: what the method call itself adds). A call then sees
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
//! `Block.free` no longer uses this rule: its exports are counted exactly ([`crate::exports`]).
//! Two kinds of `free` still use it: the methods of native classes below (their baseline
//! measured with [`RefProbe`]), and `vkgdr.RawMemory.free`, whose class is plain Python so that
//! programs may derive classes from it as in vkgdr 0.1. A Python function as `free` would see a
//! different count for each call shape (`m.free(**kw)` and `f = m.free; f()` hold one more than
//! `m.free()` from Python 3.11 on), so that `free` is a descriptor written in Rust
//! ([`crate::compat`]) whose bound object holds the receiver exactly once, whatever the shape.
//! The sharing classes' `AttachedMemory.detach` and `SharedBlock.release` ([`crate::peer`]) are
//! methods of native classes too, and use `Block.free`'s baseline.
//!
//! The rule counts references of a method's receiver, which a caller holds at least as often as
//! a plain call does. It cannot count those of an argument (`ShareServer.send_block`'s block):
//! a call with `*args`, or through `functools.partial`, holds an argument fewer times than a
//! plain call, and a view would pass unseen. So a block whose memory was exported is never sent.

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

/// The baseline of the `free` methods written in Rust, measured with [`RefProbe`].
static BASELINE: PyOnceLock<Baseline> = PyOnceLock::new();

/// A probe whose `free` is a method of a native class, as `Block.free` is, takes the keywords of
/// `vkgdr.RawMemory.free` (`after`, and `now`, which `Block.free` lacks and the calibration
/// passes), and returns the receiver's reference count on entry: what [`calibrate`] measures.
#[pyclass(module = "vkgdr._vkgdr", name = "_RefProbe")]
pub struct RefProbe;

#[pymethods]
impl RefProbe {
    #[new]
    fn new() -> Self {
        RefProbe
    }

    /// The receiver's reference count on entry.
    #[pyo3(signature = (*, after = None, now = false))]
    fn free(slf: &Bound<'_, Self>, after: Option<&Bound<'_, PyAny>>, now: bool) -> isize {
        let _ = (after, now);
        refcount(slf.as_any())
    }
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

/// [`measure`] for the tests: `(function, module, unbound_function, unbound_module)`.
#[pyfunction]
#[pyo3(name = "_calibrate")]
pub fn calibrate(cls: &Bound<'_, PyType>) -> PyResult<(isize, isize, isize, isize)> {
    let c = measure(cls)?;
    Ok((
        c.bound.function,
        c.bound.module,
        c.unbound.function,
        c.unbound.module,
    ))
}

/// Measures the baseline of the Rust `free` methods once (at import). A method of a native class
/// cannot tell whether it was called through the instance or the class: the smaller count holds.
pub fn init(py: Python<'_>) -> PyResult<()> {
    let c = measure(&py.get_type::<RefProbe>())?;
    let baseline = Baseline {
        function: c.bound.function.min(c.unbound.function),
        module: c.bound.module.min(c.unbound.module),
    };
    let _ = BASELINE.set(py, baseline);
    Ok(())
}

/// [`only_callers`] for the `free` methods written in Rust, called from Python directly (the
/// caller is the innermost Python frame).
pub fn only_callers_of_rust_free(obj: &Bound<'_, PyAny>, refs: isize) -> PyResult<bool> {
    match BASELINE.get(obj.py()) {
        Some(&baseline) => only_callers(obj, refs, baseline),
        None => Ok(false), // not calibrated: assume views
    }
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
