//! [`RingCore`]: the ring's positions, sequence numbers and space, and the shared producer path
//! — any number of threads reserve records through `&self` and commit them in any order
//! ([`Reservation`]); commits combine into one publication.

use std::time::Duration;

use super::error::RingError;
use super::layout::{
    self, RecordHeader, WrapMode, HEADER_LEN, KIND_DATA, KIND_PAD, MAX_PAYLOAD, RECORD_ALIGN,
};
use super::sink::check_capacity;
use super::sink::RingSink;
use super::staged::{stage_buf, stage_record};
use super::wait::Deadline;
use crate::core::sync::atomic::{AtomicU64, Ordering};
use crate::core::sync::{thread_id, Backoff, CachePadded, Mutex};

/// What a waiting producer calls to learn the consumer's head: `Ok(head)` (an acquire load of
/// the word the consumer publishes), or `Err` ([`RingError::Stopped`]) once the consumer is gone,
/// which ends the wait with that error.
pub type HeadFn<'a> = dyn Fn() -> Result<u64, RingError> + Send + Sync + 'a;

/// One commit slot: the end of the record whose seq maps here once it is committed, and the
/// thread that holds it while it is open (0 when none).
#[derive(Debug)]
struct Slot {
    done: AtomicU64,
    owner: AtomicU64,
}

impl Slot {
    fn new() -> Self {
        Slot {
            done: AtomicU64::new(0),
            owner: AtomicU64::new(0),
        }
    }
}

/// The producer side of a ring: hands out record space to any number of threads, numbers the
/// records, and publishes them to the consumer in position order.
///
/// Positions only grow. Invariants: `reclaimed <= committed <= reserved` and `reserved - reclaimed
/// <= capacity`, so a write never lands on bytes the consumer has not released. Reservation takes a
/// short mutex (position and seq move together, so seq order is position order). Commit never
/// waits: it marks its record done, and whoever holds the publisher role publishes every record
/// that is done and has no unfinished record before it, with one [`RingSink::publish`] for all of
/// them (commit combining). A [`Producer`](super::Producer) holds the publisher role and the
/// reservation rights for its whole life instead.
#[derive(Debug)]
pub struct RingCore<S> {
    pub(super) capacity: u64,
    pub(super) max_record: u32,
    pub(super) sink: S,
    /// Whether a record that reaches the end of the region is preceded by a wrap PAD or runs on.
    pub(super) wrap: WrapMode,
    /// The next sequence number; the lock also serialises every change of `reserved` and of
    /// `claimed` (except a claimed ring's own `reserved`, which only its producer moves).
    pub(super) next_seq: Mutex<u64>,
    /// End of the last reservation.
    pub(super) reserved: CachePadded<AtomicU64>,
    /// End of the last committed record; set just before it is published.
    pub(super) committed: CachePadded<AtomicU64>,
    /// End of the last record whose `publish` returned.
    pub(super) published: CachePadded<AtomicU64>,
    /// Sequence number of the first record not yet published (changed only by the publisher).
    pub(super) published_seq: CachePadded<AtomicU64>,
    /// The publisher role and its requests: 0 when no one publishes. A committer that raises it
    /// from 0 is the publisher and publishes until it can lower it back to 0 unchanged (every
    /// other committer's increment makes it look again); a [`Producer`] or a lone wrap PAD holds
    /// it at 1. All changes are read-modify-writes of this one word, so acquire/release is enough
    /// to make no commit go unpublished (loom checks this: `tests/loom_ring.rs`).
    pub(super) publishing: CachePadded<AtomicU64>,
    /// The thread that claimed the ring for a [`Producer`] (0: not claimed).
    pub(super) claimed: AtomicU64,
    /// `slots[seq % COMMIT_SLOTS].done` holds the end of record `seq` once it is committed; a
    /// value at or below `published` is stale (an earlier lap of the slots).
    slots: Box<[CachePadded<Slot>]>,
    /// Position the consumer has released.
    pub(super) reclaimed: CachePadded<AtomicU64>,
}

