//! CUDA virtual memory management (VMM): how every allocation of the library reaches the device's
//! address space, because its teardown never waits for a running kernel.
//!
//! With a persistent kernel running on a stream of its own (`vkgdr bench waits`; figures:
//! docs/RELIABILITY.md, 'How: the measurements that decided the design'): `cuMemFree` of an
//! imported external-memory buffer, like `cuMemFreeHost` and `cuMemHostUnregister`, returns only
//! once the kernel ends; `cuMemUnmap`, `cuMemRelease` and `cuMemAddressFree` return without waiting
//! for it, and none of these calls needs a current context. So a Vulkan allocation's opaque fd is
//! imported as a VMM handle (`cuMemImportFromShareableHandle`) and mapped into a reserved range,
//! for BAR memory and for pinned host memory alike.
//!
//! The pieces, bottom up: [`VmmDevice`] (the device's ordinal and granularity, checked once),
//! [`VmmHandle`] (an allocation handle, released on drop), [`AddressRange`] (a reservation, freed
//! on drop), [`VmmMapping`] (a handle mapped over a range with read-write access for the device)
//! and [`MappedMemory`] (a Vulkan allocation together with its device mapping). Dropping any of
//! them releases at once; waiting for the GPU's queued work first is the job of the release
//! queue.
//!
//! **Other devices.** A VMM mapping starts with access for no device; [`VmmDevice::map_at`] gives
//! its own device read-write access, and nothing else does: `cuCtxEnablePeerAccess` covers
//! `cuMemAlloc` memory but not VMM ranges, so a kernel on another GPU faults on these addresses
//! even with peer access enabled between the contexts. [`VmmMapping::grant_access`] gives another
//! device access to one whole mapping (`cuMemSetAccess` with that device's location), which
//! `RawMemory::grant_peer_access` and `Block::grant_peer_access` build on.

use std::ffi::{c_int, c_void};
use std::os::fd::AsRawFd;
use std::sync::Arc;

use crate::core::range::RangeError;
use crate::driver::cuda::injected_failure as injected;
use crate::driver::cuda::{
    self, out_of_memory, CuDevice, CuMemHandle, Driver, MemAccessDesc, MemAllocationProp,
    MemLocation, CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_ALLOC_GRANULARITY_MINIMUM,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
};
use crate::driver::vulkan::VulkanMemory;
use crate::error::{Error, InvalidArgument, Result};

/// What VMM needs to know about one device: its ordinal (access descriptors name it) and its
/// allocation granularity (2 MiB on the H100): handles map whole, and only in multiples of it.
#[derive(Clone)]
pub struct VmmDevice {
    driver: Arc<Driver>,
    ordinal: c_int,
    granularity: u64,
}

impl std::fmt::Debug for VmmDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmmDevice")
            .field("ordinal", &self.ordinal)
            .field("granularity", &self.granularity)
            .finish()
    }
}

impl VmmDevice {
    /// Checks that `device` supports VMM with POSIX-fd handles and reads its granularity.
    /// [`Error::Unsupported`] names what is missing (the driver's VMM symbols, the device
    /// attribute).
    pub fn new(driver: &Arc<Driver>, device: CuDevice) -> Result<VmmDevice> {
        for (attribute, what) in [
            (
                cuda::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                "the device does not support CUDA VMM",
            ),
            (
                cuda::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                "the device does not import POSIX fd handles",
            ),
        ] {
            if driver.device_attribute(device, attribute)? == 0 {
                return Err(Error::Unsupported(what.into()));
            }
        }
        let ordinal = ordinal_of(driver, device)?;
        Ok(VmmDevice {
            driver: driver.clone(),
            ordinal,
            granularity: granularity(driver, ordinal)?,
        })
    }

    /// The driver table.
    pub fn driver(&self) -> &Arc<Driver> {
        &self.driver
    }

    /// The device's CUDA ordinal.
    pub fn ordinal(&self) -> c_int {
        self.ordinal
    }

    /// The allocation granularity: mapped sizes are multiples of it.
    pub fn granularity(&self) -> u64 {
        self.granularity
    }

    /// `size` rounded up to the granularity; zero and overflow are [`Error::InvalidArgument`].
    pub fn round_up(&self, size: u64) -> Result<u64> {
        let g = self.granularity;
        if size == 0 {
            return Err(RangeError::ZeroSize.into());
        }
        size.checked_next_multiple_of(g).ok_or_else(|| {
            InvalidArgument::GranularityOverflow {
                size,
                granularity: g,
            }
            .into()
        })
    }

