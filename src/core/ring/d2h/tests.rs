//! Unit tests of the device → host core (they run under Miri: `core::ring::` in scripts/test).

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use super::*;
use crate::core::sync::atomic::Ordering;

fn lane(slots: u32, stride: u32) -> (LaneShape, HostLane, DeviceLaneState) {
    let shape = LaneShape::new(slots, stride).unwrap();
    (shape, HostLane::new(shape), DeviceLaneState::new())
}

/// A payload that names its record: `seq` repeated, cut to `len` bytes.
fn payload(seq: u64, len: usize) -> Vec<u8> {
    seq.to_le_bytes()
        .iter()
        .copied()
        .cycle()
        .take(len)
        .collect()
}

#[test]
fn shapes() {
    assert!(LaneShape::new(2, 32).is_ok());
    assert!(LaneShape::new(MAX_SLOTS, MAX_STRIDE).is_ok());
    for (slots, stride) in [
        (1, 64),
        (3, 64),
        (4, 16),
        (4, 48),
        (MAX_SLOTS * 2, 64),
        (4, MAX_STRIDE * 2),
    ] {
        assert_eq!(
            LaneShape::new(slots, stride),
            Err(D2hError::InvalidShape { slots, stride })
        );
    }
    let s = LaneShape::new(4, 64).unwrap();
    assert_eq!(
        (s.commit_before(3), s.commit_before(4), s.commit_before(9)),
        (0, 1, 6)
    );
    assert_eq!(s.first_word(5), 8);
    let other = HostLane::new(LaneShape::new(8, 64).unwrap());
    assert_eq!(
        LaneConsumer::new(&other, s).err(),
        Some(D2hError::MemoryMismatch {
            expected: 32,
            found: 64
        })
    );
}

/// Forty records of every length up to the lane's largest through a lane of four slots, three
/// published then three taken: the lane wraps every fourth record, and a slot holds stale words
/// of a longer record before.
fn records_through_wraps(shape: LaneShape) {
    let (lane, dev) = (HostLane::new(shape), DeviceLaneState::new());
    let producer = ProducerModel::new(&lane, &dev, shape, 0);
    let mut consumer = LaneConsumer::new(&lane, shape).unwrap();
    let len_of = |seq: u64| (seq as usize * 7) % (shape.max_payload() as usize + 1);
    for seq in 0..40u64 {
        assert_eq!(
            producer.publish(seq as u32, &payload(seq, len_of(seq))),
            Ok(seq)
        );
        if seq % 3 == 2 {
            for want in seq - 2..=seq {
                assert!(consumer.is_ready());
                let rec = consumer.try_next().unwrap().expect("published");
                assert_eq!((rec.seq, rec.kind), (want, want as u32));
                assert_eq!(rec.payload, &payload(want, len_of(want))[..]);
            }
            assert!(!consumer.is_ready());
            assert_eq!(consumer.try_next(), Ok(None));
        }
    }
    assert_eq!(lane.head_word().load(Ordering::Relaxed), 39);
}

#[test]
fn records_in_order_through_many_wraps() {
    records_through_wraps(LaneShape::new(4, 64).unwrap());
}

