//! DLPack export (`__dlpack__`): a one-dimensional `uint8` tensor over a block's bytes, with no
//! copy, as a `"dltensor"` capsule (DLPack 0.x consumers) or a `"dltensor_versioned"` capsule
//! (DLPack 1.x, when the consumer passes `max_version >= (1, 0)`).
//!
//! Ownership follows the DLPack protocol: the capsule owns the managed tensor until a consumer
//! renames it (`"used_dltensor"`, `"used_dltensor_versioned"`) and later calls the tensor's
//! deleter, from any thread and possibly without the GIL. The tensor therefore keeps the memory
//! alive through an [`ExportRef`] (an `Arc` of Rust state, counted as an export of the memory),
//! never through a Python object.

use std::ffi::{c_void, CStr};

use pyo3::ffi;
use pyo3::prelude::*;

use crate::exports::ExportRef;

/// `kDLCPU`.
pub const DEVICE_CPU: i32 = 1;
/// `kDLCUDA`.
pub const DEVICE_CUDA: i32 = 2;
/// `kDLUInt`.
const DTYPE_UINT: u8 = 1;

const NAME: &CStr = c"dltensor";
const NAME_VERSIONED: &CStr = c"dltensor_versioned";

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

#[repr(C)]
struct DlPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DlManagedTensorVersioned {
    version: DlPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DlTensor,
}

// The layouts of dlpack.h (v0.8 and v1.0) on 64-bit targets.
const _: () = assert!(std::mem::size_of::<DlDevice>() == 8);
const _: () = assert!(std::mem::size_of::<DlDataType>() == 4);
const _: () = assert!(std::mem::size_of::<DlTensor>() == 48);
const _: () = assert!(std::mem::size_of::<DlManagedTensor>() == 64);
const _: () = assert!(std::mem::size_of::<DlManagedTensorVersioned>() == 80);

/// What a tensor's `manager_ctx` owns: its shape and strides, and an export of the memory.
struct Keep {
    shape: [i64; 1],
    strides: [i64; 1],
    _owner: ExportRef,
}

/// Where the exported bytes are: an address on a DLPack device.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// Host address (`DEVICE_CPU`) or device address (`DEVICE_CUDA`).
    pub address: u64,
    /// `kDLCPU` or `kDLCUDA`.
    pub device_type: i32,
    /// CUDA device ordinal (0 for the CPU).
    pub device_id: i32,
    /// Length in bytes.
    pub len: u64,
}

fn tensor(target: Target, keep: &mut Keep) -> DlTensor {
    DlTensor {
        data: target.address as *mut c_void,
        device: DlDevice {
            device_type: target.device_type,
            device_id: target.device_id,
        },
        ndim: 1,
        dtype: DlDataType {
            code: DTYPE_UINT,
            bits: 8,
            lanes: 1,
        },
        shape: keep.shape.as_mut_ptr(),
        strides: keep.strides.as_mut_ptr(),
        byte_offset: 0,
    }
}

fn new_keep(target: Target, owner: ExportRef) -> PyResult<*mut Keep> {
    let len = i64::try_from(target.len)
        .map_err(|_| crate::errors::invalid_argument("block too large for DLPack"))?;
    Ok(Box::into_raw(Box::new(Keep {
        shape: [len],
        strides: [1],
        _owner: owner,
    })))
}

/// The two managed-tensor structs, for one deleter body.
trait Managed {
    fn manager_ctx(&self) -> *mut c_void;
}

impl Managed for DlManagedTensor {
    fn manager_ctx(&self) -> *mut c_void {
        self.manager_ctx
    }
}

impl Managed for DlManagedTensorVersioned {
    fn manager_ctx(&self) -> *mut c_void {
        self.manager_ctx
    }
}