    /// Imports the opaque fd of `memory` (a whole Vulkan allocation) as an allocation handle.
    pub fn import(&self, memory: &VulkanMemory) -> Result<VmmHandle> {
        let fd = memory.export_fd()?;
        let driver = &self.driver;
        let raw = crate::driver::failpoint::inject("cuMemImportFromShareableHandle", || {
            injected(driver, "cuMemImportFromShareableHandle")
        })
        // SAFETY: a live opaque fd passed as the handle value, as cuda.h prescribes for POSIX fds;
        // the call does not take ownership (`fd` closes it when dropped).
        .and_then(|()| unsafe {
            driver.cu_mem_import_from_shareable_handle(
                fd.as_raw_fd() as isize as *mut c_void,
                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        })
        .map_err(out_of_memory(memory.size()))?;
        Ok(VmmHandle {
            driver: driver.clone(),
            raw,
        })
    }

    /// Creates `size` bytes (a multiple of the granularity) of plain device memory, no host
    /// mapping (`cuMemCreate`).
    pub fn create(&self, size: u64) -> Result<VmmHandle> {
        let prop = MemAllocationProp::pinned_posix_fd(self.ordinal);
        // SAFETY: `prop` is a fully initialised CUmemAllocationProp that outlives the call.
        let raw = unsafe { self.driver.cu_mem_create(size as usize, &prop, 0) }
            .map_err(out_of_memory(size))?;
        Ok(VmmHandle {
            driver: self.driver.clone(),
            raw,
        })
    }

    /// Reserves `size` bytes (a multiple of the granularity) of device address space.
    pub fn reserve(&self, size: u64) -> Result<AddressRange> {
        let driver = &self.driver;
        let va = crate::driver::failpoint::inject("cuMemAddressReserve", || {
            injected(driver, "cuMemAddressReserve")
        })
        .and_then(|()| {
            driver.cu_mem_address_reserve(size as usize, self.granularity as usize, 0, 0)
        })
        .map_err(out_of_memory(size))?;
        Ok(AddressRange {
            driver: driver.clone(),
            va,
            size,
        })
    }

    /// Maps all of `handle` (`size` bytes) at `va` and gives this device read-write access,
    /// undoing the mapping if access cannot be set.
    ///
    /// # Safety
    /// - `[va, va + size)` must lie inside a live reservation and be unmapped;
    /// - `handle`'s allocation must be exactly `size` bytes, and stay alive while mapped.
    pub unsafe fn map_at(&self, va: u64, size: u64, handle: &VmmHandle) -> Result<()> {
        let driver = &self.driver;
        crate::driver::failpoint::inject("cuMemMap", || injected(driver, "cuMemMap"))
            // SAFETY: the caller's contract.
            .and_then(|()| unsafe { driver.cu_mem_map(va, size as usize, 0, handle.raw, 0) })
            .map_err(out_of_memory(size))?;
        let access = MemAccessDesc {
            location: MemLocation::device(self.ordinal),
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        let granted = crate::driver::failpoint::inject("cuMemSetAccess", || {
            injected(driver, "cuMemSetAccess")
        })
        // SAFETY: the range was just mapped; one valid descriptor, alive for the call.
        .and_then(|()| unsafe { driver.cu_mem_set_access(va, size as usize, &access, 1) });
        if let Err(e) = granted {
            // SAFETY: undo the mapping made above; nothing has used it.
            let _ = unsafe { driver.cu_mem_unmap(va, size as usize) };
            return Err(e);
        }
        Ok(())
    }

    /// Maps `handle` (`size` bytes) into a fresh reservation of its own.
    pub fn map(&self, handle: VmmHandle, size: u64) -> Result<VmmMapping> {
        let range = self.reserve(size)?;
        // SAFETY: a fresh, unmapped reservation of exactly `size` bytes; the handle moves into
        // the mapping, which unmaps before it releases it.
        unsafe { self.map_at(range.va, size, &handle) }?;
        Ok(VmmMapping {
            _handle: handle,
            range,
            size,
        })
    }
}

/// The device's VMM allocation granularity for POSIX-fd device memory (2 MiB on the H100).
pub fn granularity(driver: &Driver, ordinal: c_int) -> Result<u64> {
    let prop = MemAllocationProp::pinned_posix_fd(ordinal);
    // SAFETY: `prop` is a fully initialised CUmemAllocationProp (32 bytes, checked at compile
    // time) that outlives the call.
    let g = unsafe {
        driver.cu_mem_get_allocation_granularity(&prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)
    }?;
    Ok(g as u64)
}

/// The CUDA ordinal of `device` (access descriptors and allocation properties name ordinals).
pub fn ordinal_of(driver: &Driver, device: CuDevice) -> Result<c_int> {
    for i in 0..driver.device_count()? {
        if driver.device(i)? == device {
            return Ok(i);
        }
    }
    Err(Error::NoMatchingDevice(format!(
        "CUDA device handle {device} has no ordinal"
    )))
}

/// A VMM allocation handle (`CUmemGenericAllocationHandle`), released on drop. The memory lives
/// on while a mapping of it exists.
pub struct VmmHandle {
    driver: Arc<Driver>,
    raw: CuMemHandle,
}

impl VmmHandle {
    /// The raw handle.
    pub fn raw(&self) -> CuMemHandle {
        self.raw
    }
}

impl Drop for VmmHandle {
    fn drop(&mut self) {
        // SAFETY: the handle is ours and released once; mappings of it keep the memory until
        // they are unmapped (CUDA's reference counting).
        let _ = unsafe { self.driver.cu_mem_release(self.raw) };
    }
}

/// A reservation of device address space, freed on drop (every mapping in it must be gone by
/// then).
pub struct AddressRange {
    driver: Arc<Driver>,
    va: u64,
    size: u64,
}

impl AddressRange {
    /// The first address.
    pub fn va(&self) -> u64 {
        self.va
    }

    /// Bytes reserved.
    pub fn size(&self) -> u64 {
        self.size
    }
}

impl Drop for AddressRange {
    fn drop(&mut self) {
        // SAFETY: the reservation is ours and freed once; its owners unmap everything first.
        let _ = unsafe { self.driver.cu_mem_address_free(self.va, self.size as usize) };
    }
}

/// One handle mapped over a reservation of its own, readable and writable by the device.
/// Dropping it unmaps, releases the handle and frees the addresses, in that order, at once.
pub struct VmmMapping {
    // Field order is drop order after `Drop::drop` has unmapped: the handle, then the range.
    _handle: VmmHandle,
    range: AddressRange,
    size: u64,
}

impl VmmMapping {
    /// The device address of byte 0.
    pub fn device_ptr(&self) -> u64 {
        self.range.va
    }

    /// Gives the device with CUDA ordinal `ordinal` read-write access to the whole mapping
    /// (`cuMemSetAccess`, which only takes whole mappings), in addition to the devices that have
    /// it already. The access ends with the mapping; nothing here takes access away. Whether
    /// the device can reach this memory at all is the caller's question
    /// (`cuDeviceCanAccessPeer`): the driver refuses a device without a path to it.
    pub fn grant_access(&self, ordinal: c_int) -> Result<()> {
        let access = MemAccessDesc {
            location: MemLocation::device(ordinal),
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: exactly the live mapping made in `VmmDevice::map` (this size at this address);
        // one valid descriptor, alive for the call. Granting a device read-write access takes
        // no access away from any other.
        unsafe {
            self.range
                .driver
                .cu_mem_set_access(self.range.va, self.size as usize, &access, 1)
        }
    }

    /// Bytes mapped.
    pub fn size(&self) -> u64 {
        self.size
    }
}

impl Drop for VmmMapping {
    fn drop(&mut self) {
        // SAFETY: mapped in `VmmDevice::map` with this size; its owners only drop it once no
        // queued GPU work can use it any more (crate::mapping::release).
        let _ = unsafe {
            self.range
                .driver
                .cu_mem_unmap(self.range.va, self.size as usize)
        };
    }
}

/// A Vulkan allocation (BAR memory, or pinned host memory) with its host mapping and its device
/// mapping: the same bytes at [`host_ptr`](Self::host_ptr) and [`device_ptr`](Self::device_ptr).
/// Dropping it tears the device side down first, then the Vulkan memory; nothing waits.
pub struct MappedMemory {
    // Drop order: the device mapping, then the Vulkan memory it maps.
    mapping: VmmMapping,
    memory: VulkanMemory,
}

impl MappedMemory {
    /// Maps `memory` (its size a multiple of the granularity) into the device's address space.
    pub fn new(device: &VmmDevice, memory: VulkanMemory) -> Result<MappedMemory> {
        let size = memory.size();
        if !size.is_multiple_of(device.granularity) {
            return Err(Error::internal(format!(
                "a {size}-byte allocation cannot be mapped in {}-byte granules",
                device.granularity
            )));
        }
        let handle = device.import(&memory)?;
        let mapping = device.map(handle, size)?;
        Ok(MappedMemory { mapping, memory })
    }

    /// Allocates `size` bytes of BAR memory (rounded up to the granularity) and maps it.
    pub fn bar(
        device: &VmmDevice,
        vulkan: &Arc<crate::driver::vulkan::VulkanContext>,
        size: u64,
    ) -> Result<MappedMemory> {
        Self::new(device, vulkan.allocate(device.round_up(size)?)?)
    }

    /// Allocates `size` bytes of pinned host memory (rounded up to the granularity) and maps it.
    pub fn host(
        device: &VmmDevice,
        vulkan: &Arc<crate::driver::vulkan::VulkanContext>,
        size: u64,
    ) -> Result<MappedMemory> {
        Self::new(device, vulkan.allocate_host(device.round_up(size)?)?)
    }

    /// The device address of byte 0.
    pub fn device_ptr(&self) -> u64 {
        self.mapping.device_ptr()
    }

    /// The host address of byte 0.
    pub fn host_ptr(&self) -> *mut u8 {
        self.memory.as_ptr()
    }

    /// Bytes mapped (a multiple of the granularity).
    pub fn size(&self) -> u64 {
        self.memory.size()
    }

    /// The Vulkan allocation (flushes and invalidates).
    pub fn memory(&self) -> &VulkanMemory {
        &self.memory
    }

    /// Gives device `ordinal` read-write access to the whole device mapping
    /// ([`VmmMapping::grant_access`]).
    pub fn grant_access(&self, ordinal: c_int) -> Result<()> {
        self.mapping.grant_access(ordinal)
    }
}
