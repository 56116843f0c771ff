//! CUDA streams named by Python arguments (`free(after=stream)`, `watch_consumer(stream)`): a
//! stream object of CuPy (`.ptr`), PyTorch (`.cuda_stream`), PyCUDA or Numba (`.handle`), or
//! anything with `__cuda_stream__`; or a raw `CUstream` handle wrapped in `vkgdr.RawStream`.
//!
//! A bare int is refused with a `TypeError`: the driver cannot check a handle, and a release
//! fenced on an int that names no live stream crashes the process inside it. So a raw handle
//! passes only where the program says, by wrapping it, that it vouches for it.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyTuple};
use vkgdr::cuda::CuStream;

use crate::errors::invalid_argument;
use crate::interface::type_name;

/// ``RawStream(handle)``: a raw ``CUstream`` handle (an int; 0 is the legacy default stream)
/// that the program vouches for, for the arguments that take a CUDA stream
/// (``free(after=...)``, ``watch_consumer(...)``), which refuse a bare int.
///
/// The handle must name a live stream of the device the memory or ring belongs to, for as long
/// as the call says (a release fenced on it: until the memory has gone back), as in C; a handle
/// that names no stream crashes the process inside the CUDA driver. Pass the stream object
/// itself (CuPy, PyTorch, PyCUDA, Numba, or one with ``__cuda_stream__``) where there is one:
/// it is kept alive as long as needed.
#[pyclass(module = "vkgdr", name = "RawStream", frozen)]
pub struct RawStream {
    handle: usize,
}

#[pymethods]
impl RawStream {
    #[new]
    fn new(handle: &Bound<'_, PyAny>) -> PyResult<Self> {
        if handle.is_instance_of::<PyBool>() {
            return Err(PyTypeError::new_err(
                "RawStream takes an int CUstream handle, not a bool",
            ));
        }
        match handle.extract::<usize>() {
            Ok(handle) => Ok(RawStream { handle }),
            Err(_) if is_int(handle) => {
                Err(invalid_argument(format!(
                "RawStream takes a CUstream handle, an unsigned pointer-sized int; {} is not one",
                handle.repr().map_or_else(|_| "it".into(), |r| r.to_string())
            )))
            }
            Err(_) => Err(PyTypeError::new_err(format!(
                "RawStream takes an int CUstream handle, not {}; pass a stream object to \
                 free(after=...) or watch_consumer(...) itself",
                type_name(handle)
            ))),
        }
    }

    /// The ``CUstream`` handle (0: the legacy default stream).
    #[getter]
    fn handle(&self) -> usize {
        self.handle
    }

    fn __repr__(&self) -> String {
        format!("vkgdr.RawStream({:#x})", self.handle)
    }
}

/// A stream from a Python argument. The stream object (not a `RawStream`'s handle) is kept, so
/// the stream it owns is not destroyed while a release still has to be fenced on it.
pub struct StreamArg {
    handle: usize,
    /// The Python object that owns the stream; `None` for a `RawStream`.
    _owner: Option<Py<PyAny>>,
}

impl StreamArg {
    /// The raw `CUstream` (null: the legacy default stream).
    pub fn raw(&self) -> CuStream {
        self.handle as CuStream
    }

    /// Whether this is the null handle, the legacy default stream that every release is fenced
    /// on anyway.
    pub fn is_null(&self) -> bool {
        self.handle == 0
    }
}

/// Whether `value` is an int in Python's sense (an `int` or anything with `__index__`, such as
/// NumPy's integers), bools aside.
fn is_int(value: &Bound<'_, PyAny>) -> bool {
    !value.is_instance_of::<PyBool>()
        && (value.is_instance_of::<PyInt>() || value.hasattr("__index__").unwrap_or(false))
}

