//! The device → host core against models (proptest): device producers whose reservations,
//! word-by-word writes and commits interleave at random with the consumer's takes across many
//! wraps (a half-written record is never delivered, every committed one is, in order, complete),
//! in lanes of committed and of tagged slots; hostile commit words and tagged headers; and the
//! release-token table against a model of every token it issued,
//! with forged, stale and repeated tokens mixed in.

use std::collections::{HashMap, HashSet, VecDeque};

use proptest::prelude::*;
use vkgdr::ring::core::d2h::{
    meta_word, tag_of, tagged_word, D2hError, DeviceLaneState, HostLane, LaneConsumer, LaneMemory,
    LaneShape, ProducerModel, Refusal, ReleaseToken, ReleaseTokens, SlotFormat, TokenError,
    COMMIT_WORD, META_WORD,
};

#[derive(Debug, Clone)]
enum Op {
    /// Producer `p` (if idle) reserves `n` records.
    Reserve(u8, u32),
    /// Producer `p` writes `words` more words of its reservation (header words first per
    /// record).
    Write(u8, u8),
    /// Producer `p`, done writing, fences and commits (in a tagged lane: nothing to do, its
    /// records count once every word is written).
    Commit(u8),
    /// The consumer takes up to `k` records one at a time.
    Take(u8),
    /// The consumer drains up to `k` records.
    Drain(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..3, 1u32..4).prop_map(|(p, n)| Op::Reserve(p, n)),
        4 => (0u8..3, 1u8..6).prop_map(|(p, w)| Op::Write(p, w)),
        2 => (0u8..3).prop_map(Op::Commit),
        2 => (1u8..5).prop_map(Op::Take),
        1 => (1u8..5).prop_map(Op::Drain),
    ]
}

/// The payload of record `seq`: its length and bytes follow from `seq`.
fn record(seq: u64) -> (u32, Vec<u8>) {
    let len = (seq * 13 % 49) as usize;
    let bytes = (0..len)
        .map(|i| (seq as u8).wrapping_mul(31) ^ i as u8)
        .collect();
    ((seq % 5) as u32, bytes)
}

/// The slot words of record `seq` as the device writes them, each with its index in the slot:
/// in a committed slot the meta word, then payload words (the commit word comes with the
/// commit); in a tagged slot the length and kind words, then the payload, four bytes a word,
/// all tagged.
fn record_words(seq: u64, shape: LaneShape) -> Vec<(usize, u64)> {
    let (kind, bytes) = record(seq);
    let words: Vec<u64> = match shape.format() {
        SlotFormat::Committed => std::iter::once(meta_word(bytes.len() as u32, kind))
            .chain(bytes.chunks(8).map(|c| {
                let mut w = [0u8; 8];
                w[..c.len()].copy_from_slice(c);
                u64::from_le_bytes(w)
            }))
            .collect(),
        SlotFormat::Tagged => [bytes.len() as u32, kind]
            .into_iter()
            .chain(bytes.chunks(4).map(|c| {
                let mut w = [0u8; 4];
                w[..c.len()].copy_from_slice(c);
                u32::from_le_bytes(w)
            }))
            .map(|data| tagged_word(seq, data))
            .collect(),
    };
    let first = match shape.format() {
        SlotFormat::Committed => META_WORD,
        SlotFormat::Tagged => 0,
    };
    assert!((first + words.len()) * 8 <= shape.stride() as usize);
    words
        .into_iter()
        .enumerate()
        .map(|(i, w)| (first + i, w))
        .collect()
}

/// A producer's reservation: its records and how many of their words are written.
struct Pending {
    first: u64,
    n: u32,
    written: usize,
    total: usize,
}

