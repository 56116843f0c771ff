//! Staged DMA reads into pageable memory: the copy engine fills a few pinned staging buffers
//! while CPU threads copy the filled ones out, so neither waits for the other.
//!
//! `cuMemcpyDtoH` into pageable memory stages through the driver's own pinned buffers with one
//! CPU thread copying out, a fraction of the copy engine's rate into pinned memory (figures:
//! BENCHMARKS.md, 'Reads through the copy engine'). The
//! pipeline here keeps the engine busy with the next chunks while [`copy_host_default`]
//! (split over the global copy pool for long chunks) moves the current one out:
//!
//! ```text
//! engine:  [DMA 0][DMA 1][DMA 2][DMA 3]      [DMA 4] ...
//! CPU:            [copy 0]      [copy 1]     [copy 2] ...
//! ```
//!
//! The scheduling is pure (no driver): [`StagingEngine`] is the seam, implemented with CUDA streams
//! and events in `crate::mapping::pinned::read_staging` and with plain memory in the tests (Miri runs them).
//!
//! [`copy_host_default`]: super::copy_host_default

use crate::error::{Error, Result};

/// Something that copies device ranges into numbered host staging buffers asynchronously.
///
/// Implementations track which buffers have a copy in flight and refuse to hand out a buffer's
/// bytes (or start a second copy into it) until it has been waited for, so the pipeline, all safe
/// code, cannot read bytes the engine is still writing.
pub(crate) trait StagingEngine {
    /// Number of staging buffers.
    fn buffers(&self) -> usize;
    /// Bytes each buffer holds.
    fn buffer_len(&self) -> usize;
    /// Starts copying `len` bytes at device address `src` into buffer `buf` (returns at once).
    /// Errors if a copy into `buf` is in flight or `len` exceeds the buffer.
    fn start(&mut self, buf: usize, src: u64, len: usize) -> Result<()>;
    /// Waits until the copy into `buf` has landed.
    fn wait(&mut self, buf: usize) -> Result<()>;
    /// The first `len` bytes of buffer `buf`; errors while a copy into it is in flight.
    fn staged(&self, buf: usize, len: usize) -> Result<&[u8]>;
    /// Waits for every copy in flight (before the engine is reused after an error).
    fn drain(&mut self) -> Result<()>;
}

/// Granularity of the pipeline's chunks.
const CHUNK_ALIGN: usize = 64 << 10;

/// The chunk size for a read of `len` bytes: enough chunks to fill the pipeline (one per
/// buffer), each at least 64 KiB and at most a buffer.
pub(crate) fn chunk_for(len: usize, buffers: usize, buffer_len: usize) -> usize {
    len.div_ceil(buffers.max(1))
        .next_multiple_of(CHUNK_ALIGN)
        .clamp(CHUNK_ALIGN.min(buffer_len), buffer_len)
}

