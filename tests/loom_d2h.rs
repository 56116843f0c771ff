//! Every interleaving of the device → host lane protocol, explored by loom: device producers
//! (the Rust model of `ring_d2h.cuh`) against the CPU consumer.
//!
//! Run with `cargo test -p vkgdr --features loom --test loom_d2h` (scripts/test does). With the
//! `loom` feature the core's atomics and fences come from loom.
//!
//! What is checked in every interleaving: the consumer delivers every record exactly once, in
//! reservation order, each complete (a torn record is never delivered), while producers wait for
//! room on a full lane (two slots, three records: a wrap and back-pressure, the head cache
//! raised by one producer and used by the other); a producer waiting on a lane whose consumer
//! closes gives up instead of hanging. A producer that commits before it writes (the bug the
//! fence-then-commit order prevents) is caught. The same for lanes of tagged slots, whose
//! producers store each word with its tag, in any order, with no fence and no commit. And a
//! slot that a device ignoring the head overwrites while the consumer reads it: the record comes
//! as it was, or the overwrite is reported (torn, by the re-check after the copy, or a bad
//! commit word), never the overwriting record's content (in a committed slot: when the new
//! commit word is stored before the rest, the order the re-check can see).
#![cfg(feature = "loom")]

use loom::sync::Arc;
use loom::thread;
use vkgdr::ring::core::d2h::{
    meta_word, D2hError, DeviceLaneState, HostLane, LaneConsumer, LaneMemory, LaneShape,
    ProducerModel, Refusal, SlotFormat, COMMIT_WORD, META_WORD,
};

/// Two slots of 32 bytes: one header and two payload words, or (tagged) two header words and
/// two payload words of four bytes each.
fn shape(format: SlotFormat) -> LaneShape {
    LaneShape::new(2, 32).unwrap().with_format(format)
}

const COMMITTED: SlotFormat = SlotFormat::Committed;
const TAGGED: SlotFormat = SlotFormat::Tagged;

/// Explores the interleavings of `f` with at most `bound` preemptions.
fn model(bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(bound);
    b.check(f);
}

/// The payload of producer `p`'s `i`-th record: one word that names it (one word keeps the
/// model small; the consumer's copy and re-check are the same for any length).
fn payload(p: u32, i: u32) -> [u8; 8] {
    (u64::from(p + 1) << 32 | u64::from(i + 1)).to_le_bytes()
}

/// Takes `n` records, checking each is complete and that each producer's come in its order.
fn consume(lane: &HostLane, format: SlotFormat, n: u64) {
    let mut consumer = LaneConsumer::new(lane, shape(format)).unwrap();
    let mut next = [0u32; 2];
    let mut seq = 0;
    while seq < n {
        match consumer.try_next().unwrap() {
            Some(rec) => {
                assert_eq!(rec.seq, seq, "in reservation order");
                let p = rec.kind as usize;
                assert_eq!(
                    rec.payload,
                    payload(p as u32, next[p]),
                    "record {seq} complete"
                );
                next[p] += 1;
                seq += 1;
            }
            None => thread::yield_now(),
        }
    }
    assert_eq!(
        consumer.try_next().unwrap(),
        None,
        "nothing more than was published"
    );
}

/// Publishes producer `p`'s `count` records with the model of the device producer.
fn produce(lane: &HostLane, dev: &DeviceLaneState, format: SlotFormat, p: u32, count: u32) {
    let producer = ProducerModel::new(lane, dev, shape(format), u32::MAX);
    for i in 0..count {
        producer
            .publish(p, &payload(p, i))
            .expect("the consumer keeps taking");
    }
}

/// Producers `p` publishing `counts[p]` records each against the consumer.
fn producers_and_consumer(bound: usize, format: SlotFormat, counts: &'static [u32]) {
    model(bound, move || {
        let lane = Arc::new(HostLane::new(shape(format)));
        let dev = Arc::new(DeviceLaneState::new());
        let producers: Vec<_> = (0..counts.len() as u32)
            .map(|p| {
                let (lane, dev) = (lane.clone(), dev.clone());
                thread::spawn(move || produce(&lane, &dev, format, p, counts[p as usize]))
            })
            .collect();
        let total: u32 = counts.iter().sum();
        consume(&lane, format, total.into());
        for p in producers {
            p.join().unwrap();
        }
        assert_eq!((dev.reserved(), dev.gave_up()), (total.into(), 0));
    });
}