#[test]
fn a_full_lane_refuses_without_reserving() {
    let (shape, lane, dev) = lane(2, 32);
    let producer = ProducerModel::new(&lane, &dev, shape, 3);
    let mut consumer = LaneConsumer::new(&lane, shape).unwrap();
    producer.publish_many(&[(1, b"a"), (1, b"b")]).unwrap();
    assert_eq!(producer.publish(1, b"c"), Err(Refusal::Stalled));
    assert_eq!(
        (dev.reserved(), dev.gave_up()),
        (2, 1),
        "nothing reserved by the refusal"
    );
    assert_eq!(consumer.try_next().unwrap().unwrap().payload, b"a");
    // The head passes a record taken by a one-record call at the consumer's next call.
    assert_eq!(lane.head_word().load(Ordering::Relaxed), 0);
    assert_eq!(producer.publish(1, b"c"), Err(Refusal::Stalled));
    assert_eq!(consumer.drain(0, |_| panic!("max 0")), Ok(0));
    assert_eq!(lane.head_word().load(Ordering::Relaxed), 1);
    consumer.publish_head(); // nothing new: the same head again
    assert_eq!(lane.head_word().load(Ordering::Relaxed), 1);
    assert_eq!(
        producer.publish(1, b"c"),
        Ok(2),
        "room again once the head moved"
    );
    assert_eq!(
        producer.publish(1, &[0; 17]),
        Err(Refusal::TooLarge { len: 17, max: 16 })
    );
    assert_eq!(Refusal::Stalled.status(), STATUS_STALLED);
    consumer.close();
    assert_eq!(producer.publish(1, b"d"), Err(Refusal::Closed));
    assert_eq!(dev.gave_up(), 3);
    drop(consumer);
    // A new consumer resumes at the published head and reopens the lane.
    let mut consumer = LaneConsumer::new(&lane, shape).unwrap();
    assert_eq!(consumer.next_seq(), 1);
    let mut got = Vec::new();
    assert_eq!(consumer.drain(10, |r| got.push(r.payload.to_vec())), Ok(2));
    assert_eq!(got, [b"b".to_vec(), b"c".to_vec()]);
    assert_eq!(producer.publish(1, b"d"), Ok(3));
    drop(consumer);
    assert_eq!(
        lane.closed_word().load(Ordering::Relaxed),
        1,
        "a dropped consumer closes"
    );
}

#[test]
fn protocol_breaches_are_final_and_deliver_nothing() {
    let (shape, lane, dev) = lane(4, 32);
    let producer = ProducerModel::new(&lane, &dev, shape, 0);
    let mut consumer = LaneConsumer::new(&lane, shape).unwrap();
    producer.publish(0, b"ok").unwrap();
    assert!(consumer.try_next().unwrap().is_some());
    // A commit word from two laps ahead: the device ran past the head.
    lane.slot_words()[shape.first_word(1)].store(10, Ordering::Relaxed);
    assert!(consumer.is_ready());
    let e = D2hError::BadCommit { seq: 1, found: 10 };
    assert_eq!(consumer.try_next(), Err(e.clone()));
    assert_eq!(consumer.drain(4, |_| panic!("delivered")), Err(e));

    let (shape, lane) = lane_with_record(0, meta_word(17, 0));
    let mut consumer = LaneConsumer::new(&lane, shape).unwrap();
    assert_eq!(
        consumer.try_next(),
        Err(D2hError::BadLength {
            seq: 0,
            len: 17,
            max: 16
        })
    );
}

/// A lane whose slot 0 holds a committed record 0 with the given meta word.
fn lane_with_record(seq: u64, meta: u64) -> (LaneShape, HostLane) {
    let shape = LaneShape::new(4, 32).unwrap();
    let lane = HostLane::new(shape);
    let first = shape.first_word(seq);
    lane.slot_words()[first + META_WORD].store(meta, Ordering::Relaxed);
    lane.slot_words()[first + COMMIT_WORD].store(seq + 1, Ordering::Relaxed);
    (shape, lane)
}

/// Three producer threads publish `per_thread` records of `len` bytes each into a lane of
/// `shape` while the consumer takes them, one at a time or (`drain`) two at a time: every
/// record once, in order, each thread's in its order.
fn producers_and_a_consumer(shape: LaneShape, len: usize, drain: bool) {
    // Miri runs this too: a few records per thread keep it short there.
    let per_thread: u64 = if cfg!(miri) { 6 } else { 2000 };
    let (lane, dev) = (
        Arc::new(HostLane::new(shape)),
        Arc::new(DeviceLaneState::new()),
    );
    let producers: Vec<_> = (0..3u32)
        .map(|t| {
            let (lane, dev) = (lane.clone(), dev.clone());
            thread::spawn(move || {
                let p = ProducerModel::new(&*lane, &dev, shape, u32::MAX);
                for i in 0..per_thread {
                    let body = payload(u64::from(t) << 32 | i, len);
                    p.publish(t, &body).expect("the consumer keeps up");
                }
            })
        })
        .collect();
    let mut consumer = LaneConsumer::new(lane.clone(), shape).unwrap();
    let mut next = [0u64; 3];
    let mut seq = 0;
    while seq < 3 * per_thread {
        let mut got = Vec::new();
        if drain {
            consumer
                .drain(2, |rec| got.push((rec.seq, rec.kind, rec.payload.to_vec())))
                .unwrap();
        } else if let Some(rec) = consumer.try_next().unwrap() {
            got.push((rec.seq, rec.kind, rec.payload.to_vec()));
        }
        if got.is_empty() {
            thread::yield_now();
        }
        for (s, kind, body) in got {
            assert_eq!(s, seq);
            let t = kind as usize;
            assert_eq!(body, payload((t as u64) << 32 | next[t], len));
            next[t] += 1;
            seq += 1;
        }
    }
    for p in producers {
        p.join().unwrap();
    }
    assert_eq!(next, [per_thread; 3], "each thread's records in its order");
    assert_eq!(dev.gave_up(), 0);
}

