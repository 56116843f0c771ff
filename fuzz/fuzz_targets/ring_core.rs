//! Fuzzes the ring core (shared reservations committed in any order, abandoned records, `push`,
//! claimed producers with batched publication, wrap PADs, mirrored wrap, the consumer's head told
//! to the ring or only published, records staged for a copy engine, and waits with a zero timeout that must take the space the
//! consumer freed) against the model the proptest uses: `tests/ring_model/model.rs`, included
//! here so both check one set of rules. The model asserts every reservation, write, publication
//! and consumed record, and at the end that everything reached the consumer and the ring is
//! empty.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use vkgdr::ring::layout::WrapMode;

#[path = "../../tests/ring_model/model.rs"]
mod model;

#[derive(Arbitrary, Debug)]
struct Input {
    large: bool,
    mirrored: bool,
    /// 0: no staging copy; n: claimed producers stage records of at least 16 << (n % 8) bytes
    /// once 256 * (n / 8 % 8) bytes are pending before them.
    staging: u8,
    ops: Vec<model::Op>,
}

fuzz_target!(|input: Input| {
    let cap = if input.large { 8192 } else { 4096 };
    let mode = if input.mirrored {
        WrapMode::Mirrored
    } else {
        WrapMode::Padded
    };
    let mut ops = input.ops;
    ops.truncate(512);
    let staging = (input.staging != 0)
        .then(|| (16u64 << (input.staging % 8), 256 * u64::from(input.staging / 8 % 8)));
    model::run_model(cap, mode, staging, ops);
});
