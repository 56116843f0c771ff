//! Failure injection for pools, shared by the CPU, lavapipe and GPU tests: a chunk
//! source that fails chosen calls ([`FailingSource`]), a pool workload model that checks the
//! pool's accounting against the chunks really held after every step ([`run`]), and the final
//! check that everything was given back and the pool still works.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use vkgdr::chunk::{ChunkMemory, ChunkSource};
use vkgdr::{Block, Error, Mapping, MemorySide, Pool, PoolConfig};

/// Which calls fail: 1-based indices of the source's `allocate_chunk`, `flush_ranges` and
/// `invalidate_ranges` calls (counted over the whole run).
#[derive(Debug, Clone, Default)]
pub struct Failures {
    pub allocs: BTreeSet<u64>,
    pub flushes: BTreeSet<u64>,
    pub invalidates: BTreeSet<u64>,
}

/// What a [`FailingSource`] saw and holds; shared with its chunks.
#[derive(Default)]
pub struct Ledger {
    failures: Failures,
    allocs: AtomicU64,
    flushes: AtomicU64,
    invalidates: AtomicU64,
    /// Failures injected so far.
    injected: AtomicU64,
    /// Chunks handed out and not yet dropped, and their bytes.
    pub live_chunks: AtomicU64,
    pub live_bytes: AtomicU64,
}

impl Ledger {
    /// Failures this source injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// Counts a call of kind `counter` and says whether it is one of `fail`.
    fn fails(&self, counter: &AtomicU64, fail: &BTreeSet<u64>) -> bool {
        let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
        let hit = fail.contains(&n);
        if hit {
            self.injected.fetch_add(1, Ordering::Relaxed);
        }
        hit
    }

    /// A flush or invalidate call `call`: the driver's error when it is one of `fail`.
    fn cache_call(
        &self,
        counter: &AtomicU64,
        fail: &BTreeSet<u64>,
        call: &'static str,
    ) -> vkgdr::Result<()> {
        if self.fails(counter, fail) {
            return Err(vulkan_error(call, "VK_ERROR_OUT_OF_HOST_MEMORY"));
        }
        Ok(())
    }
}

/// A chunk source over `inner` whose calls fail as [`Failures`] says: an allocation fails with
/// the BAR's out-of-memory (odd indices) or a mapping failure (even indices), a flush or an
/// invalidate with the driver's error. It can also claim non-coherence over coherent memory, so
/// the pool's flush and invalidate paths run on host memory.
pub struct FailingSource<S> {
    inner: S,
    ledger: Arc<Ledger>,
    non_coherent: bool,
}

impl<S: ChunkSource> FailingSource<S> {
    pub fn new(inner: S, failures: Failures, force_non_coherent: bool) -> (Self, Arc<Ledger>) {
        let ledger = Arc::new(Ledger {
            failures,
            ..Default::default()
        });
        let non_coherent = force_non_coherent || inner.is_non_coherent();
        let source = FailingSource {
            inner,
            ledger: ledger.clone(),
            non_coherent,
        };
        (source, ledger)
    }
}

struct FailingChunk {
    inner: Box<dyn ChunkMemory>,
    ledger: Arc<Ledger>,
}

fn vulkan_error(call: &'static str, result: &str) -> Error {
    Error::Vulkan {
        call,
        result: result.into(),
    }
}

