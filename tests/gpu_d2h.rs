//! Device → host rings on the GPU (`DeviceToHostRing`, `include/vkgdr/ring_d2h.cuh`, the test
//! kernels of `kernels/ring_d2h.cu`): millions of records from every warp of a grid over eight
//! lanes, each checked on the CPU (sequence number, producer order, every payload byte), through
//! many wraps; 4 KiB records written by whole warps; warps that publish with changing subsets of
//! their lanes, records of every length from odd and aligned addresses, into slots that the warp
//! writes together (32 to 128 bytes) or each thread its own (256); a slow consumer that holds the
//! kernel back
//! (back-pressure: the kernel waits, nothing is lost); a consumer that closes its lane while the
//! kernel waits for room (the kernel gives up with `VKGDR_D2H_CLOSED`; a watchdog turns a hang
//! into a failure); and a lone record's latency, printed, not asserted. The streams of records
//! run in lanes of committed and of tagged slots (`SlotFormat`).
//!
//! The checker itself is tested without a GPU (the model producer of the core fills a lane in
//! host memory): it accepts a good lane and refuses a corrupted byte and a repeated record; the
//! sparse warps' checker also refuses a lost record.
#![cfg(not(feature = "loom"))]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use vkgdr::cuda_objects::{LaunchConfig, Module, Stream};
use vkgdr::ring::core::d2h::{
    test_payload, DeviceLaneState, HostLane, LaneConsumer, LaneMemory, LaneShape, Poll,
    ProducerModel, Record, SlotFormat, TestLaneChecker, STATUS_CLOSED, STATUS_STALLED,
};
use vkgdr::ring::DeviceToHostRing;
use vkgdr::{Gpu, Mapping, RawMemory};

const D2H_PTX: &str = include_str!("../kernels/ring_d2h.ptx");

// ---- The checker, without a GPU: the core's model producer fills a lane in host memory. ----

/// Publishes `rounds` test records of each of `producers` producers (round-robin) into `lane`.
fn model_publish(lane: &HostLane, shape: LaneShape, producers: u32, rounds: u32, len: usize) {
    let device = DeviceLaneState::new();
    let producer = ProducerModel::new(lane, &device, shape, 0);
    for round in 0..rounds {
        for p in 0..producers {
            let id = u64::from(p) << 32 | u64::from(round);
            producer.publish(1, &test_payload(id, len)).unwrap();
        }
    }
}

/// Runs the checker over everything in `lane`.
fn check_model_lane(lane: &HostLane, shape: LaneShape, len: usize) -> Result<u64, String> {
    let mut consumer = LaneConsumer::new(lane, shape).unwrap();
    let mut checker = TestLaneChecker::new(0, 1, len, |_| 0);
    while let Some(rec) = consumer.try_next().map_err(|e| e.to_string())? {
        checker.check(&rec).map_err(|e| e.to_string())?;
    }
    Ok(checker.count())
}

#[test]
fn checker_accepts_a_good_lane() {
    let shape = LaneShape::new(64, 64).unwrap();
    let lane = HostLane::new(shape);
    model_publish(&lane, shape, 4, 16, 48);
    assert_eq!(check_model_lane(&lane, shape, 48), Ok(64));
}

#[test]
fn checker_refuses_a_corrupted_byte_anywhere_in_the_payload() {
    let shape = LaneShape::new(64, 64).unwrap();
    for byte in [0usize, 7, 8, 23, 47] {
        let lane = HostLane::new(shape);
        model_publish(&lane, shape, 4, 16, 48);
        // Record 37's payload byte `byte` (header: two words).
        let word = shape.first_word(37) + 2 + byte / 8;
        lane.slot_words()[word].fetch_xor(1 << (8 * (byte % 8)), Ordering::Relaxed);
        let err = check_model_lane(&lane, shape, 48).expect_err("a corrupted byte");
        assert!(err.contains("record 37"), "byte {byte}: {err}");
    }
}

