//! Fuzz the allocator core against a naive model: a list of live blocks and a map of chunks.
//!
//! After every action the model's invariants are checked (no overlap, inside the chunk, aligned,
//! large enough, statistics and empty chunks agree, internal consistency); at the end everything is
//! freed, the statistics must equal a fresh heap's, and whole-chunk allocations must succeed.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use vkgdr::alloc::{AllocError, Allocation, ChunkId, Heap, HeapConfig};

#[derive(Arbitrary, Debug)]
enum Action {
    /// Allocate `size` (masked to ≤ 4 MiB) aligned to `1 << (align_log % 20)`.
    Alloc {
        size: u32,
        align_log: u8,
    },
    /// Allocate; on `OutOfSpace` add the suggested chunk and retry (must succeed).
    AllocOrGrow {
        size: u32,
        align_log: u8,
    },
    /// Allocate many equal small blocks (slab pressure).
    Burst {
        size: u16,
        count: u8,
    },
    /// Free the live block at `index % live`.
    Free {
        index: u16,
    },
    /// Free a run of blocks starting at `index`.
    FreeMany {
        index: u16,
        count: u8,
    },
    /// Add a chunk of `size_units * 4 KiB` (0 tests the error).
    AddChunk {
        size_units: u16,
    },
    /// Add a chunk of an arbitrary byte size (often invalid).
    AddOddChunk {
        size: u32,
    },
    /// Remove the chunk at `index % chunks`.
    RemoveChunk {
        index: u8,
    },
    Trim,
}

#[derive(Arbitrary, Debug)]
struct Input {
    config: u8,
    actions: Vec<Action>,
}

fn config(choice: u8) -> HeapConfig {
    match choice % 4 {
        0 => HeapConfig::default(),
        1 => HeapConfig {
            slab_page_size: 16 << 10,
            max_slab_size: 2048,
            min_align: 64,
            max_align: 16 << 10,
            slab_classes_per_octave: 2,
        },
        2 => HeapConfig {
            min_align: 1,
            max_slab_size: 512,
            slab_classes_per_octave: 16,
            ..HeapConfig::default()
        },
        _ => HeapConfig {
            max_slab_size: 0,
            ..HeapConfig::default()
        },
    }
}

struct Model {
    heap: Heap,
    config: HeapConfig,
    chunks: BTreeMap<ChunkId, u64>,
    live: Vec<(Allocation, u64)>,
}

impl Model {
    fn add_chunk(&mut self, size: u64) {
        match self.heap.add_chunk(size) {
            Ok(id) => {
                assert!(size > 0 && size.is_multiple_of(self.config.min_align));
                assert!(self.chunks.insert(id, size).is_none());
            }
            Err(e) => {
                assert_eq!(e, AllocError::BadChunkSize { size });
                assert!(size == 0 || !size.is_multiple_of(self.config.min_align));
            }
        }
    }

    fn accept(&mut self, a: Allocation, size: u64, align: u64) {
        let chunk_size = self.chunks[&a.chunk()];
        assert!(a.size() >= size && a.requested_size() == size);
        assert_eq!(a.offset() % align, 0);
        assert!(a.offset() + a.size() <= chunk_size);
        for (b, _) in &self.live {
            assert!(
                b.chunk() != a.chunk()
                    || b.offset() + b.size() <= a.offset()
                    || a.offset() + a.size() <= b.offset(),
                "overlap"
            );
        }
        self.live.push((a, size));
    }

    fn alloc(&mut self, size: u64, align: u64, grow: bool) {
        let r = self.heap.alloc(size, align);
        match r {
            Ok(a) => self.accept(a, size, align),
            Err(AllocError::ZeroSize) => assert_eq!(size, 0),
            Err(AllocError::AlignmentTooLarge { align: a, max }) => {
                assert_eq!((a, max), (align, self.config.max_align));
                assert!(align > max);
            }
            Err(AllocError::OutOfSpace {
                chunk_size_needed, ..
            }) => {
                assert!(size > 0 && align <= self.config.max_align);
                if grow {
                    self.add_chunk(chunk_size_needed);
                    let a = self.heap.alloc(size, align).expect("alloc after growing");
                    self.accept(a, size, align);
                }
            }
            Err(e) => panic!("unexpected {e:?}"),
        }
    }

