//! The ring core's unit tests: shared reservations, the exclusive producer, and the mirrored
//! wrap mode (a proptest model and a stress test are in `tests/ring_model.rs`).
#![allow(unsafe_code)] // test sinks implement and forward the sink's unsafe methods
use super::*;
use crate::core::ring::layout::{
    next_record, read_wrapped, verify_records, verify_records_in, RecordHeader, RingSource,
    WrapMode, HEADER_LEN, KIND_DATA, KIND_PAD, MAX_PAYLOAD, WRAP_PAD_SEQ,
};
use std::sync::atomic::AtomicU64 as StdAtomicU64;
use std::sync::atomic::Ordering;
use std::sync::Mutex as StdMutex;
use std::thread;
use std::time::Duration;

const CAP: u64 = 4096;

fn ring() -> RingCore<HostSink> {
    RingCore::new(CAP, HostSink::new(CAP).unwrap()).unwrap()
}

fn header_at(ring: &RingCore<HostSink>, offset: u64) -> RecordHeader {
    let mut b = [0u8; 16];
    ring.sink().read(offset, &mut b);
    RecordHeader::from_bytes(&b)
}

/// Reserves and commits a record with a valid test payload; returns (pos, seq).
fn put(ring: &RingCore<HostSink>, len: u32) -> Result<(u64, u64), RingError> {
    let mut r = ring.try_reserve(len)?;
    let mut p = vec![0x5Au8; len as usize];
    layout::seal_test_payload(&mut p, r.seq());
    r.write(0, &p)?;
    let (pos, seq) = (r.pos(), r.seq());
    r.commit();
    Ok((pos, seq))
}

#[test]
fn capacity_is_validated() {
    for bad in [0, 16, 2048, 4095, 4097, 3 << 12] {
        assert_eq!(
            RingCore::new(bad, HostSink::new(CAP).unwrap()).err(),
            Some(RingError::InvalidCapacity(bad))
        );
        assert!(HostSink::new(bad).is_err());
    }
    let big = RingCore::new(1 << 40, NullSink(1 << 40)).unwrap();
    assert_eq!(big.max_record(), MAX_PAYLOAD);
    assert_eq!(ring().max_record(), 4080);
}

/// A host sink larger than the host can allocate is an error, not an abort.
#[test]
#[cfg_attr(
    miri,
    ignore = "Miri reports the huge allocation request instead of failing it"
)]
fn a_huge_host_sink_is_an_error() {
    for huge in [1u64 << 62, 1 << 63] {
        // black_box: an optimised build may otherwise drop an allocation nobody reads and take
        // it as having succeeded.
        let sink = std::hint::black_box(HostSink::new(huge));
        assert_eq!(sink.err(), Some(RingError::HostMemory(huge)));
    }
}

/// A ring larger than its sink is refused instead of panicking on a push.
#[test]
fn capacity_must_match_the_sink() {
    assert_eq!(
        RingCore::new(8192, HostSink::new(4096).unwrap()).err(),
        Some(RingError::CapacityMismatch {
            ring: 8192,
            sink: 4096
        })
    );
    assert!(RingCore::new(4096, HostSink::new(8192).unwrap()).is_err());
}

#[derive(Debug)]
struct NullSink(u64);

impl RingSink for NullSink {
    fn capacity(&self) -> u64 {
        self.0
    }
    unsafe fn write(&self, _: u64, _: &[u8]) {}
    unsafe fn publish(&self, _: u64) {}
}

#[test]
fn bad_lengths_are_refused_without_side_effects() {
    let r = ring();
    assert_eq!(r.try_reserve(0).err(), Some(RingError::ZeroLength));
    assert_eq!(
        r.try_reserve(4081).err(),
        Some(RingError::RecordTooLarge {
            len: 4081,
            max: 4080
        })
    );
    assert_eq!((r.reserved(), r.committed(), r.free_space()), (0, 0, CAP));
    assert_eq!(put(&r, 1).unwrap(), (0, 0));
}

#[test]
fn records_are_numbered_and_published_in_order() {
    let r = ring();
    assert_eq!(put(&r, 16).unwrap(), (0, 0));
    assert_eq!(put(&r, 17).unwrap(), (32, 1));
    assert_eq!(r.committed(), 32 + 48);
    assert_eq!(r.sink().tail(), 80);
    assert_eq!(header_at(&r, 32), RecordHeader::data(17, 1));
    assert_eq!(r.free_space(), CAP - 80);
    let rep = verify_records(r.sink(), 0, 80, 0);
    assert_eq!((rep.records, rep.errors, rep.next_seq), (2, 0, 2));
}

#[test]
fn full_ring_waits_for_the_consumer() {
    let r = ring();
    put(&r, 4080).unwrap();
    assert_eq!(r.free_space(), 0);
    assert_eq!(r.try_reserve(1).err(), Some(RingError::Full));
    r.reclaim_to(CAP).unwrap();
    assert_eq!(put(&r, 1).unwrap(), (CAP, 1));
}