#[test]
fn producers_and_a_consumer_on_threads() {
    producers_and_a_consumer(LaneShape::new(4, 64).unwrap(), 32, false);
}

#[test]
fn tokens_give_each_value_back_once() {
    let mut t = ReleaseTokens::with_tag(7, 2);
    let a = t.issue('a').unwrap();
    let b = t.issue('b').unwrap();
    assert_eq!((a.tag(), a.entry(), a.generation()), (7, 0, 1));
    assert_eq!((b.entry(), b.generation()), (1, 1));
    let full = t.issue('c').unwrap_err();
    assert_eq!((full.value, full.max), ('c', 2));
    assert_eq!(t.redeem(a.to_bits()), Ok('a'));
    assert_eq!(
        t.redeem(a.to_bits()),
        Err(TokenError::Repeated(a.to_bits()))
    );
    let c = t.issue('c').unwrap();
    assert_eq!(
        (c.entry(), c.generation()),
        (0, 2),
        "entry 0 again, next generation"
    );
    assert_eq!(t.redeem(a.to_bits()), Err(TokenError::Stale(a.to_bits())));
    // Other tables' tokens, unissued entries and generations, and 0.
    for forged in [
        ReleaseToken::new(8, 0, 2),
        ReleaseToken::new(7, 5, 1),
        ReleaseToken::new(7, 1, 2),
        ReleaseToken::new(7, 1, 0),
        ReleaseToken::from_bits(0),
    ] {
        let bits = forged.to_bits();
        assert_eq!(t.redeem(bits), Err(TokenError::Forged(bits)));
    }
    assert_eq!(t.revoke(b.to_bits()), Some('b'));
    assert_eq!(t.revoke(b.to_bits()), None);
    assert_eq!(t.redeem(b.to_bits()), Err(TokenError::Stale(b.to_bits())));
    assert_eq!(t.revoke_all(), ['c']);
    let s = t.stats();
    assert_eq!(
        (s.issued, s.redeemed, s.revoked, s.forged, s.stale, s.repeated),
        (3, 1, 2, 5, 2, 1)
    );
    assert_eq!((s.outstanding(), s.refused()), (0, 8));
    assert_ne!(
        ReleaseTokens::<()>::new().tag(),
        ReleaseTokens::<()>::new().tag()
    );
}

#[test]
fn poll_says_pending_then_ended_once_producers_finish() {
    let (shape, lane, dev) = lane(4, 64);
    let producer = ProducerModel::new(&lane, &dev, shape, 0);
    let mut consumer = LaneConsumer::new(&lane, shape).unwrap();
    assert_eq!(consumer.poll().unwrap(), Poll::Pending);
    producer.publish(3, &payload(0, 9)).unwrap();
    lane.finish();
    // A record committed before the finish is still delivered, then the lane ends.
    let rec = consumer
        .poll()
        .unwrap()
        .record()
        .expect("published before the finish");
    assert_eq!((rec.seq, rec.kind, rec.payload), (0, 3, &payload(0, 9)[..]));
    assert_eq!(consumer.poll().unwrap(), Poll::Ended);
    assert_eq!(
        consumer.next_timeout(Duration::from_secs(60)).unwrap(),
        Poll::Ended,
        "an ended lane does not wait"
    );
}

#[test]
fn next_timeout_gives_up_when_nothing_comes() {
    let (shape, lane, _) = lane(4, 64);
    let mut consumer = LaneConsumer::new(&lane, shape).unwrap();
    let start = std::time::Instant::now();
    let wait = Duration::from_millis(5);
    assert_eq!(consumer.next_timeout(wait).unwrap(), Poll::Pending);
    assert!(
        start.elapsed() >= wait,
        "returned after {:?}",
        start.elapsed()
    );
    assert_eq!(
        consumer.next_timeout(Duration::ZERO).unwrap(),
        Poll::Pending
    );
}

