//! The CPU side of a lane: [`LaneMemory`] (where the slots and control words are),
//! [`HostLane`] (plain host memory, for tests and models) and [`LaneConsumer`], which takes
//! records in order and publishes its head: at once ([`LaneConsumer::try_next`],
//! [`LaneConsumer::poll`], [`LaneConsumer::drain`]), waiting ([`LaneConsumer::next_timeout`])
//! or as a blocking iterator ([`LaneConsumer::records`]).
//!
//! **When the head moves.** `drain` publishes it once at its end. The one-record calls
//! (`try_next`, `poll`, `next_timeout`, the iterator) leave it one record behind and publish
//! it at the start of the consumer's next call, or at its close or drop: the head's store
//! (through a BAR, a write-combined store and an `sfence`, some hundreds of nanoseconds) then
//! comes after the record is in the caller's hands, not before, which is most of what a lone
//! record's arrival costs beyond the device's own write. The device may overwrite a slot only
//! once the head passed it, and the record was copied out before `next` moved past it, so
//! publishing later is always safe; the lane just looks one record fuller to its producers
//! while the caller holds the record ([`LaneConsumer::publish_head`] publishes it at once).

use std::time::{Duration, Instant};

use super::layout::{tag_of, D2hError, LaneShape, SlotFormat, COMMIT_WORD, META_WORD};
use crate::core::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use crate::core::sync::CachePadded;

/// A lane's host memory as the consumer sees it: the slot region as `u64` words, and the two
/// control words the device reads. All of it is memory the CPU reads from its own RAM; the
/// device writes the slots and reads the control words over PCIe.
///
/// Implemented by [`HostLane`] here and by the pinned host buffers of the ring layer.
pub trait LaneMemory {
    /// The slot region, `shape.words()` words.
    fn slot_words(&self) -> &[AtomicU64];
    /// `head`: records consumed, stored (release) by the consumer.
    fn head_word(&self) -> &AtomicU64;
    /// `closed`: non-zero once the consumer is gone.
    fn closed_word(&self) -> &AtomicU64;
    /// Called after each store to `head` or `closed`: control words in write-combined memory
    /// (a BAR mapping) are pushed out here (`sfence`, and a flush where the memory is not
    /// coherent). The default does nothing (enough for ordinary memory).
    fn control_stored(&self) {}
    /// Whether the lane's producers have finished (their kernels completed, or the caller said
    /// so): once it returns true, every record they committed is visible to the consumer, so a
    /// record still missing after it will never come ([`Poll::Ended`]). The default: never.
    fn producers_done(&self) -> bool {
        false
    }
}

/// A reference or an `Arc` to lane memory is lane memory: every call forwarded.
macro_rules! forward_lane_memory {
    ($($pointer:ty),*) => {$(
        impl<T: LaneMemory + ?Sized> LaneMemory for $pointer {
            fn slot_words(&self) -> &[AtomicU64] {
                (**self).slot_words()
            }
            fn head_word(&self) -> &AtomicU64 {
                (**self).head_word()
            }
            fn closed_word(&self) -> &AtomicU64 {
                (**self).closed_word()
            }
            fn control_stored(&self) {
                (**self).control_stored()
            }
            fn producers_done(&self) -> bool {
                (**self).producers_done()
            }
        }
    )*};
}
forward_lane_memory!(&T, std::sync::Arc<T>);

/// A lane in plain host memory: zeroed slots and control words, for tests, models and the
/// producer model ([`ProducerModel`](super::ProducerModel)).
#[derive(Debug)]
pub struct HostLane {
    shape: LaneShape,
    words: Box<[AtomicU64]>,
    head: CachePadded<AtomicU64>,
    closed: CachePadded<AtomicU64>,
    done: AtomicBool,
}