fn run(ops: &[Op], shape: LaneShape) {
    let lane = HostLane::new(shape);
    let dev = DeviceLaneState::new();
    let producer = ProducerModel::new(&lane, &dev, shape, 0);
    let mut consumer = LaneConsumer::new(&lane, shape).unwrap();
    let tagged = shape.format() == SlotFormat::Tagged;
    let mut pending: [Option<Pending>; 3] = [None, None, None];
    let mut committed = HashSet::new();
    let mut reserved = 0u64;
    let mut taken = 0u64;
    // The last consumer call was a `try_next` that took a record: the head is one behind until
    // the next call.
    let mut behind = false;

    let check = |seq: u64, kind: u32, payload: &[u8], committed: &HashSet<u64>| {
        assert!(
            committed.contains(&seq),
            "record {seq} delivered before its commit"
        );
        let (want_kind, want) = record(seq);
        assert_eq!(
            (kind, payload),
            (want_kind, &want[..]),
            "record {seq} complete"
        );
    };

    for op in ops {
        match *op {
            Op::Reserve(p, n) => {
                if pending[p as usize].is_some() {
                    continue;
                }
                // Room by the head the producers can see.
                let head = taken - u64::from(behind);
                let room = reserved + u64::from(n) <= head + u64::from(shape.slots());
                match producer.reserve(n) {
                    Ok(first) => {
                        assert!(room, "reserved {n} at {first} past the head {head}");
                        assert_eq!(first, reserved);
                        reserved += u64::from(n);
                        let total = (first..first + u64::from(n))
                            .map(|s| record_words(s, shape).len())
                            .sum();
                        pending[p as usize] = Some(Pending {
                            first,
                            n,
                            written: 0,
                            total,
                        });
                    }
                    Err(Refusal::Stalled) => assert!(!room, "refused with room"),
                    Err(e) => panic!("{e}"),
                }
            }
            Op::Write(p, words) => {
                let Some(r) = &mut pending[p as usize] else {
                    continue;
                };
                // The device writes word by word; the consumer may look between any two.
                let mut flat = Vec::new();
                let mut ends = Vec::new(); // where each record's words end in `flat`
                for seq in r.first..r.first + u64::from(r.n) {
                    let base = shape.first_word(seq);
                    flat.extend(
                        record_words(seq, shape)
                            .into_iter()
                            .map(|(i, w)| (base + i, w)),
                    );
                    ends.push((seq, flat.len()));
                }
                let end = (r.written + words as usize).min(r.total);
                for &(index, w) in &flat[r.written..end] {
                    lane.slot_words()[index].store(w, std::sync::atomic::Ordering::Relaxed);
                }
                r.written = end;
                if tagged {
                    // A tagged record counts once its last word is written, and a reservation
                    // whose words are all written is done: there is no commit to come.
                    committed.extend(ends.iter().filter(|&&(_, e)| e <= end).map(|&(s, _)| s));
                    if end == r.total {
                        pending[p as usize] = None;
                    }
                }
            }
            Op::Commit(p) => {
                if let Some(r) = &pending[p as usize] {
                    if r.written == r.total {
                        producer.commit(r.first, r.n);
                        committed.extend(r.first..r.first + u64::from(r.n));
                        pending[p as usize] = None;
                    }
                }
            }
            Op::Take(k) => {
                for _ in 0..k {
                    match consumer.try_next().unwrap() {
                        Some(rec) => {
                            assert_eq!(rec.seq, taken);
                            check(rec.seq, rec.kind, rec.payload, &committed);
                            taken += 1;
                            behind = true;
                        }
                        None => {
                            assert!(
                                !committed.contains(&taken),
                                "committed record {taken} not delivered"
                            );
                            behind = false;
                            break;
                        }
                    }
                }
            }
            Op::Drain(k) => {
                let mut seqs = Vec::new();
                let n = consumer
                    .drain(k as usize, |rec| {
                        check(rec.seq, rec.kind, rec.payload, &committed);
                        seqs.push(rec.seq);
                    })
                    .unwrap();
                assert_eq!(seqs, (taken..taken + n as u64).collect::<Vec<_>>());
                taken += n as u64;
                behind = false;
                if n < k as usize {
                    assert!(
                        !committed.contains(&taken),
                        "committed record {taken} not delivered"
                    );
                }
            }
        }
        assert_eq!(
            lane.head_word().load(std::sync::atomic::Ordering::Relaxed),
            taken - u64::from(behind),
            "the head is published by the call after a one-record take, or by a drain"
        );
    }
    // Everything still pending is finished and committed; the consumer then takes it all.
    for r in pending.iter_mut().flatten() {
        // Only records not yet written whole: a tagged one that was may have been taken, and
        // its slot handed to a later record.
        let mut end = 0;
        for seq in r.first..r.first + u64::from(r.n) {
            end += record_words(seq, shape).len();
            if end > r.written {
                producer.write(seq, record(seq).0, &record(seq).1);
            }
        }
        producer.commit(r.first, r.n);
        committed.extend(r.first..r.first + u64::from(r.n));
    }
    let n = consumer
        .drain(usize::MAX, |rec| {
            check(rec.seq, rec.kind, rec.payload, &committed)
        })
        .unwrap();
    assert_eq!(
        taken + n as u64,
        reserved,
        "every reserved record delivered once"
    );
    assert_eq!(dev.reserved(), reserved);
}

