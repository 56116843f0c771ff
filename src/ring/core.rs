//! The pure multi-producer ring core: positions, sequence numbers, space accounting and in-order
//! publication. It touches memory only through a [`RingSink`], so it runs the same over GPU
//! memory mapped through the BAR and over plain host memory ([`HostSink`]).
//!
//! ```
//! use vkgdr::ring::core::{HostSink, RingCore};
//! use vkgdr::ring::layout::{seal_test_payload, verify_records};
//!
//! let ring = RingCore::new(4096, HostSink::new(4096)?)?;
//! let mut payload = vec![7u8; 40];
//! let mut r = ring.try_reserve(payload.len() as u32)?;
//! seal_test_payload(&mut payload, r.seq());
//! r.write(0, &payload)?;
//! let tail = r.commit(); // written, fenced and published to the consumer
//! assert_eq!(ring.sink().tail(), tail);
//!
//! // The consumer walks [head, tail) and reports its new head.
//! let report = verify_records(ring.sink(), 0, tail, 0);
//! assert_eq!((report.records, report.errors), (1, 0));
//! ring.reclaim_to(report.pos)?;
//! assert_eq!(ring.free_space(), 4096);
//! # Ok::<(), vkgdr::ring::core::RingError>(())
//! ```
#![forbid(unsafe_code)]

use std::hint::spin_loop;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::layout::{
    self, RecordHeader, RingSource, WrapMode, HEADER_LEN, KIND_DATA, KIND_PAD, MAX_PAYLOAD,
    MIN_CAPACITY, RECORD_ALIGN,
};

/// Spins of a waiting loop before it starts yielding the CPU.
const SPINS_BEFORE_YIELD: u32 = 64;

/// Keeps a hot atomic on its own cache line (128 bytes: adjacent-line prefetch pairs lines).
#[derive(Debug, Default)]
#[repr(align(128))]
struct CachePadded<T>(T);

impl<T> Deref for CachePadded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Errors of the ring core. Every error leaves the ring unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RingError {
    /// The capacity is not a power of two of at least [`MIN_CAPACITY`] bytes.
    #[error("ring capacity {0} is not a power of two >= {MIN_CAPACITY}")]
    InvalidCapacity(u64),
    /// A record with an empty payload was requested.
    #[error("zero-length record")]
    ZeroLength,
    /// The payload is larger than [`RingCore::max_record`].
    #[error("record payload of {len} bytes exceeds the maximum of {max}")]
    RecordTooLarge {
        /// Requested payload bytes.
        len: u32,
        /// Largest payload this ring takes.
        max: u32,
    },
    /// Not enough unconsumed space right now.
    #[error("ring is full")]
    Full,
    /// [`RingCore::reserve`] waited its whole timeout without getting space.
    #[error("timed out waiting for ring space")]
    Timeout,
    /// A write would go outside the reservation's payload.
    #[error("write of {len} bytes at {at} exceeds the {record_len}-byte payload")]
    OutOfRange {
        /// Payload offset of the write.
        at: u64,
        /// Bytes written.
        len: u64,
        /// The reservation's payload length.
        record_len: u32,
    },
    /// The consumer reported a head beyond anything committed.
    #[error("consumer head {head} is beyond the committed position {committed}")]
    HeadBeyondCommitted {
        /// The reported head.
        head: u64,
        /// The committed position when it was checked.
        committed: u64,
    },
    /// The consumer reported a head that is not a record boundary.
    #[error("consumer head {0} is not 16-byte aligned")]
    MisalignedHead(u64),
}

/// Where the ring's bytes go and how the consumer learns of them. The core calls it with in-range
/// offsets only; implementations for GPU memory live with the driver layer.
pub trait RingSink {
    /// Stores `bytes` at `offset` of the data region. `offset + bytes.len() <= capacity`, never
    /// wrapping (in [`WrapMode::Mirrored`] the core splits a span that runs past the end into two
    /// calls). Called concurrently by several producers, always for disjoint ranges.
    fn write(&self, offset: u64, bytes: &[u8]);