#[test]
fn checker_refuses_a_repeated_record() {
    let shape = LaneShape::new(64, 64).unwrap();
    let lane = HostLane::new(shape);
    let device = DeviceLaneState::new();
    let producer = ProducerModel::new(&lane, &device, shape, 0);
    for round in [0u32, 1, 1, 2] {
        producer
            .publish(1, &test_payload(u64::from(round), 48))
            .unwrap();
    }
    let err = check_model_lane(&lane, shape, 48).expect_err("a repeated record");
    assert!(err.contains("round 1 where 2 was due"), "{err}");
}

/// Publishes `d2h_produce_sparse`'s records of one block of 32 threads into `lane` (lane 0 of
/// one) with the model producer, round by round, leaving out thread `skip`'s round `skip.1`.
fn model_publish_sparse(lane: &HostLane, shape: LaneShape, rounds: u32, skip: (u32, u32)) {
    let device = DeviceLaneState::new();
    let producer = ProducerModel::new(lane, &device, shape, 0);
    let max_len = shape.max_payload();
    for round in 0..rounds {
        for thread in (0..32).filter(|&t| sparse_in(t, round) && (t, round) != skip) {
            let id = u64::from(thread) << 32 | u64::from(round);
            let len = 8 + (id % u64::from(max_len - 7)) as usize;
            producer.publish(5, &test_payload(id, len)).unwrap();
        }
    }
    lane.finish();
}

#[test]
fn sparse_checker_accepts_a_good_lane_and_refuses_a_bad_byte_or_a_lost_record() {
    let shape = LaneShape::new(512, 64).unwrap();
    let check = |lane: &HostLane| {
        let mut consumer = LaneConsumer::new(lane, shape).unwrap();
        check_sparse_lane(&mut consumer, (0, 1), (1, 32, 8), 48)
    };
    let expected = (0..32)
        .map(|t| (0..8).filter(|&r| sparse_in(t, r)).count() as u64)
        .sum::<u64>();
    let lane = HostLane::new(shape);
    model_publish_sparse(&lane, shape, 8, (u32::MAX, 0));
    assert_eq!(check(&lane), Ok(expected));

    let lane = HostLane::new(shape);
    model_publish_sparse(&lane, shape, 8, (u32::MAX, 0));
    let word = shape.first_word(41) + 2 + 1; // record 41's payload bytes 8..16
    lane.slot_words()[word].fetch_xor(1 << 16, Ordering::Relaxed);
    let err = check(&lane).expect_err("a corrupted byte");
    assert!(
        err.contains("record 41") && err.contains("byte 10"),
        "{err}"
    );

    // Thread 5 publishes in round 1 (5 * 7 + 3 = 38) and in round 2 (41): lose round 1.
    assert!(sparse_in(5, 1) && sparse_in(5, 2));
    let lane = HostLane::new(shape);
    model_publish_sparse(&lane, shape, 8, (5, 1));
    let err = check(&lane).expect_err("a lost record");
    assert!(
        err.contains("thread 5's round 2 where Some(1) was due"),
        "{err}"
    );
}

// ---- On the GPU. ----

/// A kernel's refusal counters (`result` of the test kernels: refusals, then one per status) in
/// GPU memory.
struct Refusals(RawMemory);

impl Refusals {
    fn new(gpu: &Gpu) -> Refusals {
        let mut m = gpu.alloc(64).expect("result memory");
        m.fill(0, 64, 0).unwrap();
        Refusals(m)
    }

    fn ptr(&self) -> u64 {
        self.0.device_ptr()
    }

    /// [refusals, OK, CLOSED, STALLED, TOO_LARGE].
    fn read(&self) -> [u64; 5] {
        let mut out = [0u64; 5];
        self.0.read_pod(0, &mut out).unwrap();
        out
    }
}

/// Launches `name` with `(view, count, len, result)` on `stream` (not waiting); `grid` is
/// (blocks, threads), `work` (records per producer, payload bytes).
fn launch_producer(
    module: &Module,
    name: &str,
    ring: &DeviceToHostRing,
    stream: &Stream,
    grid: (u32, u32),
    work: (u32, u32),
    result: &Refusals,
) {
    let f = module.function(name).expect("kernel");
    let mut view = ring.device_view();
    let ((mut count, mut len), mut result) = (work, result.ptr());
    // SAFETY: the parameters match the kernel's (vkgdr_d2h_view by value, u32, u32, u64*); the
    // ring and the result memory outlive the kernel (the tests wait for it before dropping them,
    // and their drops never free memory a queued kernel uses).
    unsafe {
        f.launch(
            LaunchConfig::linear(grid.0, grid.1),
            Some(stream),
            &mut [
                arg(&mut view),
                arg(&mut count),
                arg(&mut len),
                arg(&mut result),
            ],
        )
        .expect("launch");
    }
}

