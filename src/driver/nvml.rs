//! NVML (`libnvidia-ml.so.1`), loaded at run time like the CUDA driver: the BAR1 figures and the
//! VRAM use of every NVIDIA device, without creating a CUDA context.
//!
//! NVML is optional: a machine (or a container without the `utility` driver capability) may have
//! CUDA and Vulkan but no NVML. [`Nvml::get`] then returns [`Error::LibraryNotFound`] and callers
//! report the figures as unavailable; nothing else depends on it.
//!
//! Only the handful of functions the crate reads are resolved: the required ones all present since
//! NVML 10 (2018); the per-process lists ([`Nvml::processes`]) optional, each in its newest form
//! (`_v3`, R510) or else the first (`nvmlDeviceGetComputeRunningProcesses`), whose records are
//! shorter. Devices are matched to CUDA devices by UUID (`GPU-…`, the same 16 bytes as
//! `cuDeviceGetUuid`) and, failing that, by PCI address ([`match_device`], pure).

use std::ffi::{c_char, c_int, c_uint};
use std::fmt;
use std::sync::{Arc, OnceLock};

use crate::error::{Error, Result};

/// The library's file name; [`crate::dynlib::NVML_ENV`] (`VKGDR_NVML_LIBRARY`) overrides it.
pub const LIBRARY: &str = "libnvidia-ml.so.1";

type NvmlReturn = c_int;
type DeviceHandle = *mut std::ffi::c_void;

const NVML_SUCCESS: NvmlReturn = 0;

/// `nvmlPciInfo_t` (68 bytes).
#[repr(C)]
struct RawPciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

/// `nvmlBAR1Memory_t`: total, free, used (bytes).
#[repr(C)]
#[derive(Default)]
struct RawBar1 {
    total: u64,
    free: u64,
    used: u64,
}

/// `nvmlMemory_t`: total, free, used (bytes).
#[repr(C)]
#[derive(Default)]
struct RawMemory {
    total: u64,
    free: u64,
    used: u64,
}

/// `nvmlProcessInfo_t` (`_v3` calls): pid, device memory used, MIG instance ids.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawProcessInfo {
    pid: c_uint,
    used_gpu_memory: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// `nvmlProcessInfo_v1_t` (the unversioned calls): pid, device memory used.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawProcessInfoV1 {
    pid: c_uint,
    used_gpu_memory: u64,
}

/// `NVML_VALUE_NOT_AVAILABLE`: what `usedGpuMemory` holds where NVML cannot tell (Windows WDDM,
/// some virtual machines).
const NVML_VALUE_NOT_AVAILABLE: u64 = u64::MAX;
/// `NVML_ERROR_INSUFFICIENT_SIZE`: the process list is longer than the buffer passed.
const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;

const _: () = assert!(std::mem::size_of::<RawPciInfo>() == 68);
const _: () = assert!(std::mem::size_of::<RawProcessInfo>() == 24);
const _: () = assert!(std::mem::size_of::<RawProcessInfoV1>() == 16);
const _: () = assert!(std::mem::size_of::<RawBar1>() == 24);
const _: () = assert!(std::mem::size_of::<RawMemory>() == 24);

/// `NVML_DEVICE_UUID_V2_BUFFER_SIZE` and `NVML_DEVICE_NAME_V2_BUFFER_SIZE`.
const STRING_BUFFER: usize = 96;
/// `NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE`.
const VERSION_BUFFER: usize = 80;

