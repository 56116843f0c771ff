//! The heap's unit tests (a property model of it is in `tests/alloc_model.rs`).

use super::*;

fn heap_with(chunks: &[u64]) -> Heap {
    let mut heap = Heap::new(HeapConfig::default()).unwrap();
    for &size in chunks {
        heap.add_chunk(size).unwrap();
    }
    heap
}

#[test]
fn heap_is_send() {
    fn assert_send<T: Send>() {}
    assert_send::<Heap>();
    assert_send::<Allocation>();
}

#[test]
fn config_rules_are_enforced() {
    let bad = |f: fn(&mut HeapConfig)| {
        let mut c = HeapConfig::default();
        f(&mut c);
        matches!(Heap::new(c), Err(AllocError::InvalidConfig(_)))
    };
    assert!(bad(|c| c.min_align = 24));
    assert!(bad(|c| c.max_align = 0));
    assert!(bad(|c| c.min_align = 1 << 17));
    assert!(bad(|c| c.slab_page_size = 3 << 14));
    assert!(bad(|c| c.slab_page_size = 1 << 17));
    assert!(bad(|c| c.max_slab_size = 16 << 10));
    assert!(bad(|c| c.slab_classes_per_octave = 3));
    assert!(!bad(|c| c.max_slab_size = 0));
    assert!(!bad(|_| {}));
}

#[test]
fn request_errors_leave_heap_unchanged() {
    let mut heap = heap_with(&[1 << 20]);
    let before = heap.stats();
    assert_eq!(heap.alloc(0, 16), Err(AllocError::ZeroSize));
    assert_eq!(
        heap.alloc(16, 0),
        Err(AllocError::BadAlignment { align: 0 })
    );
    assert_eq!(
        heap.alloc(16, 48),
        Err(AllocError::BadAlignment { align: 48 })
    );
    assert_eq!(
        heap.alloc(16, 1 << 17),
        Err(AllocError::AlignmentTooLarge {
            align: 1 << 17,
            max: 1 << 16
        })
    );
    assert_eq!(
        heap.alloc(u64::MAX, 1),
        Err(AllocError::Overflow { size: u64::MAX })
    );
    assert_eq!(
        heap.alloc(2 << 20, 1),
        Err(AllocError::OutOfSpace {
            size: 2 << 20,
            align: 1,
            chunk_size_needed: 2 << 20
        })
    );
    assert_eq!(heap.stats(), before);
    heap.check_consistency().unwrap();
}

