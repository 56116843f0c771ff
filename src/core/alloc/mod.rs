//! The pure allocator core: decides offsets inside GPU chunks, touches no GPU memory and no FFI.
//!
//! A [`Heap`] manages any number of chunks (contiguous byte ranges `[0, size)` whose base address
//! the pool aligns to at least [`HeapConfig::max_align`]). Requests up to
//! [`HeapConfig::max_slab_size`] are served from slab classes (equal objects in pages carved from
//! the chunks); larger ones from a two-level segregated fit (TLSF) index with immediate coalescing.
//! Both paths are O(1) and, once warm, allocate nothing on the Rust heap. All metadata lives in host
//! RAM.
//!
//! The heap is single-threaded (`&mut self`) and `Send`; the pool puts one per shard behind a mutex.
//!
//! ```
//! use vkgdr::alloc::{AllocError, Heap, HeapConfig};
//!
//! let mut heap = Heap::new(HeapConfig::default())?;
//! let chunk = heap.add_chunk(64 << 20)?;
//! let small = heap.alloc(200, 64)?;
//! assert_eq!(small.chunk(), chunk);
//! assert_eq!(small.offset() % 64, 0);
//! assert!(small.size() >= 200);
//!
//! // A request no chunk can hold says how large a chunk to add before retrying.
//! let big = match heap.alloc(100 << 20, 4096) {
//!     Err(AllocError::OutOfSpace { chunk_size_needed, .. }) => {
//!         heap.add_chunk(chunk_size_needed)?;
//!         heap.alloc(100 << 20, 4096)?
//!     }
//!     other => other?,
//! };
//! heap.free(small)?;
//! heap.free(big)?;
//! assert_eq!(heap.empty_chunks().count(), 2);
//! assert_eq!(heap.remove_chunk(chunk)?, 64 << 20);
//! # Ok::<(), AllocError>(())
//! ```
#![forbid(unsafe_code)]

mod slab;
mod tlsf;

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};

use slab::{SlabFree, SlabObject, Slabs};
use tlsf::{align_up, BlockState, Tlsf};

/// Marks "no node" in the index-linked tables.
const NIL: u32 = u32::MAX;

/// Largest chunk (and so largest allocation and alignment) the heap accepts: 2^62 bytes.
pub const MAX_CHUNK_SIZE: u64 = 1 << 62;

/// Source of heap identities, so an [`Allocation`] freed into the wrong heap is recognised. After
/// 2^32 heaps ids repeat; a collision only weakens that check, the handle validation still applies.
static NEXT_HEAP_ID: AtomicU32 = AtomicU32::new(1);

