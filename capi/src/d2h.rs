//! Device → host rings (`vkgdr_d2h_ring_*`), a thin layer over
//! [`vkgdr::ring::DeviceToHostRing`]: kernels publish fixed-size records with
//! `include/vkgdr/ring_d2h.cuh` into the ring's device view, and C threads take them, one
//! consumer thread per lane, in order.
//!
//! A lane's consumer is named by the ring and the lane (`vkgdr_d2h_ring_try_next(ring, lane,
//! ...)`), not by a handle of its own (the handle tags are 4 bits, and one was left): the ring
//! keeps one [`LaneConsumer`] per lane, opened by the lane's first take and closed by
//! `vkgdr_d2h_ring_close_lane` or with the ring. Each lane is for one thread at a time: a call on
//! a lane that another thread is inside fails at once (never waits for it), as a second consumer
//! of one lane would be a bug.

use std::ffi::c_int;
use std::ffi::c_void;
use std::sync::{LazyLock, Mutex, MutexGuard, TryLockError};
use std::time::Duration;

use vkgdr::ring::core::d2h::{D2hDeviceView, LaneConsumer, LaneShape, Poll, SlotFormat};
use vkgdr::ring::{D2hLane, DeviceToHostRing, MAX_D2H_LANES};

use crate::device::{device, vkgdr_t};
use crate::error::{guard, CResult, Failure};
use crate::handles::{HandleTable, Tag};
use crate::ring::timeout;
use crate::versioned::{self, Versioned};
use crate::{lookup, register, release, VKGDR_ERROR, VKGDR_SUCCESS};

/// Opaque handle to a device → host ring.
pub struct vkgdr_d2h_ring {
    _private: [u8; 0],
}

/// Opaque handle to a device → host ring, from `vkgdr_d2h_ring_create`; freed with
/// `vkgdr_d2h_ring_destroy`.
pub type vkgdr_d2h_ring_t = *mut vkgdr_d2h_ring;

/// `vkgdr_d2h_ring_try_next` and `vkgdr_d2h_ring_next` found no record (none has arrived yet, or
/// none within the timeout): nothing was taken, try again later.
pub const VKGDR_D2H_RING_EMPTY: c_int = 1;

/// `vkgdr_d2h_ring_try_next` and `vkgdr_d2h_ring_next` found no record, and none will come: the
/// producers were declared finished (`vkgdr_d2h_ring_finish`) and every record they published
/// was taken.
pub const VKGDR_D2H_RING_ENDED: c_int = 2;

/// `vkgdr_d2h_ring_create_with_format`'s `format`: each slot a commit word, stored after a
/// release fence, then the meta word and `stride - 16` payload bytes (`vkgdr_d2h_ring_create`'s
/// format; the same value as `ring_d2h.cuh`'s macro).
pub const VKGDR_D2H_FORMAT_COMMITTED: u32 = 0;

/// `vkgdr_d2h_ring_create_with_format`'s `format`: every 8-byte word of a slot carries four
/// bytes and its record's tag, so a record needs no fence before it counts and reaches the CPU
/// a PCIe round trip sooner, at `stride / 2 - 8` payload bytes per slot (NCCL's low-latency
/// protocol, device to host).
pub const VKGDR_D2H_FORMAT_TAGGED: u32 = 1;

