//! `vkgdr_open`, `vkgdr_close` (vkgdr 0.1) and `vkgdr_open_vulkan` (the Vulkan half alone),
//! and what a handle's releases wait for (`vkgdr_wait_for_releases`, `vkgdr_get_release_times`).

use std::ffi::{c_char, c_int};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use ::vkgdr::compat;
use ::vkgdr::vulkan::{DeviceSelector, VulkanContext};
use ::vkgdr::{Gpu, ReleaseTimes, SlowRelease, SpareLimits};

use crate::error::{clear_last_error, guard, CResult, Failure};
use crate::handles::{HandleTable, Tag};
use crate::versioned::{self, Versioned};
use crate::{
    copy_text, lookup, register, release, write_optional, CUdevice, VKGDR_ERROR, VKGDR_SUCCESS,
};

/// Opaque handle to the library: one device opened for BAR mappings.
pub struct vkgdr {
    _private: [u8; 0],
}

/// Opaque handle to the library, from `vkgdr_open` or `vkgdr_open_vulkan`; freed with
/// `vkgdr_close`.
pub type vkgdr_t = *mut vkgdr;

/// Valid flags to pass to `vkgdr_open` (and, except `VKGDR_OPEN_CURRENT_CONTEXT_BIT`, to
/// `vkgdr_open_vulkan`). Other bits are ignored, as in vkgdr 0.1.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub enum vkgdr_open_flags {
    /// Ignore the given device and use the calling thread's current CUDA context instead.
    VKGDR_OPEN_CURRENT_CONTEXT_BIT = 1,
    /// Treat the memory as non-coherent even if it is coherent (for debugging only).
    VKGDR_OPEN_FORCE_NON_COHERENT_BIT = 2,
    /// Fail unless the memory is guaranteed to be coherent.
    VKGDR_OPEN_REQUIRE_COHERENT_BIT = 4,
}

/// What a `vkgdr_t` opened.
pub enum Device {
    /// A CUDA device with its Vulkan twin (`vkgdr_open`).
    Cuda(Gpu),
    /// A Vulkan device only (`vkgdr_open_vulkan`): host pointers, no CUDA device pointers.
    Vulkan(Arc<VulkanContext>),
}

impl Device {
    /// The CUDA side, or the error for a Vulkan-only handle.
    pub fn gpu(&self) -> CResult<&Gpu> {
        match self {
            Device::Cuda(g) => Ok(g),
            Device::Vulkan(_) => Err(Failure::Api(
                "this vkgdr_t has no CUDA device (it was opened with vkgdr_open_vulkan)".into(),
            )),
        }
    }
}

/// Live `vkgdr_t` handles.
pub static DEVICES: LazyLock<HandleTable<Device>> = LazyLock::new(|| HandleTable::new(Tag::Device));

/// The device behind `g`.
///
/// # Safety
/// - No thread closes `g` while the reference is in use.
pub unsafe fn device<'a>(g: vkgdr_t) -> CResult<&'a Device> {
    // SAFETY: forwarded to our caller.
    unsafe { lookup(&DEVICES, g) }
}

/// Obtains a handle to the library.
///
/// - `device`: the CUDA device whose memory to allocate (ignored if `flags` contains
///   `VKGDR_OPEN_CURRENT_CONTEXT_BIT`). No CUDA context is created: raw allocations go into the
///   context current when they are made; pools and rings of this handle use the device's primary
///   context (retained the first time one needs it).
/// - `flags`: a bitwise OR of `vkgdr_open_flags`. With `VKGDR_OPEN_CURRENT_CONTEXT_BIT` the
///   calling thread's current context is used, whatever kind it is (the runtime's primary
///   context, or one from `cuCtxCreate`); pools and rings of the handle then live in that
///   context, which must outlive the handle and everything allocated through it. Other bits
///   are ignored, as vkgdr 0.1 ignores them.
///
/// Clears the calling thread's last error first (as vkgdr 0.1 does), so after this call
/// `vkgdr_last_error()` is `NULL` exactly when it succeeded.
///
/// Returns a handle, or `NULL` on error (`vkgdr_last_error()` says why: e.g.
/// `cuDeviceGetUuid failed (CUDA_ERROR_INVALID_DEVICE)` for an invalid device,
/// `cuCtxGetDevice failed (CUDA_ERROR_INVALID_CONTEXT)` with no current context, the missing
/// `libcuda.so.1` or `libvulkan.so.1`).
///
/// Thread safety: any thread. The handle may be used from many threads at once.
/// Free it with `vkgdr_close`.
///
/// # Safety
/// - With `VKGDR_OPEN_CURRENT_CONTEXT_BIT` and a context from `cuCtxCreate`: that context must
///   stay alive until the handle and everything allocated through it are freed.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_open(device: CUdevice, flags: u32) -> vkgdr_t {
    guard("vkgdr_open", std::ptr::null_mut(), || {
        clear_last_error();
        // SAFETY: the context-lifetime obligation is forwarded to our caller.
        let gpu = unsafe { compat::open(device, flags) }?;
        register(&DEVICES, Device::Cuda(gpu))
    })
}