    /// Makes this thread's earlier [`write`](Self::write)s visible to the consumer, then stores
    /// `tail`. For BAR memory: `sfence` (plus a flush if the memory is not host-coherent), a
    /// volatile 8-byte store of `tail`, `sfence`.
    ///
    /// The core calls it from whichever committing thread holds the publisher role, one call at
    /// a time, with strictly increasing `tail`, each call only after the previous one has
    /// returned; one call may publish several threads' records. Every record below `tail` was
    /// written either by this thread or by a thread that called [`writes_done`](Self::writes_done)
    /// after its writes and before handing the record over (with release/acquire ordering), so
    /// fencing this thread's own stores is enough.
    fn publish(&self, tail: u64);

    /// Called by the committing thread after its last write of a record and before the record
    /// can be published, possibly by another thread: a sink over write-combined memory must drain
    /// this thread's stores here (`sfence`). The default does nothing (enough for sinks whose
    /// writes are ordered by the core's release/acquire hand-over, like [`HostSink`]).
    fn writes_done(&self) {}
}

/// Host-memory [`RingSink`] and [`RingSource`]: a CPU-only ring for tests, models and consumers
/// without a GPU. Bytes are relaxed atomics; [`tail`](Self::tail) is a release/acquire pair, as
/// the GPU's fence-and-load pair is in the real ring.
#[derive(Debug)]
pub struct HostSink {
    data: Box<[AtomicU8]>,
    tail: CachePadded<AtomicU64>,
}

impl HostSink {
    /// A zeroed region of `capacity` bytes (a power of two of at least [`MIN_CAPACITY`]).
    pub fn new(capacity: u64) -> Result<Self, RingError> {
        check_capacity(capacity)?;
        let len = usize::try_from(capacity).map_err(|_| RingError::InvalidCapacity(capacity))?;
        Ok(Self {
            data: (0..len).map(|_| AtomicU8::new(0)).collect(),
            tail: CachePadded(AtomicU64::new(0)),
        })
    }

    /// The last published tail (acquire: the records below it are readable).
    pub fn tail(&self) -> u64 {
        self.tail.load(Ordering::Acquire)
    }
}

impl RingSink for HostSink {
    /// # Panics
    /// If the range is outside the region (the core never asks for that).
    fn write(&self, offset: u64, bytes: &[u8]) {
        let start = offset as usize;
        for (cell, &b) in self.data[start..start + bytes.len()].iter().zip(bytes) {
            cell.store(b, Ordering::Relaxed);
        }
    }

    fn publish(&self, tail: u64) {
        self.tail.store(tail, Ordering::Release);
    }
}

impl RingSource for HostSink {
    fn capacity(&self) -> u64 {
        self.data.len() as u64
    }

    /// # Panics
    /// If the range is outside the region.
    fn read(&self, offset: u64, out: &mut [u8]) {
        let start = offset as usize;
        let cells = &self.data[start..start + out.len()];
        for (b, cell) in out.iter_mut().zip(cells) {
            *b = cell.load(Ordering::Relaxed);
        }
    }
}

fn check_capacity(capacity: u64) -> Result<(), RingError> {
    if capacity.is_power_of_two() && capacity >= MIN_CAPACITY {
        Ok(())
    } else {
        Err(RingError::InvalidCapacity(capacity))
    }
}

/// Waits with a short spin, then yielding, until `done` holds.
fn wait_until(mut done: impl FnMut() -> bool) {
    let mut spins = 0u32;
    while !done() {
        if spins < SPINS_BEFORE_YIELD {
            spins += 1;
            spin_loop();
        } else {
            thread::yield_now();
        }
    }
}

