//! What attaching costs another process, and what it holds of the GPU's memory: processes that
//! attach a 2 MiB region through Vulkan (`xproc-attach`, no CUDA) beside processes that open a
//! 2 MiB `cuMemAlloc` allocation through CUDA IPC (`xproc-cuda`). Each child is started on its
//! own, says its timings, then holds what it attached while the owner reads its GPU memory
//! (NVML's per-process figure, or the drop of the free VRAM while it holds) and checks that its
//! last 64-byte write arrived.

use std::time::Duration;

use vkgdr::share::ShareServer;
use vkgdr::vulkan::format_uuid;
use vkgdr::{Gpu, Mapping};

use super::{child_error, DONE_TIMEOUT, FINISH_TIMEOUT};
use crate::bench::error::{BenchError, BenchResult};
use crate::child::attach::{final_pattern, Attached, WRITES_PER_SAMPLE};
use crate::child::cuda_ipc::{handle_to_hex, Opened};
use crate::child::process::{ChildProcess, Spawn};

/// Bytes of the region attached (and of the allocation opened through CUDA IPC).
pub(super) const REGION_BYTES: u64 = 2 << 20;
/// The name the owner shares it under.
const REGION: &str = "xproc-region";

/// A child's GPU memory while it holds what it attached: NVML's figure for its pid (if NVML
/// lists it with one) and how much the free VRAM dropped since before it started.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Held {
    pub(super) nvml: Option<u64>,
    pub(super) vram_drop: u64,
}

/// What the Vulkan children measured, all of them together.
#[derive(Debug, Default)]
pub(super) struct VulkanSide {
    /// `VulkanContext::new` per child.
    pub(super) device_ns: Vec<f64>,
    /// Every attach.
    pub(super) attach_ns: Vec<f64>,
    /// Device and first attach, per child.
    pub(super) first_ns: Vec<f64>,
    /// 64-byte writes, ns per write (samples of [`WRITES_PER_SAMPLE`]).
    pub(super) write_ns: Vec<f64>,
    pub(super) held: Vec<Held>,
}

/// What the CUDA IPC children measured.
#[derive(Debug, Default)]
pub(super) struct CudaSide {
    /// Library load and `cuInit` per child.
    pub(super) init_ns: Vec<f64>,
    /// The primary context per child.
    pub(super) context_ns: Vec<f64>,
    /// `cuIpcOpenMemHandle` per child.
    pub(super) open_ns: Vec<f64>,
    /// 64-byte `cuMemcpyHtoD`, each.
    pub(super) update_ns: Vec<f64>,
    pub(super) held: Vec<Held>,
}

/// The child's memory now (it holds what it attached), against `free_before`.
fn held(gpu: &Gpu, pid: u32, free_before: u64) -> BenchResult<Held> {
    let nvml = gpu
        .processes()
        .ok()
        .and_then(|list| list.into_iter().find(|p| p.pid == pid))
        .and_then(|p| p.used_bytes);
    let free_now = gpu.mem_info()?.0;
    Ok(Held {
        nvml,
        vram_drop: free_before.saturating_sub(free_now),
    })
}

/// `children` Vulkan children one after the other, each attaching `attaches` times and writing
/// `writes` times.
pub(super) fn vulkan(
    gpu: &Gpu,
    server: &ShareServer,
    children: u32,
    attaches: u64,
    writes: u64,
) -> BenchResult<VulkanSide> {
    let mut region = gpu.alloc_shareable(REGION_BYTES)?;
    region.fill(0, REGION_BYTES, 0)?;
    server.share_memory(REGION, &region)?;
    let measured = (|| {
        let mut side = VulkanSide::default();
        for k in 0..children {
            region.write(0, &[0; 64])?;
            let free_before = gpu.mem_info()?.0;
            let mut c = ChildProcess::spawn(Spawn {
                name: format!("attaching process {k}"),
                args: vec![
                    "xproc-attach".into(),
                    format!("--socket={}", server.path().display()),
                    format!("--region={REGION}"),
                    format!("--uuid={}", format_uuid(&gpu.uuid())),
                    format!("--attaches={attaches}"),
                    format!("--writes={}", writes.max(WRITES_PER_SAMPLE)),
                ],
                no_cuda: true,
                keep_fd: None,
            })?;
            let line = c.expect("attach", DONE_TIMEOUT * 2)?;
            let done: Attached = line.read().map_err(|e| child_error(&c, e))?;
            c.expect("holding", DONE_TIMEOUT)?;
            side.held.push(held(gpu, c.pid(), free_before)?);
            let mut seen = [0u8; 64];
            region.read(0, &mut seen)?;
            if seen != final_pattern() {
                return Err(child_error(
                    &c,
                    "wrote 64 bytes the owner did not find in its memory".into(),
                )
                .into());
            }
            let (device, each) = (done.vulkan_ns, done.attach_ns);
            if each.len() as u64 != attaches {
                return Err(child_error(
                    &c,
                    format!("timed {} attaches, not {attaches}", each.len()),
                )
                .into());
            }
            side.device_ns.push(device);
            side.first_ns.push(device + each[0]);
            side.attach_ns.extend(each);
            let mut w = done.write_ns;
            w.drain(..w.len() / 10);
            side.write_ns.extend(w);
            c.finish(FINISH_TIMEOUT)?;
        }
        Ok::<_, BenchError>(side)
    })();
    server.unshare(REGION);
    measured
}

