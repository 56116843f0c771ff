//! The array protocols shared by `RawMemory` and `Block` (NumPy's `__array_interface__`, the CUDA
//! array interface v3) and reading bytes-like arguments.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyTuple};

use crate::errors::invalid_argument;

/// `__array_interface__` (version 3) of `len` writable bytes at host address `address`.
pub fn array_interface<'py>(
    py: Python<'py>,
    address: usize,
    len: u64,
    typestr: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("shape", (len,))?;
    d.set_item("typestr", typestr)?;
    d.set_item("data", (address, false))?; // false: not read-only
    d.set_item("version", 3)?;
    Ok(d)
}

/// `__cuda_array_interface__` (version 3) of `len` writable bytes at device address `address`.
/// No `stream` entry: the producer has no pending GPU work, so consumers need not synchronise.
pub fn cuda_array_interface<'py>(
    py: Python<'py>,
    address: u64,
    len: u64,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("shape", (len,))?;
    d.set_item("typestr", "|u1")?;
    d.set_item("data", (address, false))?;
    d.set_item("strides", py.None())?;
    d.set_item("version", 3)?;
    Ok(d)
}

/// Calls `f` with the bytes of a bytes-like object: `bytes` without a copy, anything else that
/// supports the buffer protocol (bytearray, memoryview, NumPy arrays) through one copy (the
/// abi3 API before Python 3.11 has no buffer access).
pub fn with_bytes<R>(data: &Bound<'_, PyAny>, f: impl FnOnce(&[u8]) -> R) -> PyResult<R> {
    if let Ok(b) = data.cast::<PyBytes>() {
        return Ok(f(b.as_bytes()));
    }
    if let Ok(b) = data.cast::<PyByteArray>() {
        return Ok(f(&b.to_vec()));
    }
    let copy = copied_bytes(data)?;
    Ok(f(copy.as_bytes()))
}

/// A `bytes` object with the bytes of a bytes-like object: `bytes` itself, anything else
/// (bytearray, memoryview, NumPy arrays) copied once, for callers that hold many at a time.
pub fn to_bytes<'py>(data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    match data.cast::<PyBytes>() {
        Ok(b) => Ok(b.clone()),
        Err(_) => copied_bytes(data),
    }
}

/// A new `bytes` object copied from any object with the buffer protocol, through `memoryview`
/// (the abi3 API before Python 3.11 has no buffer access); a `TypeError` naming the type
/// otherwise.
fn copied_bytes<'py>(data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let view = data
        .py()
        .import("builtins")?
        .getattr("memoryview")?
        .call1((data,))
        .map_err(|_| {
            pyo3::exceptions::PyTypeError::new_err(format!(
                "a bytes-like object is required, not '{}'",
                type_name(data)
            ))
        })?;
    Ok(view.call_method0("tobytes")?.cast_into::<PyBytes>()?)
}

/// The name of `obj`'s type, for error messages (empty if even that cannot be read).
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

/// The `(offset, size)` range a `flush`/`invalidate`/`read` call names in `len` bytes: `size`
/// None means "to the end" ([`vkgdr::range::range_to_end`]).
pub fn range(offset: u64, size: Option<u64>, len: u64) -> PyResult<(u64, u64)> {
    vkgdr::range::range_to_end(offset, size, len).map_err(|e| crate::errors::to_py(e.into()))
}

/// Drains this thread's write-combined stores to the mapping (a full fence: `mfence` on x86-64).
/// What `flush` means on coherent BAR memory: kernel launches drain them in practice, but only a
/// fence promises it.
pub fn drain_host_writes() {
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

static NUMPY: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// NumPy, imported once.
pub fn numpy(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    NUMPY
        .get_or_try_init(py, || Ok::<_, PyErr>(py.import("numpy")?.unbind()))
        .map(|m| m.bind(py))
}

/// A typed NumPy view of the `size` bytes `obj` exports through `__array_interface__` (a
/// `what`, for the errors): `dtype` (default `uint8`) and `shape` (default: as many elements as
/// fit). The view's base is `obj`, which it keeps alive.
pub fn typed_view<'py>(
    obj: &Bound<'py, PyAny>,
    size: u64,
    what: &str,
    dtype: Option<&Bound<'py, PyAny>>,
    shape: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    let np = numpy(py)?;
    let dtype = np.call_method1(
        "dtype",
        (dtype.map_or("u1".into_pyobject(py)?.into_any(), |d| d.clone()),),
    )?;
    let itemsize: u64 = dtype.getattr("itemsize")?.extract()?;
    if itemsize == 0 {
        return Err(invalid_argument("dtype has no size"));
    }
    let bytes = np.call_method1("asarray", (obj,))?;
    let shape: Bound<'py, PyTuple> = match shape {
        None => {
            if !size.is_multiple_of(itemsize) {
                return Err(invalid_argument(format!(
                    "a {size}-byte {what} is not a whole number of {itemsize}-byte items; \
                     give a shape"
                )));
            }
            PyTuple::new(py, [size / itemsize])?
        }
        Some(s) => match s.extract::<u64>() {
            Ok(n) => PyTuple::new(py, [n])?,
            Err(_) => PyTuple::new(py, s.try_iter()?.collect::<PyResult<Vec<_>>>()?)?,
        },
    };
    let mut count: u64 = 1;
    for d in shape.iter() {
        let d: u64 = d.extract()?;
        count = count
            .checked_mul(d)
            .ok_or_else(|| invalid_argument("shape too large"))?;
    }
    let needed = count
        .checked_mul(itemsize)
        .ok_or_else(|| invalid_argument("shape too large"))?;
    if needed > size {
        return Err(invalid_argument(format!(
            "shape {} of {itemsize}-byte items needs {needed} bytes; the {what} has {size}",
            shape.str()?
        )));
    }
    let prefix = bytes.get_item(pyo3::types::PySlice::new(py, 0, needed as isize, 1))?;
    prefix
        .call_method1("view", (dtype,))?
        .call_method1("reshape", (shape,))
}

/// Copies of at least this many bytes release the GIL (they take microseconds or more).
pub const LARGE_COPY: usize = 64 << 10;

/// Runs `f` with the GIL released when `len` bytes make it worth it ([`LARGE_COPY`]).
pub fn maybe_detached<R: Send>(py: Python<'_>, len: usize, f: impl FnOnce() -> R + Send) -> R {
    if len >= LARGE_COPY {
        py.detach(f)
    } else {
        f()
    }
}
