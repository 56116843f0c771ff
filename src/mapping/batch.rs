//! [`WriteBatch`]: many small writes into mappings with one store fence at the end.
//!
//! A safe write ([`Mapping::write`]) ends with `sfence`, which waits for the core's write-combining
//! buffers to drain into the PCIe fabric: most of what a 64-byte update costs (figures:
//! BENCHMARKS.md, 'CPU copies through the BAR'). A program that updates many small blocks before
//! telling the GPU (one flag, one kernel launch) needs that wait once, after the last of them.

use std::marker::PhantomData;

use crate::core::range::check_range;
use crate::error::Result;
use crate::mapping::Mapping;

/// Writes into any [`Mapping`]s (pool blocks, raw allocations) without fencing each one; the
/// single `sfence` comes when the batch is [finished](WriteBatch::finish) or dropped.
///
/// Every write is bounds-checked and recorded (dirty ranges on non-coherent memory) exactly as
/// [`Mapping::write`] does it. Only the ordering differs: the batch's stores are guaranteed to
/// be ordered before any later store of this thread (a "ready" flag, a ring publication) only
/// once the batch has ended, so signal the device after `finish`, never in the middle of a
/// batch. Writes of at least
/// [`DEFAULT_PARALLEL_THRESHOLD`](crate::copy::DEFAULT_PARALLEL_THRESHOLD) bytes take the
/// ordinary (split, fenced) path.
///
/// A batch is neither `Send` nor `Sync`: `sfence` orders the stores of the thread that runs it,
/// so the thread that wrote must be the one that finishes.
///
/// ```no_run
/// use vkgdr::{Gpu, Pool, PoolConfig, WriteBatch};
/// # fn main() -> vkgdr::Result<()> {
/// let pool = Pool::new(Gpu::open(0)?, PoolConfig::default())?;
/// let mut blocks: Vec<_> = (0..16).map(|_| pool.alloc(64, 64)).collect::<Result<_, _>>()?;
/// let mut batch = WriteBatch::new();
/// for (i, block) in blocks.iter_mut().enumerate() {
///     batch.write(block, 0, &[i as u8; 64])?; // no fence yet
/// }
/// batch.finish(); // one sfence for all sixteen
/// pool.flush()?; // non-coherent memory only: push the recorded ranges
/// // ... now tell the kernel (a flag, a launch) ...
/// # Ok(()) }
/// ```
#[derive(Debug, Default)]
pub struct WriteBatch {
    /// Whether a store is waiting for the closing fence.
    pending: bool,
    /// `*const ()` is neither `Send` nor `Sync`: the batch stays on its thread.
    _same_thread: PhantomData<*const ()>,
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Copies `src` to `offset` of `mapping` like [`Mapping::write`] (bounds-checked, then
    /// flushed or recorded as dirty), leaving the store fence to the end of the batch.
    pub fn write<M: Mapping + ?Sized>(
        &mut self,
        mapping: &mut M,
        offset: u64,
        src: &[u8],
    ) -> Result<()> {
        check_range(offset, src.len() as u64, mapping.len())?;
        // SAFETY: the range lies inside the mapping (checked above), which stays valid while it
        // is borrowed; `&mut` excludes other safe writers, and `src` is a distinct host buffer.
        // The fence the unfenced copy leaves out is issued by `finish` or `drop` on this thread
        // (the batch cannot leave it), before any store made after the batch ends.
        unsafe { crate::copy::write_batched(mapping.host_ptr().add(offset as usize), src) };
        self.pending = true;
        mapping.after_write(offset, src.len() as u64)
    }

    /// Writes plain-old-data values at `offset` (which must suit `T`'s alignment), like
    /// [`Mapping::write_pod`], without the fence.
    pub fn write_pod<T: bytemuck::Pod, M: Mapping + ?Sized>(
        &mut self,
        mapping: &mut M,
        offset: u64,
        values: &[T],
    ) -> Result<()> {
        crate::mapping::check_pod_offset::<T>(mapping.host_ptr(), offset)?;
        self.write(mapping, offset, bytemuck::cast_slice(values))
    }

    /// Whether a write is waiting for the batch's fence.
    pub fn is_pending(&self) -> bool {
        self.pending
    }

    /// Ends the batch with one store fence: every write made through it is ordered before
    /// this thread's later stores. Dropping the batch does the same.
    pub fn finish(self) {
        drop(self);
    }
}

impl Drop for WriteBatch {
    fn drop(&mut self) {
        if self.pending {
            crate::core::sync::store_fence();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    /// Host memory as a mapping that records the ranges written, as a block on non-coherent
    /// memory records them to flush. Words, so `write_pod` sees an aligned base.
    struct HostWords {
        words: *mut [u64],
        written: Vec<(u64, u64)>,
    }

    impl HostWords {
        fn new(words: usize) -> Self {
            HostWords {
                words: Box::into_raw(vec![0u64; words].into_boxed_slice()),
                written: Vec::new(),
            }
        }
    }

    impl Drop for HostWords {
        fn drop(&mut self) {
            // SAFETY: made by `Box::into_raw` in `new`, freed once here.
            drop(unsafe { Box::from_raw(self.words) });
        }
    }

    // SAFETY: the pointer is the whole boxed slice, owned by `self` until it drops; nothing
    // else refers to it, and `&self` methods never write it.
    unsafe impl Mapping for HostWords {
        fn host_ptr(&self) -> *mut u8 {
            self.words.cast()
        }
        fn len(&self) -> u64 {
            8 * self.words.len() as u64
        }
        fn after_write(&mut self, offset: u64, len: u64) -> Result<()> {
            self.written.push((offset, len));
            Ok(())
        }
        fn before_read(&self, _: u64, _: u64) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn batched_writes_land_and_are_checked_like_plain_ones() {
        let mut maps: Vec<_> = (0..8).map(|_| HostWords::new(13)).collect(); // 104 bytes
        let mut batch = WriteBatch::new();
        assert!(!batch.is_pending());
        for (i, m) in maps.iter_mut().enumerate() {
            batch.write(m, 3, &[i as u8 + 1; 97]).unwrap();
        }
        assert!(batch.is_pending());
        // Out of range: refused, nothing written or recorded.
        assert!(matches!(
            batch.write(&mut maps[0], 8, &[0xEE; 97]),
            Err(Error::InvalidArgument(_))
        ));
        let words = [7u32, 8, 9];
        batch.write_pod(&mut maps[1], 0, &words[..0]).unwrap();
        assert!(batch.write_pod(&mut maps[1], 1, &words).is_err());
        batch.finish();
        for (i, m) in maps.iter().enumerate() {
            let v = m.read_vec(0, 104).unwrap();
            assert!(v[..3].iter().all(|&x| x == 0), "mapping {i} head touched");
            assert!(v[3..100].iter().all(|&x| x == i as u8 + 1), "mapping {i}");
            assert!(v[100..].iter().all(|&x| x == 0), "mapping {i} tail touched");
            let mut expected = vec![(3, 97)];
            if i == 1 {
                expected.push((0, 0));
            }
            assert_eq!(m.written, expected, "mapping {i}");
        }
    }
}