/// What a producing kernel takes by value: exactly `vkgdr_d2h_view` of
/// `include/vkgdr/ring_d2h.cuh` (48 bytes, a wire format, so no `struct_size`). Pass a pointer
/// to it as the kernel's parameter (`cuLaunchKernel`'s `kernelParams` entry).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct vkgdr_d2h_ring_device_view {
    /// Device address of lane 0's slots (host memory mapped for the device); lane `i`'s are
    /// `i * slots_per_lane * stride` bytes further.
    pub slots: u64,
    /// Device address of lane 0's control block (`head`, `closed`); lane `i`'s is
    /// `i * VKGDR_D2H_CONTROL_STRIDE` (128) bytes further.
    pub control: u64,
    /// Device address of lane 0's device state (`reserve`, `head_cache`, `gave_up`); lane `i`'s
    /// is `i * VKGDR_D2H_DEVICE_STRIDE` (128) bytes further.
    pub device: u64,
    /// Slots per lane (a power of two).
    pub slots_per_lane: u32,
    /// Bytes per slot (a power of two): a record carries up to `stride - 16` payload bytes
    /// (`stride / 2 - 8` in the tagged format).
    pub stride: u32,
    /// Number of lanes.
    pub lanes: u32,
    /// Looks at a full lane's head, with no progress, before a publication gives up
    /// (`VKGDR_D2H_STALLED`).
    pub spin_limit: u32,
    /// How the slots carry their records: `VKGDR_D2H_FORMAT_COMMITTED` or
    /// `VKGDR_D2H_FORMAT_TAGGED`.
    pub format: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

const _: () = assert!(
    std::mem::size_of::<vkgdr_d2h_ring_device_view>() == std::mem::size_of::<D2hDeviceView>()
        && std::mem::size_of::<vkgdr_d2h_ring_device_view>() == 48
);

impl From<D2hDeviceView> for vkgdr_d2h_ring_device_view {
    fn from(v: D2hDeviceView) -> Self {
        vkgdr_d2h_ring_device_view {
            slots: v.slots_addr,
            control: v.control_addr,
            device: v.device_addr,
            slots_per_lane: v.slots,
            stride: v.stride,
            lanes: v.lanes,
            spin_limit: v.spin_limit,
            format: v.format,
            reserved: v.reserved,
        }
    }
}

/// One record taken by `vkgdr_d2h_ring_try_next` or `vkgdr_d2h_ring_next` (its payload is
/// copied into the caller's buffer). Set `struct_size` to `sizeof(vkgdr_d2h_record)` before the
/// call.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct vkgdr_d2h_record {
    /// `sizeof(vkgdr_d2h_record)` as the caller was compiled.
    pub struct_size: usize,
    /// The record's sequence number in its lane: 0, 1, 2, ... in the device's reservation order.
    pub seq: u64,
    /// The kind the kernel gave it (kinds from `VKGDR_D2H_KIND_RESERVED`, 0x80000000, up are the
    /// library's own).
    pub kind: u32,
    /// Payload bytes copied into the buffer.
    pub len: u32,
}

// SAFETY: integers only; `struct_size` first.
unsafe impl Versioned for vkgdr_d2h_record {
    const NAME: &'static str = "vkgdr_d2h_record";
}

/// A lane's counters (`vkgdr_d2h_ring_get_lane_stats`). Set `struct_size` to
/// `sizeof(vkgdr_d2h_lane_stats)` before the call.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct vkgdr_d2h_lane_stats {
    /// `sizeof(vkgdr_d2h_lane_stats)` as the caller was compiled.
    pub struct_size: usize,
    /// Records the kernels reserved in the lane (each is committed with no wait in between).
    pub reserved: u64,
    /// Records the lane's consumers took (its `head`).
    pub taken: u64,
    /// Publications that gave up (`VKGDR_D2H_CLOSED` or `VKGDR_D2H_STALLED`).
    pub gave_up: u64,
}

// SAFETY: integers only; `struct_size` first.
unsafe impl Versioned for vkgdr_d2h_lane_stats {
    const NAME: &'static str = "vkgdr_d2h_lane_stats";
}

/// A lane's consumer as the C library keeps it: `None` until the lane's first take, and again
/// after `vkgdr_d2h_ring_close_lane`.
type Lane = Option<LaneConsumer<D2hLane>>;

/// A ring and its lanes' consumers.
pub(crate) struct CRing {
    /// Declared before `ring`: the consumers close their lanes before the ring goes (they keep
    /// its memory alive either way).
    lanes: Box<[Mutex<Lane>]>,
    pub(crate) ring: DeviceToHostRing,
}

