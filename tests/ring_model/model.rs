//! The ring core's model, shared by the proptest in `tests/ring_model.rs` and the fuzz target
//! `fuzz/fuzz_targets/ring_core.rs` (one set of rules, not two that drift): plain counters, a
//! queue of open reservations, what a claimed producer wrote, the published records, and a map of
//! which region bytes hold published, unconsumed records. [`run_model`] drives a real
//! [`RingCore`] with a list of [`Op`]s and panics at the first difference.
//!
//! The consumer publishes its head in a word the producers read (as the GPU's head in pinned
//! host memory), and tells the ring directly only when an op says so: waits with a zero timeout
//! (shared reservations, `push`, the claimed producer) must take the space it freed without
//! being told.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use vkgdr::ring::core::{
    FlushPolicy, HostSink, Producer, Reservation, RingCore, RingError, RingSink, COMMIT_SLOTS,
};
use vkgdr::ring::layout::{
    check_test_payload, next_record_in, read_wrapped, record_size, seal_test_payload,
    verify_records_in, RecordHeader, RingSource, WrapMode, KIND_DATA, KIND_PAD, TEST_PREFIX_LEN,
    WRAP_PAD_SEQ,
};

/// A [`HostSink`] that logs every write, so the test can check none lands on unconsumed bytes.
pub struct LoggingSink {
    pub inner: HostSink,
    pub writes: Mutex<Vec<(u64, usize)>>,
}

impl RingSink for LoggingSink {
    fn capacity(&self) -> u64 {
        RingSource::capacity(&self.inner)
    }
    unsafe fn write(&self, offset: u64, bytes: &[u8]) {
        self.writes.lock().unwrap().push((offset, bytes.len()));
        // SAFETY: the caller's obligations, passed on.
        unsafe { self.inner.write(offset, bytes) };
    }
    unsafe fn publish(&self, tail: u64) {
        // SAFETY: as above.
        unsafe { self.inner.publish(tail) };
    }
    fn stage_threshold(&self) -> Option<u64> {
        self.inner.stage_threshold()
    }
    unsafe fn stage(&self, offset: u64, bytes: &[u8]) {
        // Staged bytes land on the same region offsets once published: the same rule applies.
        self.writes.lock().unwrap().push((offset, bytes.len()));
        // SAFETY: as above.
        unsafe { self.inner.stage(offset, bytes) };
    }
    unsafe fn publish_staged(&self, from: u64, tail: u64) {
        // SAFETY: as above.
        unsafe { self.inner.publish_staged(from, tail) };
    }
}

/// What the model expects the consumer to find, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Expect {
    Data {
        pos: u64,
        seq: u64,
        payload: Vec<u8>,
    },
    Abandoned {
        pos: u64,
        seq: u64,
        len: u32,
    },
    WrapPad {
        pos: u64,
        bytes: u64,
    },
}

impl Expect {
    fn span(&self) -> (u64, u64) {
        match self {
            Expect::Data { pos, payload, .. } => (*pos, record_size(payload.len() as u32)),
            Expect::Abandoned { pos, len, .. } => (*pos, record_size(*len)),
            Expect::WrapPad { pos, bytes } => (*pos, *bytes),
        }
    }
}

/// A reservation the model knows about.
#[derive(Debug, Clone)]
pub struct Pending {
    start: u64,
    pos: u64,
    end: u64,
    seq: u64,
    payload: Vec<u8>,
    /// Finished but not yet published (an earlier reservation is still open): committed or not.
    finished: Option<bool>,
}

/// The model: plain counters, a queue of open reservations, a queue of published records, and a
/// map of which region bytes hold published, unconsumed records.
pub struct Model {
    cap: u64,
    mode: WrapMode,
    reserved: u64,
    published: u64,
    /// What the ring knows the consumer has released (its `reclaimed`).
    head: u64,
    /// Where the consumer is: the head word it publishes (at or past `head`).
    consumed: u64,
    next_seq: u64,
    consumer_seq: u64,
    open: VecDeque<Pending>,
    unconsumed: VecDeque<Expect>,
    live: Vec<bool>,
    /// Whether a producer owns the ring, and what it wrote but has not published.
    claimed: bool,
    pending: Vec<(Expect, u64)>,
}

