//! Exclusive producers of a ring (`vkgdr_ring_producer_*`), a thin layer over
//! [`vkgdr::ring::OwnedProducer`]: a producer claims one lane of a ring for itself, appends
//! records without locks or atomic read-modify-writes, publishes a whole batch with one fence and
//! one tail store, and hands its large records to a copy engine (`vkgdr_ring_options`).

use std::ffi::{c_int, c_void};
use std::sync::LazyLock;
use std::time::Duration;

// std's Mutex like crate::handles (Miri); a poisoned lock still holds a valid producer: every
// library call leaves the producer consistent, even one a panic interrupted.
use std::sync::{Mutex, MutexGuard, PoisonError};
use vkgdr::ring::core::{FlushPolicy, RingError};
use vkgdr::ring::OwnedProducer;

use crate::error::{guard, CResult, Failure};
use crate::handles::{HandleTable, Tag};
use crate::ring::{payload_len, timeout, vkgdr_ring_t, VKGDR_RING_FULL};
use crate::{lookup, register, release, write_optional, VKGDR_ERROR, VKGDR_SUCCESS};

/// Opaque handle to a ring producer.
pub struct vkgdr_ring_producer {
    _private: [u8; 0],
}

/// Opaque handle to the exclusive producer of one lane of a ring, from
/// `vkgdr_ring_producer_create`; freed with `vkgdr_ring_producer_destroy`.
pub type vkgdr_ring_producer_t = *mut vkgdr_ring_producer;

/// Live `vkgdr_ring_producer_t` handles. The mutex keeps two C threads calling through one
/// handle from aliasing the `&mut` every producer call takes (uncontended for the one thread a
/// producer is meant for).
static PRODUCERS: LazyLock<HandleTable<Mutex<OwnedProducer>>> =
    LazyLock::new(|| HandleTable::new(Tag::Producer));

/// The producer behind `p`, locked.
///
/// # Safety
/// - No thread destroys `p` while the guard is in use.
unsafe fn producer<'a>(p: vkgdr_ring_producer_t) -> CResult<MutexGuard<'a, OwnedProducer>> {
    // SAFETY: forwarded to our caller.
    let m = unsafe { lookup(&PRODUCERS, p) }?;
    Ok(m.lock().unwrap_or_else(PoisonError::into_inner))
}

/// A record call's result as C sees it: `VKGDR_SUCCESS` with `*seq` set, `VKGDR_RING_FULL`
/// when no room appeared in time, or the error.
///
/// # Safety
/// - `seq` is NULL or writable.
unsafe fn record_result(result: Result<u64, RingError>, seq: *mut u64) -> CResult<c_int> {
    match result {
        Ok(n) => {
            // SAFETY: `seq` is NULL or writable (caller).
            unsafe { write_optional(seq, n) };
            Ok(VKGDR_SUCCESS)
        }
        Err(RingError::Full | RingError::Timeout) => Ok(VKGDR_RING_FULL),
        Err(e) => Err(vkgdr::Error::from(e).into()),
    }
}

/// `size` payload bytes at `payload`, checked as `vkgdr_ring_push` checks them.
///
/// # Safety
/// - `payload` is NULL or readable for `size` bytes.
unsafe fn payload<'a>(payload: *const c_void, size: usize) -> CResult<&'a [u8]> {
    if payload.is_null() {
        return Err(Failure::Api("the payload pointer is NULL".into()));
    }
    payload_len(size)?;
    // SAFETY: readable for `size` bytes (caller).
    unsafe { crate::copy::host_slice(payload, size) }
}

/// A producer call that appends one record: [`OwnedProducer::push`] or [`OwnedProducer::write`].
type AppendOp = fn(&mut OwnedProducer, &[u8], Option<Duration>) -> Result<u64, RingError>;

/// The body of `vkgdr_ring_producer_push` and `_write`: one record through `op`, reported as
/// [`record_result`] does.
///
/// # Safety
/// - As for `vkgdr_ring_producer_push`: `payload` readable for `size` bytes, `seq` NULL or
///   writable, `producer` not destroyed during the call.
unsafe fn append(
    op: AppendOp,
    producer: vkgdr_ring_producer_t,
    payload: *const c_void,
    size: usize,
    timeout_ns: i64,
    seq: *mut u64,
) -> CResult<c_int> {
    // SAFETY: the caller does not destroy `producer` during the call.
    let mut p = unsafe { self::producer(producer) }?;
    // SAFETY: readable for `size` bytes (caller).
    let bytes = unsafe { self::payload(payload, size) }?;
    // SAFETY: `seq` is NULL or writable (caller).
    unsafe { record_result(op(&mut p, bytes, timeout(timeout_ns)), seq) }
}