#[test]
fn wrap_pads_to_the_end_of_the_region() {
    let r = ring();
    put(&r, 4000).unwrap(); // 4016 bytes
    r.reclaim_to(4016).unwrap();
    let res = r.try_reserve(100).unwrap(); // 128 bytes do not fit in the last 80
    assert_eq!((res.pos(), res.offset(), res.seq()), (CAP, 0, 1));
    assert_eq!(
        res.pad_header(),
        Some((4016, RecordHeader::wrap_pad(80).to_bytes()))
    );
    assert_eq!(res.commit(), CAP + 128);
    assert_eq!(header_at(&r, 4016), RecordHeader::wrap_pad(80));
    assert_eq!(header_at(&r, 0), RecordHeader::data(100, 1));
}

#[test]
fn lone_pad_unblocks_a_record_longer_than_the_space_before_it() {
    let r = ring();
    put(&r, 2000).unwrap(); // [0, 2016)
    r.reclaim_to(2016).unwrap();
    // 3008 bytes need the wrap PAD [2016, 4096) and [4096, 7104): more than the capacity
    // until the consumer has stepped over the PAD, which this call publishes alone.
    assert_eq!(r.try_reserve(2992).err(), Some(RingError::Full));
    assert_eq!(
        (r.reserved(), r.committed(), r.sink().tail()),
        (CAP, CAP, CAP)
    );
    assert_eq!(header_at(&r, 2016), RecordHeader::wrap_pad(2080));
    assert_eq!(r.try_reserve(2992).err(), Some(RingError::Full));
    r.reclaim_to(CAP).unwrap();
    assert_eq!(put(&r, 2992).unwrap(), (CAP, 1));
}

#[test]
fn lone_pad_waits_for_earlier_commits() {
    let r = ring();
    put(&r, 2000).unwrap();
    r.reclaim_to(2016).unwrap();
    let open = r.try_reserve(16).unwrap(); // [2016, 2048), not yet committed
    assert_eq!(r.try_reserve(3000).err(), Some(RingError::Full));
    assert_eq!(r.reserved(), 2048, "no PAD while an earlier record is open");
    open.commit();
    r.reclaim_to(2048).unwrap();
    assert_eq!(r.try_reserve(3000).err(), Some(RingError::Full));
    assert_eq!(r.reserved(), CAP);
    r.reclaim_to(CAP).unwrap();
    let res = r.try_reserve(3000).unwrap();
    assert_eq!((res.pos(), res.seq()), (CAP, 2));
}

#[test]
fn dropped_reservation_becomes_a_pad_keeping_its_seq() {
    let r = ring();
    let res = r.try_reserve(40).unwrap();
    drop(res);
    assert_eq!(r.sink().tail(), 64);
    assert_eq!(
        header_at(&r, 0),
        RecordHeader {
            len: 40,
            kind: KIND_PAD,
            seq: 0
        }
    );
    put(&r, 16).unwrap();
    let rep = verify_records(r.sink(), 0, r.committed(), 0);
    assert_eq!((rep.records, rep.errors, rep.next_seq), (1, 0, 2));
}

#[test]
fn writes_are_bounds_checked() {
    let r = ring();
    let mut res = r.try_reserve(20).unwrap();
    assert!(res.write(0, &[1; 20]).is_ok());
    assert!(res.write(20, &[]).is_ok());
    assert_eq!(
        res.write(19, &[1, 2]),
        Err(RingError::OutOfRange {
            at: 19,
            len: 2,
            record_len: 20
        })
    );
    assert!(res.write(21, &[]).is_err());
    assert!(res.write(u32::MAX, &[1]).is_err());
    assert!(!res.is_empty());
    res.commit();
}

#[test]
fn reclaim_is_validated_and_monotonic() {
    let r = ring();
    put(&r, 100).unwrap(); // 128 bytes
    assert_eq!(r.reclaim_to(8), Err(RingError::MisalignedHead(8)));
    assert_eq!(
        r.reclaim_to(144),
        Err(RingError::HeadBeyondCommitted {
            head: 144,
            committed: 128
        })
    );
    r.reclaim_to(128).unwrap();
    r.reclaim_to(0).unwrap();
    assert_eq!(r.reclaimed(), 128);
}

#[test]
fn reserve_polls_the_consumer_and_times_out() {
    let r = ring();
    put(&r, 4080).unwrap();
    let polls = StdAtomicU64::new(0);
    let stuck = || {
        polls.fetch_add(1, Ordering::Relaxed);
        Ok(0)
    };
    let got = r.reserve(16, Some(Duration::from_millis(20)), &stuck);
    assert_eq!(got.err(), Some(RingError::Timeout));
    assert!(polls.load(Ordering::Relaxed) > 0);
    // The consumer moves on after a few polls.
    let polls = StdAtomicU64::new(0);
    let moving = || {
        let n = polls.fetch_add(1, Ordering::Relaxed) + 1;
        Ok(if n > 3 { CAP } else { 0 })
    };
    let res = r.reserve(16, None, &moving).unwrap();
    assert_eq!(res.pos(), CAP);
    // A consumer reporting nonsense is an error, not a hang. (The first try published the
    // wrap PAD [CAP + 32, 2 * CAP) alone, since the record cannot fit before it.)
    drop(res);
    assert_eq!(
        r.reserve(4080, None, &|| Ok(1 << 20)).err(),
        Some(RingError::HeadBeyondCommitted {
            head: 1 << 20,
            committed: 2 * CAP
        })
    );
}

