//! The pure multi-producer ring core: positions, sequence numbers, space accounting and in-order
//! publication. It touches memory only through a [`RingSink`], so it runs the same over GPU
//! memory mapped through the BAR and over plain host memory ([`HostSink`]).
//!
//! Two ways to produce:
//! * **Shared** ([`RingCore::reserve`], [`RingCore::push`]): any number of threads reserve
//!   records through `&self` and commit them in any order; commits combine (one publication for
//!   every record that is ready). Each record pays a short mutex, its commit slot and a fence.
//! * **Exclusive** ([`RingCore::claim`] → [`Producer`]): one producer owns the ring (a lane of a
//!   [`DeviceRing`](crate::ring::DeviceRing)) and appends records with plain arithmetic, no lock
//!   and no atomic read-modify-write; a whole batch is published with one fence and one tail store
//!   ([`Producer::push_batch`], [`Producer::flush`], or a [`FlushPolicy`]).
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
//!
//! The only `unsafe` here calls the sink's two unsafe methods; each call site says which rule of
//! the protocol (an in-range span nobody else writes, a tail covering only finished records)
//! makes it sound.
#![deny(unsafe_code)]

pub mod layout;

use std::time::{Duration, Instant};

use self::layout::{
    RecordHeader, RingSource, WrapMode, HEADER_LEN, KIND_DATA, KIND_PAD, MAX_PAYLOAD, MIN_CAPACITY,
    RECORD_ALIGN,
};
use crate::core::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use crate::core::sync::{thread_id, Backoff, CachePadded, Mutex};

/// Errors of the ring core. Every error leaves the ring unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RingError {
    /// The capacity is not a power of two of at least [`MIN_CAPACITY`] bytes.
    #[error("ring capacity {0} is not a power of two >= {MIN_CAPACITY}")]
    InvalidCapacity(u64),
    /// The ring's capacity differs from the capacity of the sink it writes through.
    #[error("ring capacity {ring} differs from the sink's capacity {sink}")]
    CapacityMismatch {
        /// The capacity asked for.
        ring: u64,
        /// The sink's region size.
        sink: u64,
    },
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
    /// Not enough unconsumed space right now (or every commit slot holds an unpublished record).
    #[error("ring is full")]
    Full,
    /// A wait for space ran out of its timeout.
    #[error("timed out waiting for ring space")]
    Timeout,
    /// The consumer has stopped (or was asked to stop): no more space will be freed.
    #[error("the ring's consumer has stopped")]
    Stopped,
    /// The ring is owned by a [`Producer`] right now; shared reservations wait for it.
    #[error("the ring is claimed by a producer")]
    Claimed,
    /// A claim was refused: shared reservations are still in flight.
    #[error("the ring has shared reservations in flight")]
    Busy,
    /// The calling thread would wait for something only it can finish: it holds an open
    /// reservation (or the [`Producer`]) that the space or slot it waits for depends on.
    #[error("the calling thread holds the reservation this wait depends on")]
    WouldDeadlock,
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
    /// The host memory of a [`HostSink`] of this many bytes could not be allocated.
    #[error("cannot allocate {0} bytes of host memory for a ring")]
    HostMemory(u64),
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

/// Where the ring's bytes go and how the consumer learns of them. Implementations for GPU memory
/// live with the driver layer.
///
/// The trait is safe to implement; its two memory-touching methods are `unsafe` to call, because
/// a sink over device memory trusts its caller for the range and for exclusivity: only the ring
/// core calls them, under the protocol described on each.
#[allow(unsafe_code)] // declares the two unsafe methods (callers' obligations in `# Safety`)
pub trait RingSink {
    /// Size of the data region in bytes ([`RingCore::new`] checks it against its capacity).
    fn capacity(&self) -> u64;

    /// Stores `bytes` at `offset` of the data region.
    ///
    /// # Safety
    /// * `offset + bytes.len() <= capacity()` (never wrapping: a span that runs past the end is
    ///   split by the caller);
    /// * no other call writes any of these bytes concurrently, and the consumer has released
    ///   them (they lie outside the published, unconsumed records).
    unsafe fn write(&self, offset: u64, bytes: &[u8]);