/// Reads `dst.len()` bytes from device address `src` through `engine`'s staging buffers,
/// `copy_out` moving each landed chunk into `dst` while the engine fills the next buffers.
///
/// On an error the copies still in flight are waited for before returning, so the engine can be
/// reused (or dropped) safely; `dst` may then be partly written.
pub(crate) fn read_staged<E: StagingEngine + ?Sized>(
    engine: &mut E,
    src: u64,
    dst: &mut [u8],
    mut copy_out: impl FnMut(&mut [u8], &[u8]),
) -> Result<()> {
    // A previous read that failed may have left copies in flight.
    engine.drain()?;
    let (buffers, buffer_len) = (engine.buffers(), engine.buffer_len());
    if buffers == 0 || buffer_len == 0 {
        return Err(Error::internal("a staging engine without buffers"));
    }
    let len = dst.len();
    let chunk = chunk_for(len, buffers, buffer_len);
    let chunks = len.div_ceil(chunk);
    // Chunk `k`: device address and length.
    let piece = |k: usize| (src + (k * chunk) as u64, chunk.min(len - k * chunk));
    let result = (|| {
        for k in 0..chunks.min(buffers) {
            let (at, n) = piece(k);
            engine.start(k, at, n)?;
        }
        for k in 0..chunks {
            let buf = k % buffers;
            engine.wait(buf)?;
            let n = piece(k).1;
            copy_out(&mut dst[k * chunk..k * chunk + n], engine.staged(buf, n)?);
            if k + buffers < chunks {
                let (at, n) = piece(k + buffers);
                engine.start(buf, at, n)?;
            }
        }
        Ok(())
    })();
    if result.is_err() {
        // The first error is the one to report; draining is best effort.
        let _ = engine.drain();
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Host memory as the "device": a copy is recorded at `start` and performed at `wait`, so a
    /// read of a buffer before its wait would see stale bytes (and is refused anyway).
    struct FakeEngine {
        device: Vec<u8>,
        staging: Vec<Vec<u8>>,
        pending: Vec<Option<(u64, usize)>>,
        /// Fail the `n`th start (counting from 0).
        fail_start: Option<usize>,
        starts: usize,
        max_in_flight: usize,
    }

    impl FakeEngine {
        fn new(device: Vec<u8>, buffers: usize, buffer_len: usize) -> Self {
            FakeEngine {
                device,
                staging: vec![vec![0xEE; buffer_len]; buffers],
                pending: vec![None; buffers],
                fail_start: None,
                starts: 0,
                max_in_flight: 0,
            }
        }
        fn in_flight(&self) -> usize {
            self.pending.iter().flatten().count()
        }
    }

    impl StagingEngine for FakeEngine {
        fn buffers(&self) -> usize {
            self.staging.len()
        }
        fn buffer_len(&self) -> usize {
            self.staging[0].len()
        }
        fn start(&mut self, buf: usize, src: u64, len: usize) -> Result<()> {
            if self.fail_start == Some(self.starts) {
                return Err(Error::internal("injected start failure"));
            }
            self.starts += 1;
            assert!(
                self.pending[buf].is_none(),
                "second copy into busy buffer {buf}"
            );
            assert!(len <= self.buffer_len());
            self.pending[buf] = Some((src, len));
            self.max_in_flight = self.max_in_flight.max(self.in_flight());
            Ok(())
        }
        fn wait(&mut self, buf: usize) -> Result<()> {
            if let Some((src, len)) = self.pending[buf].take() {
                let s = src as usize;
                self.staging[buf][..len].copy_from_slice(&self.device[s..s + len]);
            }
            Ok(())
        }
        fn staged(&self, buf: usize, len: usize) -> Result<&[u8]> {
            if self.pending[buf].is_some() {
                return Err(Error::internal(
                    "staged bytes read before their copy landed",
                ));
            }
            Ok(&self.staging[buf][..len])
        }
        fn drain(&mut self) -> Result<()> {
            for b in 0..self.buffers() {
                self.wait(b)?;
            }
            Ok(())
        }
    }

    /// `len` bytes of a pattern with a prime period (4093), so a byte read from the wrong place
    /// shows (chunks are multiples of 64 KiB). Built with block copies: a per-byte loop over
    /// megabytes takes minutes under Miri.
    fn device(len: usize) -> Vec<u8> {
        let period: Vec<u8> = (0..4093usize).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut v = Vec::with_capacity(len);
        while v.len() < len {
            let n = (len - v.len()).min(period.len());
            v.extend_from_slice(&period[..n]);
        }
        v
    }

    #[test]
    fn chunks_fill_the_pipeline_within_the_buffers() {
        let mib = 1 << 20;
        assert_eq!(chunk_for(mib, 4, 8 * mib), 256 << 10);
        assert_eq!(chunk_for(256 * mib, 4, 8 * mib), 8 * mib);
        assert_eq!(chunk_for(100, 4, 8 * mib), 64 << 10, "at least 64 KiB");
        assert_eq!(chunk_for(100, 4, 4096), 4096, "never above a buffer");
        assert_eq!(chunk_for(3 * mib + 1, 3, 8 * mib), mib + (64 << 10));
    }

    #[test]
    fn every_length_and_offset_reads_back_exactly() {
        let sizes: &[usize] = if cfg!(miri) {
            &[1, 65_537, 140_000]
        } else {
            &[1, 4095, 65_536, 65_537, 200_000, 1 << 20, (3 << 20) + 17]
        };
        for &buffers in &[1usize, 2, 4] {
            for &len in sizes {
                let dev = device(len + 100);
                let mut engine = FakeEngine::new(dev.clone(), buffers, 128 << 10);
                let mut dst = vec![0u8; len];
                let mut copies = 0;
                read_staged(&mut engine, 33, &mut dst, |d, s| {
                    copies += 1;
                    d.copy_from_slice(s)
                })
                .unwrap();
                assert!(dst == dev[33..33 + len], "{buffers} buffers, {len} bytes");
                let chunk = chunk_for(len, buffers, 128 << 10);
                assert_eq!(copies, len.div_ceil(chunk));
                assert_eq!(engine.in_flight(), 0);
                // The engine is kept busy: as many copies in flight as buffers (or chunks).
                assert_eq!(engine.max_in_flight, buffers.min(copies));
            }
        }
    }

    #[test]
    fn an_empty_read_starts_nothing() {
        let mut engine = FakeEngine::new(device(10), 2, 4096);
        read_staged(&mut engine, 0, &mut [], |_, _| panic!("nothing to copy")).unwrap();
        assert_eq!(engine.starts, 0);
    }

    #[test]
    fn a_failure_drains_the_copies_in_flight_and_the_engine_stays_usable() {
        // Six chunks of 64 KiB at least (one per failure point below); Miri gets no more.
        let len = if cfg!(miri) { 6 << 16 } else { 1 << 20 };
        let dev = device(len);
        for fail in 0..6 {
            let mut engine = FakeEngine::new(dev.clone(), 3, 64 << 10);
            engine.fail_start = Some(fail);
            let mut dst = vec![0u8; len];
            let err = read_staged(&mut engine, 0, &mut dst, |d, s| d.copy_from_slice(s));
            assert!(matches!(err, Err(Error::Internal(m)) if m == "injected start failure"));
            assert_eq!(
                engine.in_flight(),
                0,
                "failure at start {fail} left copies in flight"
            );
            engine.fail_start = None;
            read_staged(&mut engine, 0, &mut dst, |d, s| d.copy_from_slice(s)).unwrap();
            assert!(dst == dev);
        }
    }
}
