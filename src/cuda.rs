//! The CUDA driver API, loaded at run time from `libcuda.so.1` (never linked).
//!
//! Only the symbols the crate needs are resolved, preferring the `_v2` names where the driver has
//! them. Everything here is a thin, explicit layer: [`Driver`] is the function table,
//! [`Driver::check`] turns a `CUresult` into [`Error::Cuda`] with the name from `cuGetErrorName`,
//! and [`ContextGuard`] makes a context current for a scope. Small RAII types over CUDA objects
//! (modules, streams, events, pinned and device buffers) live in [`crate::cuda_objects`].

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::ptr;
use std::sync::{Arc, OnceLock};

use crate::error::{Error, MemorySide, Result};

/// `CUresult`.
pub type CuResult = c_int;
/// `CUdevice`.
pub type CuDevice = c_int;
/// `CUcontext`.
pub type CuContext = *mut c_void;
/// `CUdeviceptr`.
pub type CuDevicePtr = u64;
/// `CUexternalMemory`.
pub type CuExternalMemory = *mut c_void;
/// `CUmodule`.
pub type CuModule = *mut c_void;
/// `CUfunction`.
pub type CuFunction = *mut c_void;
/// `CUstream`.
pub type CuStream = *mut c_void;
/// `CUevent`.
pub type CuEvent = *mut c_void;
/// `CUmemGenericAllocationHandle`.
pub type CuMemHandle = u64;

/// `CUDA_SUCCESS`.
pub const CUDA_SUCCESS: CuResult = 0;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CUDA_ERROR_OUT_OF_MEMORY: CuResult = 2;
/// `CUDA_ERROR_NOT_READY`.
pub const CUDA_ERROR_NOT_READY: CuResult = 600;
/// `CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD`.
pub const CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD: c_uint = 1;
/// `CU_MEMHOSTALLOC_DEVICEMAP`.
pub const CU_MEMHOSTALLOC_DEVICEMAP: c_uint = 2;
/// `CU_DEVICE_ATTRIBUTE_PCI_BUS_ID`.
pub const CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: c_int = 33;
/// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`.
pub const CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: c_int = 102;
/// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`.
pub const CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: c_int = 103;
/// `CU_EVENT_DISABLE_TIMING`.
pub const CU_EVENT_DISABLE_TIMING: c_uint = 2;
/// `CU_STREAM_NON_BLOCKING`.
pub const CU_STREAM_NON_BLOCKING: c_uint = 1;

/// `CUDA_EXTERNAL_MEMORY_HANDLE_DESC` (104 bytes on x86-64).
#[repr(C)]
pub struct ExternalMemoryHandleDesc {
    /// `CUexternalMemoryHandleType`.
    pub handle_type: c_uint,
    /// The handle union: for an opaque fd only the first 4 bytes (the fd) are used.
    pub handle: [u64; 2],
    /// Size of the memory object in bytes.
    pub size: u64,
    /// `CUDA_EXTERNAL_MEMORY_DEDICATED` or 0.
    pub flags: c_uint,
    /// Must be zero.
    pub reserved: [c_uint; 16],
}