/// The handle in an int, or in a ctypes pointer (Numba's `Stream.handle` is a `c_void_p`, whose
/// `value` is None for the null stream): what a stream object's attribute holds.
fn handle_value(value: &Bound<'_, PyAny>) -> Option<usize> {
    if value.is_none() {
        return Some(0);
    }
    if value.is_instance_of::<PyInt>() && !value.is_instance_of::<PyBool>() {
        return value.extract::<usize>().ok();
    }
    match value.getattr("value") {
        Ok(inner) if inner.is_none() => Some(0),
        Ok(inner) if inner.is_instance_of::<PyInt>() => inner.extract::<usize>().ok(),
        _ => None,
    }
}

/// The `TypeError` for a bare int passed as the stream `param` (`"free(after=...)"`): it names
/// the explicit alternative.
fn bare_int(param: &str, obj: &Bound<'_, PyAny>) -> PyErr {
    let value = obj
        .str()
        .map_or_else(|_| "an int".to_string(), |s| format!("the int {s}"));
    PyTypeError::new_err(format!(
        "{param} takes a CUDA stream object, not {value}: an int that names no live stream \
         crashes the CUDA driver. Pass the stream itself (a CuPy, PyTorch, PyCUDA or Numba \
         stream, or an object with __cuda_stream__), or wrap a CUstream handle you know to be \
         live as vkgdr.RawStream(handle) (vkgdr.RawStream(0) is the legacy default stream)"
    ))
}

/// Reads the stream argument `param` (`"free(after=...)"`, for the messages).
///
/// Raises `TypeError` for a bare int (see the module docs) and `InvalidArgumentError` for
/// anything else that names no stream (bools, other objects). Whether a stream object's handle
/// or a `RawStream` is a live stream of the right device cannot be checked: a stream object is
/// alive while it is referenced, and this keeps a reference; a `RawStream` is the program's
/// promise, as in C.
pub fn stream_arg(obj: &Bound<'_, PyAny>, param: &str) -> PyResult<StreamArg> {
    if let Ok(raw) = obj.cast::<RawStream>() {
        return Ok(StreamArg {
            handle: raw.get().handle,
            _owner: None,
        });
    }
    let bad = || {
        invalid_argument(format!(
            "{param} expected a CUDA stream: a stream object with .ptr (CuPy), .cuda_stream \
             (PyTorch) or .handle (PyCUDA, Numba), or __cuda_stream__, or a raw CUstream \
             handle as vkgdr.RawStream(handle); got {}",
            type_name(obj)
        ))
    };
    if obj.is_instance_of::<PyBool>() {
        return Err(bad());
    }
    if obj.is_instance_of::<PyInt>() {
        return Err(bare_int(param, obj));
    }
    // The CUDA stream protocol: `__cuda_stream__()` returns `(version, handle)`.
    if let Ok(method) = obj.getattr("__cuda_stream__") {
        let answer = method.call0()?;
        let pair = answer.cast::<PyTuple>().map_err(|_| bad())?;
        if pair.len() == 2 {
            if let Some(handle) = handle_value(&pair.get_item(1)?) {
                return Ok(StreamArg {
                    handle,
                    _owner: Some(obj.clone().unbind()),
                });
            }
        }
        return Err(bad());
    }
    for attribute in ["ptr", "cuda_stream", "handle"] {
        if let Ok(value) = obj.getattr(attribute) {
            let handle = handle_value(&value).ok_or_else(bad)?;
            return Ok(StreamArg {
                handle,
                _owner: Some(obj.clone().unbind()),
            });
        }
    }
    // Other ints (NumPy's), once no stream object's attribute was found.
    Err(if is_int(obj) {
        bare_int(param, obj)
    } else {
        bad()
    })
}

/// A stream argument that may be left out (`free(after=None)`): `None` when it is, or when it
/// names the legacy default stream (null), which every release is fenced on anyway.
pub fn optional_stream_arg(
    obj: Option<&Bound<'_, PyAny>>,
    param: &str,
) -> PyResult<Option<StreamArg>> {
    match obj {
        Some(obj) => Ok(Some(stream_arg(obj, param)?).filter(|s| !s.is_null())),
        None => Ok(None),
    }
}