impl HostLane {
    /// A zeroed lane of `shape`.
    pub fn new(shape: LaneShape) -> Self {
        HostLane {
            shape,
            words: (0..shape.words()).map(|_| AtomicU64::new(0)).collect(),
            head: CachePadded(AtomicU64::new(0)),
            closed: CachePadded(AtomicU64::new(0)),
            done: AtomicBool::new(false),
        }
    }

    /// Marks the lane's producers finished (release: their commits come before it), so that its
    /// consumer reports [`Poll::Ended`] once it has taken every record.
    pub fn finish(&self) {
        self.done.store(true, Ordering::Release);
    }

    /// The lane's shape.
    pub fn shape(&self) -> LaneShape {
        self.shape
    }
}

impl LaneMemory for HostLane {
    fn slot_words(&self) -> &[AtomicU64] {
        &self.words
    }
    fn head_word(&self) -> &AtomicU64 {
        &self.head
    }
    fn closed_word(&self) -> &AtomicU64 {
        &self.closed
    }
    fn producers_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }
}

/// One record as the consumer delivers it: a copy, so the slot is free again at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// Its sequence number in the lane (0, 1, 2, ...: the device's reservation order).
    pub seq: u64,
    /// The kind the device gave it (below [`KIND_RESERVED`](super::KIND_RESERVED) for a
    /// kernel's own records).
    pub kind: u32,
    /// The payload.
    pub payload: &'a [u8],
}

/// A record copied out of its lane, owned: what [`LaneConsumer::records`] yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordBuf {
    /// Its sequence number in the lane.
    pub seq: u64,
    /// The kind the device gave it.
    pub kind: u32,
    /// The payload.
    pub payload: Vec<u8>,
}

impl From<Record<'_>> for RecordBuf {
    fn from(r: Record<'_>) -> Self {
        RecordBuf {
            seq: r.seq,
            kind: r.kind,
            payload: r.payload.to_vec(),
        }
    }
}

/// What a look at a lane found ([`LaneConsumer::poll`], [`LaneConsumer::next_timeout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poll<'a> {
    /// The next record, taken: the head passes it at the consumer's next call (or close).
    Record(Record<'a>),
    /// No record yet (or none before the timeout); the producers may still publish.
    Pending,
    /// No record, and none will come: the producers have finished
    /// ([`LaneMemory::producers_done`]) and every record they published was taken.
    Ended,
}

impl<'a> Poll<'a> {
    /// The record, if one was taken.
    pub fn record(self) -> Option<Record<'a>> {
        match self {
            Poll::Record(r) => Some(r),
            Poll::Pending | Poll::Ended => None,
        }
    }
}

/// Spins this many pauses, then yields this many times, then sleeps, while waiting for a record.
const WAIT_SPINS: u32 = 2048;
const WAIT_YIELDS: u32 = 64;
/// How many slots ahead of the record it takes [`LaneConsumer::drain`] prefetches.
const PREFETCH_AHEAD: u64 = 8;
/// The longest sleep between two looks at an empty lane.
const WAIT_NAP: Duration = Duration::from_micros(50);

/// The consumer of one lane: takes its records in sequence order, each checked (commit word,
/// length, unchanged while read) before it is delivered, and publishes its head so the device
/// may reuse the slots (after a one-record call, at the start of the next call, or at once with
/// [`publish_head`](Self::publish_head)). One consumer per lane; dropping it closes the lane (the device's
/// publications then end with [`STATUS_CLOSED`](super::STATUS_CLOSED)).
///
/// An error is final: the lane is broken (the device broke the protocol) and every later call
/// returns the same error, delivering nothing.
///
/// ```
/// use vkgdr::ring::core::d2h::{DeviceLaneState, HostLane, LaneConsumer, LaneShape, ProducerModel};
///
/// let shape = LaneShape::new(4, 64)?;
/// let lane = HostLane::new(shape);
/// let device = DeviceLaneState::new();
/// let producer = ProducerModel::new(&lane, &device, shape, 1000);
/// producer.publish(7, b"hello").unwrap();
///
/// let mut consumer = LaneConsumer::new(&lane, shape)?;
/// let rec = consumer.try_next()?.expect("published");
/// assert_eq!((rec.seq, rec.kind, rec.payload), (0, 7, &b"hello"[..]));
/// assert!(consumer.try_next()?.is_none());
/// # Ok::<(), vkgdr::ring::core::d2h::D2hError>(())
/// ```
#[derive(Debug)]
pub struct LaneConsumer<M: LaneMemory> {
    mem: M,
    shape: LaneShape,
    /// The next record to take; everything below it is consumed (and published as the head
    /// once `publish_head` ran).
    next: u64,
    /// The payload of the last record delivered.
    buf: Vec<u8>,
    /// Set by the first protocol error; returned from then on.
    broken: Option<D2hError>,
    /// A one-record call took a record and left the head behind it: the next call publishes.
    unpublished: bool,
}