/// Errors of the allocator core. No error changes the set of live allocations or chunks (an
/// `OutOfSpace` may have returned cached empty slab pages to the free space first).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// A zero-byte allocation was requested.
    #[error("allocation size is zero")]
    ZeroSize,
    /// The alignment is not a power of two.
    #[error("alignment {align} is not a power of two")]
    BadAlignment {
        /// The requested alignment.
        align: u64,
    },
    /// The alignment exceeds what chunk bases guarantee ([`HeapConfig::max_align`]).
    #[error("alignment {align} exceeds the pool's maximum {max}")]
    AlignmentTooLarge {
        /// The requested alignment.
        align: u64,
        /// The heap's maximum alignment.
        max: u64,
    },
    /// The size exceeds [`MAX_CHUNK_SIZE`], so rounding it could overflow and no chunk can hold it.
    #[error("allocation of {size} bytes is too large")]
    Overflow {
        /// The requested size.
        size: u64,
    },
    /// No free block was found for the request. The caller should add a chunk of at least
    /// `chunk_size_needed` bytes ([`Heap::chunk_size_needed`]) and retry, which then succeeds.
    #[error("no space for {size} bytes aligned to {align}; a chunk of {chunk_size_needed} bytes would hold it")]
    OutOfSpace {
        /// The requested size.
        size: u64,
        /// The requested alignment.
        align: u64,
        /// Size of a fresh chunk that is guaranteed to satisfy the request.
        chunk_size_needed: u64,
    },
    /// The configuration is inconsistent; the message names the rule broken.
    #[error("invalid heap configuration: {0}")]
    InvalidConfig(&'static str),
    /// A chunk size is zero, not a multiple of [`HeapConfig::min_align`], or above
    /// [`MAX_CHUNK_SIZE`].
    #[error("invalid chunk size {size}")]
    BadChunkSize {
        /// The chunk size given.
        size: u64,
    },
    /// The chunk or block tables are full (more than ~4 billion entries).
    #[error("allocator metadata tables are full")]
    MetadataExhausted,
    /// No chunk with this id is registered.
    #[error("unknown {0}")]
    UnknownChunk(ChunkId),
    /// The chunk still holds allocations.
    #[error("{chunk} still holds {live} allocations")]
    ChunkBusy {
        /// The chunk.
        chunk: ChunkId,
        /// Allocations still live in it.
        live: u64,
    },
    /// The allocation was made by another heap.
    #[error("allocation belongs to another heap")]
    ForeignAllocation,
    /// The allocation does not match any live allocation of this heap.
    #[error("allocation is not live in this heap")]
    StaleAllocation,
    /// An internal invariant failed (a bug in this module); the heap refused to change state.
    #[error("allocator invariant broken: {0}")]
    Inconsistent(&'static str),
}

impl AllocError {
    /// Whether the caller asked for something no heap can give (a bad size, alignment or
    /// configuration), as opposed to running out of space or metadata, or a bug.
    pub fn is_caller_error(&self) -> bool {
        matches!(
            self,
            AllocError::ZeroSize
                | AllocError::BadAlignment { .. }
                | AllocError::AlignmentTooLarge { .. }
                | AllocError::Overflow { .. }
                | AllocError::InvalidConfig(_)
        )
    }
}

/// Heap parameters; [`HeapConfig::default`] gives the values below.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeapConfig {
    /// Size of a slab page, a power of two in `min_align..=max_align`. Pages are aligned to their
    /// size. Default 64 KiB.
    pub slab_page_size: u64,
    /// Largest request served by slab classes, at most `slab_page_size / 8`; 0 disables slabs.
    /// Default 4096.
    pub max_slab_size: u64,
    /// Granule: every size and offset is a multiple of it (a power of two). Default 16.
    pub min_align: u64,
    /// Largest alignment accepted: the alignment the pool guarantees for chunk base addresses
    /// (a power of two, at most [`MAX_CHUNK_SIZE`]). Default 64 KiB.
    pub max_align: u64,
    /// Slab classes per power of two (1, 2, 4, 8 or 16): more classes, less rounding waste but
    /// more partially filled pages. Default 8 (16, 32, …, 256 in steps of 16, then 288, 320, …,
    /// 512 in steps of 32, …, 3840, 4096), which measured best for churn of 16 B – 64 KiB blocks.
    pub slab_classes_per_octave: u64,
}

impl Default for HeapConfig {
    fn default() -> Self {
        HeapConfig {
            slab_page_size: 64 << 10,
            max_slab_size: 4096,
            min_align: 16,
            max_align: 64 << 10,
            slab_classes_per_octave: 8,
        }
    }
}

impl HeapConfig {
    /// Checks an allocation request against this configuration: a non-zero `size` up to
    /// [`MAX_CHUNK_SIZE`] and a power-of-two `align` up to [`HeapConfig::max_align`]. The one
    /// validation of a request, shared by [`Heap::alloc`] and the pool's dedicated and cached
    /// paths.
    #[inline]
    pub fn check_request(&self, size: u64, align: u64) -> Result<(), AllocError> {
        if size == 0 {
            return Err(AllocError::ZeroSize);
        }
        if !align.is_power_of_two() {
            return Err(AllocError::BadAlignment { align });
        }
        if align > self.max_align {
            return Err(AllocError::AlignmentTooLarge {
                align,
                max: self.max_align,
            });
        }
        if size > MAX_CHUNK_SIZE {
            return Err(AllocError::Overflow { size });
        }
        Ok(())
    }
}