/// The producer side of a ring: hands out record space to any number of threads, numbers the
/// records, and publishes them to the consumer in position order.
///
/// Positions only grow. Invariants: `reclaimed <= committed <= reserved` and
/// `reserved - reclaimed <= capacity`, so a write never lands on bytes the consumer has not
/// released. Reservation takes a short mutex (position and seq move together, so seq order is
/// position order). Commit never waits for earlier records: it marks its record done, and whoever
/// holds the publisher role publishes every record that is done and has no unfinished record
/// before it, with one [`RingSink::publish`] for all of them (commit combining).
#[derive(Debug)]
pub struct RingCore<S> {
    capacity: u64,
    max_record: u32,
    sink: S,
    /// Whether a record that reaches the end of the region is preceded by a wrap PAD or runs on.
    wrap: WrapMode,
    /// The next sequence number; the lock also serialises every change of `reserved`.
    next_seq: Mutex<u64>,
    /// End of the last reservation (changed only under `next_seq`'s lock).
    reserved: CachePadded<AtomicU64>,
    /// End of the last committed record; set just before it is published.
    committed: CachePadded<AtomicU64>,
    /// End of the last record whose `publish` returned.
    published: CachePadded<AtomicU64>,
    /// Sequence number of the first record not yet published (changed only by the publisher).
    published_seq: CachePadded<AtomicU64>,
    /// The publisher role: held by the one thread running `publish_done`.
    publishing: CachePadded<AtomicBool>,
    /// `done[seq % COMMIT_SLOTS]` holds the end of record `seq` once it is committed; a value at
    /// or below `published` is stale (an earlier lap of the slots).
    done: Box<[CachePadded<AtomicU64>]>,
    /// Position the consumer has released.
    reclaimed: CachePadded<AtomicU64>,
}

/// Committed records that may wait for an earlier, unfinished one before a committer has to wait
/// for a slot.
const COMMIT_SLOTS: u64 = 256;

impl<S: RingSink> RingCore<S> {
    /// An empty ring of `capacity` bytes (a power of two of at least [`MIN_CAPACITY`]) writing
    /// through `sink`. Positions start at 0.
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
            publishing: CachePadded(AtomicBool::new(false)),
            done: (0..COMMIT_SLOTS)
                .map(|_| CachePadded(AtomicU64::new(0)))
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
    fn write_wrapping(&self, offset: u64, bytes: &[u8]) {
        let first = (self.capacity - offset).min(bytes.len() as u64) as usize;
        let (head, rest) = bytes.split_at(first);
        self.sink.write(offset, head);
        if !rest.is_empty() {
            self.sink.write(0, rest);
        }
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

    /// Bytes neither reserved nor waiting for the consumer. A record may need more than its size
    /// when it has to skip the rest of the region.
    pub fn free_space(&self) -> u64 {
        // Read `reclaimed` first: it can only grow towards `reserved`, never past it.
        let reclaimed = self.reclaimed();
        let used = self.reserved().saturating_sub(reclaimed);
        self.capacity.saturating_sub(used)
    }

    fn check_len(&self, len: u32) -> Result<(), RingError> {
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

    /// Reserves space for a record with a `len`-byte payload and gives it the next sequence
    /// number, or fails with [`RingError::Full`] without waiting.
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
                // Nothing before `start` is in flight and no one else can reserve: publish the
                // PAD alone so the consumer can step over it and free the space the record needs.
                // It takes the publisher role (a publisher may still be finishing; then the
                // caller simply retries).
                if self.published.load(Ordering::Acquire) == start
                    && pos - reclaimed <= self.capacity
                    && !self.publishing.swap(true, Ordering::SeqCst)
                {
                    if self.published.load(Ordering::Acquire) == start {
                        self.sink
                            .write(offset, &RecordHeader::wrap_pad(pad_bytes).to_bytes());
                        self.sink.writes_done();
                        self.committed.store(pos, Ordering::Release);
                        self.sink.publish(pos);
                        self.published.store(pos, Ordering::Release);
                        self.reserved.store(pos, Ordering::Release);
                    }
                    self.publishing.store(false, Ordering::SeqCst);
                }
            }
            return Err(RingError::Full);
        }
        let seq = *next_seq;
        *next_seq += 1;
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