/// `CUDA_EXTERNAL_MEMORY_BUFFER_DESC` (88 bytes on x86-64).
#[repr(C)]
pub struct ExternalMemoryBufferDesc {
    /// Offset into the memory object.
    pub offset: u64,
    /// Size of the buffer.
    pub size: u64,
    /// Must be zero.
    pub flags: c_uint,
    /// Must be zero.
    pub reserved: [c_uint; 16],
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemLocation {
    /// `CU_MEM_LOCATION_TYPE_DEVICE` = 1.
    pub location_type: c_uint,
    /// Device ordinal.
    pub id: c_int,
}

/// `CUmemAllocationProp` (32 bytes on x86-64).
#[repr(C)]
pub struct MemAllocationProp {
    /// `CU_MEM_ALLOCATION_TYPE_PINNED` = 1.
    pub alloc_type: c_uint,
    /// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` = 1.
    pub requested_handle_types: c_uint,
    /// Where the memory lives.
    pub location: MemLocation,
    /// Windows only; null.
    pub win32_handle_meta_data: *mut c_void,
    /// `compressionType`, `gpuDirectRDMACapable`, `usage`, reserved: all zero here.
    pub alloc_flags: [u8; 8],
}

/// `CUmemAccessDesc`.
#[repr(C)]
pub struct MemAccessDesc {
    /// The device given access.
    pub location: MemLocation,
    /// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE` = 3.
    pub flags: c_uint,
}

const _: () = assert!(std::mem::size_of::<ExternalMemoryHandleDesc>() == 104);
const _: () = assert!(std::mem::size_of::<ExternalMemoryBufferDesc>() == 88);
const _: () = assert!(std::mem::size_of::<MemAllocationProp>() == 32);

const LIBRARY: &str = "libcuda.so.1";

macro_rules! driver_table {
    (
        required { $( $field:ident : $sym:literal => fn($($arg:ty),*) ; )* }
        optional { $( $ofield:ident : $osym:literal => fn($($oarg:ty),*) ; )* }
    ) => {
        /// The CUDA driver's function table, resolved once from `libcuda.so.1`.
        ///
        /// Calling any of these pointers is `unsafe`: the arguments must satisfy the CUDA driver
        /// API's documented contract for that function.
        #[allow(missing_docs)]
        pub struct Driver {
            _lib: libloading::Library,
            $( pub $field: unsafe extern "C" fn($($arg),*) -> CuResult, )*
            $( pub $ofield: Option<unsafe extern "C" fn($($oarg),*) -> CuResult>, )*
        }

        impl Driver {
            fn resolve(lib: libloading::Library) -> Result<Self> {
                $(
                    // SAFETY: the symbol is a CUDA driver API function whose C signature is the one
                    // spelled out in the table above (from cuda.h); the pointer is copied out and
                    // stays valid because the library is kept alive in `_lib`.
                    let $field = unsafe {
                        *lib.get::<unsafe extern "C" fn($($arg),*) -> CuResult>(
                            concat!($sym, "\0").as_bytes(),
                        )
                        .map_err(|_| Error::MissingSymbol { library: LIBRARY, symbol: $sym })?
                    };
                )*
                $(
                    // SAFETY: as above; a missing optional symbol is recorded as `None`.
                    let $ofield = unsafe {
                        lib.get::<unsafe extern "C" fn($($oarg),*) -> CuResult>(
                            concat!($osym, "\0").as_bytes(),
                        )
                        .ok()
                        .map(|s| *s)
                    };
                )*
                Ok(Driver { _lib: lib, $( $field, )* $( $ofield, )* })
            }
        }
    };
}

driver_table! {
    required {
        cu_init: "cuInit" => fn(c_uint);
        cu_driver_get_version: "cuDriverGetVersion" => fn(*mut c_int);
        cu_get_error_name: "cuGetErrorName" => fn(CuResult, *mut *const c_char);
        cu_device_get_count: "cuDeviceGetCount" => fn(*mut c_int);
        cu_device_get: "cuDeviceGet" => fn(*mut CuDevice, c_int);
        cu_device_get_name: "cuDeviceGetName" => fn(*mut c_char, c_int, CuDevice);
        cu_device_get_uuid: "cuDeviceGetUuid" => fn(*mut [u8; 16], CuDevice);
        cu_device_total_mem: "cuDeviceTotalMem_v2" => fn(*mut usize, CuDevice);
        cu_device_get_attribute: "cuDeviceGetAttribute" => fn(*mut c_int, c_int, CuDevice);
        cu_device_primary_ctx_retain: "cuDevicePrimaryCtxRetain" => fn(*mut CuContext, CuDevice);
        cu_device_primary_ctx_release: "cuDevicePrimaryCtxRelease_v2" => fn(CuDevice);
        cu_device_primary_ctx_get_state: "cuDevicePrimaryCtxGetState" => fn(CuDevice, *mut c_uint, *mut c_int);
        cu_ctx_get_current: "cuCtxGetCurrent" => fn(*mut CuContext);
        cu_ctx_get_device: "cuCtxGetDevice" => fn(*mut CuDevice);
        cu_ctx_push_current: "cuCtxPushCurrent_v2" => fn(CuContext);
        cu_ctx_pop_current: "cuCtxPopCurrent_v2" => fn(*mut CuContext);
        cu_ctx_synchronize: "cuCtxSynchronize" => fn();
        cu_import_external_memory: "cuImportExternalMemory" => fn(*mut CuExternalMemory, *const ExternalMemoryHandleDesc);
        cu_external_memory_get_mapped_buffer: "cuExternalMemoryGetMappedBuffer" => fn(*mut CuDevicePtr, CuExternalMemory, *const ExternalMemoryBufferDesc);
        cu_destroy_external_memory: "cuDestroyExternalMemory" => fn(CuExternalMemory);
        cu_mem_alloc: "cuMemAlloc_v2" => fn(*mut CuDevicePtr, usize);
        cu_mem_free: "cuMemFree_v2" => fn(CuDevicePtr);
        cu_mem_get_info: "cuMemGetInfo_v2" => fn(*mut usize, *mut usize);
        cu_mem_alloc_host: "cuMemHostAlloc" => fn(*mut *mut c_void, usize, c_uint);
        cu_mem_free_host: "cuMemFreeHost" => fn(*mut c_void);
        cu_mem_host_get_device_pointer: "cuMemHostGetDevicePointer_v2" => fn(*mut CuDevicePtr, *mut c_void, c_uint);
        cu_memcpy_htod: "cuMemcpyHtoD_v2" => fn(CuDevicePtr, *const c_void, usize);
        cu_memcpy_dtoh: "cuMemcpyDtoH_v2" => fn(*mut c_void, CuDevicePtr, usize);
        cu_memcpy_htod_async: "cuMemcpyHtoDAsync_v2" => fn(CuDevicePtr, *const c_void, usize, CuStream);
        cu_memcpy_dtoh_async: "cuMemcpyDtoHAsync_v2" => fn(*mut c_void, CuDevicePtr, usize, CuStream);
        cu_memset_d32: "cuMemsetD32_v2" => fn(CuDevicePtr, c_uint, usize);
        cu_memset_d8: "cuMemsetD8_v2" => fn(CuDevicePtr, u8, usize);
        cu_module_load_data: "cuModuleLoadData" => fn(*mut CuModule, *const c_void);
        cu_module_unload: "cuModuleUnload" => fn(CuModule);
        cu_module_get_function: "cuModuleGetFunction" => fn(*mut CuFunction, CuModule, *const c_char);
        cu_launch_kernel: "cuLaunchKernel" => fn(CuFunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CuStream, *mut *mut c_void, *mut *mut c_void);
        cu_stream_create: "cuStreamCreate" => fn(*mut CuStream, c_uint);
        cu_stream_destroy: "cuStreamDestroy_v2" => fn(CuStream);
        cu_stream_synchronize: "cuStreamSynchronize" => fn(CuStream);
        cu_stream_query: "cuStreamQuery" => fn(CuStream);
        cu_event_create: "cuEventCreate" => fn(*mut CuEvent, c_uint);
        cu_event_record: "cuEventRecord" => fn(CuEvent, CuStream);
        cu_event_query: "cuEventQuery" => fn(CuEvent);
        cu_event_synchronize: "cuEventSynchronize" => fn(CuEvent);
        cu_event_destroy: "cuEventDestroy_v2" => fn(CuEvent);
    }
    optional {
        cu_mem_address_reserve: "cuMemAddressReserve" => fn(*mut CuDevicePtr, usize, usize, CuDevicePtr, u64);
        cu_mem_address_free: "cuMemAddressFree" => fn(CuDevicePtr, usize);
        cu_mem_import_from_shareable_handle: "cuMemImportFromShareableHandle" => fn(*mut CuMemHandle, *mut c_void, c_uint);
        cu_mem_map: "cuMemMap" => fn(CuDevicePtr, usize, usize, CuMemHandle, u64);
        cu_mem_unmap: "cuMemUnmap" => fn(CuDevicePtr, usize);
        cu_mem_set_access: "cuMemSetAccess" => fn(CuDevicePtr, usize, *const MemAccessDesc, usize);
        cu_mem_release: "cuMemRelease" => fn(CuMemHandle);
        cu_mem_get_allocation_granularity: "cuMemGetAllocationGranularity" => fn(*mut usize, *const MemAllocationProp, c_uint);
    }
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("library", &LIBRARY)
            .finish_non_exhaustive()
    }
}

