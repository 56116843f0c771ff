//! Where a ring's bytes go: the [`RingSink`] seam (GPU memory through the BAR in the ring
//! layer, plain host memory here in [`HostSink`]).
#![allow(unsafe_code)] // the sink's two memory-touching methods are unsafe to call

use super::error::RingError;
use super::layout::{RingSource, MIN_CAPACITY};
use crate::core::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use crate::core::sync::CachePadded;

/// Where the ring's bytes go and how the consumer learns of them. Implementations for GPU memory
/// live with the driver layer.
///
/// The trait is safe to implement; its two memory-touching methods are `unsafe` to call, because
/// a sink over device memory trusts its caller for the range and for exclusivity: only the ring
/// core calls them, under the protocol described on each.
#[allow(unsafe_code)] // declares the two unsafe methods (callers' obligations in `# Safety`)
pub trait RingSink {
    /// Size of the data region in bytes ([`RingCore::new`](super::RingCore::new) checks it against
    /// its capacity).
    fn capacity(&self) -> u64;

    /// Stores `bytes` at `offset` of the data region.
    ///
    /// # Safety
    /// * `offset + bytes.len() <= capacity()` (never wrapping: a span that runs past the end is
    ///   split by the caller);
    /// * no other call writes any of these bytes concurrently, and the consumer has released
    ///   them (they lie outside the published, unconsumed records).
    unsafe fn write(&self, offset: u64, bytes: &[u8]);

    /// Makes this thread's earlier [`write`](Self::write)s visible to the consumer, then stores
    /// `tail`. For BAR memory: `sfence` (plus a flush if the memory is not host-coherent), an
    /// 8-byte atomic store of `tail`, `sfence`.
    ///
    /// # Safety
    /// * calls are serialised (one at a time, each after the previous one returned) with
    ///   strictly increasing `tail`, at most the capacity past the consumer's head;
    /// * every record below `tail` is completely written, either by this thread or by a thread
    ///   that called [`writes_done`](Self::writes_done) after its writes and handed the record
    ///   over with release/acquire ordering, so fencing this thread's stores is enough.
    unsafe fn publish(&self, tail: u64);

    /// [`publish`](Self::publish), told also `next_seq`, the sequence number of the first record
    /// after `tail`: the core calls this one. The default forgets the number; a sink whose
    /// consumer learns the pair (a producer in another process, whose owner checks both before
    /// passing the tail on) overrides it.
    ///
    /// # Safety
    /// As for [`publish`](Self::publish); `next_seq` is the number of DATA and abandoned records
    /// below `tail` since the ring's sequence numbers began.
    unsafe fn publish_seq(&self, tail: u64, next_seq: u64) {
        let _ = next_seq;
        // SAFETY: the caller keeps `publish`'s contract.
        unsafe { self.publish(tail) }
    }

    /// Called by the committing thread after its last write of a record and before the record
    /// can be published, possibly by another thread: a sink over write-combined memory must drain
    /// this thread's stores here (`sfence`). The default does nothing (enough for sinks whose
    /// writes are ordered by the core's release/acquire hand-over, like [`HostSink`]).
    fn writes_done(&self) {}

    /// Records of at least this many bytes in the ring (header and padding included) that an
    /// exclusive [`Producer`](super::Producer) writes go through [`stage`](Self::stage) and
    /// [`publish_staged`](Self::publish_staged): a staging copy of the region that something
    /// else (a copy engine) moves into place before the tail. `None` (the default): every byte
    /// goes through [`write`](Self::write). Read once, when a producer claims the ring.
    fn stage_threshold(&self) -> Option<u64> {
        None
    }

    /// A large record is staged only once this many bytes (records with headers) are pending
    /// before it in the producer's unpublished batch: a publication must carry enough to pay for
    /// what a staged one costs (a copy engine's: a few driver calls). `0` (the default): every
    /// large record.
    fn stage_after_pending(&self) -> u64 {
        0
    }

    /// Stores `bytes` at `offset` of the staging copy; the consumer sees them only after a
    /// [`publish_staged`](Self::publish_staged) whose range covers them. The default writes
    /// them in place (a sink without staging).
    ///
    /// # Safety
    /// As for [`write`](Self::write).
    unsafe fn stage(&self, offset: u64, bytes: &[u8]) {
        // SAFETY: the caller keeps `write`'s contract.
        unsafe { self.write(offset, bytes) }
    }

    /// Moves the staged bytes of positions `[from, tail)` into the region, then publishes
    /// `tail` after them (and after this thread's [`write`](Self::write)s below `from`). Must
    /// not wait for the consumer. The default publishes at once (a sink whose
    /// [`stage`](Self::stage) writes in place).
    ///
    /// # Safety
    /// As for [`publish`](Self::publish); besides, `from <= tail`, `tail - from <= capacity()`,
    /// and every byte of `[from, tail)` was written through [`stage`](Self::stage) (those of
    /// earlier positions through [`write`](Self::write)).
    unsafe fn publish_staged(&self, from: u64, tail: u64) {
        let _ = from;
        // SAFETY: the caller keeps `publish`'s contract.
        unsafe { self.publish(tail) }
    }
}

