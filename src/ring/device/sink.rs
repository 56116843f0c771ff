//! [`BarSink`]: a lane's [`RingSink`] over BAR-mapped GPU memory, and the memory a ring's kernels
//! may touch ([`RingMemory`]), owned in one place.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::copy::WriteKernel;
use crate::core::handle::{assert_send_sync, SendSyncPtr};
use crate::core::ring::RingSink;
use crate::core::sync::store_fence;
use crate::error::{InvalidArgument, Result};
use crate::mapping::arena::Arena;
use crate::mapping::cuda_objects::PinnedBuffer;
use crate::mapping::memory::RawMemory;
use crate::mapping::Mapping;

use super::copy_engine::LaneCopy;

/// A data region: one raw allocation (a padded ring's lanes side by side), or a one-chunk arena
/// whose chunk is mapped a second time right after itself (one per lane of a mirrored ring), so
/// the GPU reads a record that runs past the end contiguously.
pub(super) enum RingData {
    Raw(RawMemory),
    Mirrored(Arena),
}

impl RingData {
    /// Host address of offset 0. The mirror exists only for the GPU: on the host the region is
    /// one mapping (the core splits writes at its end).
    pub(super) fn host_ptr(&self) -> Result<*mut u8> {
        match self {
            RingData::Raw(m) => Ok(m.host_ptr()),
            RingData::Mirrored(a) => a
                .host_ptr(0)
                .ok_or_else(|| InvalidArgument::RingArenaEmpty.into()),
        }
    }

    pub(super) fn device_ptr(&self) -> u64 {
        match self {
            RingData::Raw(m) => m.device_ptr(),
            RingData::Mirrored(a) => a.device_ptr(),
        }
    }

    /// Flushes `[offset, offset + len)` (within the region, not wrapping).
    fn flush(&self, offset: u64, len: u64) -> Result<()> {
        match self {
            RingData::Raw(m) => m.flush(offset, len),
            RingData::Mirrored(a) => a.flush(offset, len),
        }
    }
}

/// Everything a ring's kernels may touch, owned in one place so that one release can keep it
/// alive until its consumer has exited.
pub(super) struct RingMemory {
    pub(super) data: Vec<RingData>,
    pub(super) control: RawMemory,
    /// `head` and result words of every lane.
    pub(super) host_words: PinnedBuffer,
}

/// Writes one lane's records into BAR-mapped GPU memory and publishes its `tail` there.
///
/// Its [`RingSink`] methods are `unsafe` to call: a stray offset would write anywhere in the
/// process, and a stray tail would hand the kernel unwritten bytes. Only the ring core calls
/// them.
pub struct BarSink {
    pub(super) memory: Arc<RingMemory>,
    /// Which entry of `memory.data` and where in it this lane's region starts.
    pub(super) data_index: usize,
    pub(super) data_offset: u64,
    /// Host address of the lane's region, inside `memory` (kept alive beside it); written only
    /// through `RingSink::write`, whose callers guarantee disjoint in-range spans.
    pub(super) data: SendSyncPtr<u8>,
    /// Host address of the lane's `tail` word, inside `memory`; touched only through atomics.
    pub(super) tail: SendSyncPtr<u8>,
    pub(super) tail_offset: u64,
    pub(super) capacity: u64,
    /// The copy kernel every record is written with, picked once for the lane.
    pub(super) kernel: WriteKernel,
    /// Whether the data region is host-coherent (publishing then needs no flush).
    pub(super) coherent: bool,
    /// End of the last publication, for the non-coherent flush of `[published, tail)` (unused on
    /// coherent memory, where publishing needs no flush).
    pub(super) published: AtomicU64,
    /// Records of at least this size take the copy engine once `copy` exists (`None`: never).
    pub(super) copy_from: Option<u64>,
    /// The lane's copy-engine path, made when a producer first claims the lane.
    pub(super) copy: OnceLock<LaneCopy>,
}
// `Send + Sync` by its fields, as the compiler checks here.
const _: () = assert_send_sync::<BarSink>();

impl BarSink {
    /// Device address of the lane's region.
    pub(super) fn region_device_ptr(&self) -> u64 {
        self.memory.data[self.data_index].device_ptr() + self.data_offset
    }

    /// The BAR side of a publication up to `tail` whose records from `direct_end` on were
    /// staged: drains this thread's stores and, on non-coherent memory, flushes what was
    /// written through the BAR since the last publication.
    fn fence_direct(&self, direct_end: u64, tail: u64) {
        store_fence();
        if !self.coherent {
            let from = self.published.swap(tail, Ordering::AcqRel);
            self.flush_ring_range(from, direct_end.max(from));
        }
    }

    /// Stores `tail` into the tail word through the BAR (after `fence_direct`).
    fn store_tail(&self, tail: u64) {
        // SAFETY: an aligned 8-byte word inside the control allocation, which `self.memory`
        // keeps mapped; the host touches it only through atomics, so concurrent publications
        // (which the caller rules out anyway) could not race. One aligned store: the GPU never
        // sees a torn value.
        let word = unsafe { AtomicU64::from_ptr(self.tail.get().cast::<u64>()) };
        word.store(tail, Ordering::Release);
        let _ = self.memory.control.flush(self.tail_offset, 8);
        store_fence();
    }

