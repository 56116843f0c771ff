//! The ring core against a simple model (proptest: shared reservations and the exclusive
//! producer), and a multi-producer stress test (shared reservations interleaved with claimed
//! batches) with a consumer thread verifying every record.
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use vkgdr::ring::core::{
    FlushPolicy, HostSink, Producer, Reservation, RingCore, RingError, RingSink,
};
use vkgdr::ring::layout::{
    check_test_payload, next_record_in, read_wrapped, record_size, seal_test_payload,
    verify_records_in, RecordHeader, RingSource, WrapMode, KIND_DATA, KIND_PAD, TEST_PREFIX_LEN,
    WRAP_PAD_SEQ,
};

/// A [`HostSink`] that logs every write, so the test can check none lands on unconsumed bytes.
struct LoggingSink {
    inner: HostSink,
    writes: Mutex<Vec<(u64, usize)>>,
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
}

/// What the model expects the consumer to find, in order.
#[derive(Debug, Clone, PartialEq)]
enum Expect {
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
struct Pending {
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
struct Model {
    cap: u64,
    mode: WrapMode,
    reserved: u64,
    published: u64,
    head: u64,
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

    /// Where a producer's next record of `size` bytes goes, writing the wrap PAD before it; `None`
    /// (after publishing what is pending, as the producer does before it waits) when the
    /// consumer has not released enough space.
    fn producer_place(&mut self, size: u64) -> Option<u64> {
        let off = self.reserved % self.cap;
        if self.mode == WrapMode::Padded && off + size > self.cap {
            let pad = self.cap - off;
            if self.reserved + pad - self.head > self.cap {
                self.flush();
                return None;
            }
            let e = Expect::WrapPad {
                pos: self.reserved,
                bytes: pad,
            };
            self.reserved += pad;
            self.pending.push((e, self.reserved));
        }
        if self.reserved + size - self.head > self.cap {
            self.flush();
            return None;
        }
        Some(self.reserved)
    }
}

/// Lengths a producer is asked for (the last class, near `u32::MAX`, would need a 4 GiB slice).
fn producer_len(class: u8, raw: u32, cap: u64) -> u32 {
    pick_len(class.min(6), raw, cap)
}

fn producer_write(p: &mut Producer<'_, LoggingSink>, m: &mut Model, len: u32, bound: u8) {
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
    let e = Expect::Data {
        pos,
        seq: m.next_seq,
        payload,
    };
    m.next_seq += 1;
    m.reserved = pos + record_size(len);
    m.pending.push((e, m.reserved));
    if m.reserved - m.published >= bound {
        m.flush();
    }
}

fn producer_abandon(p: &mut Producer<'_, LoggingSink>, m: &mut Model, len: u32) {
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
    let e = Expect::Abandoned {
        pos,
        seq: m.next_seq,
        len,
    };
    m.next_seq += 1;
    m.reserved = pos + record_size(len);
    m.pending.push((e, m.reserved));
}

#[derive(Debug, Clone)]
enum Op {
    /// Reserve a record: length class and raw value, whether to write it in two pieces.
    Reserve(u8, u32, bool),
    CommitOldest,
    AbandonOldest,
    /// Finish the newest open reservation first (committed, or abandoned): out of order.
    FinishNewest(bool),
    /// Consume up to this many records.
    Consume(usize),
    /// Claim the ring for a producer.
    Claim,
    /// Producer: append a record (length class and raw value), with a flush bound class.
    ProducerWrite(u8, u32, u8),
    /// Producer: reserve a record in place and drop it (a PAD keeping its seq).
    ProducerAbandon(u8, u32),
    /// Producer: publish what it wrote.
    ProducerFlush,
    /// Drop the producer (publishes, hands the ring back).
    Release,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u8..8, any::<u32>(), any::<bool>()).prop_map(|(c, v, s)| Op::Reserve(c, v, s)),
        4 => Just(Op::CommitOldest),
        1 => Just(Op::AbandonOldest),
        2 => any::<bool>().prop_map(Op::FinishNewest),
        3 => (1usize..6).prop_map(Op::Consume),
        1 => Just(Op::Claim),
        4 => (0u8..7, any::<u32>(), any::<u8>()).prop_map(|(c, v, b)| Op::ProducerWrite(c, v, b)),
        1 => (0u8..7, any::<u32>()).prop_map(|(c, v)| Op::ProducerAbandon(c, v)),
        1 => Just(Op::ProducerFlush),
        1 => Just(Op::Release),
    ]
}

