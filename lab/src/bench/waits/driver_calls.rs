//! The driver calls probed ([`driver_scenarios`]): device and external memory, the VMM path
//! vkgdr's mappings take, pinned host memory (three ways), a completion word written by the
//! legacy stream, modules, streams, events, synchronous copies and context-wide calls.

use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::time::{Duration, Instant};

use vkgdr::cuda::{
    Driver, ExternalMemoryBufferDesc, ExternalMemoryHandleDesc, CU_EVENT_DISABLE_TIMING,
    CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD, CU_MEMHOSTALLOC_DEVICEMAP, CU_STREAM_NON_BLOCKING,
};
use vkgdr::vmm::ordinal_of;
use vkgdr::Gpu;

use super::probe::{import_fd, rw_access, Condition, Handle, Probe, SIZE};
use super::spinner::PTX;
use crate::bench::error::BenchResult;

/// The rows the registry names.
pub mod rows {
    /// `vkAllocateMemory` and `vkMapMemory` of device memory.
    pub const VK_ALLOCATE: &str = "vkAllocateMemory + vkMapMemory";
    /// Its opaque fd.
    pub const VK_EXPORT_FD: &str = "vkGetMemoryFdKHR";
    /// The fd imported as a VMM allocation handle.
    pub const CU_IMPORT: &str = "cuMemImportFromShareableHandle";
    /// A device address range.
    pub const CU_RESERVE: &str = "cuMemAddressReserve";
    /// The handle mapped there.
    pub const CU_MAP: &str = "cuMemMap";
    /// Access to the mapping.
    pub const CU_SET_ACCESS: &str = "cuMemSetAccess";
    /// The unmap.
    pub const CU_UNMAP: &str = "cuMemUnmap";
    /// The handle's release.
    pub const CU_RELEASE: &str = "cuMemRelease";
    /// The address range's release.
    pub const CU_ADDRESS_FREE: &str = "cuMemAddressFree";
    /// `vkUnmapMemory` and `vkFreeMemory`.
    pub const VK_FREE: &str = "vkUnmapMemory + vkFreeMemory";
    /// Host memory: the Vulkan allocation.
    pub const VK_ALLOCATE_HOST: &str = "vkAllocateMemory (host memory)";
    /// Host memory: its fd.
    pub const VK_EXPORT_FD_HOST: &str = "vkGetMemoryFdKHR (host memory)";
    /// Host memory: the import.
    pub const CU_IMPORT_HOST: &str = "cuMemImportFromShareableHandle (host memory)";
    /// Host memory: the map.
    pub const CU_MAP_HOST: &str = "cuMemMap (host memory)";
    /// Host memory: the access.
    pub const CU_SET_ACCESS_HOST: &str = "cuMemSetAccess (host memory)";
    /// Host memory: the unmap.
    pub const CU_UNMAP_HOST: &str = "cuMemUnmap (host memory)";
    /// Host memory: the release.
    pub const CU_RELEASE_HOST: &str = "cuMemRelease (host memory)";
    /// Host memory: the Vulkan free.
    pub const VK_FREE_HOST: &str = "vkFreeMemory (host memory)";
    /// The wait for a word the legacy stream writes (a driver row though no call of its own).
    pub const COMPLETION_WORD: &str = "legacy-stream completion word arrives";
    /// A module's load.
    pub const CU_MODULE_LOAD: &str = "cuModuleLoadData";
    /// Its unload.
    pub const CU_MODULE_UNLOAD: &str = "cuModuleUnload";
    /// A stream.
    pub const CU_STREAM_CREATE: &str = "cuStreamCreate";
    /// Its destruction.
    pub const CU_STREAM_DESTROY: &str = "cuStreamDestroy_v2";
    /// A synchronous 64 KiB copy from pageable memory.
    pub const CU_MEMCPY_HTOD: &str = "cuMemcpyHtoD_v2 (64 KiB pageable)";
}

