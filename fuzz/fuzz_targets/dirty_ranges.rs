//! Fuzzes `DirtyRanges` against a byte-bitmap model of the documented policy.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use vkgdr::dirty::{DirtyError, DirtyRanges};

#[derive(Arbitrary, Debug)]
enum Action {
    Mark {
        offset: u16,
        len: u16,
    },
    Remove {
        offset: u16,
        len: u16,
    },
    /// Offsets and lengths anywhere in u64, to hit overflow and out-of-bounds paths.
    MarkWild {
        offset: u64,
        len: u64,
    },
    RemoveWild {
        offset: u64,
        len: u64,
    },
    Intersects {
        offset: u16,
        len: u16,
    },
    Clear,
    Take,
    MarkAll,
}

#[derive(Arbitrary, Debug)]
struct Input {
    size: u16,
    atom_shift: u8,
    /// 0 means no cap.
    cap: u8,
    actions: Vec<Action>,
}

/// `marked`: bytes that must be flushed. `covered`: exact expected coverage (atom closure of
/// marks, whole atoms cleared by removes, smallest gap filled while over the cap).
struct Model {
    size: u64,
    atom: u64,
    cap: usize,
    marked: Vec<bool>,
    covered: Vec<bool>,
}

impl Model {
    fn runs(&self) -> Vec<(u64, u64)> {
        let mut runs = Vec::new();
        let mut start = None;
        for (i, &b) in self
            .covered
            .iter()
            .chain(std::iter::once(&false))
            .enumerate()
        {
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

    fn mark(&mut self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        self.marked[offset as usize..(offset + len) as usize].fill(true);
        let mut a = offset / self.atom * self.atom;
        while a < offset + len {
            let atom_end = (a + self.atom).min(self.size);
            self.covered[a as usize..atom_end as usize].fill(true);
            a += self.atom;
        }
        self.apply_cap();
    }

    fn remove(&mut self, offset: u64, len: u64) {
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
        self.covered.fill(false);
    }
}

fn check(d: &DirtyRanges, m: &Model) {
    let got: Vec<(u64, u64)> = d.ranges().collect();
    let expect: Vec<(u64, u64)> = m.runs().iter().map(|&(s, e)| (s, e - s)).collect();
    assert_eq!(got, expect, "{d:?}");
    assert!(d.len() <= m.cap);
    assert_eq!(d.len(), got.len());
    assert_eq!(d.is_empty(), got.is_empty());
    assert_eq!(d.pending_bytes(), got.iter().map(|r| r.1).sum::<u64>());
    let mut prev_end = None;
    for &(off, len) in &got {
        let end = off + len;
        assert!(len > 0 && end <= m.size);
        assert_eq!(off % m.atom, 0);
        assert!(end % m.atom == 0 || end == m.size);
        if let Some(p) = prev_end {
            assert!(off > p);
        }
        prev_end = Some(end);
        for b in off..end {
            assert!(m.covered[b as usize]);
        }
    }
    for (b, &is_marked) in m.marked.iter().enumerate() {
        assert!(!is_marked || m.covered[b], "marked byte {b} not covered");
    }
}

fn in_bounds(size: u64, offset: u64, len: u64) -> bool {
    offset.checked_add(len).is_some_and(|end| end <= size)
}

fn expect_error(r: Result<(), DirtyError>, offset: u64, len: u64, size: u64) {
    let expect = match offset.checked_add(len) {
        None => DirtyError::Overflow { offset, len },
        Some(_) => DirtyError::OutOfBounds { offset, len, size },
    };
    assert_eq!(r, Err(expect));
}

fuzz_target!(|input: Input| {
    let size = u64::from(input.size % 4096) + 1;
    let atom = 1u64 << (input.atom_shift % 11);
    let cap = if input.cap == 0 {
        usize::MAX
    } else {
        usize::from(input.cap % 16)
    };
    let mut d = match DirtyRanges::with_max_ranges(size, atom, cap) {
        Ok(d) => d,
        Err(e) => {
            assert_eq!(cap, 0);
            assert_eq!(e, DirtyError::ZeroMaxRanges);
            return;
        }
    };
    let mut m = Model {
        size,
        atom,
        cap,
        marked: vec![false; size as usize],
        covered: vec![false; size as usize],
    };
    let mut out = Vec::new();
    for action in input.actions.iter().take(256) {
        let before = d.clone();
        match *action {
            Action::Mark { offset, len } | Action::Remove { offset, len } => {
                let (o, l) = (u64::from(offset), u64::from(len));
                let is_mark = matches!(action, Action::Mark { .. });
                let r = if is_mark {
                    d.mark(o, l)
                } else {
                    d.remove(o, l)
                };
                if in_bounds(size, o, l) {
                    r.unwrap();
                    if is_mark {
                        m.mark(o, l);
                    } else {
                        m.remove(o, l);
                    }
                } else {
                    expect_error(r, o, l, size);
                    assert_eq!(d, before);
                }
            }
            Action::MarkWild { offset, len } | Action::RemoveWild { offset, len } => {
                let r = if matches!(action, Action::MarkWild { .. }) {
                    d.mark(offset, len)
                } else {
                    d.remove(offset, len)
                };
                if in_bounds(size, offset, len) {
                    // Only tiny or empty ranges can land here; replay them on the model.
                    r.unwrap();
                    if matches!(action, Action::MarkWild { .. }) {
                        m.mark(offset, len);
                    } else {
                        m.remove(offset, len);
                    }
                } else {
                    expect_error(r, offset, len, size);
                    assert_eq!(d, before);
                }
            }
            Action::Intersects { offset, len } => {
                let (o, l) = (u64::from(offset), u64::from(len));
                let end = (o + l).min(size);
                let expect = (o..end).any(|b| m.covered[b as usize]);
                assert_eq!(d.intersects(o, l), expect);
            }
            Action::Clear => {
                d.clear();
                m.clear();
            }
            Action::Take => {
                out.clear();
                d.take_into(&mut out);
                assert_eq!(out, before.ranges().collect::<Vec<_>>());
                m.clear();
            }
            Action::MarkAll => {
                d.mark_all();
                m.marked.fill(true);
                m.covered.fill(true);
            }
        }
        check(&d, &m);
    }
    // Free everything: back to the initial state.
    d.remove(0, size).unwrap();
    m.remove(0, size);
    check(&d, &m);
    assert!(d.is_empty());
    assert_eq!(d, DirtyRanges::with_max_ranges(size, atom, cap).unwrap());
});
