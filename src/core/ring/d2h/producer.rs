//! The device producer in Rust: [`DeviceLaneState`] (the lane's words in device memory) and
//! [`ProducerModel`], step for step what `include/vkgdr/ring_d2h.cuh` does on the GPU, so that
//! proptest, loom and Miri check the protocol the kernels run. A release fence here stands for
//! the kernel's `fence.acq_rel.sys` (or its commit's `st.release.sys`), an acquire load of the
//! cached head for its `ld.acquire.gpu`.

use super::consumer::LaneMemory;
use super::layout::{
    meta_word, tagged_word, LaneShape, Refusal, SlotFormat, COMMIT_WORD, META_WORD,
    TAGGED_BYTES_PER_WORD,
};
use crate::core::sync::atomic::{fence, AtomicU64, Ordering};
use crate::core::sync::{Backoff, CachePadded};

/// A lane's state in device memory (`VKGDR_D2H_DEVICE_STRIDE` bytes per lane on the GPU),
/// zeroed at creation.
#[derive(Debug, Default)]
pub struct DeviceLaneState {
    /// Records reserved so far; a reservation moves it with a compare-and-swap, only when the
    /// lane has room for it.
    reserve: CachePadded<AtomicU64>,
    /// The highest consumer head a producer has read: producers read it
    /// instead of the consumer's `head` while it shows room.
    head_cache: AtomicU64,
    /// Publications that gave up ([`Refusal::Closed`] or [`Refusal::Stalled`]).
    gave_up: AtomicU64,
}

impl DeviceLaneState {
    /// A fresh lane's state: nothing reserved.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records reserved so far.
    pub fn reserved(&self) -> u64 {
        self.reserve.load(Ordering::Acquire)
    }

    /// Publications that gave up.
    pub fn gave_up(&self) -> u64 {
        self.gave_up.load(Ordering::Relaxed)
    }
}

/// A device producer of one lane, as the kernels run it (any number of them at once, one per
/// warp or thread on the GPU):
///
/// 1. **Reserve** `n` slots: read `reserve` and the cached head; while `reserve + n <= head +
///    slots`, compare-and-swap `reserve` forward (a failed one tries again with the value it
///    found) and own records `[r, r + n)`; full after a failed one: read both again. Otherwise
///    look at `closed` (closed: give up) and at the consumer's `head` in host memory (moved:
///    raise the cache, try again; not moved: count a spin, give up with
///    [`Stalled`](Refusal::Stalled) after `spin_limit` of them in a row). A refusal reserves
///    nothing, so no slot is ever left owed and the consumer never waits for a producer that
///    gave up: no deadlock, whichever side stops.
/// 2. **Write** each record's meta word and payload into its slot (`seq % slots`), and the
///    commit word's present value (the previous lap's commit, or 0) again, as a warp writing
///    whole slots does: the consumer must not tell it from no store.
/// 3. **Fence** (a release fence at system scope), then **commit**: store `seq + 1` into the
///    slot's commit word. A reserved record is always committed, with no wait in between.
///
/// In a [`Tagged`](SlotFormat::Tagged) lane step 2 stores every word with the record's tag
/// (length, kind, then four payload bytes a word, each word relaxed and in no particular
/// order) and step 3 is nothing: no fence, no commit word.
#[derive(Debug)]
pub struct ProducerModel<'a, M: ?Sized> {
    mem: &'a M,
    state: &'a DeviceLaneState,
    shape: LaneShape,
    spin_limit: u32,
}

impl<'a, M: LaneMemory + ?Sized> ProducerModel<'a, M> {
    /// A producer of the lane in `mem` whose device state is `state`, giving up after
    /// `spin_limit` looks at an unmoving head.
    pub fn new(mem: &'a M, state: &'a DeviceLaneState, shape: LaneShape, spin_limit: u32) -> Self {
        ProducerModel {
            mem,
            state,
            shape,
            spin_limit,
        }
    }

