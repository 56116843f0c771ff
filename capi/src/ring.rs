//! Rings that stream records from C threads to a running kernel (`vkgdr_ring_*`), a thin layer
//! over [`vkgdr::ring::DeviceRing`]: create (with lanes and the copy-engine choice), push (or
//! reserve, write, commit), the device view a consumer kernel needs, the consumer's registration,
//! stop, the words the consumer reports back and the copy engine's counters. Exclusive producers
//! (`vkgdr_ring_producer_*`) are in [`crate::producer`].

use std::ffi::{c_char, c_int, c_void};
use std::mem::ManuallyDrop;
use std::ptr::null_mut;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

// std's Mutex like crate::handles (Miri); a poisoned lock still holds a valid Option.
use std::sync::{Mutex, PoisonError};
use vkgdr::ring::core::{Reservation, RingError};
use vkgdr::ring::device::MAX_LANES;
use vkgdr::ring::layout::{WrapMode, RESULT_WORDS};
use vkgdr::ring::{BarSink, CopyEngine, DeviceRing, RingOptions};

use crate::device::{device, vkgdr_t};
use crate::error::{c_string_copy, guard, CResult, Failure};
use crate::handles::{HandleTable, Tag};
use crate::versioned::{self, Versioned};
use crate::{
    lookup, register, release, write_optional, CUdeviceptr, CUstream, Handle, VKGDR_ERROR,
    VKGDR_SUCCESS,
};

/// Opaque handle to a ring.
pub struct vkgdr_ring {
    _private: [u8; 0],
}

/// Opaque handle to a ring, from `vkgdr_ring_create`; freed with `vkgdr_ring_destroy`.
pub type vkgdr_ring_t = *mut vkgdr_ring;

/// Flags of `vkgdr_ring_create`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub enum vkgdr_ring_flags {
    /// Map the data region twice back to back (CUDA VMM), so records run over the end with no
    /// padding and a consumer reads each one contiguously (the `_mirrored` consumers of
    /// `kernels/ring.cu`). `capacity` must then be a multiple of the VMM granularity (2 MiB).
    VKGDR_RING_MIRRORED_BIT = 1,
    /// Give each lane an allocation of its own, so that lanes can be lent to producers in other
    /// processes (`vkgdr_share_ring`): a peer sent one lane's memory reaches no other lane's
    /// records, and never the ring's control words. Padded rings only (not with
    /// `VKGDR_RING_MIRRORED_BIT`), without the copy engine; `capacity` is rounded up to the VMM
    /// granularity (2 MiB on the H100) in memory, not in the ring's size. Consumers are the same
    /// kernels as for other rings.
    VKGDR_RING_SHAREABLE_BIT = 2,
    /// Split the lanes between the two paths of `vkgdr_ring_options.copy_engine_record`
    /// (`vkgdr_ring_create_with_options` only, with a non-zero `copy_engine_record`): three lanes
    /// in eight (those whose index modulo 8 is 0, 3 or 6) write records below 8 KiB through the
    /// BAR, the others stage records of at least `copy_engine_record` bytes in pinned memory for
    /// the copy engine: eight producers of 1 and 2 KiB records then drive both paths at once
    /// (figures: BENCHMARKS.md, 'Lanes split between the BAR and the copy engine'). Producers
    /// claim lanes in order: a ring's first producer takes the BAR, its second and third the copy
    /// engine. Not with `VKGDR_RING_SHAREABLE_BIT`.
    VKGDR_RING_COPY_ENGINE_SPLIT_BIT = 4,
    /// Every record through the BAR, on every lane (`vkgdr_ring_create_with_options` only,
    /// with a `copy_engine_record` of 0, not with `VKGDR_RING_COPY_ENGINE_SPLIT_BIT`). Without
    /// it and with a `copy_engine_record` of 0 the ring chooses: on a ring of two lanes or more,
    /// lanes 0, 3 and 6 of each eight stage records of 8 KiB and more and the others records
    /// of 1 KiB and more (header included), once a producer's batch has 64 KiB pending before
    /// them, unless the lanes' pinned staging copies would hold more than 256 MiB in all.
    VKGDR_RING_COPY_ENGINE_OFF_BIT = 8,
}

/// The flag bits a ring knows.
const RING_FLAGS: u32 = MIRRORED | SHAREABLE | SPLIT | OFF;
const MIRRORED: u32 = vkgdr_ring_flags::VKGDR_RING_MIRRORED_BIT as u32;
const SHAREABLE: u32 = vkgdr_ring_flags::VKGDR_RING_SHAREABLE_BIT as u32;
const SPLIT: u32 = vkgdr_ring_flags::VKGDR_RING_COPY_ENGINE_SPLIT_BIT as u32;
const OFF: u32 = vkgdr_ring_flags::VKGDR_RING_COPY_ENGINE_OFF_BIT as u32;

/// Makes a ring as `flags` say: mirrored, shareable (padded lanes of their own) or plain.
fn make_ring(
    gpu: &vkgdr::Gpu,
    capacity: u64,
    options: RingOptions,
    flags: u32,
) -> CResult<DeviceRing> {
    if flags & SHAREABLE == 0 {
        return Ok(DeviceRing::with_options(gpu, capacity, options)?);
    }
    Ok(DeviceRing::new_shareable(gpu, capacity, options.lanes)?)
}