/// The names of `nvmlReturn_t` values, as nvml.h spells them.
pub fn return_name(code: c_int) -> String {
    let name = match code {
        0 => "NVML_SUCCESS",
        1 => "NVML_ERROR_UNINITIALIZED",
        2 => "NVML_ERROR_INVALID_ARGUMENT",
        3 => "NVML_ERROR_NOT_SUPPORTED",
        4 => "NVML_ERROR_NO_PERMISSION",
        5 => "NVML_ERROR_ALREADY_INITIALIZED",
        6 => "NVML_ERROR_NOT_FOUND",
        7 => "NVML_ERROR_INSUFFICIENT_SIZE",
        8 => "NVML_ERROR_INSUFFICIENT_POWER",
        9 => "NVML_ERROR_DRIVER_NOT_LOADED",
        10 => "NVML_ERROR_TIMEOUT",
        11 => "NVML_ERROR_IRQ_ISSUE",
        12 => "NVML_ERROR_LIBRARY_NOT_FOUND",
        13 => "NVML_ERROR_FUNCTION_NOT_FOUND",
        14 => "NVML_ERROR_CORRUPTED_INFOROM",
        15 => "NVML_ERROR_GPU_IS_LOST",
        16 => "NVML_ERROR_RESET_REQUIRED",
        17 => "NVML_ERROR_OPERATING_SYSTEM",
        18 => "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
        19 => "NVML_ERROR_IN_USE",
        20 => "NVML_ERROR_MEMORY",
        21 => "NVML_ERROR_NO_DATA",
        22 => "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED",
        23 => "NVML_ERROR_INSUFFICIENT_RESOURCES",
        24 => "NVML_ERROR_FREQ_NOT_SUPPORTED",
        25 => "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
        26 => "NVML_ERROR_DEPRECATED",
        27 => "NVML_ERROR_NOT_READY",
        28 => "NVML_ERROR_GPU_NOT_FOUND",
        29 => "NVML_ERROR_INVALID_STATE",
        999 => "NVML_ERROR_UNKNOWN",
        _ => return format!("nvmlReturn_t {code}"),
    };
    name.to_string()
}

/// A PCI address: domain, bus, device (the function is always 0 for a GPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PciAddress {
    /// PCI domain (segment).
    pub domain: u32,
    /// Bus number.
    pub bus: u32,
    /// Device number on the bus.
    pub device: u32,
}

impl fmt::Display for PciAddress {
    /// `dddd:bb:dd.0`, as `lspci -D` and `nvidia-smi` print it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.0",
            self.domain, self.bus, self.device
        )
    }
}

/// BAR1 figures of one device (`nvmlDeviceGetBAR1MemoryInfo`), in bytes.
///
/// On the H100 every byte of `DEVICE_LOCAL | HOST_VISIBLE` memory that Vulkan maps counts twice in
/// `used` (measured); see [`crate::bar`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bar1Memory {
    /// Size of the BAR1 aperture.
    pub total: u64,
    /// What is not mapped.
    pub free: u64,
    /// What is mapped (by every process).
    pub used: u64,
}

/// Device memory figures (`nvmlDeviceGetMemoryInfo`), in bytes: what every process uses,
/// including the driver's reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VramMemory {
    /// Total device memory.
    pub total: u64,
    /// In use by every process and the driver.
    pub used: u64,
}

/// What NVML reports about one device. Figures NVML could not give carry the failed call and its
/// result name instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlDevice {
    /// NVML's index (not necessarily the CUDA ordinal: CUDA orders by speed unless
    /// `CUDA_DEVICE_ORDER=PCI_BUS_ID`).
    pub index: u32,
    /// Product name.
    pub name: String,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (or `MIG-…` for a MIG instance).
    pub uuid: String,
    /// The device's PCI address, when NVML reports it.
    pub pci: Option<PciAddress>,
    /// BAR1 total/free/used, or why not.
    pub bar1: std::result::Result<Bar1Memory, String>,
    /// VRAM total/used, or why not.
    pub vram: std::result::Result<VramMemory, String>,
}

/// One process with a context on a device, as NVML lists it: its compute (CUDA) and graphics
/// (Vulkan, OpenGL) entries merged ([`Nvml::processes`]). A process that uses vkgdr has both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuProcess {
    /// Its process id, as the host's kernel numbers it: a process in a container (its own PID
    /// namespace) finds another number for itself in `getpid()`.
    pub pid: u32,
    /// Device memory it uses, in bytes (`None`: NVML cannot tell here).
    pub used_bytes: Option<u64>,
    /// Listed among compute processes (a CUDA context).
    pub compute: bool,
    /// Listed among graphics processes (a Vulkan or OpenGL device).
    pub graphics: bool,
}