/// Creates the exclusive producer of one lane of `ring`: it claims a lane that has no producer
/// and no shared reservation in flight (the search starts after the lane the previous producer
/// took, so producers spread over the lanes). Records it writes are numbered 0, 1, 2, ... per
/// lane, continuing from what the lane's earlier producers and shared pushes wrote. The
/// producer keeps the ring alive: `vkgdr_ring_destroy` before `vkgdr_ring_producer_destroy` is
/// allowed (the ring then goes when the producer does).
///
/// While a lane has a producer, `vkgdr_ring_push` and `vkgdr_ring_reserve` of threads that map
/// to that lane wait for it (give the producer threads lanes of their own: create the ring with
/// more lanes than producers when shared pushes are wanted too).
///
/// Returns a handle, or `NULL` on error: an invalid handle; every lane has a producer already
/// ("every one of the ring's N lanes has a producer"); shared reservations in flight on the
/// only free lanes; the ring was stopped (`vkgdr_ring_stop`).
///
/// Thread safety: any thread. The producer is for one thread at a time (calls on one producer
/// from several threads are serialised by a lock); it may move between threads.
///
/// # Safety
/// - No thread destroys `ring` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_producer_create(ring: vkgdr_ring_t) -> vkgdr_ring_producer_t {
    guard("vkgdr_ring_producer_create", std::ptr::null_mut(), || {
        // SAFETY: the caller does not destroy `ring` during the call.
        let r = unsafe { crate::ring::ring(ring) }?;
        let p = match r.owned_producer() {
            Ok(p) => p,
            Err(vkgdr::Error::Ring(RingError::Claimed)) => {
                return Err(Failure::Api(format!(
                    "every one of the ring's {} lanes has a producer: destroy one, or create \
                     the ring with more lanes (vkgdr_ring_options.lanes)",
                    r.lanes()
                )))
            }
            Err(e) => return Err(e.into()),
        };
        register(&PRODUCERS, Mutex::new(p))
    })
}

/// Destroys a producer: publishes what it has written and not yet published, and hands its
/// lane back (to a later producer, or to shared pushes). `NULL` is ignored. If the ring handle
/// was destroyed already and this was the last thing keeping the ring, the ring goes now (see
/// `vkgdr_ring_destroy`).
///
/// Errors (reported through `vkgdr_last_error()` only): a handle already destroyed or not a
/// `vkgdr_ring_producer_t`.
///
/// Thread safety: any thread, but not while another thread is using the same producer.
///
/// # Safety
/// - No other thread uses `producer` during or after the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_producer_destroy(producer: vkgdr_ring_producer_t) {
    guard("vkgdr_ring_producer_destroy", (), || {
        release(&PRODUCERS, producer)
    })
}

/// Appends one record with the `size`-byte payload at `payload` and publishes it at once,
/// together with anything written before (the lowest latency). A record of at least
/// `vkgdr_ring_options.copy_engine_record` bytes with 64 KiB written before it and not yet
/// published goes through pinned memory and a copy engine; a lone one takes the BAR.
///
/// - `timeout_ns`: how long to wait for the consumer to free space: negative waits forever
///   (until the watched consumer has exited), 0 tries once.
/// - `seq`: NULL, or where to store the record's sequence number in its lane.
///
/// Returns `VKGDR_SUCCESS`; `VKGDR_RING_FULL` if no room appeared in time (nothing written); or
/// `VKGDR_ERROR` (an invalid handle, `payload` NULL, a zero size or one larger than the ring
/// takes, a consumer that has stopped).
///
/// Thread safety: any thread, one at a time per producer (see `vkgdr_ring_producer_create`).
///
/// # Safety
/// - `payload` is readable for `size` bytes; `seq` is NULL or writable.
/// - No thread destroys `producer` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_producer_push(
    producer: vkgdr_ring_producer_t,
    payload: *const c_void,
    size: usize,
    timeout_ns: i64,
    seq: *mut u64,
) -> c_int {
    guard("vkgdr_ring_producer_push", VKGDR_ERROR, || {
        // SAFETY: the caller's contract, forwarded.
        unsafe {
            append(
                OwnedProducer::push,
                producer,
                payload,
                size,
                timeout_ns,
                seq,
            )
        }
    })
}