/// Reservations that may be open (reserved, not yet published) at once. A reservation beyond
/// them waits (or fails with `Full`), so a commit never waits for a slot. Small under loom so the
/// model reaches the slot wrap-around.
#[cfg(not(feature = "loom"))]
pub const COMMIT_SLOTS: u64 = 256;
/// Reservations that may be open (reserved, not yet published) at once.
#[cfg(feature = "loom")]
pub const COMMIT_SLOTS: u64 = 2;

impl<S: RingSink> RingCore<S> {
    /// An empty ring of `capacity` bytes (a power of two of at least
    /// [`MIN_CAPACITY`](layout::MIN_CAPACITY), equal to the sink's) writing through `sink`.
    /// Positions start at 0.
    pub fn new(capacity: u64, sink: S) -> Result<Self, RingError> {
        Self::with_wrap_mode(capacity, sink, WrapMode::Padded)
    }

    /// Like [`new`](Self::new), choosing how records meet the end of the region. In
    /// [`WrapMode::Mirrored`] no wrap PAD is ever written: a record may run past the end and
    /// continue at offset 0, which only a consumer that sees the region mirrored (or splits its
    /// reads, [`layout::read_wrapped`]) can read.
    ///
    /// ```
    /// use vkgdr::ring::core::{HostSink, RingCore};
    /// use vkgdr::ring::layout::{seal_test_payload, verify_records_in, WrapMode};
    ///
    /// let ring = RingCore::with_wrap_mode(4096, HostSink::new(4096)?, WrapMode::Mirrored)?;
    /// let mut tail = 0;
    /// for _ in 0..3 {
    ///     let mut payload = vec![1u8; 1500];
    ///     let mut r = ring.try_reserve(1500)?;
    ///     assert_eq!(r.pos(), tail, "no padding, ever");
    ///     seal_test_payload(&mut payload, r.seq());
    ///     r.write(0, &payload)?; // the third record runs past byte 4096 and continues at 0
    ///     tail = r.commit();
    ///     ring.reclaim_to(tail - 1520)?;
    /// }
    /// let report = verify_records_in(ring.sink(), 1520, tail, 1, WrapMode::Mirrored);
    /// assert_eq!((report.records, report.errors), (2, 0));
    /// # Ok::<(), vkgdr::ring::core::RingError>(())
    /// ```
    pub fn with_wrap_mode(capacity: u64, sink: S, wrap: WrapMode) -> Result<Self, RingError> {
        check_capacity(capacity)?;
        if sink.capacity() != capacity {
            return Err(RingError::CapacityMismatch {
                ring: capacity,
                sink: sink.capacity(),
            });
        }
        let max_record = u32::try_from(capacity - HEADER_LEN).unwrap_or(MAX_PAYLOAD);
        Ok(Self {
            capacity,
            max_record: max_record.min(MAX_PAYLOAD),
            sink,
            wrap,
            next_seq: Mutex::new(0),
            reserved: CachePadded(AtomicU64::new(0)),
            committed: CachePadded(AtomicU64::new(0)),
            published: CachePadded(AtomicU64::new(0)),
            published_seq: CachePadded(AtomicU64::new(0)),
            publishing: CachePadded(AtomicU64::new(0)),
            claimed: AtomicU64::new(0),
            slots: (0..COMMIT_SLOTS)
                .map(|_| CachePadded(Slot::new()))
                .collect(),
            reclaimed: CachePadded(AtomicU64::new(0)),
        })
    }

    /// Size of the data region in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// How records meet the end of the region.
    pub fn wrap_mode(&self) -> WrapMode {
        self.wrap
    }

