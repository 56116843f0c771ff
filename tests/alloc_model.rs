//! Property test: random action sequences against a simple model of live blocks and chunks.
//!
//! After every step: blocks never overlap, stay inside their chunk, honour their alignment and are
//! at least the requested size; the heap's statistics and empty-chunk list agree with the model; the
//! heap's own consistency check passes. At the end everything is freed, the statistics equal those
//! of a fresh heap with the same chunks, and whole-chunk allocations succeed.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::sample::Index;
use vkgdr::alloc::{AllocError, Allocation, ChunkId, Heap, HeapConfig, MAX_CHUNK_SIZE};

#[derive(Clone, Debug)]
enum Action {
    /// Allocate; `OutOfSpace` is an allowed outcome.
    Alloc {
        size: u64,
        align_log: u32,
    },
    /// Allocate; on `OutOfSpace` add the suggested chunk and retry, which must succeed.
    AllocOrGrow {
        size: u64,
        align_log: u32,
    },
    /// A request that must be refused: 0 = zero size, 1 = bad alignment, 2 = oversize.
    Invalid {
        kind: u8,
        value: u64,
    },
    Free(Index),
    AddChunk(u64),
    /// Remove a registered chunk (busy or not), or an unknown id when there is none.
    RemoveChunk(Index),
    Trim,
}

fn size_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1..=256u64,
        4 => 257..=4096u64,
        2 => 4097..=100_000u64,
        1 => 100_001..=(3u64 << 20),
    ]
}

fn action_strategy() -> impl Strategy<Value = Action> {
    prop_oneof![
        8 => (size_strategy(), 0..=17u32).prop_map(|(size, align_log)| Action::Alloc { size, align_log }),
        3 => (size_strategy(), 0..=16u32)
            .prop_map(|(size, align_log)| Action::AllocOrGrow { size, align_log }),
        1 => (0..3u8, any::<u64>()).prop_map(|(kind, value)| Action::Invalid { kind, value }),
        7 => any::<Index>().prop_map(Action::Free),
        1 => prop_oneof![
            (1..=32u64).prop_map(|k| k << 16),
            (0..=70_000u64).prop_map(|k| k * 8),
        ]
        .prop_map(Action::AddChunk),
        1 => any::<Index>().prop_map(Action::RemoveChunk),
        1 => Just(Action::Trim),
    ]
}

fn config_strategy() -> impl Strategy<Value = HeapConfig> {
    prop_oneof![
        Just(HeapConfig::default()),
        Just(HeapConfig {
            slab_classes_per_octave: 4,
            ..HeapConfig::default()
        }),
        // Small pages and granule 64, alignment capped at 16 KiB.
        Just(HeapConfig {
            slab_page_size: 16 << 10,
            max_slab_size: 2048,
            min_align: 64,
            max_align: 16 << 10,
            slab_classes_per_octave: 2,
        }),
        // Byte granule.
        Just(HeapConfig {
            min_align: 1,
            max_slab_size: 512,
            ..HeapConfig::default()
        }),
        // No slabs at all.
        Just(HeapConfig {
            max_slab_size: 0,
            ..HeapConfig::default()
        }),
    ]
}

struct Live {
    alloc: Allocation,
    requested: u64,
}

struct Harness {
    heap: Heap,
    config: HeapConfig,
    chunks: BTreeMap<ChunkId, u64>,
    live: Vec<Live>,
    /// (chunk, offset) -> end, for overlap checks.
    ranges: BTreeMap<(ChunkId, u64), u64>,
}

impl Harness {
    fn new(config: HeapConfig) -> Self {
        Harness {
            heap: Heap::new(config.clone()).unwrap(),
            config,
            chunks: BTreeMap::new(),
            live: Vec::new(),
            ranges: BTreeMap::new(),
        }
    }

    fn add_chunk(&mut self, size: u64) -> Result<ChunkId, AllocError> {
        let r = self.heap.add_chunk(size);
        if size == 0 || !size.is_multiple_of(self.config.min_align) {
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
    fn accept(&mut self, a: Allocation, size: u64, align: u64) {
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

    fn alloc(&mut self, size: u64, align: u64, grow: bool) {
        let before = self.heap.stats();
        let result = self.heap.alloc(size, align);
        if let Some(expected) = self.expected_error(size, align) {
            assert_eq!(result, Err(expected.clone()));
            assert_eq!(self.heap.chunk_size_needed(size, align), Err(expected));
            assert_eq!(self.heap.stats(), before);
            return;
        }
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

    fn free(&mut self, index: usize) {
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

    fn remove_chunk(&mut self, index: Index) {
        if self.chunks.is_empty() {
            let id = ChunkId(index.index(1000) as u32);
            assert_eq!(
                self.heap.remove_chunk(id),
                Err(AllocError::UnknownChunk(id))
            );
            return;
        }
        let (&id, &size) = self
            .chunks
            .iter()
            .nth(index.index(self.chunks.len()))
            .unwrap();
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

    fn step(&mut self, action: Action) {
        match action {
            Action::Alloc { size, align_log } => self.alloc(size, 1 << align_log, false),
            Action::AllocOrGrow { size, align_log } => self.alloc(size, 1 << align_log, true),
            Action::Invalid { kind, value } => {
                let (size, align) = match kind {
                    0 => (0, 1 << (value % 8)),
                    // Never a power of two: 0 or a sum of two distinct bits.
                    1 => (
                        1 + value % 5000,
                        if value % 7 == 0 { 0 } else { 3 << (value % 20) },
                    ),
                    _ => (MAX_CHUNK_SIZE + 1 + value % (1 << 40), 16),
                };
                self.alloc(size, align, false);
            }
            Action::Free(index) => {
                if !self.live.is_empty() {
                    self.free(index.index(self.live.len()));
                }
            }
            Action::AddChunk(size) => {
                let _ = self.add_chunk(size);
            }
            Action::RemoveChunk(index) => self.remove_chunk(index),
            Action::Trim => {
                self.heap.trim();
            }
        }
    }

    fn check(&self) {
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

    /// Frees everything and checks the heap is back to a fresh state.
    fn finish(mut self) {
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn heap_matches_model(
        config in config_strategy(),
        initial in prop::collection::vec((1..=16u64).prop_map(|k| k << 18), 0..3),
        actions in prop::collection::vec(action_strategy(), 1..300),
    ) {
        let mut h = Harness::new(config);
        for size in initial {
            h.add_chunk(size).unwrap();
        }
        h.check();
        for action in actions {
            h.step(action);
            h.check();
        }
        h.finish();
    }
}

/// Fill a heap with one small class until it runs out, free in a scattered order, and check the
/// chunk becomes whole again (slab pages released, coalescing complete).
#[test]
fn scattered_frees_restore_whole_chunk() {
    let mut h = Harness::new(HeapConfig::default());
    h.add_chunk(1 << 20).unwrap();
    loop {
        match h.heap.alloc(48, 16) {
            Ok(a) => h.accept(a, 48, 16),
            Err(AllocError::OutOfSpace { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    // 16 pages of 1365 objects fill the chunk exactly.
    assert_eq!(h.live.len(), 16 * ((64 << 10) / 48));
    let mut i = 0;
    while !h.live.is_empty() {
        i = (i + 7919) % h.live.len();
        h.free(i);
    }
    h.check();
    h.finish();
}