#[test]
fn records_iterator_takes_everything_from_another_thread_then_ends() {
    const N: u64 = 200;
    let (shape, lane, dev) = lane(8, 32);
    let (lane, dev) = (Arc::new(lane), Arc::new(dev));
    let mut consumer = LaneConsumer::new(Arc::clone(&lane), shape).unwrap();
    let producer = {
        let (lane, dev) = (Arc::clone(&lane), Arc::clone(&dev));
        thread::spawn(move || {
            let p = ProducerModel::new(&*lane, &dev, shape, u32::MAX);
            for seq in 0..N {
                p.publish(1, &payload(seq, 16)).unwrap();
            }
            lane.finish();
        })
    };
    let got: Vec<RecordBuf> = consumer.records().collect::<Result<_, _>>().unwrap();
    producer.join().unwrap();
    assert_eq!(got.len() as u64, N);
    for (seq, rec) in (0..N).zip(&got) {
        assert_eq!((rec.seq, rec.kind), (seq, 1));
        assert_eq!(rec.payload, payload(seq, 16));
    }
}

#[test]
fn records_iterator_yields_a_broken_lane_once() {
    let (shape, lane, _) = lane(4, 64);
    // A commit word of no lap: record 0's slot claims record 7.
    lane.slot_words()[COMMIT_WORD].store(8, Ordering::Release);
    let mut consumer = LaneConsumer::new(&lane, shape).unwrap();
    let mut it = consumer.records();
    assert_eq!(
        it.next(),
        Some(Err(D2hError::BadCommit { seq: 0, found: 8 }))
    );
    assert_eq!(it.next(), None);
}

#[test]
fn a_views_bytes_are_its_repr_c_layout() {
    let v = D2hDeviceView {
        slots_addr: 0x0102_0304_0506_0708,
        control_addr: 0x1112_1314_1516_1718,
        device_addr: 0x2122_2324_2526_2728,
        slots: 0x3132_3334,
        stride: 0x4142_4344,
        lanes: 0x5152_5354,
        spin_limit: 0x6162_6364,
        format: 0x7172_7374,
        reserved: 0x7576_7778,
    };
    // Each field at its repr(C) offset (the kernel's vkgdr_d2h_view), little-endian.
    use std::mem::offset_of;
    let b = v.to_bytes();
    let at = |offset: usize, bytes: &[u8]| assert_eq!(&b[offset..offset + bytes.len()], bytes);
    at(
        offset_of!(D2hDeviceView, slots_addr),
        &v.slots_addr.to_le_bytes(),
    );
    at(
        offset_of!(D2hDeviceView, control_addr),
        &v.control_addr.to_le_bytes(),
    );
    at(
        offset_of!(D2hDeviceView, device_addr),
        &v.device_addr.to_le_bytes(),
    );
    at(offset_of!(D2hDeviceView, slots), &v.slots.to_le_bytes());
    at(offset_of!(D2hDeviceView, stride), &v.stride.to_le_bytes());
    at(offset_of!(D2hDeviceView, lanes), &v.lanes.to_le_bytes());
    at(
        offset_of!(D2hDeviceView, spin_limit),
        &v.spin_limit.to_le_bytes(),
    );
    at(offset_of!(D2hDeviceView, format), &v.format.to_le_bytes());
    at(
        offset_of!(D2hDeviceView, reserved),
        &v.reserved.to_le_bytes(),
    );
    assert_eq!(
        offset_of!(D2hDeviceView, format),
        40,
        "vkgdr_d2h_view's format"
    );
}

fn tagged_lane(slots: u32, stride: u32) -> (LaneShape, HostLane, DeviceLaneState) {
    let (shape, lane, dev) = lane(slots, stride);
    (shape.with_format(SlotFormat::Tagged), lane, dev)
}