    /// Makes this thread's earlier [`write`](Self::write)s visible to the consumer, then stores
    /// `tail`. For BAR memory: `sfence` (plus a flush if the memory is not host-coherent), an
    /// 8-byte atomic store of `tail`, `sfence`.
    ///
    /// # Safety
    /// * calls are serialised (one at a time, each after the previous one returned) with
    ///   strictly increasing `tail`, at most the capacity past the consumer's head;
    /// * every record below `tail` is completely written, either by this thread or by a thread
    ///   that called [`writes_done`](Self::writes_done) after its writes and handed the record
    ///   over with release/acquire ordering, so fencing this thread's stores is enough.
    unsafe fn publish(&self, tail: u64);

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
        // Fallibly: a huge capacity is an error, not an abort of the process.
        let mut data = Vec::new();
        data.try_reserve_exact(len)
            .map_err(|_| RingError::HostMemory(capacity))?;
        data.extend((0..len).map(|_| AtomicU8::new(0)));
        Ok(Self {
            data: data.into_boxed_slice(),
            tail: CachePadded(AtomicU64::new(0)),
        })
    }

    /// The last published tail (acquire: the records below it are readable).
    pub fn tail(&self) -> u64 {
        self.tail.load(Ordering::Acquire)
    }
}

#[allow(unsafe_code)] // implements the unsafe methods with safe bodies
impl RingSink for HostSink {
    fn capacity(&self) -> u64 {
        self.data.len() as u64
    }

    /// # Safety
    /// As the trait says; this sink checks the range anyway (a panic, not a stray write) and
    /// stores relaxed atomics, so a protocol bug shows as wrong bytes, never as a data race.
    unsafe fn write(&self, offset: u64, bytes: &[u8]) {
        let start = offset as usize;
        for (cell, &b) in self.data[start..start + bytes.len()].iter().zip(bytes) {
            cell.store(b, Ordering::Relaxed);
        }
    }