    fn free(&mut self, index: usize) {
        if self.live.is_empty() {
            return;
        }
        let (a, _) = self.live.swap_remove(index % self.live.len());
        self.heap.free(a).unwrap();
    }

    fn check(&self) {
        self.heap.check_consistency().unwrap();
        let s = self.heap.stats();
        assert_eq!(s.bytes_in_use, self.live.iter().map(|l| l.1).sum::<u64>());
        assert_eq!(
            s.bytes_allocated,
            self.live.iter().map(|l| l.0.size()).sum::<u64>()
        );
        assert_eq!(s.allocation_count, self.live.len() as u64);
        assert_eq!(s.bytes_reserved, self.chunks.values().sum::<u64>());
        let empty: Vec<ChunkId> = self.heap.empty_chunks().collect();
        let expected: Vec<ChunkId> = self
            .chunks
            .keys()
            .copied()
            .filter(|c| self.live.iter().all(|l| l.0.chunk() != *c))
            .collect();
        assert_eq!(empty, expected);
    }
}

fuzz_target!(|input: Input| {
    let config = config(input.config);
    let mut m = Model {
        heap: Heap::new(config.clone()).unwrap(),
        config,
        chunks: BTreeMap::new(),
        live: Vec::new(),
    };
    m.add_chunk(1 << 20);
    for action in input.actions.into_iter().take(256) {
        match action {
            Action::Alloc { size, align_log } => {
                m.alloc(u64::from(size % (4 << 20)), 1 << (align_log % 20), false)
            }
            Action::AllocOrGrow { size, align_log } => {
                m.alloc(u64::from(size % (4 << 20)), 1 << (align_log % 20), true)
            }
            Action::Burst { size, count } => {
                for _ in 0..count % 64 {
                    m.alloc(u64::from(size % 4097), 16, false);
                }
            }
            Action::Free { index } => m.free(usize::from(index)),
            Action::FreeMany { index, count } => {
                for _ in 0..count % 64 {
                    m.free(usize::from(index));
                }
            }
            Action::AddChunk { size_units } => {
                if m.chunks.len() < 16 {
                    m.add_chunk(u64::from(size_units % 512) << 12);
                }
            }
            Action::AddOddChunk { size } => {
                if m.chunks.len() < 16 {
                    m.add_chunk(u64::from(size % (2 << 20)));
                }
            }
            Action::RemoveChunk { index } => {
                if let Some((&id, &size)) = m
                    .chunks
                    .iter()
                    .nth(usize::from(index) % m.chunks.len().max(1))
                {
                    let live = m.live.iter().filter(|l| l.0.chunk() == id).count() as u64;
                    let r = m.heap.remove_chunk(id);
                    if live == 0 {
                        assert_eq!(r, Ok(size));
                        m.chunks.remove(&id);
                    } else {
                        assert_eq!(r, Err(AllocError::ChunkBusy { chunk: id, live }));
                    }
                }
            }
            Action::Trim => {
                m.heap.trim();
            }
        }
        m.check();
    }
    // Free everything: the heap must look fresh and every chunk must be allocatable whole.
    while !m.live.is_empty() {
        m.free(0);
    }
    m.heap.trim();
    m.check();
    let mut fresh = Heap::new(m.config.clone()).unwrap();
    for &size in m.chunks.values() {
        fresh.add_chunk(size).unwrap();
    }
    assert_eq!(m.heap.stats(), fresh.stats());
    let mut sizes: Vec<u64> = m.chunks.values().copied().collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    let whole: Vec<Allocation> = sizes
        .iter()
        .map(|&size| {
            let a = m.heap.alloc(size, 1).expect("whole-chunk allocation");
            assert_eq!((a.offset(), a.size()), (0, size));
            a
        })
        .collect();
    for a in whole {
        m.heap.free(a).unwrap();
    }
    for (id, size) in std::mem::take(&mut m.chunks) {
        assert_eq!(m.heap.remove_chunk(id), Ok(size));
    }
});