/// A lane of `shape` whose first `before` records were published and taken (its consumer
/// closed again: the next one resumes at `before`).
fn lane_after(shape: LaneShape, before: u64) -> HostLane {
    let lane = HostLane::new(shape);
    let dev = DeviceLaneState::new();
    let producer = ProducerModel::new(&lane, &dev, shape, 0);
    let mut consumer = LaneConsumer::new(&lane, shape).unwrap();
    for _ in 0..before {
        producer.publish(1, b"x").unwrap();
        consumer.try_next().unwrap().unwrap();
    }
    drop(consumer);
    lane
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn interleaved_producers_and_consumer(ops in proptest::collection::vec(op(), 1..120), slots in 2u32..4) {
        // 4 or 8 slots of 64 bytes: many wraps in 120 operations.
        run(&ops, LaneShape::new(1 << slots, 64).unwrap());
    }

    /// The same in tagged slots (128 bytes: 56-byte payloads), whose records count once
    /// their last word lands, with no commit.
    #[test]
    fn interleaved_producers_and_consumer_tagged(ops in proptest::collection::vec(op(), 1..120), slots in 2u32..4) {
        run(&ops, LaneShape::new(1 << slots, 128).unwrap().with_format(SlotFormat::Tagged));
    }

    /// Whatever a hostile device leaves in the next tagged slot's first word, the consumer
    /// waits while its tag is the previous lap's (or the record's own, its other words not
    /// there yet) and refuses any other tag.
    #[test]
    fn hostile_tagged_headers(before in 0u64..12, found in prop_oneof![0u64..40, any::<u64>(), (0u32..16, any::<u32>()).prop_map(|(t, d)| u64::from(t) << 32 | u64::from(d))]) {
        let shape = LaneShape::new(4, 32).unwrap().with_format(SlotFormat::Tagged);
        let lane = lane_after(shape, before);
        let mut consumer = LaneConsumer::new(&lane, shape).unwrap();
        lane.slot_words()[shape.first_word(before)]
            .store(found, std::sync::atomic::Ordering::Relaxed);
        let got = consumer.try_next().map(|r| r.map(|r| r.seq));
        let tag = (found >> 32) as u32;
        if tag == tag_of(before) || tag == shape.tag_before(before) {
            prop_assert_eq!(got, Ok(None));
        } else {
            prop_assert_eq!(got, Err(D2hError::BadCommit { seq: before, found }));
        }
    }

    /// Whatever a hostile device leaves in the next slot's commit word, the consumer delivers
    /// only the record's own commit, waits on the previous lap's, and refuses the rest.
    #[test]
    fn hostile_commit_words(before in 0u64..12, found in prop_oneof![0u64..40, any::<u64>()]) {
        let shape = LaneShape::new(4, 32).unwrap();
        let lane = lane_after(shape, before);
        let mut consumer = LaneConsumer::new(&lane, shape).unwrap();
        lane.slot_words()[shape.first_word(before) + COMMIT_WORD]
            .store(found, std::sync::atomic::Ordering::Relaxed);
        let got = consumer.try_next().map(|r| r.map(|r| r.seq));
        if found == before + 1 {
            prop_assert_eq!(got, Ok(Some(before)));
        } else if found == shape.commit_before(before) {
            prop_assert_eq!(got, Ok(None));
        } else {
            prop_assert_eq!(got, Err(D2hError::BadCommit { seq: before, found }));
        }
    }
}

#[derive(Debug, Clone)]
enum TokenOp {
    Issue,
    /// Redeem the outstanding token at this index (modulo), if any.
    RedeemOutstanding(usize),
    /// Redeem any token ever issued, at this index (modulo): repeats and stale ones.
    RedeemOld(usize),
    /// Redeem these bits, with the table's tag or as they are.
    RedeemBits(u64, bool),
    /// Revoke the outstanding token at this index.
    Revoke(usize),
}