/// Every driver call, in the order a user of the driver makes them; `scratch` is a device
/// buffer of [`SIZE`] bytes for the synchronous copies.
pub(super) fn driver_scenarios(p: &mut Probe<'_>, gpu: &Gpu, scratch: u64) -> BenchResult<()> {
    let d: &Driver = gpu.driver();
    let vk = gpu.vulkan();
    let ordinal = ordinal_of(d, gpu.cu_device())?;

    // cuMemAlloc / cuMemFree.
    let ptr = p.call("cuMemAlloc_v2", || {
        let _c = gpu.bind()?;
        d.cu_mem_alloc(SIZE as usize)
    })?;
    p.call("cuMemFree_v2 (cuMemAlloc memory)", || {
        let _c = gpu.bind()?;
        // SAFETY: allocated just above, unused.
        unsafe { d.cu_mem_free(ptr) }
    })?;

    // External memory: the mapping layer's import path.
    let mem = p.call(rows::VK_ALLOCATE, || vk.allocate(SIZE))?;
    let fd: OwnedFd = p.call(rows::VK_EXPORT_FD, || mem.export_fd())?;
    let raw_fd = fd.as_raw_fd();
    let ext = p.call("cuImportExternalMemory", || {
        let _c = gpu.bind()?;
        let desc = ExternalMemoryHandleDesc {
            handle_type: CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
            handle: [raw_fd as u32 as u64, 0],
            size: mem.size(),
            flags: 0,
            reserved: [0; 16],
        };
        // SAFETY: a live opaque fd of `mem`, described exactly.
        unsafe { d.cu_import_external_memory(&desc) }.map(Handle::of)
    })?;
    // The import owns the fd now.
    let _ = fd.into_raw_fd();
    let mapped = p.call("cuExternalMemoryGetMappedBuffer", || {
        let _c = gpu.bind()?;
        let desc = ExternalMemoryBufferDesc {
            offset: 0,
            size: mem.size(),
            flags: 0,
            reserved: [0; 16],
        };
        // SAFETY: the live import; the buffer covers the memory object.
        unsafe { d.cu_external_memory_get_mapped_buffer(ext.ptr(), &desc) }
    })?;
    p.call("cuMemFree_v2 (imported buffer)", || {
        let _c = gpu.bind()?;
        // SAFETY: the mapped buffer of the import, unused.
        unsafe { d.cu_mem_free(mapped) }
    })?;
    p.call("cuDestroyExternalMemory", || {
        let _c = gpu.bind()?;
        // SAFETY: the import, with no mapped buffer left.
        unsafe { d.cu_destroy_external_memory(ext.ptr()) }
    })?;

    // The same Vulkan memory through VMM: the non-waiting candidate.
    let fd = p.call("vkGetMemoryFdKHR (again)", || mem.export_fd())?;
    let handle = p.call(rows::CU_IMPORT, || {
        let _c = gpu.bind()?;
        import_fd(d, &fd)
    })?;
    drop(fd);
    let va = p.call(rows::CU_RESERVE, || {
        let _c = gpu.bind()?;
        d.cu_mem_address_reserve(SIZE as usize, SIZE as usize, 0, 0)
    })?;
    p.call(rows::CU_MAP, || {
        let _c = gpu.bind()?;
        // SAFETY: a fresh reservation of exactly the handle's size.
        unsafe { d.cu_mem_map(va, SIZE as usize, 0, handle, 0) }
    })?;
    p.call(rows::CU_SET_ACCESS, || {
        let _c = gpu.bind()?;
        let access = rw_access(ordinal);
        // SAFETY: the range was just mapped; one descriptor alive for the call.
        unsafe { d.cu_mem_set_access(va, SIZE as usize, &access, 1) }
    })?;
    p.call(rows::CU_UNMAP, || {
        let _c = gpu.bind()?;
        // SAFETY: mapped above with this size, unused.
        unsafe { d.cu_mem_unmap(va, SIZE as usize) }
    })?;
    p.call(rows::CU_RELEASE, || {
        let _c = gpu.bind()?;
        // SAFETY: the handle is ours and unmapped.
        unsafe { d.cu_mem_release(handle) }
    })?;
    p.call(rows::CU_ADDRESS_FREE, || {
        let _c = gpu.bind()?;
        // SAFETY: the reservation is ours and unmapped.
        unsafe { d.cu_mem_address_free(va, SIZE as usize) }
    })?;
    p.call(rows::VK_FREE, || {
        drop(mem);
        Ok(())
    })?;

    // Pinned host memory, two ways.
    let host = p.call("cuMemHostAlloc", || {
        let _c = gpu.bind()?;
        d.cu_mem_alloc_host(SIZE as usize, CU_MEMHOSTALLOC_DEVICEMAP)
            .map(Handle::of)
    })?;
    p.call("cuMemFreeHost", || {
        let _c = gpu.bind()?;
        // SAFETY: allocated above, unused by any kernel.
        unsafe { d.cu_mem_free_host(host.ptr()) }
    })?;
    let layout = std::alloc::Layout::from_size_align(SIZE as usize, 4096).expect("valid layout");
    // SAFETY: a non-zero size; a null result (no memory) is handled below.
    let raw = unsafe { std::alloc::alloc(layout) };
    if raw.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    let buf = Handle::of(raw.cast());
    p.call("cuMemHostRegister_v2", || {
        let _c = gpu.bind()?;
        // SAFETY: `buf` is a live allocation of SIZE bytes, unregistered before it is freed.
        unsafe { d.cu_mem_host_register(buf.ptr(), SIZE as usize, CU_MEMHOSTALLOC_DEVICEMAP) }
    })?;
    p.call("cuMemHostUnregister", || {
        let _c = gpu.bind()?;
        // SAFETY: registered above.
        unsafe { d.cu_mem_host_unregister(buf.ptr()) }
    })?;
    // SAFETY: allocated above with this layout, unregistered.
    unsafe { std::alloc::dealloc(buf.ptr().cast(), layout) };

    // Pinned host memory through Vulkan and VMM: freed by unmapping, like the BAR chunks.
    let host_mem = p.call(rows::VK_ALLOCATE_HOST, || vk.allocate_host(SIZE))?;
    let fd = p.call(rows::VK_EXPORT_FD_HOST, || host_mem.export_fd())?;
    let handle = p.call(rows::CU_IMPORT_HOST, || {
        let _c = gpu.bind()?;
        import_fd(d, &fd)
    })?;
    drop(fd);
    let va = {
        let _c = gpu.bind()?;
        d.cu_mem_address_reserve(SIZE as usize, SIZE as usize, 0, 0)?
    };
    p.call(rows::CU_MAP_HOST, || {
        let _c = gpu.bind()?;
        // SAFETY: a fresh reservation of exactly the handle's size.
        unsafe { d.cu_mem_map(va, SIZE as usize, 0, handle, 0) }
    })?;
    p.call(rows::CU_SET_ACCESS_HOST, || {
        let _c = gpu.bind()?;
        let access = rw_access(ordinal);
        // SAFETY: the range was just mapped; one descriptor alive for the call.
        unsafe { d.cu_mem_set_access(va, SIZE as usize, &access, 1) }
    })?;
    if p.condition == Condition::Idle {
        // The GPU writes through the device mapping; the CPU reads through Vulkan's.
        let _c = gpu.bind()?;
        // SAFETY: the whole range is mapped with read-write access.
        unsafe { d.cu_memset_d32(va, 0x5a5a_5a5a, (SIZE / 4) as usize) }?;
        d.cu_ctx_synchronize()?;
        let p0 = host_mem.as_ptr();
        // SAFETY: first and last word of the mapped allocation; the GPU is done with them.
        let (first, last) = unsafe {
            (
                std::ptr::read_volatile(p0.cast::<u32>()),
                std::ptr::read_volatile(p0.add(SIZE as usize - 4).cast::<u32>()),
            )
        };
        p.observe(format!(
            "GPU writes into host memory mapped through VMM reach the CPU: {}",
            first == 0x5a5a_5a5a && last == 0x5a5a_5a5a
        ));
    }
    p.call(rows::CU_UNMAP_HOST, || {
        let _c = gpu.bind()?;
        // SAFETY: mapped above with this size.
        unsafe { d.cu_mem_unmap(va, SIZE as usize) }
    })?;
    p.call(rows::CU_RELEASE_HOST, || {
        let _c = gpu.bind()?;
        // SAFETY: ours and unmapped.
        unsafe { d.cu_mem_release(handle) }
    })?;
    {
        let _c = gpu.bind()?;
        // SAFETY: ours and unmapped.
        unsafe { d.cu_mem_address_free(va, SIZE as usize) }?;
    }
    p.call(rows::VK_FREE_HOST, || {
        drop(host_mem);
        Ok(())
    })?;

    // A completion word written by the legacy stream once the work queued before it is done:
    // what a release ordered after that work can poll without a driver call.
    let (word_dev, word_host) = p.word();
    let ticket = p.next_ticket();
    p.call("cuStreamWriteValue32_v2 (legacy stream)", || {
        let _c = gpu.bind()?;
        // SAFETY: an aligned word inside the probe's live BAR allocation.
        unsafe { d.cu_stream_write_value32(std::ptr::null_mut(), word_dev, ticket, 0) }
    })?;
    p.call(rows::COMPLETION_WORD, || {
        let t = Instant::now();
        // SAFETY: an aligned u32 in the live BAR allocation, read with volatile loads.
        while unsafe { std::ptr::read_volatile(word_host.ptr().cast::<u32>()) } != ticket {
            if t.elapsed() > Duration::from_secs(20) {
                return Err(vkgdr::Error::Unsupported(
                    "the completion word never arrived".into(),
                ));
            }
            std::hint::spin_loop();
        }
        Ok(())
    })?;

    // Modules, streams, events.
    let text = std::ffi::CString::new(PTX).expect("no NUL in the PTX");
    let module = p.call(rows::CU_MODULE_LOAD, || {
        let _c = gpu.bind()?;
        // SAFETY: NUL-terminated PTX alive for the call.
        unsafe { d.cu_module_load_data(text.as_ptr().cast()) }.map(Handle::of)
    })?;
    p.call(rows::CU_MODULE_UNLOAD, || {
        let _c = gpu.bind()?;
        // SAFETY: loaded above, no function of it in use.
        unsafe { d.cu_module_unload(module.ptr()) }
    })?;
    let stream = p.call(rows::CU_STREAM_CREATE, || {
        let _c = gpu.bind()?;
        d.cu_stream_create(CU_STREAM_NON_BLOCKING).map(Handle::of)
    })?;
    p.call(rows::CU_STREAM_DESTROY, || {
        let _c = gpu.bind()?;
        // SAFETY: created above, idle.
        unsafe { d.cu_stream_destroy(stream.ptr()) }
    })?;
    let event = p.call("cuEventCreate", || {
        let _c = gpu.bind()?;
        d.cu_event_create(CU_EVENT_DISABLE_TIMING).map(Handle::of)
    })?;
    p.call("cuEventRecord (legacy stream)", || {
        let _c = gpu.bind()?;
        // SAFETY: a live event of this context; the null stream is the legacy stream.
        unsafe { d.cu_event_record(event.ptr(), std::ptr::null_mut()) }
    })?;
    // Whether work queued on the legacy stream before this point is done: what a release ordered
    // after the legacy stream learns.
    std::thread::sleep(Duration::from_millis(2));
    let done = p.call("cuEventQuery", || {
        let _c = gpu.bind()?;
        // SAFETY: a live, recorded event.
        unsafe { d.cu_event_query(event.ptr()) }
    })?;
    p.observe(format!("an event on the legacy stream completes: {done}"));
    p.call("cuEventDestroy_v2", || {
        let _c = gpu.bind()?;
        // SAFETY: ours; the driver releases it once the recorded work completes.
        unsafe { d.cu_event_destroy(event.ptr()) }
    })?;

    // Synchronous copies on the legacy stream, and context-wide calls.
    let mut host_bytes = vec![0u8; 64 << 10];
    p.call(rows::CU_MEMCPY_HTOD, || {
        let _c = gpu.bind()?;
        // SAFETY: `scratch` is a live device buffer of SIZE bytes; the source is 64 KiB.
        unsafe { d.cu_memcpy_htod(scratch, host_bytes.as_ptr().cast(), host_bytes.len()) }
    })?;
    p.call("cuMemcpyDtoH_v2 (64 KiB pageable)", || {
        let _c = gpu.bind()?;
        // SAFETY: as above, the other way.
        unsafe { d.cu_memcpy_dtoh(host_bytes.as_mut_ptr().cast(), scratch, host_bytes.len()) }
    })?;
    p.call("cuMemGetInfo_v2", || {
        let _c = gpu.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: two valid out-pointers.
        unsafe { d.cu_mem_get_info(&mut free, &mut total) }
    })?;
    p.call("cuCtxSynchronize", || {
        let _c = gpu.bind()?;
        d.cu_ctx_synchronize()
    })?;
    Ok(())
}
