//! Fuzz the allocator core against the model of `tests/models/alloc.rs` (shared with the proptest
//! model `tests/alloc_model.rs`), which states what is checked after every action and at the end
//! (everything freed, statistics of a fresh heap, whole-chunk allocations succeed).
#![no_main]

#[path = "../../tests/models/alloc.rs"]
mod model;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use model::{configs, Action, Model};

#[derive(Arbitrary, Debug)]
enum Input {
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
    /// Allocate with any size and alignment (mostly invalid: must be refused cleanly).
    AllocWild {
        size: u64,
        align: u64,
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

/// Chunks the fuzzer may register, to keep runs fast.
const MAX_CHUNKS: usize = 16;

fuzz_target!(|data: (u8, Vec<Input>)| {
    let (config, inputs) = data;
    let configs = configs();
    let mut m = Model::new(configs[usize::from(config) % configs.len()].clone());
    m.add_chunk(1 << 20).unwrap();
    m.check();
    for input in inputs.into_iter().take(256) {
        let alloc = |size: u64, align: u64, grow| Action::Alloc { size, align, grow };
        let actions: Vec<Action> = match input {
            Input::Alloc { size, align_log } => {
                vec![alloc(
                    u64::from(size % (4 << 20)),
                    1 << (align_log % 20),
                    false,
                )]
            }
            Input::AllocOrGrow { size, align_log } => {
                vec![alloc(
                    u64::from(size % (4 << 20)),
                    1 << (align_log % 20),
                    true,
                )]
            }
            Input::AllocWild { size, align } => vec![alloc(size, align, false)],
            Input::Burst { size, count } => {
                vec![alloc(u64::from(size % 4097), 16, false); usize::from(count % 64)]
            }
            Input::Free { index } => vec![Action::Free(usize::from(index))],
            Input::FreeMany { index, count } => {
                vec![Action::Free(usize::from(index)); usize::from(count % 64)]
            }
            Input::AddChunk { size_units } if m.chunks.len() < MAX_CHUNKS => {
                vec![Action::AddChunk(u64::from(size_units % 512) << 12)]
            }
            Input::AddOddChunk { size } if m.chunks.len() < MAX_CHUNKS => {
                vec![Action::AddChunk(u64::from(size % (2 << 20)))]
            }
            Input::AddChunk { .. } | Input::AddOddChunk { .. } => Vec::new(),
            Input::RemoveChunk { index } => vec![Action::RemoveChunk(usize::from(index))],
            Input::Trim => vec![Action::Trim],
        };
        for action in actions {
            m.apply(action);
        }
        m.check();
    }
    m.finish();
});