fn token_op() -> impl Strategy<Value = TokenOp> {
    prop_oneof![
        4 => Just(TokenOp::Issue),
        3 => any::<usize>().prop_map(TokenOp::RedeemOutstanding),
        2 => any::<usize>().prop_map(TokenOp::RedeemOld),
        2 => (any::<u64>(), any::<bool>()).prop_map(|(b, t)| TokenOp::RedeemBits(b, t)),
        1 => any::<usize>().prop_map(TokenOp::Revoke),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Status {
    Outstanding(u32),
    Redeemed,
    Revoked,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn tokens_against_their_model(ops in proptest::collection::vec(token_op(), 1..200)) {
        const TAG: u16 = 0x5a5a;
        let mut table = ReleaseTokens::with_tag(TAG, 6);
        let mut status: HashMap<u64, Status> = HashMap::new();
        let mut issued_order: Vec<u64> = Vec::new();
        let mut outstanding: VecDeque<u64> = VecDeque::new();
        // The newest token of each entry.
        let mut latest: HashMap<u32, u64> = HashMap::new();
        let mut given_back = HashSet::new();
        let mut next_value = 0u32;

        let expect = |bits: u64, status: &HashMap<u64, Status>, latest: &HashMap<u32, u64>| {
            let t = ReleaseToken::from_bits(bits);
            match status.get(&bits) {
                Some(Status::Outstanding(v)) => Ok(*v),
                Some(Status::Redeemed) if latest[&t.entry()] == bits => Err(TokenError::Repeated(bits)),
                Some(_) => Err(TokenError::Stale(bits)),
                None => {
                    let newest = latest.get(&t.entry()).map(|&b| ReleaseToken::from_bits(b).generation());
                    match newest {
                        Some(g) if t.tag() == TAG && t.generation() != 0 && t.generation() < g => {
                            Err(TokenError::Stale(bits))
                        }
                        _ => Err(TokenError::Forged(bits)),
                    }
                }
            }
        };

        for op in ops {
            let bits = match op {
                TokenOp::Issue => {
                    match table.issue(next_value) {
                        Ok(t) => {
                            prop_assert_eq!(t.tag(), TAG);
                            prop_assert!(!status.contains_key(&t.to_bits()), "a token issued twice");
                            status.insert(t.to_bits(), Status::Outstanding(next_value));
                            issued_order.push(t.to_bits());
                            outstanding.push_back(t.to_bits());
                            latest.insert(t.entry(), t.to_bits());
                        }
                        Err(full) => {
                            prop_assert_eq!(full.value, next_value);
                            prop_assert_eq!(outstanding.len(), 6);
                        }
                    }
                    next_value += 1;
                    continue;
                }
                TokenOp::Revoke(i) => {
                    if outstanding.is_empty() {
                        continue;
                    }
                    let bits = outstanding.remove(i % outstanding.len()).unwrap();
                    let Status::Outstanding(v) = status[&bits] else { unreachable!() };
                    prop_assert_eq!(table.revoke(bits), Some(v));
                    prop_assert_eq!(table.revoke(bits), None);
                    status.insert(bits, Status::Revoked);
                    continue;
                }
                TokenOp::RedeemOutstanding(i) if !outstanding.is_empty() => {
                    outstanding[i % outstanding.len()]
                }
                TokenOp::RedeemOld(i) if !issued_order.is_empty() => issued_order[i % issued_order.len()],
                TokenOp::RedeemBits(b, with_tag) => {
                    if with_tag {
                        // The table's tag, a small entry and generation: near misses.
                        ReleaseToken::new(TAG, (b % 8) as u32, ((b >> 8) % 8) as u32).to_bits()
                    } else {
                        b
                    }
                }
                _ => continue,
            };
            let want = expect(bits, &status, &latest);
            let got = table.redeem(bits);
            prop_assert_eq!(got, want, "token {:#x}", bits);
            if let Ok(v) = got {
                prop_assert!(given_back.insert(v), "value {} given back twice", v);
                status.insert(bits, Status::Redeemed);
                outstanding.retain(|&b| b != bits);
            }
        }
        let s = table.stats();
        prop_assert_eq!(s.outstanding(), outstanding.len() as u64);
        prop_assert_eq!(s.issued, issued_order.len() as u64);
        prop_assert_eq!(s.redeemed, given_back.len() as u64);
        let mut left = table.revoke_all();
        left.sort_unstable();
        let mut want: Vec<u32> = outstanding.iter().map(|b| match status[b] {
            Status::Outstanding(v) => v,
            _ => unreachable!(),
        }).collect();
        want.sort_unstable();
        prop_assert_eq!(left, want);
    }
}
