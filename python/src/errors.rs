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
use vkgdr::ring::core::d2h::D2hError;
use vkgdr::ring::core::RingError;
use vkgdr::share::{RefusalCode, ShareError as LibShareError};

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
create_exception!(
    vkgdr,
    ShareError,
    VkgdrError,
    "Sharing with another process failed: the owner refused a request (no such region, busy, \
     over quota, not allowed), revoked what was attached, hung up or did not answer in time, or \
     a message, descriptor or fd was refused by name. The message says which; the attribute \
     `reason` names the outcomes a program acts on ('no_such_region', 'not_allowed', 'revoked', \
     'busy', 'out_of_memory', 'quota', 'bad_request', 'internal', 'disconnected', 'timeout', \
     'name_taken'), None for the others."
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
    Share,
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
        vkgdr::Error::D2h(D2hError::InvalidShape { .. } | D2hError::NoSuchLane { .. }) => {
            Kind::InvalidArgument
        }
        vkgdr::Error::Share(LibShareError::BadName(_)) => Kind::InvalidArgument,
        vkgdr::Error::Share(_) => Kind::Share,
        _ => Kind::Base,
    }
}

/// The `reason` attribute of a `ShareError`: the outcomes a program acts on, by a stable name.
fn share_reason(e: &vkgdr::Error) -> Option<&'static str> {
    let vkgdr::Error::Share(e) = e else {
        return None;
    };
    Some(match e {
        LibShareError::Refused { code, .. } => match code {
            RefusalCode::NoSuchRegion => "no_such_region",
            RefusalCode::NotAllowed => "not_allowed",
            RefusalCode::Revoked => "revoked",
            RefusalCode::Busy => "busy",
            RefusalCode::OutOfMemory => "out_of_memory",
            RefusalCode::Quota => "quota",
            RefusalCode::BadRequest => "bad_request",
            _ => "internal",
        },
        LibShareError::PeerNotAllowed { .. } => "not_allowed",
        LibShareError::Revoked => "revoked",
        LibShareError::Disconnected => "disconnected",
        LibShareError::Timeout { .. } => "timeout",
        LibShareError::NameTaken(_) => "name_taken",
        _ => return None,
    })
}

/// Converts a library error into the matching exception, with `call` and `result_name` set.
pub fn to_py(e: vkgdr::Error) -> PyErr {
    let message = vkgdr::compat::message(&e);
    made(e, message)
}

/// [`to_py`] with `context` before the library's message (`"<context>: <message>"`).
pub fn to_py_in(e: vkgdr::Error, context: &str) -> PyErr {
    let message = format!("{context}: {}", vkgdr::compat::message(&e));
    made(e, message)
}

/// The exception for `e`, with `message` and the attributes of `e`.
fn made(e: vkgdr::Error, message: String) -> PyErr {
    Python::attach(|py| {
        let made = match kind(&e) {
            Kind::Base => Ok(VkgdrError::new_err(message)),
            Kind::OutOfMemory => Ok(OutOfDeviceMemoryError::new_err(message)),
            Kind::LibraryNotFound => Ok(LibraryNotFoundError::new_err(message)),
            Kind::RingFull => Ok(RingFullError::new_err(message)),
            Kind::Share => Ok(ShareError::new_err(message)),
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
        if let Kind::Share = kind(&e) {
            let _ = value.setattr("reason", share_reason(&e));
        }
        err
    })
}

/// A `ShareError` for any library error `e` (a failure to reach an owner is one, whatever the
/// system call said), with `context` before its message.
pub fn share_error_in(e: vkgdr::Error, context: &str) -> PyErr {
    let message = format!("{context}: {}", vkgdr::compat::message(&e));
    Python::attach(|py| {
        let err = ShareError::new_err(message);
        let value = err.value(py);
        let _ = value.setattr("call", e.driver_call());
        let _ = value.setattr("result_name", e.result_name());
        let _ = value.setattr("reason", share_reason(&e));
        err
    })
}

/// A `ShareError` with a message of this package's own and `reason` (see the class docs).
pub fn share_error(message: impl Into<String>, reason: Option<&str>) -> PyErr {
    Python::attach(|py| {
        let err = ShareError::new_err(message.into());
        let value = err.value(py);
        let _ = value.setattr("reason", reason);
        let _ = value.setattr("call", py.None());
        let _ = value.setattr("result_name", py.None());
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
    let share = py.get_type::<ShareError>();
    share.setattr("reason", py.None())?;
    m.add("ShareError", share)?;
    m.add("InvalidArgumentError", invalid_argument_type(py)?)?;
    Ok(())
}