/// Two producers race for the reservation and commit in either order.
#[test]
fn two_producers_and_the_consumer() {
    producers_and_consumer(3, COMMITTED, &[1, 1]);
}

/// The same with tagged slots: each word proves its own arrival.
#[test]
fn two_producers_and_the_consumer_tagged() {
    producers_and_consumer(3, TAGGED, &[1, 1]);
}

/// Three records through two slots: the producer waits for the consumer's head and wraps.
#[test]
fn a_producer_wraps_and_waits_for_the_consumer() {
    producers_and_consumer(3, COMMITTED, &[3]);
}

/// The same with tagged slots: a slot's previous lap's words are told from the new record's.
#[test]
fn a_producer_wraps_and_waits_for_the_consumer_tagged() {
    producers_and_consumer(3, TAGGED, &[3]);
}

/// Both waits at once: the second producer may find the lane full of the first's records and
/// use the head cache the first one raised. One preemption: with two, the producers' and the
/// consumer's waits together run past loom's branch limit.
#[test]
fn two_producers_wrap_and_wait_for_the_consumer() {
    producers_and_consumer(1, COMMITTED, &[2, 1]);
}

#[test]
fn two_producers_wrap_and_wait_for_the_consumer_tagged() {
    producers_and_consumer(1, TAGGED, &[2, 1]);
}

#[test]
fn a_waiting_producer_gives_up_when_the_consumer_closes() {
    model(3, || {
        let lane = Arc::new(HostLane::new(shape(COMMITTED)));
        let dev = Arc::new(DeviceLaneState::new());
        let consumer = LaneConsumer::new(&*lane, shape(COMMITTED)).unwrap();
        let producer = {
            let (lane, dev) = (lane.clone(), dev.clone());
            thread::spawn(move || {
                let p = ProducerModel::new(&*lane, &dev, shape(COMMITTED), u32::MAX);
                (0..3)
                    .map(|i| p.publish(0, &payload(0, i)))
                    .collect::<Vec<_>>()
            })
        };
        drop(consumer); // closes without taking anything
        let results = producer.join().unwrap();
        assert_eq!(results, [Ok(0), Ok(1), Err(Refusal::Closed)]);
        assert_eq!((dev.reserved(), dev.gave_up()), (2, 1));
    });
}

/// The bug: the commit word stored before the payload (no fence between them either).
fn produce_committing_first(lane: &HostLane, dev: &DeviceLaneState, p: u32, count: u32) {
    let shape = shape(COMMITTED);
    let producer = ProducerModel::new(lane, dev, shape, u32::MAX);
    let words = lane.slot_words();
    for i in 0..count {
        let seq = producer.reserve(1).unwrap();
        let first = shape.first_word(seq);
        let release = std::sync::atomic::Ordering::Release;
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        words[first + META_WORD].store(meta_word(8, p), relaxed);
        words[first + COMMIT_WORD].store(seq + 1, release);
        words[first + META_WORD + 1].store(u64::from_le_bytes(payload(p, i)), relaxed);
    }
}

#[test]
#[should_panic(expected = "complete")]
fn committing_before_writing_is_caught() {
    model(2, || {
        let lane = Arc::new(HostLane::new(shape(COMMITTED)));
        let dev = Arc::new(DeviceLaneState::new());
        let producer = {
            let (lane, dev) = (lane.clone(), dev.clone());
            thread::spawn(move || produce_committing_first(&lane, &dev, 0, 1))
        };
        consume(&lane, COMMITTED, 1);
        producer.join().unwrap();
    });
}