/// Unknown flag bits, the combinations a shareable ring does not take, and a split without a
/// record size.
fn check_flags(flags: u32, copy_engine_record: u64) -> CResult<()> {
    if flags & !RING_FLAGS != 0 {
        return Err(Failure::Api(format!(
            "unknown ring flag bits {:#x}",
            flags & !RING_FLAGS
        )));
    }
    if flags & SHAREABLE != 0 && flags & MIRRORED != 0 {
        return Err(Failure::Api(
            "a shareable ring is padded: VKGDR_RING_SHAREABLE_BIT does not go with \
             VKGDR_RING_MIRRORED_BIT"
                .into(),
        ));
    }
    if flags & SHAREABLE != 0 && flags & SPLIT != 0 {
        return Err(Failure::Api(
            "a shareable ring has no copy engine: VKGDR_RING_SHAREABLE_BIT does not go with \
             VKGDR_RING_COPY_ENGINE_SPLIT_BIT"
                .into(),
        ));
    }
    if flags & SHAREABLE != 0 && copy_engine_record != 0 {
        return Err(Failure::Api(
            "a shareable ring has no copy engine: leave copy_engine_record 0 with \
             VKGDR_RING_SHAREABLE_BIT"
                .into(),
        ));
    }
    if flags & OFF != 0 && (flags & SPLIT != 0 || copy_engine_record != 0) {
        return Err(Failure::Api(
            "VKGDR_RING_COPY_ENGINE_OFF_BIT keeps the copy engine off: it goes with neither \
             VKGDR_RING_COPY_ENGINE_SPLIT_BIT nor a non-zero copy_engine_record"
                .into(),
        ));
    }
    if flags & SPLIT != 0 && copy_engine_record == 0 {
        return Err(Failure::Api(
            "VKGDR_RING_COPY_ENGINE_SPLIT_BIT needs a copy_engine_record: set \
             vkgdr_ring_options.copy_engine_record to a record size (4096, say) and make the \
             ring with vkgdr_ring_create_with_options"
                .into(),
        ));
    }
    Ok(())
}

/// `vkgdr_ring_push` found no room before its timeout: nothing was written, try again later.
pub const VKGDR_RING_FULL: c_int = 1;

/// What a consumer kernel needs (`vkgdr_ring_get_device_view`); the wire format is described in
/// `kernels/ring.cu`. Set `struct_size` to `sizeof(vkgdr_ring_device_view)` before the call.
/// Kernels that take `vkgdr_ring_view` of `include/vkgdr/ring.cuh` by value (`ring_check_lanes`)
/// get it from these fields: `data, capacity, tail, stop, head, result, lane_data, lanes`, and
/// `mirrored` as its `wrap`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct vkgdr_ring_device_view {
    /// `sizeof(vkgdr_ring_device_view)` as the caller was compiled.
    pub struct_size: usize,
    /// Device address of the data region (16-byte aligned).
    pub data: CUdeviceptr,
    /// Capacity of the data region in bytes (a power of two).
    pub capacity: u64,
    /// Device address of `tail` (u64 in GPU memory, written by the CPU: end of the published
    /// records).
    pub tail: CUdeviceptr,
    /// Device address of `stop` (u32 in GPU memory, set by `vkgdr_ring_stop`).
    pub stop: CUdeviceptr,
    /// Device address of `head` (u64 in pinned host memory, written by the consumer: end of the
    /// consumed records; producers reuse the space below it).
    pub head: CUdeviceptr,
    /// Device address of 8 u64 result words in pinned host memory for the consumer to report
    /// into (`vkgdr_ring_get_results` reads them).
    pub result: CUdeviceptr,
    /// 1 for a ring made with `VKGDR_RING_MIRRORED_BIT`, else 0.
    pub mirrored: u32,
    /// Number of lanes (1 unless the ring was made with `vkgdr_ring_options.lanes`). `data`,
    /// `tail`, `head` and `result` above are lane 0's; lane `i`'s `tail` is at
    /// `tail + i * 128`, its `head` at `head + i * 256`, its result words at `result + i * 256`,
    /// its data region at `((uint64_t *)lane_data)[i]` (device memory). A caller whose
    /// `struct_size` ends before this field does not get it.
    pub lanes: u32,
    /// Device address of a table of `lanes` u64s: each lane's data region. A caller whose
    /// `struct_size` ends before this field does not get it.
    pub lane_data: CUdeviceptr,
}

// SAFETY: integers only; `struct_size` first.
unsafe impl Versioned for vkgdr_ring_device_view {
    const NAME: &'static str = "vkgdr_ring_device_view";
}