/// Opens the Vulkan half only, on a machine with or without CUDA: `vkgdr_pool_create` works on
/// such a handle (its blocks have host pointers and device pointer 0); `vkgdr_memory_alloc` and
/// `vkgdr_ring_create` fail, as they need CUDA. For tests (Mesa's lavapipe) and programs that
/// only need Vulkan's exportable host-visible memory.
///
/// - `vulkan_device`: index in Vulkan's physical-device order, or -1 for the first device with
///   exportable host-visible device-local memory.
/// - `flags`: `VKGDR_OPEN_FORCE_NON_COHERENT_BIT` and/or `VKGDR_OPEN_REQUIRE_COHERENT_BIT`;
///   `VKGDR_OPEN_CURRENT_CONTEXT_BIT` is an error (it needs CUDA), other bits are ignored as
///   `vkgdr_open` ignores them.
///
/// Clears the calling thread's last error first, like `vkgdr_open`.
///
/// Returns a handle, or `NULL` on error (see `vkgdr_last_error()`).
///
/// Thread safety: any thread; the handle may be used from many threads. Free it with
/// `vkgdr_close`.
///
/// # Safety
/// - None beyond the C calling convention.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_open_vulkan(vulkan_device: c_int, flags: u32) -> vkgdr_t {
    guard("vkgdr_open_vulkan", std::ptr::null_mut(), || {
        clear_last_error();
        if flags & compat::OPEN_CURRENT_CONTEXT_BIT != 0 {
            return Err(Failure::Api(
                "VKGDR_OPEN_CURRENT_CONTEXT_BIT needs CUDA: use vkgdr_open".into(),
            ));
        }
        let options = compat::open_options(flags);
        let selector = match usize::try_from(vulkan_device) {
            Ok(i) => DeviceSelector::Index(i),
            Err(_) if vulkan_device == -1 => DeviceSelector::FirstSuitable,
            Err(_) => {
                return Err(Failure::Api(format!(
                    "vulkan_device {vulkan_device} is neither an index nor -1"
                )))
            }
        };
        let vulkan = VulkanContext::new(selector, options.memory_options())?;
        register(&DEVICES, Device::Vulkan(vulkan))
    })
}

/// Closes a handle from `vkgdr_open` or `vkgdr_open_vulkan`. `NULL` is ignored.
///
/// Unlike vkgdr 0.1 this may be called while allocations, pools or rings made through the handle
/// are still alive: they keep the device open until they are freed themselves.
///
/// Errors (reported through `vkgdr_last_error()` only): a handle already closed or not a
/// `vkgdr_t`.
///
/// Thread safety: any thread, but not while another thread is using the same handle.
///
/// # Safety
/// - No other thread uses `g` during or after the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_close(g: vkgdr_t) {
    guard("vkgdr_close", (), || release(&DEVICES, g))
}

