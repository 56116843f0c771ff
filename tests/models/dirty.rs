//! The dirty-range tracker's model, shared by the property tests (`tests/dirty_model.rs`) and the
//! fuzz target (`fuzz/fuzz_targets/dirty_ranges.rs`), each of which includes this file with
//! `#[path]` and drives it with its own input generator. Plain `std` and `vkgdr` only.
//!
//! The model keeps three bitmaps over the allocation:
//! - `marked`: bytes marked and not removed since the last clear (what must be flushed);
//! - `ever`: bytes marked since the last clear, removes ignored (bounds what may be flushed);
//! - `covered`: the exact coverage the documented policy prescribes: marks add their
//!   atom-rounded closure, removes clear whole atoms, and while there are more runs than the
//!   cap the smallest gap (leftmost on a tie) is filled.
// Each includer uses part of it.
#![allow(dead_code)]

use vkgdr::dirty::{DirtyError, DirtyRanges};

/// One operation on the tracker; ranges may be out of bounds or overflow (they must be refused
/// and change nothing).
#[derive(Debug, Clone)]
pub enum Op {
    Mark(u64, u64),
    Remove(u64, u64),
    Intersects(u64, u64),
    Clear,
    Take,
    MarkAll,
}

pub struct Model {
    size: u64,
    atom: u64,
    cap: usize,
    marked: Vec<bool>,
    ever: Vec<bool>,
    covered: Vec<bool>,
}

impl Model {
    pub fn new(size: u64, atom: u64, cap: usize) -> Self {
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
            self.covered[runs[k].1 as usize..runs[k + 1].0 as usize].fill(true);
        }
    }

    /// Marks an in-bounds range.
    pub fn mark(&mut self, offset: u64, len: u64) {
        self.marked[offset as usize..(offset + len) as usize].fill(true);
        self.ever[offset as usize..(offset + len) as usize].fill(true);
        // Closure: every atom holding a marked byte, the last clamped to the allocation.
        let mut a = offset / self.atom * self.atom;
        while len > 0 && a < offset + len {
            let atom_end = (a + self.atom).min(self.size);
            self.covered[a as usize..atom_end as usize].fill(true);
            a += self.atom;
        }
        self.apply_cap();
    }

    /// Removes an in-bounds range: clears only atoms that lie entirely inside it.
    pub fn remove(&mut self, offset: u64, len: u64) {
        let mut a = 0;
        while a < self.size {
            let atom_end = (a + self.atom).min(self.size);
            if a >= offset && atom_end <= offset + len {
                self.marked[a as usize..atom_end as usize].fill(false);
                self.covered[a as usize..atom_end as usize].fill(false);
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
pub fn check(d: &DirtyRanges, m: &Model) {
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
        tracker_cover[off as usize..end as usize].fill(true);
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

fn assert_error(r: Result<(), DirtyError>, offset: u64, len: u64, size: u64) {
    match offset.checked_add(len) {
        None => assert_eq!(r, Err(DirtyError::Overflow { offset, len })),
        Some(_) => assert_eq!(r, Err(DirtyError::OutOfBounds { offset, len, size })),
    }
}

/// A tracker and its model, driven by [`Op`]s.
pub struct Harness {
    pub tracker: DirtyRanges,
    pub model: Model,
    out: Vec<(u64, u64)>,
}

impl Harness {
    /// A tracker of `size` bytes, `atom` granularity and at most `cap` ranges, with its model;
    /// the tracker's own error where it refuses the parameters.
    pub fn new(size: u64, atom: u64, cap: usize) -> Result<Self, DirtyError> {
        Ok(Harness {
            tracker: DirtyRanges::with_max_ranges(size, atom, cap)?,
            model: Model::new(size, atom, cap),
            out: Vec::new(),
        })
    }

    /// Applies `op` to both, checks its outcome, then every guarantee.
    pub fn step(&mut self, op: Op) {
        let (d, m) = (&mut self.tracker, &mut self.model);
        let size = m.size;
        let before = d.clone();
        match op {
            Op::Mark(o, l) | Op::Remove(o, l) => {
                let is_mark = matches!(op, Op::Mark(..));
                let r = if is_mark {
                    d.mark(o, l)
                } else {
                    d.remove(o, l)
                };
                if m.in_bounds(o, l) {
                    r.unwrap();
                    if is_mark {
                        m.mark(o, l);
                    } else {
                        m.remove(o, l);
                    }
                } else {
                    assert_error(r, o, l, size);
                    assert_eq!(*d, before);
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
                // take_into appends: what was in the vector stays in front.
                self.out.clear();
                self.out.push((u64::MAX, 0));
                d.take_into(&mut self.out);
                let expect: Vec<_> = std::iter::once((u64::MAX, 0))
                    .chain(before.ranges())
                    .collect();
                assert_eq!(self.out, expect);
                m.clear();
            }
            Op::MarkAll => {
                d.mark_all();
                m.mark_all();
            }
        }
        check(d, m);
    }

    /// Removes everything: the tracker must be back to its initial state.
    pub fn finish(mut self) {
        let size = self.model.size;
        self.tracker.remove(0, size).unwrap();
        self.model.remove(0, size);
        check(&self.tracker, &self.model);
        assert!(self.tracker.is_empty());
        self.tracker.clear();
        let fresh = DirtyRanges::with_max_ranges(size, self.model.atom, self.model.cap).unwrap();
        assert_eq!(self.tracker, fresh);
    }
}