    /// Loads the tail word through the BAR (uncached: about a microsecond), after an
    /// invalidate on non-coherent memory. On an invalidate error (a lost device) it says 0,
    /// which keeps later tails on the copy stream, as if the last one had not landed.
    pub(super) fn load_tail(&self) -> u64 {
        if self
            .memory
            .control
            .before_read(self.tail_offset, 8)
            .is_err()
        {
            return 0;
        }
        // SAFETY: as in `store_tail`: an aligned word inside the control allocation, touched by
        // the host only through atomics.
        let word = unsafe { AtomicU64::from_ptr(self.tail.get().cast::<u64>()) };
        word.load(Ordering::Acquire)
    }

    /// Writes staged bytes `[from, tail)` through the BAR (when their copy could not be queued).
    ///
    /// # Safety
    /// As for [`RingSink::publish_staged`].
    unsafe fn write_staged_through_bar(&self, copy: &LaneCopy, from: u64, tail: u64) {
        let cap = self.capacity;
        let at = from & (cap - 1);
        let len = tail - from;
        let first = len.min(cap - at);
        for (offset, n) in [(at, first), (0, len - first)] {
            if n > 0 {
                // SAFETY: staged, in range and owned by the publisher (the caller's contract);
                // the same span of the region is released by the consumer.
                unsafe { self.write(offset, copy.staged(offset, n)) };
            }
        }
        if !self.coherent {
            self.flush_ring_range(from, tail);
        }
        store_fence();
    }

    fn flush_ring_range(&self, from: u64, to: u64) {
        if from >= to {
            return;
        }
        let cap = self.capacity;
        let data = &self.memory.data[self.data_index];
        let (a, len) = (from & (cap - 1), (to - from).min(cap));
        // Flush errors cannot be returned through `publish`; on the coherent memory NVIDIA offers
        // no call is made, on non-coherent memory an error would mean a lost device, which the
        // consumer's checks then report. A range that wraps is flushed in two pieces.
        let _ = data.flush(self.data_offset + a, len.min(cap - a));
        if a + len > cap {
            let _ = data.flush(self.data_offset, a + len - cap);
        }
    }
}

#[allow(clippy::missing_safety_doc)] // the trait's `# Safety` sections apply
impl RingSink for BarSink {
    fn capacity(&self) -> u64 {
        self.capacity
    }

    unsafe fn write(&self, offset: u64, bytes: &[u8]) {
        debug_assert!(offset + bytes.len() as u64 <= self.capacity);
        // SAFETY: the caller guarantees an in-range span of this lane's region that no one else
        // writes; the mapping lives as long as `self.memory`. No fence per piece: `publish` (or
        // `writes_done`) fences.
        unsafe {
            self.kernel
                .write_unfenced(self.data.get().add(offset as usize), bytes)
        };
    }

    fn writes_done(&self) {
        // Drain this thread's record stores now, outside the in-order section.
        store_fence();
    }

    unsafe fn publish(&self, tail: u64) {
        // Drain this thread's write-combined stores before the tail can be seen. On
        // non-coherent memory push everything since the last publication first.
        self.fence_direct(tail, tail);
        if let Some(copy) = self.copy.get() {
            // A tail still queued on the copy stream would land after ours: queue ours behind
            // it (no copy). If that fails the context is lost and nothing queued will run.
            if copy.tail_in_flight(|| self.load_tail()) {
                // SAFETY: the caller is the publisher; an empty staged span.
                if unsafe { copy.queue(self.capacity, tail, tail) }.is_ok() {
                    return;
                }
            }
        }
        self.store_tail(tail);
    }

    fn stage_threshold(&self) -> Option<u64> {
        self.copy.get().and(self.copy_from)
    }

    fn stage_after_pending(&self) -> u64 {
        super::copy_engine::STAGE_AFTER_PENDING
    }

    unsafe fn stage(&self, offset: u64, bytes: &[u8]) {
        debug_assert!(offset + bytes.len() as u64 <= self.capacity);
        match self.copy.get() {
            // SAFETY: in range and owned (the trait's contract, which the staging copy shares
            // with the region).
            Some(copy) => unsafe { copy.stage(self.kernel, offset, bytes) },
            // SAFETY: forwarded; without a staging copy nothing is staged (no threshold).
            None => unsafe { self.write(offset, bytes) },
        }
    }

    unsafe fn publish_staged(&self, from: u64, tail: u64) {
        let Some(copy) = self.copy.get() else {
            // SAFETY: forwarded; `stage` wrote in place.
            return unsafe { self.publish(tail) };
        };
        // The direct records below `from` and the staged bytes are in memory before the engine
        // is told to read.
        self.fence_direct(from, tail);
        // SAFETY: the caller is the publisher and staged `[from, tail)`.
        if unsafe { copy.queue(self.capacity, from, tail) }.is_ok() {
            return;
        }
        copy.count_fallback();
        // SAFETY: forwarded.
        unsafe { self.write_staged_through_bar(copy, from, tail) };
        self.store_tail(tail);
    }
}