/// Releases of memory allocated through `g` (raw memory, pool chunks and blocks, rings) that
/// still wait for GPU work queued before them: frees never wait for a running kernel, they fence
/// on a stream (the legacy default stream, or the one named to `vkgdr_memory_free_after`,
/// `vkgdr_block_free_after` or `vkgdr_ring_watch_consumer`), and the memory stays in use until
/// the GPU has passed that point. This waits up to `timeout_ns` for that count to reach 0, for
/// tests and orderly shutdown; nothing else needs it. `vkgdr_get_release_times` says which
/// release has waited longest, and for how long.
///
/// - `timeout_ns`: 0 only counts (after handing back what is due), negative waits until none is
///   left (for ever, while a kernel holds a stream back).
///
/// Returns the number still waiting (0 once everything is released); 0 also for a
/// `vkgdr_open_vulkan` handle, which has no GPU work to wait for. `SIZE_MAX` on error (an
/// invalid handle).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread closes `g` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_wait_for_releases(g: vkgdr_t, timeout_ns: i64) -> usize {
    guard("vkgdr_wait_for_releases", usize::MAX, || {
        // SAFETY: the caller does not close `g` during the call.
        let gpu = match unsafe { device(g) }? {
            Device::Cuda(gpu) => gpu.clone(),
            Device::Vulkan(_) => return Ok(0),
        };
        match u64::try_from(timeout_ns) {
            Ok(ns) => {
                gpu.wait_for_releases(Duration::from_nanos(ns));
            }
            Err(_) => while !gpu.wait_for_releases(Duration::from_secs(1)) {},
        }
        Ok(gpu.pending_releases())
    })
}

/// Bytes of `vkgdr_slow_release.what`, its NUL included.
pub const VKGDR_SLOW_RELEASE_WHAT: usize = 64;

/// One release and how long it took, or has taken so far (a field of `vkgdr_release_times`).
/// All zero when there is none: `what[0] == 0` says so.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct vkgdr_slow_release {
    /// How long, in nanoseconds; 0 when there is none.
    pub time_ns: u64,
    /// What was released: the library's type name without module paths (`Backing`,
    /// `Arc<RingMemory>`, `ReleasedChunk`), NUL-terminated, cut at a UTF-8 character when longer
    /// than `VKGDR_SLOW_RELEASE_WHAT - 1` bytes; empty when there is none.
    pub what: [c_char; VKGDR_SLOW_RELEASE_WHAT],
}

impl vkgdr_slow_release {
    /// The C form of one entry of [`ReleaseTimes`]: all zero for `None`.
    fn of(slow: Option<SlowRelease>) -> Self {
        let mut out = vkgdr_slow_release {
            time_ns: 0,
            what: [0; VKGDR_SLOW_RELEASE_WHAT],
        };
        if let Some(s) = slow {
            out.time_ns = u64::try_from(s.time.as_nanos()).unwrap_or(u64::MAX);
            copy_text(&mut out.what, &s.what());
        }
        out
    }
}

/// How the releases of a handle's memory went (`vkgdr_get_release_times`): those waiting now,
/// and the slowest so far. Set `struct_size` to `sizeof(vkgdr_release_times)` before the call.
///
/// Only releases that waited in the release queue count: one whose GPU work was done when it
/// was made frees its memory at once. A queued release first waits for the GPU work queued
/// before it (on the legacy and blocking streams, or on the stream named to a `_free_after`
/// call or `vkgdr_ring_watch_consumer`): one that waits for seconds names work that does not
/// end, such as a kernel there that runs on. Then it waits for its turn: the queue hands out
/// one release at a time to whichever thread polls, so a drop that takes long (unmapping a
/// large allocation) holds back the releases behind it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct vkgdr_release_times {
    /// `sizeof(vkgdr_release_times)` as the caller was compiled.
    pub struct_size: usize,
    /// Releases waiting now, for their GPU work or in a drop (what `vkgdr_wait_for_releases`
    /// counts).
    pub waiting: u64,
    /// The queued release that has waited longest of those waiting now (for its GPU work, or
    /// for its turn to be dropped), and for how long so far.
    pub oldest_waiting: vkgdr_slow_release,
    /// The drop under way now that began first, and how long it has taken so far.
    pub longest_dropping: vkgdr_slow_release,
    /// The longest any release waited for the GPU work queued before it (as often as the queue
    /// looked: at least every millisecond, and between two drops).
    pub longest_wait: vkgdr_slow_release,
    /// The longest a release whose GPU work was done waited for its turn to be dropped: behind
    /// other drops, until a thread that polls took it.
    pub longest_turn: vkgdr_slow_release,
    /// The longest the drop of released memory took (unmapping it, giving it back to the
    /// driver or its pool).
    pub longest_drop: vkgdr_slow_release,
}

