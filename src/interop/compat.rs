//! vkgdr 0.1's semantics, in one place for the members that are drop-ins for it: the C library
//! (`capi/`, `vkgdr.h`) and the Python package (`python/`, `import vkgdr`).
//!
//! What a program written for vkgdr 0.1 relies on, and what this module keeps:
//! - open flags with the same values ([`OPEN_CURRENT_CONTEXT_BIT`] = 1,
//!   [`OPEN_FORCE_NON_COHERENT_BIT`] = 2, [`OPEN_REQUIRE_COHERENT_BIT`] = 4); unknown bits are
//!   ignored, as vkgdr 0.1 ignores them;
//! - [`open`] on a `CUdevice` creates no CUDA context; with `OPEN_CURRENT_CONTEXT_BIT` it opens the
//!   device of the calling thread's current context, whatever kind of context that is (the
//!   runtime's primary context, or one from `cuCtxCreate` such as PyCUDA's default context);
//! - [`alloc`] imports into the calling thread's *current* context, reports the size asked for,
//!   and ignores its flags (vkgdr 0.1 defines none);
//! - error texts in vkgdr 0.1's form, `"<call> failed (<RESULT_NAME>)"` ([`message`]): an
//!   invalid device gives `cuDeviceGetUuid failed (CUDA_ERROR_INVALID_DEVICE)`, opening the
//!   current context with none current `cuCtxGetDevice failed (CUDA_ERROR_INVALID_CONTEXT)`, a
//!   10^15-byte allocation `vkAllocateMemory failed (VK_ERROR_OUT_OF_DEVICE_MEMORY)`. An
//!   allocation with no current context says more ([`Error::NoCurrentContext`]): the rule it
//!   broke and how to make a context current, worded for the [`Face`] that asked, before the
//!   driver's failure in that form.
//!
//! Where this library does better than vkgdr 0.1 and no correct program can tell: memory
//! remembers the context it was imported into and makes it current to free itself (vkgdr 0.1
//! needs the caller to have it current), flush and invalidate ranges are rounded to whole atoms
//! inside the allocation instead of being undefined behaviour, and their failures are reported.

use crate::driver::cuda::{CuContext, CuDevice, Driver};
use crate::error::{Error, Result};
use crate::mapping::gpu::{current_context, Gpu, OpenOptions};
use crate::mapping::memory::RawMemory;

/// Ignore the given device and use the calling thread's current CUDA context instead.
pub const OPEN_CURRENT_CONTEXT_BIT: u32 = 1;
/// Treat the memory as non-coherent even if it is coherent (for debugging only).
pub const OPEN_FORCE_NON_COHERENT_BIT: u32 = 2;
/// Fail unless the memory is guaranteed to be coherent.
pub const OPEN_REQUIRE_COHERENT_BIT: u32 = 4;
/// Every flag [`open`] knows.
pub const OPEN_FLAGS_ALL: u32 =
    OPEN_CURRENT_CONTEXT_BIT | OPEN_FORCE_NON_COHERENT_BIT | OPEN_REQUIRE_COHERENT_BIT;

/// The [`OpenOptions`] for vkgdr 0.1 open flags. Bits outside [`OPEN_FLAGS_ALL`] are ignored:
/// vkgdr 0.1 ignores them, and programs written for it may pass them.
pub fn open_options(flags: u32) -> OpenOptions {
    OpenOptions::new()
        .force_non_coherent(flags & OPEN_FORCE_NON_COHERENT_BIT != 0)
        .require_coherent(flags & OPEN_REQUIRE_COHERENT_BIT != 0)
}

/// `vkgdr_open(device, flags)`.
///
/// Without [`OPEN_CURRENT_CONTEXT_BIT`], `device` is a `CUdevice` handle and no context is
/// created: raw allocations go into whatever context is current when they are made, and the
/// device's primary context is retained only if a pool, ring or copy of this handle needs one
/// ([`Gpu::open_cu_device`]). With it, `device` is ignored and the handle works in the current
/// context: a primary context is retained for the handle's lifetime, any other context is used as
/// it is.
///
/// # Safety
/// - With [`OPEN_CURRENT_CONTEXT_BIT`] and a current context that is not its device's primary
///   context: that context must stay alive (not destroyed) as long as the handle, its clones or
///   anything allocated through them exist, as vkgdr 0.1 requires.
pub unsafe fn open(device: CuDevice, flags: u32) -> Result<Gpu> {
    let options = open_options(flags);
    if flags & OPEN_CURRENT_CONTEXT_BIT == 0 {
        return Gpu::open_cu_device(device, options);
    }
    let driver = Driver::get()?;
    let (current, device) = current_context(&driver)?;
    if is_primary(&driver, device, current)? {
        Gpu::open_current_context(options)
    } else {
        // SAFETY: forwarded to our caller.
        unsafe { Gpu::open_current_context_unchecked(options) }
    }
}