/// How `vkgdr_ring_create_with_options` makes a ring. Fill it with `vkgdr_ring_options_init`,
/// then change what you need. Later versions may add fields at the end: `struct_size` tells the
/// library which ones the caller knows.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct vkgdr_ring_options {
    /// `sizeof(vkgdr_ring_options)` as the caller was compiled (set by
    /// `vkgdr_ring_options_init`).
    pub struct_size: usize,
    /// Lanes, 1 to 64 (default 1): independent sub-rings of `capacity` bytes each, with their
    /// own tail, head and sequence numbers. Give each producer thread its own lane
    /// (`vkgdr_ring_producer_create`); a consumer reads each lane in order (one thread block
    /// per lane, say). Records of different lanes are not ordered with each other.
    pub lanes: u32,
    /// 0, `VKGDR_RING_MIRRORED_BIT` (each lane then gets a region of its own mapped twice) or
    /// `VKGDR_RING_SHAREABLE_BIT` (each lane an allocation of its own, to lend to other
    /// processes with `vkgdr_share_ring`), and `VKGDR_RING_COPY_ENGINE_SPLIT_BIT` (with a
    /// non-zero `copy_engine_record`, not with `VKGDR_RING_SHAREABLE_BIT`: three lanes in eight
    /// keep records below 8 KiB on the BAR, the others take the copy engine from
    /// `copy_engine_record` bytes on) or `VKGDR_RING_COPY_ENGINE_OFF_BIT` (every record through
    /// the BAR).
    pub flags: u32,
    /// Records of at least this many bytes in the ring (16-byte header and padding to 16
    /// included) that a `vkgdr_ring_producer_t` writes, once its batch has 64 KiB pending before
    /// them (`vkgdr_ring_producer_set_stage_after` changes that for a producer), are staged in
    /// pinned host memory and moved by a copy engine, which outruns CPU
    /// stores through the BAR when several producers stream large records; smaller ones, lone
    /// ones, and every record of `vkgdr_ring_push` and `vkgdr_ring_reserve`, take the BAR.
    /// 0 (the default) lets the ring choose (`VKGDR_RING_COPY_ENGINE_OFF_BIT` says what it
    /// chooses; with that flag the copy engine stays off); at most `UINT32_MAX`.
    /// With `VKGDR_RING_COPY_ENGINE_SPLIT_BIT` in `flags` (which needs it non-zero) this holds
    /// on five lanes in eight only; lanes 0, 3 and 6 of each eight stage records of at least
    /// 8 KiB (or of `copy_engine_record`, if larger) and write smaller ones through the BAR.
    pub copy_engine_record: u64,
}

// SAFETY: integers only; `struct_size` first.
unsafe impl Versioned for vkgdr_ring_options {
    const NAME: &'static str = "vkgdr_ring_options";
}

impl vkgdr_ring_options {
    fn defaults() -> Self {
        vkgdr_ring_options {
            struct_size: std::mem::size_of::<Self>(),
            lanes: 1,
            flags: 0,
            copy_engine_record: 0,
        }
    }

    /// The library's options. Everything that needs no device is checked here, so a bad
    /// configuration is reported before the device handle is looked at (as for pools).
    fn to_options(self) -> CResult<RingOptions> {
        check_flags(self.flags, self.copy_engine_record)?;
        if self.lanes == 0 || self.lanes > MAX_LANES {
            return Err(vkgdr::Error::from(vkgdr::InvalidArgument::RingLanes {
                lanes: self.lanes,
                max: MAX_LANES,
            })
            .into());
        }
        let copy_engine = match self.copy_engine_record {
            0 if self.flags & OFF != 0 => CopyEngine::Off,
            0 => CopyEngine::Auto,
            n => {
                let n = u32::try_from(n).map_err(|_| {
                    Failure::Api(format!(
                        "vkgdr_ring_options.copy_engine_record {n} is larger than UINT32_MAX"
                    ))
                })?;
                if self.flags & SPLIT != 0 {
                    CopyEngine::Split(n)
                } else {
                    CopyEngine::FromRecord(n)
                }
            }
        };
        Ok(RingOptions {
            lanes: self.lanes,
            wrap: if self.flags & MIRRORED != 0 {
                WrapMode::Mirrored
            } else {
                WrapMode::Padded
            },
            copy_engine,
        })
    }
}

/// What the copy-engine path of a ring's lanes has done so far
/// (`vkgdr_ring_get_copy_engine_stats`). Set `struct_size` to
/// `sizeof(vkgdr_ring_copy_engine_stats)` before the call.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct vkgdr_ring_copy_engine_stats {
    /// `sizeof(vkgdr_ring_copy_engine_stats)` as the caller was compiled.
    pub struct_size: usize,
    /// Lanes whose staging copy and copy stream exist (made when a producer first claims the
    /// lane, for rings whose copy engine is on).
    pub lanes_ready: u32,
    /// 1 when the copy-engine path could not be made (the lanes then use the BAR; the reason is
    /// `vkgdr_ring_get_copy_engine_error`), else 0.
    pub unavailable: u32,
    /// Staged publications queued on the lanes' copy streams.
    pub copies: u64,
    /// Bytes those publications copied.
    pub bytes: u64,
    /// Publications whose copy could not be queued (a driver error): their staged bytes went
    /// through the BAR instead.
    pub fallbacks: u64,
    /// Publications of records written through the BAR whose tail went through a lane's copy
    /// stream, behind a staged publication's tail that had not landed yet.
    pub stream_tails: u64,
}

// SAFETY: integers only; `struct_size` first.
unsafe impl Versioned for vkgdr_ring_copy_engine_stats {
    const NAME: &'static str = "vkgdr_ring_copy_engine_stats";
}

/// Opaque handle to a reservation.
pub struct vkgdr_ring_reservation {
    _private: [u8; 0],
}

/// Opaque handle to space reserved for one record, from `vkgdr_ring_reserve`; consumed by
/// `vkgdr_ring_commit` or `vkgdr_ring_cancel`.
pub type vkgdr_ring_reservation_t = *mut vkgdr_ring_reservation;