impl Model {
    fn new(cap: u64, mode: WrapMode) -> Self {
        Model {
            cap,
            mode,
            reserved: 0,
            published: 0,
            head: 0,
            consumed: 0,
            next_seq: 0,
            consumer_seq: 0,
            open: VecDeque::new(),
            unconsumed: VecDeque::new(),
            live: vec![false; cap as usize],
            claimed: false,
            pending: Vec::new(),
        }
    }

    fn set_live(&mut self, e: &Expect, v: bool) {
        let (pos, size) = e.span();
        let off = pos % self.cap;
        assert!(
            self.mode == WrapMode::Mirrored || off + size <= self.cap,
            "record crosses the end: {e:?}"
        );
        for i in 0..size {
            self.live[((off + i) % self.cap) as usize] = v;
        }
    }

    fn publish(&mut self, e: Expect, end: u64) {
        self.set_live(&e, true);
        self.unconsumed.push_back(e);
        self.published = end;
    }

    /// A producer's flush: everything it wrote becomes visible.
    fn flush(&mut self) {
        for (e, end) in std::mem::take(&mut self.pending) {
            self.publish(e, end);
        }
    }

    /// A producer's record ending at `end` is written (numbered, not yet published).
    fn producer_append(&mut self, e: Expect, end: u64) {
        self.next_seq += 1;
        self.reserved = end;
        self.pending.push((e, end));
    }

    /// Whether a producer's record may end at `end`: with the space the ring knows of, or else
    /// (after publishing what is pending, as the producer does before it waits) with what the
    /// consumer's head word says, read once.
    fn producer_room(&mut self, end: u64) -> bool {
        if end - self.head <= self.cap {
            return true;
        }
        self.flush();
        self.head = self.head.max(self.consumed);
        end - self.head <= self.cap
    }

    /// Where a producer's next record of `size` bytes goes, writing the wrap PAD before it; `None`
    /// when the consumer has not released enough space (a zero timeout).
    fn producer_place(&mut self, size: u64) -> Option<u64> {
        let off = self.reserved % self.cap;
        if self.mode == WrapMode::Padded && off + size > self.cap {
            let pad = self.cap - off;
            if !self.producer_room(self.reserved + pad) {
                return None;
            }
            let e = Expect::WrapPad {
                pos: self.reserved,
                bytes: pad,
            };
            self.reserved += pad;
            self.pending.push((e, self.reserved));
        }
        if !self.producer_room(self.reserved + size) {
            return None;
        }
        Some(self.reserved)
    }

    /// One `try_reserve` of a record of `len` valid bytes by the model's rules, with the lone
    /// wrap PAD it may publish applied.
    fn attempt(&mut self, len: u32) -> Attempt {
        if self.claimed {
            return Attempt::Claimed;
        }
        if self
            .open
            .front()
            .is_some_and(|first| self.next_seq >= first.seq + COMMIT_SLOTS)
        {
            return Attempt::Full; // every commit slot holds an unpublished record
        }
        let cap = self.cap;
        let size = record_size(len);
        let off = self.reserved % cap;
        let pad = (self.mode == WrapMode::Padded && off + size > cap).then(|| cap - off);
        let pos = self.reserved + pad.unwrap_or(0);
        let end = pos + size;
        if end - self.head > cap {
            if let Some(bytes) = pad {
                if self.open.is_empty() && pos - self.head <= cap {
                    let e = Expect::WrapPad {
                        pos: self.reserved,
                        bytes,
                    };
                    self.publish(e, pos);
                    self.reserved = pos;
                }
            }
            return Attempt::Full;
        }
        Attempt::Fits { pad, pos, end }
    }