    /// Like [`try_reserve`](Self::try_reserve), but while the ring is full it calls `reclaim`
    /// (which returns the consumer's published head, e.g. an acquire load of pinned host memory),
    /// passes it to [`reclaim_to`](Self::reclaim_to) and retries, spinning briefly and then
    /// yielding, until `timeout` (`None`: no limit) runs out.
    ///
    /// Do not call this while the same thread holds an uncommitted reservation: that reservation
    /// may be exactly what the consumer is waiting for.
    pub fn reserve(
        &self,
        len: u32,
        timeout: Option<Duration>,
        reclaim: &dyn Fn() -> u64,
    ) -> Result<Reservation<'_, S>, RingError> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut spins = 0u32;
        loop {
            match self.try_reserve(len) {
                Err(RingError::Full) => {}
                other => return other,
            }
            // No deadline: no timeout, or one too long to represent (treated as no limit).
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(RingError::Timeout);
            }
            if spins < SPINS_BEFORE_YIELD {
                spins += 1;
                spin_loop();
            } else {
                thread::yield_now();
            }
            self.reclaim_to(reclaim())?;
        }
    }

    /// Reserves, writes `payload` and commits: one whole record. Returns its sequence number.
    /// Arguments as for [`reserve`](Self::reserve).
    pub fn push(
        &self,
        payload: &[u8],
        timeout: Option<Duration>,
        reclaim: &dyn Fn() -> u64,
    ) -> Result<u64, RingError> {
        let len = u32::try_from(payload.len()).map_err(|_| RingError::RecordTooLarge {
            len: u32::MAX,
            max: self.max_record,
        })?;
        let mut r = self.reserve(len, timeout, reclaim)?;
        r.write(0, payload)?;
        let seq = r.seq();
        r.commit();
        Ok(seq)
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
    fn commit_record(&self, seq: u64, end: u64) {
        // Its slot must not hold a record that is still unpublished (COMMIT_SLOTS earlier).
        wait_until(|| seq < self.published_seq.load(Ordering::Acquire) + COMMIT_SLOTS);
        // SeqCst with the role's swap below and the publisher's release-then-recheck: either this
        // thread gets the role, or the releasing publisher sees this slot (see `publish_done`).
        self.done[(seq % COMMIT_SLOTS) as usize].store(end, Ordering::SeqCst);
        self.publish_done();
    }

    /// Takes the publisher role if it is free and publishes the longest run of committed records
    /// from `published` with one `publish`, repeating until no committed record is left behind.
    fn publish_done(&self) {
        while !self.publishing.swap(true, Ordering::SeqCst) {
            let from = self.published.load(Ordering::Acquire);
            let mut pos = from;
            let mut seq = self.published_seq.load(Ordering::Acquire);
            loop {
                let end = self.done[(seq % COMMIT_SLOTS) as usize].load(Ordering::Acquire);
                if end <= pos {
                    break; // not committed yet (a stale slot holds an end at or below `pos`)
                }
                pos = end;
                seq += 1;
            }
            if pos != from {
                // `committed` first: a consumer head can never be seen beyond it.
                self.committed.store(pos, Ordering::Release);
                self.sink.publish(pos);
                self.published.store(pos, Ordering::Release);
                self.published_seq.store(seq, Ordering::Release);
            }
            self.publishing.store(false, Ordering::SeqCst);
            // A committer may have marked the next record after the scan above and found the role
            // taken: look once more after releasing it (both sides are SeqCst, so one of the two
            // threads sees the other).
            let next = self.published_seq.load(Ordering::SeqCst);
            let end = self.done[(next % COMMIT_SLOTS) as usize].load(Ordering::SeqCst);
            if end <= self.published.load(Ordering::SeqCst) {
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
/// published once every earlier one is committed. One exception: a commit 256 or more seqs past
/// the oldest unpublished reservation waits for that one to be committed, so a thread must not
/// commit that far ahead of a reservation it still holds open itself.
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
        let (at, n) = (u64::from(at), bytes.len() as u64);
        if n > u64::from(self.len) || at > u64::from(self.len) - n {
            return Err(RingError::OutOfRange {
                at,
                len: n,
                record_len: self.len,
            });
        }
        if n > 0 {
            let offset = (self.payload_offset() + at) & (self.core.capacity - 1);
            self.core.write_wrapping(offset, bytes);
        }
        Ok(())
    }

    /// Writes the headers and commits the record. It is published (with every committed record
    /// before it) as soon as no earlier reservation is still open: by this call, or by the
    /// committer of the last of those records. Never waits for other producers, unless its seq is
    /// 256 or more past the oldest unpublished record (then until that one is committed). Returns
    /// this record's end: the tail once it is published.
    pub fn commit(mut self) -> u64 {
        self.finish(KIND_DATA)
    }

    fn finish(&mut self, kind: u32) -> u64 {
        self.done = true;
        let core = self.core;
        if let Some((offset, header)) = self.pad_header() {
            core.sink.write(offset, &header);
        }
        let header = RecordHeader {
            len: self.len,
            kind,
            seq: self.seq,
        };
        core.sink.write(self.offset(), &header.to_bytes());
        core.sink.writes_done();
        core.commit_record(self.seq, self.end);
        self.end
    }
}

impl<S: RingSink> Drop for Reservation<'_, S> {
    fn drop(&mut self) {
        if !self.done {
            self.finish(KIND_PAD);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::layout::{next_record, verify_records, WRAP_PAD_SEQ};
    use std::cell::Cell;

    const CAP: u64 = 4096;

    fn ring() -> RingCore<HostSink> {
        RingCore::new(CAP, HostSink::new(CAP).unwrap()).unwrap()
    }

    fn header_at(ring: &RingCore<HostSink>, offset: u64) -> RecordHeader {
        let mut b = [0u8; 16];
        ring.sink().read(offset, &mut b);
        RecordHeader::from_bytes(&b)
    }

    /// Reserves and commits a record with a valid test payload; returns (pos, seq).
    fn put(ring: &RingCore<HostSink>, len: u32) -> Result<(u64, u64), RingError> {
        let mut r = ring.try_reserve(len)?;
        let mut p = vec![0x5Au8; len as usize];
        layout::seal_test_payload(&mut p, r.seq());
        r.write(0, &p)?;
        let (pos, seq) = (r.pos(), r.seq());
        r.commit();
        Ok((pos, seq))
    }

    #[test]
    fn capacity_is_validated() {
        for bad in [0, 16, 2048, 4095, 4097, 3 << 12] {
            assert_eq!(
                RingCore::new(bad, HostSink::new(CAP).unwrap()).err(),
                Some(RingError::InvalidCapacity(bad))
            );
            assert!(HostSink::new(bad).is_err());
        }
        let big = RingCore::new(1 << 40, NullSink).unwrap();
        assert_eq!(big.max_record(), MAX_PAYLOAD);
        assert_eq!(ring().max_record(), 4080);
    }

    #[derive(Debug)]
    struct NullSink;

    impl RingSink for NullSink {
        fn write(&self, _: u64, _: &[u8]) {}
        fn publish(&self, _: u64) {}
    }

    #[test]
    fn bad_lengths_are_refused_without_side_effects() {
        let r = ring();
        assert_eq!(r.try_reserve(0).err(), Some(RingError::ZeroLength));
        assert_eq!(
            r.try_reserve(4081).err(),
            Some(RingError::RecordTooLarge {
                len: 4081,
                max: 4080
            })
        );
        assert_eq!((r.reserved(), r.committed(), r.free_space()), (0, 0, CAP));
        assert_eq!(put(&r, 1).unwrap(), (0, 0));
    }

    #[test]
    fn records_are_numbered_and_published_in_order() {
        let r = ring();
        assert_eq!(put(&r, 16).unwrap(), (0, 0));
        assert_eq!(put(&r, 17).unwrap(), (32, 1));
        assert_eq!(r.committed(), 32 + 48);
        assert_eq!(r.sink().tail(), 80);
        assert_eq!(header_at(&r, 32), RecordHeader::data(17, 1));
        assert_eq!(r.free_space(), CAP - 80);
        let rep = verify_records(r.sink(), 0, 80, 0);
        assert_eq!((rep.records, rep.errors, rep.next_seq), (2, 0, 2));
    }

    #[test]
    fn full_ring_waits_for_the_consumer() {
        let r = ring();
        put(&r, 4080).unwrap();
        assert_eq!(r.free_space(), 0);
        assert_eq!(r.try_reserve(1).err(), Some(RingError::Full));
        r.reclaim_to(CAP).unwrap();
        assert_eq!(put(&r, 1).unwrap(), (CAP, 1));
    }

    #[test]
    fn wrap_pads_to_the_end_of_the_region() {
        let r = ring();
        put(&r, 4000).unwrap(); // 4016 bytes
        r.reclaim_to(4016).unwrap();
        let res = r.try_reserve(100).unwrap(); // 128 bytes do not fit in the last 80
        assert_eq!((res.pos(), res.offset(), res.seq()), (CAP, 0, 1));
        assert_eq!(
            res.pad_header(),
            Some((4016, RecordHeader::wrap_pad(80).to_bytes()))
        );
        assert_eq!(res.commit(), CAP + 128);
        assert_eq!(header_at(&r, 4016), RecordHeader::wrap_pad(80));
        assert_eq!(header_at(&r, 0), RecordHeader::data(100, 1));
    }

    #[test]
    fn lone_pad_unblocks_a_record_longer_than_the_space_before_it() {
        let r = ring();
        put(&r, 2000).unwrap(); // [0, 2016)
        r.reclaim_to(2016).unwrap();
        // 3008 bytes need the wrap PAD [2016, 4096) and [4096, 7104): more than the capacity
        // until the consumer has stepped over the PAD, which this call publishes alone.
        assert_eq!(r.try_reserve(2992).err(), Some(RingError::Full));
        assert_eq!(
            (r.reserved(), r.committed(), r.sink().tail()),
            (CAP, CAP, CAP)
        );
        assert_eq!(header_at(&r, 2016), RecordHeader::wrap_pad(2080));
        assert_eq!(r.try_reserve(2992).err(), Some(RingError::Full));
        r.reclaim_to(CAP).unwrap();
        assert_eq!(put(&r, 2992).unwrap(), (CAP, 1));
    }

    #[test]
    fn lone_pad_waits_for_earlier_commits() {
        let r = ring();
        put(&r, 2000).unwrap();
        r.reclaim_to(2016).unwrap();
        let open = r.try_reserve(16).unwrap(); // [2016, 2048), not yet committed
        assert_eq!(r.try_reserve(3000).err(), Some(RingError::Full));
        assert_eq!(r.reserved(), 2048, "no PAD while an earlier record is open");
        open.commit();
        r.reclaim_to(2048).unwrap();
        assert_eq!(r.try_reserve(3000).err(), Some(RingError::Full));
        assert_eq!(r.reserved(), CAP);
        r.reclaim_to(CAP).unwrap();
        let res = r.try_reserve(3000).unwrap();
        assert_eq!((res.pos(), res.seq()), (CAP, 2));
    }

    #[test]
    fn dropped_reservation_becomes_a_pad_keeping_its_seq() {
        let r = ring();
        let res = r.try_reserve(40).unwrap();
        drop(res);
        assert_eq!(r.sink().tail(), 64);
        assert_eq!(
            header_at(&r, 0),
            RecordHeader {
                len: 40,
                kind: KIND_PAD,
                seq: 0
            }
        );
        put(&r, 16).unwrap();
        let rep = verify_records(r.sink(), 0, r.committed(), 0);
        assert_eq!((rep.records, rep.errors, rep.next_seq), (1, 0, 2));
    }

    #[test]
    fn writes_are_bounds_checked() {
        let r = ring();
        let mut res = r.try_reserve(20).unwrap();
        assert!(res.write(0, &[1; 20]).is_ok());
        assert!(res.write(20, &[]).is_ok());
        assert_eq!(
            res.write(19, &[1, 2]),
            Err(RingError::OutOfRange {
                at: 19,
                len: 2,
                record_len: 20
            })
        );
        assert!(res.write(21, &[]).is_err());
        assert!(res.write(u32::MAX, &[1]).is_err());
        assert!(!res.is_empty());
        res.commit();
    }

    #[test]
    fn reclaim_is_validated_and_monotonic() {
        let r = ring();
        put(&r, 100).unwrap(); // 128 bytes
        assert_eq!(r.reclaim_to(8), Err(RingError::MisalignedHead(8)));
        assert_eq!(
            r.reclaim_to(144),
            Err(RingError::HeadBeyondCommitted {
                head: 144,
                committed: 128
            })
        );
        r.reclaim_to(128).unwrap();
        r.reclaim_to(0).unwrap();
        assert_eq!(r.reclaimed(), 128);
    }

    #[test]
    fn reserve_polls_the_consumer_and_times_out() {
        let r = ring();
        put(&r, 4080).unwrap();
        let polls = Cell::new(0u32);
        let stuck = || {
            polls.set(polls.get() + 1);
            0
        };
        let got = r.reserve(16, Some(Duration::from_millis(20)), &stuck);
        assert_eq!(got.err(), Some(RingError::Timeout));
        assert!(polls.get() > 0);
        // The consumer moves on after a few polls.
        let polls = Cell::new(0u32);
        let moving = || {
            polls.set(polls.get() + 1);
            if polls.get() > 3 {
                CAP
            } else {
                0
            }
        };
        let res = r.reserve(16, None, &moving).unwrap();
        assert_eq!(res.pos(), CAP);
        // A consumer reporting nonsense is an error, not a hang. (The first try published the
        // wrap PAD [CAP + 32, 2 * CAP) alone, since the record cannot fit before it.)
        drop(res);
        assert_eq!(
            r.reserve(4080, None, &|| 1 << 20).err(),
            Some(RingError::HeadBeyondCommitted {
                head: 1 << 20,
                committed: 2 * CAP
            })
        );
    }

    #[test]
    fn push_writes_a_whole_record() {
        let r = ring();
        let mut p = vec![3u8; 33];
        layout::seal_test_payload(&mut p, 0);
        assert_eq!(r.push(&p, None, &|| 0), Ok(0));
        let (h, next) = next_record(r.sink(), 0, r.committed()).unwrap();
        assert_eq!((h, next), (RecordHeader::data(33, 0), 64));
        assert_eq!(r.push(&[], None, &|| 0), Err(RingError::ZeroLength));
        assert_ne!(h.seq, WRAP_PAD_SEQ);
    }

    #[test]
    fn threads_commit_out_of_order_but_publish_in_order() {
        let r = ring();
        let first = r.try_reserve(16).unwrap();
        thread::scope(|s| {
            let later = s.spawn(|| r.try_reserve(16).unwrap().commit());
            // The later commit cannot publish before `first`.
            thread::sleep(Duration::from_millis(10));
            assert_eq!(r.sink().tail(), 0);
            assert_eq!(first.commit(), 32);
            assert_eq!(later.join().unwrap(), 64);
        });
        assert_eq!(r.sink().tail(), 64);
    }

    #[test]
    fn one_publish_covers_records_committed_out_of_order() {
        struct Counting {
            inner: HostSink,
            publishes: std::sync::Mutex<Vec<u64>>,
        }
        impl RingSink for Counting {
            fn write(&self, offset: u64, bytes: &[u8]) {
                self.inner.write(offset, bytes);
            }
            fn publish(&self, tail: u64) {
                self.publishes.lock().unwrap().push(tail);
                self.inner.publish(tail);
            }
        }
        let sink = Counting {
            inner: HostSink::new(CAP).unwrap(),
            publishes: std::sync::Mutex::new(Vec::new()),
        };
        let r = RingCore::new(CAP, sink).unwrap();
        let (a, b, c) = (
            r.try_reserve(16).unwrap(),
            r.try_reserve(16).unwrap(),
            r.try_reserve(16).unwrap(),
        );
        // One thread holding three reservations may commit them in any order.
        assert_eq!(c.commit(), 96);
        assert_eq!(b.commit(), 64);
        assert_eq!(
            (r.committed(), r.published()),
            (0, 0),
            "seq 0 is still open"
        );
        assert!(r.sink().publishes.lock().unwrap().is_empty());
        assert_eq!(a.commit(), 32);
        assert_eq!(
            *r.sink().publishes.lock().unwrap(),
            [96],
            "one publish for all three"
        );
        assert_eq!((r.committed(), r.published()), (96, 96));
        let mut pos = 0;
        for seq in 0..3 {
            let (h, next) = next_record(&r.sink().inner, pos, 96).unwrap();
            assert_eq!(h, RecordHeader::data(16, seq));
            pos = next;
        }
    }

    #[test]
    fn commits_wait_for_a_slot_behind_an_open_reservation() {
        // A region large enough that the slots, not the space, run out first.
        let r = RingCore::new(1 << 16, HostSink::new(1 << 16).unwrap()).unwrap();
        let first = r.try_reserve(16).unwrap();
        let n = COMMIT_SLOTS * 3;
        let committed = AtomicU64::new(0);
        thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..n {
                    let mut res = r.reserve(16, None, &|| r.published()).unwrap();
                    res.write(0, &[1; 16]).unwrap();
                    res.commit();
                    committed.fetch_add(1, Ordering::Relaxed);
                }
            });
            thread::sleep(Duration::from_millis(50));
            assert_eq!(r.published(), 0, "everything waits behind `first`");
            assert_eq!(
                committed.load(Ordering::Relaxed),
                COMMIT_SLOTS - 1,
                "the committer stops when the slots are full (the open record has one)"
            );
            first.commit();
        });
        assert_eq!(r.published(), 32 * (n + 1));
        let rep = layout::verify_records(r.sink(), 0, r.published(), 0);
        assert_eq!(
            (rep.records, rep.next_seq, rep.pos),
            (n + 1, n + 1, r.published())
        );
    }
}