/// Live `vkgdr_ring_t` handles. An `Arc`, so that open reservations and producers keep their
/// ring alive.
pub(crate) static RINGS: LazyLock<HandleTable<Arc<DeviceRing>>> =
    LazyLock::new(|| HandleTable::new(Tag::Ring));

/// A reservation with the ring it borrows from.
struct OpenReservation {
    /// `None` once committed or cancelled (the handle is removed right after). The mutex keeps
    /// two C threads writing through one handle from aliasing the `&mut` that writes take.
    reservation: Mutex<Option<Reservation<'static, BarSink>>>,
    /// Keeps the ring (which `reservation` borrows) alive and in place; dropped after it.
    ring: ManuallyDrop<Arc<DeviceRing>>,
}

impl Drop for OpenReservation {
    fn drop(&mut self) {
        // An uncommitted reservation becomes a PAD record when dropped: before the ring goes.
        drop(
            self.reservation
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        // SAFETY: dropped exactly once, here, after the reservation that borrowed it.
        unsafe { ManuallyDrop::drop(&mut self.ring) };
    }
}

/// Live `vkgdr_ring_reservation_t` handles.
static RESERVATIONS: LazyLock<HandleTable<OpenReservation>> =
    LazyLock::new(|| HandleTable::new(Tag::Reservation));

/// # Safety
/// - No thread destroys `ring` while the reference is in use.
pub(crate) unsafe fn ring<'a>(ring: vkgdr_ring_t) -> CResult<&'a Arc<DeviceRing>> {
    // SAFETY: forwarded to our caller.
    unsafe { lookup(&RINGS, ring) }
}

pub(crate) fn timeout(timeout_ns: i64) -> Option<Duration> {
    u64::try_from(timeout_ns).ok().map(Duration::from_nanos)
}

pub(crate) fn payload_len(size: usize) -> CResult<u32> {
    u32::try_from(size)
        .map_err(|_| Failure::Api(format!("a record of {size} bytes is larger than 4 GiB")))
}

/// Creates a ring of `capacity` bytes (a power of two, at least 4096) in BAR-mapped memory of
/// `g`'s device, in the handle's context (see `vkgdr_pool_create`).
///
/// - `flags`: 0, `VKGDR_RING_MIRRORED_BIT` or `VKGDR_RING_SHAREABLE_BIT` (its one lane can then
///   be lent to another process: `vkgdr_share_ring`). `VKGDR_RING_COPY_ENGINE_SPLIT_BIT` needs
///   a `copy_engine_record`, which only `vkgdr_ring_create_with_options` takes: it is refused
///   here. `VKGDR_RING_COPY_ENGINE_OFF_BIT` is accepted and changes nothing: a one-lane ring
///   writes every record through the BAR.
///
/// Returns a handle, or `NULL` on error (a bad capacity or flag, a `vkgdr_open_vulkan` handle, a
/// driver failure).
///
/// Thread safety: any thread. Pushes may come from many threads at once.
/// Free it with `vkgdr_ring_destroy` once the consumer is done.
///
/// # Safety
/// - No thread closes `g` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_create(g: vkgdr_t, capacity: u64, flags: u32) -> vkgdr_ring_t {
    guard("vkgdr_ring_create", std::ptr::null_mut(), || {
        check_flags(flags, 0)?;
        // SAFETY: the caller does not close `g` during the call.
        let gpu = unsafe { device(g) }?.gpu()?;
        // A one-lane ring keeps the BAR whatever the copy-engine flags say.
        let r = match flags & !OFF {
            MIRRORED => DeviceRing::new_mirrored(gpu, capacity)?,
            flags => make_ring(gpu, capacity, RingOptions::default(), flags)?,
        };
        register(&RINGS, Arc::new(r))
    })
}