static DRIVER: OnceLock<std::result::Result<Arc<Driver>, String>> = OnceLock::new();

impl Driver {
    /// Loads `libcuda.so.1` (or the file `VKGDR_CUDA_LIBRARY` names) and calls `cuInit(0)`, once
    /// per process; later calls share the table.
    ///
    /// Returns [`Error::LibraryNotFound`] on a machine without the NVIDIA driver.
    pub fn get() -> Result<Arc<Driver>> {
        let cached = DRIVER.get_or_init(|| Self::load().map(Arc::new).map_err(|e| e.to_string()));
        match cached {
            Ok(d) => Ok(d.clone()),
            // Reload to rebuild the typed error; the failure is cheap and rare.
            Err(_) => Self::load().map(Arc::new),
        }
    }

    fn load() -> Result<Self> {
        // `VKGDR_CUDA_LIBRARY` may name another file (crate::dynlib).
        let lib = crate::dynlib::load(LIBRARY, crate::dynlib::CUDA_ENV)?;
        let driver = Self::resolve(lib)?;
        // SAFETY: cuInit with flags 0 is always a valid call.
        driver.check("cuInit", unsafe { (driver.cu_init)(0) })?;
        Ok(driver)
    }

    /// The name of a `CUresult` (`CUDA_ERROR_INVALID_VALUE`), from `cuGetErrorName`.
    pub fn error_name(&self, code: CuResult) -> String {
        let mut name: *const c_char = ptr::null();
        // SAFETY: `name` is a valid out-pointer; the driver writes a pointer to a static string.
        let r = unsafe { (self.cu_get_error_name)(code, &mut name) };
        if r != CUDA_SUCCESS || name.is_null() {
            return format!("CUresult {code}");
        }
        // SAFETY: on success the driver returned a NUL-terminated static string.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    /// Turns a `CUresult` into `Ok(())` or [`Error::Cuda`].
    pub fn check(&self, call: &'static str, code: CuResult) -> Result<()> {
        if code == CUDA_SUCCESS {
            Ok(())
        } else {
            Err(Error::Cuda {
                call,
                code,
                name: self.error_name(code),
            })
        }
    }

    /// Like [`Driver::check`], but maps `CUDA_ERROR_OUT_OF_MEMORY` to [`Error::OutOfDeviceMemory`].
    pub fn check_alloc(&self, call: &'static str, code: CuResult, size: u64) -> Result<()> {
        if code == CUDA_ERROR_OUT_OF_MEMORY {
            return Err(Error::OutOfDeviceMemory {
                side: MemorySide::Cuda,
                call,
                size,
                result: self.error_name(code),
            });
        }
        self.check(call, code)
    }

    /// The driver's CUDA version, e.g. 13000 for 13.0.
    pub fn version(&self) -> Result<i32> {
        let mut v = 0;
        // SAFETY: valid out-pointer.
        self.check("cuDriverGetVersion", unsafe {
            (self.cu_driver_get_version)(&mut v)
        })?;
        Ok(v)
    }

    /// Number of CUDA devices.
    pub fn device_count(&self) -> Result<i32> {
        let mut n = 0;
        // SAFETY: valid out-pointer.
        self.check("cuDeviceGetCount", unsafe {
            (self.cu_device_get_count)(&mut n)
        })?;
        Ok(n)
    }

    /// The `CUdevice` for an ordinal.
    pub fn device(&self, ordinal: i32) -> Result<CuDevice> {
        let mut dev = 0;
        // SAFETY: valid out-pointer; an out-of-range ordinal is reported as CUDA_ERROR_INVALID_DEVICE.
        self.check("cuDeviceGet", unsafe {
            (self.cu_device_get)(&mut dev, ordinal)
        })?;
        Ok(dev)
    }

    /// The device's name.
    pub fn device_name(&self, dev: CuDevice) -> Result<String> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: the buffer holds 256 bytes and we pass that length.
        self.check("cuDeviceGetName", unsafe {
            (self.cu_device_get_name)(buf.as_mut_ptr(), buf.len() as c_int, dev)
        })?;
        // SAFETY: the driver NUL-terminates within the given length.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// The device's UUID (equal to Vulkan's `deviceUUID`).
    pub fn device_uuid(&self, dev: CuDevice) -> Result<[u8; 16]> {
        let mut uuid = [0u8; 16];
        // SAFETY: `CUuuid` is 16 bytes; valid out-pointer.
        self.check("cuDeviceGetUuid", unsafe {
            (self.cu_device_get_uuid)(&mut uuid, dev)
        })?;
        Ok(uuid)
    }

    /// The device's total memory in bytes.
    pub fn device_total_mem(&self, dev: CuDevice) -> Result<u64> {
        let mut bytes = 0usize;
        // SAFETY: valid out-pointer.
        self.check("cuDeviceTotalMem_v2", unsafe {
            (self.cu_device_total_mem)(&mut bytes, dev)
        })?;
        Ok(bytes as u64)
    }

    /// A `CU_DEVICE_ATTRIBUTE_*` value.
    pub fn device_attribute(&self, dev: CuDevice, attribute: c_int) -> Result<i32> {
        let mut v = 0;
        // SAFETY: valid out-pointer; an unknown attribute is an error result, not UB.
        self.check("cuDeviceGetAttribute", unsafe {
            (self.cu_device_get_attribute)(&mut v, attribute, dev)
        })?;
        Ok(v)
    }
}

/// Makes a context current on this thread for the guard's lifetime (push on create, pop on drop),
/// so CUDA calls work from any thread without disturbing the caller's own current context.
pub struct ContextGuard<'a> {
    driver: &'a Driver,
}

impl<'a> ContextGuard<'a> {
    /// Pushes `ctx` onto this thread's context stack.
    ///
    /// # Safety
    /// - `ctx` must be a live CUDA context for the guard's whole lifetime.
    pub unsafe fn push(driver: &'a Driver, ctx: CuContext) -> Result<Self> {
        // SAFETY: the caller guarantees `ctx` is live.
        driver.check("cuCtxPushCurrent_v2", unsafe {
            (driver.cu_ctx_push_current)(ctx)
        })?;
        Ok(ContextGuard { driver })
    }
}

impl Drop for ContextGuard<'_> {
    fn drop(&mut self) {
        let mut popped: CuContext = ptr::null_mut();
        // SAFETY: we pushed exactly one context in `push`; popping restores the caller's stack.
        unsafe { (self.driver.cu_ctx_pop_current)(&mut popped) };
    }
}