impl CRing {
    /// Lane `lane`, locked for the calling thread, or why not.
    fn lane(&self, lane: u32) -> CResult<MutexGuard<'_, Lane>> {
        let n = self.lanes.len();
        let slot = usize::try_from(lane)
            .ok()
            .and_then(|i| self.lanes.get(i))
            .ok_or_else(|| {
                Failure::Api(format!("lane {lane} does not exist (the ring has {n})"))
            })?;
        match slot.try_lock() {
            Ok(g) => Ok(g),
            // A panic inside a call left the lane as it was at that step: still consistent.
            Err(TryLockError::Poisoned(p)) => Ok(p.into_inner()),
            Err(TryLockError::WouldBlock) => Err(Failure::Api(format!(
                "lane {lane} is in use by another thread: a lane has one consumer thread"
            ))),
        }
    }
}

/// Live `vkgdr_d2h_ring_t` handles.
static D2H_RINGS: LazyLock<HandleTable<CRing>> = LazyLock::new(|| HandleTable::new(Tag::D2hRing));

/// # Safety
/// - No thread destroys `ring` while the reference is in use.
pub(crate) unsafe fn d2h_ring<'a>(ring: vkgdr_d2h_ring_t) -> CResult<&'a CRing> {
    // SAFETY: forwarded to our caller.
    unsafe { lookup(&D2H_RINGS, ring) }
}

/// The consumer of a locked lane, opened on first use.
fn consumer<'a>(
    ring: &DeviceToHostRing,
    lane: u32,
    state: &'a mut Lane,
) -> CResult<&'a mut LaneConsumer<D2hLane>> {
    if state.is_none() {
        *state = Some(ring.consumer(lane)?);
    }
    state
        .as_mut()
        .ok_or_else(|| Failure::Api(format!("lane {lane} has no consumer")))
}

/// Reports what a look at a lane found: a record copied into `buf` and `*rec`, or the status.
///
/// # Safety
/// - `rec` points to `rec->struct_size` writable bytes (checked non-NULL already).
unsafe fn deliver(poll: Poll<'_>, buf: &mut [u8], rec: *mut vkgdr_d2h_record) -> CResult<c_int> {
    let r = match poll {
        Poll::Record(r) => r,
        Poll::Pending => return Ok(VKGDR_D2H_RING_EMPTY),
        Poll::Ended => return Ok(VKGDR_D2H_RING_ENDED),
    };
    buf[..r.payload.len()].copy_from_slice(r.payload);
    let out = vkgdr_d2h_record {
        struct_size: std::mem::size_of::<vkgdr_d2h_record>(),
        seq: r.seq,
        kind: r.kind,
        // At most the stride, which is a u32.
        len: r.payload.len() as u32,
    };
    // SAFETY: writable for its struct_size (caller).
    unsafe { versioned::write(rec, &out) }?;
    Ok(VKGDR_SUCCESS)
}

/// The checked arguments of a take: the caller's buffer (at least the ring's largest payload,
/// so that no record is ever cut) and record struct.
///
/// # Safety
/// - `buf` is NULL or writable for `capacity` bytes; `rec` is NULL or points to
///   `rec->struct_size` readable bytes.
unsafe fn take_args<'a>(
    ring: &DeviceToHostRing,
    buf: *mut c_void,
    capacity: usize,
    rec: *mut vkgdr_d2h_record,
) -> CResult<&'a mut [u8]> {
    // SAFETY: NULL or readable for its struct_size (caller).
    unsafe { versioned::check(rec.cast_const()) }?;
    let max = ring.shape().max_payload() as usize;
    if capacity < max {
        return Err(Failure::Api(format!(
            "the buffer of {capacity} bytes is smaller than the ring's largest payload, {max} \
             bytes (vkgdr_d2h_ring_get_max_payload)"
        )));
    }
    // Only the bytes a record can fill: a `capacity` beyond them is never touched.
    // SAFETY: writable for `capacity >= max` bytes (caller).
    unsafe { crate::copy::host_slice_mut(buf, max) }
}