/// The drop-in a call comes from: an error that tells its caller what to do names that face's
/// own calls and remedies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Face {
    /// The C library (`vkgdr.h`).
    C,
    /// The Python package (`import vkgdr`).
    Python,
}

impl Face {
    /// What [`alloc`] with no current context tells this face's caller: the rule, and how to
    /// make a context current (or to use a pool, whose blocks need none).
    fn no_current_context(self) -> &'static str {
        match self {
            Face::C => {
                "vkgdr_memory_alloc needs a current CUDA context on the calling thread (vkgdr \
                 0.1's rule: the memory is allocated in that context), and this thread has \
                 none. Make one current first (the runtime's cudaSetDevice(n), or \
                 cuCtxSetCurrent / cuCtxPushCurrent), or allocate from a pool \
                 (vkgdr_pool_create on a handle from vkgdr_open(n, 0)), which needs none"
            }
            Face::Python => {
                "RawMemory needs a current CUDA context on the calling thread (vkgdr 0.1's \
                 rule: the memory is allocated in that context), and this thread has none. \
                 Make one current first (CuPy: cupy.cuda.runtime.setDevice(n); PyTorch: \
                 torch.cuda.synchronize(n); PyCUDA: ctx.push()), or allocate from a \
                 vkgdr.Pool(vkgdr.Vkgdr(n)), which needs none"
            }
        }
    }
}

/// `vkgdr_memory_alloc(g, size, flags)`: `size` bytes imported into the calling thread's current
/// context ([`Gpu::alloc_in_current_context`]). `flags` is ignored: vkgdr 0.1 defines no
/// allocation flag and ignores the argument.
///
/// With no context current the error is [`Error::NoCurrentContext`], which tells `face`'s
/// caller how to make one current; its driver call and result name are the driver's
/// (`cuCtxGetDevice`, `CUDA_ERROR_INVALID_CONTEXT`), and its message ends with them in vkgdr
/// 0.1's form.
///
/// # Safety
/// - The current context must stay alive until the memory is dropped.
pub unsafe fn alloc(gpu: &Gpu, size: u64, flags: u32, face: Face) -> Result<RawMemory> {
    let _ = flags;
    // SAFETY: forwarded to our caller.
    unsafe { gpu.alloc_in_current_context(size) }.map_err(|e| explain_no_context(e, face))
}

/// [`Error::NoCurrentContext`] for the driver's answer to a thread with no current context
/// (`cuCtxGetDevice` failing with `CUDA_ERROR_INVALID_CONTEXT`); any other error unchanged.
fn explain_no_context(e: Error, face: Face) -> Error {
    match e {
        Error::Cuda { call, code, name }
            if call == "cuCtxGetDevice" && name == "CUDA_ERROR_INVALID_CONTEXT" =>
        {
            Error::NoCurrentContext {
                explanation: face.no_current_context(),
                call,
                code,
                name,
            }
        }
        e => e,
    }
}

/// An error as vkgdr 0.1 words it: `"<call> failed (<RESULT_NAME>)"` for what a driver returned,
/// this library's own message otherwise. [`Error::NoCurrentContext`] explains itself first and
/// ends with that text.
pub fn message(e: &Error) -> String {
    match (e, e.driver_call(), e.result_name()) {
        (Error::NoCurrentContext { .. }, ..) => e.to_string(),
        (_, Some(call), Some(name)) => format!("{call} failed ({name})"),
        _ => e.to_string(),
    }
}