impl HeapConfig {
    /// Checks the rules stated on each field.
    pub fn validate(&self) -> Result<(), AllocError> {
        let err = |msg| Err(AllocError::InvalidConfig(msg));
        if !self.min_align.is_power_of_two() {
            return err("min_align must be a power of two");
        }
        if !self.max_align.is_power_of_two() || self.max_align > MAX_CHUNK_SIZE {
            return err("max_align must be a power of two at most MAX_CHUNK_SIZE");
        }
        if self.min_align > self.max_align {
            return err("min_align must not exceed max_align");
        }
        if self.max_slab_size == 0 {
            return Ok(());
        }
        if !self.slab_page_size.is_power_of_two()
            || self.slab_page_size < self.min_align
            || self.slab_page_size > self.max_align
        {
            return err("slab_page_size must be a power of two in min_align..=max_align");
        }
        if self.max_slab_size > self.slab_page_size / 8 {
            return err("max_slab_size must be at most slab_page_size / 8");
        }
        if !matches!(self.slab_classes_per_octave, 1 | 2 | 4 | 8 | 16) {
            return err("slab_classes_per_octave must be 1, 2, 4, 8 or 16");
        }
        Ok(())
    }
}

/// Identifies a chunk within one heap. Ids of removed chunks are reused by later
/// [`Heap::add_chunk`] calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkId(pub u32);

impl fmt::Display for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "chunk {}", self.0)
    }
}

/// A live allocation: a byte range `offset..offset + size` of a chunk.
///
/// Neither `Clone` nor `Copy`: [`Heap::free`] consumes it, so it cannot be freed twice. Dropping it
/// without freeing leaks the range (the chunk then never becomes empty).
#[must_use = "dropping an Allocation leaks its range; pass it to Heap::free"]
#[derive(Debug, PartialEq, Eq)]
pub struct Allocation {
    offset: u64,
    size: u64,
    requested: u64,
    chunk: ChunkId,
    heap: u32,
    /// TLSF node, or slab page when `slot != NIL`.
    handle: u32,
    generation: u32,
    /// Object index in the slab page; `NIL` for a TLSF block.
    slot: u32,
}

impl Allocation {
    /// The chunk holding the range.
    pub fn chunk(&self) -> ChunkId {
        self.chunk
    }

    /// Byte offset of the range from the chunk's base.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Usable size in bytes (at least the requested size).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The size that was requested.
    pub fn requested_size(&self) -> u64 {
        self.requested
    }
}

/// Usage of one slab class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlabClassStats {
    /// Object size in bytes.
    pub class_size: u64,
    /// Objects handed out.
    pub objects_in_use: u64,
    /// Pages owned by the class (each [`HeapConfig::slab_page_size`] bytes).
    pub slab_pages: u32,
}

/// A snapshot of a heap's usage.
#[derive(Clone, Debug, PartialEq)]
pub struct HeapStats {
    /// Sum of the *requested* sizes of live allocations.
    pub bytes_in_use: u64,
    /// Sum of the usable sizes of live allocations (requested sizes after class/granule rounding).
    pub bytes_allocated: u64,
    /// Sum of the sizes of all chunks.
    pub bytes_reserved: u64,
    /// Bytes in free TLSF blocks (free objects inside slab pages are not counted).
    pub bytes_free: u64,
    /// Bytes held by slab pages, used or not.
    pub slab_page_bytes: u64,
    /// Largest free TLSF block.
    pub largest_free_block: u64,
    /// Number of free TLSF blocks.
    pub free_blocks: u64,
    /// Number of chunks.
    pub chunk_count: u32,
    /// Number of live allocations.
    pub allocation_count: u64,
    /// `1 - largest_free_block / bytes_free` (0 when nothing is free): 0 means all free space is
    /// one block.
    pub fragmentation: f64,
    /// Every slab class, smallest first.
    pub slab_classes: Vec<SlabClassStats>,
}

