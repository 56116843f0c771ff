//! Property tests of `DirtyRanges` against the byte-bitmap model of `models/dirty.rs` (shared
//! with the `dirty_ranges` fuzz target), which states the guarantees checked after every step.

#[path = "models/dirty.rs"]
mod model;

use model::{check, Harness, Model, Op};
use proptest::prelude::*;
use vkgdr::dirty::DirtyRanges;

fn run_ops(size: u64, atom: u64, cap: usize, ops: Vec<Op>) {
    let mut h = Harness::new(size, atom, cap).unwrap();
    for op in ops {
        h.step(op);
    }
    h.finish();
}

/// Mostly in-bounds ranges, sometimes slightly or wildly out of bounds.
fn range(size: u64) -> impl Strategy<Value = (u64, u64)> {
    prop_oneof![
        8 => (0..=size).prop_flat_map(move |o| (Just(o), 0..=(size - o).min(200))),
        2 => (0..=size).prop_flat_map(move |o| (Just(o), 0..=size - o)),
        1 => (0..size + 3, 0..size + 3),
        1 => (any::<u64>(), any::<u64>()),
        1 => (Just(u64::MAX - 2), 0..5u64),
    ]
}

fn op(size: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => range(size).prop_map(|(o, l)| Op::Mark(o, l)),
        4 => range(size).prop_map(|(o, l)| Op::Remove(o, l)),
        3 => range(size).prop_map(|(o, l)| Op::Intersects(o, l)),
        1 => Just(Op::Clear),
        1 => Just(Op::Take),
        1 => Just(Op::MarkAll),
    ]
}

fn setup() -> impl Strategy<Value = (u64, u64)> {
    (1..=1500u64, 0..=9u32).prop_map(|(size, shift)| (size, 1u64 << shift))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn uncapped_matches_closure_model(
        (size, atom, ops) in setup().prop_flat_map(|(size, atom)| {
            (Just(size), Just(atom), prop::collection::vec(op(size), 0..60))
        })
    ) {
        run_ops(size, atom, usize::MAX, ops);
    }

    #[test]
    fn capped_matches_smallest_gap_model(
        (size, atom, cap, ops) in setup().prop_flat_map(|(size, atom)| {
            (Just(size), Just(atom), 1..=6usize, prop::collection::vec(op(size), 0..60))
        })
    ) {
        run_ops(size, atom, cap, ops);
    }

    #[test]
    fn default_cap_with_many_small_marks(
        (size, atom, marks) in (512..=4096u64, 0..=6u32).prop_flat_map(|(size, shift)| {
            let marks = prop::collection::vec(
                (0..size).prop_flat_map(move |o| (Just(o), 1..=(size - o).min(8))),
                0..200,
            );
            (Just(size), Just(1u64 << shift), marks)
        })
    ) {
        let mut d = DirtyRanges::new(size, atom).unwrap();
        let mut m = Model::new(size, atom, vkgdr::dirty::DEFAULT_MAX_RANGES);
        for (o, l) in marks {
            d.mark(o, l).unwrap();
            m.mark(o, l);
        }
        check(&d, &m);
    }
}