    /// Writes `bytes` at region offset `offset` (below the capacity) through the sink, in two
    /// pieces when the span runs past the end (only a mirrored ring's records do).
    ///
    /// The caller owns the span: it lies inside a reservation (or a claimed ring's next record)
    /// that no one else writes, and `reserved - reclaimed <= capacity` keeps it off unconsumed
    /// bytes.
    pub(super) fn write_owned(&self, offset: u64, bytes: &[u8]) {
        let first = (self.capacity - offset).min(bytes.len() as u64) as usize;
        let (head, rest) = bytes.split_at(first);
        // SAFETY: `offset < capacity` and `head` ends at the capacity at the latest; the span is
        // the caller's alone and released by the consumer (see above).
        #[allow(unsafe_code)]
        unsafe {
            self.sink.write(offset, head)
        };
        if !rest.is_empty() {
            // SAFETY: as above; `rest` is shorter than the capacity (a record is at most the
            // capacity) and continues the same owned span at offset 0.
            #[allow(unsafe_code)]
            unsafe {
                self.sink.write(0, rest)
            };
        }
    }

    /// [`write_owned`](Self::write_owned) into the sink's staging copy (see
    /// [`RingSink::stage`]), under the same ownership of the span.
    pub(super) fn stage_owned(&self, offset: u64, bytes: &[u8]) {
        let first = (self.capacity - offset).min(bytes.len() as u64) as usize;
        let (head, rest) = bytes.split_at(first);
        // SAFETY: as in `write_owned`: an in-range span the caller owns, split at the end.
        #[allow(unsafe_code)]
        unsafe {
            self.sink.stage(offset, head)
        };
        if !rest.is_empty() {
            // SAFETY: as in `write_owned`.
            #[allow(unsafe_code)]
            unsafe {
                self.sink.stage(0, rest)
            };
        }
    }

    /// Publishes `tail` after the sink has moved the staged bytes of `[from, tail)` into place.
    /// As [`publish_owned`](Self::publish_owned), and every byte of `[from, tail)` was staged.
    pub(super) fn publish_staged_owned(&self, from: u64, tail: u64) {
        // SAFETY: as in `publish_owned`; the caller (the claiming producer) staged every byte of
        // `[from, tail)`, which lies within the unconsumed span (`tail - from <= capacity`).
        #[allow(unsafe_code)]
        unsafe {
            self.sink.publish_staged(from, tail)
        };
    }

    /// Publishes `tail` (with `next_seq`, the number of the first record after it) through the
    /// sink. Callers hold the publisher role (so calls are serialised and `tail` grows) and every
    /// record below `tail` is finished and fenced.
    pub(super) fn publish_owned(&self, tail: u64, next_seq: u64) {
        // SAFETY: the caller holds the publisher role (one publication at a time, strictly
        // increasing tails, never past `reserved`, which stays within the capacity of the
        // consumer's head); the records below `tail` were finished and handed over as the
        // callers document.
        #[allow(unsafe_code)]
        unsafe {
            self.sink.publish_seq(tail, next_seq)
        };
    }

    /// Largest payload: `capacity - 16` (a record filling the whole region), at most
    /// [`MAX_PAYLOAD`].
    pub fn max_record(&self) -> u32 {
        self.max_record
    }

    /// The sink the ring writes through.
    pub fn sink(&self) -> &S {
        &self.sink
    }

    /// End of the last committed record (what the consumer may read up to, once published).
    pub fn committed(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }

    /// End of the last record whose publication (fence, flush, `tail` store) has completed: what
    /// a consumer launched now may read up to.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Acquire)
    }

    /// Position up to which the consumer has released space.
    pub fn reclaimed(&self) -> u64 {
        self.reclaimed.load(Ordering::Acquire)
    }

    /// End of the last reservation.
    pub fn reserved(&self) -> u64 {
        self.reserved.load(Ordering::Acquire)
    }

    /// Whether a [`Producer`](super::Producer) owns the ring now.
    pub fn is_claimed(&self) -> bool {
        self.claimed.load(Ordering::Acquire) != 0
    }

    /// Bytes neither reserved nor waiting for the consumer. A record may need more than its size
    /// when it has to skip the rest of the region.
    pub fn free_space(&self) -> u64 {
        // Read `reclaimed` first: it can only grow towards `reserved`, never past it.
        let reclaimed = self.reclaimed();
        let used = self.reserved().saturating_sub(reclaimed);
        self.capacity.saturating_sub(used)
    }

    pub(super) fn check_len(&self, len: u32) -> Result<(), RingError> {
        if len == 0 {
            Err(RingError::ZeroLength)
        } else if len > self.max_record {
            Err(RingError::RecordTooLarge {
                len,
                max: self.max_record,
            })
        } else {
            Ok(())
        }
    }

    pub(super) fn check_payload(&self, payload: &[u8]) -> Result<u32, RingError> {
        let len = u32::try_from(payload.len()).map_err(|_| RingError::RecordTooLarge {
            len: u32::MAX,
            max: self.max_record,
        })?;
        self.check_len(len)?;
        Ok(len)
    }

    /// Reserves space for a record with a `len`-byte payload and gives it the next sequence
    /// number, or fails without waiting: [`RingError::Full`] when the space (or every commit
    /// slot) is taken, [`RingError::Claimed`] while a [`Producer`](super::Producer) owns the ring.
    ///
    /// In [`WrapMode::Padded`] a record that does not fit before the end of the region starts
    /// at offset 0 of the next lap behind a wrap PAD record. When the consumer must read that PAD
    /// before the record's space frees up (the record is longer than the bytes before the PAD)
    /// and every earlier reservation is already published, this call writes and publishes the PAD
    /// on its own and still returns `Full`; a retry then finds the record at offset 0. In
    /// [`WrapMode::Mirrored`] the record simply follows the previous one.
    pub fn try_reserve(&self, len: u32) -> Result<Reservation<'_, S>, RingError> {
        self.check_len(len)?;
        let size = layout::record_size(len);
        let mut next_seq = self.next_seq.lock();
        if self.claimed.load(Ordering::Acquire) != 0 {
            return Err(RingError::Claimed);
        }
        let seq = *next_seq;
        // The slot of `seq` must not hold an unpublished record, so a commit never waits for it.
        if seq >= self.published_seq.load(Ordering::Acquire) + COMMIT_SLOTS {
            return Err(RingError::Full);
        }
        let start = self.reserved.load(Ordering::Relaxed);
        let reclaimed = self.reclaimed.load(Ordering::Acquire);
        let offset = start & (self.capacity - 1);
        let pad = if self.wrap == WrapMode::Padded && offset + size > self.capacity {
            Some(self.capacity - offset)
        } else {
            None
        };
        let pos = start + pad.unwrap_or(0);
        let end = pos + size;
        if end - reclaimed > self.capacity {
            if let Some(pad_bytes) = pad {
                self.publish_lone_pad(start, offset, pad_bytes, reclaimed);
            }
            return Err(RingError::Full);
        }
        *next_seq += 1;
        let slot = &self.slots[(seq % COMMIT_SLOTS) as usize];
        slot.owner.store(thread_id(), Ordering::Relaxed);
        self.reserved.store(end, Ordering::Release);
        drop(next_seq);
        Ok(Reservation {
            core: self,
            start,
            pos,
            end,
            len,
            seq,
            pad: pad.map(|b| (b - HEADER_LEN) as u32),
            done: false,
        })
    }

    /// Nothing before `start` is in flight and no one else can reserve (the caller holds the
    /// reservation lock): publishes the wrap PAD `[start, start + pad_bytes)` alone so the
    /// consumer can step over it and free the space the next record needs. It takes the
    /// publisher role (a publisher may still be finishing; the caller then simply retries).
    fn publish_lone_pad(&self, start: u64, offset: u64, pad_bytes: u64, reclaimed: u64) {
        let pos = start + pad_bytes;
        if self.published.load(Ordering::Acquire) == start
            && pos - reclaimed <= self.capacity
            && self
                .publishing
                .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            if self.published.load(Ordering::Acquire) == start {
                // The PAD's bytes lie in `[reserved, reserved + pad)`, free and unreserved, and
                // the lock keeps every other writer off them.
                self.write_owned(offset, &RecordHeader::wrap_pad(pad_bytes).to_bytes());
                self.sink.writes_done();
                self.committed.store(pos, Ordering::Release);
                // A wrap PAD takes no sequence number: every record before it is published.
                self.publish_owned(pos, self.published_seq.load(Ordering::Acquire));
                self.published.store(pos, Ordering::Release);
                self.reserved.store(pos, Ordering::Release);
            }
            // No commit can be waiting: every reservation is published and the lock is held.
            self.publishing.store(0, Ordering::Release);
        }
    }

    /// Like [`try_reserve`](Self::try_reserve), but while the ring is full (or claimed) it calls
    /// `head` (which returns the consumer's published head, e.g. an acquire load of pinned host
    /// memory), passes it to [`reclaim_to`](Self::reclaim_to) and retries, spinning briefly and
    /// then yielding, until `timeout` (`None`: no limit) runs out.
    ///
    /// `head` is called only when the first attempt finds no room, and then always once more
    /// before the call gives up: with a zero timeout this is a [`try_reserve`](Self::try_reserve)
    /// that also takes whatever the consumer has freed since the ring last heard of it. The clock
    /// is read only once a wait begins (never for a zero timeout); the timeout counts from then.
    ///
    /// A wait that only the calling thread could end fails (after that one look at the head)
    /// with [`RingError::WouldDeadlock`]: this thread holds an open reservation of this ring
    /// (made by this thread; the consumer cannot pass it, so no space frees beyond it) or owns
    /// its [`Producer`](super::Producer). An `Err` from `head` (a stopped consumer) ends the wait
    /// with that error.
    pub fn reserve(
        &self,
        len: u32,
        timeout: Option<Duration>,
        head: &HeadFn<'_>,
    ) -> Result<Reservation<'_, S>, RingError> {
        let mut deadline = Deadline::new(timeout);
        let mut backoff = Backoff::new();
        let mut retry = false;
        loop {
            if retry {
                // The consumer's head before every retry, the last one before giving up
                // included: a zero (or spent) timeout still gets the space freed since the ring
                // last heard.
                self.reclaim_to(head()?)?;
            }
            match self.try_reserve(len) {
                Err(RingError::Full | RingError::Claimed) => {}
                other => return other,
            }
            if retry {
                if self.held_by_current_thread() {
                    return Err(RingError::WouldDeadlock);
                }
                if deadline.passed() {
                    return Err(RingError::Timeout);
                }
                backoff.snooze();
            }
            retry = true;
        }
    }

    /// Whether the calling thread owns the ring's [`Producer`] or holds one of its open shared
    /// reservations (slow path of a wait: scans at most [`COMMIT_SLOTS`] slots).
    fn held_by_current_thread(&self) -> bool {
        let me = thread_id();
        if self.claimed.load(Ordering::Acquire) == me {
            return true;
        }
        let next = *self.next_seq.lock();
        let first = self.published_seq.load(Ordering::Acquire);
        (first..next).any(|seq| {
            let slot = &self.slots[(seq % COMMIT_SLOTS) as usize];
            slot.owner.load(Ordering::Relaxed) == me
        })
    }

    /// Reserves, writes `payload` and commits: one whole record, which reaches the sink in one
    /// write with its header when it is short. Returns its sequence number. Arguments as for
    /// [`reserve`](Self::reserve).
    pub fn push(
        &self,
        payload: &[u8],
        timeout: Option<Duration>,
        head: &HeadFn<'_>,
    ) -> Result<u64, RingError> {
        let len = self.check_payload(payload)?;
        let mut r = self.reserve(len, timeout, head)?;
        Ok(r.finish(KIND_DATA, payload))
    }

    /// Records that the consumer has finished with everything below `head`. Older values than
    /// the current one are ignored (heads only grow); a head that is misaligned or beyond the
    /// committed position is rejected.
    pub fn reclaim_to(&self, head: u64) -> Result<(), RingError> {
        if !head.is_multiple_of(RECORD_ALIGN) {
            return Err(RingError::MisalignedHead(head));
        }
        let committed = self.committed();
        if head > committed {
            return Err(RingError::HeadBeyondCommitted { head, committed });
        }
        // AcqRel: the consumer's release of `head` reaches the producers that load `reclaimed`.
        self.reclaimed.fetch_max(head, Ordering::AcqRel);
        Ok(())
    }

    /// Marks record `seq` (ending at `end`) as committed, then publishes every record that is
    /// ready unless another thread holds the publisher role (it then publishes this one too).
    /// Never waits: `try_reserve` handed out `seq` only once its slot was free.
    fn commit_record(&self, seq: u64, end: u64) {
        let slot = &self.slots[(seq % COMMIT_SLOTS) as usize];
        slot.owner.store(0, Ordering::Relaxed);
        slot.done.store(end, Ordering::Release);
        // Release: the publisher that sees this request sees the slot (and the record's bytes).
        if self.publishing.fetch_add(1, Ordering::AcqRel) == 0 {
            self.publish_done();
        }
    }

    /// As the publisher: publishes the longest run of committed records from `published` with one
    /// `publish`, again and again until no request arrived during a pass.
    fn publish_done(&self) {
        loop {
            let requests = self.publishing.load(Ordering::Acquire);
            let from = self.published.load(Ordering::Acquire);
            let mut pos = from;
            let mut seq = self.published_seq.load(Ordering::Acquire);
            loop {
                let end = self.slots[(seq % COMMIT_SLOTS) as usize]
                    .done
                    .load(Ordering::Acquire);
                if end <= pos {
                    break; // not committed yet (a stale slot holds an end at or below `pos`)
                }
                pos = end;
                seq += 1;
            }
            if pos != from {
                // `committed` first: a consumer head can never be seen beyond it.
                self.committed.store(pos, Ordering::Release);
                // Every record in [from, pos) was committed (its writer fenced it, then marked
                // its slot, which the loads above acquired) and the role is held.
                self.publish_owned(pos, seq);
                self.published.store(pos, Ordering::Release);
                self.published_seq.store(seq, Ordering::Release);
            }
            // Unchanged since the pass began: every commit so far was seen. Otherwise a committer
            // raised it after marking its slot (and left the publishing to us): look again.
            if self
                .publishing
                .compare_exchange(requests, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return;
            }
        }
    }
}

