//! `xproc-cuda`: the CUDA IPC path a process would take instead of attaching: load the driver
//! and `cuInit`, retain the device's primary context, `cuIpcOpenMemHandle` the owner's
//! `cuMemAlloc` allocation, then `--updates` 64-byte `cuMemcpyHtoD` from a pageable buffer (each
//! timed), [`final_pattern`](super::attach::final_pattern) written last for the owner to check;
//! it holds the mapping until told to quit.

use std::time::Instant;

use vkgdr::cuda::{ContextGuard, Driver, IpcMemHandle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS};

use super::attach::{final_pattern, uuid};
use serde::{Deserialize, Serialize};

use super::protocol::{say, Line};
use super::{Commands, Context, Outcome};

/// A `CUipcMemHandle` as 128 hex digits (how the owner passes it on the command line).
pub fn handle_to_hex(h: &IpcMemHandle) -> String {
    h.reserved.iter().map(|b| format!("{b:02x}")).collect()
}

/// The handle of 128 hex digits.
pub fn handle_from_hex(s: &str) -> Result<IpcMemHandle, String> {
    if s.len() != 128 || !s.is_ascii() {
        return Err("a CUipcMemHandle: 128 hex digits".into());
    }
    let mut h = IpcMemHandle { reserved: [0; 64] };
    for (i, b) in h.reserved.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
            .map_err(|_| "a CUipcMemHandle: 128 hex digits".to_string())?;
    }
    Ok(h)
}

/// `xproc-cuda`'s options.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct CudaArgs {
    /// The GPU's UUID (the CUDA device is found by it)
    #[arg(long, value_name = "UUID", value_parser = uuid)]
    pub uuid: [u8; 16],
    /// The owner's cuIpcGetMemHandle, 128 hex digits
    #[arg(long, value_name = "HEX", value_parser = handle_from_hex)]
    pub handle: IpcMemHandle,
    /// 64-byte cuMemcpyHtoD updates to time
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub updates: u64,
}

/// What a CUDA IPC child says once done (its `cuda` line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Opened {
    /// Loading the library and `cuInit`.
    pub init_ns: f64,
    /// `cuDevicePrimaryCtxRetain` and making it current.
    pub context_ns: f64,
    /// `cuIpcOpenMemHandle`.
    pub open_ns: f64,
    /// Each 64-byte update.
    pub update_ns: Vec<f64>,
}

/// The role (see the module docs). Says `cuda` ([`Opened`]), then `holding`.
pub fn run(a: &CudaArgs) -> Outcome {
    let commands = Commands::start()?;
    let t = Instant::now();
    let driver = Driver::get().ctx("loading libcuda and cuInit")?;
    let init_ns = t.elapsed().as_nanos() as f64;
    let count = driver.device_count().ctx("cuDeviceGetCount")?;
    let mut device = None;
    for i in 0..count {
        let d = driver.device(i).ctx("cuDeviceGet")?;
        if driver.device_uuid(d).ctx("cuDeviceGetUuid")? == a.uuid {
            device = Some(d);
        }
    }
    let device = device.ok_or_else(|| {
        format!(
            "no CUDA device with UUID {} among {count}",
            vkgdr::vulkan::format_uuid(&a.uuid)
        )
    })?;
    let t = Instant::now();
    let context = driver
        .cu_device_primary_ctx_retain(device)
        .ctx("cuDevicePrimaryCtxRetain")?;
    // SAFETY: the primary context retained above stays alive until it is released below, after
    // the guard is gone.
    let guard = unsafe { ContextGuard::push(&driver, context) }.ctx("cuCtxPushCurrent")?;
    let context_ns = t.elapsed().as_nanos() as f64;
    let t = Instant::now();
    // SAFETY: a context is current; the handle names an allocation the owner keeps until this
    // process has exited.
    let ptr =
        unsafe { driver.cu_ipc_open_mem_handle(a.handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) }
            .ctx("cuIpcOpenMemHandle")?;
    let open_ns = t.elapsed().as_nanos() as f64;
    let mut update_ns = Vec::with_capacity(a.updates as usize);
    let mut bytes = [0u8; 64];
    let copy = |bytes: &[u8; 64]| {
        // SAFETY: `ptr` maps the owner's allocation (2 MiB, more than 64 bytes) into the current
        // context; `bytes` is 64 readable bytes that outlive the synchronous copy.
        unsafe { driver.cu_memcpy_htod(ptr, bytes.as_ptr().cast(), bytes.len()) }
            .ctx("cuMemcpyHtoD")
    };
    for k in 0..a.updates {
        bytes[..8].copy_from_slice(&k.to_le_bytes());
        let t = Instant::now();
        copy(&bytes)?;
        update_ns.push(t.elapsed().as_nanos() as f64);
    }
    copy(&final_pattern())?;
    let opened = Opened {
        init_ns,
        context_ns,
        open_ns,
        update_ns,
    };
    say(&Line::of("cuda", &opened));
    say(&Line::new("holding").with("pid", std::process::id()));
    commands.wait_quit()?;
    // SAFETY: opened above in this context, which is still current; nothing uses it any more.
    unsafe { driver.cu_ipc_close_mem_handle(ptr) }.ctx("cuIpcCloseMemHandle")?;
    drop(guard);
    // SAFETY: retained once above; its guard is gone.
    unsafe { driver.cu_device_primary_ctx_release(device) }.ctx("cuDevicePrimaryCtxRelease")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_survives_the_command_line() {
        let h = IpcMemHandle {
            reserved: std::array::from_fn(|i| (i * 37) as u8),
        };
        let text = handle_to_hex(&h);
        assert_eq!(text.len(), 128);
        assert_eq!(handle_from_hex(&text), Ok(h));
        assert!(handle_from_hex(&text[2..]).is_err());
        assert!(handle_from_hex(&"zz".repeat(64)).is_err());
        assert!(handle_from_hex(&"é".repeat(64)).is_err());
    }
}