/// Creates a device → host ring on `g`'s device: `lanes` lanes (1 to 1024) of `slots` slots
/// (a power of two, 2 to 2^24) of `stride` bytes (a power of two, 32 to 65536: each record
/// carries up to `stride - 16` payload bytes). The slots are pinned host memory mapped for the
/// device; each lane's `head` and `closed` words are GPU memory the CPU stores to through the
/// BAR. A kernel's publication into a full lane gives up (`VKGDR_D2H_STALLED`) after
/// `spin_limit` looks at a head that does not move (each a read of GPU memory and a nap of up
/// to about 4 µs); the warp calls of `ring_d2h.cuh` reserve up to 32 slots at once, so give a
/// lane at least 32 slots.
///
/// Returns a handle, or `NULL` on error (a bad shape or lane count, a `vkgdr_open_vulkan`
/// handle, a driver failure).
///
/// Thread safety: any thread. Free it with `vkgdr_d2h_ring_destroy` once no kernel publishes
/// into it any more (synchronise with the producing kernels first: their stores go to the
/// ring's memory).
///
/// # Safety
/// - No thread closes `g` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_d2h_ring_create(
    g: vkgdr_t,
    lanes: u32,
    slots: u32,
    stride: u32,
    spin_limit: u32,
) -> vkgdr_d2h_ring_t {
    guard("vkgdr_d2h_ring_create", std::ptr::null_mut(), || {
        // SAFETY: the caller does not close `g` during the call.
        unsafe { create(g, lanes, slots, stride, spin_limit, SlotFormat::Committed) }
    })
}

/// `vkgdr_d2h_ring_create` with the slots' format: `VKGDR_D2H_FORMAT_COMMITTED` (the same
/// ring) or `VKGDR_D2H_FORMAT_TAGGED` (records of up to `stride / 2 - 8` bytes that reach the
/// CPU sooner: for status words, completion notices and release tokens). The kernels need no
/// change: `ring_d2h.cuh` reads the format from the view.
///
/// Returns a handle, or `NULL` on error (an unknown format, and `vkgdr_d2h_ring_create`'s).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread closes `g` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_d2h_ring_create_with_format(
    g: vkgdr_t,
    lanes: u32,
    slots: u32,
    stride: u32,
    spin_limit: u32,
    format: u32,
) -> vkgdr_d2h_ring_t {
    guard("vkgdr_d2h_ring_create_with_format", NO_RING, || {
        let format = slot_format(format)?;
        // SAFETY: the caller does not close `g` during the call.
        unsafe { create(g, lanes, slots, stride, spin_limit, format) }
    })
}

/// The error return of the creators.
const NO_RING: vkgdr_d2h_ring_t = std::ptr::null_mut();

/// The slot format of a `VKGDR_D2H_FORMAT_*` code.
fn slot_format(code: u32) -> CResult<SlotFormat> {
    SlotFormat::from_code(code).ok_or_else(|| {
        Failure::Api(format!(
            "slot format {code}: use VKGDR_D2H_FORMAT_COMMITTED (0) or \
             VKGDR_D2H_FORMAT_TAGGED (1)"
        ))
    })
}

/// Both creators' body: the shape and lanes checked before the device handle is looked at.
///
/// # Safety
/// - No thread closes `g` during the call.
unsafe fn create(
    g: vkgdr_t,
    lanes: u32,
    slots: u32,
    stride: u32,
    spin_limit: u32,
    format: SlotFormat,
) -> CResult<vkgdr_d2h_ring_t> {
    // Checked before the device handle is looked at, as for pools and rings.
    let shape = LaneShape::new(slots, stride)
        .map_err(vkgdr::Error::from)?
        .with_format(format);
    if lanes == 0 || lanes > MAX_D2H_LANES {
        let max = MAX_D2H_LANES;
        return Err(vkgdr::Error::from(vkgdr::InvalidArgument::RingLanes { lanes, max }).into());
    }
    // SAFETY: the caller does not close `g` during the call.
    let gpu = unsafe { device(g) }?.gpu()?;
    let ring = DeviceToHostRing::new(gpu, lanes, shape, spin_limit)?;
    let lanes = (0..ring.lanes()).map(|_| Mutex::new(None)).collect();
    register(&D2H_RINGS, CRing { lanes, ring })
}