/// Appends one record like `vkgdr_ring_producer_push` but publishes it only when the flush
/// policy says so (`vkgdr_ring_producer_set_flush_policy`; by default once 64 KiB wait), or at
/// the next push, `vkgdr_ring_producer_flush`, wait for space or destroy: many records then cost
/// one fence and one tail store. Call `vkgdr_ring_producer_flush` when a burst ends: nothing
/// publishes records that are left waiting otherwise.
///
/// Returns and waits as `vkgdr_ring_producer_push`.
///
/// Thread safety: any thread, one at a time per producer.
///
/// # Safety
/// - `payload` is readable for `size` bytes; `seq` is NULL or writable.
/// - No thread destroys `producer` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_producer_write(
    producer: vkgdr_ring_producer_t,
    payload: *const c_void,
    size: usize,
    timeout_ns: i64,
    seq: *mut u64,
) -> c_int {
    guard("vkgdr_ring_producer_write", VKGDR_ERROR, || {
        // SAFETY: the caller's contract, forwarded.
        unsafe {
            append(
                OwnedProducer::write,
                producer,
                payload,
                size,
                timeout_ns,
                seq,
            )
        }
    })
}

/// Appends `count` records (`payloads[i]`, `sizes[i]` bytes each) and publishes them all with
/// one fence and one tail store (a batch larger than the free space is published in pieces while
/// waiting for more). Their sequence numbers are `next_seq`, `next_seq + 1`, ... as
/// `vkgdr_ring_producer_get_next_seq` said before the call.
///
/// - `timeout_ns`: as for `vkgdr_ring_producer_push`, for each wait.
/// - `written`: NULL, or where to store how many records were written (and published), also on
///   `VKGDR_RING_FULL` and `VKGDR_ERROR`.
///
/// Returns `VKGDR_SUCCESS`; `VKGDR_RING_FULL` if no room appeared in time for a record (the ones
/// before it are published); or `VKGDR_ERROR` (an invalid handle, `payloads` or `sizes` NULL with
/// `count` > 0, a NULL payload, a zero size or one larger than the ring takes: the records
/// before it are published).
///
/// Thread safety: any thread, one at a time per producer.
///
/// # Safety
/// - `payloads` and `sizes` are readable for `count` entries; each `payloads[i]` is readable
///   for `sizes[i]` bytes; `written` is NULL or writable.
/// - No thread destroys `producer` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_producer_push_batch(
    producer: vkgdr_ring_producer_t,
    payloads: *const *const c_void,
    sizes: *const usize,
    count: usize,
    timeout_ns: i64,
    written: *mut usize,
) -> c_int {
    guard("vkgdr_ring_producer_push_batch", VKGDR_ERROR, || {
        // SAFETY: `written` is NULL or writable (caller).
        unsafe { write_optional(written, 0) };
        // SAFETY: the caller does not destroy `producer` during the call.
        let mut p = unsafe { self::producer(producer) }?;
        if count == 0 {
            return Ok(VKGDR_SUCCESS);
        }
        if payloads.is_null() || sizes.is_null() {
            return Err(Failure::Api("the payloads or sizes pointer is NULL".into()));
        }
        // SAFETY: readable for `count` entries each (caller).
        let (ptrs, lens) = unsafe {
            (
                std::slice::from_raw_parts(payloads, count),
                std::slice::from_raw_parts(sizes, count),
            )
        };
        // Checked before anything is written, so that a bad entry never leaves half a batch.
        for (i, (&ptr, &len)) in ptrs.iter().zip(lens).enumerate() {
            if ptr.is_null() {
                return Err(Failure::Api(format!("payloads[{i}] is NULL")));
            }
            payload_len(len)?;
        }
        // SAFETY: each non-NULL (checked) and readable for its size (caller).
        let records = ptrs
            .iter()
            .zip(lens)
            .map(|(&ptr, &len)| unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) });
        // Every record takes one sequence number: their difference counts what went in, also
        // when the batch stops early.
        let first = p.next_seq();
        let result = p.push_batch(records, timeout(timeout_ns));
        // SAFETY: `written` is NULL or writable (caller); the count is at most `count`, a usize.
        unsafe { write_optional(written, (p.next_seq() - first) as usize) };
        // SAFETY: NULL is allowed for `seq`.
        unsafe { record_result(result, std::ptr::null_mut()) }
    })
}

/// Publishes every record the producer has written and not yet published: one fence and one
/// tail store (nothing when nothing is waiting).
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle).
///
/// Thread safety: any thread, one at a time per producer.
///
/// # Safety
/// - No thread destroys `producer` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_producer_flush(producer: vkgdr_ring_producer_t) -> c_int {
    guard("vkgdr_ring_producer_flush", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `producer` during the call.
        unsafe { self::producer(producer) }?.flush();
        Ok(VKGDR_SUCCESS)
    })
}