#[derive(Clone, Debug)]
struct Chunk {
    size: u64,
    /// The TLSF node at offset 0; it is never merged away, so it stays valid for the chunk's life.
    first_block: u32,
    /// Live allocations (blocks and slab objects) in the chunk.
    live: u64,
    present: bool,
}

/// The allocator core for one shard: chunks, TLSF index and slab classes. See the module docs.
pub struct Heap {
    id: u32,
    config: HeapConfig,
    gran: u64,
    tlsf: Tlsf,
    slabs: Slabs,
    chunks: Vec<Chunk>,
    vacant_chunks: Vec<u32>,
    chunk_count: u32,
    bytes_reserved: u64,
    bytes_in_use: u64,
    /// Usable bytes and number of the live TLSF blocks; slab objects are counted by their
    /// classes (so the slab paths move one counter fewer each way).
    block_bytes: u64,
    block_count: u64,
}

impl fmt::Debug for Heap {
    /// A summary; the block tables can be millions of entries long.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Heap")
            .field("id", &self.id)
            .field("chunks", &self.chunk_count)
            .field("bytes_reserved", &self.bytes_reserved)
            .field("bytes_allocated", &self.bytes_allocated())
            .field("allocations", &self.allocation_count())
            .finish_non_exhaustive()
    }
}

impl Heap {
    /// A heap with no chunks. Fails with [`AllocError::InvalidConfig`] when `config` breaks a rule
    /// stated on [`HeapConfig`].
    pub fn new(config: HeapConfig) -> Result<Self, AllocError> {
        config.validate()?;
        let slabs = Slabs::new(
            config.slab_page_size,
            config.max_slab_size,
            config.min_align,
            config.slab_classes_per_octave,
        );
        Ok(Heap::with_slabs(config, slabs))
    }

    /// A heap with this one's configuration and no chunk, as [`Heap::new`] would build it, with
    /// its own identity; it shares this heap's slab lookup table (which never changes) instead
    /// of building one. A pool's shards are made so.
    pub(crate) fn empty_like(&self) -> Self {
        Heap::with_slabs(self.config.clone(), self.slabs.empty_like())
    }

