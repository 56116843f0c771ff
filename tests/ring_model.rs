//! The ring core against its model (proptest: shared reservations, `push` and the exclusive
//! producer, waits with a zero timeout that must take the space a consumer freed without telling
//! the ring; the model is `ring_model/model.rs`, shared with the fuzz target), and a
//! multi-producer stress test (shared reservations interleaved with claimed batches) with a
//! consumer thread verifying every record.
#[path = "ring_model/model.rs"]
mod model;

use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use model::{run_model, Op};
use proptest::prelude::*;
use vkgdr::ring::core::{FlushPolicy, HostSink, RingCore};
use vkgdr::ring::layout::{
    check_test_payload, next_record_in, read_wrapped, seal_test_payload, verify_records_in,
    WrapMode, KIND_PAD, WRAP_PAD_SEQ,
};

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u8..8, any::<u32>(), any::<bool>()).prop_map(|(c, v, s)| Op::Reserve(c, v, s)),
        4 => Just(Op::CommitOldest),
        1 => Just(Op::AbandonOldest),
        2 => any::<bool>().prop_map(Op::FinishNewest),
        2 => (1usize..6).prop_map(Op::Consume),
        2 => (1usize..6).prop_map(Op::ConsumeQuietly),
        3 => (0u8..8, any::<u32>(), any::<bool>()).prop_map(|(c, v, s)| Op::ReserveNow(c, v, s)),
        3 => (0u8..7, any::<u32>()).prop_map(|(c, v)| Op::PushNow(c, v)),
        1 => Just(Op::Claim),
        4 => (0u8..7, any::<u32>(), any::<u8>()).prop_map(|(c, v, b)| Op::ProducerWrite(c, v, b)),
        1 => (0u8..7, any::<u32>()).prop_map(|(c, v)| Op::ProducerAbandon(c, v)),
        1 => Just(Op::ProducerFlush),
        1 => any::<u8>().prop_map(Op::ProducerStageAfter),
        1 => Just(Op::Release),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn ring_matches_model(
        cap in prop_oneof![Just(4096u64), Just(8192)],
        mode in prop_oneof![Just(WrapMode::Padded), Just(WrapMode::Mirrored)],
        staging in prop_oneof![
            2 => Just(None),
            1 => Just(Some((16u64, 0u64))),
            1 => Just(Some((160, 0))),
            1 => Just(Some((1024, 0))),
            1 => Just(Some((16, 512))),
            1 => Just(Some((160, 1024))),
        ],
        ops in prop::collection::vec(op(), 1..120),
    ) {
        run_model(cap, mode, staging, ops);
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