/// Merges NVML's compute and graphics lists of `(pid, used bytes)` into one entry per process,
/// by pid. A process in both lists is one process: NVML gives it one figure in each, and the
/// larger is kept (never their sum).
pub fn merge_processes(
    compute: &[(u32, Option<u64>)],
    graphics: &[(u32, Option<u64>)],
) -> Vec<GpuProcess> {
    let mut merged: std::collections::BTreeMap<u32, GpuProcess> = Default::default();
    for (list, is_compute) in [(compute, true), (graphics, false)] {
        for &(pid, used) in list {
            let entry = merged.entry(pid).or_insert(GpuProcess {
                pid,
                used_bytes: used,
                compute: false,
                graphics: false,
            });
            entry.used_bytes = match (entry.used_bytes, used) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            if is_compute {
                entry.compute = true;
            } else {
                entry.graphics = true;
            }
        }
    }
    merged.into_values().collect()
}

/// The NVML device that is the CUDA device with `uuid` and PCI address `pci`: the one with the same
/// UUID, or else (NVML and CUDA UUIDs are the same bytes, but a MIG setup or an old NVML may
/// differ) the one at the same PCI address.
pub fn match_device<'a>(
    devices: &'a [NvmlDevice],
    uuid: &[u8; 16],
    pci: Option<PciAddress>,
) -> Option<&'a NvmlDevice> {
    let want = format!("GPU-{}", crate::driver::uuid::format_uuid(uuid));
    devices
        .iter()
        .find(|d| d.uuid.eq_ignore_ascii_case(&want))
        .or_else(|| pci.and_then(|p| devices.iter().find(|d| d.pci == Some(p))))
}

macro_rules! nvml_table {
    (
        required { $( $field:ident : $sym:literal => fn($($arg:ty),*) -> $ret:ty ; )* }
        optional { $( $ofield:ident : $osym:literal => fn($($oarg:ty),*) -> $oret:ty ; )* }
    ) => {
        /// NVML's function table, resolved once from `libnvidia-ml.so.1` and initialised
        /// (`nvmlInit_v2`). An optional symbol the library lacks is `None`; calls that need it
        /// fail with [`Error::MissingSymbol`] naming it.
        struct Table {
            _lib: libloading::Library,
            $( $field: unsafe extern "C" fn($($arg),*) -> $ret, )*
            $( $ofield: Option<unsafe extern "C" fn($($oarg),*) -> $oret>, )*
        }

        impl Table {
            fn resolve(lib: libloading::Library) -> Result<Self> {
                $(
                    // SAFETY: the symbol is an NVML function whose C signature is the one spelled
                    // out in the table (from nvml.h); the pointer is copied out and stays valid
                    // because the library is kept alive in `_lib`.
                    let $field = unsafe {
                        *lib.get::<unsafe extern "C" fn($($arg),*) -> $ret>(
                            concat!($sym, "\0").as_bytes(),
                        )
                        .map_err(|_| Error::MissingSymbol { library: LIBRARY, symbol: $sym })?
                    };
                )*
                $(
                    // SAFETY: as above; a missing optional symbol is recorded as `None`.
                    let $ofield = unsafe {
                        lib.get::<unsafe extern "C" fn($($oarg),*) -> $oret>(
                            concat!($osym, "\0").as_bytes(),
                        )
                        .ok()
                        .map(|s| *s)
                    };
                )*
                Ok(Table { _lib: lib, $( $field, )* $( $ofield, )* })
            }
        }
    };
}

