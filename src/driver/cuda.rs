//! The CUDA driver API, loaded at run time from `libcuda.so.1` (never linked).
//!
//! Only the symbols the crate needs are resolved, preferring the `_v2` names where the driver has
//! them. Everything here is a thin, explicit layer: [`Driver`] is the function table, written once
//! as data, with one checked method per symbol (`driver.cu_mem_alloc(size)?` returns the
//! `CUdeviceptr` or an [`Error::Cuda`] naming `cuMemAlloc_v2` and the result from
//! `cuGetErrorName`); the constants and `#[repr(C)]` structs of `cuda.h` the crate uses; and
//! [`ContextGuard`], which makes a context current for a scope. Small RAII types over CUDA objects
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
/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_uint = 1;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`, a `CUmemAllocationHandleType`: the handle type a
/// [`MemAllocationProp`] requests, and the type of a shareable handle that is imported.
pub const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: c_uint = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_uint = 1;
/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`.
pub const CU_MEM_ALLOC_GRANULARITY_MINIMUM: c_uint = 0;
/// `CU_MEM_ACCESS_FLAGS_PROT_NONE`: no access, what `cuMemGetAccess` reports for a device never
/// granted any on a VMM mapping.
pub const CU_MEM_ACCESS_FLAGS_PROT_NONE: c_uint = 0;
/// `CU_MEM_ACCESS_FLAGS_PROT_READ`.
pub const CU_MEM_ACCESS_FLAGS_PROT_READ: c_uint = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
pub const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: c_uint = 3;
/// `CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK`, a `CUdevice_P2PAttribute`: the link's relative
/// performance (lower is better).
pub const CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: c_int = 1;
/// `CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED`: 1 if peer access over the link is possible.
pub const CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED: c_int = 2;
/// `CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED`: 1 if every CUDA atomic works over the link.
pub const CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED: c_int = 3;

