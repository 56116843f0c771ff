//! CUDA streams named by Python arguments (`free(after=stream)`, `watch_consumer(stream)`): an int
//! handle (`CUstream`) or a stream object of CuPy (`.ptr`), PyTorch (`.cuda_stream`), PyCUDA or
//! Numba (`.handle`), or anything with `__cuda_stream__`.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyTuple};
use vkgdr::cuda::CuStream;

use crate::errors::invalid_argument;
use crate::interface::type_name;

/// A stream from a Python argument. The stream object (not an int handle) is kept, so the
/// stream it owns is not destroyed while a release still has to be fenced on it.
pub struct StreamArg {
    handle: usize,
    /// The Python object that owns the stream; `None` for an int handle.
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

/// The handle in an int, or in a ctypes pointer (Numba's `Stream.handle` is a `c_void_p`, whose
/// `value` is None for the null stream).
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

/// Reads a stream argument.
///
/// Raises `InvalidArgumentError` for anything that names no stream (negative ints, bools, other
/// objects). Whether the handle is a live stream of the right device cannot be checked: for an
/// int, the caller promises it (as in C); a stream object is alive while it is referenced, and
/// this keeps a reference.
pub fn stream_arg(obj: &Bound<'_, PyAny>) -> PyResult<StreamArg> {
    let bad = || {
        invalid_argument(format!(
            "expected a CUDA stream: an int handle (CUstream) or a stream object with .ptr \
             (CuPy), .cuda_stream (PyTorch) or .handle (PyCUDA), or __cuda_stream__; got {}",
            type_name(obj)
        ))
    };
    if obj.is_instance_of::<PyBool>() {
        return Err(bad());
    }
    if obj.is_instance_of::<PyInt>() {
        let handle = obj.extract::<usize>().map_err(|_| bad())?;
        return Ok(StreamArg {
            handle,
            _owner: None,
        });
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
    Err(bad())
}

/// A stream argument that may be left out (`free(after=None)`): `None` when it is, or when it
/// names the legacy default stream (null), which every release is fenced on anyway.
pub fn optional_stream_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<StreamArg>> {
    match obj {
        Some(obj) => Ok(Some(stream_arg(obj)?).filter(|s| !s.is_null())),
        None => Ok(None),
    }
}
