//! The allocator core's model, shared by the property test (`tests/alloc_model.rs`) and the fuzz
//! target (`fuzz/fuzz_targets/alloc_core.rs`), each of which includes this file with `#[path]`
//! and drives it with its own input generator. Plain `std` and `vkgdr` only.
//!
//! The model is a list of live blocks and a map of chunks. After every step: blocks never
//! overlap, stay inside their chunk, honour their alignment and are at least the requested size;
//! invalid requests fail with the documented error and change nothing; the heap's statistics and
//! empty-chunk list agree with the model; the heap's own consistency check passes. At the end
//! ([`Model::finish`]) everything is freed, the statistics equal those of a fresh heap with the
//! same chunks, and whole-chunk allocations succeed.
// Each includer uses part of it.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

use vkgdr::alloc::{AllocError, Allocation, ChunkId, Heap, HeapConfig, MAX_CHUNK_SIZE};

/// One step against the heap. Indices ("picks") are taken modulo the number of candidates.
#[derive(Clone, Debug)]
pub enum Action {
    /// Allocate `size` aligned to `align` (valid or not). `OutOfSpace` is an allowed outcome; with
    /// `grow`, the suggested chunk is added and the retry must succeed.
    Alloc {
        size: u64,
        align: u64,
        grow: bool,
    },
    /// Free the live block at `pick % live` (nothing when none is live).
    Free(usize),
    /// Register a chunk of this size (invalid sizes must be refused).
    AddChunk(u64),
    /// Remove the chunk at `pick % chunks` (busy or not), or an unknown id when there is none.
    RemoveChunk(usize),
    Trim,
}

/// The heap configurations both drivers choose from.
pub fn configs() -> Vec<HeapConfig> {
    vec![
        HeapConfig::default(),
        HeapConfig {
            slab_classes_per_octave: 4,
            ..HeapConfig::default()
        },
        // Small pages and granule 64, alignment capped at 16 KiB.
        HeapConfig {
            slab_page_size: 16 << 10,
            max_slab_size: 2048,
            min_align: 64,
            max_align: 16 << 10,
            slab_classes_per_octave: 2,
        },
        // Byte granule.
        HeapConfig {
            min_align: 1,
            max_slab_size: 512,
            ..HeapConfig::default()
        },
        // Byte granule with the finest classes.
        HeapConfig {
            min_align: 1,
            max_slab_size: 512,
            slab_classes_per_octave: 16,
            ..HeapConfig::default()
        },
        // No slabs at all.
        HeapConfig {
            max_slab_size: 0,
            ..HeapConfig::default()
        },
    ]
}

pub struct Live {
    pub alloc: Allocation,
    pub requested: u64,
}

pub struct Model {
    pub heap: Heap,
    pub config: HeapConfig,
    pub chunks: BTreeMap<ChunkId, u64>,
    pub live: Vec<Live>,
    /// (chunk, offset) -> end, for overlap checks.
    ranges: BTreeMap<(ChunkId, u64), u64>,
}

impl Model {
    pub fn new(config: HeapConfig) -> Self {
        Model {
            heap: Heap::new(config.clone()).unwrap(),
            config,
            chunks: BTreeMap::new(),
            live: Vec::new(),
            ranges: BTreeMap::new(),
        }
    }

    pub fn add_chunk(&mut self, size: u64) -> Result<ChunkId, AllocError> {
        let r = self.heap.add_chunk(size);
        if size == 0 || !size.is_multiple_of(self.config.min_align) || size > MAX_CHUNK_SIZE {
            assert_eq!(r, Err(AllocError::BadChunkSize { size }));
        } else {
            let id = r.clone().unwrap();
            assert!(
                self.chunks.insert(id, size).is_none(),
                "{id} handed out twice"
            );
        }
        r
    }