/// Frees a managed tensor made by [`export`] and drops its reference on the memory.
///
/// # Safety
/// - `t` is null, or a tensor made by `Box::into_raw` in [`export`] whose `manager_ctx` is its
///   `Keep`, not deleted before (the protocol calls the deleter exactly once: the capsule
///   destructor only when no consumer took the tensor).
unsafe fn delete<T: Managed>(t: *mut T) {
    if t.is_null() {
        return;
    }
    // A panic must not unwind into the consumer's C code.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: per this function's contract.
        unsafe {
            drop(Box::from_raw((*t).manager_ctx().cast::<Keep>()));
            drop(Box::from_raw(t));
        }
    }));
}

unsafe extern "C" fn delete_managed(t: *mut DlManagedTensor) {
    // SAFETY: DLPack calls the deleter with the tensor it was set on, once.
    unsafe { delete(t) }
}

unsafe extern "C" fn delete_versioned(t: *mut DlManagedTensorVersioned) {
    // SAFETY: as in `delete_managed`.
    unsafe { delete(t) }
}

unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // Called with the GIL held when the capsule is collected. A consumer that took the tensor
    // renamed the capsule, and then it is not ours to delete. `PyCapsule_IsValid` sets no
    // exception, and `PyCapsule_GetPointer` cannot fail after it said yes.
    // SAFETY: `capsule` is the capsule being destroyed; the names are NUL-terminated statics.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME.as_ptr()) == 1 {
            let t = ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr()).cast::<DlManagedTensor>();
            delete_managed(t);
        } else if ffi::PyCapsule_IsValid(capsule, NAME_VERSIONED.as_ptr()) == 1 {
            let t = ffi::PyCapsule_GetPointer(capsule, NAME_VERSIONED.as_ptr())
                .cast::<DlManagedTensorVersioned>();
            delete_versioned(t);
        }
    }
}

/// A DLPack capsule over `target`, keeping `owner` alive until the consumer releases it.
/// `versioned` chooses the DLPack 1.0 capsule.
pub fn export<'py>(
    py: Python<'py>,
    target: Target,
    owner: ExportRef,
    versioned: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let keep = new_keep(target, owner)?;
    // SAFETY: `keep` was just made by `Box::into_raw` and is not shared yet.
    let dl_tensor = tensor(target, unsafe { &mut *keep });
    let (pointer, name, undo): (*mut c_void, &CStr, Box<dyn FnOnce()>) = if versioned {
        let t = Box::into_raw(Box::new(DlManagedTensorVersioned {
            version: DlPackVersion { major: 1, minor: 0 },
            manager_ctx: keep.cast(),
            deleter: Some(delete_versioned),
            flags: 0, // writable, not a copy
            dl_tensor,
        }));
        // SAFETY: `t` is ours until the capsule exists.
        (
            t.cast(),
            NAME_VERSIONED,
            Box::new(move || unsafe { delete_versioned(t) }),
        )
    } else {
        let t = Box::into_raw(Box::new(DlManagedTensor {
            dl_tensor,
            manager_ctx: keep.cast(),
            deleter: Some(delete_managed),
        }));
        // SAFETY: `t` is ours until the capsule exists.
        (
            t.cast(),
            NAME,
            Box::new(move || unsafe { delete_managed(t) }),
        )
    };
    // SAFETY: `pointer` is non-null and lives until the destructor or a consumer deletes it;
    // `name` is a static C string, as the capsule API requires (it keeps the pointer).
    let capsule = unsafe { ffi::PyCapsule_New(pointer, name.as_ptr(), Some(capsule_destructor)) };
    if capsule.is_null() {
        undo();
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new, owned reference returned by `PyCapsule_New`.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) })
}

/// Whether the consumer's `max_version` asks for a versioned (DLPack 1.x) capsule.
pub fn wants_versioned(max_version: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
    match max_version {
        None => Ok(false),
        Some(v) if v.is_none() => Ok(false),
        Some(v) => {
            let (major, _minor): (u32, u32) = v.extract()?;
            Ok(major >= 1)
        }
    }
}