/// Destroys a ring: closes every open lane (a kernel still publishing gets `VKGDR_D2H_CLOSED`
/// from its next wait for room) and frees the memory. `NULL` is ignored.
///
/// Errors (reported through `vkgdr_last_error()` only): a handle already destroyed, or not a
/// `vkgdr_d2h_ring_t`.
///
/// Thread safety: any thread.
///
/// # Safety
/// - No other thread uses `ring` during or after the call, and no kernel publishes into it any
///   more (the memory goes back).
#[no_mangle]
pub unsafe extern "C" fn vkgdr_d2h_ring_destroy(ring: vkgdr_d2h_ring_t) {
    guard("vkgdr_d2h_ring_destroy", (), || release(&D2H_RINGS, ring))
}

/// Fills `*view` with what a producing kernel takes by value (`vkgdr_d2h_view` of
/// `ring_d2h.cuh`, the same 48 bytes).
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, `view` NULL).
///
/// Thread safety: any thread.
///
/// # Safety
/// - `view` is NULL or writable for `sizeof(vkgdr_d2h_ring_device_view)` bytes.
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_d2h_ring_get_device_view(
    ring: vkgdr_d2h_ring_t,
    view: *mut vkgdr_d2h_ring_device_view,
) -> c_int {
    guard("vkgdr_d2h_ring_get_device_view", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        let r = unsafe { d2h_ring(ring) }?;
        if view.is_null() {
            return Err(Failure::Api(
                "the vkgdr_d2h_ring_device_view pointer is NULL".into(),
            ));
        }
        let out = vkgdr_d2h_ring_device_view::from(r.ring.device_view());
        // SAFETY: non-NULL and writable (caller); any alignment.
        unsafe { view.write_unaligned(out) };
        Ok(VKGDR_SUCCESS)
    })
}

/// Number of lanes of the ring, or 0 on error (an invalid handle).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_d2h_ring_get_lanes(ring: vkgdr_d2h_ring_t) -> u32 {
    guard("vkgdr_d2h_ring_get_lanes", 0, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        Ok(unsafe { d2h_ring(ring) }?.ring.lanes())
    })
}

/// The largest payload a record of the ring carries (`stride - 16`): the least `capacity` of
/// the buffers `vkgdr_d2h_ring_try_next` and `vkgdr_d2h_ring_next` take. 0 on error (an
/// invalid handle).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_d2h_ring_get_max_payload(ring: vkgdr_d2h_ring_t) -> u32 {
    guard("vkgdr_d2h_ring_get_max_payload", 0, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        Ok(unsafe { d2h_ring(ring) }?.ring.shape().max_payload())
    })
}