/// 2 MiB of `cuMemAlloc` memory (what CUDA IPC shares), freed on drop.
struct CuAllocation<'a> {
    gpu: &'a Gpu,
    ptr: u64,
}

impl<'a> CuAllocation<'a> {
    fn new(gpu: &'a Gpu, size: usize) -> BenchResult<CuAllocation<'a>> {
        let _ctx = gpu.bind()?;
        let ptr = gpu.driver().cu_mem_alloc(size)?;
        let a = CuAllocation { gpu, ptr };
        // SAFETY: `size` bytes of the allocation just made, 4-aligned.
        unsafe { gpu.driver().cu_memset_d32(ptr, 0, size / 4) }?;
        Ok(a)
    }

    fn read64(&self) -> BenchResult<[u8; 64]> {
        let _ctx = self.gpu.bind()?;
        let mut out = [0u8; 64];
        // SAFETY: the first 64 bytes of the live allocation into a local; synchronous.
        unsafe {
            self.gpu
                .driver()
                .cu_memcpy_dtoh(out.as_mut_ptr().cast(), self.ptr, 64)
        }?;
        Ok(out)
    }

    fn clear64(&self) -> BenchResult<()> {
        let _ctx = self.gpu.bind()?;
        // SAFETY: the first 64 bytes of the live allocation.
        unsafe { self.gpu.driver().cu_memset_d32(self.ptr, 0, 16) }?;
        Ok(())
    }
}

impl Drop for CuAllocation<'_> {
    fn drop(&mut self) {
        let Ok(_ctx) = self.gpu.bind() else { return };
        // SAFETY: ours, freed once; the children that opened it have exited, and no kernel uses
        // it.
        let _ = unsafe { self.gpu.driver().cu_mem_free(self.ptr) };
    }
}

/// `children` CUDA IPC children one after the other, each opening a 2 MiB allocation of this
/// process and timing `updates` 64-byte copies into it.
pub(super) fn cuda(gpu: &Gpu, children: u32, updates: u64) -> BenchResult<CudaSide> {
    let alloc = CuAllocation::new(gpu, REGION_BYTES as usize)?;
    let handle = {
        let _ctx = gpu.bind()?;
        // SAFETY: a live `cuMemAlloc` allocation of the current context.
        unsafe { gpu.driver().cu_ipc_get_mem_handle(alloc.ptr) }?
    };
    let mut side = CudaSide::default();
    for k in 0..children {
        alloc.clear64()?;
        let free_before = gpu.mem_info()?.0;
        let mut c = ChildProcess::spawn(Spawn {
            name: format!("CUDA IPC process {k}"),
            args: vec![
                "xproc-cuda".into(),
                format!("--uuid={}", format_uuid(&gpu.uuid())),
                format!("--handle={}", handle_to_hex(&handle)),
                format!("--updates={updates}"),
            ],
            no_cuda: false,
            keep_fd: None,
        })?;
        let line = c.expect("cuda", DONE_TIMEOUT * 2)?;
        let done: Opened = line.read().map_err(|e| child_error(&c, e))?;
        c.expect("holding", DONE_TIMEOUT)?;
        side.held.push(held(gpu, c.pid(), free_before)?);
        if alloc.read64()? != final_pattern() {
            return Err(child_error(
                &c,
                "copied 64 bytes the owner did not find in its memory".into(),
            )
            .into());
        }
        side.init_ns.push(done.init_ns);
        side.context_ns.push(done.context_ns);
        side.open_ns.push(done.open_ns);
        let mut u = done.update_ns;
        u.drain(..u.len() / 10);
        side.update_ns.extend(u);
        c.finish(FINISH_TIMEOUT)?;
    }
    // The children are gone: the allocation may go (a short wait lets the driver drop their
    // mappings first).
    std::thread::sleep(Duration::from_millis(10));
    drop(alloc);
    Ok(side)
}
