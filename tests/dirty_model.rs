//! Property tests of `DirtyRanges` against a byte-bitmap model.
//!
//! The model keeps three bitmaps over the allocation:
//! - `marked`: bytes marked and not removed since the last clear (what must be flushed);
//! - `ever`: bytes marked since the last clear, removes ignored (bounds what may be flushed);
//! - `covered`: the exact coverage the documented policy prescribes: marks add their
//!   atom-rounded closure, removes clear whole atoms, and while there are more runs than the
//!   cap the smallest gap (leftmost on a tie) is filled.

use proptest::prelude::*;
use vkgdr::dirty::{DirtyError, DirtyRanges};

#[derive(Debug, Clone)]
enum Op {
    Mark(u64, u64),
    Remove(u64, u64),
    Intersects(u64, u64),
    Clear,
    Take,
    MarkAll,
}

struct Model {
    size: u64,
    atom: u64,
    cap: usize,
    marked: Vec<bool>,
    ever: Vec<bool>,
    covered: Vec<bool>,
}

impl Model {
    fn new(size: u64, atom: u64, cap: usize) -> Self {
        let n = size as usize;
        Self {
            size,
            atom,
            cap,
            marked: vec![false; n],
            ever: vec![false; n],
            covered: vec![false; n],
        }
    }

    fn in_bounds(&self, offset: u64, len: u64) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.size)
    }

    /// Runs of `covered` as half-open pairs.
    fn runs(&self) -> Vec<(u64, u64)> {
        bitmap_runs(&self.covered)
    }

    fn apply_cap(&mut self) {
        loop {
            let runs = self.runs();
            if runs.len() <= self.cap {
                return;
            }
            let (k, _) = runs
                .windows(2)
                .enumerate()
                .min_by_key(|&(k, w)| (w[1].0 - w[0].1, k))
                .unwrap();
            for b in runs[k].1..runs[k + 1].0 {
                self.covered[b as usize] = true;
            }
        }
    }

    fn mark(&mut self, offset: u64, len: u64) {
        for b in offset..offset + len {
            self.marked[b as usize] = true;
            self.ever[b as usize] = true;
        }
        // Closure: every atom holding a marked byte, the last clamped to the allocation.
        let mut a = offset / self.atom * self.atom;
        while len > 0 && a < offset + len {
            let atom_end = (a + self.atom).min(self.size);
            self.covered[a as usize..atom_end as usize].fill(true);
            a += self.atom;
        }
        self.apply_cap();
    }

    fn remove(&mut self, offset: u64, len: u64) {
        // Clear only atoms that lie entirely inside the range.
        let mut a = 0;
        while a < self.size {
            let atom_end = (a + self.atom).min(self.size);
            if a >= offset && atom_end <= offset + len {
                for c in a..atom_end {
                    self.marked[c as usize] = false;
                    self.covered[c as usize] = false;
                }
            }
            a += self.atom;
        }
        self.apply_cap();
    }

    fn clear(&mut self) {
        self.marked.fill(false);
        self.ever.fill(false);
        self.covered.fill(false);
    }

    fn mark_all(&mut self) {
        self.marked.fill(true);
        self.ever.fill(true);
        self.covered.fill(true);
    }
}

fn bitmap_runs(bits: &[bool]) -> Vec<(u64, u64)> {
    let mut runs = Vec::new();
    let mut start = None;
    for (i, &b) in bits.iter().chain(std::iter::once(&false)).enumerate() {
        match (b, start) {
            (true, None) => start = Some(i as u64),
            (false, Some(s)) => {
                runs.push((s, i as u64));
                start = None;
            }
            _ => {}
        }
    }
    runs
}