/// Fills `*options` with the defaults (one lane, padded, the copy engine chosen by the ring)
/// and sets `options->struct_size` to `struct_size`, which must be
/// `sizeof(vkgdr_ring_options)` as the caller sees it (only that many bytes are written).
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` if `options` is NULL or `struct_size` too small.
///
/// Thread safety: any thread.
///
/// # Safety
/// - `options` is NULL or writable for `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_options_init(
    options: *mut vkgdr_ring_options,
    struct_size: usize,
) -> c_int {
    guard("vkgdr_ring_options_init", VKGDR_ERROR, || {
        if options.is_null() {
            return Err(Failure::Api(
                "the vkgdr_ring_options pointer is NULL".into(),
            ));
        }
        if struct_size < std::mem::size_of::<usize>() {
            return Err(Failure::Api(format!(
                "struct_size {struct_size} is too small"
            )));
        }
        // SAFETY: writable for `struct_size` bytes (caller), of which the first hold the size.
        unsafe { options.cast::<usize>().write_unaligned(struct_size) };
        // SAFETY: as above; `write` copies at most `struct_size` bytes.
        unsafe { versioned::write(options, &vkgdr_ring_options::defaults()) }?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Creates a ring of `options->lanes` lanes of `capacity` bytes each (a power of two, at least
/// 4096; for `VKGDR_RING_MIRRORED_BIT`, a multiple of the VMM granularity, 2 MiB on the H100)
/// in BAR-mapped memory of `g`'s device, in the handle's context (see `vkgdr_pool_create`).
///
/// - `options`: NULL for the defaults (then it is `vkgdr_ring_create(g, capacity, 0)`), or
///   options from `vkgdr_ring_options_init`. They are checked before `g`: unknown flag bits,
///   lanes outside 1 to 64, a `copy_engine_record` above `UINT32_MAX`,
///   `VKGDR_RING_COPY_ENGINE_SPLIT_BIT` with a `copy_engine_record` of 0 or with
///   `VKGDR_RING_SHAREABLE_BIT`, `VKGDR_RING_COPY_ENGINE_OFF_BIT` with either of those, an
///   unset `struct_size` or fields this version does not know set are errors.
///
/// Which producer for which lane: `vkgdr_ring_producer_create` claims a lane for one thread
/// (records appended without locks, batches published with one fence and one tail store, large
/// records by the copy engine); `vkgdr_ring_push` / `vkgdr_ring_reserve` from any thread share
/// the calling thread's lane (thread index modulo the lane count) and publish every record on
/// its own.
///
/// Returns a handle, or `NULL` on error (bad options or capacity, a `vkgdr_open_vulkan` handle,
/// a driver failure).
///
/// Thread safety: any thread. Free it with `vkgdr_ring_destroy` once the consumer is done.
///
/// # Safety
/// - `options` is NULL or readable for `options->struct_size` bytes.
/// - No thread closes `g` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_create_with_options(
    g: vkgdr_t,
    capacity: u64,
    options: *const vkgdr_ring_options,
) -> vkgdr_ring_t {
    guard("vkgdr_ring_create_with_options", null_mut(), || {
        let o = if options.is_null() {
            vkgdr_ring_options::defaults()
        } else {
            // SAFETY: readable for its struct_size (caller).
            unsafe { versioned::read(options, vkgdr_ring_options::defaults()) }?
        };
        let options = o.to_options()?;
        // SAFETY: the caller does not close `g` during the call.
        let gpu = unsafe { device(g) }?.gpu()?;
        let r = make_ring(gpu, capacity, options, o.flags)?;
        register(&RINGS, Arc::new(r))
    })
}

/// Destroys a ring handle. `NULL` is ignored. Open reservations and producers
/// (`vkgdr_ring_producer_t`) keep the ring alive until they are committed, cancelled or
/// destroyed; when the last of them goes, the ring goes as described here. Sets the ring's
/// `stop` word (as `vkgdr_ring_stop`) and never waits: with a consumer registered by
/// `vkgdr_ring_watch_consumer`, the ring's memory is kept until that consumer has exited;
/// otherwise it is released after the legacy default stream's queued work, so a consumer on
/// another stream must have finished with it.
///
/// Errors (reported through `vkgdr_last_error()` only): a handle already destroyed or not a
/// `vkgdr_ring_t`.
///
/// Thread safety: any thread, but not while another thread is using the same ring.
///
/// # Safety
/// - No other thread uses `ring` during or after the call; no kernel reads it any more, unless
///   it is the consumer registered with `vkgdr_ring_watch_consumer`.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_destroy(ring: vkgdr_ring_t) {
    guard("vkgdr_ring_destroy", (), || release(&RINGS, ring))
}

/// Appends one record with the `size`-byte payload at `payload` and publishes it to the consumer
/// (records of all threads reach the consumer in the order their space was reserved).
///
/// - `timeout_ns`: how long to wait for the consumer to free space: negative waits forever, 0
///   tries once.
/// - `seq`: NULL, or where to store the record's sequence number (0, 1, 2, ... per ring).
///
/// Returns `VKGDR_SUCCESS`; `VKGDR_RING_FULL` if no room appeared in time (nothing written); or
/// `VKGDR_ERROR` (an invalid handle, `payload` NULL, a zero size or one larger than the ring
/// takes, a consumer head that makes no sense).
///
/// Thread safety: any thread, concurrently.
///
/// # Safety
/// - `payload` is readable for `size` bytes; `seq` is NULL or writable.
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_push(
    ring: vkgdr_ring_t,
    payload: *const c_void,
    size: usize,
    timeout_ns: i64,
    seq: *mut u64,
) -> c_int {
    guard("vkgdr_ring_push", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        let r = unsafe { self::ring(ring) }?;
        if payload.is_null() {
            return Err(Failure::Api("the payload pointer is NULL".into()));
        }
        // SAFETY: readable for `size` bytes (caller).
        let bytes = unsafe { crate::copy::host_slice(payload, size) }?;
        match r.push(bytes, timeout(timeout_ns)) {
            Ok(n) => {
                // SAFETY: `seq` is NULL or writable (caller).
                unsafe { write_optional(seq, n) };
                Ok(VKGDR_SUCCESS)
            }
            Err(vkgdr::Error::Ring(RingError::Full | RingError::Timeout)) => Ok(VKGDR_RING_FULL),
            Err(e) => Err(e.into()),
        }
    })
}

/// Reserves space for one record with a `size`-byte payload and gives it the next sequence
/// number, for producers that need the number in the payload or write it piece by piece:
/// write with `vkgdr_ring_reservation_write`, then `vkgdr_ring_commit`. Records are consumed in
/// reservation order; a reservation not yet committed holds back the records reserved after it,
/// so commit promptly (and never wait for ring space while holding one).
///
/// - `timeout_ns`: as for `vkgdr_ring_push`.
/// - `reservation`: where to store the handle (set to NULL unless `VKGDR_SUCCESS`).
///
/// Returns `VKGDR_SUCCESS`; `VKGDR_RING_FULL` if no room appeared in time; or `VKGDR_ERROR` (an
/// invalid handle, `reservation` NULL, a zero size or one larger than the ring takes).
///
/// Thread safety: any thread, concurrently.
///
/// # Safety
/// - `reservation` is writable.
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_reserve(
    ring: vkgdr_ring_t,
    size: usize,
    timeout_ns: i64,
    reservation: *mut vkgdr_ring_reservation_t,
) -> c_int {
    guard("vkgdr_ring_reserve", VKGDR_ERROR, || {
        if reservation.is_null() {
            return Err(Failure::Api("the reservation pointer is NULL".into()));
        }
        // SAFETY: writable (caller).
        unsafe { reservation.write(std::ptr::null_mut()) };
        // SAFETY: the caller does not destroy `ring` during the call.
        let r = unsafe { self::ring(ring) }?.clone();
        let res = match r.reserve(payload_len(size)?, timeout(timeout_ns)) {
            Ok(res) => res,
            Err(vkgdr::Error::Ring(RingError::Full | RingError::Timeout)) => {
                return Ok(VKGDR_RING_FULL)
            }
            Err(e) => return Err(e.into()),
        };
        // SAFETY: the reservation borrows the `DeviceRing` inside the `Arc` that
        // `OpenReservation::ring` keeps alive, at a fixed address, until after the reservation
        // is dropped (see its `Drop`).
        let res = unsafe {
            std::mem::transmute::<Reservation<'_, BarSink>, Reservation<'static, BarSink>>(res)
        };
        let open = OpenReservation {
            reservation: Mutex::new(Some(res)),
            ring: ManuallyDrop::new(r),
        };
        let h = register(&RESERVATIONS, open)?;
        // SAFETY: writable (caller).
        unsafe { reservation.write(h) };
        Ok(VKGDR_SUCCESS)
    })
}

/// The sequence number of a reserved record, or `UINT64_MAX` on error (an invalid handle).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread commits or cancels `reservation` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_reservation_get_seq(
    reservation: vkgdr_ring_reservation_t,
) -> u64 {
    guard("vkgdr_ring_reservation_get_seq", u64::MAX, || {
        // SAFETY: the caller does not commit or cancel it during the call.
        let open = unsafe { lookup(&RESERVATIONS, reservation) }?;
        let seq = open
            .reservation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(Reservation::seq);
        seq.ok_or_else(|| Failure::Api("the reservation is already finished".into()))
    })
}