#[cfg(test)]
mod mirrored_tests {
    use super::*;
    use crate::ring::layout::{read_wrapped, verify_records_in};

    #[test]
    fn records_run_past_the_end_without_padding() {
        let ring = RingCore::with_wrap_mode(4096, HostSink::new(4096).unwrap(), WrapMode::Mirrored)
            .unwrap();
        assert_eq!(ring.wrap_mode(), WrapMode::Mirrored);
        let mut straddled = 0;
        for seq in 0..200u64 {
            let len = 100 + (seq as u32 * 37) % 900;
            let mut r = ring.try_reserve(len).unwrap();
            assert_eq!(r.seq(), seq);
            assert_eq!(r.pos(), ring.committed(), "no padding between records");
            assert_eq!(r.pad_header(), None);
            let (pos, end) = (r.pos(), r.end());
            let mut payload: Vec<u8> = (0..len).map(|i| (seq as u32 ^ i) as u8).collect();
            layout::seal_test_payload(&mut payload, seq);
            // In two pieces, so one write may start exactly at the end of the region.
            let cut = (seq as usize * 13) % payload.len();
            r.write(0, &payload[..cut]).unwrap();
            r.write(cut as u32, &payload[cut..]).unwrap();
            r.commit();
            if (pos & 4095) + (end - pos) > 4096 {
                straddled += 1;
            }
            let mut raw = [0u8; 16];
            read_wrapped(ring.sink(), pos, &mut raw);
            let header = RecordHeader::from_bytes(&raw);
            assert_eq!((header.len, header.kind, header.seq), (len, KIND_DATA, seq));
            let mut got = vec![0u8; len as usize];
            read_wrapped(ring.sink(), pos + HEADER_LEN, &mut got);
            assert_eq!(got, payload);
            let rep = verify_records_in(ring.sink(), pos, end, seq, WrapMode::Mirrored);
            assert_eq!((rep.records, rep.errors, rep.pos), (1, 0, end));
            ring.reclaim_to(end).unwrap();
        }
        assert!(straddled > 10, "only {straddled} records crossed the end");
        // The padded reference rejects a record that crosses the end.
        let r = ring.try_reserve(4096 - 16).unwrap();
        let (pos, end) = (r.pos(), r.end());
        assert_ne!(pos & 4095, 0, "starts mid-region");
        r.commit();
        let padded = layout::verify_records(ring.sink(), pos, end, 200);
        assert_eq!(
            (padded.errors, padded.pos),
            (1, pos),
            "stops at the crossing"
        );
        let mirrored = verify_records_in(ring.sink(), pos, end, 200, WrapMode::Mirrored);
        assert_eq!((mirrored.records, mirrored.pos), (1, end));
    }
}