#[test]
fn empty_heap_reports_out_of_space_with_needed_size() {
    let mut heap = heap_with(&[]);
    match heap.alloc(100, 1) {
        Err(AllocError::OutOfSpace {
            chunk_size_needed, ..
        }) => assert_eq!(chunk_size_needed, 112),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(heap.chunk_size_needed(5000, 1), Ok(5008));
    assert_eq!(heap.chunk_size_needed(0, 1), Err(AllocError::ZeroSize));
}

#[test]
fn chunk_size_needed_always_suffices() {
    // Fill a chunk, then for assorted requests add the suggested chunk and retry.
    let mut heap = heap_with(&[1 << 16]);
    let filler = heap.alloc(1 << 16, 1).unwrap();
    let mut live = vec![filler];
    for &(size, align) in &[
        (1, 1),
        (4096, 4096),
        (4097, 16),
        (5000, 1 << 16),
        (100_000, 256),
        (1 << 20, 1 << 12),
        (12_345, 32),
    ] {
        let needed = match heap.alloc(size, align) {
            Err(AllocError::OutOfSpace {
                chunk_size_needed, ..
            }) => chunk_size_needed,
            other => panic!("expected OutOfSpace for {size}/{align}, got {other:?}"),
        };
        assert_eq!(heap.chunk_size_needed(size, align), Ok(needed));
        let chunk = heap.add_chunk(needed).unwrap();
        let a = heap.alloc(size, align).unwrap();
        assert_eq!(a.chunk(), chunk);
        assert_eq!(a.offset() % align, 0);
        // Keep the rest of the new chunk busy so the next request needs another chunk.
        while let Ok(x) = heap.alloc(16, 16) {
            live.push(x);
        }
        live.push(a);
        heap.check_consistency().unwrap();
    }
    for a in live {
        heap.free(a).unwrap();
    }
    heap.check_consistency().unwrap();
}

#[test]
fn foreign_and_stale_allocations_are_refused() {
    let mut a_heap = heap_with(&[1 << 20]);
    let mut b_heap = heap_with(&[1 << 20]);
    let small = a_heap.alloc(64, 16).unwrap();
    let big = a_heap.alloc(8192, 16).unwrap();
    let b_before = b_heap.stats();
    assert!(!b_heap.owns(&small));
    assert_eq!(b_heap.free(small), Err(AllocError::ForeignAllocation));
    assert_eq!(b_heap.free(big), Err(AllocError::ForeignAllocation));
    assert_eq!(b_heap.stats(), b_before);

    // Forged handles (only possible inside the module) must not corrupt the heap.
    let real_small = a_heap.alloc(64, 16).unwrap();
    let real_big = a_heap.alloc(8192, 16).unwrap();
    let before = a_heap.stats();
    let forge = |a: &Allocation, f: fn(&mut Allocation)| {
        let mut x = Allocation { ..*a };
        f(&mut x);
        x
    };
    let forgeries = [
        forge(&real_small, |x| x.generation += 1),
        forge(&real_small, |x| x.slot += 1),
        forge(&real_small, |x| x.offset += 16),
        forge(&real_small, |x| x.handle = 999),
        forge(&real_small, |x| x.chunk = ChunkId(7)),
        forge(&real_big, |x| x.generation += 1),
        forge(&real_big, |x| x.handle += 1),
        forge(&real_big, |x| x.handle = 12345),
        forge(&real_big, |x| x.slot = 3),
        forge(&real_big, |x| x.size += 16),
    ];
    for f in forgeries {
        assert_eq!(a_heap.free(f), Err(AllocError::StaleAllocation));
        assert_eq!(a_heap.stats(), before);
        a_heap.check_consistency().unwrap();
    }
    a_heap.free(real_small).unwrap();
    a_heap.free(real_big).unwrap();
    a_heap.check_consistency().unwrap();
}

#[test]
fn empty_chunks_ignore_cached_slab_pages_and_remove_releases_them() {
    let mut heap = heap_with(&[1 << 20, 1 << 20]);
    let a = heap.alloc(100, 16).unwrap();
    let c = a.chunk();
    assert_eq!(heap.empty_chunks().count(), 1);
    assert_eq!(
        heap.remove_chunk(c),
        Err(AllocError::ChunkBusy { chunk: c, live: 1 })
    );
    heap.free(a).unwrap();
    // The page is cached but the chunk counts as empty.
    assert_eq!(heap.stats().slab_page_bytes, 64 << 10);
    assert_eq!(heap.empty_chunks().count(), 2);
    assert_eq!(heap.remove_chunk(c), Ok(1 << 20));
    assert_eq!(heap.stats().slab_page_bytes, 0);
    assert_eq!(heap.remove_chunk(c), Err(AllocError::UnknownChunk(c)));
    assert_eq!(
        heap.remove_chunk(ChunkId(99)),
        Err(AllocError::UnknownChunk(ChunkId(99)))
    );
    // Ids are reused.
    assert_eq!(heap.add_chunk(1 << 16), Ok(c));
    heap.check_consistency().unwrap();
}

#[test]
fn bad_chunk_sizes_are_refused() {
    let mut heap = heap_with(&[]);
    for size in [0, 8, 1000, MAX_CHUNK_SIZE + 16] {
        assert_eq!(heap.add_chunk(size), Err(AllocError::BadChunkSize { size }));
    }
    assert_eq!(heap.add_chunk(MAX_CHUNK_SIZE).map(|c| c.0), Ok(0));
    let a = heap.alloc(MAX_CHUNK_SIZE, 1 << 16).unwrap();
    assert_eq!(a.size(), MAX_CHUNK_SIZE);
    heap.free(a).unwrap();
}

#[test]
fn cached_pages_yield_to_large_requests() {
    let mut heap = heap_with(&[1 << 20]);
    let a = heap.alloc(64, 16).unwrap();
    let b = heap.alloc(1024, 16).unwrap();
    heap.free(a).unwrap();
    heap.free(b).unwrap();
    assert_eq!(heap.stats().slab_page_bytes, 128 << 10);
    // The whole chunk is needed: the cached pages must go back first.
    let whole = heap.alloc(1 << 20, 1).unwrap();
    assert_eq!(whole.offset(), 0);
    heap.free(whole).unwrap();
    assert_eq!(heap.trim(), 0);
    heap.check_consistency().unwrap();
}

#[test]
fn stats_track_requested_and_usable_bytes() {
    let mut heap = heap_with(&[1 << 20]);
    let fresh = heap.stats();
    assert_eq!(fresh.fragmentation, 0.0);
    assert_eq!(fresh.largest_free_block, 1 << 20);
    let a = heap.alloc(257, 1).unwrap();
    let b = heap.alloc(5000, 1).unwrap();
    assert_eq!(a.size(), 288);
    assert_eq!(b.size(), 5008);
    let s = heap.stats();
    assert_eq!(s.bytes_in_use, 257 + 5000);
    assert_eq!(s.bytes_allocated, 288 + 5008);
    assert_eq!(s.allocation_count, 2);
    let class = s.slab_classes.iter().find(|c| c.class_size == 288).unwrap();
    assert_eq!((class.objects_in_use, class.slab_pages), (1, 1));
    assert_eq!(s.bytes_free + s.slab_page_bytes + 5008, 1 << 20);
    heap.free(a).unwrap();
    heap.free(b).unwrap();
    heap.trim();
    assert_eq!(heap.stats(), fresh);
}

#[test]
fn slabs_disabled_routes_everything_to_tlsf() {
    let mut heap = Heap::new(HeapConfig {
        max_slab_size: 0,
        ..HeapConfig::default()
    })
    .unwrap();
    heap.add_chunk(1 << 16).unwrap();
    let a = heap.alloc(1, 1).unwrap();
    assert_eq!(a.size(), 16);
    assert!(heap.stats().slab_classes.is_empty());
    heap.free(a).unwrap();
    heap.check_consistency().unwrap();
}

/// A heap made by `empty_like` from a heap in use starts as `Heap::new` would make it (no pages,
/// no counts: every class reset), hands out the same offsets as a new heap for the same requests,
/// and is a heap of its own (its allocations are foreign to the heap it was made from).
#[test]
fn a_heap_made_like_a_used_one_starts_new_and_is_its_own() {
    let mut used = heap_with(&[1 << 20]);
    let kept: Vec<Allocation> = [24, 200, 200, 4000, 70_000]
        .iter()
        .map(|&s| used.alloc(s, 16).unwrap())
        .collect();
    let mut like = used.empty_like();
    let mut new = Heap::new(HeapConfig::default()).unwrap();
    assert_eq!(like.stats(), new.stats());
    like.add_chunk(1 << 20).unwrap();
    new.add_chunk(1 << 20).unwrap();
    for (size, align) in [
        (24, 16),
        (200, 64),
        (200, 16),
        (4000, 4096),
        (70_000, 16),
        (17, 8),
    ] {
        let (a, b) = (
            like.alloc(size, align).unwrap(),
            new.alloc(size, align).unwrap(),
        );
        assert_eq!(
            (a.chunk(), a.offset(), a.size()),
            (b.chunk(), b.offset(), b.size())
        );
        like.free(a).unwrap();
        new.free(b).unwrap();
    }
    let theirs = like.alloc(64, 16).unwrap();
    assert_eq!(used.free(theirs), Err(AllocError::ForeignAllocation));
    for a in kept {
        used.free(a).unwrap();
    }
    used.check_consistency().unwrap();
    like.check_consistency().unwrap();
}