nvml_table! {
    required {
        init: "nvmlInit_v2" => fn() -> NvmlReturn;
        driver_version: "nvmlSystemGetDriverVersion" => fn(*mut c_char, c_uint) -> NvmlReturn;
        device_count: "nvmlDeviceGetCount_v2" => fn(*mut c_uint) -> NvmlReturn;
        device_by_index: "nvmlDeviceGetHandleByIndex_v2" => fn(c_uint, *mut DeviceHandle) -> NvmlReturn;
        device_name: "nvmlDeviceGetName" => fn(DeviceHandle, *mut c_char, c_uint) -> NvmlReturn;
        device_uuid: "nvmlDeviceGetUUID" => fn(DeviceHandle, *mut c_char, c_uint) -> NvmlReturn;
        device_pci: "nvmlDeviceGetPciInfo_v3" => fn(DeviceHandle, *mut RawPciInfo) -> NvmlReturn;
        device_bar1: "nvmlDeviceGetBAR1MemoryInfo" => fn(DeviceHandle, *mut RawBar1) -> NvmlReturn;
        device_memory: "nvmlDeviceGetMemoryInfo" => fn(DeviceHandle, *mut RawMemory) -> NvmlReturn;
    }
    optional {
        compute_processes_v3: "nvmlDeviceGetComputeRunningProcesses_v3" => fn(DeviceHandle, *mut c_uint, *mut RawProcessInfo) -> NvmlReturn;
        compute_processes_v1: "nvmlDeviceGetComputeRunningProcesses" => fn(DeviceHandle, *mut c_uint, *mut RawProcessInfoV1) -> NvmlReturn;
        graphics_processes_v3: "nvmlDeviceGetGraphicsRunningProcesses_v3" => fn(DeviceHandle, *mut c_uint, *mut RawProcessInfo) -> NvmlReturn;
        graphics_processes_v1: "nvmlDeviceGetGraphicsRunningProcesses" => fn(DeviceHandle, *mut c_uint, *mut RawProcessInfoV1) -> NvmlReturn;
    }
}

/// One of NVML's process-list calls, in whichever form the library has.
#[derive(Clone, Copy)]
enum ProcessList {
    V3(
        &'static str,
        unsafe extern "C" fn(DeviceHandle, *mut c_uint, *mut RawProcessInfo) -> NvmlReturn,
    ),
    V1(
        &'static str,
        unsafe extern "C" fn(DeviceHandle, *mut c_uint, *mut RawProcessInfoV1) -> NvmlReturn,
    ),
}

impl ProcessList {
    /// `v3` where the library has it, else `v1`, else the error naming the newer symbol.
    fn pick(
        v3: Option<
            unsafe extern "C" fn(DeviceHandle, *mut c_uint, *mut RawProcessInfo) -> NvmlReturn,
        >,
        v1: Option<
            unsafe extern "C" fn(DeviceHandle, *mut c_uint, *mut RawProcessInfoV1) -> NvmlReturn,
        >,
        names: (&'static str, &'static str),
    ) -> Result<ProcessList> {
        match (v3, v1) {
            (Some(f), _) => Ok(ProcessList::V3(names.0, f)),
            (None, Some(f)) => Ok(ProcessList::V1(names.1, f)),
            (None, None) => Err(Error::MissingSymbol {
                library: LIBRARY,
                symbol: names.0,
            }),
        }
    }