/// Whether `context` is `device`'s primary context, without creating the primary context when
/// it does not exist yet (then `context` cannot be it).
fn is_primary(driver: &Driver, device: CuDevice, context: CuContext) -> Result<bool> {
    let (mut flags, mut active) = (0, 0);
    // SAFETY: `device` came from the driver (cuCtxGetDevice); two valid out-pointers.
    unsafe { driver.cu_device_primary_ctx_get_state(device, &mut flags, &mut active) }?;
    if active == 0 {
        return Ok(false);
    }
    // Balanced by the release just below.
    let primary = driver.cu_device_primary_ctx_retain(device)?;
    // SAFETY: balances the retain above; the primary context is active, so it stays alive.
    let _ = unsafe { driver.cu_device_primary_ctx_release(device) };
    Ok(primary == context)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::MemorySide;

    #[test]
    fn flags_map_to_options_and_unknown_bits_are_ignored() {
        let o = open_options(OPEN_FORCE_NON_COHERENT_BIT);
        assert!(o.memory_options().force_non_coherent && !o.memory_options().require_coherent);
        let o = open_options(OPEN_REQUIRE_COHERENT_BIT | OPEN_CURRENT_CONTEXT_BIT);
        assert!(o.memory_options().require_coherent && !o.memory_options().force_non_coherent);
        for unknown in [8, 0x10, 0x8000_0000] {
            let o = open_options(unknown).memory_options();
            assert!(!o.require_coherent && !o.force_non_coherent, "{unknown:#x}");
        }
        let o = open_options(u32::MAX).memory_options();
        assert!(o.require_coherent && o.force_non_coherent);
    }

    #[test]
    fn messages_take_vkgdr_0_1_form_for_driver_errors() {
        let cuda = Error::Cuda {
            call: "cuDeviceGetUuid",
            code: 101,
            name: "CUDA_ERROR_INVALID_DEVICE".into(),
        };
        assert_eq!(
            message(&cuda),
            "cuDeviceGetUuid failed (CUDA_ERROR_INVALID_DEVICE)"
        );
        let oom = Error::OutOfDeviceMemory {
            side: MemorySide::Vulkan,
            call: "vkAllocateMemory",
            size: 1_000_000_000_000_000,
            result: "VK_ERROR_OUT_OF_DEVICE_MEMORY (above maxMemoryAllocationSize 4)".into(),
        };
        assert_eq!(
            message(&oom),
            "vkAllocateMemory failed (VK_ERROR_OUT_OF_DEVICE_MEMORY)"
        );
        let limit = Error::OutOfDeviceMemory {
            side: MemorySide::Limit,
            call: "Pool::alloc",
            size: 1,
            result: "max_bytes 0".into(),
        };
        assert_eq!(message(&limit), limit.to_string());
        let missing = Error::LibraryNotFound {
            name: "libcuda.so.1",
            reason: "libcuda.so.1: cannot open shared object file".into(),
        };
        assert!(message(&missing).contains("libcuda.so.1: cannot open shared object file"));
    }

    fn no_context() -> Error {
        Error::Cuda {
            call: "cuCtxGetDevice",
            code: 201,
            name: "CUDA_ERROR_INVALID_CONTEXT".into(),
        }
    }

    #[test]
    fn an_allocation_with_no_current_context_says_what_is_missing_and_how_to_fix_it() {
        for (face, starts, fixes) in [
            (
                Face::Python,
                "RawMemory needs a current CUDA context on the calling thread (vkgdr 0.1's rule",
                &[
                    "cupy.cuda.runtime.setDevice(n)",
                    "ctx.push()",
                    "vkgdr.Pool(",
                ][..],
            ),
            (
                Face::C,
                "vkgdr_memory_alloc needs a current CUDA context on the calling thread (vkgdr \
                 0.1's rule",
                &["cudaSetDevice(n)", "cuCtxSetCurrent", "vkgdr_pool_create"][..],
            ),
        ] {
            let e = explain_no_context(no_context(), face);
            let text = message(&e);
            assert!(text.starts_with(starts), "{text}");
            assert!(text.contains("and this thread has none"), "{text}");
            for fix in fixes {
                assert!(text.contains(fix), "{fix}: {text}");
            }
            // 0.1's text for the driver's failure ends it; the parts stay the driver's.
            assert!(
                text.ends_with(". cuCtxGetDevice failed (CUDA_ERROR_INVALID_CONTEXT)"),
                "{text}"
            );
            assert_eq!(text, e.to_string());
            assert_eq!(e.driver_call(), Some("cuCtxGetDevice"));
            assert_eq!(e.result_name(), Some("CUDA_ERROR_INVALID_CONTEXT"));
        }
    }

    #[test]
    fn other_allocation_errors_are_not_explained() {
        let elsewhere = Error::Cuda {
            call: "cuImportExternalMemory",
            code: 201,
            name: "CUDA_ERROR_INVALID_CONTEXT".into(),
        };
        let e = explain_no_context(elsewhere, Face::Python);
        assert_eq!(
            message(&e),
            "cuImportExternalMemory failed (CUDA_ERROR_INVALID_CONTEXT)"
        );
        let device = Error::Cuda {
            call: "cuCtxGetDevice",
            code: 101,
            name: "CUDA_ERROR_INVALID_DEVICE".into(),
        };
        let e = explain_no_context(device, Face::C);
        assert_eq!(
            message(&e),
            "cuCtxGetDevice failed (CUDA_ERROR_INVALID_DEVICE)"
        );
    }
}