/// Space for one record, from [`RingCore::try_reserve`] or [`RingCore::reserve`].
///
/// Write the payload with [`write`](Self::write), then [`commit`](Self::commit). Dropping it
/// uncommitted (also while unwinding) commits a PAD record of the same size that keeps the
/// sequence number, so later records are not blocked and seqs stay gapless; consumers skip it.
/// Reservations may be committed in any order, also several held by one thread; a record is
/// published once every earlier one is committed. At most [`COMMIT_SLOTS`] reservations are
/// open at once; a reservation counts as held by the thread that made it (see
/// [`RingCore::reserve`]).
#[must_use = "dropping a reservation turns it into a PAD record"]
#[derive(Debug)]
pub struct Reservation<'a, S: RingSink> {
    core: &'a RingCore<S>,
    /// Where the reservation starts: the wrap PAD if there is one, else the record.
    start: u64,
    pos: u64,
    end: u64,
    len: u32,
    seq: u64,
    /// Payload length of the wrap PAD at `start`.
    pad: Option<u32>,
    done: bool,
}

impl<S: RingSink> Reservation<'_, S> {
    /// Position of the record's header.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// Offset of the record's header in the data region.
    pub fn offset(&self) -> u64 {
        self.pos & (self.core.capacity - 1)
    }

    /// Offset of the payload in the data region, for writers that store it themselves. In a
    /// [`WrapMode::Mirrored`] ring the payload may run past the end of the region (this offset
    /// may even equal the capacity): its bytes from the end onwards belong at offset 0, as
    /// [`write`](Self::write) does.
    pub fn payload_offset(&self) -> u64 {
        self.offset() + HEADER_LEN
    }

    /// Payload length.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Always false: empty records are refused.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The record's sequence number.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Position just past the record: the tail once it is committed.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// The header [`commit`](Self::commit) writes at [`offset`](Self::offset).
    pub fn header_bytes(&self) -> [u8; 16] {
        RecordHeader::data(self.len, self.seq).to_bytes()
    }

    /// The wrap PAD this reservation starts with, as (offset, header bytes); `commit` writes it.
    pub fn pad_header(&self) -> Option<(u64, [u8; 16])> {
        self.pad.map(|len| {
            let header = RecordHeader {
                len,
                kind: KIND_PAD,
                seq: layout::WRAP_PAD_SEQ,
            };
            (self.start & (self.core.capacity - 1), header.to_bytes())
        })
    }

    /// Writes `bytes` at payload offset `at` through the ring's sink.
    pub fn write(&mut self, at: u32, bytes: &[u8]) -> Result<(), RingError> {
        check_write(at, bytes, self.len)?;
        if !bytes.is_empty() {
            let offset = (self.payload_offset() + u64::from(at)) & (self.core.capacity - 1);
            // Inside this reservation's payload, which only this (exclusively borrowed)
            // reservation writes.
            self.core.write_owned(offset, bytes);
        }
        Ok(())
    }

    /// Writes the headers and commits the record. It is published (with every committed record
    /// before it) as soon as no earlier reservation is still open: by this call, or by the
    /// committer of the last of those records. Never waits. Returns this record's end: the tail
    /// once it is published.
    pub fn commit(mut self) -> u64 {
        self.finish(KIND_DATA, &[]);
        self.end
    }

    /// Writes the wrap PAD's header (if any) and this record's header of `kind` with `payload`
    /// after it (all of the payload, or none: already written), then commits the record.
    /// Returns its seq.
    fn finish(&mut self, kind: u32, payload: &[u8]) -> u64 {
        debug_assert!(payload.is_empty() || payload.len() == self.len as usize);
        self.done = true;
        let core = self.core;
        if let Some((offset, header)) = self.pad_header() {
            core.write_owned(offset, &header);
        }
        let header = RecordHeader {
            len: self.len,
            kind,
            seq: self.seq,
        }
        .to_bytes();
        let mut buf = stage_buf();
        if payload.is_empty() {
            core.write_owned(self.offset(), &header);
        } else if let Some(record) = stage_record(&mut buf, &header, payload) {
            core.write_owned(self.offset(), record);
        } else {
            core.write_owned(self.offset(), &header);
            core.write_owned(self.payload_offset() & (core.capacity - 1), payload);
        }
        core.sink.writes_done();
        core.commit_record(self.seq, self.end);
        self.seq
    }
}

impl<S: RingSink> Drop for Reservation<'_, S> {
    fn drop(&mut self) {
        if !self.done {
            self.finish(KIND_PAD, &[]);
        }
    }
}

/// Checks a write of `bytes` at payload offset `at` of a `len`-byte payload.
pub(super) fn check_write(at: u32, bytes: &[u8], len: u32) -> Result<(), RingError> {
    let (at, n) = (u64::from(at), bytes.len() as u64);
    if n > u64::from(len) || at > u64::from(len) - n {
        return Err(RingError::OutOfRange {
            at,
            len: n,
            record_len: len,
        });
    }
    Ok(())
}