/// The bug a tag prevents: a tagged slot whose payload word is stored without its record's tag
/// (the previous lap's tag, as a producer that computed the tag from a stale sequence number
/// would): the consumer must wait for the word, never take the old lap's bytes as this
/// record's. With the tag checked, a record whose word never arrives is never delivered.
#[test]
fn a_payload_word_with_an_old_tag_is_never_taken() {
    use vkgdr::ring::core::d2h::tagged_word;
    model(2, || {
        let shape = shape(TAGGED);
        let lane = Arc::new(HostLane::new(shape));
        let dev = Arc::new(DeviceLaneState::new());
        let producer = {
            let (lane, dev) = (lane.clone(), dev.clone());
            thread::spawn(move || {
                let p = ProducerModel::new(&*lane, &dev, shape, u32::MAX);
                p.publish(0, &payload(0, 0)).unwrap();
                // Record 1 goes to slot 1; record 2 to slot 0 again, its second payload word
                // stored with record 0's tag.
                p.publish(0, &payload(0, 1)).unwrap();
                let seq = p.reserve(1).unwrap();
                let words = lane.slot_words();
                let first = shape.first_word(seq);
                let relaxed = std::sync::atomic::Ordering::Relaxed;
                let bytes = payload(0, 2);
                let lo = u32::from_le_bytes(bytes[..4].try_into().unwrap());
                words[first + 2].store(tagged_word(seq, lo), relaxed);
                words[first + 3].store(tagged_word(seq - 2, 0xDEAD), relaxed);
                words[first + 1].store(tagged_word(seq, 0), relaxed);
                words[first].store(tagged_word(seq, 8), relaxed);
            })
        };
        let mut consumer = LaneConsumer::new(&*lane, shape).unwrap();
        let mut taken = 0;
        while taken < 2 {
            match consumer.try_next().unwrap() {
                Some(rec) => {
                    assert_eq!(rec.seq, taken);
                    assert_eq!(rec.payload, payload(0, taken as u32), "complete");
                    taken += 1;
                }
                None => thread::yield_now(),
            }
        }
        producer.join().unwrap();
        // Every word is stored now; one of record 2's is not its own.
        assert_eq!(
            consumer.try_next().unwrap(),
            None,
            "record 2 lacks a word: never taken"
        );
    });
}

/// Record 0's slot is overwritten by record 2 (the slot's next lap) from a device that ignores
/// the head: record 0 is published before the model starts, the device's stores race the
/// consumer's one look at it.
const ROGUE_SEQ: u64 = 2;
const ROGUE_KIND: u32 = 9;

/// What one look at record 0 gave, counted over every execution of a model (std atomics: they
/// outlive loom's executions; one per test, as the tests run at once).
struct Outcomes {
    delivered: std::sync::atomic::AtomicUsize,
    not_yet: std::sync::atomic::AtomicUsize,
    torn: std::sync::atomic::AtomicUsize,
    bad_commit: std::sync::atomic::AtomicUsize,
}

impl Outcomes {
    const fn new() -> Self {
        use std::sync::atomic::AtomicUsize;
        Outcomes {
            delivered: AtomicUsize::new(0),
            not_yet: AtomicUsize::new(0),
            torn: AtomicUsize::new(0),
            bad_commit: AtomicUsize::new(0),
        }
    }