/// Copies `size` bytes from `src` to payload offset `offset` of a reserved record (into the
/// ring's BAR-mapped memory; a record of a mirrored ring may continue at the region's start,
/// which this handles).
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, a range outside the payload,
/// `src` NULL with `size` > 0).
///
/// Thread safety: any thread; calls on one reservation are serialised.
///
/// # Safety
/// - `src` is readable for `size` bytes.
/// - No thread commits or cancels `reservation` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_reservation_write(
    reservation: vkgdr_ring_reservation_t,
    offset: usize,
    src: *const c_void,
    size: usize,
) -> c_int {
    guard("vkgdr_ring_reservation_write", VKGDR_ERROR, || {
        // SAFETY: the caller does not commit or cancel it during the call.
        let open = unsafe { lookup(&RESERVATIONS, reservation) }?;
        // SAFETY: readable for `size` bytes (caller).
        let bytes = unsafe { crate::copy::host_slice(src, size) }?;
        let mut guard = open
            .reservation
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let res = guard
            .as_mut()
            .ok_or_else(|| Failure::Api("the reservation is already finished".into()))?;
        let at = u32::try_from(offset).map_err(|_| {
            Failure::Library(
                RingError::OutOfRange {
                    at: offset as u64,
                    len: size as u64,
                    record_len: res.len(),
                }
                .into(),
            )
        })?;
        res.write(at, bytes).map_err(vkgdr::Error::from)?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Commits a reserved record: it is published to the consumer as soon as every record reserved
/// before it is committed (possibly by this call, possibly by a later one of another thread).
/// Consumes the handle, also on error.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (a handle already committed or cancelled, or not a
/// reservation).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No other thread uses `reservation` during or after the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_commit(reservation: vkgdr_ring_reservation_t) -> c_int {
    guard("vkgdr_ring_commit", VKGDR_ERROR, || {
        let open = RESERVATIONS
            .remove(reservation.token())
            .map_err(|why| Failure::handle(Tag::Reservation, why))?;
        if let Some(res) = open
            .reservation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            res.commit();
        }
        Ok(VKGDR_SUCCESS)
    })
}

/// Abandons a reserved record: it becomes a padding record the consumer skips (it keeps its
/// sequence number, so numbering stays gapless). Consumes the handle. `NULL` is ignored.
///
/// Errors (reported through `vkgdr_last_error()` only): a handle already committed or
/// cancelled, or not a reservation.
///
/// Thread safety: any thread.
///
/// # Safety
/// - No other thread uses `reservation` during or after the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_cancel(reservation: vkgdr_ring_reservation_t) {
    guard("vkgdr_ring_cancel", (), || {
        release(&RESERVATIONS, reservation)
    })
}