/// A zero timeout is a `try_reserve` that also asks the consumer once: the space it freed
/// since the ring last heard of it is taken, rather than the call timing out without asking.
#[test]
fn a_zero_timeout_takes_the_space_the_consumer_freed() {
    let r = ring();
    put(&r, 4080).unwrap();
    // The consumer has consumed the record and published its head, which the ring has not seen.
    let polls = StdAtomicU64::new(0);
    let freed = || {
        polls.fetch_add(1, Ordering::Relaxed);
        Ok(CAP)
    };
    let res = r.reserve(16, Some(Duration::ZERO), &freed).unwrap();
    assert_eq!((res.pos(), res.seq()), (CAP, 1));
    assert_eq!(
        polls.load(Ordering::Relaxed),
        1,
        "asked once, after the first try"
    );
    res.commit();
    // With room already known, the consumer is not asked at all.
    assert_eq!(
        r.reserve(16, Some(Duration::ZERO), &freed).unwrap().seq(),
        2
    );
    assert_eq!(polls.load(Ordering::Relaxed), 1);
    // `push` takes the same path; when the consumer has freed nothing new, it still asks once.
    let stuck = || {
        polls.fetch_add(1, Ordering::Relaxed);
        Ok(CAP)
    };
    let payload = sealed(4080, 3);
    assert_eq!(
        r.push(&payload, Some(Duration::ZERO), &stuck),
        Err(RingError::Timeout)
    );
    assert_eq!(polls.load(Ordering::Relaxed), 2);
    // The record needs the whole region: the failed push published the wrap PAD before it on
    // its own, for the consumer to step over.
    assert_eq!((r.reserved(), r.sink().tail()), (2 * CAP, 2 * CAP));
    assert_eq!(
        r.push(&payload, Some(Duration::ZERO), &|| Ok(2 * CAP)),
        Ok(3)
    );
    let rep = verify_records(r.sink(), 2 * CAP, r.committed(), 3);
    assert_eq!((rep.records, rep.errors, rep.pos), (1, 0, 3 * CAP));
}

/// A thread holding an open reservation may still take space the consumer has freed with a zero
/// timeout: it is told `WouldDeadlock` only when waiting would be the only way on.
#[test]
fn a_zero_timeout_asks_the_consumer_before_refusing_to_wait_on_itself() {
    let r = ring();
    put(&r, 4000).unwrap(); // [0, 4016)
    let open = r.try_reserve(48).unwrap(); // [4016, 4080), held by this thread
    assert_eq!(
        r.reserve(16, Some(Duration::ZERO), &|| Ok(0)).err(),
        Some(RingError::WouldDeadlock)
    );
    // The consumer has consumed the first record: room for a wrap PAD and 32 bytes at 0.
    let res = r.reserve(16, Some(Duration::ZERO), &|| Ok(4016)).unwrap();
    assert_eq!((res.pos(), res.seq()), (CAP, 2));
    res.commit();
    assert_eq!(r.sink().tail(), 4016, "behind the open reservation");
    open.commit();
    assert_eq!(r.sink().tail(), CAP + 32);
}

/// The exclusive producer asks the consumer before a zero timeout gives up, too.
#[test]
fn a_producer_with_a_zero_timeout_takes_the_space_the_consumer_freed() {
    let r = ring();
    let head = StdAtomicU64::new(0);
    let mut p = r.claim(|| Ok(head.load(Ordering::Acquire))).unwrap();
    assert_eq!(p.push(&sealed(4080, 0), Some(Duration::ZERO)), Ok(0));
    assert_eq!(
        p.push(&sealed(16, 1), Some(Duration::ZERO)),
        Err(RingError::Timeout)
    );
    head.store(CAP, Ordering::Release); // consumed; the ring has not been told
    assert_eq!(p.push(&sealed(16, 1), Some(Duration::ZERO)), Ok(1));
    let batch = [sealed(16, 2), sealed(16, 3)];
    assert_eq!(
        p.push_batch(batch.iter().map(Vec::as_slice), Some(Duration::ZERO)),
        Ok(2)
    );
    drop(p);
    let rep = verify_records(r.sink(), CAP, r.sink().tail(), 1);
    assert_eq!((rep.records, rep.errors, rep.next_seq), (3, 0, 4));
}

/// Short records are staged with their header and reach the sink in one write; long ones in two
/// (header, payload); either way the ring holds the same bytes.
#[test]
fn short_records_reach_the_sink_in_one_write() {
    for mode in [WrapMode::Padded, WrapMode::Mirrored] {
        let r = RingCore::with_wrap_mode(CAP, Writes::new(CAP), mode).unwrap();
        let head = || Ok(r.committed());
        let short = sealed(240, 0);
        let long = sealed(241, 1);
        r.push(&short, None, &head).unwrap();
        r.push(&long, None, &head).unwrap();
        assert_eq!(r.sink().take(), [(0, 256), (256, 16), (272, 241)]);
        let mut p = r.claim(head).unwrap();
        p.push(&sealed(240, 2), None).unwrap();
        p.push(&sealed(241, 3), None).unwrap();
        drop(p);
        assert_eq!(r.sink().take(), [(528, 256), (784, 16), (800, 241)]);
        let rep = verify_records_in(&r.sink().inner, 0, r.committed(), 0, mode);
        assert_eq!((rep.records, rep.errors), (4, 0), "{rep:?}");
    }
    // A staged record that runs past the end of a mirrored region is split there.
    let r = RingCore::with_wrap_mode(CAP, Writes::new(CAP), WrapMode::Mirrored).unwrap();
    let head = || Ok(r.committed());
    r.push(&sealed(4000, 0), None, &head).unwrap(); // [0, 4016)
    r.sink().take();
    r.push(&sealed(100, 1), None, &head).unwrap(); // [4016, 4144)
    assert_eq!(r.sink().take(), [(4016, 80), (0, 36)]);
    let rep = verify_records_in(&r.sink().inner, 4016, 4144, 1, WrapMode::Mirrored);
    assert_eq!((rep.records, rep.errors), (1, 0), "{rep:?}");
}