    /// An empty heap of a validated `config` and its `slabs` (no page yet), with a new identity.
    fn with_slabs(config: HeapConfig, slabs: Slabs) -> Self {
        Heap {
            id: NEXT_HEAP_ID.fetch_add(1, Ordering::Relaxed),
            gran: config.min_align,
            tlsf: Tlsf::new(config.min_align.trailing_zeros()),
            slabs,
            config,
            chunks: Vec::new(),
            vacant_chunks: Vec::new(),
            chunk_count: 0,
            bytes_reserved: 0,
            bytes_in_use: 0,
            block_bytes: 0,
            block_count: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &HeapConfig {
        &self.config
    }

    /// Registers a chunk `[0, size)`. `size` must be a non-zero multiple of
    /// [`HeapConfig::min_align`] no larger than [`MAX_CHUNK_SIZE`].
    pub fn add_chunk(&mut self, size: u64) -> Result<ChunkId, AllocError> {
        if size == 0 || !size.is_multiple_of(self.gran) || size > MAX_CHUNK_SIZE {
            return Err(AllocError::BadChunkSize { size });
        }
        let id = match self.vacant_chunks.last() {
            Some(&id) => id,
            None if self.chunks.len() < NIL as usize => self.chunks.len() as u32,
            None => return Err(AllocError::MetadataExhausted),
        };
        let first_block = self
            .tlsf
            .add_region(id, size)
            .ok_or(AllocError::MetadataExhausted)?;
        let chunk = Chunk {
            size,
            first_block,
            live: 0,
            present: true,
        };
        if self.vacant_chunks.pop().is_some() {
            self.chunks[id as usize] = chunk;
        } else {
            self.chunks.push(chunk);
        }
        self.chunk_count += 1;
        self.bytes_reserved += size;
        Ok(ChunkId(id))
    }

    /// The size of a registered chunk.
    pub fn chunk_size(&self, id: ChunkId) -> Option<u64> {
        self.chunk(id).map(|c| c.size)
    }

    /// Live allocations in a chunk (`None` for an unknown id). O(1).
    pub fn chunk_allocations(&self, id: ChunkId) -> Option<u64> {
        self.chunk(id).map(|c| c.live)
    }

    fn chunk(&self, id: ChunkId) -> Option<&Chunk> {
        self.chunks.get(id.0 as usize).filter(|c| c.present)
    }

    /// Validates a request; returns the size rounded to the granule and the effective alignment.
    #[inline]
    fn check_request(&self, size: u64, align: u64) -> Result<(u64, u64), AllocError> {
        self.config.check_request(size, align)?;
        Ok((align_up(size, self.gran), align.max(self.gran)))
    }

    /// The size of a fresh chunk that is guaranteed to satisfy `alloc(size, align)` when added right
    /// before the call: `size` rounded up to the granule (chunk bases satisfy every accepted
    /// alignment, and a small request falls back to a plain block when no slab page fits). The pool
    /// will usually add `max(needed, its standard chunk size)`. Fails like [`Heap::alloc`] on invalid
    /// input.
    pub fn chunk_size_needed(&self, size: u64, align: u64) -> Result<u64, AllocError> {
        self.check_request(size, align).map(|(rounded, _)| rounded)
    }

    /// Allocates at least `size` bytes at an offset that is a multiple of `align` (a power of two
    /// up to [`HeapConfig::max_align`]).
    ///
    /// Sizes up to [`HeapConfig::max_slab_size`] come from a slab class; when no slab page can be
    /// carved they fall back to a plain TLSF block, so a small request does not fail merely because
    /// no whole page is free (nor in a chunk smaller than a page).
    ///
    /// Errors: [`AllocError::ZeroSize`], [`AllocError::BadAlignment`],
    /// [`AllocError::AlignmentTooLarge`], [`AllocError::Overflow`], and
    /// [`AllocError::OutOfSpace`] when no free range was found (the good-fit search inspects a
    /// bounded number of blocks, so it can miss a fitting block in a fragmented heap; adding the
    /// suggested chunk always helps).
    // Always inlined: the pool's shard path calls it once, and a call returning a result this
    // large costs a fifth of the pool's whole allocation.
    #[inline(always)]
    pub fn alloc(&mut self, size: u64, align: u64) -> Result<Allocation, AllocError> {
        self.config.check_request(size, align)?;
        self.alloc_valid(size, align)
    }

    /// [`alloc`](Self::alloc) of a request the caller has already checked against this heap's
    /// configuration ([`HeapConfig::check_request`] of an equal `HeapConfig`, as the pool does
    /// once for every path): the same result without checking again.
    #[inline(always)]
    pub(crate) fn alloc_valid(&mut self, size: u64, align: u64) -> Result<Allocation, AllocError> {
        match self.alloc_from_partial_page(size, align) {
            Ok(a) => Ok(a),
            Err(class) => self.alloc_past_partial_pages(size, align, class),
        }
    }

    /// [`alloc_valid`](Self::alloc_valid)'s usual case alone: an object of a slab page that has
    /// a free one; otherwise the request's slab class (`None`: a plain block's size), for
    /// [`alloc_past_partial_pages`](Self::alloc_past_partial_pages), and nothing changed. A
    /// caller that takes the other cases out of line keeps the allocation in registers: a result
    /// that may come back from an out-of-line call lives in memory, as `alloc_valid`'s does.
    #[inline(always)]
    pub(crate) fn alloc_from_partial_page(
        &mut self,
        size: u64,
        align: u64,
    ) -> Result<Allocation, Option<u32>> {
        debug_assert_eq!(self.config.check_request(size, align), Ok(()));
        let class = self
            .slabs
            .class_for(align_up(size, self.gran), align.max(self.gran))
            .ok_or(None)?;
        let object = self.slabs.alloc(class).ok_or(Some(class))?;
        Ok(self.record_object(object, size))
    }

    /// The rest of [`alloc_valid`](Self::alloc_valid) after
    /// [`alloc_from_partial_page`](Self::alloc_from_partial_page) gave `class`: a new slab page
    /// or a plain block.
    #[inline]
    pub(crate) fn alloc_past_partial_pages(
        &mut self,
        size: u64,
        align: u64,
        class: Option<u32>,
    ) -> Result<Allocation, AllocError> {
        let (rounded, effective_align) = (align_up(size, self.gran), align.max(self.gran));
        self.alloc_slow(size, align, rounded, effective_align, class)
    }

    /// A new slab page or a plain block; as a last resort the cached empty pages go back first.
    #[inline(never)]
    fn alloc_slow(
        &mut self,
        size: u64,
        align: u64,
        rounded: u64,
        effective_align: u64,
        class: Option<u32>,
    ) -> Result<Allocation, AllocError> {
        for attempt in 0..2 {
            if attempt == 1 {
                if self.slabs.cached_pages() == 0 {
                    break;
                }
                self.release_cached_pages(None);
            }
            if let Some(class) = class {
                if let Some(object) = self.new_slab_page(class) {
                    return Ok(self.record_object(object, size));
                }
            }
            if let Some(index) = self.tlsf.alloc(rounded, effective_align, BlockState::User) {
                let b = *self
                    .tlsf
                    .block(index)
                    .ok_or(AllocError::Inconsistent("fresh block missing"))?;
                self.block_bytes += b.size;
                self.block_count += 1;
                return Ok(self.record(b.chunk, b.offset, b.size, size, index, b.generation, NIL));
            }
        }
        Err(AllocError::OutOfSpace {
            size,
            align,
            chunk_size_needed: rounded,
        })
    }

    #[inline]
    fn record_object(&mut self, o: SlabObject, requested: u64) -> Allocation {
        self.record(
            o.chunk,
            o.offset,
            o.size,
            requested,
            o.page,
            o.generation,
            o.slot,
        )
    }

    /// Counts a new allocation in its chunk and in the bytes in use (a TLSF block also in
    /// `block_bytes`/`block_count`, by the caller) and builds its handle.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn record(
        &mut self,
        chunk: u32,
        offset: u64,
        size: u64,
        requested: u64,
        handle: u32,
        generation: u32,
        slot: u32,
    ) -> Allocation {
        self.chunks[chunk as usize].live += 1;
        self.bytes_in_use += requested;
        Allocation {
            offset,
            size,
            requested,
            chunk: ChunkId(chunk),
            heap: self.id,
            handle,
            generation,
            slot,
        }
    }

    /// Carves a page for `class` and takes its first object.
    fn new_slab_page(&mut self, class: u32) -> Option<SlabObject> {
        let page_size = self.config.slab_page_size;
        let block = self
            .tlsf
            .alloc(page_size, page_size, BlockState::SlabPage)?;
        let b = *self.tlsf.block(block)?;
        let object = self.slabs.add_page(class, block, b.chunk, b.offset);
        if object.is_none() {
            self.tlsf.free(block);
        }
        object
    }

    /// Releases the cached empty slab pages (of one chunk, or all); returns how many.
    fn release_cached_pages(&mut self, only: Option<u32>) -> usize {
        let mut released = 0;
        let tlsf = &mut self.tlsf;
        self.slabs.release_cached(
            |chunk| only.is_some_and(|c| c != chunk),
            |block| {
                tlsf.free(block);
                released += 1;
            },
        );
        released
    }

    /// Whether `a` was made by this heap (a cheap check for routing between shards).
    pub fn owns(&self, a: &Allocation) -> bool {
        a.heap == self.id
    }

    /// Frees an allocation. An allocation made by another heap gives
    /// [`AllocError::ForeignAllocation`], one that matches no live allocation
    /// [`AllocError::StaleAllocation`]; in both cases nothing changes.
    #[inline(always)]
    pub fn free(&mut self, a: Allocation) -> Result<(), AllocError> {
        self.free_emptying(a).map(|_| ())
    }

    /// [`free`](Self::free), telling whether the allocation's chunk holds no allocation now:
    /// the pool asks after each free, and the count is at hand here.
    #[inline(always)]
    pub(crate) fn free_emptying(&mut self, a: Allocation) -> Result<bool, AllocError> {
        if a.heap != self.id {
            return Err(AllocError::ForeignAllocation);
        }
        if a.slot != NIL {
            match self
                .slabs
                .free(a.handle, a.generation, a.slot, a.chunk.0, a.offset)
            {
                Err(()) => return Err(AllocError::StaleAllocation),
                Ok(SlabFree::Kept) => {}
                Ok(SlabFree::Release(block)) => self.tlsf.free(block),
            }
        } else {
            let live = self.tlsf.block(a.handle).is_some_and(|b| {
                b.state == BlockState::User
                    && b.generation == a.generation
                    && b.chunk == a.chunk.0
                    && b.offset == a.offset
                    && b.size == a.size
            });
            if !live {
                return Err(AllocError::StaleAllocation);
            }
            self.tlsf.free(a.handle);
            self.block_bytes -= a.size;
            self.block_count -= 1;
        }
        let chunk = &mut self.chunks[a.chunk.0 as usize];
        chunk.live -= 1;
        let emptied = chunk.live == 0;
        self.bytes_in_use -= a.requested;
        Ok(emptied)
    }

    /// Chunks holding no allocation (cached empty slab pages do not count), in id order.
    pub fn empty_chunks(&self) -> impl Iterator<Item = ChunkId> + '_ {
        self.chunks
            .iter()
            .enumerate()
            .filter(|(_, c)| c.present && c.live == 0)
            .map(|(i, _)| ChunkId(i as u32))
    }