    /// The processes on `handle`: `(pid, used bytes)`. The list is asked for with the room the
    /// last answer said it needs (processes may come between two calls), a few times at most.
    fn read(self, handle: DeviceHandle) -> Result<Vec<(u32, Option<u64>)>> {
        let used = |b: u64| (b != NVML_VALUE_NOT_AVAILABLE).then_some(b);
        let mut room: c_uint = 0;
        for _ in 0..4 {
            let mut count = room;
            let (call, code, got) = match self {
                ProcessList::V3(call, f) => {
                    let mut buf = vec![RawProcessInfo::default(); room as usize];
                    let ptr = if buf.is_empty() {
                        std::ptr::null_mut()
                    } else {
                        buf.as_mut_ptr()
                    };
                    // SAFETY: a live device handle; `buf` holds `count` records of the layout
                    // this symbol writes (null with a count of 0, which NVML answers with the
                    // count it needs).
                    let code = unsafe { f(handle, &mut count, ptr) };
                    let got = buf
                        .iter()
                        .take(count as usize)
                        .map(|p| (p.pid, used(p.used_gpu_memory)))
                        .collect::<Vec<_>>();
                    (call, code, got)
                }
                ProcessList::V1(call, f) => {
                    let mut buf = vec![RawProcessInfoV1::default(); room as usize];
                    let ptr = if buf.is_empty() {
                        std::ptr::null_mut()
                    } else {
                        buf.as_mut_ptr()
                    };
                    // SAFETY: as above, with the records of the first version.
                    let code = unsafe { f(handle, &mut count, ptr) };
                    let got = buf
                        .iter()
                        .take(count as usize)
                        .map(|p| (p.pid, used(p.used_gpu_memory)))
                        .collect::<Vec<_>>();
                    (call, code, got)
                }
            };
            match code {
                NVML_SUCCESS => return Ok(got),
                // Room for the processes there now, and a few that may start meanwhile.
                NVML_ERROR_INSUFFICIENT_SIZE => room = count.saturating_add(8),
                code => return check(call, code).map(|()| got),
            }
        }
        check(self.name(), NVML_ERROR_INSUFFICIENT_SIZE).map(|()| Vec::new())
    }

    fn name(self) -> &'static str {
        match self {
            ProcessList::V3(n, _) | ProcessList::V1(n, _) => n,
        }
    }
}

/// A loaded, initialised NVML. Shared process-wide through [`Nvml::get`]; never shut down (NVML's
/// init is reference-counted and cheap to keep).
pub struct Nvml {
    table: Table,
}

impl fmt::Debug for Nvml {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nvml").finish_non_exhaustive()
    }
}

static NVML: OnceLock<std::result::Result<Arc<Nvml>, String>> = OnceLock::new();

fn check(call: &'static str, code: NvmlReturn) -> Result<()> {
    if code == NVML_SUCCESS {
        Ok(())
    } else {
        Err(Error::Nvml {
            call,
            code,
            name: return_name(code),
        })
    }
}

/// Reads a NUL-terminated string NVML wrote into `buf` (cut at the buffer's end if it did not
/// terminate it).
fn buffer_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

impl Nvml {
    /// Loads NVML (`VKGDR_NVML_LIBRARY` or `libnvidia-ml.so.1`) and initialises it, once per
    /// process. Without NVML: [`Error::LibraryNotFound`], a normal outcome on machines without
    /// the NVIDIA driver's management library.
    pub fn get() -> Result<Arc<Nvml>> {
        let cached = NVML.get_or_init(|| Self::load().map(Arc::new).map_err(|e| e.to_string()));
        match cached {
            Ok(n) => Ok(n.clone()),
            // Reload to rebuild the typed error; the failure is cheap and rare.
            Err(_) => Self::load().map(Arc::new),
        }
    }

    fn load() -> Result<Nvml> {
        let lib = crate::driver::dynlib::load(LIBRARY, crate::driver::dynlib::NVML_ENV)?;
        let table = Table::resolve(lib)?;
        // SAFETY: nvmlInit_v2 takes no arguments and may be called from any thread.
        check("nvmlInit_v2", unsafe { (table.init)() })?;
        Ok(Nvml { table })
    }

    /// The driver version NVML reports (`580.159.04`).
    pub fn driver_version(&self) -> Result<String> {
        let mut buf = [0 as c_char; VERSION_BUFFER];
        // SAFETY: the buffer holds VERSION_BUFFER bytes and we pass that length.
        check("nvmlSystemGetDriverVersion", unsafe {
            (self.table.driver_version)(buf.as_mut_ptr(), buf.len() as c_uint)
        })?;
        Ok(buffer_string(&buf))
    }