#[test]
fn tagged_shapes_and_words() {
    let s = LaneShape::new(4, 64).unwrap();
    assert_eq!(s.format(), SlotFormat::Committed);
    let t = s.with_format(SlotFormat::Tagged);
    assert_eq!((s.max_payload(), t.max_payload()), (48, 24));
    assert_eq!(
        LaneShape::new(2, 32)
            .unwrap()
            .with_format(SlotFormat::Tagged)
            .max_payload(),
        8
    );
    assert_eq!((t.slots(), t.stride(), t.bytes()), (4, 64, 256));
    assert_eq!(
        (t.tag_before(3), t.tag_before(4), t.tag_before(9)),
        (0, 1, 6)
    );
    assert_eq!(
        (tag_of(0), tag_of(u64::from(u32::MAX)), tag_of(1 << 32)),
        (1, 0, 1)
    );
    assert_eq!(tagged_word(2, 0xAABB_CCDD), 0x0000_0003_AABB_CCDD);
    for f in [SlotFormat::Committed, SlotFormat::Tagged] {
        assert_eq!(SlotFormat::from_code(f.code()), Some(f));
    }
    assert_eq!(SlotFormat::from_code(2), None);
    assert_eq!(SlotFormat::default(), SlotFormat::Committed);
}

#[test]
fn tagged_records_in_order_through_many_wraps() {
    let (shape, lane, dev) = tagged_lane(4, 64);
    assert_eq!(
        ProducerModel::new(&lane, &dev, shape, 0).publish(0, &[0; 25]),
        Err(Refusal::TooLarge { len: 25, max: 24 })
    );
    records_through_wraps(shape);
}

#[test]
fn a_tagged_record_waits_for_every_word() {
    let (shape, lane, dev) = tagged_lane(4, 64);
    let producer = ProducerModel::new(&lane, &dev, shape, 0);
    let mut consumer = LaneConsumer::new(&lane, shape).unwrap();
    // Record 0 arrives word by word, its header first: nothing is taken until the last one.
    let seq = producer.reserve(1).unwrap();
    let body = payload(7, 12);
    let words = lane.slot_words();
    let word = |i: usize| u32::from_le_bytes(body[4 * i..4 * i + 4].try_into().unwrap());
    words[0].store(tagged_word(seq, 12), Ordering::Relaxed);
    assert!(consumer.is_ready(), "the first word has arrived");
    assert_eq!(consumer.try_next(), Ok(None));
    words[1].store(tagged_word(seq, 5), Ordering::Relaxed);
    words[2].store(tagged_word(seq, word(0)), Ordering::Relaxed);
    words[4].store(tagged_word(seq, word(2)), Ordering::Relaxed);
    assert_eq!(consumer.try_next(), Ok(None), "word 3 is missing");
    // A word of the wrong record (its tag not the record's) does not count either.
    words[3].store(tagged_word(seq + 4, word(1)), Ordering::Relaxed);
    assert_eq!(consumer.try_next(), Ok(None));
    words[3].store(tagged_word(seq, word(1)), Ordering::Relaxed);
    let rec = consumer.try_next().unwrap().expect("every word is there");
    assert_eq!((rec.seq, rec.kind, rec.payload), (0, 5, &body[..]));
    // Record 1's header from a later lap: a device past the head, final.
    words[8].store(tagged_word(5, 0), Ordering::Relaxed);
    let e = D2hError::BadCommit {
        seq: 1,
        found: tagged_word(5, 0),
    };
    assert_eq!(consumer.try_next(), Err(e.clone()));
    assert_eq!(consumer.drain(4, |_| panic!("delivered")), Err(e));
}

#[test]
fn a_tagged_header_that_lies_is_refused() {
    let (shape, lane, _) = tagged_lane(4, 32);
    let mut consumer = LaneConsumer::new(&lane, shape).unwrap();
    lane.slot_words()[0].store(tagged_word(0, 9), Ordering::Relaxed);
    lane.slot_words()[1].store(tagged_word(0, 1), Ordering::Relaxed);
    assert_eq!(
        consumer.try_next(),
        Err(D2hError::BadLength {
            seq: 0,
            len: 9,
            max: 8
        })
    );
}

#[test]
fn tagged_producers_and_a_consumer_on_threads() {
    let shape = LaneShape::new(4, 64)
        .unwrap()
        .with_format(SlotFormat::Tagged);
    producers_and_a_consumer(shape, 24, true);
}