/// Sets when `vkgdr_ring_producer_write` publishes: once `max_pending_bytes` bytes (records
/// with their headers) wait (0: every record at once), or once the oldest waiting record has
/// waited `max_delay_ns` nanoseconds (negative: no time bound), checked on each write — there is
/// no timer: a producer that goes idle calls `vkgdr_ring_producer_flush`. The default is 64 KiB
/// and no time bound.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle).
///
/// Thread safety: any thread, one at a time per producer.
///
/// # Safety
/// - No thread destroys `producer` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_producer_set_flush_policy(
    producer: vkgdr_ring_producer_t,
    max_pending_bytes: u64,
    max_delay_ns: i64,
) -> c_int {
    guard("vkgdr_ring_producer_set_flush_policy", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `producer` during the call.
        let mut p = unsafe { self::producer(producer) }?;
        p.set_policy(FlushPolicy {
            max_pending_bytes,
            max_delay: u64::try_from(max_delay_ns).ok().map(Duration::from_nanos),
        });
        Ok(VKGDR_SUCCESS)
    })
}

/// Sets how many bytes (records with their headers) of a batch not yet published a producer
/// writes through the BAR before it stages a record of `vkgdr_ring_options.copy_engine_record`
/// bytes or more for the copy engine; from its next record on. A producer starts at 64 KiB, so
/// that a lone large record or a short batch keeps the BAR, which is quicker for it. 0 stages
/// every such record, the first of a batch and a lone one included: for producers streaming
/// large records beside a lane whose lone records must arrive quickly, which otherwise wait
/// behind the BAR stores of those batches' first 64 KiB. `UINT64_MAX` stages none. No effect
/// on a lane whose records all take the BAR.
///
/// Returns `VKGDR_SUCCESS`, or `VKGDR_ERROR` (an invalid handle).
///
/// Thread safety: any thread, one at a time per producer.
///
/// # Safety
/// - No thread destroys `producer` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_producer_set_stage_after(
    producer: vkgdr_ring_producer_t,
    bytes: u64,
) -> c_int {
    guard("vkgdr_ring_producer_set_stage_after", VKGDR_ERROR, || {
        // SAFETY: the caller does not destroy `producer` during the call.
        unsafe { self::producer(producer) }?.set_stage_after(bytes);
        Ok(VKGDR_SUCCESS)
    })
}

/// What `vkgdr_ring_producer_set_stage_after` last set (64 KiB at first), or `UINT64_MAX` on
/// error (an invalid handle; `UINT64_MAX` is also what a producer set to stage nothing holds).
///
/// Thread safety: any thread, one at a time per producer.
///
/// # Safety
/// - No thread destroys `producer` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_producer_get_stage_after(
    producer: vkgdr_ring_producer_t,
) -> u64 {
    guard("vkgdr_ring_producer_get_stage_after", u64::MAX, || {
        // SAFETY: the caller does not destroy `producer` during the call.
        Ok(unsafe { self::producer(producer) }?.stage_after())
    })
}

/// The sequence number the producer's next record gets (in its lane), or `UINT64_MAX` on error
/// (an invalid handle).
///
/// Thread safety: any thread, one at a time per producer.
///
/// # Safety
/// - No thread destroys `producer` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_producer_get_next_seq(producer: vkgdr_ring_producer_t) -> u64 {
    guard("vkgdr_ring_producer_get_next_seq", u64::MAX, || {
        // SAFETY: the caller does not destroy `producer` during the call.
        Ok(unsafe { self::producer(producer) }?.next_seq())
    })
}

/// The lane the producer owns (0 to lanes - 1: its consumer's head and result words are
/// `vkgdr_ring_get_lane_head` and `vkgdr_ring_get_lane_results` of it), or `UINT32_MAX` on
/// error (an invalid handle).
///
/// Thread safety: any thread, one at a time per producer.
///
/// # Safety
/// - No thread destroys `producer` during the call.
#[no_mangle]
pub unsafe extern "C" fn vkgdr_ring_producer_get_lane(producer: vkgdr_ring_producer_t) -> u32 {
    guard("vkgdr_ring_producer_get_lane", u32::MAX, || {
        // SAFETY: the caller does not destroy `producer` during the call.
        let lane = unsafe { self::producer(producer) }?.lane();
        // At most MAX_LANES (64).
        Ok(lane as u32)
    })
}
