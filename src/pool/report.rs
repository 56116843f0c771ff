//! Allocation reports ([`Pool::report`](super::Pool::report)) and the labels they group blocks by
//! (gpu-allocator's model): what is alive, where, for whom, and how fragmented the pool is.
//!
//! Labels cost nothing until used: an unlabeled block carries one flag, checked when it drops.
//! A label is kept in the pool's registry, beside the block rather than in it, and leaves when
//! the block goes. With the `log` feature, a pool whose last handle drops while blocks are still
//! alive says so through the `log` facade (a warning naming their labels).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use crate::core::alloc::{ChunkId, HeapStats};
use crate::core::sync::Handshake;

use super::inner::PoolInner;
use super::registry::ChunkKey;
use super::shards::ShardSet;

/// A usage snapshot of a pool.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolStats {
    /// Bytes of all chunks held, including dedicated ones.
    pub bytes_reserved: u64,
    /// Bytes requested by live blocks in shared chunks (blocks kept in thread caches excluded).
    pub bytes_in_use: u64,
    /// Bytes requested by freed blocks that thread caches keep for reuse
    /// ([`magazine`](super::magazine)): still allocated in their chunks (counted in
    /// `bytes_allocated`), given back by [`Pool::trim`](super::Pool::trim).
    pub bytes_cached: u64,
    /// Blocks that thread caches keep for reuse (the blocks behind `bytes_cached`; counted in
    /// the shards' `allocation_count`).
    pub blocks_cached: u64,
    /// Bytes handed out (rounded sizes) in shared chunks.
    pub bytes_allocated: u64,
    /// Shared chunks held.
    pub chunks: u64,
    /// Dedicated chunks held (one per large block).
    pub dedicated_chunks: u64,
    /// Largest free block in any shard.
    pub largest_free_block: u64,
    /// Per-shard allocator statistics, one per [`PoolConfig::shards`](super::PoolConfig::shards);
    /// a shard no thread has allocated from yet reads as an empty heap.
    pub shards: Vec<HeapStats>,
    /// Blocks lent to kernels ([`Block::release_on_device`](super::Block::release_on_device))
    /// and the tokens and records their release feed refused.
    pub device_releases: super::lent::DeviceReleaseStats,
}

/// Where a chunk of a report lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ChunkPlace {
    /// A shared chunk: its shard and its id in that shard's heap.
    Shared {
        /// Shard index.
        shard: usize,
        /// Chunk id in the shard's heap.
        chunk: u32,
    },
    /// A dedicated chunk (one large block).
    Dedicated,
}

impl fmt::Display for ChunkPlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChunkPlace::Shared { shard, chunk } => write!(f, "shard {shard} chunk {chunk}"),
            ChunkPlace::Dedicated => f.write_str("dedicated"),
        }
    }
}

/// One chunk's usage.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkReport {
    /// Where it lies.
    pub place: ChunkPlace,
    /// Its size in bytes.
    pub size: u64,
    /// Its device address, for chunks imported into CUDA.
    pub device_ptr: Option<u64>,
    /// Live allocations in it (blocks, and blocks kept in thread caches).
    pub allocations: u64,
    /// Bytes requested by its labeled blocks.
    pub labeled_bytes: u64,
}

/// One live labeled block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockReport {
    /// Its label.
    pub label: Arc<str>,
    /// Requested size in bytes.
    pub size: u64,
    /// The chunk it lies in.
    pub place: ChunkPlace,
    /// Its offset in that chunk.
    pub offset: u64,
}

/// The live blocks of one label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelReport {
    /// The label.
    pub label: Arc<str>,
    /// Live blocks with it.
    pub blocks: u64,
    /// Their requested bytes.
    pub bytes: u64,
}

/// What a pool holds, by chunk and by label: [`Pool::report`](super::Pool::report). Its
/// `Display` is a human-readable table.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolReport {
    /// The usual snapshot.
    pub stats: PoolStats,
    /// Every chunk held (shared ones by shard and id, then dedicated ones).
    pub chunks: Vec<ChunkReport>,
    /// Labels with live blocks, most bytes first.
    pub labels: Vec<LabelReport>,
    /// Every live labeled block, by label, then chunk and offset.
    pub blocks: Vec<BlockReport>,
    /// Live blocks (shared and dedicated) without a label, and their requested bytes (blocks in
    /// thread caches count as live, as in [`PoolStats`]).
    pub unlabeled_blocks: u64,
    /// See `unlabeled_blocks`.
    pub unlabeled_bytes: u64,
    /// Free space in pieces: `1 - largest free block / free bytes` over all shards (0: all free
    /// space of the shared chunks is one block).
    pub fragmentation: f64,
    /// The pool's per-thread caches of freed small blocks: `None` when they are off
    /// ([`PoolConfig::thread_cache`](super::PoolConfig::thread_cache) 0, or another backend).
    pub thread_cache: Option<ThreadCacheReport>,
}