    fn count(counter: &std::sync::atomic::AtomicUsize) {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// `[delivered, not yet, torn, bad commit]`.
    fn counts(&self) -> [usize; 4] {
        [&self.delivered, &self.not_yet, &self.torn, &self.bad_commit]
            .map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// Takes record 0 once: it must come exactly as published, or not yet, or as `Torn`, or as
/// `BadCommit` showing one of the `overwriting` record's header words, and never with any
/// other payload or kind.
fn take_overwritten(lane: &HostLane, shape: LaneShape, overwriting: &[u64], outcomes: &Outcomes) {
    let mut consumer = LaneConsumer::new(lane, shape).unwrap();
    match consumer.try_next() {
        Ok(Some(rec)) => {
            assert_eq!(
                (rec.seq, rec.kind, rec.payload),
                (0, 0, &payload(0, 0)[..]),
                "record 0 delivered with content other than its own"
            );
            Outcomes::count(&outcomes.delivered);
        }
        Ok(None) => Outcomes::count(&outcomes.not_yet),
        Err(D2hError::Torn { seq: 0 }) => Outcomes::count(&outcomes.torn),
        Err(D2hError::BadCommit { seq: 0, found }) => {
            assert!(
                overwriting.contains(&found),
                "BadCommit shows {found:#x}, not a word of the overwriting record"
            );
            Outcomes::count(&outcomes.bad_commit);
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// Runs `rogue` (a device writing into record 0's slot, which the head does not let it touch)
/// against one look of the consumer at record 0, in every interleaving; returns the outcomes.
fn overwritten_while_read(
    format: SlotFormat,
    overwriting: &'static [u64],
    outcomes: &'static Outcomes,
    rogue: fn(&HostLane, &DeviceLaneState),
) -> [usize; 4] {
    // A bound these two short threads never reach (their executions stop growing at six
    // preemptions): every interleaving.
    model(8, move || {
        let shape = shape(format);
        let lane = Arc::new(HostLane::new(shape));
        let dev = Arc::new(DeviceLaneState::new());
        let p = ProducerModel::new(&*lane, &dev, shape, u32::MAX);
        assert_eq!(p.publish(0, &payload(0, 0)), Ok(0));
        let device = {
            let (lane, dev) = (lane.clone(), dev.clone());
            thread::spawn(move || rogue(&lane, &dev))
        };
        take_overwritten(&lane, shape, overwriting, outcomes);
        device.join().unwrap();
    });
    let counts = outcomes.counts();
    println!("{format:?}: [delivered, not yet, torn, bad commit] = {counts:?}");
    assert!(counts[2] > 0, "Torn never reached: {counts:?}");
    counts
}

/// A committed slot overwritten while it is read: the device stores record 2's commit word into
/// record 0's slot, then (ordered after it, as PCIe delivers one requester's posted writes in
/// order: the release fence) a new meta word and payload. In every interleaving the consumer
/// delivers record 0 exactly as published, or reports `BadCommit` (it saw the new commit word
/// at its first load) or `Torn` (at its re-check after the copy), and `Torn` is reached: any
/// overwriting word the copy read comes after the new commit word, which the re-check then
/// sees. (Without that order the copy may read the new payload and the re-check the old commit
/// word.)
///
/// What the re-check does not catch: an overwrite in the protocol's own order, payload first
/// and commit word last (and the write step's store of the commit word's present value, which
/// for record 2 is record 0's commit word, no change), whose commit word lands after the
/// re-check. The consumer then copies the new payload between two loads of an unchanged commit
/// word and delivers it. Nothing in the slot can show that overwrite in time; only the head
/// keeps a device out of a slot being read.
#[test]
fn a_committed_slot_overwritten_while_read_is_torn() {
    static OUTCOMES: Outcomes = Outcomes::new();
    const OVERWRITING: &[u64] = &[LaneShape::commit_of(ROGUE_SEQ)];
    let counts = overwritten_while_read(COMMITTED, OVERWRITING, &OUTCOMES, |lane, _| {
        let shape = shape(COMMITTED);
        let words = lane.slot_words();
        let first = shape.first_word(ROGUE_SEQ);
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        words[first + COMMIT_WORD].store(LaneShape::commit_of(ROGUE_SEQ), relaxed);
        loom::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        words[first + META_WORD].store(meta_word(8, ROGUE_KIND), relaxed);
        words[first + META_WORD + 1].store(u64::from_le_bytes(payload(1, 1)), relaxed);
    });
    assert!(counts[0] > 0 && counts[3] > 0, "{counts:?}");
}

/// A tagged slot overwritten while it is read: the device writes record 2 into record 0's slot
/// (the producer model's write step, for a record the head does not let it write: a shorter
/// payload, another kind, every word with record 2's tag, no fence). In every interleaving
/// the consumer delivers record 0 exactly as published (the tags keep record 2's words out of
/// it), or says not yet (a payload word without record 0's tag while header word 0 still holds
/// it), or reports `BadCommit` (a header word with record 2's tag) or `Torn`: header word 0
/// changed between its first load and the re-check after the payload's, which is reached. The
/// tags alone keep record 2's words out; the re-check is what reports the overwrite (without it
/// these interleavings end in a delivery or a not yet).
#[test]
fn a_tagged_slot_overwritten_while_read_is_torn() {
    use vkgdr::ring::core::d2h::tagged_word;
    static OUTCOMES: Outcomes = Outcomes::new();
    // Its header words: length and kind.
    const OVERWRITING: &[u64] = &[
        tagged_word(ROGUE_SEQ, 4),
        tagged_word(ROGUE_SEQ, ROGUE_KIND),
    ];
    let counts = overwritten_while_read(TAGGED, OVERWRITING, &OUTCOMES, |lane, dev| {
        ProducerModel::new(lane, dev, shape(TAGGED), u32::MAX).write(
            ROGUE_SEQ,
            ROGUE_KIND,
            &payload(1, 1)[..4],
        );
    });
    assert!(counts[0] > 0 && counts[3] > 0, "{counts:?}");
}
