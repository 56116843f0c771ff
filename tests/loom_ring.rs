//! Every interleaving of the ring core's commit/publish protocol, explored by loom.
//!
//! Run with `cargo test -p vkgdr --features loom --test loom_ring` (scripts/test does). With the
//! `loom` feature the core's atomics and mutex come from loom (`crate::core::sync`) and it has 2
//! commit slots, so the slot wrap-around is reached with 3 records.
//!
//! What is checked in every interleaving: a consumer that sees a tail finds every record below it
//! complete (header and payload: the publication's release/acquire chain covers other threads'
//! records), tails only grow, and when the producers are done nothing is left unpublished (no
//! lost hand-over of the publisher role). Against a consumer freeing space at the same time, a
//! wait with a zero timeout (shared `reserve`, a producer's `push`) takes the space whenever the
//! consumer had published its head before the call began.
#![cfg(feature = "loom")]

use std::time::Duration;

use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;
use vkgdr::ring::core::{RingCore, RingError, RingSink};
use vkgdr::ring::layout::{next_record, RingSource, KIND_DATA};

const CAP: u64 = 4096;

/// A host sink of 8-byte relaxed atomic words (the test writes whole words only), so a record
/// costs loom four operations instead of thirty-two; the tail is a release/acquire pair, as in
/// `HostSink`.
struct WordSink {
    words: Vec<AtomicU64>,
    tail: AtomicU64,
}

impl WordSink {
    fn new() -> Self {
        WordSink {
            words: (0..CAP / 8).map(|_| AtomicU64::new(0)).collect(),
            tail: AtomicU64::new(0),
        }
    }

    fn tail(&self) -> u64 {
        self.tail.load(Ordering::Acquire)
    }
}

impl RingSink for WordSink {
    fn capacity(&self) -> u64 {
        CAP
    }

    unsafe fn write(&self, offset: u64, bytes: &[u8]) {
        assert!(
            offset.is_multiple_of(8) && bytes.len().is_multiple_of(8),
            "whole words only"
        );
        for (i, w) in bytes.chunks_exact(8).enumerate() {
            let v = u64::from_le_bytes(w.try_into().unwrap());
            self.words[offset as usize / 8 + i].store(v, Ordering::Relaxed);
        }
    }

    unsafe fn publish(&self, tail: u64) {
        self.tail.store(tail, Ordering::Release);
    }
}

impl RingSource for WordSink {
    fn capacity(&self) -> u64 {
        CAP
    }

    fn read(&self, offset: u64, out: &mut [u8]) {
        assert!(
            offset.is_multiple_of(8) && out.len().is_multiple_of(8),
            "whole words only"
        );
        for (i, w) in out.chunks_exact_mut(8).enumerate() {
            let v = self.words[offset as usize / 8 + i].load(Ordering::Relaxed);
            w.copy_from_slice(&v.to_le_bytes());
        }
    }
}

type Ring = RingCore<WordSink>;

fn ring() -> Arc<Ring> {
    Arc::new(RingCore::new(CAP, WordSink::new()).unwrap())
}

/// Explores the interleavings of `f` with at most 3 preemptions (loom's usual bound: bugs
/// need few preemptions, and the unbounded space of five threads' worth of atomics is too large).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

/// One 16-byte payload, every byte `seq + 1`.
fn payload(seq: u64) -> [u8; 16] {
    [seq as u8 + 1; 16]
}

/// Reserves, writes and commits one record (skipping if the ring says Full: the slots).
fn put(ring: &Ring) {
    if let Ok(mut r) = ring.try_reserve(16) {
        r.write(0, &payload(r.seq())).unwrap();
        r.commit();
    }
}

/// What a consumer may assert about `[0, tail)`: intact records, numbered from 0.
fn check_below(ring: &Ring, tail: u64) {
    let mut pos = 0;
    let mut seq = 0;
    while pos < tail {
        let (h, next) = next_record(ring.sink(), pos, tail).expect("intact chain below the tail");
        assert_eq!((h.kind, h.seq, h.len), (KIND_DATA, seq, 16));
        let mut body = [0u8; 16];
        ring.sink().read(pos + 16, &mut body);
        assert_eq!(body, payload(seq), "payload of seq {seq} complete");
        pos = next;
        seq += 1;
    }
}

/// When the producers are done: nothing left unpublished (no lost hand-over of the publisher
/// role), and every record intact.
fn assert_all_published(ring: &Ring) {
    assert_eq!(
        ring.sink().tail(),
        ring.reserved(),
        "nothing left unpublished"
    );
    check_below(ring, ring.reserved());
}

/// Watches the tail twice while producers run.
fn consumer(ring: Arc<Ring>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let first = ring.sink().tail();
        check_below(&ring, first);
        let second = ring.sink().tail();
        assert!(second >= first, "tails only grow");
        check_below(&ring, second);
    })
}

#[test]
fn two_committers_and_a_consumer() {
    model(|| {
        let ring = ring();
        let producers: Vec<_> = (0..2)
            .map(|_| {
                let ring = ring.clone();
                thread::spawn(move || put(&ring))
            })
            .collect::<Vec<_>>();
        let c = consumer(ring.clone());
        for p in producers {
            p.join().unwrap();
        }
        c.join().unwrap();
        assert_all_published(&ring);
    });
}

/// One thread commits its second record before its first, while another thread commits a third
/// (with two slots, the third reservation may find the slots full: then it is skipped).
#[test]
fn out_of_order_commits_hand_over_the_publisher_role() {
    model(|| {
        let ring = ring();
        let a = {
            let ring = ring.clone();
            thread::spawn(move || {
                // With two slots, `second` is refused while the other thread's record is open.
                let mut first = ring.try_reserve(16).unwrap();
                first.write(0, &payload(first.seq())).unwrap();
                match ring.try_reserve(16) {
                    Ok(mut second) => {
                        second.write(0, &payload(second.seq())).unwrap();
                        second.commit();
                    }
                    Err(e) => assert_eq!(e, RingError::Full),
                }
                first.commit();
            })
        };
        let b = {
            let ring = ring.clone();
            thread::spawn(move || put(&ring))
        };
        a.join().unwrap();
        b.join().unwrap();
        assert_all_published(&ring);
    });
}

