//! Property test: random action sequences against the allocator model of `models/alloc.rs` (shared
//! with the `alloc_core` fuzz target), which states what is checked after every step and at the
//! end.

#[path = "models/alloc.rs"]
mod model;

use model::{configs, Action, Model};
use proptest::prelude::*;
use vkgdr::alloc::{AllocError, HeapConfig, MAX_CHUNK_SIZE};

fn size_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1..=256u64,
        4 => 257..=4096u64,
        2 => 4097..=100_000u64,
        1 => 100_001..=(3u64 << 20),
    ]
}

/// A request that must be refused: 0 = zero size, 1 = bad alignment, 2 = oversize.
fn invalid_request(kind: u8, value: u64) -> (u64, u64) {
    match kind {
        0 => (0, 1 << (value % 8)),
        // Never a power of two: 0 or a sum of two distinct bits.
        1 => (
            1 + value % 5000,
            if value.is_multiple_of(7) {
                0
            } else {
                3 << (value % 20)
            },
        ),
        _ => (MAX_CHUNK_SIZE + 1 + value % (1 << 40), 16),
    }
}

fn action_strategy() -> impl Strategy<Value = Action> {
    prop_oneof![
        8 => (size_strategy(), 0..=17u32)
            .prop_map(|(size, log)| Action::Alloc { size, align: 1 << log, grow: false }),
        3 => (size_strategy(), 0..=16u32)
            .prop_map(|(size, log)| Action::Alloc { size, align: 1 << log, grow: true }),
        1 => (0..3u8, any::<u64>()).prop_map(|(kind, value)| {
            let (size, align) = invalid_request(kind, value);
            Action::Alloc { size, align, grow: false }
        }),
        7 => any::<usize>().prop_map(Action::Free),
        1 => prop_oneof![
            (1..=32u64).prop_map(|k| k << 16),
            (0..=70_000u64).prop_map(|k| k * 8),
        ]
        .prop_map(Action::AddChunk),
        1 => any::<usize>().prop_map(Action::RemoveChunk),
        1 => Just(Action::Trim),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn heap_matches_model(
        config in prop::sample::select(configs()),
        initial in prop::collection::vec((1..=16u64).prop_map(|k| k << 18), 0..3),
        actions in prop::collection::vec(action_strategy(), 1..300),
    ) {
        let mut m = Model::new(config);
        for size in initial {
            m.add_chunk(size).unwrap();
        }
        m.check();
        for action in actions {
            m.step(action);
        }
        m.finish();
    }
}

/// Fill a heap with one small class until it runs out, free in a scattered order, and check the
/// chunk becomes whole again (slab pages released, coalescing complete).
#[test]
fn scattered_frees_restore_whole_chunk() {
    let mut m = Model::new(HeapConfig::default());
    m.add_chunk(1 << 20).unwrap();
    loop {
        match m.heap.alloc(48, 16) {
            Ok(a) => m.accept(a, 48, 16),
            Err(AllocError::OutOfSpace { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    // 16 pages of 1365 objects fill the chunk exactly.
    assert_eq!(m.live.len(), 16 * ((64 << 10) / 48));
    let mut i = 0;
    while !m.live.is_empty() {
        i = (i + 7919) % m.live.len();
        m.free(i);
    }
    m.check();
    m.finish();
}
