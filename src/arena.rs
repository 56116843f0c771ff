//! CUDA virtual memory management (VMM) over exported chunks: feature detection and granularity.

use std::ffi::c_int;

use crate::cuda::{Driver, MemAllocationProp, MemLocation};
use crate::error::{Error, Result};

/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
const ALLOCATION_TYPE_PINNED: u32 = 1;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
const HANDLE_TYPE_POSIX_FD: u32 = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_TYPE_DEVICE: u32 = 1;
/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`.
const GRANULARITY_MINIMUM: u32 = 0;

pub(crate) fn allocation_prop(ordinal: c_int) -> MemAllocationProp {
    MemAllocationProp {
        alloc_type: ALLOCATION_TYPE_PINNED,
        requested_handle_types: HANDLE_TYPE_POSIX_FD,
        location: MemLocation {
            location_type: LOCATION_TYPE_DEVICE,
            id: ordinal,
        },
        win32_handle_meta_data: std::ptr::null_mut(),
        alloc_flags: [0; 8],
    }
}

/// The VMM mapping granularity for POSIX-fd device memory on device `ordinal` (2 MiB on the H100):
/// chunks mapped into an arena must be multiples of it.
pub fn granularity(driver: &Driver, ordinal: c_int) -> Result<u64> {
    let f = driver.cu_mem_get_allocation_granularity.ok_or_else(|| {
        Error::Unsupported("cuMemGetAllocationGranularity missing (driver too old)".into())
    })?;
    let prop = allocation_prop(ordinal);
    let mut g = 0usize;
    // SAFETY: `prop` is a fully initialised CUmemAllocationProp (32 bytes, checked at compile
    // time); valid out-pointer.
    driver.check("cuMemGetAllocationGranularity", unsafe {
        f(&mut g, &prop, GRANULARITY_MINIMUM)
    })?;
    Ok(g as u64)
}