    /// Unregisters an empty chunk and returns its size. Fails with [`AllocError::ChunkBusy`] while
    /// it holds allocations, [`AllocError::UnknownChunk`] for an id not registered.
    pub fn remove_chunk(&mut self, id: ChunkId) -> Result<u64, AllocError> {
        let chunk = self.chunk(id).ok_or(AllocError::UnknownChunk(id))?;
        if chunk.live > 0 {
            return Err(AllocError::ChunkBusy {
                chunk: id,
                live: chunk.live,
            });
        }
        let (size, first) = (chunk.size, chunk.first_block);
        self.release_cached_pages(Some(id.0));
        // With no live allocation and its cached pages gone, coalescing left one whole block.
        if !self.tlsf.is_whole_free_region(first, size) {
            return Err(AllocError::Inconsistent(
                "empty chunk is not one free block",
            ));
        }
        self.tlsf.remove_region(first);
        self.chunks[id.0 as usize].present = false;
        self.vacant_chunks.push(id.0);
        self.chunk_count -= 1;
        self.bytes_reserved -= size;
        Ok(size)
    }

    /// Returns the cached empty slab pages to the free space; returns how many were released.
    /// [`Heap::stats`] after freeing everything and trimming equals the stats of a fresh heap with
    /// the same chunks.
    pub fn trim(&mut self) -> usize {
        self.release_cached_pages(None)
    }

