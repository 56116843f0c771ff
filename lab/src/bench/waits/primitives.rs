//! Facts the mapping layer's design rests on, measured once with no kernel running
//! ([`primitives`]): VMM calls from a thread with no current context, and copy-engine bandwidth
//! into and out of host memory mapped through VMM beside pinned memory.

use std::time::Instant;

use vkgdr::cuda_objects::Stream;
use vkgdr::vmm::ordinal_of;
use vkgdr::Gpu;

use super::probe::{import_fd, rw_access, Handle, SIZE};
use crate::bench::error::BenchResult;

/// Maps `mem` (a whole Vulkan allocation, a multiple of the granularity) into the device's
/// address space through VMM, with no context current on the calling thread when `bind` is false.
fn vmm_map(gpu: &Gpu, mem: &vkgdr::vulkan::VulkanMemory, bind: bool) -> vkgdr::Result<(u64, u64)> {
    let d = gpu.driver();
    let _c = if bind { Some(gpu.bind()?) } else { None };
    // Asked first: a device without an ordinal leaves nothing mapped behind.
    let ordinal = ordinal_of(d, gpu.cu_device())?;
    let fd = mem.export_fd()?;
    let handle = import_fd(d, &fd)?;
    let size = mem.size() as usize;
    let va = d.cu_mem_address_reserve(size, SIZE as usize, 0, 0)?;
    // SAFETY: a fresh reservation of exactly the handle's size.
    unsafe { d.cu_mem_map(va, size, 0, handle, 0) }?;
    let access = rw_access(ordinal);
    // SAFETY: just mapped; one descriptor alive for the call.
    unsafe { d.cu_mem_set_access(va, size, &access, 1) }?;
    Ok((va, handle))
}

fn vmm_unmap(gpu: &Gpu, va: u64, handle: u64, size: u64, bind: bool) -> vkgdr::Result<()> {
    let d = gpu.driver();
    let _c = if bind { Some(gpu.bind()?) } else { None };
    // SAFETY: mapped by `vmm_map` with this size and handle, no longer used.
    unsafe {
        d.cu_mem_unmap(va, size as usize)?;
        d.cu_mem_release(handle)?;
        d.cu_mem_address_free(va, size as usize)
    }
}

/// Facts the mapping layer's design rests on, measured once with no kernel running.
pub(super) fn primitives(gpu: &Gpu) -> BenchResult<Vec<String>> {
    let mut notes = Vec::new();
    // VMM calls from a thread with no current context (what releasing memory of a context that
    // may be gone by then needs).
    let no_context = std::thread::scope(|s| {
        s.spawn(|| -> vkgdr::Result<()> {
            let mem = gpu.vulkan().allocate(SIZE)?;
            let (va, handle) = vmm_map(gpu, &mem, false)?;
            vmm_unmap(gpu, va, handle, SIZE, false)
        })
        .join()
        .expect("no panic")
    });
    notes.push(format!(
        "VMM import, map, access, unmap, release with no current context: {}",
        match &no_context {
            Ok(()) => "work".to_string(),
            Err(e) => format!("fail ({e})"),
        }
    ));
    // Copy-engine bandwidth into and out of host memory mapped through VMM, beside pinned memory
    // from cuMemHostAlloc.
    let len: u64 = 64 << 20;
    let bar = gpu.alloc(len)?;
    let host = gpu.vulkan().allocate_host(len)?;
    let (va, handle) = vmm_map(gpu, &host, true)?;
    let stream = Stream::new(gpu)?;
    let d = gpu.driver();
    let pinned = {
        let _c = gpu.bind()?;
        Handle::of(d.cu_mem_alloc_host(len as usize, 0)?)
    };
    let time = |f: &dyn Fn() -> vkgdr::Result<()>| -> vkgdr::Result<f64> {
        f()?;
        stream.synchronize()?;
        let t = Instant::now();
        for _ in 0..5 {
            f()?;
        }
        stream.synchronize()?;
        Ok(5.0 * len as f64 / t.elapsed().as_nanos() as f64)
    };
    let s = stream.raw();
    let (bar_ptr, n) = (bar.device_ptr(), len as usize);
    let _c = gpu.bind()?;
    // Each copy: both ranges are live allocations of `len` bytes, alive until `time` has
    // synchronised the stream; the stream is ours and its context current.
    // SAFETY: as said.
    let dtod_host = time(&|| unsafe { d.cu_memcpy_dtod_async(va, bar_ptr, n, s) })?;
    // SAFETY: as above.
    let dtoh_pinned = time(&|| unsafe { d.cu_memcpy_dtoh_async(pinned.ptr(), bar_ptr, n, s) })?;
    // SAFETY: as above.
    let htod_host = time(&|| unsafe { d.cu_memcpy_dtod_async(bar_ptr, va, n, s) })?;
    // SAFETY: as above.
    let htod_pinned = time(&|| unsafe { d.cu_memcpy_htod_async(bar_ptr, pinned.ptr(), n, s) })?;
    notes.push(format!(
        "64 MiB device -> host: into VMM-mapped host memory {dtod_host:.1} GB/s, into cuMemHostAlloc memory {dtoh_pinned:.1} GB/s"
    ));
    notes.push(format!(
        "64 MiB host -> device: from VMM-mapped host memory {htod_host:.1} GB/s, from cuMemHostAlloc memory {htod_pinned:.1} GB/s"
    ));
    // SAFETY: ours, no copy in flight.
    unsafe { d.cu_mem_free_host(pinned.ptr()) }?;
    drop(_c);
    vmm_unmap(gpu, va, handle, len, true)?;
    Ok(notes)
}