/// Checks every documented guarantee of the tracker against the model.
fn check(d: &DirtyRanges, m: &Model) {
    let got: Vec<(u64, u64)> = d.ranges().collect();
    assert_eq!(d.len(), got.len());
    assert_eq!(d.is_empty(), got.is_empty());
    assert!(d.len() <= m.cap);

    // Shape: aligned starts, ends aligned or at size, sorted, disjoint, non-adjacent.
    let mut prev_end: Option<u64> = None;
    let mut bytes = 0;
    let mut tracker_cover = vec![false; m.size as usize];
    for &(off, len) in &got {
        let end = off + len;
        assert!(len > 0, "empty range in {d:?}");
        assert_eq!(off % m.atom, 0, "unaligned start in {d:?}");
        assert!(end % m.atom == 0 || end == m.size, "bad end in {d:?}");
        assert!(end <= m.size, "range past the end in {d:?}");
        if let Some(p) = prev_end {
            assert!(off > p, "overlapping or adjacent ranges in {d:?}");
        }
        prev_end = Some(end);
        bytes += len;
        for b in off..end {
            tracker_cover[b as usize] = true;
        }
    }
    assert_eq!(d.pending_bytes(), bytes);

    // Every byte that must be flushed is covered.
    for (b, &is_marked) in m.marked.iter().enumerate() {
        assert!(
            !is_marked || tracker_cover[b],
            "marked byte {b} not covered by {d:?}"
        );
    }

    // Exact policy.
    assert_eq!(
        got,
        m.runs()
            .iter()
            .map(|&(s, e)| (s, e - s))
            .collect::<Vec<_>>()
    );

    // Looser guarantee that holds with any cap: nothing outside the atom-rounded hull of the
    // bytes marked since the last clear.
    let ever_runs = bitmap_runs(&m.ever);
    if let (Some(first), Some(last)) = (ever_runs.first(), ever_runs.last()) {
        let lo = first.0 / m.atom * m.atom;
        let hi = last.1.next_multiple_of(m.atom).min(m.size);
        for &(off, len) in &got {
            assert!(off >= lo && off + len <= hi, "range outside hull in {d:?}");
        }
    } else {
        assert!(got.is_empty());
    }

    // Without merges forced by the cap, nothing outside the closure of the marked bytes.
    if m.cap == usize::MAX {
        let atom = m.atom as usize;
        for (marked, cover) in m.marked.chunks(atom).zip(tracker_cover.chunks(atom)) {
            let in_closure = marked.contains(&true);
            assert!(
                cover.iter().all(|&c| c == in_closure),
                "coverage differs from the closure in {d:?}"
            );
        }
    }
}

fn run_ops(size: u64, atom: u64, cap: usize, ops: Vec<Op>) {
    let mut d = DirtyRanges::with_max_ranges(size, atom, cap).unwrap();
    let mut m = Model::new(size, atom, cap);
    let mut out = Vec::new();
    for op in ops {
        let before = d.clone();
        match op {
            Op::Mark(o, l) => {
                let r = d.mark(o, l);
                if m.in_bounds(o, l) {
                    r.unwrap();
                    m.mark(o, l);
                } else {
                    assert_error(r, o, l, size);
                    assert_eq!(d, before);
                }
            }
            Op::Remove(o, l) => {
                let r = d.remove(o, l);
                if m.in_bounds(o, l) {
                    r.unwrap();
                    m.remove(o, l);
                } else {
                    assert_error(r, o, l, size);
                    assert_eq!(d, before);
                }
            }
            Op::Intersects(o, l) => {
                let end = o.saturating_add(l).min(size);
                let expect = (o..end).any(|b| m.covered[b as usize]);
                assert_eq!(d.intersects(o, l), expect, "intersects({o}, {l}) on {d:?}");
            }
            Op::Clear => {
                d.clear();
                m.clear();
            }
            Op::Take => {
                out.clear();
                out.push((u64::MAX, 0));
                d.take_into(&mut out);
                let expect: Vec<_> = std::iter::once((u64::MAX, 0))
                    .chain(before.ranges())
                    .collect();
                assert_eq!(out, expect);
                m.clear();
            }
            Op::MarkAll => {
                d.mark_all();
                m.mark_all();
            }
        }
        check(&d, &m);
    }
    // Freeing everything returns to the initial state.
    d.remove(0, size).unwrap();
    m.remove(0, size);
    check(&d, &m);
    assert!(d.is_empty());
    d.clear();
    assert_eq!(d, DirtyRanges::with_max_ranges(size, atom, cap).unwrap());
}

fn assert_error(r: Result<(), DirtyError>, offset: u64, len: u64, size: u64) {
    match offset.checked_add(len) {
        None => assert_eq!(r, Err(DirtyError::Overflow { offset, len })),
        Some(_) => assert_eq!(r, Err(DirtyError::OutOfBounds { offset, len, size })),
    }
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