// SAFETY: forwards the inner chunk's pointer and size, which keep their contract; the extra
// failures happen before the inner call, touching no memory.
unsafe impl ChunkMemory for FailingChunk {
    fn host_ptr(&self) -> *mut u8 {
        self.inner.host_ptr()
    }
    fn device_ptr(&self) -> Option<u64> {
        self.inner.device_ptr()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn flush_ranges(&self, ranges: &[(u64, u64)]) -> vkgdr::Result<()> {
        let l = &self.ledger;
        l.cache_call(&l.flushes, &l.failures.flushes, "vkFlushMappedMemoryRanges")?;
        self.inner.flush_ranges(ranges)
    }
    fn invalidate_ranges(&self, ranges: &[(u64, u64)]) -> vkgdr::Result<()> {
        let l = &self.ledger;
        l.cache_call(
            &l.invalidates,
            &l.failures.invalidates,
            "vkInvalidateMappedMemoryRanges",
        )?;
        self.inner.invalidate_ranges(ranges)
    }
    fn read_dma(&self, offset: u64, dst: &mut [u8]) -> Option<vkgdr::Result<()>> {
        self.inner.read_dma(offset, dst)
    }
}

impl Drop for FailingChunk {
    fn drop(&mut self) {
        self.ledger.live_chunks.fetch_sub(1, Ordering::Relaxed);
        self.ledger
            .live_bytes
            .fetch_sub(self.inner.size(), Ordering::Relaxed);
    }
}

// SAFETY: the chunks are the inner source's, unchanged (see `FailingChunk`); the atom is the
// inner source's.
unsafe impl<S: ChunkSource> ChunkSource for FailingSource<S> {
    fn allocate_chunk(&self, size: u64) -> vkgdr::Result<Box<dyn ChunkMemory>> {
        let l = &self.ledger;
        if l.fails(&l.allocs, &l.failures.allocs) {
            return Err(if l.allocs.load(Ordering::Relaxed) % 2 == 1 {
                Error::OutOfDeviceMemory {
                    side: MemorySide::Vulkan,
                    call: "vkAllocateMemory",
                    size,
                    result: "VK_ERROR_OUT_OF_DEVICE_MEMORY".into(),
                }
            } else {
                vulkan_error("vkMapMemory", "VK_ERROR_MEMORY_MAP_FAILED")
            });
        }
        let inner = self.inner.allocate_chunk(size)?;
        l.live_chunks.fetch_add(1, Ordering::Relaxed);
        l.live_bytes.fetch_add(inner.size(), Ordering::Relaxed);
        Ok(Box::new(FailingChunk {
            inner,
            ledger: l.clone(),
        }))
    }
    fn atom_size(&self) -> u64 {
        self.inner.atom_size()
    }
    fn is_non_coherent(&self) -> bool {
        self.non_coherent
    }
}

/// One step of a workload.
#[derive(Debug, Clone)]
pub enum Op {
    /// Allocates `size` bytes aligned to `1 << align_log2`.
    Alloc { size: u64, align_log2: u32 },
    /// Frees live block `i % live`.
    Free(usize),
    /// Fills live block `i % live` with a new tag byte.
    Write(usize),
    /// Reads live block `i % live` back (invalidates first on non-coherent memory).
    Read(usize),
    /// `Block::flush` of live block `i % live`.
    Flush(usize),
    /// `Pool::flush`.
    PoolFlush,
    /// `Pool::trim`.
    Trim,
}

/// The pool the workloads run on: small chunks (so growth is frequent), dedicated blocks from
/// 32 KiB, one shard (one test thread).
pub fn config() -> PoolConfig {
    PoolConfig {
        chunk_size: 64 << 10,
        max_chunk_size: 256 << 10,
        dedicated_threshold: 32 << 10,
        shards: 1,
        ..Default::default()
    }
}

/// Requests of every path: tiny slab sizes, TLSF sizes, dedicated sizes.
pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..=4096, 0u32..=12).prop_map(|(size, align_log2)| Op::Alloc { size, align_log2 }),
        1 => (4097u64..=30_000, 0u32..=8).prop_map(|(size, align_log2)| Op::Alloc { size, align_log2 }),
        1 => (32u64 << 10..=96 << 10).prop_map(|size| Op::Alloc { size, align_log2: 6 }),
        3 => any::<usize>().prop_map(Op::Free),
        2 => any::<usize>().prop_map(Op::Write),
        2 => any::<usize>().prop_map(Op::Read),
        1 => any::<usize>().prop_map(Op::Flush),
        1 => Just(Op::PoolFlush),
        1 => Just(Op::Trim),
    ]
}

/// Random failure points: a few of the first 40 calls of each kind.
pub fn failures() -> impl Strategy<Value = Failures> {
    let set = || prop::collection::btree_set(1u64..=40, 0..6);
    (set(), set(), set()).prop_map(|(allocs, flushes, invalidates)| Failures {
        allocs,
        flushes,
        invalidates,
    })
}

/// A live block and the byte it was last filled with (`None`: never written).
struct Live {
    block: Block,
    fill: Option<u8>,
}