    /// Whether this (the only) thread holds an open reservation or the producer: a wait would
    /// depend on itself.
    fn holds_something(&self) -> bool {
        self.claimed || self.open.iter().any(|p| p.finished.is_none())
    }

    /// `reserve` with a zero timeout: one attempt; when it finds no room, the consumer's head
    /// word is read, then one more attempt before giving up.
    fn attempt_once_more(&mut self, len: u32) -> Result<(Option<u64>, u64, u64), RingError> {
        let mut got = self.attempt(len);
        if !matches!(got, Attempt::Fits { .. }) {
            self.head = self.head.max(self.consumed);
            got = self.attempt(len);
        }
        match got {
            Attempt::Fits { pad, pos, end } => Ok((pad, pos, end)),
            _ if self.holds_something() => Err(RingError::WouldDeadlock),
            _ => Err(RingError::Timeout),
        }
    }

    /// Publishes the finished reservations at the front of the queue (every ready one, in
    /// order), as the ring's commit combining does.
    fn drain(&mut self, open: &mut VecDeque<Option<Reservation<'_, LoggingSink>>>) {
        while self.open.front().is_some_and(|p| p.finished.is_some()) {
            let p = self.open.pop_front().expect("checked");
            open.pop_front();
            if p.pos != p.start {
                let e = Expect::WrapPad {
                    pos: p.start,
                    bytes: p.pos - p.start,
                };
                self.set_live(&e, true);
                self.unconsumed.push_back(e);
            }
            let e = if p.finished == Some(true) {
                Expect::Data {
                    pos: p.pos,
                    seq: p.seq,
                    payload: p.payload,
                }
            } else {
                Expect::Abandoned {
                    pos: p.pos,
                    seq: p.seq,
                    len: p.payload.len() as u32,
                }
            };
            self.publish(e, p.end);
        }
    }
}

/// What one reservation attempt finds.
enum Attempt {
    Claimed,
    Full,
    Fits {
        /// Bytes of the wrap PAD before the record.
        pad: Option<u64>,
        pos: u64,
        end: u64,
    },
}

/// Lengths a producer is asked for (the last class, near `u32::MAX`, would need a 4 GiB slice).
pub fn producer_len(class: u8, raw: u32, cap: u64) -> u32 {
    pick_len(class.min(6), raw, cap)
}

pub fn producer_write(p: &mut Producer<'_, LoggingSink>, m: &mut Model, len: u32, bound: u8) {
    let max = (m.cap - 16) as u32;
    let bound = [0, 64, 1024, u64::MAX][bound as usize % 4];
    p.set_policy(FlushPolicy {
        max_pending_bytes: bound,
        max_delay: None,
    });
    let payload = make_payload(len, m.next_seq);
    let got = p.write(&payload, Some(Duration::ZERO));
    if len == 0 {
        assert_eq!(got, Err(RingError::ZeroLength));
        return;
    }
    if len > max {
        assert_eq!(got, Err(RingError::RecordTooLarge { len, max }));
        return;
    }
    let Some(pos) = m.producer_place(record_size(len)) else {
        assert_eq!(got, Err(RingError::Timeout));
        return;
    };
    assert_eq!(got, Ok(m.next_seq));
    let seq = m.next_seq;
    m.producer_append(Expect::Data { pos, seq, payload }, pos + record_size(len));
    if m.reserved - m.published >= bound {
        m.flush();
    }
}

pub fn producer_abandon(p: &mut Producer<'_, LoggingSink>, m: &mut Model, len: u32) {
    let max = (m.cap - 16) as u32;
    let got = p.reserve(len, Some(Duration::ZERO));
    if len == 0 || len > max {
        assert!(got.is_err());
        return;
    }
    let Some(pos) = m.producer_place(record_size(len)) else {
        assert_eq!(got.err(), Some(RingError::Timeout));
        return;
    };
    let r = got.expect("model says it fits");
    assert_eq!((r.pos(), r.seq(), r.len()), (pos, m.next_seq, len));
    drop(r);
    let seq = m.next_seq;
    m.producer_append(Expect::Abandoned { pos, seq, len }, pos + record_size(len));
}