/// How a pool's per-thread caches are set up ([`PoolReport::thread_cache`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadCacheReport {
    /// Blocks kept per 16-byte size bucket and thread
    /// ([`PoolConfig::thread_cache`](super::PoolConfig::thread_cache)).
    pub depth: usize,
    /// Bytes one thread keeps for this pool at most
    /// ([`PoolConfig::thread_cache_bytes`](super::PoolConfig::thread_cache_bytes)).
    pub max_bytes: u64,
    /// How other threads reach the caches: what each cached allocation and free costs its
    /// thread ([`magazine::handshake`](super::magazine::handshake)).
    pub handshake: Handshake,
}

impl PoolReport {
    /// Gathers the report (takes each shard's lock briefly, and the registry's).
    pub(super) fn gather(
        inner: &PoolInner,
        shards: &ShardSet,
        stats: PoolStats,
        thread_cache: Option<ThreadCacheReport>,
    ) -> PoolReport {
        let mut chunks = Vec::new();
        let mut places: HashMap<ChunkKey, usize> = HashMap::new();
        for (s, cell) in shards.iter() {
            let shard = cell.state.lock();
            for (id, chunk) in shard.chunks.iter().enumerate() {
                let Some(chunk) = chunk else { continue };
                places.insert(Arc::as_ptr(chunk) as ChunkKey, chunks.len());
                chunks.push(ChunkReport {
                    place: ChunkPlace::Shared {
                        shard: s,
                        chunk: id as u32,
                    },
                    size: chunk.memory.size(),
                    device_ptr: chunk.device_base,
                    allocations: shard
                        .heap
                        .chunk_allocations(ChunkId(id as u32))
                        .unwrap_or(0),
                    labeled_bytes: 0,
                });
            }
        }
        let mut dedicated: Vec<(ChunkKey, (u64, u64))> = inner
            .registry
            .dedicated
            .lock()
            .iter()
            .map(|(&k, &sizes)| (k, sizes))
            .collect();
        dedicated.sort_unstable();
        let dedicated_bytes: u64 = dedicated.iter().map(|(_, (_, requested))| requested).sum();
        for (key, (size, _)) in dedicated {
            places.insert(key, chunks.len());
            chunks.push(ChunkReport {
                place: ChunkPlace::Dedicated,
                size,
                device_ptr: None,
                allocations: 1,
                labeled_bytes: 0,
            });
        }
        let mut blocks = Vec::new();
        for (&(key, offset), entry) in inner.registry.labels.lock().iter() {
            // A block of a chunk this snapshot missed (allocated meanwhile) is left out.
            let Some(&i) = places.get(&key) else { continue };
            chunks[i].labeled_bytes += entry.size;
            blocks.push(BlockReport {
                label: entry.label.clone(),
                size: entry.size,
                place: chunks[i].place,
                offset,
            });
        }
        blocks.sort_by(|a, b| (&a.label, a.place, a.offset).cmp(&(&b.label, b.place, b.offset)));
        let mut by_label: BTreeMap<Arc<str>, (u64, u64)> = BTreeMap::new();
        for b in &blocks {
            let e = by_label.entry(b.label.clone()).or_default();
            e.0 += 1;
            e.1 += b.size;
        }
        let mut labels: Vec<LabelReport> = by_label
            .into_iter()
            .map(|(label, (blocks, bytes))| LabelReport {
                label,
                blocks,
                bytes,
            })
            .collect();
        labels.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.label.cmp(&b.label)));
        let (labeled_blocks, labeled_bytes) = (
            blocks.len() as u64,
            blocks.iter().map(|b| b.size).sum::<u64>(),
        );
        // Blocks resting in thread caches are the pool's, not the program's: not counted.
        let shared_blocks: u64 = stats
            .shards
            .iter()
            .map(|h| h.allocation_count)
            .sum::<u64>()
            .saturating_sub(stats.blocks_cached);
        let live_blocks = shared_blocks + stats.dedicated_chunks;
        let live_bytes = stats.bytes_in_use + dedicated_bytes;
        let free: u64 = stats.shards.iter().map(|h| h.bytes_free).sum();
        PoolReport {
            fragmentation: if free == 0 {
                0.0
            } else {
                1.0 - stats.largest_free_block as f64 / free as f64
            },
            unlabeled_blocks: live_blocks.saturating_sub(labeled_blocks),
            unlabeled_bytes: live_bytes.saturating_sub(labeled_bytes),
            thread_cache,
            stats,
            chunks,
            labels,
            blocks,
        }
    }
}

/// Bytes as B, KiB, MiB or GiB with one decimal.
fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// Labeled blocks listed per label in the text form (the value has them all).
const BLOCKS_SHOWN_PER_LABEL: usize = 16;