/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`: the flag `cuIpcOpenMemHandle` takes (peer access
/// enabled when it is first needed).
pub const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 1;

/// `CUipcMemHandle` (64 bytes): names a `cuMemAlloc` allocation to another process of the host,
/// which maps it into its own context with `cuIpcOpenMemHandle`. Passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcMemHandle {
    /// The driver's opaque bytes.
    pub reserved: [u8; 64],
}

// SAFETY: a plain byte array, for which all-zero bytes are a valid value (what the driver
// overwrites).
unsafe impl bytemuck::Zeroable for IpcMemHandle {}

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
    /// [`CU_MEM_LOCATION_TYPE_DEVICE`].
    pub location_type: c_uint,
    /// Device ordinal.
    pub id: c_int,
}

impl MemLocation {
    /// The device with this ordinal.
    pub fn device(ordinal: c_int) -> Self {
        MemLocation {
            location_type: CU_MEM_LOCATION_TYPE_DEVICE,
            id: ordinal,
        }
    }
}

/// `CUmemAllocationProp` (32 bytes on x86-64).
#[repr(C)]
pub struct MemAllocationProp {
    /// [`CU_MEM_ALLOCATION_TYPE_PINNED`].
    pub alloc_type: c_uint,
    /// [`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`].
    pub requested_handle_types: c_uint,
    /// Where the memory lives.
    pub location: MemLocation,
    /// Windows only; null.
    pub win32_handle_meta_data: *mut c_void,
    /// `compressionType`, `gpuDirectRDMACapable`, `usage`, reserved: all zero here.
    pub alloc_flags: [u8; 8],
}

impl MemAllocationProp {
    /// Pinned device memory on device `ordinal`, exportable as a POSIX fd: what a BAR-mapped
    /// chunk imported with `cuMemImportFromShareableHandle` is.
    pub fn pinned_posix_fd(ordinal: c_int) -> Self {
        MemAllocationProp {
            alloc_type: CU_MEM_ALLOCATION_TYPE_PINNED,
            requested_handle_types: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            location: MemLocation::device(ordinal),
            win32_handle_meta_data: ptr::null_mut(),
            alloc_flags: [0; 8],
        }
    }
}

/// `CUmemAccessDesc`.
#[repr(C)]
pub struct MemAccessDesc {
    /// The device given access.
    pub location: MemLocation,
    /// [`CU_MEM_ACCESS_FLAGS_PROT_READWRITE`].
    pub flags: c_uint,
}

const _: () = assert!(std::mem::size_of::<ExternalMemoryHandleDesc>() == 104);
const _: () = assert!(std::mem::size_of::<ExternalMemoryBufferDesc>() == 88);
const _: () = assert!(std::mem::size_of::<MemAllocationProp>() == 32);
const _: () = assert!(std::mem::size_of::<IpcMemHandle>() == 64);

const LIBRARY: &str = "libcuda.so.1";

/// Builds [`Driver`] from the table of symbols below: one raw function-pointer field per symbol
/// (resolved once at load) and one checked method of the same name, which calls it and turns the
/// `CUresult` into [`Error::Cuda`] named after the symbol. An entry written `-> out T` passes a
/// pointer to a zeroed `T` as the first argument and returns the value the driver wrote there;
/// one written `-> ready` (the queries) returns `false` for `CUDA_ERROR_NOT_READY`, an answer
/// rather than an error.
///
/// An entry is `safe` when every argument is a plain value the driver validates itself (an
/// ordinal, a `CUdevice`, flags, sizes): calling it cannot cause undefined behaviour. Every
/// other entry (handles that must be live, pointers the driver reads or writes, calls that free
/// or unmap) gives an `unsafe` method whose caller upholds the CUDA driver API's contract.
macro_rules! driver_table {
    (
        required { $( $safety:tt $field:ident : $sym:literal
                      => fn($($arg:ident : $ty:ty),*) $(-> $ret:ident $($out:ty)?)? ; )* }
        optional { $( $osafety:tt $ofield:ident : $osym:literal
                      => fn($($oarg:ident : $oty:ty),*) $(-> $oret:ident $($oout:ty)?)? ; )* }
    ) => {
        /// The CUDA driver's function table, resolved once from `libcuda.so.1`.
        ///
        /// Each symbol has a checked method named like its field (`driver.cu_mem_free(ptr)`,
        /// `Result<()>`, failing with [`Error::Cuda`] `{ call: "cuMemFree_v2", .. }`); use those.
        /// The raw fields stay public for code that needs the bare `CUresult`: calling them is
        /// `unsafe`, and the arguments must satisfy the CUDA driver API's documented contract.
        #[allow(missing_docs)]
        pub struct Driver {
            _lib: libloading::Library,
            $( pub $field: unsafe extern "C" fn($($(*mut $out,)?)? $($ty),*) -> CuResult, )*
            $( pub $ofield:
                Option<unsafe extern "C" fn($($(*mut $oout,)?)? $($oty),*) -> CuResult>, )*
        }

        impl Driver {
            fn resolve(lib: libloading::Library) -> Result<Self> {
                $(
                    // SAFETY: the symbol is a CUDA driver API function whose C signature is the one
                    // spelled out in the table above (from cuda.h); the pointer is copied out and
                    // stays valid because the library is kept alive in `_lib`.
                    let $field = unsafe {
                        *lib.get::<unsafe extern "C" fn($($(*mut $out,)?)? $($ty),*) -> CuResult>(
                            concat!($sym, "\0").as_bytes(),
                        )
                        .map_err(|_| Error::MissingSymbol { library: LIBRARY, symbol: $sym })?
                    };
                )*
                $(
                    // SAFETY: as above; a missing optional symbol is recorded as `None`.
                    let $ofield = unsafe {
                        lib.get::<unsafe extern "C" fn($($(*mut $oout,)?)? $($oty),*) -> CuResult>(
                            concat!($osym, "\0").as_bytes(),
                        )
                        .ok()
                        .map(|s| *s)
                    };
                )*
                Ok(Driver { _lib: lib, $( $field, )* $( $ofield, )* })
            }
        }

        /// Checked calls, one per symbol (see [`Driver`]).
        // One argument per C parameter (cuLaunchKernel has eleven).
        #[allow(clippy::too_many_arguments)]
        impl Driver {
            $( checked_call!($safety required $field $sym ($($arg : $ty),*) [$($ret $($out)?)?]); )*
            $( checked_call!(
                $osafety optional $ofield $osym ($($oarg : $oty),*) [$($oret $($oout)?)?]
            ); )*
        }
    };
}

/// One checked method of [`Driver`] (see `driver_table!`).
macro_rules! checked_call {
    (safe $kind:ident $field:ident $sym:literal ($($arg:ident : $ty:ty),*) [$($ret:tt)*]) => {
        #[doc = concat!("`", $sym, "`, checked", checked_call!(@doc $kind))]
        pub fn $field(&self, $($arg: $ty),*) -> Result<checked_call!(@ret $($ret)*)> {
            let f = checked_call!(@get self $kind $field $sym);
            // SAFETY: every argument is a plain value the driver validates (see `driver_table!`);
            // an out-pointer points to a local of the type the symbol writes.
            unsafe { checked_call!(@call self f $sym ($($arg),*) [$($ret)*]) }
        }
    };
    (unsafe $kind:ident $field:ident $sym:literal ($($arg:ident : $ty:ty),*) [$($ret:tt)*]) => {
        #[doc = concat!("`", $sym, "`, checked", checked_call!(@doc $kind))]
        ///
        /// # Safety
        /// - The arguments must satisfy the CUDA driver API's contract for this call: handles
        ///   live (and of the current context where it says so), pointers valid for every access
        ///   the call makes, for as long as it makes them.
        pub unsafe fn $field(&self, $($arg: $ty),*) -> Result<checked_call!(@ret $($ret)*)> {
            let f = checked_call!(@get self $kind $field $sym);
            // SAFETY: the caller upholds the call's contract; an out-pointer points to a local of
            // the type the symbol writes.
            unsafe { checked_call!(@call self f $sym ($($arg),*) [$($ret)*]) }
        }
    };
    (@doc required) => { "." };
    (@doc optional) => {
        "; [`Error::Unsupported`] where the driver lacks the symbol (too old for CUDA VMM, or \
         built without CUDA IPC)."
    };
    (@ret) => { () };
    (@ret out $out:ty) => { $out };
    (@ret ready) => { bool };
    (@get $s:tt required $field:ident $sym:literal) => { $s.$field };
    (@get $s:tt optional $field:ident $sym:literal) => {
        $s.$field.ok_or_else(|| {
            Error::Unsupported(concat!($sym, " missing from libcuda (a driver too old for it)").into())
        })?
    };
    (@call $s:tt $f:ident $sym:literal ($($arg:ident),*) []) => { $s.check($sym, $f($($arg),*)) };
    (@call $s:tt $f:ident $sym:literal ($($arg:ident),*) [out $out:ty]) => {{
        let mut out: $out = bytemuck::Zeroable::zeroed();
        $s.check($sym, $f(&mut out, $($arg),*)).map(|()| out)
    }};
    (@call $s:tt $f:ident $sym:literal ($($arg:ident),*) [ready]) => {{
        match $f($($arg),*) {
            CUDA_ERROR_NOT_READY => Ok(false),
            code => $s.check($sym, code).map(|()| true),
        }
    }};
}

driver_table! {
    required {
        safe cu_init: "cuInit" => fn(flags: c_uint);
        safe cu_driver_get_version: "cuDriverGetVersion" => fn() -> out c_int;
        unsafe cu_get_error_name: "cuGetErrorName" => fn(error: CuResult, name: *mut *const c_char);
        safe cu_device_get_count: "cuDeviceGetCount" => fn() -> out c_int;
        safe cu_device_get: "cuDeviceGet" => fn(ordinal: c_int) -> out CuDevice;
        unsafe cu_device_get_name: "cuDeviceGetName" => fn(name: *mut c_char, len: c_int, dev: CuDevice);
        safe cu_device_get_uuid: "cuDeviceGetUuid" => fn(dev: CuDevice) -> out [u8; 16];
        safe cu_device_total_mem: "cuDeviceTotalMem_v2" => fn(dev: CuDevice) -> out usize;
        safe cu_device_get_attribute: "cuDeviceGetAttribute" => fn(attrib: c_int, dev: CuDevice) -> out c_int;
        safe cu_device_can_access_peer: "cuDeviceCanAccessPeer" => fn(dev: CuDevice, peer_dev: CuDevice) -> out c_int;
        safe cu_device_get_p2p_attribute: "cuDeviceGetP2PAttribute" => fn(attrib: c_int, src_device: CuDevice, dst_device: CuDevice) -> out c_int;
        safe cu_device_primary_ctx_retain: "cuDevicePrimaryCtxRetain" => fn(dev: CuDevice) -> out CuContext;
        unsafe cu_device_primary_ctx_release: "cuDevicePrimaryCtxRelease_v2" => fn(dev: CuDevice);
        unsafe cu_device_primary_ctx_get_state: "cuDevicePrimaryCtxGetState" => fn(dev: CuDevice, flags: *mut c_uint, active: *mut c_int);
        safe cu_ctx_get_current: "cuCtxGetCurrent" => fn() -> out CuContext;
        safe cu_ctx_get_device: "cuCtxGetDevice" => fn() -> out CuDevice;
        unsafe cu_ctx_push_current: "cuCtxPushCurrent_v2" => fn(ctx: CuContext);
        unsafe cu_ctx_pop_current: "cuCtxPopCurrent_v2" => fn() -> out CuContext;
        safe cu_ctx_synchronize: "cuCtxSynchronize" => fn();
        unsafe cu_import_external_memory: "cuImportExternalMemory" => fn(desc: *const ExternalMemoryHandleDesc) -> out CuExternalMemory;
        unsafe cu_external_memory_get_mapped_buffer: "cuExternalMemoryGetMappedBuffer" => fn(ext_mem: CuExternalMemory, desc: *const ExternalMemoryBufferDesc) -> out CuDevicePtr;
        unsafe cu_destroy_external_memory: "cuDestroyExternalMemory" => fn(ext_mem: CuExternalMemory);
        safe cu_mem_alloc: "cuMemAlloc_v2" => fn(bytesize: usize) -> out CuDevicePtr;
        unsafe cu_mem_free: "cuMemFree_v2" => fn(dptr: CuDevicePtr);
        unsafe cu_mem_get_info: "cuMemGetInfo_v2" => fn(free: *mut usize, total: *mut usize);
        safe cu_mem_alloc_host: "cuMemHostAlloc" => fn(bytesize: usize, flags: c_uint) -> out *mut c_void;
        unsafe cu_mem_free_host: "cuMemFreeHost" => fn(p: *mut c_void);
        unsafe cu_mem_host_get_device_pointer: "cuMemHostGetDevicePointer_v2" => fn(p: *mut c_void, flags: c_uint) -> out CuDevicePtr;
        unsafe cu_mem_host_register: "cuMemHostRegister_v2" => fn(p: *mut c_void, bytesize: usize, flags: c_uint);
        unsafe cu_mem_host_unregister: "cuMemHostUnregister" => fn(p: *mut c_void);
        unsafe cu_memcpy_htod: "cuMemcpyHtoD_v2" => fn(dst: CuDevicePtr, src: *const c_void, count: usize);
        unsafe cu_memcpy_dtoh: "cuMemcpyDtoH_v2" => fn(dst: *mut c_void, src: CuDevicePtr, count: usize);
        unsafe cu_memcpy_htod_async: "cuMemcpyHtoDAsync_v2" => fn(dst: CuDevicePtr, src: *const c_void, count: usize, stream: CuStream);
        unsafe cu_memcpy_dtoh_async: "cuMemcpyDtoHAsync_v2" => fn(dst: *mut c_void, src: CuDevicePtr, count: usize, stream: CuStream);
        unsafe cu_memcpy_dtod_async: "cuMemcpyDtoDAsync_v2" => fn(dst: CuDevicePtr, src: CuDevicePtr, count: usize, stream: CuStream);
        unsafe cu_memset_d32: "cuMemsetD32_v2" => fn(dst: CuDevicePtr, value: c_uint, count: usize);
        unsafe cu_memset_d8: "cuMemsetD8_v2" => fn(dst: CuDevicePtr, value: u8, count: usize);
        unsafe cu_memset_d32_async: "cuMemsetD32Async" => fn(dst: CuDevicePtr, value: c_uint, count: usize, stream: CuStream);
        unsafe cu_module_load_data: "cuModuleLoadData" => fn(image: *const c_void) -> out CuModule;
        unsafe cu_module_unload: "cuModuleUnload" => fn(module: CuModule);
        unsafe cu_module_get_function: "cuModuleGetFunction" => fn(module: CuModule, name: *const c_char) -> out CuFunction;
        unsafe cu_launch_kernel: "cuLaunchKernel" => fn(f: CuFunction, grid_x: c_uint, grid_y: c_uint, grid_z: c_uint, block_x: c_uint, block_y: c_uint, block_z: c_uint, shared_bytes: c_uint, stream: CuStream, params: *mut *mut c_void, extra: *mut *mut c_void);
        safe cu_stream_create: "cuStreamCreate" => fn(flags: c_uint) -> out CuStream;
        unsafe cu_stream_destroy: "cuStreamDestroy_v2" => fn(stream: CuStream);
        unsafe cu_stream_synchronize: "cuStreamSynchronize" => fn(stream: CuStream);
        unsafe cu_stream_query: "cuStreamQuery" => fn(stream: CuStream) -> ready;
        safe cu_event_create: "cuEventCreate" => fn(flags: c_uint) -> out CuEvent;
        unsafe cu_event_record: "cuEventRecord" => fn(event: CuEvent, stream: CuStream);
        unsafe cu_event_query: "cuEventQuery" => fn(event: CuEvent) -> ready;
        unsafe cu_event_synchronize: "cuEventSynchronize" => fn(event: CuEvent);
        unsafe cu_event_destroy: "cuEventDestroy_v2" => fn(event: CuEvent);
        unsafe cu_stream_wait_event: "cuStreamWaitEvent" => fn(stream: CuStream, event: CuEvent, flags: c_uint);
    }
    optional {
        safe cu_mem_address_reserve: "cuMemAddressReserve" => fn(size: usize, alignment: usize, addr: CuDevicePtr, flags: u64) -> out CuDevicePtr;
        unsafe cu_mem_address_free: "cuMemAddressFree" => fn(ptr: CuDevicePtr, size: usize);
        unsafe cu_mem_import_from_shareable_handle: "cuMemImportFromShareableHandle" => fn(os_handle: *mut c_void, handle_type: c_uint) -> out CuMemHandle;
        unsafe cu_mem_map: "cuMemMap" => fn(ptr: CuDevicePtr, size: usize, offset: usize, handle: CuMemHandle, flags: u64);
        unsafe cu_mem_unmap: "cuMemUnmap" => fn(ptr: CuDevicePtr, size: usize);
        unsafe cu_mem_set_access: "cuMemSetAccess" => fn(ptr: CuDevicePtr, size: usize, desc: *const MemAccessDesc, count: usize);
        unsafe cu_mem_get_access: "cuMemGetAccess" => fn(location: *const MemLocation, ptr: CuDevicePtr) -> out u64;
        unsafe cu_mem_release: "cuMemRelease" => fn(handle: CuMemHandle);
        unsafe cu_mem_create: "cuMemCreate" => fn(size: usize, prop: *const MemAllocationProp, flags: u64) -> out CuMemHandle;
        unsafe cu_mem_get_allocation_granularity: "cuMemGetAllocationGranularity" => fn(prop: *const MemAllocationProp, option: c_uint) -> out usize;
        unsafe cu_stream_write_value32: "cuStreamWriteValue32_v2" => fn(stream: CuStream, addr: CuDevicePtr, value: c_uint, flags: c_uint);
        unsafe cu_stream_write_value64: "cuStreamWriteValue64_v2" => fn(stream: CuStream, addr: CuDevicePtr, value: u64, flags: c_uint);
        unsafe cu_stream_get_ctx: "cuStreamGetCtx" => fn(stream: CuStream, ctx: *mut CuContext);
        unsafe cu_ipc_get_mem_handle: "cuIpcGetMemHandle" => fn(dptr: CuDevicePtr) -> out IpcMemHandle;
        unsafe cu_ipc_open_mem_handle: "cuIpcOpenMemHandle_v2" => fn(handle: IpcMemHandle, flags: c_uint) -> out CuDevicePtr;
        unsafe cu_ipc_close_mem_handle: "cuIpcCloseMemHandle" => fn(dptr: CuDevicePtr);
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
        let lib = crate::driver::dynlib::load(LIBRARY, crate::driver::dynlib::CUDA_ENV)?;
        let driver = Self::resolve(lib)?;
        driver.cu_init(0)?;
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

    /// The driver's CUDA version, e.g. 13000 for 13.0.
    pub fn version(&self) -> Result<i32> {
        self.cu_driver_get_version()
    }

    /// Number of CUDA devices.
    pub fn device_count(&self) -> Result<i32> {
        self.cu_device_get_count()
    }

    /// The `CUdevice` for an ordinal (an unknown one is `CUDA_ERROR_INVALID_DEVICE`).
    pub fn device(&self, ordinal: i32) -> Result<CuDevice> {
        self.cu_device_get(ordinal)
    }

    /// The device's name.
    pub fn device_name(&self, dev: CuDevice) -> Result<String> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: the buffer holds 256 bytes and we pass that length.
        unsafe { self.cu_device_get_name(buf.as_mut_ptr(), buf.len() as c_int, dev) }?;
        // SAFETY: the driver NUL-terminates within the given length.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// The device's UUID (equal to Vulkan's `deviceUUID`).
    pub fn device_uuid(&self, dev: CuDevice) -> Result<[u8; 16]> {
        self.cu_device_get_uuid(dev)
    }

    /// The device's total memory in bytes.
    pub fn device_total_mem(&self, dev: CuDevice) -> Result<u64> {
        Ok(self.cu_device_total_mem(dev)? as u64)
    }

    /// The context a stream belongs to (`cuStreamGetCtx`, whose out-pointer comes second).
    ///
    /// # Safety
    /// - `stream` must be a live stream (or the null stream: the current context's).
    pub unsafe fn stream_context(&self, stream: CuStream) -> Result<CuContext> {
        let mut ctx: CuContext = ptr::null_mut();
        // SAFETY: the caller guarantees the stream; `ctx` is a valid out-pointer.
        unsafe { self.cu_stream_get_ctx(stream, &mut ctx) }?;
        Ok(ctx)
    }

    /// A `CU_DEVICE_ATTRIBUTE_*` value.
    pub fn device_attribute(&self, dev: CuDevice, attribute: c_int) -> Result<i32> {
        self.cu_device_get_attribute(attribute, dev)
    }

    /// Whether kernels on `dev` can reach memory of `peer` at all (`cuDeviceCanAccessPeer`): a
    /// peer-to-peer path (NVLink, or PCIe where the platform allows it) between two different
    /// devices. Not a question for a device and itself (`Gpu::can_access_peer` answers `true`
    /// there without asking).
    pub fn can_access_peer(&self, dev: CuDevice, peer: CuDevice) -> Result<bool> {
        Ok(self.cu_device_can_access_peer(dev, peer)? != 0)
    }

    /// A `CU_DEVICE_P2P_ATTRIBUTE_*` value of the link from `src` to `dst`
    /// (`cuDeviceGetP2PAttribute`).
    pub fn p2p_attribute(&self, attribute: c_int, src: CuDevice, dst: CuDevice) -> Result<i32> {
        self.cu_device_get_p2p_attribute(attribute, src, dst)
    }

    /// The access device `ordinal` has to the VMM mapping at `ptr` (`cuMemGetAccess`): one of the
    /// `CU_MEM_ACCESS_FLAGS_PROT_*` values, [`CU_MEM_ACCESS_FLAGS_PROT_NONE`] for a device never
    /// granted any. An address no VMM mapping covers is the driver's `CUDA_ERROR_INVALID_VALUE`.
    pub fn mem_access(&self, ptr: CuDevicePtr, ordinal: c_int) -> Result<u64> {
        let location = MemLocation::device(ordinal);
        // SAFETY: `location` is a valid CUmemLocation that outlives the call; the driver only
        // looks `ptr` up in its own tables (an unknown address is an error, not an access).
        unsafe { self.cu_mem_get_access(&location, ptr) }
    }
}

/// The error an injected failure (the `failpoints` feature) of the CUDA allocation step `call`
/// gives: the driver's own out-of-memory, named by the driver as a real one would be.
pub(crate) fn injected_failure(driver: &Driver, call: &'static str) -> Error {
    match driver.check(call, CUDA_ERROR_OUT_OF_MEMORY) {
        Err(e) => e,
        Ok(()) => Error::internal("a failure was injected with CUDA_SUCCESS"),
    }
}

/// For allocation calls: `CUDA_ERROR_OUT_OF_MEMORY` becomes [`Error::OutOfDeviceMemory`] (a
/// normal, recoverable outcome, with the call and the driver's result name kept) for a request
/// of `size` bytes; every other error passes unchanged.
pub(crate) fn out_of_memory(size: u64) -> impl FnOnce(Error) -> Error {
    move |e| match e {
        Error::Cuda {
            call,
            code: CUDA_ERROR_OUT_OF_MEMORY,
            name,
        } => Error::OutOfDeviceMemory {
            side: MemorySide::Cuda,
            call,
            size,
            result: name,
        },
        e => e,
    }
}

/// Makes a context current on this thread for the guard's lifetime (push on create, pop on drop),
/// so CUDA calls work from any thread without disturbing the caller's own current context.
///
/// Neither `Send` nor `Sync`: the context stack it pops is the creating thread's, so the guard
/// must drop on that thread (dropped elsewhere it would pop another thread's context).
pub struct ContextGuard<'a> {
    driver: &'a Driver,
    _this_thread: std::marker::PhantomData<*const ()>,
}

impl<'a> ContextGuard<'a> {
    /// Pushes `ctx` onto this thread's context stack.
    ///
    /// # Safety
    /// - `ctx` must be a live CUDA context for the guard's whole lifetime.
    pub unsafe fn push(driver: &'a Driver, ctx: CuContext) -> Result<Self> {
        // SAFETY: the caller guarantees `ctx` is live.
        unsafe { driver.cu_ctx_push_current(ctx) }?;
        Ok(ContextGuard {
            driver,
            _this_thread: std::marker::PhantomData,
        })
    }
}

impl Drop for ContextGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: we pushed exactly one context in `push`; popping restores the caller's stack.
        // Nothing to do if it fails: the push succeeded, so the pop does too.
        let _ = unsafe { self.driver.cu_ctx_pop_current() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_memory_maps_only_cuda_oom() {
        let oom = Error::Cuda {
            call: "cuMemAlloc_v2",
            code: CUDA_ERROR_OUT_OF_MEMORY,
            name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
        };
        let e = out_of_memory(1 << 40)(oom);
        assert!(matches!(
            &e,
            Error::OutOfDeviceMemory { side: MemorySide::Cuda, call: "cuMemAlloc_v2", size, .. }
                if *size == 1 << 40
        ));
        // The drop-ins' "<call> failed (<NAME>)" survives the mapping.
        assert_eq!(e.driver_call(), Some("cuMemAlloc_v2"));
        assert_eq!(e.result_name(), Some("CUDA_ERROR_OUT_OF_MEMORY"));
        let invalid = Error::Cuda {
            call: "cuMemAlloc_v2",
            code: 1,
            name: "CUDA_ERROR_INVALID_VALUE".into(),
        };
        assert!(matches!(
            out_of_memory(8)(invalid),
            Error::Cuda { code: 1, .. }
        ));
    }

    #[test]
    fn struct_sizes_and_constructors_match_cuda_h() {
        let prop = MemAllocationProp::pinned_posix_fd(3);
        assert_eq!(
            (
                prop.alloc_type,
                prop.requested_handle_types,
                prop.location.location_type
            ),
            (1, 1, 1)
        );
        assert_eq!(prop.location.id, 3);
        assert_eq!(std::mem::size_of::<MemAccessDesc>(), 12);
        assert_eq!(std::mem::size_of::<MemLocation>(), 8);
        let handle: IpcMemHandle = bytemuck::Zeroable::zeroed();
        assert_eq!(handle.reserved, [0; 64]);
        assert_eq!(std::mem::align_of::<IpcMemHandle>(), 1);
    }
}
