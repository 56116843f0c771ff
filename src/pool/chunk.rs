//! A chunk of pool memory as the pool keeps it: the memory, its base addresses read once, and the
//! dirty ranges that writes through its blocks leave behind on non-coherent memory.

use std::fmt;
use std::sync::Arc;

use crate::core::dirty::DirtyRanges;
use crate::core::handle::SendSyncPtr;
use crate::core::sync::lock::Mutex;
use crate::error::Result;
use crate::mapping::chunk::ChunkMemory;

/// One chunk with its dirty-range tracker. Blocks hold an `Arc`, so the memory outlives them.
pub(super) struct Chunk {
    pub(super) memory: Box<dyn ChunkMemory>,
    /// `memory.host_ptr()` and `memory.device_ptr()`, read once: every block creation needs them.
    /// The host base keeps its provenance; it is only used to compute block addresses inside the
    /// chunk, which the chunk outlives, and is never written through here.
    pub(super) host_base: SendSyncPtr<u8>,
    pub(super) device_base: Option<u64>,
    pub(super) dirty: Mutex<DirtyRanges>,
    /// A number no other chunk of this process has had or will have: how the sharing layer
    /// tells chunks apart (an address can be reused once a chunk is gone).
    pub(super) serial: u64,
}

impl fmt::Debug for Chunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chunk")
            .field("size", &self.memory.size())
            .field("host_ptr", &self.memory.host_ptr())
            .finish()
    }
}

impl Chunk {
    /// Wraps a freshly allocated chunk with an empty dirty-range tracker of `atom` granularity.
    pub(super) fn new(memory: Box<dyn ChunkMemory>, atom: u64) -> Result<Arc<Chunk>> {
        let dirty = DirtyRanges::new(memory.size(), atom)?;
        static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Ok(Arc::new(Chunk {
            host_base: SendSyncPtr::new(memory.host_ptr()),
            device_base: memory.device_ptr(),
            memory,
            dirty: Mutex::new(dirty),
            serial: SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }))
    }

    /// Pushes every recorded dirty range to the device in one call and forgets them.
    pub(super) fn flush(&self, scratch: &mut Vec<(u64, u64)>) -> Result<()> {
        let mut dirty = self.dirty.lock();
        if dirty.is_empty() {
            return Ok(());
        }
        scratch.clear();
        scratch.extend(dirty.ranges());
        self.memory.flush_ranges(scratch)?;
        dirty.clear();
        Ok(())
    }
}