/// Takes the next record of lane `lane` if it has arrived, without waiting: copies its payload
/// into `buf` and its number, kind and length into `*rec`; its slot goes back to the device at
/// the lane's next call (or its close, or `vkgdr_d2h_ring_publish_head`), so the store that
/// hands it back is not on the record's way to the caller. Records of a lane come in the order the device reserved them; the lane's
/// first call opens it (from where an earlier consumer stopped).
///
/// - `capacity`: bytes of `buf`, at least `vkgdr_d2h_ring_get_max_payload(ring)`.
/// - `rec`: its `struct_size` set by the caller.
///
/// Returns `VKGDR_SUCCESS` (a record), `VKGDR_D2H_RING_EMPTY` (none has arrived; nothing
/// taken), `VKGDR_D2H_RING_ENDED` (none will come: `vkgdr_d2h_ring_finish` was called and the
/// lane is empty), or `VKGDR_ERROR`: an invalid handle, no such lane, the lane closed or in use by
/// another thread, `buf` too small or NULL, `rec` NULL or its `struct_size` unset, or the
/// device broke the protocol ("slot of record N holds commit word ...": the lane is broken and
/// every later call says so).
///
/// Thread safety: any thread, one at a time per lane (a call on a lane another thread is inside
/// fails); lanes are independent.
///
/// # Safety
/// - `buf` is writable for `capacity` bytes; `rec` is NULL or writable for `rec->struct_size`
///   bytes.
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_d2h_ring_try_next(
    ring: vkgdr_d2h_ring_t,
    lane: u32,
    buf: *mut c_void,
    capacity: usize,
    rec: *mut vkgdr_d2h_record,
) -> c_int {
    guard("vkgdr_d2h_ring_try_next", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        let r = unsafe { d2h_ring(ring) }?;
        // SAFETY: forwarded from our caller.
        let buf = unsafe { take_args(&r.ring, buf, capacity, rec) }?;
        let mut state = r.lane(lane)?;
        let c = consumer(&r.ring, lane, &mut state)?;
        let poll = c.poll().map_err(vkgdr::Error::from)?;
        // SAFETY: `rec` checked and writable (caller).
        unsafe { deliver(poll, buf, rec) }
    })
}

/// `vkgdr_d2h_ring_try_next` that waits up to `timeout_ns` nanoseconds for the record to arrive
/// (negative: without limit; 0: one look), spinning first (a record that comes within
/// microseconds is seen at once), then yielding, then napping up to 50 µs between looks.
///
/// Returns `VKGDR_SUCCESS`, `VKGDR_D2H_RING_EMPTY` (nothing arrived in time),
/// `VKGDR_D2H_RING_ENDED` (none will come) or `VKGDR_ERROR`, as `vkgdr_d2h_ring_try_next`. A
/// wait without limit ends from another thread with `vkgdr_d2h_ring_finish`: the call then
/// returns `VKGDR_D2H_RING_ENDED` once the lane is empty (the lane itself cannot be closed while
/// this thread is inside it).
///
/// Thread safety: as `vkgdr_d2h_ring_try_next`.
///
/// # Safety
/// - As `vkgdr_d2h_ring_try_next`.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_d2h_ring_next(
    ring: vkgdr_d2h_ring_t,
    lane: u32,
    timeout_ns: i64,
    buf: *mut c_void,
    capacity: usize,
    rec: *mut vkgdr_d2h_record,
) -> c_int {
    guard("vkgdr_d2h_ring_next", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        let r = unsafe { d2h_ring(ring) }?;
        // SAFETY: forwarded from our caller.
        let buf = unsafe { take_args(&r.ring, buf, capacity, rec) }?;
        let wait = timeout(timeout_ns).unwrap_or(Duration::MAX);
        let mut state = r.lane(lane)?;
        let c = consumer(&r.ring, lane, &mut state)?;
        let poll = c.next_timeout(wait).map_err(vkgdr::Error::from)?;
        // SAFETY: `rec` checked and writable (caller).
        unsafe { deliver(poll, buf, rec) }
    })
}

/// Hands the slots of every record taken from lane `lane` back to the device now. A take
/// (`vkgdr_d2h_ring_try_next`, `vkgdr_d2h_ring_next`) leaves the lane's head one record behind
/// and moves it at the lane's next call or close, so that its store through the BAR is not on
/// the record's way to the caller; a caller that holds on to a record a while calls this first
/// (until then the lane looks one record fuller to its kernels: enough to keep out a warp's
/// 32-record reservation). A lane that is not open has nothing to hand back.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, no such lane, the lane in use
/// by another thread).
///
/// Thread safety: any thread, one at a time per lane.
///
/// # Safety
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_d2h_ring_publish_head(ring: vkgdr_d2h_ring_t, lane: u32) -> c_int {
    guard("vkgdr_d2h_ring_publish_head", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        let r = unsafe { d2h_ring(ring) }?;
        if let Some(c) = r.lane(lane)?.as_mut() {
            c.publish_head();
        }
        Ok(VKGDR_SUCCESS)
    })
}