/// Fills `*view` (whose `struct_size` the caller sets) with the addresses a consumer kernel
/// needs.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, `view` NULL or its `struct_size`
/// unset).
///
/// Thread safety: any thread.
///
/// # Safety
/// - `view` is NULL or writable for `view->struct_size` bytes.
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_get_device_view(
    ring: vkgdr_ring_t,
    view: *mut vkgdr_ring_device_view,
) -> c_int {
    guard("vkgdr_ring_get_device_view", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        let v = unsafe { self::ring(ring) }?.device_view();
        let out = vkgdr_ring_device_view {
            struct_size: std::mem::size_of::<vkgdr_ring_device_view>(),
            data: v.data,
            capacity: v.capacity,
            tail: v.tail,
            stop: v.stop,
            head: v.head,
            result: v.result,
            mirrored: u32::from(v.wrap == WrapMode::Mirrored),
            lanes: v.lanes,
            lane_data: v.lane_data,
        };
        // SAFETY: writable for its struct_size (caller).
        unsafe { versioned::write(view, &out) }?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Registers the ring's persistent consumer kernel, just launched on `stream`: records a CUDA
/// event there, after the launch. From then on a producer waiting for space (`vkgdr_ring_push`,
/// `vkgdr_ring_reserve` with a timeout) that the consumer will never free learns that it has
/// exited or died (`VKGDR_ERROR`, "the ring's consumer has stopped") instead of waiting out its
/// timeout, and `vkgdr_ring_destroy` keeps the ring's memory until the consumer has exited
/// without waiting for it. Call it again after launching a new consumer.
///
/// - `stream`: the stream the consumer was launched on (a `CUstream`, or the runtime's
///   `cudaStream_t`); `NULL` is the legacy default stream.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, the driver's failure to create
/// or record the event, e.g. `cuEventRecord failed (CUDA_ERROR_INVALID_HANDLE)` for a stream of
/// another context).
///
/// Thread safety: any thread.
///
/// # Safety
/// - `stream` is NULL, a special stream handle or a stream not yet destroyed, of the ring's
///   context.
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_watch_consumer(ring: vkgdr_ring_t, stream: CUstream) -> c_int {
    guard("vkgdr_ring_watch_consumer", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        let r = unsafe { self::ring(ring) }?;
        // SAFETY: a live stream of the ring's context, or NULL (the caller's contract).
        unsafe { r.watch_consumer_stream(stream.cast()) }?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Asks a persistent consumer to exit once it has consumed everything published (sets `stop`
/// after the last tail). Push nothing afterwards.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_stop(ring: vkgdr_ring_t) -> c_int {
    guard("vkgdr_ring_stop", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        unsafe { self::ring(ring) }?.stop();
        Ok(VKGDR_SUCCESS)
    })
}

/// The consumer's published head (how far it has consumed, in bytes since the start), read
/// from pinned host memory. `UINT64_MAX` on error (an invalid handle).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_get_head(ring: vkgdr_ring_t) -> u64 {
    guard("vkgdr_ring_get_head", u64::MAX, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        Ok(unsafe { self::ring(ring) }?.head())
    })
}

/// Copies the first `count` (at most 8) result words the consumer reported (the view's
/// `result`) into `words`. For the `ring_consume_*` kernels of `kernels/ring.cu`: records,
/// checksum sum, errors, next sequence number, position.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, `words` NULL, `count` > 8).
///
/// Thread safety: any thread.
///
/// # Safety
/// - `words` is writable for `count` values.
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_get_results(
    ring: vkgdr_ring_t,
    words: *mut u64,
    count: usize,
) -> c_int {
    guard("vkgdr_ring_get_results", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        let results = unsafe { self::ring(ring) }?.results();
        // SAFETY: forwarded from our caller.
        unsafe { copy_results(&results, words, count) }
    })
}

/// Number of lanes of the ring (1 unless it was made with `vkgdr_ring_options.lanes`), or 0 on
/// error (an invalid handle).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_get_lanes(ring: vkgdr_ring_t) -> u32 {
    guard("vkgdr_ring_get_lanes", 0, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        let r = unsafe { self::ring(ring) }?;
        Ok(r.lanes() as u32)
    })
}

/// The lane `lane` of `r`, or the C-facing error.
fn check_lane(r: &DeviceRing, lane: u32) -> CResult<usize> {
    let n = r.lanes();
    match usize::try_from(lane) {
        Ok(i) if i < n => Ok(i),
        _ => Err(Failure::Api(format!(
            "lane {lane} does not exist (the ring has {n})"
        ))),
    }
}

/// `vkgdr_ring_get_head` of lane `lane`: how far the consumer of that lane has consumed.
/// `UINT64_MAX` on error (an invalid handle, no such lane).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_get_lane_head(ring: vkgdr_ring_t, lane: u32) -> u64 {
    guard("vkgdr_ring_get_lane_head", u64::MAX, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        let r = unsafe { self::ring(ring) }?;
        Ok(r.head_of(check_lane(r, lane)?))
    })
}

/// `vkgdr_ring_get_results` of lane `lane`: the first `count` (at most 8) result words its
/// consumer reported (at the view's `result + lane * 256`).
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, no such lane, `words` NULL,
/// `count` > 8).
///
/// Thread safety: any thread.
///
/// # Safety
/// - `words` is writable for `count` values.
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_get_lane_results(
    ring: vkgdr_ring_t,
    lane: u32,
    words: *mut u64,
    count: usize,
) -> c_int {
    guard("vkgdr_ring_get_lane_results", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        let r = unsafe { self::ring(ring) }?;
        let results = r.results_of(check_lane(r, lane)?);
        // SAFETY: forwarded from our caller.
        unsafe { copy_results(&results, words, count) }
    })
}