/// One step of a model run (the fuzz target derives `Arbitrary` for it).
#[derive(Debug, Clone)]
#[cfg_attr(fuzzing, derive(arbitrary::Arbitrary))]
pub enum Op {
    /// Reserve a record: length class and raw value, whether to write it in two pieces.
    Reserve(u8, u32, bool),
    CommitOldest,
    AbandonOldest,
    /// Finish the newest open reservation first (committed, or abandoned): out of order.
    FinishNewest(bool),
    /// Consume up to this many records and tell the ring.
    Consume(usize),
    /// Consume up to this many records and only publish the head word (the ring learns of it
    /// when a producer asks).
    ConsumeQuietly(usize),
    /// Reserve with a zero timeout (asks the consumer's head word before giving up): length
    /// class and raw value, whether to write it in two pieces.
    ReserveNow(u8, u32, bool),
    /// `push` a whole record with a zero timeout: length class and raw value.
    PushNow(u8, u32),
    /// Claim the ring for a producer.
    Claim,
    /// Producer: append a record (length class and raw value), with a flush bound class.
    ProducerWrite(u8, u32, u8),
    /// Producer: reserve a record in place and drop it (a PAD keeping its seq).
    ProducerAbandon(u8, u32),
    /// Producer: publish what it wrote.
    ProducerFlush,
    /// Producer: how many bytes pending before a large record it stages (a class: 0, 64,
    /// 1024, the sink's own).
    ProducerStageAfter(u8),
    /// Drop the producer (publishes, hands the ring back).
    Release,
}

pub fn pick_len(class: u8, raw: u32, cap: u64) -> u32 {
    let max = (cap - 16) as u32;
    match class {
        0 | 1 => 1 + raw % 64,
        2 => 1 + raw % 1024,
        3 => 1 + raw % max,
        4 => max,
        5 => max + 1,
        6 => 0,
        _ => u32::MAX - raw % 16,
    }
}

/// Payload for record `seq`: a sealed test payload when long enough, else arbitrary bytes.
pub fn make_payload(len: u32, seq: u64) -> Vec<u8> {
    let mut p: Vec<u8> = (0..len as u64)
        .map(|i| (i.wrapping_mul(31) ^ seq.wrapping_mul(131)) as u8)
        .collect();
    seal_test_payload(&mut p, seq);
    p
}

pub type Ring = RingCore<LoggingSink>;

/// The head function the producers get: the consumer's published head word.
pub type HeadWord = AtomicU64;

/// How a reservation is asked for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum How {
    /// `try_reserve`: the ring's own idea of the space only.
    Try,
    /// `reserve` with a zero timeout: the consumer's head is asked before giving up.
    Now,
}