    /// Usable bytes of the live allocations: TLSF blocks and slab objects.
    fn bytes_allocated(&self) -> u64 {
        let slab: u64 = self.slabs.classes().iter().map(|c| c.in_use * c.size).sum();
        self.block_bytes + slab
    }

    /// Number of live allocations: TLSF blocks and slab objects.
    fn allocation_count(&self) -> u64 {
        let slab: u64 = self.slabs.classes().iter().map(|c| c.in_use).sum();
        self.block_count + slab
    }

    /// A usage snapshot (allocates the per-class vector; not for hot paths).
    pub fn stats(&self) -> HeapStats {
        let bytes_free = self.tlsf.free_bytes();
        let largest_free_block = self.tlsf.largest_free();
        let slab_pages = self.slabs.page_count();
        HeapStats {
            bytes_in_use: self.bytes_in_use,
            bytes_allocated: self.bytes_allocated(),
            bytes_reserved: self.bytes_reserved,
            bytes_free,
            slab_page_bytes: slab_pages * self.config.slab_page_size,
            largest_free_block,
            free_blocks: self.tlsf.free_count(),
            chunk_count: self.chunk_count,
            allocation_count: self.allocation_count(),
            fragmentation: if bytes_free == 0 {
                0.0
            } else {
                1.0 - largest_free_block as f64 / bytes_free as f64
            },
            slab_classes: self
                .slabs
                .classes()
                .iter()
                .map(|c| SlabClassStats {
                    class_size: c.size,
                    objects_in_use: c.in_use,
                    slab_pages: c.pages,
                })
                .collect(),
        }
    }