/// A test's producer kernels on the GPU, ready to launch: the ring they publish into, their
/// refusal counters and their stream (dropped in this order: all three before the module and
/// the GPU).
struct Producers {
    stream: Stream,
    result: Refusals,
    ring: DeviceToHostRing,
    module: Module,
    gpu: Gpu,
}

impl Producers {
    /// Opens the GPU, loads the test kernels and makes a ring of `lanes` lanes of `shape` whose
    /// producers look at a full lane up to `spin_limit` times before giving up.
    fn new(lanes: u32, shape: LaneShape, spin_limit: u32) -> Producers {
        let gpu = open(false);
        let module = Module::load_ptx(&gpu, D2H_PTX).unwrap();
        let ring = DeviceToHostRing::new(&gpu, lanes, shape, spin_limit).unwrap();
        let result = Refusals::new(&gpu);
        let stream = Stream::new(&gpu).unwrap();
        Producers {
            stream,
            result,
            ring,
            module,
            gpu,
        }
    }

    /// Launches `name` on the stream (not waiting); `grid` and `work` as [`launch_producer`]
    /// takes them.
    fn launch(&self, name: &str, grid: (u32, u32), work: (u32, u32)) {
        launch_producer(
            &self.module,
            name,
            &self.ring,
            &self.stream,
            grid,
            work,
            &self.result,
        );
    }
}

