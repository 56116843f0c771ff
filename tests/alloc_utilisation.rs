//! Space utilisation under churn: after a long random churn of 64 B – 4 KiB blocks, how much of the
//! reserved memory do live blocks hold at the moments the heap reports `OutOfSpace`?
//!
//! Deterministic (seeded), so the figures are reproducible; `cargo test --test alloc_utilisation
//! -- --nocapture` prints them.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use vkgdr::alloc::{AllocError, Allocation, Heap, HeapConfig};

/// Fractions of the reserved bytes held by live blocks.
#[derive(Debug)]
struct Figures {
    /// Mean, over the churn's `OutOfSpace` events, of requested bytes / reserved bytes.
    requested_mean: f64,
    /// Lowest requested fraction seen at an event.
    requested_min: f64,
    /// Mean of usable (rounded) bytes / reserved bytes at the same events.
    usable_mean: f64,
    /// Number of `OutOfSpace` events.
    events: usize,
}

/// Fills one `heap_size` chunk with random blocks, then churns: each step frees a random live
/// block (probability 0.45) or allocates one; failed allocations are the measurement points.
fn churn(heap_size: u64, steps: usize, seed: u64) -> Figures {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut heap = Heap::new(HeapConfig::default()).unwrap();
    heap.add_chunk(heap_size).unwrap();
    let mut live: Vec<Allocation> = Vec::new();
    let (mut sum_requested, mut sum_usable, mut min_requested, mut events) = (0.0, 0.0, 1.0f64, 0);
    for _ in 0..steps {
        if rng.gen_bool(0.45) && !live.is_empty() {
            let i = rng.gen_range(0..live.len());
            heap.free(live.swap_remove(i)).unwrap();
            continue;
        }
        let size = rng.gen_range(64..=4096u64);
        let align = 1u64 << rng.gen_range(0..=6u32);
        match heap.alloc(size, align) {
            Ok(a) => {
                assert_eq!(a.offset() % align, 0);
                live.push(a);
            }
            Err(AllocError::OutOfSpace { .. }) => {
                let s = heap.stats();
                let requested = s.bytes_in_use as f64 / s.bytes_reserved as f64;
                sum_requested += requested;
                sum_usable += s.bytes_allocated as f64 / s.bytes_reserved as f64;
                min_requested = min_requested.min(requested);
                events += 1;
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
    heap.check_consistency().unwrap();
    for a in live {
        heap.free(a).unwrap();
    }
    heap.trim();
    assert_eq!(heap.stats().largest_free_block, heap_size);
    Figures {
        requested_mean: sum_requested / events as f64,
        requested_min: min_requested,
        usable_mean: sum_usable / events as f64,
        events,
    }
}

#[test]
fn live_blocks_hold_over_90_percent_of_a_full_heap() {
    let f = churn(64 << 20, 2_000_000, 0x5eed);
    println!("64 MiB heap, 64 B - 4 KiB blocks, align 1..64: {f:?}");
    assert!(f.events > 10_000, "{f:?}");
    assert!(f.requested_mean >= 0.90, "{f:?}");
    assert!(f.requested_min >= 0.88, "{f:?}");
    assert!(f.usable_mean >= 0.93, "{f:?}");
}