pub fn reserve_step<'a>(
    ring: &'a Ring,
    m: &mut Model,
    open: &mut VecDeque<Option<Reservation<'a, LoggingSink>>>,
    head_word: &HeadWord,
    (len, split, how): (u32, bool, How),
) {
    let got = match how {
        How::Try => ring.try_reserve(len),
        How::Now => ring.reserve(len, Some(Duration::ZERO), &|| {
            Ok(head_word.load(Ordering::Acquire))
        }),
    };
    let cap = m.cap;
    let max = (cap - 16) as u32;
    if len == 0 {
        assert_eq!(got.err(), Some(RingError::ZeroLength));
        return;
    }
    if len > max {
        assert_eq!(got.err(), Some(RingError::RecordTooLarge { len, max }));
        return;
    }
    let want = match how {
        How::Try => match m.attempt(len) {
            Attempt::Claimed => Err(RingError::Claimed),
            Attempt::Full => Err(RingError::Full),
            Attempt::Fits { pad, pos, end } => Ok((pad, pos, end)),
        },
        How::Now => m.attempt_once_more(len),
    };
    let (pad, pos, end) = match want {
        Ok(fits) => fits,
        Err(e) => {
            assert_eq!(got.err(), Some(e));
            return;
        }
    };
    let mut r = got.expect("model says it fits");
    let seq = m.next_seq;
    m.next_seq += 1;
    assert_eq!(
        (r.pos(), r.offset(), r.seq(), r.len()),
        (pos, pos % cap, seq, len)
    );
    assert_eq!(r.end(), end);
    assert_eq!(
        r.header_bytes(),
        RecordHeader {
            len,
            kind: KIND_DATA,
            seq
        }
        .to_bytes()
    );
    assert_eq!(
        r.pad_header(),
        pad.map(|b| (m.reserved % cap, RecordHeader::wrap_pad(b).to_bytes()))
    );
    let payload = make_payload(len, seq);
    let cut = if split { payload.len() / 2 } else { 0 };
    r.write(0, &payload[..cut]).unwrap();
    r.write(cut as u32, &payload[cut..]).unwrap();
    assert!(r.write(len, &[0]).is_err());
    m.open.push_back(Pending {
        start: m.reserved,
        pos,
        end,
        seq,
        payload,
        finished: None,
    });
    m.reserved = end;
    open.push_back(Some(r));
}

/// `push` with a zero timeout: a whole record, committed at once (published once every earlier
/// reservation is finished).
pub fn push_step(
    ring: &Ring,
    m: &mut Model,
    open: &mut VecDeque<Option<Reservation<'_, LoggingSink>>>,
    head_word: &HeadWord,
    len: u32,
) {
    let payload = make_payload(len, m.next_seq);
    let got = ring.push(&payload, Some(Duration::ZERO), &|| {
        Ok(head_word.load(Ordering::Acquire))
    });
    let max = (m.cap - 16) as u32;
    if len == 0 {
        assert_eq!(got, Err(RingError::ZeroLength));
        return;
    }
    if len > max {
        assert_eq!(got, Err(RingError::RecordTooLarge { len, max }));
        return;
    }
    let (_, pos, end) = match m.attempt_once_more(len) {
        Ok(fits) => fits,
        Err(e) => {
            assert_eq!(got, Err(e));
            return;
        }
    };
    let seq = m.next_seq;
    assert_eq!(got, Ok(seq));
    m.next_seq += 1;
    m.open.push_back(Pending {
        start: m.reserved,
        pos,
        end,
        seq,
        payload,
        finished: Some(true),
    });
    m.reserved = end;
    open.push_back(None);
    let front_open = m.open.len() > 1;
    let published_before = m.published;
    m.drain(open);
    if front_open {
        assert_eq!(m.published, published_before, "waits for the oldest");
    }
    assert_eq!(ring.sink().inner.tail(), m.published);
}

/// Commits or abandons the oldest (or newest) unfinished reservation. Records are published once
/// every earlier one is finished, all ready ones together.
pub fn finish_step(
    m: &mut Model,
    open: &mut VecDeque<Option<Reservation<'_, LoggingSink>>>,
    ring: &Ring,
    commit: bool,
    newest: bool,
) {
    let mut unfinished = (0..open.len()).filter(|&i| open[i].is_some());
    let Some(i) = (if newest {
        unfinished.next_back()
    } else {
        unfinished.next()
    }) else {
        return;
    };
    let r = open[i].take().expect("unfinished");
    let end = m.open[i].end;
    if commit {
        assert_eq!(r.commit(), end);
    } else {
        drop(r);
    }
    m.open[i].finished = Some(commit);
    let published_before = m.published;
    m.drain(open);
    if i > 0 {
        assert_eq!(
            m.published, published_before,
            "a later record waits for the oldest"
        );
    }
    assert_eq!(ring.sink().inner.tail(), m.published);
}

