//! [`Producer`]: the exclusive producer of a ring ([`RingCore::claim`]), which appends records
//! with plain arithmetic and publishes a whole batch with one fence and one tail store.

use std::time::{Duration, Instant};

use super::error::RingError;
use super::layout::{self, RecordHeader, WrapMode, HEADER_LEN, KIND_DATA, KIND_PAD};
use super::shared::RingCore;
use super::shared::{check_write, HeadFn};
use super::sink::RingSink;
use super::staged::{stage_buf, stage_record};
use super::wait::Deadline;
use crate::core::sync::atomic::Ordering;
use crate::core::sync::{thread_id, Backoff};

impl<S: RingSink> RingCore<S> {
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
            stage_at: self.sink.stage_threshold().unwrap_or(u64::MAX),
            stage_after: self.sink.stage_after_pending(),
            staged_from: None,
        })
    }
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

/// The exclusive producer of a ring, from [`RingCore::claim`]: appends records with no lock and
/// no atomic read-modify-write, and publishes a whole batch with one fence and one tail store.
/// Dropping it publishes what it has written and hands the ring back to shared use.
///
/// Records are numbered and placed exactly as shared reservations would be (the same wire
/// format, the same wrap PADs), so a consumer cannot tell the two apart.
///
/// **Large records.** Where the sink offers a staging copy ([`RingSink::stage_threshold`]: a
/// GPU ring's copy-engine path), records of at least that size are written there once the batch
/// has [`RingSink::stage_after_pending`] bytes pending before them (so a lone push or a short
/// batch keeps the direct path), and so is everything after the first of them until the next
/// publication; the publication then has the
/// sink move `[first staged position, tail)` into place before the tail. Records before the
/// first staged one keep the direct path. So a batch is one direct span and one staged span, in
/// position order, and the consumer's view is the same either way.
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
    /// Records of at least this size are staged (`u64::MAX`: none)...
    stage_at: u64,
    /// ... once this many bytes are pending before them.
    stage_after: u64,
    /// The first staged position since the last publication: everything from here to `pos` is
    /// in the sink's staging copy.
    staged_from: Option<u64>,
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

    /// How many bytes (records with headers) of the unpublished batch are written in place
    /// before a large record is staged (see "Large records" above).
    pub fn stage_after(&self) -> u64 {
        self.stage_after
    }

    /// Sets how many bytes (records with headers) must be pending in the unpublished batch
    /// before a large record is staged; from the producer's next record on. A producer starts
    /// with its sink's [`RingSink::stage_after_pending`]: on a GPU ring 64 KiB, so that a lone
    /// large record or a short batch keeps the direct path, which is quicker for it. `0` stages
    /// every large record, the first of a batch and a lone one included: for producers that
    /// stream large records beside a lane whose lone records must arrive quickly, since the
    /// direct writes of their batches' first bytes are what those records wait behind on a GPU
    /// ring (BENCHMARKS.md, 'A lone record beside bulk producers'); and for producers whose
    /// batches hold a few records of a megabyte, whose first record is otherwise a large share
    /// of each batch on the direct path (BENCHMARKS.md, 'Records up to 1 MiB'). `u64::MAX`
    /// stages none. No effect where the sink stages nothing.
    ///
    /// ```
    /// use vkgdr::ring::core::{HostSink, RingCore};
    /// let ring = RingCore::new(1 << 16, HostSink::with_staging_after(1 << 16, 4096, 1 << 16)?)?;
    /// let mut bulk = ring.claim(|| Ok(0))?;
    /// assert_eq!(bulk.stage_after(), 1 << 16);
    /// bulk.set_stage_after(0); // every record of 4 KiB and more staged, the first one too
    /// bulk.push(&[7u8; 4096], None)?;
    /// # Ok::<(), vkgdr::ring::core::RingError>(())
    /// ```
    pub fn set_stage_after(&mut self, bytes: u64) {
        self.stage_after = bytes;
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
        let size = layout::record_size(len);
        let pos = self.place(size, timeout)?;
        // Decided now, before any piece is written: the staged span then starts at the header.
        let staged = self.staging(pos, size);
        Ok(ProducerRecord {
            producer: self,
            pos,
            len,
            staged,
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
        // producer's for its life), so the sink's own fence covers them; from `staged_from` on,
        // every byte was staged (see `staging`).
        match self.staged_from.take() {
            Some(from) => core.publish_staged_owned(from, self.pos),
            None => core.publish_owned(self.pos, self.seq),
        }
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
            || self
                .policy
                .max_delay
                .is_some_and(|d| match self.pending_since {
                    Some(since) => since.elapsed() >= d,
                    // The oldest pending record was just written: it has not waited yet.
                    None => {
                        self.pending_since = Some(Instant::now());
                        d.is_zero()
                    }
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
        let staged = self.staging(pos, size);
        let seq = self.seq;
        let header = RecordHeader::data(len, seq).to_bytes();
        let offset = pos & (self.core.capacity - 1);
        // `[pos, pos + size)` is this producer's next record: free (checked by `place`) and
        // written by no one else while the ring is claimed. A short record goes in one write.
        let mut buf = stage_buf();
        if let Some(record) = stage_record(&mut buf, &header, payload) {
            self.put(staged, offset, record);
        } else {
            self.put(staged, offset, &header);
            let at = (offset + HEADER_LEN) & (self.core.capacity - 1);
            self.put(staged, at, payload);
        }
        self.advance(pos + size);
        Ok(seq)
    }

    /// Whether the bytes of a record (or wrap PAD) of `size` bytes at `pos` go to the sink's
    /// staging copy: a large record in a batch long enough does, and so does everything after a
    /// staged record until the next publication, which keeps the staged span
    /// `[staged_from, pos)` whole.
    fn staging(&mut self, pos: u64, size: u64) -> bool {
        let large = size >= self.stage_at && pos - self.published >= self.stage_after;
        if large || self.staged_from.is_some() {
            self.staged_from.get_or_insert(pos);
            true
        } else {
            false
        }
    }

    /// Writes `bytes` at region offset `offset` of an owned span, staged or in place.
    fn put(&self, staged: bool, offset: u64, bytes: &[u8]) {
        if staged {
            self.core.stage_owned(offset, bytes);
        } else {
            self.core.write_owned(offset, bytes);
        }
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
        // One deadline for the PAD's space and the record's: the clock starts only if either
        // has to wait.
        let mut deadline = Deadline::new(timeout);
        if self.core.wrap == WrapMode::Padded && offset + size > cap {
            let pad = cap - offset;
            self.make_room(self.pos + pad, &mut deadline)?;
            // Staged only inside a staged span (a PAD is never large itself).
            let staged = self.staging(self.pos, 0);
            self.put(staged, offset, &RecordHeader::wrap_pad(pad).to_bytes());
            self.pos += pad;
            self.core.reserved.store(self.pos, Ordering::Release);
        }
        self.make_room(self.pos + size, &mut deadline)?;
        Ok(self.pos)
    }

    /// Waits until `[.., end)` is free: the consumer has released `end - capacity`. Publishes
    /// what is pending first, since the consumer can only release what it can see. Asks for the
    /// consumer's head at least once before giving up, however short the deadline.
    fn make_room(&mut self, end: u64, deadline: &mut Deadline) -> Result<(), RingError> {
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
            if deadline.passed() {
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
    /// Whether the record's bytes go to the sink's staging copy.
    staged: bool,
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
            self.producer.put(self.staged, offset, bytes);
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
        p.put(self.staged, offset, &header.to_bytes());
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