impl<M: LaneMemory> LaneConsumer<M> {
    /// The consumer of the lane in `mem`, starting at the head the memory holds (0 for a new
    /// lane, or where an earlier consumer stopped) and opening the lane (`closed` = 0).
    pub fn new(mem: M, shape: LaneShape) -> Result<Self, D2hError> {
        let found = mem.slot_words().len();
        if found != shape.words() {
            return Err(D2hError::MemoryMismatch {
                expected: shape.words(),
                found,
            });
        }
        let next = mem.head_word().load(Ordering::Acquire);
        mem.closed_word().store(0, Ordering::Release);
        mem.control_stored();
        Ok(LaneConsumer {
            mem,
            shape,
            next,
            buf: vec![0; shape.max_payload() as usize],
            broken: None,
            unpublished: false,
        })
    }

    /// The lane's shape.
    pub fn shape(&self) -> LaneShape {
        self.shape
    }

    /// The sequence number of the next record to take (= records consumed).
    pub fn next_seq(&self) -> u64 {
        self.next
    }

    /// The lane's memory.
    pub fn memory(&self) -> &M {
        &self.mem
    }

    /// Whether the next record has arrived (or the lane is broken): one load. In a
    /// [`Tagged`](SlotFormat::Tagged) lane, whether its first word has: the rest of it may
    /// still be on its way, for a moment, and [`try_next`](Self::try_next) says `None` until
    /// it is there.
    pub fn is_ready(&self) -> bool {
        if self.broken.is_some() {
            return true;
        }
        let word = self.mem.slot_words()[self.shape.first_word(self.next)].load(Ordering::Relaxed);
        match self.shape.format() {
            SlotFormat::Committed => word != self.shape.commit_before(self.next),
            SlotFormat::Tagged => (word >> 32) as u32 != self.shape.tag_before(self.next),
        }
    }

