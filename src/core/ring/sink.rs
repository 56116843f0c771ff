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

    /// Called by the committing thread after its last write of a record and before the record
    /// can be published, possibly by another thread: a sink over write-combined memory must drain
    /// this thread's stores here (`sfence`). The default does nothing (enough for sinks whose
    /// writes are ordered by the core's release/acquire hand-over, like [`HostSink`]).
    fn writes_done(&self) {}
}

/// Host-memory [`RingSink`] and [`RingSource`]: a CPU-only ring for tests, models and consumers
/// without a GPU. Bytes are relaxed atomics; [`tail`](Self::tail) is a release/acquire pair, as
/// the GPU's fence-and-load pair is in the real ring.
#[derive(Debug)]
pub struct HostSink {
    data: Box<[AtomicU8]>,
    tail: CachePadded<AtomicU64>,
}

impl HostSink {
    /// A zeroed region of `capacity` bytes (a power of two of at least [`MIN_CAPACITY`]).
    pub fn new(capacity: u64) -> Result<Self, RingError> {
        check_capacity(capacity)?;
        let len = usize::try_from(capacity).map_err(|_| RingError::InvalidCapacity(capacity))?;
        // Fallibly: a huge capacity is an error, not an abort of the process.
        let mut data = Vec::new();
        data.try_reserve_exact(len)
            .map_err(|_| RingError::HostMemory(capacity))?;
        data.extend((0..len).map(|_| AtomicU8::new(0)));
        Ok(Self {
            data: data.into_boxed_slice(),
            tail: CachePadded(AtomicU64::new(0)),
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

pub(super) fn check_capacity(capacity: u64) -> Result<(), RingError> {
    if capacity.is_power_of_two() && capacity >= MIN_CAPACITY {
        Ok(())
    } else {
        Err(RingError::InvalidCapacity(capacity))
    }
}