/// A sink that logs every write as (offset, length).
struct Writes {
    inner: HostSink,
    writes: StdMutex<Vec<(u64, usize)>>,
}

impl Writes {
    fn new(cap: u64) -> Self {
        Writes {
            inner: HostSink::new(cap).unwrap(),
            writes: StdMutex::new(Vec::new()),
        }
    }
    fn take(&self) -> Vec<(u64, usize)> {
        std::mem::take(&mut *self.writes.lock().unwrap())
    }
}

impl RingSink for Writes {
    fn capacity(&self) -> u64 {
        RingSink::capacity(&self.inner)
    }
    unsafe fn write(&self, offset: u64, bytes: &[u8]) {
        self.writes.lock().unwrap().push((offset, bytes.len()));
        // SAFETY: the caller's obligations are passed on unchanged.
        unsafe { self.inner.write(offset, bytes) };
    }
    unsafe fn publish(&self, tail: u64) {
        // SAFETY: as above.
        unsafe { self.inner.publish(tail) };
    }
}

#[test]
fn push_writes_a_whole_record() {
    let r = ring();
    let mut p = vec![3u8; 33];
    layout::seal_test_payload(&mut p, 0);
    assert_eq!(r.push(&p, None, &|| Ok(0)), Ok(0));
    let (h, next) = next_record(r.sink(), 0, r.committed()).unwrap();
    assert_eq!((h, next), (RecordHeader::data(33, 0), 64));
    assert_eq!(r.push(&[], None, &|| Ok(0)), Err(RingError::ZeroLength));
    assert_ne!(h.seq, WRAP_PAD_SEQ);
}

#[test]
fn threads_commit_out_of_order_but_publish_in_order() {
    let r = ring();
    let first = r.try_reserve(16).unwrap();
    thread::scope(|s| {
        let later = s.spawn(|| r.try_reserve(16).unwrap().commit());
        // The later commit cannot publish before `first`.
        thread::sleep(Duration::from_millis(10));
        assert_eq!(r.sink().tail(), 0);
        assert_eq!(first.commit(), 32);
        assert_eq!(later.join().unwrap(), 64);
    });
    assert_eq!(r.sink().tail(), 64);
}

#[test]
fn one_publish_covers_records_committed_out_of_order() {
    let r = RingCore::new(CAP, Counting::new(CAP)).unwrap();
    let (a, b, c) = (
        r.try_reserve(16).unwrap(),
        r.try_reserve(16).unwrap(),
        r.try_reserve(16).unwrap(),
    );
    // One thread holding three reservations may commit them in any order.
    assert_eq!(c.commit(), 96);
    assert_eq!(b.commit(), 64);
    assert_eq!(
        (r.committed(), r.published()),
        (0, 0),
        "seq 0 is still open"
    );
    assert!(r.sink().publishes.lock().unwrap().is_empty());
    assert_eq!(a.commit(), 32);
    assert_eq!(
        *r.sink().publishes.lock().unwrap(),
        [96],
        "one publish for all three"
    );
    assert_eq!((r.committed(), r.published()), (96, 96));
    let mut pos = 0;
    for seq in 0..3 {
        let (h, next) = next_record(&r.sink().inner, pos, 96).unwrap();
        assert_eq!(h, RecordHeader::data(16, seq));
        pos = next;
    }
}

/// A sink that logs every publication.
struct Counting {
    inner: HostSink,
    publishes: StdMutex<Vec<u64>>,
}

impl Counting {
    fn new(cap: u64) -> Self {
        Counting {
            inner: HostSink::new(cap).unwrap(),
            publishes: StdMutex::new(Vec::new()),
        }
    }
    fn publishes(&self) -> Vec<u64> {
        self.publishes.lock().unwrap().clone()
    }
}

impl RingSink for Counting {
    fn capacity(&self) -> u64 {
        RingSink::capacity(&self.inner)
    }
    unsafe fn write(&self, offset: u64, bytes: &[u8]) {
        // SAFETY: the caller's obligations are passed on unchanged.
        unsafe { self.inner.write(offset, bytes) };
    }
    unsafe fn publish(&self, tail: u64) {
        self.publishes.lock().unwrap().push(tail);
        // SAFETY: as above.
        unsafe { self.inner.publish(tail) };
    }
}