    /// Every device NVML sees, with its figures.
    pub fn devices(&self) -> Result<Vec<NvmlDevice>> {
        let mut count: c_uint = 0;
        // SAFETY: valid out-pointer.
        check("nvmlDeviceGetCount_v2", unsafe {
            (self.table.device_count)(&mut count)
        })?;
        (0..count).map(|i| self.device(i)).collect()
    }

    /// The processes with a context on device `index` (NVML's index, [`NvmlDevice::index`]):
    /// `nvmlDeviceGetComputeRunningProcesses` and `nvmlDeviceGetGraphicsRunningProcesses`
    /// (`_v3` where the library has it), merged by pid ([`merge_processes`]). A library without
    /// either call is [`Error::MissingSymbol`]; a device that does not report them, the call's
    /// [`Error::Nvml`] (`NVML_ERROR_NOT_SUPPORTED`, `NVML_ERROR_NO_PERMISSION`).
    pub fn processes(&self, index: u32) -> Result<Vec<GpuProcess>> {
        let t = &self.table;
        let compute = ProcessList::pick(
            t.compute_processes_v3,
            t.compute_processes_v1,
            (
                "nvmlDeviceGetComputeRunningProcesses_v3",
                "nvmlDeviceGetComputeRunningProcesses",
            ),
        )?;
        let graphics = ProcessList::pick(
            t.graphics_processes_v3,
            t.graphics_processes_v1,
            (
                "nvmlDeviceGetGraphicsRunningProcesses_v3",
                "nvmlDeviceGetGraphicsRunningProcesses",
            ),
        )?;
        let handle = self.handle(index)?;
        Ok(merge_processes(
            &compute.read(handle)?,
            &graphics.read(handle)?,
        ))
    }

    fn handle(&self, index: u32) -> Result<DeviceHandle> {
        let mut handle: DeviceHandle = std::ptr::null_mut();
        // SAFETY: valid out-pointer; NVML checks the index itself.
        check("nvmlDeviceGetHandleByIndex_v2", unsafe {
            (self.table.device_by_index)(index, &mut handle)
        })?;
        Ok(handle)
    }