impl fmt::Display for PoolReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.stats;
        writeln!(
            f,
            "pool: {} reserved in {} shared and {} dedicated chunks; {} requested by live blocks \
             in shared chunks ({} allocated); fragmentation {:.1} %",
            size(s.bytes_reserved),
            s.chunks,
            s.dedicated_chunks,
            size(s.bytes_in_use),
            size(s.bytes_allocated),
            100.0 * self.fragmentation
        )?;
        match &self.thread_cache {
            Some(t) => writeln!(
                f,
                "thread caches: {} blocks per bucket, {} per thread; {} cached now; handshake: {}",
                t.depth,
                size(t.max_bytes),
                size(s.bytes_cached),
                t.handshake
            )?,
            None => writeln!(f, "thread caches: off")?,
        }
        let d = &s.device_releases;
        if d.tokens.issued > 0 || d.refused() > 0 {
            writeln!(
                f,
                "device releases: {} blocks lent now, {} given back; refused: {} forged, {} stale, \
                 {} repeated tokens, {} foreign and {} malformed records{}",
                d.outstanding,
                d.tokens.redeemed,
                d.tokens.forged,
                d.tokens.stale,
                d.tokens.repeated,
                d.foreign_records,
                d.malformed_records,
                match &d.lane_error {
                    Some(e) => format!("; a lane broke: {e}"),
                    None => String::new(),
                }
            )?;
        }
        writeln!(f, "chunks:")?;
        for c in &self.chunks {
            write!(
                f,
                "  {:<20} {:>10}  {:>7} allocations  {:>10} labeled",
                c.place.to_string(),
                size(c.size),
                c.allocations,
                size(c.labeled_bytes)
            )?;
            match c.device_ptr {
                Some(p) => writeln!(f, "  at {p:#x}")?,
                None => writeln!(f)?,
            }
        }
        writeln!(f, "by label:")?;
        for l in &self.labels {
            writeln!(
                f,
                "  {:<24} {:>7} blocks  {:>10}",
                format!("{:?}", l.label),
                l.blocks,
                size(l.bytes)
            )?;
        }
        writeln!(
            f,
            "  {:<24} {:>7} blocks  {:>10}",
            "(unlabeled)",
            self.unlabeled_blocks,
            size(self.unlabeled_bytes)
        )?;
        if !self.blocks.is_empty() {
            writeln!(f, "labeled blocks:")?;
        }
        for l in &self.labels {
            let mine = self.blocks.iter().filter(|b| b.label == l.label);
            for b in mine.clone().take(BLOCKS_SHOWN_PER_LABEL) {
                writeln!(
                    f,
                    "  {:<24} {:>10}  {} +{:#x}",
                    format!("{:?}", b.label),
                    size(b.size),
                    b.place,
                    b.offset
                )?;
            }
            let more = l.blocks as usize - mine.take(BLOCKS_SHOWN_PER_LABEL).count();
            if more > 0 {
                writeln!(f, "  {:<24} ... and {more} more", format!("{:?}", l.label))?;
            }
        }
        Ok(())
    }
}

/// With the `log` feature: when the last handle of a pool drops while blocks are alive, one
/// warning (target `vkgdr::pool`) with their number, bytes and labels. Blocks other threads
/// keep in their thread caches count as alive here (they return when those threads release
/// their caches).
#[cfg(feature = "log")]
pub(super) fn report_leaks(inner: &PoolInner, shards: &ShardSet) {
    if !log::log_enabled!(target: "vkgdr::pool", log::Level::Warn) {
        return;
    }
    let mut blocks = inner.dedicated.load(std::sync::atomic::Ordering::Relaxed);
    let mut bytes = 0;
    for (_, cell) in shards.iter() {
        let h = cell.state.lock().heap.stats();
        blocks += h.allocation_count;
        bytes += h.bytes_in_use;
    }
    bytes += inner
        .registry
        .dedicated
        .lock()
        .values()
        .map(|(_, requested)| requested)
        .sum::<u64>();
    if blocks == 0 {
        return;
    }
    let mut by_label: BTreeMap<Arc<str>, (u64, u64)> = BTreeMap::new();
    for e in inner.registry.labels.lock().values() {
        let c = by_label.entry(e.label.clone()).or_default();
        c.0 += 1;
        c.1 += e.size;
    }
    let labeled: Vec<String> = by_label
        .iter()
        .map(|(l, (n, b))| format!("{l:?}: {n} blocks, {}", size(*b)))
        .collect();
    log::warn!(
        target: "vkgdr::pool",
        "pool dropped with {blocks} blocks still alive ({} requested); they keep their chunks \
         until dropped; labeled: {}",
        size(bytes),
        if labeled.is_empty() {
            "none".to_string()
        } else {
            labeled.join("; ")
        }
    );
}

#[cfg(test)]
mod tests {
    use super::size;

    #[test]
    fn sizes_read_well() {
        assert_eq!(size(0), "0 B");
        assert_eq!(size(1023), "1023 B");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(48 << 20), "48.0 MiB");
        assert_eq!(size(3 << 30), "3.0 GiB");
    }
}