#[test]
#[cfg_attr(miri, ignore = "hundreds of records: too slow under Miri")]
fn reservations_wait_for_a_slot_behind_an_open_reservation() {
    // A region large enough that the slots, not the space, run out first.
    let r = RingCore::new(1 << 16, HostSink::new(1 << 16).unwrap()).unwrap();
    let first = r.try_reserve(16).unwrap();
    let n = COMMIT_SLOTS * 3;
    let committed = StdAtomicU64::new(0);
    thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..n {
                let mut res = r.reserve(16, None, &|| Ok(r.published())).unwrap();
                res.write(0, &[1; 16]).unwrap();
                res.commit();
                committed.fetch_add(1, Ordering::Relaxed);
            }
        });
        thread::sleep(Duration::from_millis(50));
        assert_eq!(r.published(), 0, "everything waits behind `first`");
        assert_eq!(
            committed.load(Ordering::Relaxed),
            COMMIT_SLOTS - 1,
            "the other thread's reservations stop when the slots are full (`first` has one)"
        );
        first.commit();
    });
    assert_eq!(r.published(), 32 * (n + 1));
    let rep = layout::verify_records(r.sink(), 0, r.published(), 0);
    assert_eq!(
        (rep.records, rep.next_seq, rep.pos),
        (n + 1, n + 1, r.published())
    );
}

/// A thread waiting on itself, first case: one thread commits 256+ records past a reservation it
/// holds open itself, where a `commit` that waited for the open one would wait forever. Commits
/// never wait; the reservation that would need the open one's slot fails at once instead of
/// waiting for this thread.
#[test]
#[cfg_attr(miri, ignore = "hundreds of records: too slow under Miri")]
fn a_thread_cannot_wait_on_its_own_open_reservation() {
    let r = RingCore::new(1 << 16, HostSink::new(1 << 16).unwrap()).unwrap();
    let first = r.try_reserve(16).unwrap();
    for _ in 1..COMMIT_SLOTS {
        r.reserve(16, None, &|| Ok(0)).unwrap().commit();
    }
    assert_eq!(r.try_reserve(16).err(), Some(RingError::Full));
    assert_eq!(
        r.reserve(16, None, &|| Ok(0)).err(),
        Some(RingError::WouldDeadlock)
    );
    assert_eq!(r.published(), 0);
    first.commit();
    assert_eq!(r.published(), 32 * COMMIT_SLOTS);
    // With nothing held, the same wait is an ordinary one (here it times out).
    r.reclaim_to(r.published()).unwrap();
    assert!(r
        .reserve(16, Some(Duration::from_millis(1)), &|| Ok(0))
        .is_ok());
}

/// A thread waiting on itself, second case: `reserve(_, None)` while the same thread holds a
/// whole-ring reservation is refused instead of hanging; another thread's identical wait is
/// served once the reservation is committed and consumed.
#[test]
fn a_whole_ring_reservation_blocks_others_not_its_owner() {
    let r = ring();
    let whole = r.try_reserve(4080).unwrap();
    assert_eq!(
        r.reserve(16, None, &|| Ok(r.published())).err(),
        Some(RingError::WouldDeadlock)
    );
    thread::scope(|s| {
        let other = s.spawn(|| {
            r.reserve(16, None, &|| Ok(r.published()))
                .map(|res| res.commit())
        });
        thread::sleep(Duration::from_millis(20));
        assert!(!other.is_finished(), "the other thread waits for space");
        whole.commit();
        assert_eq!(other.join().unwrap(), Ok(CAP + 32));
    });
}

#[test]
fn a_stopped_consumer_ends_the_wait() {
    let r = ring();
    put(&r, 4080).unwrap();
    assert_eq!(
        r.reserve(16, None, &|| Err(RingError::Stopped)).err(),
        Some(RingError::Stopped)
    );
    assert_eq!(r.reserved(), CAP, "nothing changed");
}

#[test]
fn a_producer_batches_records_into_one_publication() {
    let r = RingCore::new(CAP, Counting::new(CAP)).unwrap();
    put_shared(&r, 20); // seq 0 through the shared path
    let mut p = r.claim(|| Ok(0)).unwrap();
    assert!(r.is_claimed());
    let payloads: Vec<Vec<u8>> = (1..=5u64).map(|seq| sealed(40, seq)).collect();
    assert_eq!(
        p.push_batch(payloads.iter().map(Vec::as_slice), None),
        Ok(5)
    );
    assert_eq!(
        r.sink().publishes(),
        [48, 48 + 5 * 64],
        "one tail store for five"
    );
    assert_eq!(
        (r.committed(), r.published(), r.reserved()),
        (368, 368, 368)
    );
    // Deferred writes wait for the policy, a flush, or the drop.
    p.set_policy(FlushPolicy {
        max_pending_bytes: 3 * 64,
        max_delay: None,
    });
    assert_eq!(p.write(&sealed(40, 6), None), Ok(6));
    assert_eq!(p.write(&sealed(40, 7), None), Ok(7));
    assert_eq!((p.pending(), r.sink().inner.tail()), (128, 368));
    assert_eq!(
        p.write(&sealed(40, 8), None),
        Ok(8),
        "the third reaches the bound"
    );
    assert_eq!((p.pending(), r.sink().inner.tail()), (0, 368 + 192));
    assert_eq!(p.write(&sealed(40, 9), None), Ok(9));
    drop(p);
    assert!(!r.is_claimed());
    assert_eq!(
        r.sink().inner.tail(),
        368 + 256,
        "the drop published the rest"
    );
    // Shared reservations continue the numbering.
    assert_eq!(put_shared(&r, 20), (624, 10));
    let rep = verify_records(&r.sink().inner, 0, r.published(), 0);
    assert_eq!((rep.records, rep.errors, rep.next_seq), (11, 0, 11));
}