// SAFETY: integers only (the names are arrays of `char`); `struct_size` first.
unsafe impl Versioned for vkgdr_release_times {
    const NAME: &'static str = "vkgdr_release_times";
}

impl vkgdr_release_times {
    fn of(t: ReleaseTimes) -> Self {
        vkgdr_release_times {
            struct_size: std::mem::size_of::<Self>(),
            waiting: t.waiting as u64,
            oldest_waiting: vkgdr_slow_release::of(t.oldest_waiting),
            longest_dropping: vkgdr_slow_release::of(t.longest_dropping),
            longest_wait: vkgdr_slow_release::of(t.longest_wait),
            longest_turn: vkgdr_slow_release::of(t.longest_turn),
            longest_drop: vkgdr_slow_release::of(t.longest_drop),
        }
    }
}

/// Fills `*times` (whose `struct_size` the caller sets) with how the releases of memory
/// allocated through `g` went: how many wait now (as `vkgdr_wait_for_releases` counts them), the
/// one that has waited longest of those, and the slowest so far (see `vkgdr_release_times`).
/// For finding what holds memory back, e.g. a kernel that never ends on the stream a free
/// waits for. Takes a lock of the release queue briefly; waits for nothing.
///
/// Returns `VKGDR_SUCCESS` (for a `vkgdr_open_vulkan` handle with every field but
/// `struct_size` 0: its releases wait for no GPU work), or `VKGDR_ERROR` (`times` NULL or its
/// `struct_size` unset, checked first; an invalid handle).
///
/// Thread safety: any thread.
///
/// # Safety
/// - `times` is NULL or writable for `times->struct_size` bytes.
/// - No thread closes `g` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_get_release_times(
    g: vkgdr_t,
    times: *mut vkgdr_release_times,
) -> c_int {
    guard("vkgdr_get_release_times", VKGDR_ERROR, || {
        // SAFETY: NULL or readable for its struct_size (caller).
        unsafe { versioned::check(times) }?;
        // SAFETY: the caller does not close `g` during the call.
        let t = match unsafe { device(g) }? {
            Device::Cuda(gpu) => gpu.release_times(),
            Device::Vulkan(_) => ReleaseTimes::default(),
        };
        // SAFETY: writable for its struct_size (caller).
        unsafe { versioned::write(times, &vkgdr_release_times::of(t)) }?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Gives back to the driver what `g` keeps for later allocations: the empty shared granule small
/// allocations (up to 1 MiB) are carved from, and the mappings of larger freed allocations kept
/// for the next allocation of the same size, which then takes no driver call (each up to 1/1024
/// of the device's BAR heap, 32–256 MiB: 64 MiB on an H100, 128 MiB on an H200; two of those in
/// all). Memory whose release still waits for GPU work is not reached: call
/// `vkgdr_wait_for_releases` first to count free VRAM exactly.
///
/// - `released`: NULL, or where to store the number of granules and mappings released.
///
/// Returns `VKGDR_SUCCESS` (also for a `vkgdr_open_vulkan` handle, which keeps nothing), or
/// `VKGDR_ERROR` (an invalid handle).
///
/// Thread safety: any thread, concurrently with allocations.
///
/// # Safety
/// - `released` is NULL or writable.
/// - No thread closes `g` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_trim(g: vkgdr_t, released: *mut usize) -> c_int {
    guard("vkgdr_trim", VKGDR_ERROR, || {
        // SAFETY: the caller does not close `g` during the call.
        let n = match unsafe { device(g) }? {
            Device::Cuda(gpu) => gpu.trim(),
            Device::Vulkan(_) => 0,
        };
        // SAFETY: `released` is NULL or writable (caller).
        unsafe { write_optional(released, n) };
        Ok(VKGDR_SUCCESS)
    })
}

/// How much `g` keeps of the mappings freed allocations leave for the next allocation of their
/// size (see `vkgdr_trim`): the largest freed allocation whose mapping is kept (bytes, the size
/// asked for rounded up to 4 KiB), and the bytes kept in all. By default 1/1024 of the device's
/// BAR heap, rounded down to a power of two, between 32 and 256 MiB (64 MiB on an H100, 128 MiB
/// on an H200), and twice that in all.
///
/// - `each`, `total`: NULL, or where to store the limits; 0 and 0 for a `vkgdr_open_vulkan`
///   handle, which keeps nothing.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle); nothing is written on error.
///
/// Thread safety: any thread.
///
/// # Safety
/// - `each` and `total` are NULL or writable.
/// - No thread closes `g` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_get_spare_limits(
    g: vkgdr_t,
    each: *mut u64,
    total: *mut u64,
) -> c_int {
    guard("vkgdr_get_spare_limits", VKGDR_ERROR, || {
        // SAFETY: the caller does not close `g` during the call.
        let limits = match unsafe { device(g) }? {
            Device::Cuda(gpu) => gpu.spare_limits(),
            Device::Vulkan(_) => SpareLimits::NONE,
        };
        // SAFETY: `each` and `total` are NULL or writable (caller).
        unsafe {
            write_optional(each, limits.each);
            write_optional(total, limits.total);
        }
        Ok(VKGDR_SUCCESS)
    })
}

/// Keeps the mappings freed allocations of `g` leave within new limits from now on: a freed
/// allocation of up to `each` bytes (rounded up to 4 KiB) keeps its mapping for the next
/// allocation of its size, `total` bytes in all. Those kept beyond the new limits (larger than
/// `each`, then the oldest until the total fits) go back to the driver during the call. 0 for
/// either keeps none: every free gives its memory back, as in vkgdr 0.1.
///
/// - `released`: NULL, or where to store how many kept mappings went back.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, or one of `vkgdr_open_vulkan`,
/// which keeps nothing).
///
/// Thread safety: any thread, concurrently with allocations.
///
/// # Safety
/// - `released` is NULL or writable.
/// - No thread closes `g` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_set_spare_limits(
    g: vkgdr_t,
    each: u64,
    total: u64,
    released: *mut usize,
) -> c_int {
    guard("vkgdr_set_spare_limits", VKGDR_ERROR, || {
        // SAFETY: the caller does not close `g` during the call.
        let gpu = unsafe { device(g) }?.gpu()?;
        let n = gpu.set_spare_limits(SpareLimits { each, total });
        // SAFETY: `released` is NULL or writable (caller).
        unsafe { write_optional(released, n) };
        Ok(VKGDR_SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `what` up to its NUL, which must be there.
    fn what(slow: &vkgdr_slow_release) -> String {
        let end = slow
            .what
            .iter()
            .position(|&c| c == 0)
            .expect("NUL-terminated");
        let bytes = slow.what[..end].iter().map(|&c| c as u8).collect();
        String::from_utf8(bytes).expect("UTF-8")
    }

    #[test]
    fn a_slow_release_is_named_without_paths_and_cut_at_a_character() {
        let none = vkgdr_slow_release::of(None);
        assert_eq!((none.time_ns, what(&none).as_str()), (0, ""));
        assert!(none.what.iter().all(|&c| c == 0));

        let ring = vkgdr_slow_release::of(Some(SlowRelease {
            time: Duration::from_micros(1500),
            type_name: "alloc::sync::Arc<vkgdr::ring::RingMemory>",
        }));
        assert_eq!(
            (ring.time_ns, what(&ring).as_str()),
            (1_500_000, "Arc<RingMemory>")
        );

        // 62 bytes and a 2-byte character: 63 fit before the NUL, so the character is left out.
        let long: &'static str = format!("m::{}\u{e9}", "x".repeat(62)).leak();
        let cut = vkgdr_slow_release::of(Some(SlowRelease {
            time: Duration::MAX,
            type_name: long,
        }));
        assert_eq!(cut.time_ns, u64::MAX, "saturates");
        assert_eq!(what(&cut), "x".repeat(62));
    }
}
