//! Device → host rings, the pure core: kernels publish fixed-size records into host memory,
//! CPU threads take them in order; and the release tokens that let a kernel give a pool block
//! back. The GPU side is `include/vkgdr/ring_d2h.cuh`; [`ProducerModel`] is the same protocol
//! in Rust, so proptest, loom (`tests/loom_d2h.rs`) and Miri check what the kernels run.
//!
//! # A lane in memory
//!
//! A ring has one or more **lanes**; records of one lane are delivered in one order, lanes are
//! independent. A lane is `slots` slots (a power of two) of `stride` bytes (a power of two,
//! [`LaneShape`]), in host memory that the CPU reads from its own RAM and the device writes over
//! PCIe (pinned and mapped into the device's address space):
//!
//! | word | bytes | written by | |
//! |:--|:--|:--|:--|
//! | commit | 0..8 | device, last | `seq + 1` once record `seq` is complete; 0: never written |
//! | meta | 8..16 | device | payload length (low 32 bits), kind (high 32 bits) |
//! | payload | 16..stride | device | up to `stride - 16` bytes |
//!
//! Record `seq` (the lane's reservation count) goes to slot `seq % slots`. The commit word
//! carries the whole `seq`, so a slot's previous lap (`seq + 1 - slots`) and its current one
//! are told apart and wrap needs no padding and no lap bit.
//!
//! That is the [`Committed`](SlotFormat::Committed) format, the default. A ring may instead
//! take the [`Tagged`](SlotFormat::Tagged) format, for records that must arrive soonest: every
//! 8-byte word carries four bytes (low half) and the record's tag `(seq + 1) as u32` (high
//! half), so each word proves its own arrival and the device needs no fence before the record
//! counts, at half the payload per slot:
//!
//! | word | data (low 32 bits) | tag (high 32 bits) |
//! |:--|:--|:--|
//! | 0 | payload length | `(seq + 1) as u32` |
//! | 1 | kind | `(seq + 1) as u32` |
//! | 2.. | payload bytes `4 (i - 2)..4 (i - 1)`, little-endian, zero-padded | `(seq + 1) as u32` |
//!
//! Per lane, three words steer the flow:
//!
//! | word | lives in | written by | read by |
//! |:--|:--|:--|:--|
//! | `head` | a control block ([`CONTROL_STRIDE`] per lane) | CPU consumer: records taken | device, when the lane looks full |
//! | `closed` | the control block, beside `head` | CPU: the consumer is gone | device, when the lane looks full |
//! | `reserve` | device memory ([`DEVICE_STRIDE`] per lane, with `head_cache` and `gave_up`) | device producers | device producers |
//!
//! The core sees the control blocks only through [`LaneMemory`], so where they live is the ring
//! layer's choice: host memory (the device pays a PCIe read only when the lane looks full), or
//! GPU memory the CPU stores to through the BAR, as the host → device rings keep their `tail`
//! (the device's look costs no PCIe read). Pinned memory that CUDA maps through VMM may keep serving the GPU a word the CPU
//! has rewritten (seen with copies: [`PinnedBuffer`](crate::cuda_objects::PinnedBuffer)), so
//! `head` must come from memory the GPU reads afresh each time.
//!
//! # Memory ordering
//!
//! **Producer (device, [`ProducerModel`]).** Any number of warps of any number of blocks
//! publish into one lane. A warp **reserves** `n` slots with one compare-and-swap of
//! `reserve`, taken only if `reserve + n <= head + slots`, where `head` is `head_cache`, a copy
//! in device memory of the highest consumer head any producer read: the consumer's `head` (a
//! PCIe read of about a microsecond if it lives in host memory) is read only when the lane looks
//! full. It then **writes**
//! each record's meta word and payload (a record may be written by a whole warp, 16-byte stores
//! each; a warp whose threads publish a record each writes their slots of up to 128 bytes
//! together, whole 16-byte pieces of consecutive slots per store, the header piece carrying the
//! commit word's present value, which the consumer cannot tell from no store), runs a release
//! fence at system scope (`fence.acq_rel.sys`, or a lone writer's `st.release.sys` commit) in
//! every writing thread, and after the warp's barrier **commits**: one aligned 8-byte store of
//! `seq + 1` (a single PCIe write, never torn). PCIe keeps one requester's posted writes in
//! order, and the fence orders them inside the GPU, so the payload is in host memory before the
//! commit word is.
//!
//! **Back-pressure.** When the lane looks full the producer reads `closed` (set: give up with
//! [`STATUS_CLOSED`]) and the consumer's `head` (moved: raise `head_cache`, try again), and after
//! `spin_limit` looks at a `head` that did not move, gives up with [`STATUS_STALLED`] and counts
//! it in `gave_up`. A refusal reserves nothing: the reservation is a compare-and-swap taken
//! only when there is room, never an add to be undone, so no slot is ever owed. Between a
//! reservation and its commit a producer never waits, so the consumer waits only for producers
//! that are running, and a producer waits only for the consumer, boundedly: no deadlock,
//! whichever side stops. (The cost: one compare-and-swap per warp, retried under contention;
//! spread the warps over lanes.)
//!
//! In a tagged lane a producer reserves the same way, then stores every word of its records
//! (each an aligned 8-byte store, which PCIe delivers whole) and is done: no fence, no commit,
//! so a lone record reaches the CPU a PCIe round trip sooner (the fence waits for the
//! payload's stores to be acknowledged from host memory before the commit may leave).
//!
//! **Consumer (CPU, [`LaneConsumer`]).** One thread per lane. For record `seq` it loads the
//! slot's commit word with `Acquire`: `seq + 1` means complete, the previous lap's value (or 0)
//! means not yet, anything else is a device that wrote past the head or wrote garbage
//! ([`D2hError::BadCommit`]). It then copies the meta word and payload out (a length beyond the
//! slot: [`D2hError::BadLength`]), `fence(Acquire)`, and re-loads the commit word: a change means
//! the slot was overwritten while read ([`D2hError::Torn`]; only a device that ignores `head`
//! does it). In a tagged lane it takes the record once every word it needs carries the
//! record's tag: the two header words hold exactly the previous lap's tag until then (anything
//! else is [`D2hError::BadCommit`]), and a payload word without the tag is not there yet.
//! Nothing is delivered unchecked, and an error is final for the lane. After the copy
//! the consumer stores `head` (`Release`: its reads of the slot come before any overwrite by a
//! device that read that `head`). Dropping it (or [`LaneConsumer::close`]) stores `closed`.
//!
//! # Release tokens
//!
//! `Block::release_on_device` puts the block into a [`ReleaseTokens`] table and hands the kernel
//! a [`ReleaseToken`]: 64 bits of table tag (16), entry (20) and generation (28). The kernel's
//! `vkgdr_release_token` publishes it (a warp's tokens together, one [`KIND_RELEASE`] record of
//! `u64`s) into the pool's device → host ring; whoever drains that ring (the pool's slow path or
//! its release thread) [`redeem`](ReleaseTokens::redeem)s each token and frees the block it gives
//! back. A token of another table or never issued is [`TokenError::Forged`], one of an earlier
//! issue of its entry (or of a block the host took back) is [`TokenError::Stale`], one redeemed
//! already is [`TokenError::Repeated`]: each is counted ([`TokenStats`]) and frees nothing, so a
//! buggy kernel can neither free a block twice nor free another's. A block is freed only when its
//! token arrives, so it is never reused before its kernel is done with it.
//!
//! ```
//! use vkgdr::ring::core::d2h::{
//!     tokens_in, DeviceLaneState, HostLane, LaneConsumer, LaneShape, ProducerModel,
//!     ReleaseTokens, KIND_RELEASE,
//! };
//!
//! let mut table = ReleaseTokens::new();
//! let token = table.issue("block").unwrap().to_bits();
//!
//! // The kernel's side, modelled: a release record with the token.
//! let shape = LaneShape::new(8, 64)?;
//! let lane = HostLane::new(shape);
//! let device = DeviceLaneState::new();
//! ProducerModel::new(&lane, &device, shape, 100)
//!     .publish(KIND_RELEASE, &token.to_le_bytes())
//!     .unwrap();
//!
//! // The pool's drain.
//! let mut consumer = LaneConsumer::new(&lane, shape)?;
//! let mut freed = Vec::new();
//! consumer.drain(64, |rec| {
//!     assert_eq!(rec.kind, KIND_RELEASE);
//!     for t in tokens_in(rec.payload).unwrap() {
//!         freed.extend(table.redeem(t).ok());
//!     }
//! })?;
//! assert_eq!(freed, ["block"]);
//! # Ok::<(), vkgdr::ring::core::d2h::D2hError>(())
//! ```