/// Waits (up to 30 s: compute-sanitizer slows the kernel down a hundredfold) until lane 0 of
/// `ring` holds `slots` records its consumer has not taken: the kernel then waits for room.
fn wait_until_full(ring: &DeviceToHostRing, slots: u32) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(30) {
        let stats = ring.lane_stats(0).unwrap();
        if stats.reserved - stats.taken == u64::from(slots) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

/// Gives the last reservations of a lane found full time to be committed (nothing waits between
/// a reservation and its commit, but a warp under compute-sanitizer is slow).
fn settle_commits() {
    std::thread::sleep(Duration::from_millis(if under_sanitizer() {
        500
    } else {
        20
    }));
}

/// Starts the watchdog for a test: the process ends, with a message, if `done` is not set in time.
fn guard(what: &'static str, limit: Duration) -> Arc<AtomicBool> {
    let done = Arc::new(AtomicBool::new(false));
    watchdog(what, limit, ThreadStates::new(0), Arc::clone(&done));
    done
}

/// Every thread of `blocks` blocks of `threads` publishes `per_thread` records of 48 bytes
/// (d2h_produce_check) into `lanes` lanes of `slots` slots of 64 bytes (128 when tagged); one
/// CPU thread per lane checks every record. Returns the records per lane.
fn many_producers(
    format: SlotFormat,
    lanes: u32,
    slots: u32,
    blocks: u32,
    threads: u32,
    per_thread: u32,
) -> Vec<u64> {
    const LEN: u32 = 48;
    let done = guard("many_producers", Duration::from_secs(300));
    let stride = if format == SlotFormat::Tagged {
        128
    } else {
        64
    };
    let shape = LaneShape::new(slots, stride).unwrap().with_format(format);
    let p = Producers::new(lanes, shape, 5_000_000);
    let consumers = p.ring.consumers().unwrap();
    let started = Instant::now();
    p.launch("d2h_produce_check", (blocks, threads), (per_thread, LEN));
    p.ring.finish_after(&p.stream).unwrap();
    let checkers: Vec<_> = consumers
        .into_iter()
        .enumerate()
        .map(|(lane, mut consumer)| {
            std::thread::spawn(move || {
                let lane_of = move |thread: u32| (thread / threads) % lanes;
                let mut checker = TestLaneChecker::new(lane as u32, 1, LEN as usize, lane_of);
                loop {
                    match consumer.next_timeout(Duration::from_secs(1)) {
                        Ok(Poll::Record(rec)) => checker.check(&rec).map_err(|e| e.to_string())?,
                        Ok(Poll::Pending) => {}
                        Ok(Poll::Ended) => break,
                        Err(e) => return Err(format!("lane {lane}: {e}")),
                    }
                }
                checker
                    .all_rounds(blocks * threads, per_thread)
                    .map_err(|e| e.to_string())?;
                Ok::<u64, String>(checker.count())
            })
        })
        .collect();
    let counts: Vec<u64> = checkers
        .into_iter()
        .map(|c| c.join().unwrap().unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let elapsed = started.elapsed();
    assert!(
        p.ring.is_finished(),
        "the lanes ended only after the kernel"
    );
    assert_eq!(p.result.read(), [0; 5], "no publication refused");
    let total: u64 = counts.iter().sum();
    assert_eq!(
        total,
        u64::from(blocks * threads * per_thread),
        "every record delivered"
    );
    for lane in 0..lanes {
        let stats = p.ring.lane_stats(lane).unwrap();
        assert_eq!(
            (stats.reserved, stats.taken, stats.gave_up),
            (counts[lane as usize], counts[lane as usize], 0),
            "lane {lane}'s counters"
        );
    }
    println!(
        "{total} records of {LEN} bytes ({format:?}) over {lanes} lanes in {elapsed:?}: \
         {:.1} M records/s",
        total as f64 / elapsed.as_secs_f64() / 1e6
    );
    done.store(true, Ordering::Release);
    counts
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn millions_of_records_from_every_warp_arrive_checked_in_order() {
    millions_of_records(SlotFormat::Committed);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn millions_of_tagged_records_from_every_warp_arrive_checked_in_order() {
    millions_of_records(SlotFormat::Tagged);
}

fn millions_of_records(format: SlotFormat) {
    let (lanes, slots) = (8, 4096);
    // 264 blocks of 256 threads (two per SM of an H100/H200: all resident) x 48 records each:
    // 3.2 million records, over 400 000 per lane, each lane wrapping about a hundred times.
    let (blocks, per_thread) = if under_sanitizer() {
        (16, 4)
    } else {
        (264, 48)
    };
    let counts = many_producers(format, lanes, slots, blocks, 256, per_thread);
    if !under_sanitizer() {
        for (lane, &n) in counts.iter().enumerate() {
            assert!(
                n / u64::from(slots) >= 90,
                "lane {lane} wrapped only {} times",
                n / u64::from(slots)
            );
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn whole_warps_publish_4_kib_records_checked_byte_for_byte() {
    whole_warps_publish(SlotFormat::Committed, 4080);
}

/// The same into tagged 4 KiB slots: 2,032-byte records, each word tagged.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn whole_warps_publish_tagged_records_checked_byte_for_byte() {
    whole_warps_publish(SlotFormat::Tagged, 2032);
}

fn whole_warps_publish(format: SlotFormat, len: u32) {
    const STRIDE: u32 = 4096;
    let done = guard("whole-warp records", Duration::from_secs(300));
    let lanes = 4;
    let shape = LaneShape::new(256, STRIDE).unwrap().with_format(format);
    assert!(len <= shape.max_payload() && len.is_multiple_of(16));
    let p = Producers::new(lanes, shape, 5_000_000);
    let (blocks, per_warp) = if under_sanitizer() { (4, 4) } else { (132, 64) };
    let warps = blocks * 8;
    let consumers = p.ring.consumers().unwrap();
    p.launch("d2h_produce_warp_check", (blocks, 256), (per_warp, len));
    p.ring.finish_after(&p.stream).unwrap();
    let checkers: Vec<_> = consumers
        .into_iter()
        .enumerate()
        .map(|(lane, mut consumer)| {
            std::thread::spawn(move || {
                let mut checker =
                    TestLaneChecker::new(lane as u32, 2, len as usize, move |w| w % lanes);
                for rec in consumer.records() {
                    let rec = rec.map_err(|e| e.to_string())?;
                    checker
                        .check(&Record {
                            seq: rec.seq,
                            kind: rec.kind,
                            payload: &rec.payload,
                        })
                        .map_err(|e| e.to_string())?;
                }
                checker
                    .all_rounds(warps, per_warp)
                    .map_err(|e| e.to_string())?;
                Ok::<u64, String>(checker.count())
            })
        })
        .collect();
    let total: u64 = checkers
        .into_iter()
        .map(|c| c.join().unwrap().unwrap_or_else(|e| panic!("{e}")))
        .sum();
    assert_eq!(p.result.read(), [0; 5], "no publication refused");
    assert_eq!(total, u64::from(warps * per_warp));
    done.store(true, Ordering::Release);
}

/// Whether thread `thread` publishes in round `round` of `d2h_produce_sparse` (its
/// `d2h_sparse_in`): every thread in every fourth round, about four in five otherwise.
fn sparse_in(thread: u32, round: u32) -> bool {
    round.is_multiple_of(4)
        || !thread
            .wrapping_mul(7)
            .wrapping_add(round.wrapping_mul(3))
            .is_multiple_of(5)
}

/// Checks one lane of `d2h_produce_sparse`'s records (`threads` per block, `rounds` rounds,
/// payloads of 8 to `max_len` bytes): sequence numbers in order, each thread's records in its
/// rounds' order with none missing, every payload byte. Returns the records taken.
fn check_sparse_lane<M: LaneMemory>(
    consumer: &mut LaneConsumer<M>,
    (lane, lanes): (u32, u32),
    (blocks, threads, rounds): (u32, u32, u32),
    max_len: u32,
) -> Result<u64, String> {
    let mut next_round = std::collections::HashMap::<u32, u32>::new();
    let mut n = 0u64;
    for rec in consumer.records() {
        let rec = rec.map_err(|e| format!("lane {lane}: {e}"))?;
        if rec.seq != n || rec.kind != 5 || rec.payload.len() < 8 {
            return Err(format!(
                "lane {lane}: record {} of kind {} and {} bytes where record {n} of kind 5 was due",
                rec.seq,
                rec.kind,
                rec.payload.len()
            ));
        }
        let id = u64::from_le_bytes(rec.payload[..8].try_into().unwrap());
        let (thread, round) = ((id >> 32) as u32, id as u32);
        if thread / threads % lanes != lane {
            return Err(format!(
                "lane {lane}: record {n} of thread {thread} of another lane"
            ));
        }
        let from = next_round.get(&thread).copied().unwrap_or(0);
        let due = (from..rounds).find(|&r| sparse_in(thread, r));
        if due != Some(round) {
            return Err(format!(
                "lane {lane}: record {n}: thread {thread}'s round {round} where {due:?} was due"
            ));
        }
        next_round.insert(thread, round + 1);
        let len = 8 + (id % u64::from(max_len - 7)) as usize;
        let expected = test_payload(id, len);
        if rec.payload.len() != len {
            return Err(format!(
                "lane {lane}: record {n} (thread {thread}, round {round}): {} bytes, expected {len}",
                rec.payload.len()
            ));
        }
        if let Some(at) = (0..len).find(|&i| rec.payload[i] != expected[i]) {
            return Err(format!(
                "lane {lane}: record {n} (thread {thread}, round {round}, {len} bytes): byte {at} \
                 is {:#04x}, expected {:#04x}",
                rec.payload[at], expected[at]
            ));
        }
        n += 1;
    }
    for t in (0..blocks * threads).filter(|t| t / threads % lanes == lane) {
        let from = next_round.get(&t).copied().unwrap_or(0);
        if let Some(r) = (from..rounds).find(|&r| sparse_in(t, r)) {
            return Err(format!("lane {lane}: thread {t}'s round {r} never came"));
        }
    }
    Ok(n)
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn warps_with_some_lanes_publish_records_of_every_length_intact() {
    let done = guard("warps with some lanes", Duration::from_secs(300));
    let gpu = open(false);
    let module = Module::load_ptx(&gpu, D2H_PTX).unwrap();
    let (lanes, blocks, threads) = (4u32, 16u32, 128u32);
    let rounds = if under_sanitizer() { 4 } else { 64 };
    // Slots of 32 to 128 bytes: a warp writes its records' slots together (shuffled pieces,
    // payloads from odd and aligned addresses); 256 bytes: each thread writes its own. Each
    // committed and tagged.
    let formats = [SlotFormat::Committed, SlotFormat::Tagged];
    for (format, stride) in formats
        .into_iter()
        .flat_map(|f| [32u32, 64, 128, 256].map(|s| (f, s)))
    {
        let shape = LaneShape::new(256, stride).unwrap().with_format(format);
        let max_len = shape.max_payload();
        let ring = DeviceToHostRing::new(&gpu, lanes, shape, 5_000_000).unwrap();
        let result = Refusals::new(&gpu);
        let stream = Stream::new(&gpu).unwrap();
        let consumers = ring.consumers().unwrap();
        launch_producer(
            &module,
            "d2h_produce_sparse",
            &ring,
            &stream,
            (blocks, threads),
            (rounds, max_len),
            &result,
        );
        ring.finish_after(&stream).unwrap();
        let checkers: Vec<_> = consumers
            .into_iter()
            .enumerate()
            .map(|(lane, mut consumer)| {
                std::thread::spawn(move || {
                    check_sparse_lane(
                        &mut consumer,
                        (lane as u32, lanes),
                        (blocks, threads, rounds),
                        max_len,
                    )
                })
            })
            .collect();
        let total: u64 = checkers
            .into_iter()
            .map(|c| {
                c.join()
                    .unwrap()
                    .unwrap_or_else(|e| panic!("{stride}-byte {format:?} slots: {e}"))
            })
            .sum();
        assert_eq!(
            result.read(),
            [0; 5],
            "{stride}-byte {format:?} slots: no publication refused"
        );
        let expected: u64 = (0..blocks * threads)
            .map(|t| (0..rounds).filter(|&r| sparse_in(t, r)).count() as u64)
            .sum();
        assert_eq!(
            total, expected,
            "{stride}-byte {format:?} slots: every record delivered"
        );
    }
    done.store(true, Ordering::Release);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn a_slow_consumer_holds_the_kernel_back_and_nothing_is_lost() {
    const LEN: u32 = 48;
    const SLOTS: u32 = 64;
    let done = guard("back-pressure", Duration::from_secs(120));
    // A million looks of up to ~4 µs: far longer than the consumer's naps.
    let p = Producers::new(1, LaneShape::new(SLOTS, 64).unwrap(), 1_000_000);
    let (blocks, threads, per_thread) = (4u32, 64u32, if under_sanitizer() { 8 } else { 64 });
    let total = u64::from(blocks * threads * per_thread);
    let mut consumer = p.ring.consumer(0).unwrap();
    p.launch("d2h_produce_check", (blocks, threads), (per_thread, LEN));
    p.ring.finish_after(&p.stream).unwrap();
    let mut checker = TestLaneChecker::new(0, 1, LEN as usize, |_| 0);
    // Multiples of the warps' 32-record reservations, so the lane fills to the last slot.
    let pauses = [0, total / 4, total / 2];
    let mut failure = None;
    for (i, &at) in pauses.iter().enumerate() {
        // Take records up to the pause, then let the kernel run into the full lane.
        while checker.count() < at {
            match consumer.next_timeout(Duration::from_secs(10)).unwrap() {
                Poll::Record(rec) => checker.check(&rec).unwrap(),
                other => panic!("record {} missing: {other:?}", checker.count()),
            }
        }
        // The head past the last record taken (a one-record call leaves it to the next call).
        consumer.publish_head();
        std::thread::sleep(Duration::from_millis(30));
        assert!(wait_until_full(&p.ring, SLOTS), "pause {i}: the lane fills");
        settle_commits();
        // Everything the lane holds, with one head store at the end: exactly a lane's worth.
        let taken = consumer
            .drain(usize::MAX, |rec| {
                if let Err(e) = checker.check(&rec) {
                    failure.get_or_insert(e);
                }
            })
            .unwrap();
        assert_eq!(failure.take(), None);
        assert_eq!(taken, SLOTS as usize, "pause {i}: a full lane's records");
    }
    for rec in consumer.records() {
        let rec = rec.unwrap();
        checker
            .check(&Record {
                seq: rec.seq,
                kind: rec.kind,
                payload: &rec.payload,
            })
            .unwrap();
    }
    checker.all_rounds(blocks * threads, per_thread).unwrap();
    assert_eq!(checker.count(), total);
    assert_eq!(
        p.result.read(),
        [0; 5],
        "the kernel waited instead of giving up"
    );
    assert_eq!(p.ring.lane_stats(0).unwrap().gave_up, 0);
    done.store(true, Ordering::Release);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn closing_a_lane_releases_the_kernel_waiting_on_it() {
    const LEN: u32 = 48;
    const SLOTS: u32 = 64;
    let done = guard("close releases the kernel", Duration::from_secs(60));
    // The kernel never gives up on its own: only the close can end its wait.
    let p = Producers::new(1, LaneShape::new(SLOTS, 64).unwrap(), u32::MAX);
    let (blocks, threads, per_thread) = (8u32, 64u32, 64u32);
    let mut consumer = p.ring.consumer(0).unwrap();
    p.launch("d2h_produce_check", (blocks, threads), (per_thread, LEN));
    let mut checker = TestLaneChecker::new(0, 1, LEN as usize, |_| 0);
    // A multiple of the warps' 32-record reservations, so the lane fills to the last slot.
    while checker.count() < 96 {
        match consumer.next_timeout(Duration::from_secs(10)).unwrap() {
            Poll::Record(rec) => checker.check(&rec).unwrap(),
            other => panic!("record {} missing: {other:?}", checker.count()),
        }
    }
    consumer.publish_head();
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        wait_until_full(&p.ring, SLOTS),
        "the kernel waits on a full lane"
    );
    settle_commits();
    assert!(
        !wait_for(&p.gpu, &p.stream, Duration::from_millis(20)),
        "the kernel is still waiting"
    );

    consumer.close();
    assert!(
        wait_for(&p.gpu, &p.stream, Duration::from_secs(30)),
        "the kernel did not end within 30 s of the close"
    );
    let counts = p.result.read();
    let (refusals, closed, stalled) = (
        counts[0],
        counts[1 + STATUS_CLOSED as usize],
        counts[1 + STATUS_STALLED as usize],
    );
    assert!(refusals > 0, "some publications were refused");
    assert_eq!(
        (closed, stalled),
        (refusals, 0),
        "every refusal says CLOSED: {counts:?}"
    );
    // What was committed before the close is still there, whole.
    let mut failure = None;
    let left = consumer
        .drain(usize::MAX, |rec| {
            if let Err(e) = checker.check(&rec) {
                failure.get_or_insert(e);
            }
        })
        .unwrap();
    assert_eq!(failure, None);
    assert_eq!(left, SLOTS as usize);
    let after = p.ring.lane_stats(0).unwrap();
    assert_eq!(
        (after.reserved, after.taken),
        (checker.count(), checker.count())
    );
    assert_eq!(
        after.gave_up,
        refusals / 32,
        "one refusal per warp's reservation"
    );
    done.store(true, Ordering::Release);
}

/// Sorted samples' median and 99th percentile.
fn median_p99(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (v[v.len() / 2], v[(v.len() * 99 / 100).min(v.len() - 1)])
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn a_lone_record_s_latency_is_measured() {
    let done = guard("lone record latency", Duration::from_secs(120));
    for format in [SlotFormat::Committed, SlotFormat::Tagged] {
        lone_record_latency(format);
    }
    done.store(true, Ordering::Release);
}

/// A lone record's round trip through a ring of `format`, then from the launch: printed.
fn lone_record_latency(format: SlotFormat) {
    let gpu = open(false);
    let module = Module::load_ptx(&gpu, D2H_PTX).unwrap();
    let shape = LaneShape::new(64, 64).unwrap().with_format(format);
    let ring = DeviceToHostRing::new(&gpu, 1, shape, 1_000_000).unwrap();
    let result = Refusals::new(&gpu);
    let stream = Stream::new(&gpu).unwrap();
    let n: u32 = if under_sanitizer() { 20 } else { 2000 };
    let mut go = gpu.alloc(4096).unwrap();
    go.fill(0, 8, 0).unwrap();
    let go_word = go.host_ptr().cast::<u64>();
    let mut consumer = ring.consumer(0).unwrap();
    {
        let f = module.function("d2h_ping").unwrap();
        let (mut view, mut go_ptr, mut n, mut res) =
            (ring.device_view(), go.device_ptr(), n, result.ptr());
        // SAFETY: (vkgdr_d2h_view, const u64*, u32, u64*) as the kernel takes them; the ring,
        // `go` and `result` outlive it (waited for below).
        unsafe {
            f.launch(
                LaunchConfig::linear(1, 32),
                Some(&stream),
                &mut [arg(&mut view), arg(&mut go_ptr), arg(&mut n), arg(&mut res)],
            )
            .unwrap();
        }
    }
    let mut trips = Vec::with_capacity(n as usize);
    for i in 0..n {
        let t = Instant::now();
        // SAFETY: an aligned u64 of the live BAR mapping `go`, which only the kernel reads.
        unsafe { go_word.write_volatile(u64::from(i) + 1) };
        // Out of the write-combining buffer now (mfence drains it, as sfence does).
        std::sync::atomic::fence(Ordering::SeqCst);
        loop {
            match consumer.poll().unwrap() {
                Poll::Record(rec) => {
                    assert_eq!(
                        (rec.seq, rec.kind, rec.payload),
                        (u64::from(i), 3, &u64::from(i).to_le_bytes()[..])
                    );
                    break;
                }
                Poll::Pending => std::hint::spin_loop(),
                Poll::Ended => unreachable!("no finish was set"),
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "record {i} never came"
            );
        }
        trips.push(t.elapsed());
    }
    assert!(
        wait_for(&gpu, &stream, Duration::from_secs(10)),
        "d2h_ping ended"
    );
    assert_eq!(result.read(), [0; 5]);
    let (median, p99) = median_p99(trips);
    println!(
        "{format:?}: CPU store -> kernel publishes -> CPU sees the record: median {median:?}, \
         p99 {p99:?}"
    );

    // From the launch: a kernel that publishes one record, seen by a polling consumer.
    let lone = module.function("d2h_lone").unwrap();
    let mut from_launch = Vec::new();
    for i in 0..n.min(200) {
        let (mut view, mut value) = (ring.device_view(), u64::from(i) + 7);
        let t = Instant::now();
        // SAFETY: (vkgdr_d2h_view, u64) as the kernel takes them; the ring outlives it.
        unsafe {
            lone.launch(
                LaunchConfig::linear(1, 32),
                Some(&stream),
                &mut [arg(&mut view), arg(&mut value)],
            )
            .unwrap();
        }
        let rec = loop {
            if let Poll::Record(rec) = consumer.poll().unwrap() {
                break rec;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "lone record {i} never came"
            );
        };
        from_launch.push(t.elapsed());
        assert_eq!(
            (rec.kind, rec.payload),
            (4, &(u64::from(i) + 7).to_le_bytes()[..])
        );
    }
    let (median, p99) = median_p99(from_launch);
    println!("{format:?}: launch -> lone record seen: median {median:?}, p99 {p99:?}");
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn lanes_are_handed_out_once_and_checked() {
    let gpu = open(false);
    let ring = DeviceToHostRing::new(&gpu, 2, LaneShape::new(64, 64).unwrap(), 1000).unwrap();
    let first = ring.consumer(1).unwrap();
    assert!(matches!(
        ring.consumer(1),
        Err(vkgdr::Error::D2h(
            vkgdr::ring::core::d2h::D2hError::LaneTaken { lane: 1 }
        ))
    ));
    assert!(matches!(
        ring.consumer(2),
        Err(vkgdr::Error::D2h(
            vkgdr::ring::core::d2h::D2hError::NoSuchLane { lane: 2, lanes: 2 }
        ))
    ));
    drop(first);
    let again = ring.consumer(1).expect("free again once dropped");
    assert_eq!(again.next_seq(), 0);
    assert!(DeviceToHostRing::new(&gpu, 0, LaneShape::new(64, 64).unwrap(), 1).is_err());
    assert!(!ring.is_finished());
    ring.finish();
    assert!(ring.is_finished());
    ring.restart();
    assert!(!ring.is_finished());
}