    /// Reserves `n` consecutive records (1 ≤ `n` ≤ slots) and returns the first one's sequence
    /// number, waiting for room as described on the type.
    ///
    /// # Panics
    /// If `n` is 0 or more than the lane's slots.
    pub fn reserve(&self, n: u32) -> Result<u64, Refusal> {
        assert!(
            n > 0 && n <= self.shape.slots(),
            "reserve 1..=slots records"
        );
        let (n, slots) = (n as u64, self.shape.slots() as u64);
        let mut spins = 0u32;
        let mut backoff = Backoff::new();
        loop {
            let mut r = self.state.reserve.load(Ordering::Relaxed);
            let head = self.state.head_cache.load(Ordering::Acquire);
            // A failed compare-and-swap is retried with the value it found, as the kernels do.
            let mut tried = false;
            while r + n <= head + slots {
                match self.state.reserve.compare_exchange(
                    r,
                    r + n,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return Ok(r),
                    Err(seen) => r = seen,
                }
                tried = true;
            }
            if tried {
                continue;
            }
            if self.mem.closed_word().load(Ordering::Acquire) != 0 {
                return Err(self.give_up(Refusal::Closed));
            }
            let host = self.mem.head_word().load(Ordering::Acquire);
            if host > head {
                // Release: a producer that reads the cache acquires the consumer's reads too.
                self.state.head_cache.fetch_max(host, Ordering::AcqRel);
                spins = 0;
                continue;
            }
            spins += 1;
            if spins > self.spin_limit {
                return Err(self.give_up(Refusal::Stalled));
            }
            backoff.snooze();
        }
    }

    /// Writes record `seq`: in a committed lane its meta word and payload (payload words
    /// relaxed, the last one zero-filled) and the commit word's present value again (relaxed),
    /// not yet visible to the consumer; in a tagged lane every word of it, tagged, the payload
    /// words last to first (the consumer must take them in any order), and the record is
    /// published.
    ///
    /// # Panics
    /// If the payload is longer than the lane's slots carry.
    pub fn write(&self, seq: u64, kind: u32, payload: &[u8]) {
        assert!(payload.len() <= self.shape.max_payload() as usize);
        let words = self.mem.slot_words();
        let first = self.shape.first_word(seq);
        match self.shape.format() {
            SlotFormat::Committed => {
                words[first + COMMIT_WORD].store(self.shape.commit_before(seq), Ordering::Relaxed);
                words[first + META_WORD]
                    .store(meta_word(payload.len() as u32, kind), Ordering::Relaxed);
                for (word, chunk) in words[first + META_WORD + 1..].iter().zip(payload.chunks(8)) {
                    let mut bytes = [0u8; 8];
                    bytes[..chunk.len()].copy_from_slice(chunk);
                    word.store(u64::from_le_bytes(bytes), Ordering::Relaxed);
                }
            }
            SlotFormat::Tagged => {
                let chunks = payload.chunks(TAGGED_BYTES_PER_WORD as usize);
                for (word, chunk) in words[first + 2..].iter().zip(chunks).rev() {
                    let mut bytes = [0u8; 4];
                    bytes[..chunk.len()].copy_from_slice(chunk);
                    word.store(
                        tagged_word(seq, u32::from_le_bytes(bytes)),
                        Ordering::Relaxed,
                    );
                }
                words[first + 1].store(tagged_word(seq, kind), Ordering::Relaxed);
                words[first].store(tagged_word(seq, payload.len() as u32), Ordering::Relaxed);
            }
        }
    }

    /// Fences this producer's writes, then commits records `[first, first + n)`; nothing in a
    /// tagged lane (its records are published by their writes).
    pub fn commit(&self, first: u64, n: u32) {
        if self.shape.format() == SlotFormat::Tagged {
            return;
        }
        fence(Ordering::Release);
        let words = self.mem.slot_words();
        for seq in first..first + n as u64 {
            words[self.shape.first_word(seq) + COMMIT_WORD]
                .store(LaneShape::commit_of(seq), Ordering::Relaxed);
        }
    }

    /// Reserves, writes and commits one record; returns its sequence number.
    pub fn publish(&self, kind: u32, payload: &[u8]) -> Result<u64, Refusal> {
        self.publish_many(&[(kind, payload)])
    }

    /// Publishes `records` (at most the lane's slots) with one reservation, as a warp does:
    /// consecutive sequence numbers, one fence. Returns the first one's sequence number.
    pub fn publish_many(&self, records: &[(u32, &[u8])]) -> Result<u64, Refusal> {
        let max = self.shape.max_payload();
        if let Some((_, p)) = records.iter().find(|(_, p)| p.len() > max as usize) {
            return Err(Refusal::TooLarge { len: p.len(), max });
        }
        let first = self.reserve(records.len() as u32)?;
        for (seq, (kind, payload)) in (first..).zip(records) {
            self.write(seq, *kind, payload);
        }
        self.commit(first, records.len() as u32);
        Ok(first)
    }

    fn give_up(&self, why: Refusal) -> Refusal {
        self.state.gave_up.fetch_add(1, Ordering::Relaxed);
        why
    }
}