fn sealed(len: usize, seq: u64) -> Vec<u8> {
    let mut p: Vec<u8> = (0..len).map(|i| (i as u64 * 7 + seq) as u8).collect();
    layout::seal_test_payload(&mut p, seq).unwrap();
    p
}

/// `put` for any sink.
fn put_shared<S: RingSink>(ring: &RingCore<S>, len: u32) -> (u64, u64) {
    let mut r = ring.try_reserve(len).unwrap();
    r.write(0, &sealed(len as usize, r.seq())).unwrap();
    let (pos, seq) = (r.pos(), r.seq());
    r.commit();
    (pos, seq)
}

#[test]
fn claims_exclude_each_other_and_shared_reservations() {
    let r = ring();
    let open = r.try_reserve(16).unwrap();
    assert_eq!(r.claim(|| Ok(0)).err(), Some(RingError::Busy));
    open.commit();
    let mut p = r.claim(|| Ok(0)).unwrap();
    assert_eq!(r.claim(|| Ok(0)).err(), Some(RingError::Claimed));
    assert_eq!(r.try_reserve(16).err(), Some(RingError::Claimed));
    assert_eq!(
        r.reserve(16, None, &|| Ok(0)).err(),
        Some(RingError::WouldDeadlock),
        "this thread owns the producer"
    );
    thread::scope(|s| {
        let other = s.spawn(|| {
            r.reserve(16, Some(Duration::from_secs(60)), &|| Ok(0))
                .map(|res| (res.pos(), res.seq()))
        });
        thread::sleep(Duration::from_millis(20));
        assert!(
            !other.is_finished(),
            "shared reservations wait for the producer"
        );
        assert_eq!(p.push(&sealed(16, 1), None), Ok(1));
        drop(p);
        assert_eq!(other.join().unwrap(), Ok((64, 2)));
    });
}

#[test]
fn a_producer_wraps_waits_and_times_out() {
    let r = ring();
    let head = StdAtomicU64::new(0);
    let mut p = r.claim(|| Ok(head.load(Ordering::Acquire))).unwrap();
    p.set_policy(FlushPolicy {
        max_pending_bytes: u64::MAX,
        max_delay: None,
    });
    for seq in 0..3 {
        assert_eq!(p.write(&sealed(1200, seq), None), Ok(seq)); // 1216 bytes each
    }
    assert_eq!(r.sink().tail(), 0, "nothing published yet");
    // The fourth does not fit before the end (3648 + 1216 > 4096): a wrap PAD, then offset 0,
    // which needs the consumer; waiting published the three records first.
    assert_eq!(
        p.write(&sealed(1200, 3), Some(Duration::from_millis(5))),
        Err(RingError::Timeout)
    );
    assert_eq!(
        r.sink().tail(),
        CAP,
        "the records and the wrap PAD are published"
    );
    assert_eq!(header_at(&r, 3648), RecordHeader::wrap_pad(448));
    head.store(2432, Ordering::Release); // two records consumed
    assert_eq!(p.write(&sealed(1200, 3), None), Ok(3));
    let mut rec = p.reserve(100, None).unwrap();
    assert_eq!((rec.pos(), rec.seq()), (CAP + 1216, 4));
    assert!(rec.write(90, &[0; 11]).is_err());
    drop(rec); // becomes a PAD keeping seq 4
    p.flush();
    let mut rec = p.reserve(24, None).unwrap();
    rec.write(0, &sealed(24, 5)).unwrap();
    assert_eq!(rec.commit(), 5);
    p.flush();
    // Seq 2, the wrap PAD, seq 3, the abandoned seq 4, seq 5 (seq 0 and 1 are overwritten).
    let rep = verify_records(r.sink(), 2432, r.sink().tail(), 2);
    assert_eq!(
        (rep.records, rep.errors, rep.next_seq),
        (3, 0, 6),
        "{rep:?}"
    );
    // A consumer that stopped ends a producer's wait too.
    drop(p);
    let mut p = r.claim(|| Err(RingError::Stopped)).unwrap();
    assert_eq!(p.push(&[1; 4000], None), Err(RingError::Stopped));
}

#[test]
fn a_producer_publishes_after_its_delay() {
    let r = RingCore::new(CAP, Counting::new(CAP)).unwrap();
    let mut p = r.claim(|| Ok(0)).unwrap();
    p.set_policy(FlushPolicy {
        max_pending_bytes: u64::MAX,
        max_delay: Some(Duration::from_millis(5)),
    });
    p.write(&sealed(16, 0), None).unwrap();
    assert!(r.sink().publishes().is_empty());
    thread::sleep(Duration::from_millis(6));
    p.write(&sealed(16, 1), None).unwrap();
    assert_eq!(
        r.sink().publishes(),
        [64],
        "the second write found the first too old"
    );
}

