//! Fuzzes `DirtyRanges` against the byte-bitmap model of `tests/models/dirty.rs` (shared with the
//! proptest model `tests/dirty_model.rs`), which states the guarantees checked after every step.
#![no_main]

#[path = "../../tests/models/dirty.rs"]
mod model;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use model::{Harness, Op};
use vkgdr::dirty::DirtyError;

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
    IntersectsWild {
        offset: u64,
        len: u64,
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

fuzz_target!(|input: Input| {
    let size = u64::from(input.size % 4096) + 1;
    let atom = 1u64 << (input.atom_shift % 11);
    let cap = if input.cap == 0 {
        usize::MAX
    } else {
        usize::from(input.cap % 16)
    };
    let mut h = match Harness::new(size, atom, cap) {
        Ok(h) => h,
        Err(e) => {
            assert_eq!(cap, 0);
            assert_eq!(e, DirtyError::ZeroMaxRanges);
            return;
        }
    };
    for action in input.actions.into_iter().take(256) {
        h.step(match action {
            Action::Mark { offset, len } => Op::Mark(offset.into(), len.into()),
            Action::Remove { offset, len } => Op::Remove(offset.into(), len.into()),
            Action::MarkWild { offset, len } => Op::Mark(offset, len),
            Action::RemoveWild { offset, len } => Op::Remove(offset, len),
            Action::Intersects { offset, len } => Op::Intersects(offset.into(), len.into()),
            Action::IntersectsWild { offset, len } => Op::Intersects(offset, len),
            Action::Clear => Op::Clear,
            Action::Take => Op::Take,
            Action::MarkAll => Op::MarkAll,
        });
    }
    h.finish();
});