    /// The next record, if it has arrived (the head passes it at the next call); `Ok(None)` if
    /// it has not arrived yet.
    pub fn try_next(&mut self) -> Result<Option<Record<'_>>, D2hError> {
        self.settle();
        match self.take()? {
            Some((seq, kind, len)) => {
                self.unpublished = true;
                Ok(Some(Record {
                    seq,
                    kind,
                    payload: &self.buf[..len],
                }))
            }
            None => Ok(None),
        }
    }

    /// The next record if it has arrived ([`Poll::Record`]; the head passes it at the next
    /// call), [`Poll::Ended`] if none has and the producers are finished, else
    /// [`Poll::Pending`].
    pub fn poll(&mut self) -> Result<Poll<'_>, D2hError> {
        self.settle();
        Ok(match self.look()? {
            Look::Taken(seq, kind, len) => self.deliver(seq, kind, len),
            Look::Pending => Poll::Pending,
            Look::Ended => Poll::Ended,
        })
    }

    /// Waits up to `timeout` for the next record: [`Poll::Record`], [`Poll::Ended`] when the
    /// producers finished and everything was taken, or [`Poll::Pending`] when the time ran out.
    /// It spins first (a record that comes within microseconds is seen at once), then yields,
    /// then naps up to 50 µs between looks. [`Duration::MAX`] waits for as long as it takes.
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<Poll<'_>, D2hError> {
        self.settle();
        let deadline = Instant::now().checked_add(timeout);
        let mut waited = 0u32;
        loop {
            match self.look()? {
                Look::Taken(seq, kind, len) => return Ok(self.deliver(seq, kind, len)),
                Look::Ended => return Ok(Poll::Ended),
                Look::Pending => {}
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => left,
                    _ => return Ok(Poll::Pending),
                },
                None => WAIT_NAP,
            };
            pause(&mut waited, left);
        }
    }

    /// A blocking iterator over the lane's records, in order: each one copied out
    /// ([`RecordBuf`]) and its slot released. It waits as [`next_timeout`](Self::next_timeout)
    /// does, without a deadline, and ends when the producers have finished and everything was
    /// taken ([`Poll::Ended`]: give the lane's memory a way to know, e.g.
    /// `DeviceToHostRing::finish_after`), or after yielding the lane's error.
    pub fn records(&mut self) -> Records<'_, M> {
        Records {
            consumer: self,
            over: false,
        }
    }

    /// Takes up to `max` records that have arrived, in order, calling `f` with each, then
    /// publishes the head once. Returns how many were taken. On an error the records before it
    /// were delivered and their slots released.
    ///
    /// The throughput path: the other calls publish the head once per record, which where the
    /// head lies behind a BAR is a store and a fence each. A `max` of a quarter of the lane lets
    /// the producers refill the rest while `f` runs (with no limit they would wait for the whole
    /// lane to be taken).
    pub fn drain(&mut self, max: usize, mut f: impl FnMut(Record<'_>)) -> Result<usize, D2hError> {
        self.settle();
        let mut taken = 0;
        let result = loop {
            if taken == max {
                break Ok(taken);
            }
            self.prefetch(self.next + PREFETCH_AHEAD);
            match self.take() {
                Ok(Some((seq, kind, len))) => {
                    taken += 1;
                    f(Record {
                        seq,
                        kind,
                        payload: &self.buf[..len],
                    });
                }
                Ok(None) => break Ok(taken),
                Err(e) => break Err(e),
            }
        };
        if taken > 0 {
            self.store_head();
        }
        result
    }

    /// Tells the device that nothing will be taken any more: its waiting and later
    /// publications end with [`STATUS_CLOSED`](super::STATUS_CLOSED). Dropping the consumer
    /// does it too. The head is published first, so the lane's next consumer starts after the
    /// last record this one delivered.
    pub fn close(&self) {
        self.store_head();
        self.mem.closed_word().store(1, Ordering::Release);
        self.mem.control_stored();
    }

    /// Publishes the head a one-record call left behind, if it did.
    fn settle(&mut self) {
        if self.unpublished {
            self.publish_head();
        }
    }

    /// Publishes the head now, past every record taken so far: what the next call would do
    /// first after a one-record call. For a caller that holds a record a while (the lane looks
    /// one record fuller to its producers until then: enough to keep a warp's 32-record
    /// reservation out of a lane that has room for it).
    pub fn publish_head(&mut self) {
        self.unpublished = false;
        self.store_head();
    }

    /// Stores the head (release: every read of the slots below it happens before the device's
    /// acquire of it, hence before any overwrite).
    fn store_head(&self) {
        self.mem.head_word().store(self.next, Ordering::Release);
        self.mem.control_stored();
    }

    /// Asks the CPU to fetch the first line of record `seq`'s slot into its caches: the device
    /// wrote it into memory, so each slot is a cache miss, and a stream of misses taken one by
    /// one is far slower than the same misses in flight together. A hint only: nothing is read.
    #[inline]
    fn prefetch(&self, seq: u64) {
        #[cfg(all(target_arch = "x86_64", not(miri), not(feature = "loom")))]
        {
            let p = self.mem.slot_words()[self.shape.first_word(seq)].as_ptr();
            // SAFETY: a prefetch reads nothing the program sees and never faults; `p` points
            // into the lane's live slot region anyway.
            #[allow(unsafe_code)]
            // the intrinsic is unsafe to call; the hint has no effect on memory
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
            };
        }
        #[cfg(not(all(target_arch = "x86_64", not(miri), not(feature = "loom"))))]
        let _ = seq;
    }

    /// Hands over a record [`take`](Self::take) copied out; the head passes it at the next call.
    fn deliver(&mut self, seq: u64, kind: u32, len: usize) -> Poll<'_> {
        self.unpublished = true;
        Poll::Record(Record {
            seq,
            kind,
            payload: &self.buf[..len],
        })
    }

    /// Takes the next record if it has arrived, else says whether more may come. The producers
    /// are asked only when the lane looks empty (the ring layer's answer may cost a driver
    /// call), and then the slot is looked at again: a record still missing after the producers
    /// were seen finished never comes.
    fn look(&mut self) -> Result<Look, D2hError> {
        if let Some((seq, kind, len)) = self.take()? {
            return Ok(Look::Taken(seq, kind, len));
        }
        if !self.mem.producers_done() {
            return Ok(Look::Pending);
        }
        Ok(match self.take()? {
            Some((seq, kind, len)) => Look::Taken(seq, kind, len),
            None => Look::Ended,
        })
    }

    /// Copies the next record into `buf` and moves past it (without publishing the head):
    /// `(seq, kind, len)`.
    fn take(&mut self) -> Result<Option<(u64, u32, usize)>, D2hError> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let seq = self.next;
        let words = self.mem.slot_words();
        let taken = match self.shape.format() {
            SlotFormat::Committed => take_committed(words, self.shape, seq, &mut self.buf),
            SlotFormat::Tagged => take_tagged(words, self.shape, seq, &mut self.buf),
        };
        match taken {
            Ok(Some((kind, len))) => {
                self.next = seq + 1;
                Ok(Some((seq, kind, len)))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(self.fail(e)),
        }
    }

    fn fail(&mut self, e: D2hError) -> D2hError {
        self.broken = Some(e.clone());
        e
    }
}

