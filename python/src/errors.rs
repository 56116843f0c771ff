//! The exception hierarchy and the one conversion from [`vkgdr::Error`] to a Python exception.
//!
//! Every error is a `VkgdrError` (a `RuntimeError`, as in vkgdr 0.1) whose message has vkgdr
//! 0.1's form for driver failures, `"<call> failed (<RESULT_NAME>)"` ([`vkgdr::compat::message`]).
//! Subclasses let callers catch the outcomes they can act on.

use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use vkgdr::ring::core::RingError;

create_exception!(
    vkgdr,
    VkgdrError,
    PyRuntimeError,
    "Raised on every vkgdr failure. For driver failures the message reads \
     '<call> failed (<RESULT_NAME>)' and the attributes `call` and `result_name` hold both parts \
     (None for errors no driver returned)."
);
create_exception!(
    vkgdr,
    OutOfDeviceMemoryError,
    VkgdrError,
    "BAR-mappable GPU memory (or a pool's max_bytes) is exhausted: a normal, recoverable outcome."
);
create_exception!(
    vkgdr,
    LibraryNotFoundError,
    VkgdrError,
    "A driver library (libcuda.so.1 or the Vulkan loader) could not be loaded."
);
create_exception!(
    vkgdr,
    RingFullError,
    VkgdrError,
    "The ring had no room for the record within the timeout."
);

/// `InvalidArgumentError(VkgdrError, ValueError)`: made at import time because an exception with
/// two bases cannot be declared with `create_exception!`.
static INVALID_ARGUMENT: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// The `InvalidArgumentError` type, created on first use.
pub fn invalid_argument_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    INVALID_ARGUMENT
        .get_or_try_init(py, || {
            let bases = PyTuple::new(
                py,
                [
                    py.get_type::<VkgdrError>().into_any(),
                    py.get_type::<PyValueError>().into_any(),
                ],
            )?;
            let dict = PyDict::new(py);
            dict.set_item("__module__", "vkgdr")?;
            dict.set_item(
                "__doc__",
                "A bad argument: zero size, a range outside the memory, an alignment that is not a \
                 power of two, a stream that is not one. Both a VkgdrError and a ValueError.",
            )?;
            let made = py
                .get_type::<PyType>()
                .call1(("InvalidArgumentError", bases, dict))?;
            Ok(made.cast_into::<PyType>()?.unbind())
        })
        .map(|t| t.bind(py))
}

/// Which exception class an error becomes.
enum Kind {
    Base,
    OutOfMemory,
    LibraryNotFound,
    RingFull,
    InvalidArgument,
}

fn kind(e: &vkgdr::Error) -> Kind {
    match e {
        vkgdr::Error::OutOfDeviceMemory { .. } => Kind::OutOfMemory,
        vkgdr::Error::LibraryNotFound { .. } => Kind::LibraryNotFound,
        vkgdr::Error::InvalidArgument(_) => Kind::InvalidArgument,
        vkgdr::Error::Ring(RingError::Full | RingError::Timeout) => Kind::RingFull,
        vkgdr::Error::Ring(
            RingError::InvalidCapacity(_)
            | RingError::ZeroLength
            | RingError::RecordTooLarge { .. }
            | RingError::OutOfRange { .. },
        ) => Kind::InvalidArgument,
        _ => Kind::Base,
    }
}

/// Converts a library error into the matching exception, with `call` and `result_name` set.
pub fn to_py(e: vkgdr::Error) -> PyErr {
    Python::attach(|py| {
        let message = vkgdr::compat::message(&e);
        let made = match kind(&e) {
            Kind::Base => Ok(VkgdrError::new_err(message)),
            Kind::OutOfMemory => Ok(OutOfDeviceMemoryError::new_err(message)),
            Kind::LibraryNotFound => Ok(LibraryNotFoundError::new_err(message)),
            Kind::RingFull => Ok(RingFullError::new_err(message)),
            Kind::InvalidArgument => {
                invalid_argument_type(py).map(|t| PyErr::from_type(t.clone(), message))
            }
        };
        let err = match made {
            Ok(err) => err,
            Err(failed) => return failed,
        };
        let value = err.value(py);
        // Attributes are a convenience: a failure to set them must not hide the real error.
        let _ = value.setattr("call", e.driver_call());
        let _ = value.setattr("result_name", e.result_name());
        err
    })
}

/// A `VkgdrError` with a message of this package's own (no library error behind it).
pub fn vkgdr_error(message: impl Into<String>) -> PyErr {
    VkgdrError::new_err(message.into())
}

/// An `InvalidArgumentError` with a message of this package's own.
pub fn invalid_argument(message: impl Into<String>) -> PyErr {
    to_py(vkgdr::InvalidArgument::Other(message.into()).into())
}

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("VkgdrError", py.get_type::<VkgdrError>())?;
    m.add(
        "OutOfDeviceMemoryError",
        py.get_type::<OutOfDeviceMemoryError>(),
    )?;
    m.add(
        "LibraryNotFoundError",
        py.get_type::<LibraryNotFoundError>(),
    )?;
    m.add("RingFullError", py.get_type::<RingFullError>())?;
    m.add("InvalidArgumentError", invalid_argument_type(py)?)?;
    Ok(())
}