/// The consumer reads up to `k` records from where it is, publishes its head word, and tells the
/// ring (`reclaim_to`) when `tell` is set.
pub fn consume_step(m: &mut Model, ring: &Ring, head_word: &HeadWord, k: usize, tell: bool) {
    let sink = &ring.sink().inner;
    let tail = sink.tail();
    assert_eq!(tail, m.published);
    let (from, seq_from) = (m.consumed, m.consumer_seq);
    let mut pos = from;
    let (mut data, mut short) = (0u64, 0u64);
    for _ in 0..k {
        if pos == tail {
            break;
        }
        let (h, next) = next_record_in(sink, pos, tail, m.mode).expect("intact chain");
        let want = m.unconsumed.pop_front().expect("model has a record here");
        match &want {
            Expect::Data {
                pos: p,
                seq,
                payload,
            } => {
                assert_eq!(
                    (pos, h.kind, h.seq, h.len),
                    (*p, KIND_DATA, *seq, payload.len() as u32)
                );
                let mut got = vec![0u8; payload.len()];
                read_wrapped(sink, pos + 16, &mut got);
                assert_eq!(&got, payload, "payload of seq {seq}");
                data += 1;
                if payload.len() < TEST_PREFIX_LEN {
                    short += 1;
                } else {
                    assert!(check_test_payload(&got, *seq));
                }
                m.consumer_seq = seq + 1;
            }
            Expect::Abandoned { pos: p, seq, len } => {
                assert_eq!((pos, h.kind, h.seq, h.len), (*p, KIND_PAD, *seq, *len));
                m.consumer_seq = seq + 1;
            }
            Expect::WrapPad { pos: p, bytes } => {
                assert_eq!(
                    m.mode,
                    WrapMode::Padded,
                    "a mirrored ring writes no wrap PAD"
                );
                assert_eq!((pos, h.kind, h.seq), (*p, KIND_PAD, WRAP_PAD_SEQ));
                assert_eq!(h.record_size(), *bytes);
                assert_eq!(
                    (pos + bytes) % m.cap,
                    0,
                    "wrap PAD ends at the region's end"
                );
            }
        }
        assert_eq!(next, pos + want.span().1);
        m.set_live(&want, false);
        pos = next;
    }
    let before = verify_records_in(sink, from, pos, seq_from, m.mode);
    assert_eq!(before.records, data);
    assert_eq!(before.errors, short, "only short payloads are errors");
    assert_eq!((before.pos, before.next_seq), (pos, m.consumer_seq));
    head_word.store(pos, Ordering::Release);
    m.consumed = pos;
    if tell {
        ring.reclaim_to(pos).unwrap();
        m.head = pos;
    }
}

pub fn check_state(ring: &Ring, m: &Model) {
    assert_eq!(ring.reserved(), m.reserved);
    assert_eq!(ring.committed(), m.published);
    assert_eq!(ring.reclaimed(), m.head);
    assert_eq!(ring.free_space(), m.cap - (m.reserved - m.head));
    assert!(m.reserved - m.head <= m.cap);
    assert!(m.head <= m.consumed && m.consumed <= m.published);
}

/// Every write since the last call must miss the published, unconsumed bytes.
pub fn check_writes(ring: &Ring, m: &Model) {
    let writes = std::mem::take(&mut *ring.sink().writes.lock().unwrap());
    for (off, n) in writes {
        assert!(off + n as u64 <= m.cap, "write past the region: {off}+{n}");
        let hit = m.live[off as usize..off as usize + n].iter().any(|&b| b);
        assert!(!hit, "write {off}+{n} overwrote unconsumed bytes");
    }
}