/// Copies record `seq` out of a [`Committed`](SlotFormat::Committed) slot into `buf`:
/// `(kind, len)`, or `None` while its commit word is the previous lap's.
fn take_committed(
    words: &[AtomicU64],
    shape: LaneShape,
    seq: u64,
    buf: &mut [u8],
) -> Result<Option<(u32, usize)>, D2hError> {
    let first = shape.first_word(seq);
    let commit = words[first + COMMIT_WORD].load(Ordering::Acquire);
    if commit != LaneShape::commit_of(seq) {
        if commit == shape.commit_before(seq) {
            return Ok(None);
        }
        return Err(D2hError::BadCommit { seq, found: commit });
    }
    let meta = words[first + META_WORD].load(Ordering::Relaxed);
    let (len, kind) = (meta as u32, (meta >> 32) as u32);
    let max = shape.max_payload();
    if len > max {
        return Err(D2hError::BadLength { seq, len, max });
    }
    let len = len as usize;
    let body = &words[first + META_WORD + 1..][..len.div_ceil(8)];
    for (chunk, word) in buf[..len.next_multiple_of(8)].chunks_exact_mut(8).zip(body) {
        chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
    }
    // The payload loads come before the re-check: a slot the device overwrote while we read
    // it (only a device that ignores the head does) shows a different commit word now.
    fence(Ordering::Acquire);
    if words[first + COMMIT_WORD].load(Ordering::Relaxed) != commit {
        return Err(D2hError::Torn { seq });
    }
    Ok(Some((kind, len)))
}