/// Copies `count` result words into `words`, after checking the arguments.
///
/// # Safety
/// - `words` is writable for `count` values.
unsafe fn copy_results(
    results: &[u64; RESULT_WORDS],
    words: *mut u64,
    count: usize,
) -> CResult<c_int> {
    if count > RESULT_WORDS {
        return Err(Failure::Api(format!(
            "count {count} exceeds the {RESULT_WORDS} result words"
        )));
    }
    if count > 0 && words.is_null() {
        return Err(Failure::Api("the words pointer is NULL".into()));
    }
    // SAFETY: writable for `count` u64s (caller); `count` <= results.len().
    unsafe { std::ptr::copy_nonoverlapping(results.as_ptr(), words, count) };
    Ok(VKGDR_SUCCESS)
}

/// Fills `*stats` (whose `struct_size` the caller sets) with what the copy-engine path of the
/// ring's lanes has done so far, over every lane.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle, `stats` NULL or its
/// `struct_size` unset).
///
/// Thread safety: any thread.
///
/// # Safety
/// - `stats` is NULL or writable for `stats->struct_size` bytes.
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_get_copy_engine_stats(
    ring: vkgdr_ring_t,
    stats: *mut vkgdr_ring_copy_engine_stats,
) -> c_int {
    guard("vkgdr_ring_get_copy_engine_stats", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `ring` during the call.
        let s = unsafe { self::ring(ring) }?.copy_engine_stats();
        let out = vkgdr_ring_copy_engine_stats {
            struct_size: std::mem::size_of::<vkgdr_ring_copy_engine_stats>(),
            lanes_ready: u32::try_from(s.lanes_ready).unwrap_or(u32::MAX),
            unavailable: u32::from(s.unavailable.is_some()),
            copies: s.copies,
            bytes: s.bytes,
            fallbacks: s.fallbacks,
            stream_tails: s.stream_tails,
        };
        // SAFETY: writable for its struct_size (caller).
        unsafe { versioned::write(stats, &out) }?;
        Ok(VKGDR_SUCCESS)
    })
}

/// Why the ring's copy-engine path could not be made (its lanes then carry every record through
/// the BAR): a copy the caller releases with `free()`, or `NULL` when the path is fine (or not
/// made yet, or off) and on error (an invalid handle, reported through `vkgdr_last_error()`).
///
/// Thread safety: any thread.
///
/// # Safety
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_get_copy_engine_error(ring: vkgdr_ring_t) -> *mut c_char {
    guard("vkgdr_ring_get_copy_engine_error", null_mut(), || {
        // SAFETY: the caller does not destroy `ring` during the call.
        let s = unsafe { self::ring(ring) }?.copy_engine_stats();
        Ok(s.unavailable.map_or(null_mut(), |m| c_string_copy(&m)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(flags: u32, copy_engine_record: u64) -> vkgdr_ring_options {
        vkgdr_ring_options {
            lanes: 8,
            flags,
            copy_engine_record,
            ..vkgdr_ring_options::defaults()
        }
    }

    fn refusal(o: vkgdr_ring_options) -> String {
        match o.to_options() {
            Err(Failure::Api(message)) => message,
            other => panic!("{o:?} not refused as a misuse: {other:?}"),
        }
    }

    #[test]
    fn the_split_bit_picks_the_split_and_needs_a_record_size() {
        assert_eq!(
            options(0, 4096).to_options().unwrap().copy_engine,
            CopyEngine::FromRecord(4096)
        );
        assert_eq!(
            options(SPLIT, 4096).to_options().unwrap().copy_engine,
            CopyEngine::Split(4096)
        );
        let mirrored = options(SPLIT | MIRRORED, 1024).to_options().unwrap();
        assert_eq!(mirrored.copy_engine, CopyEngine::Split(1024));
        assert_eq!(mirrored.wrap, WrapMode::Mirrored);
        assert_eq!(
            options(0, 0).to_options().unwrap().copy_engine,
            CopyEngine::Auto
        );
        assert_eq!(
            options(OFF, 0).to_options().unwrap().copy_engine,
            CopyEngine::Off
        );
        assert!(refusal(options(OFF, 4096)).contains("VKGDR_RING_COPY_ENGINE_OFF_BIT keeps"));
        assert!(refusal(options(OFF | SPLIT, 4096)).contains("goes with neither"));

        assert!(refusal(options(SPLIT, 0)).contains("needs a copy_engine_record"));
        assert!(refusal(options(SPLIT | SHAREABLE, 4096)).contains(
            "VKGDR_RING_SHAREABLE_BIT does not go with VKGDR_RING_COPY_ENGINE_SPLIT_BIT"
        ));
        assert!(refusal(options(SPLIT | SHAREABLE, 0)).contains("a shareable ring has no copy"));
        assert!(refusal(options(SPLIT, 1 << 32)).contains("larger than UINT32_MAX"));
        assert!(refusal(options(16, 4096)).contains("unknown ring flag bits 0x10"));
    }
}