fn pick_len(class: u8, raw: u32, cap: u64) -> u32 {
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
fn make_payload(len: u32, seq: u64) -> Vec<u8> {
    let mut p: Vec<u8> = (0..len as u64)
        .map(|i| (i.wrapping_mul(31) ^ seq.wrapping_mul(131)) as u8)
        .collect();
    seal_test_payload(&mut p, seq);
    p
}

type Ring = RingCore<LoggingSink>;

fn reserve_step<'a>(
    ring: &'a Ring,
    m: &mut Model,
    open: &mut VecDeque<Option<Reservation<'a, LoggingSink>>>,
    len: u32,
    split: bool,
) {
    let got = ring.try_reserve(len);
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
    if m.claimed {
        assert_eq!(got.err(), Some(RingError::Claimed));
        return;
    }
    let size = record_size(len);
    let off = m.reserved % cap;
    let pad = (m.mode == WrapMode::Padded && off + size > cap).then(|| cap - off);
    let pos = m.reserved + pad.unwrap_or(0);
    let end = pos + size;
    if end - m.head > cap {
        if let Some(bytes) = pad {
            if m.open.is_empty() && pos - m.head <= cap {
                let e = Expect::WrapPad {
                    pos: m.reserved,
                    bytes,
                };
                m.publish(e, pos);
                m.reserved = pos;
            }
        }
        assert_eq!(got.err(), Some(RingError::Full));
        return;
    }
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
        pad.map(|b| (off, RecordHeader::wrap_pad(b).to_bytes()))
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

/// Commits or abandons the oldest (or newest) unfinished reservation. Records are published once
/// every earlier one is finished, all ready ones together.
fn finish_step(
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
    while m.open.front().is_some_and(|p| p.finished.is_some()) {
        let p = m.open.pop_front().expect("checked");
        open.pop_front();
        if p.pos != p.start {
            let e = Expect::WrapPad {
                pos: p.start,
                bytes: p.pos - p.start,
            };
            m.set_live(&e, true);
            m.unconsumed.push_back(e);
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
        m.publish(e, p.end);
    }
    if i > 0 {
        assert_eq!(
            m.published, published_before,
            "a later record waits for the oldest"
        );
    }
    assert_eq!(ring.sink().inner.tail(), m.published);
}

fn consume_step(m: &mut Model, ring: &Ring, k: usize) {
    let sink = &ring.sink().inner;
    let tail = sink.tail();
    assert_eq!(tail, m.published);
    let (from, seq_from) = (m.head, m.consumer_seq);
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
    ring.reclaim_to(pos).unwrap();
    m.head = pos;
}

fn check_state(ring: &Ring, m: &Model) {
    assert_eq!(ring.reserved(), m.reserved);
    assert_eq!(ring.committed(), m.published);
    assert_eq!(ring.reclaimed(), m.head);
    assert_eq!(ring.free_space(), m.cap - (m.reserved - m.head));
    assert!(m.reserved - m.head <= m.cap);
}

/// Every write since the last call must miss the published, unconsumed bytes.
fn check_writes(ring: &Ring, m: &Model) {
    let writes = std::mem::take(&mut *ring.sink().writes.lock().unwrap());
    for (off, n) in writes {
        assert!(off + n as u64 <= m.cap, "write past the region: {off}+{n}");
        let hit = m.live[off as usize..off as usize + n].iter().any(|&b| b);
        assert!(!hit, "write {off}+{n} overwrote unconsumed bytes");
    }
}

fn run_model(cap: u64, mode: WrapMode, ops: Vec<Op>) {
    let sink = LoggingSink {
        inner: HostSink::new(cap).unwrap(),
        writes: Mutex::new(Vec::new()),
    };
    let ring = RingCore::with_wrap_mode(cap, sink, mode).unwrap();
    assert_eq!(ring.max_record() as u64, cap - 16);
    let mut m = Model::new(cap, mode);
    let mut open = VecDeque::new();
    let mut producer: Option<Producer<'_, LoggingSink>> = None;
    for op in ops {
        // Writes are checked against the live map as it was before this op published anything.
        let live_before = m.live.clone();
        match op {
            Op::Reserve(class, raw, split) => {
                if open.len() < 3 {
                    reserve_step(&ring, &mut m, &mut open, pick_len(class, raw, cap), split);
                }
            }
            Op::CommitOldest => finish_step(&mut m, &mut open, &ring, true, false),
            Op::AbandonOldest => finish_step(&mut m, &mut open, &ring, false, false),
            Op::FinishNewest(commit) => finish_step(&mut m, &mut open, &ring, commit, true),
            Op::Consume(k) => consume_step(&mut m, &ring, k),
            Op::Claim => {
                if producer.is_none() {
                    let got = ring.claim(|| Ok(ring.reclaimed()));
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
    consume_step(&mut m, &ring, usize::MAX);
    check_writes(&ring, &m);
    check_state(&ring, &m);
    assert_eq!(ring.free_space(), cap, "empty at the end");
    assert!(m.unconsumed.is_empty());
    assert_eq!(m.consumer_seq, m.next_seq, "every seq reached the consumer");
    assert!(m.live.iter().all(|&b| !b));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn ring_matches_model(
        cap in prop_oneof![Just(4096u64), Just(8192)],
        mode in prop_oneof![Just(WrapMode::Padded), Just(WrapMode::Mirrored)],
        ops in prop::collection::vec(op(), 1..120),
    ) {
        run_model(cap, mode, ops);
    }
}

/// Records per producer attempt; every 97th attempt is abandoned instead of committed.
const PRODUCERS: u64 = 4;
const ATTEMPTS: u64 = 50_000;
const ABANDON_EVERY: u64 = 97;

/// Records a producer writes per claim of the ring (a batch through `Producer`).
const GROUP: u64 = 8;

fn body_byte(producer: u64, counter: u64, j: u64) -> u8 {
    (producer * 31 + counter * 7 + j) as u8
}

/// 28..=300 bytes: seq, checksum, producer id, counter, filler.
fn stress_payload(producer: u64, counter: u64, len: u32, seq: u64) -> Vec<u8> {
    let mut payload = vec![0u8; len as usize];
    payload[16..20].copy_from_slice(&(producer as u32).to_le_bytes());
    payload[20..28].copy_from_slice(&counter.to_le_bytes());
    for (j, b) in payload[28..].iter_mut().enumerate() {
        *b = body_byte(producer, counter, j as u64);
    }
    seal_test_payload(&mut payload, seq).unwrap();
    payload
}

#[test]
fn four_producers_one_consumer() {
    producers_and_consumer(WrapMode::Padded);
}

#[test]
fn four_producers_one_consumer_mirrored() {
    producers_and_consumer(WrapMode::Mirrored);
}

fn producers_and_consumer(mode: WrapMode) {
    const CAP: u64 = 64 << 10;
    let ring = RingCore::with_wrap_mode(CAP, HostSink::new(CAP).unwrap(), mode).unwrap();
    let head = AtomicU64::new(0); // the "pinned host memory" word the consumer publishes
    let limit = Duration::from_secs(120); // a hang fails the test instead of blocking it
    let started = Instant::now();

    let (committed, abandoned) = thread::scope(|s| {
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let (ring, head) = (&ring, &head);
                s.spawn(move || {
                    let reclaim = || Ok(head.load(Ordering::Acquire));
                    let (mut counter, mut dropped, mut batches) = (0u64, 0u64, 0u64);
                    let len_of = |attempt: u64| 28 + (attempt * 2654435761 % 273) as u32;
                    let abandon = |attempt: u64| attempt % ABANDON_EVERY == ABANDON_EVERY - 1;
                    let mut attempt = 0;
                    while attempt < ATTEMPTS {
                        // Every GROUP-th attempt tries to own the ring for a batch of GROUP
                        // records (refused while others' reservations are in flight).
                        let claim = (attempt % GROUP == 0)
                            .then(|| ring.claim(move || Ok(head.load(Ordering::Acquire))).ok())
                            .flatten();
                        if let Some(mut prod) = claim {
                            prod.set_policy(FlushPolicy {
                                max_pending_bytes: 1024,
                                max_delay: None,
                            });
                            let group_end = (attempt + GROUP).min(ATTEMPTS);
                            for a in attempt..group_end {
                                if abandon(a) {
                                    drop(prod.reserve(len_of(a), Some(limit)).unwrap());
                                    dropped += 1;
                                    continue;
                                }
                                let payload =
                                    stress_payload(p, counter, len_of(a), prod.next_seq());
                                prod.write(&payload, Some(limit)).unwrap();
                                counter += 1;
                            }
                            attempt = group_end;
                            batches += 1;
                            continue; // dropping `prod` published the rest
                        }
                        let mut r = ring
                            .reserve(len_of(attempt), Some(limit), &reclaim)
                            .unwrap();
                        if abandon(attempt) {
                            dropped += 1;
                            drop(r);
                            attempt += 1;
                            continue;
                        }
                        let payload = stress_payload(p, counter, len_of(attempt), r.seq());
                        // Two pieces, so a torn record would show.
                        r.write(0, &payload[..20]).unwrap();
                        r.write(20, &payload[20..]).unwrap();
                        r.commit();
                        counter += 1;
                        attempt += 1;
                    }
                    (counter, dropped, batches)
                })
            })
            .collect();

        let consumer = s.spawn(|| {
            let sink = ring.sink();
            let total = PRODUCERS * ATTEMPTS;
            let (mut pos, mut seq, mut data, mut pads) = (0u64, 0u64, 0u64, 0u64);
            let mut crossings = 0u64;
            let mut next_counter = [0u64; PRODUCERS as usize];
            let mut payload = Vec::new();
            while seq < total {
                assert!(started.elapsed() < limit, "consumer starved at seq {seq}");
                let tail = sink.tail();
                if tail == pos {
                    thread::yield_now();
                    continue;
                }
                let report = verify_records_in(sink, pos, tail, seq, mode);
                assert_eq!((report.errors, report.pos), (0, tail), "{report:?}");
                let data_before = data;
                while pos < tail {
                    let (h, next) = next_record_in(sink, pos, tail, mode).unwrap();
                    if h.kind == KIND_PAD && h.seq == WRAP_PAD_SEQ {
                        assert_eq!(mode, WrapMode::Padded);
                        pos = next;
                        continue;
                    }
                    if pos % CAP + (next - pos) > CAP {
                        crossings += 1;
                    }
                    assert_eq!(h.seq, seq, "seq contiguous");
                    seq += 1;
                    if h.kind == KIND_PAD {
                        pads += 1;
                    } else {
                        payload.resize(h.len as usize, 0);
                        read_wrapped(sink, pos + 16, &mut payload);
                        assert!(check_test_payload(&payload, h.seq));
                        let p = u32::from_le_bytes(payload[16..20].try_into().unwrap()) as u64;
                        let c = u64::from_le_bytes(payload[20..28].try_into().unwrap());
                        assert!(p < PRODUCERS);
                        assert_eq!(c, next_counter[p as usize], "producer {p} in order, once");
                        next_counter[p as usize] += 1;
                        for (j, &b) in payload[28..].iter().enumerate() {
                            assert_eq!(b, body_byte(p, c, j as u64), "torn record {}", h.seq);
                        }
                        data += 1;
                    }
                    pos = next;
                }
                assert_eq!((report.records, report.next_seq), (data - data_before, seq));
                head.store(pos, Ordering::Release);
            }
            (data, pads, next_counter, pos, crossings)
        });

        let per: Vec<(u64, u64, u64)> = producers.into_iter().map(|h| h.join().unwrap()).collect();
        let batches: u64 = per.iter().map(|&(_, _, b)| b).sum();
        assert!(batches > 100, "only {batches} claimed batches");
        let (data, pads, counters, end, crossings) = consumer.join().unwrap();
        // ~10 MB through a 64 KiB region: over a hundred laps.
        match mode {
            WrapMode::Padded => assert_eq!(crossings, 0),
            WrapMode::Mirrored => assert!(crossings > 50, "only {crossings} records crossed"),
        }
        for (p, &(c, _, _)) in per.iter().enumerate() {
            assert_eq!(counters[p], c, "producer {p}: every commit arrived");
        }
        assert_eq!(end, ring.committed());
        assert_eq!(pads, per.iter().map(|&(_, d, _)| d).sum::<u64>());
        (data, pads)
    });
    assert_eq!(committed + abandoned, PRODUCERS * ATTEMPTS);
    assert_eq!(abandoned, PRODUCERS * (ATTEMPTS / ABANDON_EVERY));
    ring.reclaim_to(head.load(Ordering::Acquire)).unwrap();
    assert_eq!(ring.free_space(), CAP, "everything consumed");
}