    /// Checks a new allocation against the model and records it.
    pub fn accept(&mut self, a: Allocation, size: u64, align: u64) {
        let chunk_size = *self
            .chunks
            .get(&a.chunk())
            .expect("allocation in unknown chunk");
        assert!(a.size() >= size, "usable {} < requested {size}", a.size());
        assert_eq!(a.requested_size(), size);
        assert_eq!(
            a.offset() % align,
            0,
            "offset {} not aligned to {align}",
            a.offset()
        );
        assert_eq!(a.offset() % self.config.min_align, 0);
        let end = a.offset() + a.size();
        assert!(
            end <= chunk_size,
            "block ends at {end} past chunk size {chunk_size}"
        );
        let key = (a.chunk(), a.offset());
        if let Some((&(c, start), &prev_end)) = self.ranges.range(..=key).next_back() {
            assert!(
                c != a.chunk() || prev_end <= a.offset(),
                "overlap with {c}@{start}..{prev_end}"
            );
        }
        if let Some((&(c, start), _)) = self.ranges.range(key..).next() {
            assert!(c != a.chunk() || start >= end, "overlap with {c}@{start}");
        }
        self.ranges.insert(key, end);
        assert!(self.heap.owns(&a));
        self.live.push(Live {
            alloc: a,
            requested: size,
        });
    }

    fn expected_error(&self, size: u64, align: u64) -> Option<AllocError> {
        if size == 0 {
            Some(AllocError::ZeroSize)
        } else if !align.is_power_of_two() {
            Some(AllocError::BadAlignment { align })
        } else if align > self.config.max_align {
            Some(AllocError::AlignmentTooLarge {
                align,
                max: self.config.max_align,
            })
        } else if size > MAX_CHUNK_SIZE {
            Some(AllocError::Overflow { size })
        } else {
            None
        }
    }

    pub fn alloc(&mut self, size: u64, align: u64, grow: bool) {
        let before = self.heap.stats();
        let result = self.heap.alloc(size, align);
        if let Some(expected) = self.expected_error(size, align) {
            assert_eq!(result, Err(expected.clone()));
            assert_eq!(
                self.heap.chunk_size_needed(size, align),
                Err(expected.clone())
            );
            assert_eq!(self.config.check_request(size, align), Err(expected));
            assert_eq!(self.heap.stats(), before);
            return;
        }
        assert_eq!(self.config.check_request(size, align), Ok(()));
        match result {
            Ok(a) => self.accept(a, size, align),
            Err(AllocError::OutOfSpace {
                size: s,
                align: al,
                chunk_size_needed,
            }) => {
                assert_eq!((s, al), (size, align));
                assert_eq!(
                    self.heap.chunk_size_needed(size, align),
                    Ok(chunk_size_needed)
                );
                assert!(chunk_size_needed >= size);
                let after = self.heap.stats();
                assert_eq!(after.bytes_in_use, before.bytes_in_use);
                assert_eq!(after.allocation_count, before.allocation_count);
                if grow {
                    self.add_chunk(chunk_size_needed).unwrap();
                    let a = self
                        .heap
                        .alloc(size, align)
                        .expect("alloc after adding the suggested chunk");
                    self.accept(a, size, align);
                }
            }
            Err(e) => panic!("unexpected error {e:?}"),
        }
    }

    pub fn free(&mut self, index: usize) {
        let live = self.live.swap_remove(index);
        self.ranges
            .remove(&(live.alloc.chunk(), live.alloc.offset()))
            .unwrap();
        self.heap.free(live.alloc).unwrap();
    }

    fn live_in(&self, chunk: ChunkId) -> u64 {
        self.live
            .iter()
            .filter(|l| l.alloc.chunk() == chunk)
            .count() as u64
    }

    fn remove_chunk(&mut self, pick: usize) {
        if self.chunks.is_empty() {
            let id = ChunkId((pick % 1000) as u32);
            assert_eq!(
                self.heap.remove_chunk(id),
                Err(AllocError::UnknownChunk(id))
            );
            return;
        }
        let (&id, &size) = self.chunks.iter().nth(pick % self.chunks.len()).unwrap();
        let live = self.live_in(id);
        if live == 0 {
            assert_eq!(self.heap.remove_chunk(id), Ok(size));
            self.chunks.remove(&id);
            assert_eq!(
                self.heap.remove_chunk(id),
                Err(AllocError::UnknownChunk(id))
            );
        } else {
            assert_eq!(
                self.heap.remove_chunk(id),
                Err(AllocError::ChunkBusy { chunk: id, live })
            );
        }
    }