    unsafe fn publish(&self, tail: u64) {
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
/// Positions only grow. Invariants: `reclaimed <= committed <= reserved` and
/// `reserved - reclaimed <= capacity`, so a write never lands on bytes the consumer has not
/// released. Reservation takes a short mutex (position and seq move together, so seq order is
/// position order). Commit never waits: it marks its record done, and whoever holds the
/// publisher role publishes every record that is done and has no unfinished record before it,
/// with one [`RingSink::publish`] for all of them (commit combining). A [`Producer`] holds the
/// publisher role and the reservation rights for its whole life instead.
#[derive(Debug)]
pub struct RingCore<S> {
    capacity: u64,
    max_record: u32,
    sink: S,
    /// Whether a record that reaches the end of the region is preceded by a wrap PAD or runs on.
    wrap: WrapMode,
    /// The next sequence number; the lock also serialises every change of `reserved` and of
    /// `claimed` (except a claimed ring's own `reserved`, which only its producer moves).
    next_seq: Mutex<u64>,
    /// End of the last reservation.
    reserved: CachePadded<AtomicU64>,
    /// End of the last committed record; set just before it is published.
    committed: CachePadded<AtomicU64>,
    /// End of the last record whose `publish` returned.
    published: CachePadded<AtomicU64>,
    /// Sequence number of the first record not yet published (changed only by the publisher).
    published_seq: CachePadded<AtomicU64>,
    /// The publisher role and its requests: 0 when no one publishes. A committer that raises it
    /// from 0 is the publisher and publishes until it can lower it back to 0 unchanged (every
    /// other committer's increment makes it look again); a [`Producer`] or a lone wrap PAD holds
    /// it at 1. All changes are read-modify-writes of this one word, so acquire/release is enough
    /// to make no commit go unpublished (loom checks this: `tests/loom_ring.rs`).
    publishing: CachePadded<AtomicU64>,
    /// The thread that claimed the ring for a [`Producer`] (0: not claimed).
    claimed: AtomicU64,
    /// `slots[seq % COMMIT_SLOTS].done` holds the end of record `seq` once it is committed; a
    /// value at or below `published` is stale (an earlier lap of the slots).
    slots: Box<[CachePadded<Slot>]>,
    /// Position the consumer has released.
    reclaimed: CachePadded<AtomicU64>,
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
    /// An empty ring of `capacity` bytes (a power of two of at least [`MIN_CAPACITY`], equal to
    /// the sink's) writing through `sink`. Positions start at 0.
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
    fn write_owned(&self, offset: u64, bytes: &[u8]) {
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

    /// Publishes `tail` through the sink. Callers hold the publisher role (so calls are
    /// serialised and `tail` grows) and every record below `tail` is finished and fenced.
    fn publish_owned(&self, tail: u64) {
        // SAFETY: the caller holds the publisher role (one publication at a time, strictly
        // increasing tails, never past `reserved`, which stays within the capacity of the
        // consumer's head); the records below `tail` were finished and handed over as the
        // callers document.
        #[allow(unsafe_code)]
        unsafe {
            self.sink.publish(tail)
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

    /// Whether a [`Producer`] owns the ring now.
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

    fn check_payload(&self, payload: &[u8]) -> Result<u32, RingError> {
        let len = u32::try_from(payload.len()).map_err(|_| RingError::RecordTooLarge {
            len: u32::MAX,
            max: self.max_record,
        })?;
        self.check_len(len)?;
        Ok(len)
    }

    /// Reserves space for a record with a `len`-byte payload and gives it the next sequence
    /// number, or fails without waiting: [`RingError::Full`] when the space (or every commit
    /// slot) is taken, [`RingError::Claimed`] while a [`Producer`] owns the ring.
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
                self.publish_owned(pos);
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
    /// A wait that only the calling thread could end fails at once with
    /// [`RingError::WouldDeadlock`]: this thread holds an open reservation of this ring (made by
    /// this thread; the consumer cannot pass it, so no space frees beyond it) or owns its
    /// [`Producer`]. An `Err` from `head` (a stopped consumer) ends the wait with that error.
    pub fn reserve(
        &self,
        len: u32,
        timeout: Option<Duration>,
        head: &HeadFn<'_>,
    ) -> Result<Reservation<'_, S>, RingError> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut backoff = Backoff::new();
        loop {
            match self.try_reserve(len) {
                Err(RingError::Full | RingError::Claimed) => {}
                other => return other,
            }
            if self.held_by_current_thread() {
                return Err(RingError::WouldDeadlock);
            }
            // No deadline: no timeout, or one too long to represent (treated as no limit).
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(RingError::Timeout);
            }
            backoff.snooze();
            self.reclaim_to(head()?)?;
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

    /// Reserves, writes `payload` and commits: one whole record. Returns its sequence number.
    /// Arguments as for [`reserve`](Self::reserve).
    pub fn push(
        &self,
        payload: &[u8],
        timeout: Option<Duration>,
        head: &HeadFn<'_>,
    ) -> Result<u64, RingError> {
        let len = self.check_payload(payload)?;
        let mut r = self.reserve(len, timeout, head)?;
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
                self.publish_owned(pos);
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

    /// Takes the ring for one [`Producer`]: no shared reservation may be in flight
    /// ([`RingError::Busy`] otherwise) and no other producer may own it
    /// ([`RingError::Claimed`]). Until the producer is dropped, shared reservations wait (or
    /// `try_reserve` says `Claimed`). `head` is how the producer learns the consumer's head when
    /// it needs space (see [`HeadFn`]).
    ///
    /// ```
    /// use vkgdr::ring::core::{HostSink, RingCore};
    /// use vkgdr::ring::layout::verify_records;
    ///
    /// let ring = RingCore::new(4096, HostSink::new(4096)?)?;
    /// let mut p = ring.claim(|| Ok(0))?;
    /// let records: [&[u8]; 3] = [b"first record", b"second", b"third"];
    /// p.push_batch(records, None)?; // three records, one publication
    /// drop(p);
    /// let report = verify_records(ring.sink(), 0, ring.sink().tail(), 0);
    /// assert_eq!((report.records, report.next_seq), (3, 3)); // (short test payloads: errors)
    /// # Ok::<(), vkgdr::ring::core::RingError>(())
    /// ```
    pub fn claim<'a>(
        &'a self,
        head: impl Fn() -> Result<u64, RingError> + Send + Sync + 'a,
    ) -> Result<Producer<'a, S>, RingError> {
        let next_seq = self.next_seq.lock();
        if self.claimed.load(Ordering::Acquire) != 0 {
            return Err(RingError::Claimed);
        }
        let reserved = self.reserved.load(Ordering::Relaxed);
        if self.published.load(Ordering::Acquire) != reserved {
            return Err(RingError::Busy);
        }
        // The producer is the publisher from now on; a committer still finishing its last pass
        // makes the claim fail rather than wait.
        if self
            .publishing
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Err(RingError::Busy);
        }
        if self.published.load(Ordering::Acquire) != reserved {
            self.publishing.store(0, Ordering::Release);
            return Err(RingError::Busy);
        }
        self.claimed.store(thread_id(), Ordering::Release);
        let seq = *next_seq;
        drop(next_seq);
        Ok(Producer {
            core: self,
            head: Box::new(head),
            pos: reserved,
            seq,
            published: reserved,
            limit: self.reclaimed() + self.capacity,
            policy: FlushPolicy::default(),
            pending_since: None,
        })
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
        self.finish(KIND_DATA)
    }

    fn finish(&mut self, kind: u32) -> u64 {
        self.done = true;
        let core = self.core;
        if let Some((offset, header)) = self.pad_header() {
            core.write_owned(offset, &header);
        }
        let header = RecordHeader {
            len: self.len,
            kind,
            seq: self.seq,
        };
        core.write_owned(self.offset(), &header.to_bytes());
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

/// Checks a write of `bytes` at payload offset `at` of a `len`-byte payload.
fn check_write(at: u32, bytes: &[u8], len: u32) -> Result<(), RingError> {
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

/// When a [`Producer`] publishes records it has written but not yet published.
///
/// [`Producer::push`] and [`Producer::push_batch`] always publish before they return, and every
/// wait for space publishes first (the consumer cannot free space for records it cannot see).
/// [`Producer::write`] and [`ProducerRecord::commit`] publish only when this policy says so,
/// trading latency for one fence and one tail store per batch instead of per record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlushPolicy {
    /// Publish once this many bytes (records with headers) are waiting. `0`: every record at
    /// once.
    pub max_pending_bytes: u64,
    /// Publish once the oldest waiting record has waited this long, checked on each write
    /// (there is no timer thread: a producer that goes idle calls [`Producer::flush`]).
    pub max_delay: Option<Duration>,
}

impl Default for FlushPolicy {
    /// Publish every 64 KiB (less than a quarter of the ring keeps the consumer busy while the
    /// producer writes on), with no delay bound.
    fn default() -> Self {
        FlushPolicy {
            max_pending_bytes: 64 << 10,
            max_delay: None,
        }
    }
}

/// Records at most this long (with the header) are assembled on the stack and written with one
/// copy: one call into the copy kernel instead of two, and whole write-combining lines.
const SMALL_RECORD: usize = 256;

/// The exclusive producer of a ring, from [`RingCore::claim`]: appends records with no lock and
/// no atomic read-modify-write, and publishes a whole batch with one fence and one tail store.
/// Dropping it publishes what it has written and hands the ring back to shared use.
///
/// Records are numbered and placed exactly as shared reservations would be (the same wire
/// format, the same wrap PADs), so a consumer cannot tell the two apart.
pub struct Producer<'a, S: RingSink> {
    core: &'a RingCore<S>,
    head: Box<HeadFn<'a>>,
    /// End of the last record written (the ring's `reserved`).
    pos: u64,
    /// The next record's sequence number.
    seq: u64,
    /// End of the last publication.
    published: u64,
    /// `reclaimed + capacity` when last looked at: writes below it need no check.
    limit: u64,
    policy: FlushPolicy,
    /// When the oldest unpublished record was written (tracked only with a `max_delay`).
    pending_since: Option<Instant>,
}

impl<S: RingSink> std::fmt::Debug for Producer<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("pos", &self.pos)
            .field("seq", &self.seq)
            .field("published", &self.published)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl<'a, S: RingSink> Producer<'a, S> {
    /// The ring this producer owns.
    pub fn core(&self) -> &'a RingCore<S> {
        self.core
    }

    /// The sequence number the next record gets.
    pub fn next_seq(&self) -> u64 {
        self.seq
    }

    /// Bytes written but not yet published.
    pub fn pending(&self) -> u64 {
        self.pos - self.published
    }

    /// The publication policy for [`write`](Self::write) and [`ProducerRecord::commit`].
    pub fn policy(&self) -> FlushPolicy {
        self.policy
    }

    /// Sets the publication policy (see [`FlushPolicy`]).
    pub fn set_policy(&mut self, policy: FlushPolicy) {
        self.policy = policy;
    }

    /// Appends one record and publishes it (with anything written before) at once: the
    /// lowest-latency path. Returns its sequence number. Waits up to `timeout` for space.
    pub fn push(&mut self, payload: &[u8], timeout: Option<Duration>) -> Result<u64, RingError> {
        let seq = self.append(payload, timeout)?;
        self.flush();
        Ok(seq)
    }

    /// Appends every payload, then publishes them all with one fence and one tail store (a batch
    /// larger than the ring is published in pieces while waiting for space). Returns how many
    /// records were written. On an error, the records written before it are still published.
    pub fn push_batch<'p>(
        &mut self,
        payloads: impl IntoIterator<Item = &'p [u8]>,
        timeout: Option<Duration>,
    ) -> Result<u64, RingError> {
        let mut n = 0;
        let mut result = Ok(());
        for p in payloads {
            if let Err(e) = self.append(p, timeout) {
                result = Err(e);
                break;
            }
            n += 1;
        }
        self.flush();
        result.map(|()| n)
    }

    /// Appends one record; it is published by the [`FlushPolicy`], a later
    /// [`flush`](Self::flush) or push, a wait for space, or dropping the producer. Returns its
    /// sequence number.
    pub fn write(&mut self, payload: &[u8], timeout: Option<Duration>) -> Result<u64, RingError> {
        let seq = self.append(payload, timeout)?;
        self.flush_by_policy();
        Ok(seq)
    }

    /// Reserves the next record (`len` payload bytes) for writing in place, waiting up to
    /// `timeout` for space. The record is numbered now; [`ProducerRecord::commit`] appends it,
    /// dropping it appends a PAD of the same size with that number.
    pub fn reserve(
        &mut self,
        len: u32,
        timeout: Option<Duration>,
    ) -> Result<ProducerRecord<'_, 'a, S>, RingError> {
        self.core.check_len(len)?;
        let pos = self.place(layout::record_size(len), timeout)?;
        Ok(ProducerRecord {
            producer: self,
            pos,
            len,
            done: false,
        })
    }

    /// Publishes every record written so far: one fence (after this thread's stores) and one
    /// tail store. Does nothing when nothing is pending.
    pub fn flush(&mut self) {
        if self.pos == self.published {
            return;
        }
        let core = self.core;
        core.committed.store(self.pos, Ordering::Release);
        // Every record below `pos` was written by this thread (the publisher role is this
        // producer's for its life), so the sink's own fence covers them.
        core.publish_owned(self.pos);
        core.published.store(self.pos, Ordering::Release);
        core.published_seq.store(self.seq, Ordering::Release);
        self.published = self.pos;
        self.pending_since = None;
    }

    fn flush_by_policy(&mut self) {
        let pending = self.pending();
        if pending == 0 {
            return;
        }
        let due = pending >= self.policy.max_pending_bytes
            || self.policy.max_delay.is_some_and(|d| {
                let since = *self.pending_since.get_or_insert_with(Instant::now);
                since.elapsed() >= d
            });
        if due {
            self.flush();
        }
    }

    /// Writes one whole record (header and payload) at the next position.
    fn append(&mut self, payload: &[u8], timeout: Option<Duration>) -> Result<u64, RingError> {
        let len = self.core.check_payload(payload)?;
        let size = layout::record_size(len);
        let pos = self.place(size, timeout)?;
        let seq = self.seq;
        let header = RecordHeader::data(len, seq).to_bytes();
        let offset = pos & (self.core.capacity - 1);
        // `[pos, pos + size)` is this producer's next record: free (checked by `place`) and
        // written by no one else while the ring is claimed.
        if size as usize <= SMALL_RECORD {
            let mut buf = [0u8; SMALL_RECORD];
            buf[..16].copy_from_slice(&header);
            buf[16..16 + payload.len()].copy_from_slice(payload);
            self.core.write_owned(offset, &buf[..16 + payload.len()]);
        } else {
            self.core.write_owned(offset, &header);
            self.core
                .write_owned((offset + HEADER_LEN) & (self.core.capacity - 1), payload);
        }
        self.advance(pos + size);
        Ok(seq)
    }

    /// The record just placed ends at `end`: it is written and numbered.
    fn advance(&mut self, end: u64) {
        self.pos = end;
        self.seq += 1;
        self.core.reserved.store(end, Ordering::Release);
    }

    /// Where the next record of `size` bytes goes: writes the wrap PAD before it if it would
    /// cross the end of a padded region, and waits until the consumer has released its space.
    fn place(&mut self, size: u64, timeout: Option<Duration>) -> Result<u64, RingError> {
        let cap = self.core.capacity;
        let offset = self.pos & (cap - 1);
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        if self.core.wrap == WrapMode::Padded && offset + size > cap {
            let pad = cap - offset;
            self.make_room(self.pos + pad, deadline)?;
            self.core
                .write_owned(offset, &RecordHeader::wrap_pad(pad).to_bytes());
            self.pos += pad;
            self.core.reserved.store(self.pos, Ordering::Release);
        }
        self.make_room(self.pos + size, deadline)?;
        Ok(self.pos)
    }

    /// Waits until `[.., end)` is free: the consumer has released `end - capacity`. Publishes
    /// what is pending first, since the consumer can only release what it can see.
    fn make_room(&mut self, end: u64, deadline: Option<Instant>) -> Result<(), RingError> {
        if end <= self.limit {
            return Ok(());
        }
        let cap = self.core.capacity;
        self.limit = self.core.reclaimed() + cap;
        if end <= self.limit {
            return Ok(());
        }
        self.flush();
        let mut backoff = Backoff::new();
        loop {
            self.core.reclaim_to((self.head)()?)?;
            self.limit = self.core.reclaimed() + cap;
            if end <= self.limit {
                return Ok(());
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(RingError::Timeout);
            }
            backoff.snooze();
        }
    }
}

impl<S: RingSink> Drop for Producer<'_, S> {
    fn drop(&mut self) {
        self.flush();
        let core = self.core;
        let mut next_seq = core.next_seq.lock();
        *next_seq = self.seq;
        core.published_seq.store(self.seq, Ordering::Release);
        core.claimed.store(0, Ordering::Release);
        // No shared commit can be waiting: reservations were refused while the ring was claimed.
        core.publishing.store(0, Ordering::Release);
    }
}

/// The next record of a [`Producer`], written in place: [`write`](Self::write) its payload, then
/// [`commit`](Self::commit). Dropped uncommitted, it becomes a PAD record keeping its seq.
#[must_use = "dropping a record reservation turns it into a PAD record"]
pub struct ProducerRecord<'p, 'a, S: RingSink> {
    producer: &'p mut Producer<'a, S>,
    pos: u64,
    len: u32,
    done: bool,
}

impl<S: RingSink> ProducerRecord<'_, '_, S> {
    /// Position of the record's header.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// The record's sequence number.
    pub fn seq(&self) -> u64 {
        self.producer.seq
    }