#[test]
fn a_mirrored_producer_writes_across_the_end() {
    let ring =
        RingCore::with_wrap_mode(4096, HostSink::new(4096).unwrap(), WrapMode::Mirrored).unwrap();
    let head = StdAtomicU64::new(0);
    let mut p = ring.claim(|| Ok(head.load(Ordering::Acquire))).unwrap();
    let mut seqs = 0;
    // Five rounds (about 5 KiB) cross the end of the 4 KiB region once, enough for Miri.
    for round in 0..if cfg!(miri) { 5u64 } else { 20 } {
        let batch: Vec<Vec<u8>> = (0..3)
            .map(|i| sealed(300 + i * 37, seqs + i as u64))
            .collect();
        let from = p.core().reserved();
        p.push_batch(batch.iter().map(Vec::as_slice), None).unwrap();
        seqs += 3;
        let to = ring.sink().tail();
        assert_eq!(
            to - from,
            batch
                .iter()
                .map(|b| layout::record_size(b.len() as u32))
                .sum::<u64>(),
            "round {round}: no padding"
        );
        let rep = verify_records_in(ring.sink(), from, to, seqs - 3, WrapMode::Mirrored);
        assert_eq!((rep.records, rep.errors), (3, 0), "{rep:?}");
        head.store(to, Ordering::Release);
    }
}

#[test]
#[cfg_attr(miri, ignore = "hundreds of records: too slow under Miri")]
fn records_run_past_the_end_without_padding() {
    let ring =
        RingCore::with_wrap_mode(4096, HostSink::new(4096).unwrap(), WrapMode::Mirrored).unwrap();
    assert_eq!(ring.wrap_mode(), WrapMode::Mirrored);
    let mut straddled = 0;
    for seq in 0..200u64 {
        let len = 100 + (seq as u32 * 37) % 900;
        let mut r = ring.try_reserve(len).unwrap();
        assert_eq!(r.seq(), seq);
        assert_eq!(r.pos(), ring.committed(), "no padding between records");
        assert_eq!(r.pad_header(), None);
        let (pos, end) = (r.pos(), r.end());
        let mut payload: Vec<u8> = (0..len).map(|i| (seq as u32 ^ i) as u8).collect();
        layout::seal_test_payload(&mut payload, seq);
        // In two pieces, so one write may start exactly at the end of the region.
        let cut = (seq as usize * 13) % payload.len();
        r.write(0, &payload[..cut]).unwrap();
        r.write(cut as u32, &payload[cut..]).unwrap();
        r.commit();
        if (pos & 4095) + (end - pos) > 4096 {
            straddled += 1;
        }
        let mut raw = [0u8; 16];
        read_wrapped(ring.sink(), pos, &mut raw);
        let header = RecordHeader::from_bytes(&raw);
        assert_eq!((header.len, header.kind, header.seq), (len, KIND_DATA, seq));
        let mut got = vec![0u8; len as usize];
        read_wrapped(ring.sink(), pos + HEADER_LEN, &mut got);
        assert_eq!(got, payload);
        let rep = verify_records_in(ring.sink(), pos, end, seq, WrapMode::Mirrored);
        assert_eq!((rep.records, rep.errors, rep.pos), (1, 0, end));
        ring.reclaim_to(end).unwrap();
    }
    assert!(straddled > 10, "only {straddled} records crossed the end");
    // The padded reference rejects a record that crosses the end.
    let r = ring.try_reserve(4096 - 16).unwrap();
    let (pos, end) = (r.pos(), r.end());
    assert_ne!(pos & 4095, 0, "starts mid-region");
    r.commit();
    let padded = layout::verify_records(ring.sink(), pos, end, 200);
    assert_eq!(
        (padded.errors, padded.pos),
        (1, pos),
        "stops at the crossing"
    );
    let mirrored = verify_records_in(ring.sink(), pos, end, 200, WrapMode::Mirrored);
    assert_eq!((mirrored.records, mirrored.pos), (1, end));
}

#[test]
fn a_producer_stages_large_records_and_everything_after_them() {
    // Records of 256 bytes or more (header included) go through the staging copy.
    let ring = RingCore::new(CAP, HostSink::with_staging(CAP, 256).unwrap()).unwrap();
    let mut p = ring.claim(|| Ok(0)).unwrap();
    p.set_policy(FlushPolicy {
        max_pending_bytes: u64::MAX,
        max_delay: None,
    });
    p.write(&sealed(40, 0), None).unwrap(); // direct: in the region at once
    p.write(&sealed(600, 1), None).unwrap(); // staged
    p.write(&sealed(40, 2), None).unwrap(); // small, but after a staged one: staged too
    assert_eq!(header_at(&ring, 0).seq, 0, "the direct record is in place");
    assert_eq!(
        header_at(&ring, 64).len,
        0,
        "a staged record is not in place before publishing"
    );
    assert_eq!(header_at(&ring, 64 + 624).len, 0);
    p.flush();
    let report = verify_records(ring.sink(), 0, ring.sink().tail(), 0);
    assert_eq!((report.records, report.errors, report.next_seq), (3, 0, 3));
    // After the publication the next small record is direct again.
    p.write(&sealed(40, 3), None).unwrap();
    assert_eq!(header_at(&ring, 64 + 624 + 64).seq, 3);
    drop(p);
    let report = verify_records(ring.sink(), 0, ring.sink().tail(), 0);
    assert_eq!((report.records, report.errors), (4, 0));
}