/// What the pool's accounting must match after every step: the chunks the source really holds.
fn check_accounting(pool: &Pool, ledger: &Ledger, step: &str) {
    let s = pool.stats();
    let (chunks, bytes) = (
        ledger.live_chunks.load(Ordering::Relaxed),
        ledger.live_bytes.load(Ordering::Relaxed),
    );
    assert_eq!(
        s.bytes_reserved, bytes,
        "after {step}: the pool counts {} reserved bytes, the source holds {bytes}",
        s.bytes_reserved
    );
    assert_eq!(
        s.chunks + s.dedicated_chunks,
        chunks,
        "after {step}: the pool counts {} + {} chunks, the source holds {chunks}",
        s.chunks,
        s.dedicated_chunks
    );
}

/// Runs `ops` on `pool` (built over a [`FailingSource`] whose ledger is `ledger`). Every error
/// must follow an injected failure (`injected` counts them: the ledger's, or the library's
/// failure points), every read must see the last fill, and the pool's accounting must match the
/// chunks held after every step. At the end every block is freed and the pool trimmed: no chunk
/// may stay, and the pool must still allocate, write and read (failures are then exhausted or
/// never hit again). Returns the number of failures injected.
pub fn run(pool: &Pool, ledger: &Ledger, ops: &[Op], injected: &dyn Fn() -> u64) -> u64 {
    let mut live: Vec<Live> = Vec::new();
    let mut next_fill = 0u8;
    for (n, op) in ops.iter().enumerate() {
        let injected_before = injected();
        let step = format!("step {n} {op:?}");
        let result: vkgdr::Result<()> = match *op {
            Op::Alloc { size, align_log2 } => pool
                .alloc(size, 1 << align_log2)
                .map(|block| live.push(Live { block, fill: None })),
            Op::Free(i) if !live.is_empty() => {
                drop(live.swap_remove(i % live.len()));
                Ok(())
            }
            Op::Write(i) if !live.is_empty() => {
                let l = live.len();
                let entry = &mut live[i % l];
                next_fill = next_fill.wrapping_add(1);
                let len = entry.block.size();
                let r = entry.block.fill(0, len, next_fill);
                if r.is_ok() {
                    entry.fill = Some(next_fill);
                }
                r
            }
            Op::Read(i) if !live.is_empty() => {
                let entry = &live[i % live.len()];
                entry
                    .block
                    .read_vec(0, entry.block.size() as usize)
                    .map(|bytes| {
                        if let Some(fill) = entry.fill {
                            assert!(
                                bytes.iter().all(|&b| b == fill),
                                "{step}: a block lost its bytes"
                            );
                        }
                    })
            }
            Op::Flush(i) if !live.is_empty() => live[i % live.len()].block.flush(),
            Op::PoolFlush => pool.flush(),
            Op::Trim => {
                pool.trim();
                Ok(())
            }
            _ => Ok(()),
        };
        if let Err(e) = result {
            assert!(
                injected() > injected_before,
                "{step}: failed with no failure injected: {e}"
            );
            assert!(
                matches!(
                    e,
                    Error::OutOfDeviceMemory { .. }
                        | Error::Vulkan { .. }
                        | Error::Cuda { .. }
                        | Error::System { .. }
                ),
                "{step}: not an injected error: {e}"
            );
        }
        check_accounting(pool, ledger, &step);
    }
    drop(live);
    pool.trim();
    check_accounting(pool, ledger, "freeing everything");
    assert_eq!(
        ledger.live_chunks.load(Ordering::Relaxed),
        0,
        "chunks left behind"
    );
    still_usable(pool);
    injected()
}

/// The pool allocates, writes, flushes and reads back after whatever failed before (retrying
/// while injected failures are still in the way).
pub fn still_usable(pool: &Pool) {
    for size in [100u64, 8 << 10, 40 << 10] {
        let mut result = Err(Error::InvalidArgument("not tried".into()));
        for _ in 0..16 {
            result = pool.alloc(size, 64).and_then(|mut b| {
                b.fill(0, size, 0xc3)?;
                b.flush()?;
                let back = b.read_vec(0, size as usize)?;
                assert!(back.iter().all(|&x| x == 0xc3), "{size}-byte block");
                Ok(())
            });
            if result.is_ok() {
                break;
            }
        }
        if let Err(e) = result {
            panic!("the pool no longer serves {size}-byte blocks: {e}");
        }
    }
}