/// Runs `ops` on a ring of `cap` bytes; with `staging` (record bytes, pending bytes), the sink
/// has a staging copy that claimed producers write records of at least that many bytes into once
/// that many bytes are pending before them (a GPU ring's copy-engine path), so the consumer sees such records only if every staged span was moved into place.
pub fn run_model(cap: u64, mode: WrapMode, staging: Option<(u64, u64)>, ops: Vec<Op>) {
    let head_word = HeadWord::new(0);
    let inner = match staging {
        Some((threshold, after)) => HostSink::with_staging_after(cap, threshold, after).unwrap(),
        None => HostSink::new(cap).unwrap(),
    };
    let sink = LoggingSink {
        inner,
        writes: Mutex::new(Vec::new()),
    };
    let ring = RingCore::with_wrap_mode(cap, sink, mode).unwrap();
    assert_eq!(ring.max_record() as u64, cap - 16);
    let mut m = Model::new(cap, mode);
    let mut open = VecDeque::new();
    let mut producer: Option<Producer<'_, LoggingSink>> = None;
    let head_word = &head_word;
    for op in ops {
        // Writes are checked against the live map as it was before this op published anything.
        let live_before = m.live.clone();
        match op {
            Op::Reserve(class, raw, split) | Op::ReserveNow(class, raw, split) => {
                let how = match op {
                    Op::Reserve(..) => How::Try,
                    _ => How::Now,
                };
                if open.len() < 3 {
                    let len = pick_len(class, raw, cap);
                    reserve_step(&ring, &mut m, &mut open, head_word, (len, split, how));
                }
            }
            Op::PushNow(class, raw) => {
                push_step(
                    &ring,
                    &mut m,
                    &mut open,
                    head_word,
                    producer_len(class, raw, cap),
                );
            }
            Op::CommitOldest => finish_step(&mut m, &mut open, &ring, true, false),
            Op::AbandonOldest => finish_step(&mut m, &mut open, &ring, false, false),
            Op::FinishNewest(commit) => finish_step(&mut m, &mut open, &ring, commit, true),
            Op::Consume(k) => consume_step(&mut m, &ring, head_word, k, true),
            Op::ConsumeQuietly(k) => consume_step(&mut m, &ring, head_word, k, false),
            Op::Claim => {
                if producer.is_none() {
                    let got = ring.claim(|| Ok(head_word.load(Ordering::Acquire)));
                    if m.open.is_empty() {
                        producer = Some(got.expect("no reservation in flight"));
                        m.claimed = true;
                    } else {
                        assert_eq!(got.err(), Some(RingError::Busy));
                    }
                } else {
                    assert_eq!(ring.claim(|| Ok(0)).err(), Some(RingError::Claimed));
                }
            }
            Op::ProducerWrite(class, raw, bound) => {
                if let Some(p) = producer.as_mut() {
                    producer_write(p, &mut m, producer_len(class, raw, cap), bound);
                }
            }
            Op::ProducerAbandon(class, raw) => {
                if let Some(p) = producer.as_mut() {
                    producer_abandon(p, &mut m, producer_len(class, raw, cap));
                }
            }
            Op::ProducerFlush => {
                if let Some(p) = producer.as_mut() {
                    p.flush();
                    m.flush();
                }
            }
            Op::ProducerStageAfter(class) => {
                if let Some(p) = producer.as_mut() {
                    let sink_default = staging.map_or(0, |(_, after)| after);
                    p.set_stage_after([0, 64, 1024, sink_default][class as usize % 4]);
                }
            }
            Op::Release => {
                if producer.take().is_some() {
                    m.flush();
                    m.claimed = false;
                }
            }
        }
        assert_eq!(ring.is_claimed(), m.claimed);
        let live_after = std::mem::replace(&mut m.live, live_before);
        check_writes(&ring, &m);
        m.live = live_after;
        check_state(&ring, &m);
    }
    if producer.take().is_some() {
        m.flush();
        m.claimed = false;
    }
    while !open.is_empty() {
        finish_step(&mut m, &mut open, &ring, false, false);
    }
    consume_step(&mut m, &ring, head_word, usize::MAX, true);
    check_writes(&ring, &m);
    check_state(&ring, &m);
    assert_eq!(ring.free_space(), cap, "empty at the end");
    assert!(m.unconsumed.is_empty());
    assert_eq!(m.consumer_seq, m.next_seq, "every seq reached the consumer");
    assert!(m.live.iter().all(|&b| !b));
}