    /// Payload length.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Always false: empty records are refused.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Position just past the record.
    pub fn end(&self) -> u64 {
        self.pos + layout::record_size(self.len)
    }

    /// Writes `bytes` at payload offset `at`.
    pub fn write(&mut self, at: u32, bytes: &[u8]) -> Result<(), RingError> {
        check_write(at, bytes, self.len)?;
        if !bytes.is_empty() {
            let core = self.producer.core;
            let offset = (self.pos + HEADER_LEN + u64::from(at)) & (core.capacity - 1);
            // Inside this record's payload, which is placed and free (see `Producer::place`).
            core.write_owned(offset, bytes);
        }
        Ok(())
    }

    /// Writes the header and appends the record (published as the [`FlushPolicy`] says).
    /// Returns its sequence number.
    pub fn commit(mut self) -> u64 {
        let seq = self.finish(KIND_DATA);
        self.producer.flush_by_policy();
        seq
    }

    fn finish(&mut self, kind: u32) -> u64 {
        self.done = true;
        let p = &mut *self.producer;
        let seq = p.seq;
        let header = RecordHeader {
            len: self.len,
            kind,
            seq,
        };
        let offset = self.pos & (p.core.capacity - 1);
        p.core.write_owned(offset, &header.to_bytes());
        p.advance(self.pos + layout::record_size(self.len));
        seq
    }
}

impl<S: RingSink> Drop for ProducerRecord<'_, '_, S> {
    fn drop(&mut self) {
        if !self.done {
            self.finish(KIND_PAD);
        }
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests;