    /// Checks every internal invariant (block lists, bitmaps, counters, per-chunk tallies) in time
    /// linear in the heap's metadata; for tests, fuzzing and debugging. `Err` describes the first
    /// violation found.
    pub fn check_consistency(&self) -> Result<(), String> {
        self.tlsf.check_lists()?;
        let mut user_blocks = 0u64;
        let mut user_bytes = 0u64;
        let mut page_blocks = Vec::new();
        let mut live = vec![0u64; self.chunks.len()];
        let mut reserved = 0;
        let mut count = 0;
        for (i, c) in self.chunks.iter().enumerate() {
            if !c.present {
                continue;
            }
            reserved += c.size;
            count += 1;
            self.tlsf
                .check_region(i as u32, c.first_block, c.size, |index, b| {
                    if b.state == BlockState::User {
                        user_blocks += 1;
                        user_bytes += b.size;
                        live[i] += 1;
                    } else {
                        page_blocks.push((index, b.chunk, b.offset, b.size));
                    }
                })?;
        }
        let mut pages = self.slabs.check()?;
        if pages.len() != page_blocks.len() {
            return Err(format!(
                "{} slab pages but {} slab-page blocks",
                pages.len(),
                page_blocks.len()
            ));
        }
        pages.sort_unstable_by_key(|p| p.block);
        page_blocks.sort_unstable();
        for (p, &(index, chunk, offset, size)) in pages.iter().zip(&page_blocks) {
            if p.block != index
                || p.chunk != chunk
                || p.offset != offset
                || size != self.config.slab_page_size
            {
                return Err(format!("slab page {p:?} disagrees with its block"));
            }
            live[chunk as usize] += p.used;
        }
        for (i, c) in self.chunks.iter().enumerate() {
            if c.present && c.live != live[i] {
                return Err(format!(
                    "chunk {i}: live {} but counted {}",
                    c.live, live[i]
                ));
            }
        }
        let slab_objects: u64 = self.slabs.classes().iter().map(|c| c.in_use).sum();
        let slab_bytes: u64 = self.slabs.classes().iter().map(|c| c.in_use * c.size).sum();
        let used = user_bytes + page_blocks.len() as u64 * self.config.slab_page_size;
        if reserved != self.bytes_reserved
            || count != self.chunk_count
            || user_blocks != self.block_count
            || user_bytes != self.block_bytes
            || user_blocks + slab_objects != self.allocation_count()
            || user_bytes + slab_bytes != self.bytes_allocated()
            || used + self.tlsf.free_bytes() != reserved
            || self.bytes_in_use > self.bytes_allocated()
        {
            return Err("heap counters disagree with the blocks".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