mod check;
mod consumer;
mod layout;
mod producer;
mod tokens;

pub use check::{test_payload, test_word, TestLaneChecker, TestRecordError};
pub use consumer::{HostLane, LaneConsumer, LaneMemory, Poll, Record, RecordBuf, Records};
pub use layout::{
    meta_word, tag_of, tagged_word, D2hDeviceView, D2hError, LaneShape, Refusal, SlotFormat,
    COMMIT_WORD, CONTROL_CLOSED_OFFSET, CONTROL_HEAD_OFFSET, CONTROL_STRIDE, DEVICE_STRIDE,
    FORMAT_COMMITTED, FORMAT_TAGGED, KIND_RELEASE, KIND_RESERVED, MAX_SLOTS, MAX_STRIDE, META_WORD,
    MIN_SLOTS, MIN_STRIDE, SLOT_HEADER_LEN, STATUS_CLOSED, STATUS_OK, STATUS_STALLED,
    STATUS_TOO_LARGE, TAGGED_BYTES_PER_WORD,
};
pub use producer::{DeviceLaneState, ProducerModel};
pub use tokens::{
    tokens_in, ReleaseToken, ReleaseTokens, TableFull, TokenError, TokenStats, ENTRY_BITS,
    GENERATION_BITS, MAX_ENTRIES, MAX_GENERATION, TAG_BITS,
};

#[cfg(all(test, not(feature = "loom")))]
mod tests;