    fn device(&self, index: u32) -> Result<NvmlDevice> {
        let t = &self.table;
        let handle = self.handle(index)?;
        let string = |call: &'static str,
                      f: unsafe extern "C" fn(DeviceHandle, *mut c_char, c_uint) -> NvmlReturn|
         -> Result<String> {
            let mut buf = [0 as c_char; STRING_BUFFER];
            // SAFETY: live device handle; the buffer holds STRING_BUFFER bytes and we pass that.
            check(call, unsafe {
                f(handle, buf.as_mut_ptr(), buf.len() as c_uint)
            })?;
            Ok(buffer_string(&buf))
        };
        let name = string("nvmlDeviceGetName", t.device_name)?;
        let uuid = string("nvmlDeviceGetUUID", t.device_uuid)?;
        // SAFETY: all-zero bytes are a valid `nvmlPciInfo_t` (integers and char arrays).
        let mut pci: RawPciInfo = unsafe { std::mem::zeroed() };
        // SAFETY: live device handle; `pci` is an `nvmlPciInfo_t` of the v3 layout.
        let pci = check("nvmlDeviceGetPciInfo_v3", unsafe {
            (t.device_pci)(handle, &mut pci)
        })
        .ok()
        .map(|()| PciAddress {
            domain: pci.domain,
            bus: pci.bus,
            device: pci.device,
        });
        let mut bar1 = RawBar1::default();
        // SAFETY: live device handle; `bar1` is an `nvmlBAR1Memory_t`.
        let bar1 = check("nvmlDeviceGetBAR1MemoryInfo", unsafe {
            (t.device_bar1)(handle, &mut bar1)
        })
        .map(|()| Bar1Memory {
            total: bar1.total,
            free: bar1.free,
            used: bar1.used,
        })
        .map_err(|e| e.to_string());
        let mut mem = RawMemory::default();
        // SAFETY: live device handle; `mem` is an `nvmlMemory_t` (the v1 query).
        let vram = check("nvmlDeviceGetMemoryInfo", unsafe {
            (t.device_memory)(handle, &mut mem)
        })
        .map(|()| VramMemory {
            total: mem.total,
            used: mem.used,
        })
        .map_err(|e| e.to_string());
        Ok(NvmlDevice {
            index,
            name,
            uuid,
            pci,
            bar1,
            vram,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(index: u32, uuid: &str, pci: Option<PciAddress>) -> NvmlDevice {
        NvmlDevice {
            index,
            name: format!("GPU {index}"),
            uuid: uuid.into(),
            pci,
            bar1: Err("nvmlDeviceGetBAR1MemoryInfo failed: NVML_ERROR_NOT_SUPPORTED".into()),
            vram: Err("nvmlDeviceGetMemoryInfo failed: NVML_ERROR_NOT_SUPPORTED".into()),
        }
    }

    const UUID: [u8; 16] = [
        0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8,
    ];

    #[test]
    fn matches_by_uuid_before_pci() {
        let at = |bus| {
            Some(PciAddress {
                domain: 0,
                bus,
                device: 0,
            })
        };
        let devices = [
            device(0, "GPU-00000000-0000-0000-0000-000000000000", at(0x41)),
            device(1, "GPU-12345678-9ABC-DEF0-0102-030405060708", at(0x81)),
        ];
        // Same UUID (case-insensitive) wins even when the PCI address points elsewhere.
        assert_eq!(match_device(&devices, &UUID, at(0x41)).unwrap().index, 1);
        // No UUID match: the PCI address decides.
        let other = [0xffu8; 16];
        assert_eq!(match_device(&devices, &other, at(0x41)).unwrap().index, 0);
        assert!(match_device(&devices, &other, at(0x99)).is_none());
        assert!(match_device(&devices, &other, None).is_none());
        assert!(match_device(&[], &UUID, at(0x41)).is_none());
    }

    #[test]
    fn a_process_in_both_lists_is_one_process_with_one_figure() {
        let mib = |n: u64| Some(n << 20);
        let compute = [(300, mib(600)), (100, mib(500))];
        // The vkgdr process (100) is a graphics process too (its Vulkan device), with the same
        // figure or a smaller one: never counted twice. 200 is Vulkan only; 400 cannot be told.
        let graphics = [(100, mib(480)), (200, mib(17)), (400, None)];
        let merged = merge_processes(&compute, &graphics);
        let by_pid: Vec<_> = merged
            .iter()
            .map(|p| (p.pid, p.used_bytes, p.compute, p.graphics))
            .collect();
        assert_eq!(
            by_pid,
            [
                (100, mib(500), true, true),
                (200, mib(17), false, true),
                (300, mib(600), true, false),
                (400, None, false, true),
            ]
        );
        // A figure NVML cannot give in one list is taken from the other.
        let merged = merge_processes(&[(7, None)], &[(7, mib(3))]);
        assert_eq!(merged[0].used_bytes, mib(3));
        assert!(merge_processes(&[], &[]).is_empty());
    }

    #[test]
    fn pci_address_prints_like_lspci() {
        let p = PciAddress {
            domain: 0,
            bus: 0x1b,
            device: 3,
        };
        assert_eq!(p.to_string(), "0000:1b:03.0");
    }

    #[test]
    fn return_names() {
        assert_eq!(return_name(3), "NVML_ERROR_NOT_SUPPORTED");
        assert_eq!(return_name(9), "NVML_ERROR_DRIVER_NOT_LOADED");
        assert_eq!(return_name(12345), "nvmlReturn_t 12345");
    }

    #[test]
    fn strings_stop_at_nul_or_buffer_end() {
        let mut buf = [0 as c_char; 8];
        for (i, b) in b"H100".iter().enumerate() {
            buf[i] = *b as c_char;
        }
        assert_eq!(buffer_string(&buf), "H100");
        let full = [b'x' as c_char; 4];
        assert_eq!(buffer_string(&full), "xxxx");
    }
}