/// A claimed producer against a shared committer: the claim is refused while a shared record is
/// in flight, shared reservations are refused while it holds the ring, and whatever the order
/// everything ends up published, numbered without gaps.
#[test]
fn a_claim_against_a_shared_committer() {
    model(|| {
        let ring = ring();
        let claimer = {
            let ring = ring.clone();
            thread::spawn(move || match ring.claim(|| Ok(0)) {
                Ok(mut p) => {
                    let seq = p.next_seq();
                    p.push(&payload(seq), None).unwrap();
                }
                Err(e) => assert!(matches!(e, RingError::Busy | RingError::Claimed), "{e}"),
            })
        };
        let shared = {
            let ring = ring.clone();
            thread::spawn(move || match ring.try_reserve(16) {
                Ok(mut r) => {
                    r.write(0, &payload(r.seq())).unwrap();
                    r.commit();
                }
                Err(e) => assert_eq!(e, RingError::Claimed),
            })
        };
        let c = consumer(ring.clone());
        claimer.join().unwrap();
        shared.join().unwrap();
        c.join().unwrap();
        assert!(!ring.is_claimed());
        assert_all_published(&ring);
        // The ring is usable afterwards, by either path.
        put(&ring);
        assert_eq!(ring.sink().tail(), ring.reserved());
    });
}

/// Fills the region with one record (header only: loom tracks every word written) and returns a
/// consumer head word, still 0, and the flag the consumer raises once it has published its head.
fn full_ring() -> (Arc<Ring>, Arc<AtomicU64>, Arc<AtomicBool>) {
    let ring = ring();
    ring.try_reserve(CAP as u32 - 16).unwrap().commit();
    assert_eq!(ring.sink().tail(), CAP);
    (
        ring,
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    )
}

/// The consumer: takes everything published, publishes its head, then raises `freed`.
fn consume_all(
    ring: &Arc<Ring>,
    head: &Arc<AtomicU64>,
    freed: &Arc<AtomicBool>,
) -> thread::JoinHandle<()> {
    let (ring, head, freed) = (ring.clone(), head.clone(), freed.clone());
    thread::spawn(move || {
        let tail = ring.sink().tail();
        head.store(tail, Ordering::Release);
        freed.store(true, Ordering::Release);
    })
}

/// After the producers: the record at `CAP` is intact (seq 1) and published.
fn assert_second_record(ring: &Ring) {
    assert_eq!(ring.sink().tail(), CAP + 32, "published");
    let (h, _) = next_record(ring.sink(), CAP, CAP + 32).expect("intact record");
    assert_eq!((h.kind, h.seq, h.len), (KIND_DATA, 1, 16));
    let mut body = [0u8; 16];
    ring.sink().read(16, &mut body); // region offset of position CAP + 16
    assert_eq!(body, payload(1));
}

/// A shared reservation with a zero timeout, racing a consumer that frees the space: when the
/// consumer had published its head before the call began, the call takes the space (it asks for
/// the head once before giving up); when it times out, a second zero-timeout call after the
/// consumer is done succeeds.
#[test]
fn a_zero_timeout_reservation_sees_a_published_head() {
    model(|| {
        let (ring, head, freed) = full_ring();
        let consumer = consume_all(&ring, &head, &freed);
        let reserve = {
            let (ring, head) = (ring.clone(), head.clone());
            move || {
                let head = || Ok(head.load(Ordering::Acquire));
                ring.reserve(16, Some(Duration::ZERO), &head).map(|mut r| {
                    r.write(0, &payload(r.seq())).unwrap();
                    r.commit();
                })
            }
        };
        let producer = {
            let (freed, reserve) = (freed.clone(), reserve.clone());
            thread::spawn(move || {
                let already_freed = freed.load(Ordering::Acquire);
                match reserve() {
                    Ok(()) => true,
                    Err(e) => {
                        assert_eq!(e, RingError::Timeout);
                        assert!(!already_freed, "the head was published before the call");
                        false
                    }
                }
            })
        };
        consumer.join().unwrap();
        if !producer.join().unwrap() {
            reserve().expect("the consumer is done: the space is free");
        }
        assert_second_record(&ring);
    });
}

/// The same race for a claimed producer's `push` with a zero timeout.
#[test]
fn a_zero_timeout_push_of_a_producer_sees_a_published_head() {
    model(|| {
        let (ring, head, freed) = full_ring();
        let consumer = consume_all(&ring, &head, &freed);
        let push = {
            let (ring, head) = (ring.clone(), head.clone());
            move || {
                let mut p = ring.claim(|| Ok(head.load(Ordering::Acquire))).unwrap();
                p.push(&payload(1), Some(Duration::ZERO))
                    .map(|seq| assert_eq!(seq, 1))
            }
        };
        let producer = {
            let (freed, push) = (freed.clone(), push.clone());
            thread::spawn(move || {
                let already_freed = freed.load(Ordering::Acquire);
                match push() {
                    Ok(()) => true,
                    Err(e) => {
                        assert_eq!(e, RingError::Timeout);
                        assert!(!already_freed, "the head was published before the call");
                        false
                    }
                }
            })
        };
        consumer.join().unwrap();
        if !producer.join().unwrap() {
            push().expect("the consumer is done: the space is free");
        }
        assert_second_record(&ring);
    });
}