#[test]
fn a_staged_record_written_in_place_and_a_staged_wrap_pad_reach_the_consumer() {
    let ring = RingCore::new(CAP, HostSink::with_staging(CAP, 1024).unwrap()).unwrap();
    let head = StdAtomicU64::new(0);
    let mut p = ring.claim(|| Ok(head.load(Ordering::Acquire))).unwrap();
    p.set_policy(FlushPolicy {
        max_pending_bytes: u64::MAX,
        max_delay: None,
    });
    // 2 × 1040 bytes published; then a staged 1040-byte record and a 2000-byte record that
    // wraps: its wrap PAD lies inside the staged span.
    for seq in 0..2 {
        p.write(&sealed(1024, seq), None).unwrap();
    }
    p.flush();
    head.store(2 * 1040, Ordering::Release);
    // Told now, so that placing the wrapping record needs no wait (which would publish first).
    ring.reclaim_to(2 * 1040).unwrap();
    p.write(&sealed(1024, 2), None).unwrap();
    let mut r = p.reserve(2000, None).unwrap();
    assert_eq!(r.pos(), CAP, "after the wrap PAD");
    let payload = sealed(2000, r.seq());
    r.write(1000, &payload[1000..]).unwrap(); // payload before header, in pieces
    r.write(0, &payload[..1000]).unwrap();
    r.commit();
    p.write(&sealed(40, 4), None).unwrap();
    assert_eq!(
        header_at(&ring, 3 * 1040).len,
        0,
        "the PAD is staged, not in place"
    );
    drop(p);
    assert_eq!(header_at(&ring, 3 * 1040).seq, WRAP_PAD_SEQ);
    let report = verify_records(ring.sink(), 2 * 1040, ring.sink().tail(), 2);
    assert_eq!((report.records, report.errors, report.next_seq), (3, 0, 5));
}

#[test]
fn a_large_record_is_staged_only_after_enough_pending_bytes() {
    // Records of 256 bytes or more are staged once 1024 bytes are pending before them.
    let ring = RingCore::new(CAP, HostSink::with_staging_after(CAP, 256, 1024).unwrap()).unwrap();
    let mut p = ring.claim(|| Ok(0)).unwrap();
    p.set_policy(FlushPolicy {
        max_pending_bytes: u64::MAX,
        max_delay: None,
    });
    p.push(&sealed(600, 0), None).unwrap(); // a lone large record: in place
    assert_eq!(header_at(&ring, 0).seq, 0);
    p.write(&sealed(600, 1), None).unwrap(); // 0 pending before it: in place
    p.write(&sealed(600, 2), None).unwrap(); // 624 pending: in place
    let third = 3 * 624;
    assert_eq!(header_at(&ring, third - 624).seq, 2);
    p.write(&sealed(600, 3), None).unwrap(); // 1248 pending: staged
    assert_eq!(
        header_at(&ring, third).len,
        0,
        "staged, not in place before publishing"
    );
    drop(p);
    let report = verify_records(ring.sink(), 0, ring.sink().tail(), 0);
    assert_eq!((report.records, report.errors, report.next_seq), (4, 0, 4));
}

#[test]
fn a_producer_told_to_stage_at_once_stages_the_first_large_record_of_a_batch() {
    // Records of 256 bytes or more are staged once 1024 bytes are pending before them, unless
    // the producer is told otherwise.
    let ring = RingCore::new(CAP, HostSink::with_staging_after(CAP, 256, 1024).unwrap()).unwrap();
    let mut p = ring.claim(|| Ok(0)).unwrap();
    p.set_policy(FlushPolicy {
        max_pending_bytes: u64::MAX,
        max_delay: None,
    });
    assert_eq!(p.stage_after(), 1024, "the sink's choice at first");
    p.set_stage_after(0);
    assert_eq!(p.stage_after(), 0);
    p.write(&sealed(600, 0), None).unwrap(); // nothing pending before it: staged all the same
    assert_eq!(header_at(&ring, 0).len, 0, "staged, not in place");
    p.flush();
    assert_eq!(
        header_at(&ring, 0).seq,
        0,
        "moved into place by the publication"
    );
    p.push(&sealed(600, 1), None).unwrap(); // a lone large record: staged, then published
    assert_eq!(header_at(&ring, 624).seq, 1);
    p.write(&sealed(40, 2), None).unwrap(); // small: in place
    assert_eq!(header_at(&ring, 2 * 624).seq, 2);
    // Back to the sink's choice: the next large record, 64 bytes pending, stays in place.
    p.set_stage_after(1024);
    p.write(&sealed(600, 3), None).unwrap();
    assert_eq!(header_at(&ring, 2 * 624 + 64).seq, 3, "in place again");
    drop(p);
    let report = verify_records(ring.sink(), 0, ring.sink().tail(), 0);
    assert_eq!((report.records, report.errors, report.next_seq), (4, 0, 4));
}