/// Copies record `seq` out of a [`Tagged`](SlotFormat::Tagged) slot into `buf`: `(kind, len)`,
/// or `None` while any word it needs lacks the record's tag.
///
/// Every record writes the two header words, so before record `seq` arrives they hold exactly
/// the previous lap's tag (0 on the first lap): any other tag there is a device that wrote
/// past the head or wrote garbage ([`D2hError::BadCommit`]). A payload word may hold an older
/// lap's tag (a shorter record before did not write it), so one without the record's tag is
/// only "not yet", unless the header changed meanwhile ([`D2hError::Torn`]).
fn take_tagged(
    words: &[AtomicU64],
    shape: LaneShape,
    seq: u64,
    buf: &mut [u8],
) -> Result<Option<(u32, usize)>, D2hError> {
    let first = shape.first_word(seq);
    let tag = tag_of(seq);
    let before = shape.tag_before(seq);
    let header = |i: usize| -> Result<Option<u64>, D2hError> {
        let word = words[first + i].load(Ordering::Relaxed);
        match (word >> 32) as u32 {
            t if t == tag => Ok(Some(word)),
            t if t == before => Ok(None),
            _ => Err(D2hError::BadCommit { seq, found: word }),
        }
    };
    let Some(length) = header(0)? else {
        return Ok(None);
    };
    let Some(kind) = header(1)? else {
        return Ok(None);
    };
    // As in a committed slot: every load before it, then the first word again: a change means
    // the slot was overwritten while read.
    let unchanged = || {
        fence(Ordering::Acquire);
        if words[first].load(Ordering::Relaxed) == length {
            Ok(())
        } else {
            Err(D2hError::Torn { seq })
        }
    };
    let (len, max) = (length as u32, shape.max_payload());
    if len > max {
        return Err(D2hError::BadLength { seq, len, max });
    }
    let len = len as usize;
    let body = &words[first + 2..][..len.div_ceil(4)];
    for (chunk, word) in buf[..len.next_multiple_of(4)].chunks_exact_mut(4).zip(body) {
        let word = word.load(Ordering::Relaxed);
        if (word >> 32) as u32 != tag {
            // Not here yet, or overwritten under us.
            return unchanged().map(|()| None);
        }
        chunk.copy_from_slice(&(word as u32).to_le_bytes());
    }
    unchanged()?;
    Ok(Some((kind as u32, len)))
}

/// What [`LaneConsumer::look`] found.
enum Look {
    Taken(u64, u32, usize),
    Pending,
    Ended,
}

/// One pause of a wait for a record, at most `left` long; `waited` counts the pauses so far.
fn pause(waited: &mut u32, left: Duration) {
    if *waited < WAIT_SPINS {
        std::hint::spin_loop();
    } else if *waited < WAIT_SPINS + WAIT_YIELDS {
        std::thread::yield_now();
    } else {
        std::thread::sleep(left.min(WAIT_NAP));
    }
    *waited = waited.saturating_add(1);
}

/// The blocking iterator of [`LaneConsumer::records`].
#[derive(Debug)]
pub struct Records<'c, M: LaneMemory> {
    consumer: &'c mut LaneConsumer<M>,
    /// Ended, or the error was yielded.
    over: bool,
}

impl<M: LaneMemory> Iterator for Records<'_, M> {
    type Item = Result<RecordBuf, D2hError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.over {
            return None;
        }
        loop {
            match self.consumer.next_timeout(Duration::MAX) {
                Ok(Poll::Record(r)) => return Some(Ok(r.into())),
                Ok(Poll::Pending) => continue,
                Ok(Poll::Ended) => {
                    self.over = true;
                    return None;
                }
                Err(e) => {
                    self.over = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

impl<M: LaneMemory> std::iter::FusedIterator for Records<'_, M> {}

impl<M: LaneMemory> Drop for LaneConsumer<M> {
    fn drop(&mut self) {
        self.close();
    }
}