    /// Applies one action, then checks every invariant.
    pub fn step(&mut self, action: Action) {
        self.apply(action);
        self.check();
    }

    /// Applies one action, checking its own outcome (not yet the invariants: [`Model::check`]).
    pub fn apply(&mut self, action: Action) {
        match action {
            Action::Alloc { size, align, grow } => self.alloc(size, align, grow),
            Action::Free(pick) => {
                if !self.live.is_empty() {
                    self.free(pick % self.live.len());
                }
            }
            Action::AddChunk(size) => {
                let _ = self.add_chunk(size);
            }
            Action::RemoveChunk(pick) => self.remove_chunk(pick),
            Action::Trim => {
                self.heap.trim();
            }
        }
    }

    pub fn check(&self) {
        self.heap.check_consistency().unwrap();
        let s = self.heap.stats();
        let requested: u64 = self.live.iter().map(|l| l.requested).sum();
        let usable: u64 = self.live.iter().map(|l| l.alloc.size()).sum();
        assert_eq!(s.bytes_in_use, requested);
        assert_eq!(s.bytes_allocated, usable);
        assert_eq!(s.allocation_count, self.live.len() as u64);
        assert_eq!(s.chunk_count as usize, self.chunks.len());
        assert_eq!(s.bytes_reserved, self.chunks.values().sum::<u64>());
        assert!(s.bytes_free + s.slab_page_bytes <= s.bytes_reserved);
        assert!(s.largest_free_block <= s.bytes_free);
        assert!((0.0..=1.0).contains(&s.fragmentation));
        let slab_objects: u64 = s.slab_classes.iter().map(|c| c.objects_in_use).sum();
        assert!(slab_objects <= s.allocation_count);
        let empty: BTreeSet<ChunkId> = self.heap.empty_chunks().collect();
        let expected: BTreeSet<ChunkId> = self
            .chunks
            .keys()
            .copied()
            .filter(|&c| self.live_in(c) == 0)
            .collect();
        assert_eq!(empty, expected);
        for (&id, &size) in &self.chunks {
            assert_eq!(self.heap.chunk_size(id), Some(size));
        }
    }

    /// Frees everything and checks the heap is back to a fresh state: same statistics as a new
    /// heap with the same chunks, every chunk allocatable whole, every chunk removable.
    pub fn finish(mut self) {
        while !self.live.is_empty() {
            self.free(self.live.len() - 1);
        }
        self.heap.trim();
        self.check();
        let mut fresh = Heap::new(self.config.clone()).unwrap();
        for &size in self.chunks.values() {
            fresh.add_chunk(size).unwrap();
        }
        assert_eq!(self.heap.stats(), fresh.stats());
        assert_eq!(
            self.heap.empty_chunks().count(),
            self.chunks.len(),
            "all chunks empty"
        );
        // Largest first, so each request takes a chunk of exactly its size.
        let mut sizes: Vec<(u64, ChunkId)> = self.chunks.iter().map(|(&c, &s)| (s, c)).collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let mut whole = Vec::new();
        for (size, _) in sizes {
            let a = self
                .heap
                .alloc(size, 1)
                .unwrap_or_else(|e| panic!("whole-chunk allocation of {size}: {e}"));
            assert_eq!((a.offset(), a.size()), (0, size));
            assert_eq!(self.heap.chunk_size(a.chunk()), Some(size));
            whole.push(a);
        }
        assert_eq!(self.heap.stats().bytes_free, 0);
        for a in whole {
            self.heap.free(a).unwrap();
        }
        self.heap.trim();
        assert_eq!(self.heap.stats(), fresh.stats());
        for (id, size) in std::mem::take(&mut self.chunks) {
            assert_eq!(self.heap.remove_chunk(id), Ok(size));
        }
        self.heap.check_consistency().unwrap();
    }
}