/// Host-memory [`RingSink`] and [`RingSource`]: a CPU-only ring for tests, models and consumers
/// without a GPU. Bytes are relaxed atomics; [`tail`](Self::tail) is a release/acquire pair, as
/// the GPU's fence-and-load pair is in the real ring.
#[derive(Debug)]
pub struct HostSink {
    data: Box<[AtomicU8]>,
    tail: CachePadded<AtomicU64>,
    /// A staging copy, its record threshold and the bytes pending before a staged record
    /// ([`with_staging`](Self::with_staging)).
    staging: Option<(Box<[AtomicU8]>, u64, u64)>,
}

impl HostSink {
    /// A zeroed region of `capacity` bytes (a power of two of at least [`MIN_CAPACITY`]).
    pub fn new(capacity: u64) -> Result<Self, RingError> {
        check_capacity(capacity)?;
        Ok(Self {
            data: zeroed(capacity)?,
            tail: CachePadded(AtomicU64::new(0)),
            staging: None,
        })
    }

    /// Like [`new`](Self::new), with a staging copy of the region: a producer writes records of
    /// at least `threshold` bytes there, and a staged publication copies its range into the
    /// region before it stores the tail, as a copy engine does for a GPU ring. For testing the
    /// producer's choice of path against a model.
    pub fn with_staging(capacity: u64, threshold: u64) -> Result<Self, RingError> {
        Self::with_staging_after(capacity, threshold, 0)
    }

    /// [`with_staging`](Self::with_staging), staging a large record only once `after_pending`
    /// bytes are pending before it (see [`RingSink::stage_after_pending`]).
    pub fn with_staging_after(
        capacity: u64,
        threshold: u64,
        after_pending: u64,
    ) -> Result<Self, RingError> {
        Ok(Self {
            staging: Some((zeroed(capacity)?, threshold, after_pending)),
            ..Self::new(capacity)?
        })
    }

    /// The last published tail (acquire: the records below it are readable).
    pub fn tail(&self) -> u64 {
        self.tail.load(Ordering::Acquire)
    }
}

#[allow(unsafe_code)] // implements the unsafe methods with safe bodies
impl RingSink for HostSink {
    fn capacity(&self) -> u64 {
        self.data.len() as u64
    }

    /// # Safety
    /// As the trait says; this sink checks the range anyway (a panic, not a stray write) and
    /// stores relaxed atomics, so a protocol bug shows as wrong bytes, never as a data race.
    unsafe fn write(&self, offset: u64, bytes: &[u8]) {
        let start = offset as usize;
        for (cell, &b) in self.data[start..start + bytes.len()].iter().zip(bytes) {
            cell.store(b, Ordering::Relaxed);
        }
    }

    unsafe fn publish(&self, tail: u64) {
        self.tail.store(tail, Ordering::Release);
    }

    fn stage_threshold(&self) -> Option<u64> {
        self.staging.as_ref().map(|(_, threshold, _)| *threshold)
    }

    fn stage_after_pending(&self) -> u64 {
        self.staging.as_ref().map_or(0, |(_, _, after)| *after)
    }

    /// # Safety
    /// As the trait says; checked as [`write`](RingSink::write) is.
    unsafe fn stage(&self, offset: u64, bytes: &[u8]) {
        let Some((staging, _, _)) = &self.staging else {
            // SAFETY: forwarded (a sink without staging writes in place).
            return unsafe { self.write(offset, bytes) };
        };
        let start = offset as usize;
        for (cell, &b) in staging[start..start + bytes.len()].iter().zip(bytes) {
            cell.store(b, Ordering::Relaxed);
        }
    }

    unsafe fn publish_staged(&self, from: u64, tail: u64) {
        if let Some((staging, _, _)) = &self.staging {
            let mask = self.data.len() as u64 - 1;
            for pos in from..tail {
                let i = (pos & mask) as usize;
                self.data[i].store(staging[i].load(Ordering::Relaxed), Ordering::Relaxed);
            }
        }
        self.tail.store(tail, Ordering::Release);
    }
}

impl RingSource for HostSink {
    fn capacity(&self) -> u64 {
        self.data.len() as u64
    }

    /// # Panics
    /// If the range is outside the region.
    fn read(&self, offset: u64, out: &mut [u8]) {
        let start = offset as usize;
        let cells = &self.data[start..start + out.len()];
        for (b, cell) in out.iter_mut().zip(cells) {
            *b = cell.load(Ordering::Relaxed);
        }
    }
}

/// `capacity` zeroed bytes, allocated fallibly: a huge capacity is an error, not an abort.
fn zeroed(capacity: u64) -> Result<Box<[AtomicU8]>, RingError> {
    let len = usize::try_from(capacity).map_err(|_| RingError::InvalidCapacity(capacity))?;
    let mut data = Vec::new();
    data.try_reserve_exact(len)
        .map_err(|_| RingError::HostMemory(capacity))?;
    data.extend((0..len).map(|_| AtomicU8::new(0)));
    Ok(data.into_boxed_slice())
}

pub(super) fn check_capacity(capacity: u64) -> Result<(), RingError> {
    if capacity.is_power_of_two() && capacity >= MIN_CAPACITY {
        Ok(())
    } else {
        Err(RingError::InvalidCapacity(capacity))
    }
}