/// Closes lane `lane`: tells the device that nothing will be taken from it any more (its
/// waiting and later publications end with `VKGDR_D2H_CLOSED`). Records committed before stay;
/// a later take from the lane opens it again, where this consumer stopped. Closing a lane that
/// is not open does nothing.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, no such lane, the lane in use
/// by another thread).
///
/// Thread safety: any thread, one at a time per lane.
///
/// # Safety
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_d2h_ring_close_lane(ring: vkgdr_d2h_ring_t, lane: u32) -> c_int {
    guard("vkgdr_d2h_ring_close_lane", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        let r = unsafe { d2h_ring(ring) }?;
        // Dropping the consumer closes the lane and frees it for the next one.
        drop(r.lane(lane)?.take());
        Ok(VKGDR_SUCCESS)
    })
}

/// Closes every lane: kernels waiting for room, and later publications, give up with
/// `VKGDR_D2H_CLOSED`. Records committed before stay; a lane's next take opens it again.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle).
///
/// Thread safety: any thread, also while consumers take.
///
/// # Safety
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_d2h_ring_close(ring: vkgdr_d2h_ring_t) -> c_int {
    guard("vkgdr_d2h_ring_close", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        unsafe { d2h_ring(ring) }?.ring.close();
        Ok(VKGDR_SUCCESS)
    })
}

/// Declares the producing kernels finished: the caller knows they completed (it synchronised
/// their stream or context), so everything they committed is visible. From then on a lane whose
/// records were all taken reports `VKGDR_D2H_RING_ENDED` instead of waiting. Call
/// `vkgdr_d2h_ring_restart` before the next launch publishes into the ring.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_d2h_ring_finish(ring: vkgdr_d2h_ring_t) -> c_int {
    guard("vkgdr_d2h_ring_finish", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        unsafe { d2h_ring(ring) }?.ring.finish();
        Ok(VKGDR_SUCCESS)
    })
}

/// Clears `vkgdr_d2h_ring_finish` before a new launch publishes into the ring: its lanes wait
/// for records again.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_d2h_ring_restart(ring: vkgdr_d2h_ring_t) -> c_int {
    guard("vkgdr_d2h_ring_restart", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        unsafe { d2h_ring(ring) }?.ring.restart();
        Ok(VKGDR_SUCCESS)
    })
}

/// Fills `*stats` (whose `struct_size` the caller sets) with lane `lane`'s counters: records
/// reserved by the kernels, taken by the consumers, and publications that gave up. Read through
/// the BAR: a few microseconds, not for a hot loop.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, no such lane, `stats` NULL or
/// its `struct_size` unset).
///
/// Thread safety: any thread, also while the lane's consumer takes.
///
/// # Safety
/// - `stats` is NULL or writable for `stats->struct_size` bytes.
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_d2h_ring_get_lane_stats(
    ring: vkgdr_d2h_ring_t,
    lane: u32,
    stats: *mut vkgdr_d2h_lane_stats,
) -> c_int {
    guard("vkgdr_d2h_ring_get_lane_stats", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        let r = unsafe { d2h_ring(ring) }?;
        // SAFETY: NULL or readable for its struct_size (caller).
        unsafe { versioned::check(stats.cast_const()) }?;
        let s = r.ring.lane_stats(lane)?;
        let out = vkgdr_d2h_lane_stats {
            struct_size: std::mem::size_of::<vkgdr_d2h_lane_stats>(),
            reserved: s.reserved,
            taken: s.taken,
            gave_up: s.gave_up,
        };
        // SAFETY: writable for its struct_size (caller).
        unsafe { versioned::write(stats, &out) }?;
        Ok(VKGDR_SUCCESS)
    })
}
