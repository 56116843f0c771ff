//! Ring buffers on the GPU: 1,000,000 records of mixed sizes from 4 producer threads, consumed by a
//! persistent kernel and by one launch per batch; the kernels check every record's sequence number
//! and checksum, the CPU checks the totals: nothing lost, duplicated or torn. The same for
//! mirrored rings (records run past the end of the region with no padding, read contiguously by
//! the `_mirrored` kernels through the arena's mirror mapping). Lanes: one producer thread per
//! lane writing every way the `Producer` offers, checked by `ring_check_lanes` (the device API
//! of `include/vkgdr/ring.cuh`), and what happens when the consumer stops or the ring is dropped
//! under it.

mod common;

use std::ffi::c_void;
use std::time::{Duration, Instant};

use common::*;
use rand::{Rng, SeedableRng};
use vkgdr::cuda_objects::{Event, Function, LaunchConfig, Module, Stream};
use vkgdr::ring::core::{FlushPolicy, Reservation, RingCore, RingSink};
use vkgdr::ring::layout::{self, seal_test_payload, WrapMode};
use vkgdr::ring::{BarSink, CopyEngine, DeviceRing, LaunchRing, RingDeviceView, RingOptions};
use vkgdr::{Error, OpenOptions};

const RING_PTX: &str = include_str!("../kernels/ring.ptx");
/// Records per long test: a million, or 64,000 under compute-sanitizer (`VKGDR_UNDER_SANITIZER`,
/// set by `scripts/gpu-check` under `SANITIZE=1`), whose racecheck makes every access of the
/// consumer's shared memory a hundred times slower. Both split evenly over the producers of
/// every test (a multiple of 8 × 4).
fn records() -> u64 {
    if under_sanitizer() {
        64_000
    } else {
        1_000_000
    }
}

/// How many records a mirrored test must see cross the end of the ring: with the sanitizer's
/// fewer records, two (both a crossing and the next one) still prove the wrap.
fn min_crossings() -> u64 {
    if under_sanitizer() {
        2
    } else {
        10
    }
}
const PRODUCERS: u64 = 4;

/// The copy engine as a user turns it on: records of 4 KiB and more.
const LARGE_ON_COPY_ENGINE: CopyEngine =
    CopyEngine::FromRecord(vkgdr::ring::device::DEFAULT_COPY_ENGINE_RECORD);

/// Two padded lanes with the copy engine on for large records.
fn two_lanes_on_copy_engine() -> RingOptions {
    RingOptions {
        lanes: 2,
        wrap: WrapMode::Padded,
        copy_engine: LARGE_ON_COPY_ENGINE,
    }
}

/// Largest payload `payload_len` returns with `large`.
const LARGE_MAX: u32 = 256 << 10;

/// A payload length: mostly small, some medium, a few 4 KiB; with `large`, 1 % are 4 KiB-256 KiB
/// (so records cross the end of a mirrored ring at every size and the kernel's whole-block path
/// reads across it too).
fn payload_len(rng: &mut impl Rng, large: bool) -> u32 {
    match rng.gen_range(0..100) {
        0 if large => rng.gen_range(4097..=LARGE_MAX),
        0..=79 => rng.gen_range(16..=128),
        80..=97 => rng.gen_range(129..=1024),
        _ => 4096,
    }
}

/// What the producers wrote.
#[derive(Default)]
struct Produced {
    /// Wrapping sum of the payload checksums (the kernel's RESULT_CHECKSUM_SUM).
    sum: u64,
    /// Ring bytes of all records (headers and alignment included).
    bytes: u64,
    /// Records that ran past the end of the region.
    crossings: u64,
}

/// Produces `per_thread` sealed records on each of 4 threads.
fn produce<'r, S: RingSink + Sync + 'r>(
    per_thread: u64,
    capacity: u64,
    large: bool,
    reserve: &(dyn Fn(u32) -> vkgdr::Result<Reservation<'r, S>> + Sync),
) -> Produced {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..PRODUCERS)
            .map(|t| {
                s.spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                    let mut buf = vec![0u8; LARGE_MAX as usize];
                    let mut out = Produced::default();
                    for _ in 0..per_thread {
                        let len = payload_len(&mut rng, large);
                        let mut r = reserve(len).expect("reserve");
                        let body = &mut buf[..len as usize];
                        rng.fill(&mut body[layout::TEST_PREFIX_LEN..]);
                        let sum = seal_test_payload(body, r.seq()).expect("len >= 16");
                        out.sum = out.sum.wrapping_add(sum);
                        out.bytes += r.end() - r.pos();
                        if r.offset() + (r.end() - r.pos()) > capacity {
                            out.crossings += 1;
                        }
                        r.write(0, body).expect("write");
                        r.commit();
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .fold(Produced::default(), |a, b| Produced {
                sum: a.sum.wrapping_add(b.sum),
                bytes: a.bytes + b.bytes,
                crossings: a.crossings + b.crossings,
            })
    })
}

fn wait(event: &Event, limit: Duration) {
    let t = Instant::now();
    while !event.is_complete().unwrap() {
        assert!(t.elapsed() < limit, "consumer kernel did not finish");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Launches a persistent consumer (`kernel`, one block of `CHECK_THREADS`) on `ring`; the returned
/// event completes when it exits.
fn launch_persistent(module: &Module, kernel: &str, ring: &DeviceRing, stream: &Stream) -> Event {
    let kernel = module.function(kernel).unwrap();
    let v = ring.device_view();
    let (mut d, mut c, mut t, mut st, mut h, mut r) =
        (v.data, v.capacity, v.tail, v.stop, v.head, v.result);
    let mut params: Vec<*mut c_void> = vec![
        arg(&mut d),
        arg(&mut c),
        arg(&mut t),
        arg(&mut st),
        arg(&mut h),
        arg(&mut r),
    ];
    // SAFETY: ring_consume_persistent[_mirrored](const u8*, u64, u64*, u32*, u64*, u64*): six
    // 8-byte parameters; all addresses belong to `ring`, which the callers keep alive until the
    // returned event has completed.
    unsafe {
        kernel
            .launch(
                LaunchConfig::linear(1, layout::CHECK_THREADS),
                Some(stream),
                &mut params,
            )
            .unwrap()
    };
    let done = Event::new(ring.gpu()).unwrap();
    done.record(stream).unwrap();
    done
}

fn persistent(force_non_coherent: bool, records: u64, wrap: WrapMode) {
    let gpu = open(force_non_coherent);
    let module = Module::load_ptx(&gpu, RING_PTX).unwrap();
    let (ring, kernel) = match wrap {
        WrapMode::Padded => (DeviceRing::new(&gpu, 1 << 20), "ring_consume_persistent"),
        WrapMode::Mirrored => (
            DeviceRing::new_mirrored(&gpu, 2 << 20),
            "ring_consume_persistent_mirrored",
        ),
    };
    let ring = ring.unwrap();
    assert_eq!(ring.device_view().wrap, wrap);
    let capacity = ring.core().capacity();
    let stream = Stream::new(&gpu).unwrap();
    let done = launch_persistent(&module, kernel, &ring, &stream);
    // If an assertion fails below, still stop the kernel before the ring is freed under it.
    let _stop = StopOnDrop(&ring, &done);

    let t0 = Instant::now();
    let large = wrap == WrapMode::Mirrored;
    let produced = produce(records / PRODUCERS, capacity, large, &|len| {
        ring.reserve(len, Some(Duration::from_secs(30)))
    });
    ring.stop();
    wait(&done, Duration::from_secs(60));
    let elapsed = t0.elapsed();
    let res = ring.results();
    println!(
        "persistent ({wrap:?}, non-coherent {force_non_coherent}): {} records in {elapsed:?} \
         ({:.2} M records/s), {} crossed the end",
        res[layout::RESULT_RECORDS],
        res[layout::RESULT_RECORDS] as f64 / elapsed.as_secs_f64() / 1e6,
        produced.crossings
    );
    check_consumed(&res, records, &produced, wrap, ring.core().committed());
    assert_eq!(ring.head(), ring.core().committed());
}

/// The kernel's result words and the ring's end position against what the producers wrote: every
/// record seen once, in order, intact; a mirrored ring holds records only (no padding) and some
/// of them crossed its end, a padded ring's never do.
fn check_consumed(
    res: &[u64; layout::RESULT_WORDS],
    records: u64,
    produced: &Produced,
    wrap: WrapMode,
    committed: u64,
) {
    assert_eq!(
        res[layout::RESULT_ERRORS],
        0,
        "kernel found bad records: {res:?}"
    );
    assert_eq!(res[layout::RESULT_RECORDS], records);
    assert_eq!(res[layout::RESULT_NEXT_SEQ], records);
    assert_eq!(res[layout::RESULT_CHECKSUM_SUM], produced.sum);
    match wrap {
        WrapMode::Padded => assert_eq!(produced.crossings, 0),
        WrapMode::Mirrored => {
            assert_eq!(
                committed, produced.bytes,
                "a mirrored ring holds records only, no padding"
            );
            assert!(
                produced.crossings >= min_crossings(),
                "{} crossed",
                produced.crossings
            );
        }
    }
}

/// Stops a persistent consumer and waits for it when dropped (also while unwinding).
struct StopOnDrop<'a>(&'a DeviceRing, &'a Event);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.stop();
        let t = Instant::now();
        while !self.1.is_complete().unwrap_or(true) && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn persistent_kernel_consumes_a_million_records() {
    persistent(false, records(), WrapMode::Padded);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn persistent_kernel_forced_non_coherent() {
    persistent(true, records() / 4, WrapMode::Padded);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn mirrored_ring_persistent_kernel_reads_records_across_the_end() {
    persistent(false, records() / 2, WrapMode::Mirrored);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn mirrored_ring_forced_non_coherent() {
    persistent(true, records() / 8, WrapMode::Mirrored);
}

/// Launches `ring_consume_batch[_mirrored]` over `[from, to)` on `stream`, expecting seq `seq`
/// first (`layout::SEQ_FROM_RESULT`: continue from the result words).
fn launch_batch(
    kernel: &Function,
    v: &RingDeviceView,
    (from, to): (u64, u64),
    mut seq: u64,
    stream: &Stream,
) -> vkgdr::Result<()> {
    let (mut d, mut c, mut f, mut t, mut r) = (v.data, v.capacity, from, to, v.result);
    let mut p = [
        arg(&mut d),
        arg(&mut c),
        arg(&mut f),
        arg(&mut t),
        arg(&mut r),
        arg(&mut seq),
    ];
    // SAFETY: ring_consume_batch[_mirrored](const u8*, u64, u64, u64, u64*, u64): six 8-byte
    // parameters; the callers keep the ring alive until the stream's work is done.
    unsafe {
        kernel.launch(
            LaunchConfig::linear(1, layout::CHECK_THREADS),
            Some(stream),
            &mut p,
        )
    }
}

fn launch_mode(records: u64, wrap: WrapMode) {
    let gpu = open(false);
    let module = Module::load_ptx(&gpu, RING_PTX).unwrap();
    let (ring, kernel) = match wrap {
        WrapMode::Padded => (LaunchRing::new(&gpu, 1 << 20), "ring_consume_batch"),
        WrapMode::Mirrored => (
            LaunchRing::new_mirrored(&gpu, 2 << 20),
            "ring_consume_batch_mirrored",
        ),
    };
    let ring = ring.unwrap();
    let kernel = module.function(kernel).unwrap();
    let v = ring.ring().device_view();
    let capacity = v.capacity;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut batches = 0u64;
    let produced = std::thread::scope(|s| {
        let launcher = s.spawn(|| {
            let mut n = 0u64;
            let launch_once = || {
                ring.launch_pending(|from, to, stream| {
                    launch_batch(&kernel, &v, (from, to), layout::SEQ_FROM_RESULT, stream)
                })
                .unwrap()
            };
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                if launch_once().is_some() {
                    n += 1;
                }
                ring.reclaim().unwrap();
                std::thread::sleep(Duration::from_micros(200));
            }
            if launch_once().is_some() {
                n += 1;
            }
            n
        });
        let produced = produce(
            records / PRODUCERS,
            capacity,
            wrap == WrapMode::Mirrored,
            &|len| ring.reserve(len, Some(Duration::from_secs(30))),
        );
        stop.store(true, std::sync::atomic::Ordering::Release);
        batches = launcher.join().unwrap();
        produced
    });
    ring.drain().unwrap();
    let res = ring.ring().results();
    println!(
        "launch mode ({wrap:?}): {} records in {batches} batches, {} crossed the end",
        res[layout::RESULT_RECORDS],
        produced.crossings
    );
    let core = ring.ring().core();
    check_consumed(&res, records, &produced, wrap, core.committed());
    assert_eq!(core.reclaimed(), core.committed());
    assert!(batches > 1);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn launch_mode_consumes_a_million_records() {
    launch_mode(records(), WrapMode::Padded);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn mirrored_launch_mode_batches_cross_the_end() {
    launch_mode(records() / 2, WrapMode::Mirrored);
}

/// One record that crosses the end of a mirrored ring: the bytes at `data + offset` are the whole
/// record for the GPU (a DMA copy through the mirror), the mirrored batch kernel accepts it, and
/// the padded kernel rejects it (so the `_mirrored` flag is what makes the difference).
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn mirrored_record_is_contiguous_for_the_gpu() {
    let gpu = open(false);
    let module = Module::load_ptx(&gpu, RING_PTX).unwrap();
    let cap = 2u64 << 20;
    let ring = LaunchRing::new_mirrored(&gpu, cap).unwrap();
    let core = ring.ring().core();
    assert_eq!(core.wrap_mode(), WrapMode::Mirrored);
    // Fill to 100 KiB before the end, consume it, then write one 300 KiB record over the end.
    let filler = (cap - (100 << 10)) as u32 - 16;
    ring.reserve(filler, None).unwrap().commit();
    // "Consume" the filler with an empty launch: its event reclaims the space.
    ring.launch_pending(|_, _, _| Ok(())).unwrap();
    ring.drain().unwrap();
    assert_eq!(core.reclaimed(), core.committed());
    let len = 300u32 << 10;
    let mut r = ring.reserve(len, None).unwrap();
    let (pos, off, seq) = (r.pos(), r.offset(), r.seq());
    assert_eq!(pos, core.committed(), "no padding before the record");
    assert!(
        off + 16 + u64::from(len) > cap,
        "the record crosses the end"
    );
    let mut payload: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
    let sum = seal_test_payload(&mut payload, seq).unwrap();
    r.write(0, &payload).unwrap();
    let end = r.commit();

    let v = ring.ring().device_view();
    let mut rec = vec![0u8; 16 + len as usize];
    // SAFETY: [data + off, data + off + 16 + len) lies in the chunk and its mirror.
    unsafe { gpu.memcpy_dtoh(&mut rec, v.data + off).unwrap() };
    let header = layout::RecordHeader::from_bytes(rec[..16].try_into().unwrap());
    assert_eq!(
        (header.len, header.kind, header.seq),
        (len, layout::KIND_DATA, seq)
    );
    assert!(
        rec[16..] == payload[..],
        "the GPU sees the record whole through the mirror"
    );

    let stream = Stream::new(&gpu).unwrap();
    for (name, errors, records) in [
        ("ring_consume_batch", 1, 0),
        ("ring_consume_batch_mirrored", 0, 1),
    ] {
        let kernel = module.function(name).unwrap();
        // SAFETY: the result words are this ring's pinned words; no kernel is running.
        unsafe {
            gpu.memset_d32(v.result, 0, 2 * layout::RESULT_WORDS)
                .unwrap()
        };
        gpu.synchronize().unwrap();
        launch_batch(&kernel, &v, (pos, end), seq, &stream).unwrap();
        stream.synchronize().unwrap();
        let got = ring.ring().results();
        println!("mirrored record ({len} bytes at offset {off}) under {name}: {got:?}");
        assert_eq!(got[layout::RESULT_ERRORS], errors, "{name}");
        assert_eq!(got[layout::RESULT_RECORDS], records, "{name}");
        if records == 1 {
            assert_eq!(got[layout::RESULT_CHECKSUM_SUM], sum);
            assert_eq!(got[layout::RESULT_POS], end);
        } else {
            assert_eq!(
                got[layout::RESULT_POS],
                pos,
                "the padded walker stops at the crossing"
            );
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn ring_errors() {
    let gpu = vkgdr::Gpu::open_with(0, OpenOptions::new()).unwrap();
    assert!(matches!(DeviceRing::new(&gpu, 3000), Err(Error::Ring(_))));
    let ring = DeviceRing::new(&gpu, 4096).unwrap();
    assert!(matches!(ring.reserve(5000, None), Err(Error::Ring(_))));
    // Nothing consumes: the ring fills, then try_reserve says Full and reserve times out.
    while ring.try_reserve(1000).map(|r| r.commit()).is_ok() {}
    assert!(matches!(
        ring.try_reserve(1000),
        Err(Error::Ring(vkgdr::ring::core::RingError::Full))
    ));
    assert!(matches!(
        ring.reserve(1000, Some(Duration::from_millis(20))),
        Err(Error::Ring(vkgdr::ring::core::RingError::Timeout))
    ));
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn mirrored_ring_errors() {
    let gpu = vkgdr::Gpu::open_with(0, OpenOptions::new()).unwrap();
    assert!(matches!(
        DeviceRing::new_mirrored(&gpu, 3 << 20),
        Err(Error::Ring(_))
    ));
    // A power of two below the 2 MiB VMM granularity.
    assert!(matches!(
        DeviceRing::new_mirrored(&gpu, 1 << 20),
        Err(Error::InvalidArgument(_))
    ));
    let ring = DeviceRing::new_mirrored(&gpu, 2 << 20).unwrap();
    assert_eq!(ring.core().max_record() as u64, (2 << 20) - 16);
    // Nothing consumes: fills up, then Full, with no PAD ever written.
    let mut n = 0u64;
    while ring.try_reserve(100_000).map(|r| r.commit()).is_ok() {
        n += 1;
    }
    assert_eq!(ring.core().committed(), n * layout::record_size(100_000));
    assert!(matches!(
        ring.try_reserve(100_000),
        Err(Error::Ring(vkgdr::ring::core::RingError::Full))
    ));
}

/// Launches `ring_check_lanes` (one block of `CHECK_THREADS` per lane) on `stream` and registers it
/// as the ring's consumer.
fn launch_check_lanes(module: &Module, ring: &DeviceRing, stream: &Stream) {
    let kernel = module.function("ring_check_lanes").unwrap();
    let mut view = ring.device_view();
    let mut params: Vec<*mut c_void> = vec![(&mut view as *mut RingDeviceView).cast()];
    // SAFETY: ring_check_lanes(vkgdr_ring_view) takes the 64-byte #[repr(C)] view by value; the
    // ring is watched below, so dropping it stops the kernel and waits before freeing memory.
    unsafe {
        kernel
            .launch(
                LaunchConfig::linear(view.lanes, layout::CHECK_THREADS),
                Some(stream),
                &mut params,
            )
            .unwrap()
    };
    ring.watch_consumer(stream).unwrap();
}

/// What one lane's producer wrote.
#[derive(Default)]
struct LaneProduced {
    lane: usize,
    records: u64,
    /// DATA and abandoned records: the lane's next seq.
    seqs: u64,
    sum: u64,
    crossings: u64,
}

impl LaneProduced {
    /// Nothing written yet by the producer of `core`, one of `ring`'s lanes.
    fn on_lane_of(ring: &DeviceRing, core: &RingCore<BarSink>) -> Self {
        let lane = (0..ring.lanes())
            .find(|&i| std::ptr::eq(ring.lane(i).unwrap(), core))
            .unwrap();
        LaneProduced {
            lane,
            ..Default::default()
        }
    }
}

/// One producer thread per lane, every way of writing mixed: deferred writes (published by the
/// flush policy), immediate pushes, batches, records written in place, abandoned records.
fn produce_lanes(ring: &DeviceRing, per_thread: u64, large: bool) -> Vec<LaneProduced> {
    let capacity = ring.core().capacity();
    let limit = Some(Duration::from_secs(30));
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..ring.lanes())
            .map(|t| {
                s.spawn(move || {
                    let mut p = ring.producer().expect("a free lane");
                    // Writes gather up to 256 KiB, so large records meet the copy engine's rule
                    // (64 KiB pending before them).
                    p.set_policy(FlushPolicy {
                        max_pending_bytes: 256 << 10,
                        max_delay: None,
                    });
                    let mut out = LaneProduced::on_lane_of(ring, p.core());
                    let mut rng = rand::rngs::StdRng::seed_from_u64(100 + t as u64);
                    let payload = |rng: &mut rand::rngs::StdRng, seq: u64| {
                        let len = payload_len(rng, large);
                        let mut body = vec![0u8; len as usize];
                        rng.fill(&mut body[layout::TEST_PREFIX_LEN..]);
                        let sum = seal_test_payload(&mut body, seq).unwrap();
                        (body, sum)
                    };
                    let count = |out: &mut LaneProduced, pos: u64, len: usize, sum: u64| {
                        out.records += 1;
                        out.seqs += 1;
                        out.sum = out.sum.wrapping_add(sum);
                        if (pos & (capacity - 1)) + layout::record_size(len as u32) > capacity {
                            out.crossings += 1;
                        }
                    };
                    // Abandoned reservations take a seq but deliver no record: count records.
                    while out.records < per_thread {
                        let pos = p.core().reserved();
                        // Every other stretch of 2,000 records only writes (published by the
                        // policy), so batches grow past the copy engine's 64 KiB.
                        let write_only = (out.records / 2_000) % 2 == 1;
                        match if write_only { 0 } else { rng.gen_range(0..100) } {
                            0..=69 => {
                                let (body, sum) = payload(&mut rng, p.next_seq());
                                p.write(&body, limit).unwrap();
                                let size = layout::record_size(body.len() as u32);
                                count(&mut out, p.core().reserved() - size, body.len(), sum);
                            }
                            70..=79 => {
                                let (body, sum) = payload(&mut rng, p.next_seq());
                                p.push(&body, limit).unwrap();
                                let size = layout::record_size(body.len() as u32);
                                count(&mut out, p.core().reserved() - size, body.len(), sum);
                            }
                            80..=89 => {
                                let len = payload_len(&mut rng, large);
                                let mut rec = p.reserve(len, limit).unwrap();
                                let mut body = vec![0u8; len as usize];
                                rng.fill(&mut body[layout::TEST_PREFIX_LEN..]);
                                let sum = seal_test_payload(&mut body, rec.seq()).unwrap();
                                let cut = body.len() / 3;
                                rec.write(0, &body[..cut]).unwrap();
                                rec.write(cut as u32, &body[cut..]).unwrap();
                                let at = rec.pos();
                                rec.commit();
                                count(&mut out, at, body.len(), sum);
                            }
                            90 => {
                                drop(p.reserve(payload_len(&mut rng, large), limit).unwrap());
                                out.seqs += 1;
                            }
                            _ => {
                                let first = p.next_seq();
                                let batch: Vec<(Vec<u8>, u64)> =
                                    (0..8).map(|i| payload(&mut rng, first + i)).collect();
                                p.push_batch(batch.iter().map(|(b, _)| b.as_slice()), limit)
                                    .unwrap();
                                // Positions only matter for the crossing count: recount them.
                                let mut at = pos;
                                for (b, sum) in &batch {
                                    let size = layout::record_size(b.len() as u32);
                                    if ring.core().wrap_mode() == WrapMode::Padded
                                        && (at & (capacity - 1)) + size > capacity
                                    {
                                        at = at.next_multiple_of(capacity);
                                    }
                                    count(&mut out, at, b.len(), *sum);
                                    at += size;
                                }
                            }
                        }
                    }
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// What the checking kernel found on each lane, once the ring has stopped, against what its
/// producer wrote: every record, sequence number and checksum, no error, the head at the end.
fn check_lanes(ring: &DeviceRing, produced: &[LaneProduced]) {
    for p in produced {
        let res = ring.results_of(p.lane);
        assert_eq!(res[layout::RESULT_ERRORS], 0, "lane {}: {res:?}", p.lane);
        assert_eq!(res[layout::RESULT_RECORDS], p.records, "lane {}", p.lane);
        assert_eq!(res[layout::RESULT_NEXT_SEQ], p.seqs, "lane {}", p.lane);
        assert_eq!(res[layout::RESULT_CHECKSUM_SUM], p.sum, "lane {}", p.lane);
        let core = ring.lane(p.lane).unwrap();
        assert_eq!(res[layout::RESULT_POS], core.committed());
        assert_eq!(ring.head_of(p.lane), core.committed());
    }
}

/// Every lane's records checked by `ring_check_lanes` against what its producer wrote, with the
/// producers' large records on the copy-engine path as `copy` says.
fn lanes_persistent(
    force_non_coherent: bool,
    records: u64,
    wrap: WrapMode,
    lanes: u32,
    copy: CopyEngine,
) {
    let gpu = open(force_non_coherent);
    let module = Module::load_ptx(&gpu, RING_PTX).unwrap();
    let capacity = if wrap == WrapMode::Mirrored {
        2 << 20
    } else {
        1 << 20
    };
    let options = RingOptions {
        lanes,
        wrap,
        copy_engine: copy,
    };
    let ring = DeviceRing::with_options(&gpu, capacity, options).unwrap();
    let stream = Stream::new(&gpu).unwrap();
    launch_check_lanes(&module, &ring, &stream);
    let t0 = Instant::now();
    let produced = produce_lanes(
        &ring,
        records / u64::from(lanes),
        wrap == WrapMode::Mirrored,
    );
    ring.stop_and_wait(Duration::from_secs(60)).unwrap();
    let elapsed = t0.elapsed();
    let total: u64 = produced.iter().map(|p| p.records).sum();
    let crossings: u64 = produced.iter().map(|p| p.crossings).sum();
    let copies = ring.copy_engine_stats();
    println!(
        "lanes ({lanes} lanes, {wrap:?}, non-coherent {force_non_coherent}, {copy:?}): {total} \
         records in {elapsed:?} ({:.2} M records/s), {crossings} crossed the end; {copies:?}",
        total as f64 / elapsed.as_secs_f64() / 1e6
    );
    assert!(total >= records);
    // Every test's mix has records of 4 KiB and more: with the path on, copies carried them.
    match copy {
        CopyEngine::Off => assert_eq!(copies.lanes_ready, 0),
        CopyEngine::Auto => unreachable!("the tests name their path"),
        CopyEngine::FromRecord(_) | CopyEngine::Split(_) => {
            assert_eq!(copies.unavailable, None);
            assert_eq!(copies.lanes_ready, lanes as usize);
            assert!(copies.copies > 0 && copies.bytes > 0, "{copies:?}");
            assert_eq!(copies.fallbacks, 0);
        }
    }
    check_lanes(&ring, &produced);
    if wrap == WrapMode::Mirrored {
        assert!(crossings >= min_crossings(), "{crossings} crossed");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn lanes_checking_kernel_a_million_records() {
    lanes_persistent(false, records(), WrapMode::Padded, 4, LARGE_ON_COPY_ENGINE);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn lanes_checking_kernel_every_record_through_the_bar() {
    lanes_persistent(false, records() / 2, WrapMode::Padded, 4, CopyEngine::Off);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn lanes_checking_kernel_copy_engine_for_every_size() {
    lanes_persistent(
        false,
        records(),
        WrapMode::Padded,
        4,
        CopyEngine::FromRecord(16),
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn mirrored_lanes_copy_engine_for_every_size() {
    lanes_persistent(
        false,
        records() / 2,
        WrapMode::Mirrored,
        4,
        CopyEngine::FromRecord(16),
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn lanes_copy_engine_forced_non_coherent() {
    lanes_persistent(
        true,
        records() / 4,
        WrapMode::Padded,
        4,
        CopyEngine::FromRecord(1024),
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn lanes_checking_kernel_forced_non_coherent() {
    lanes_persistent(
        true,
        records() / 4,
        WrapMode::Padded,
        4,
        LARGE_ON_COPY_ENGINE,
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn mirrored_lanes_checking_kernel() {
    lanes_persistent(
        false,
        records() / 2,
        WrapMode::Mirrored,
        4,
        LARGE_ON_COPY_ENGINE,
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn mirrored_lanes_forced_non_coherent() {
    lanes_persistent(
        true,
        records() / 8,
        WrapMode::Mirrored,
        2,
        LARGE_ON_COPY_ENGINE,
    );
}

/// Small groups: each lane's producer publishes runs of 1 to 8 records of 16 to 96 payload bytes
/// (a push, or a batch), one publication per run, into lanes of 64 KiB, so the checking kernel's
/// window reader mostly sees windows of at most 512 bytes, the ones its warp 0 reads alone: a
/// lone record (one record filling the window, whose head it publishes before the block's
/// barrier) or a few (the chain through them resolved with shuffles). A reader that lost a record
/// of a small group fails the counts; one that published a head past what it had read leaves the
/// head beyond the committed position (the producers' reservations refuse such a head, and the
/// check at the end sees it).
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn lanes_small_groups_through_the_readers_warp_path() {
    let gpu = open(false);
    let module = Module::load_ptx(&gpu, RING_PTX).unwrap();
    let options = RingOptions {
        lanes: 4,
        wrap: WrapMode::Padded,
        copy_engine: CopyEngine::Off,
    };
    let ring = DeviceRing::with_options(&gpu, 64 << 10, options).unwrap();
    let stream = Stream::new(&gpu).unwrap();
    launch_check_lanes(&module, &ring, &stream);
    let per_lane = records() / 10;
    let limit = Some(Duration::from_secs(30));
    let t0 = Instant::now();
    let produced: Vec<LaneProduced> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..ring.lanes())
            .map(|t| {
                let ring = &ring;
                s.spawn(move || {
                    let mut p = ring.producer().expect("a free lane");
                    let mut out = LaneProduced::on_lane_of(ring, p.core());
                    let mut rng = rand::rngs::StdRng::seed_from_u64(300 + t as u64);
                    while out.records < per_lane {
                        let first = p.next_seq();
                        let run: Vec<(Vec<u8>, u64)> = (0..rng.gen_range(1..=8u64))
                            .map(|i| {
                                let len = rng.gen_range(layout::TEST_PREFIX_LEN..=96);
                                let mut body = vec![0u8; len];
                                rng.fill(&mut body[layout::TEST_PREFIX_LEN..]);
                                let sum = seal_test_payload(&mut body, first + i).unwrap();
                                (body, sum)
                            })
                            .collect();
                        if let [(body, _)] = run.as_slice() {
                            p.push(body, limit).unwrap();
                        } else {
                            p.push_batch(run.iter().map(|(b, _)| b.as_slice()), limit)
                                .unwrap();
                        }
                        for (_, sum) in &run {
                            out.records += 1;
                            out.seqs += 1;
                            out.sum = out.sum.wrapping_add(*sum);
                        }
                    }
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    ring.stop_and_wait(Duration::from_secs(60)).unwrap();
    let total: u64 = produced.iter().map(|p| p.records).sum();
    println!(
        "small groups: {total} records in {:?} through 4 lanes of 64 KiB",
        t0.elapsed()
    );
    check_lanes(&ring, &produced);
}

/// A consumer that has exited leaves waiting producers with `Stopped`, never a hang; after
/// `stop` nothing new is accepted.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn an_exited_consumer_ends_producer_waits() {
    use vkgdr::ring::core::RingError;
    let gpu = open(false);
    let module = Module::load_ptx(&gpu, RING_PTX).unwrap();
    let ring = DeviceRing::new(&gpu, 4096).unwrap();
    let stream = Stream::new(&gpu).unwrap();
    // A "consumer" that returns at once: the pingpong probe with no round trips.
    let v = ring.device_view();
    let (mut a, mut b, mut iters) = (v.tail, v.head, 0u64);
    let mut params = [arg(&mut a), arg(&mut b), arg(&mut iters)];
    let pingpong = module.function("ring_pingpong").unwrap();
    // SAFETY: ring_pingpong(u64*, u64*, u64) with zero iterations touches nothing.
    unsafe {
        pingpong
            .launch(LaunchConfig::linear(1, 1), Some(&stream), &mut params)
            .unwrap()
    };
    ring.watch_consumer(&stream).unwrap();
    stream.synchronize().unwrap();
    while ring.try_reserve(1000).map(|r| r.commit()).is_ok() {}
    let t = Instant::now();
    assert!(matches!(
        ring.reserve(1000, None),
        Err(Error::Ring(RingError::Stopped))
    ));
    let mut p = ring.producer().unwrap();
    assert!(matches!(p.push(&[5; 2000], None), Err(RingError::Stopped)));
    drop(p);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    ring.stop();
    assert!(matches!(
        ring.push(&[1; 16], None),
        Err(Error::Ring(RingError::Stopped))
    ));
    assert!(matches!(
        ring.producer(),
        Err(Error::Ring(RingError::Stopped))
    ));
}

/// A small record pushed right after a staged batch is published through the BAR while the
/// batch's copy may still run: its tail must follow the copy's tail on the lane's stream (else
/// the tail would go backwards when the copy's tail lands). Every record is checked by the
/// kernel, and the path is seen taken.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn bar_publications_right_after_staged_ones_follow_their_copy() {
    staged_then_small(false);
}

/// The same on forced non-coherent memory: the tail word is read back after an invalidate.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn bar_publications_right_after_staged_ones_follow_their_copy_forced_non_coherent() {
    staged_then_small(true);
}

/// A one-lane ring of 4 MiB staging records of 4 KiB and more, checked by `ring_check_lanes` on
/// a stream of its own: the module and stream go after the ring (declared before it).
fn checked_copy_engine_lane(gpu: &vkgdr::Gpu) -> (Module, Stream, DeviceRing) {
    let module = Module::load_ptx(gpu, RING_PTX).unwrap();
    let stream = Stream::new(gpu).unwrap();
    let options = RingOptions {
        lanes: 1,
        copy_engine: LARGE_ON_COPY_ENGINE,
        ..Default::default()
    };
    let ring = DeviceRing::with_options(gpu, 4 << 20, options).unwrap();
    launch_check_lanes(&module, &ring, &stream);
    (module, stream, ring)
}

fn staged_then_small(force_non_coherent: bool) {
    let gpu = open(force_non_coherent);
    let (_module, _stream, ring) = checked_copy_engine_lane(&gpu);
    let limit = Some(Duration::from_secs(30));
    let (mut p, mut sum, mut records) = (ring.producer().unwrap(), 0u64, 0u64);
    for round in 0..500u64 {
        // 24 records of 4 KiB: the ones after the first 64 KiB are staged and copied.
        let first = p.next_seq();
        let batch: Vec<Vec<u8>> = (0..24)
            .map(|i| {
                let mut body = vec![(round % 251) as u8; 4080];
                sum = sum.wrapping_add(seal_test_payload(&mut body, first + i).unwrap());
                body
            })
            .collect();
        p.push_batch(batch.iter().map(Vec::as_slice), limit)
            .unwrap();
        // At once a small record through the BAR, while that copy is queued.
        let mut small = vec![7u8; 48];
        sum = sum.wrapping_add(seal_test_payload(&mut small, p.next_seq()).unwrap());
        p.push(&small, limit).unwrap();
        records += 25;
    }
    drop(p);
    let end = ring.lane(0).unwrap().committed();
    let copies = ring.copy_engine_stats();
    ring.stop_and_wait(Duration::from_secs(60)).unwrap();
    println!("staged then small (non-coherent {force_non_coherent}): {copies:?}");
    assert_eq!(copies.fallbacks, 0);
    assert!(copies.copies > 0, "{copies:?}");
    assert!(
        copies.stream_tails > 0,
        "no tail followed a copy: {copies:?}"
    );
    let res = ring.results_of(0);
    assert_eq!(res[layout::RESULT_ERRORS], 0, "{res:?}");
    assert_eq!(res[layout::RESULT_RECORDS], records);
    assert_eq!(res[layout::RESULT_CHECKSUM_SUM], sum);
    assert_eq!(res[layout::RESULT_POS], end);
}

/// A producer told `set_stage_after(0)` stages its large records from the first byte of a batch:
/// a lone 4 KiB push and the first 64 KiB of a batch take the copy engine, where a producer left
/// at the default writes them through the BAR; the checking kernel sees every record either way.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn a_producer_told_to_stage_at_once_sends_its_whole_batches_through_the_copy_engine() {
    let gpu = open(false);
    let (_module, _stream, ring) = checked_copy_engine_lane(&gpu);
    let limit = Some(Duration::from_secs(30));
    let (mut p, mut sum, mut records) = (ring.producer().unwrap(), 0u64, 0u64);
    let mut record = |seq: u64, fill: u8| {
        let mut body = vec![fill; 4080];
        sum = sum.wrapping_add(seal_test_payload(&mut body, seq).unwrap());
        records += 1;
        body
    };
    assert_eq!(p.stage_after(), vkgdr::ring::device::STAGE_AFTER_PENDING);
    // At the default a lone large record and a batch's first 64 KiB take the BAR.
    let lone = record(p.next_seq(), 1);
    p.push(&lone, limit).unwrap();
    let first = p.next_seq();
    let batch: Vec<Vec<u8>> = (0..16).map(|i| record(first + i, 2)).collect();
    p.push_batch(batch.iter().map(Vec::as_slice), limit)
        .unwrap();
    let bar = ring.copy_engine_stats();
    assert_eq!((bar.copies, bar.bytes), (0, 0), "{bar:?}");
    // Told to stage at once: the lone record is one copy, the batch of 16 another, 64 KiB.
    p.set_stage_after(0);
    assert_eq!(p.stage_after(), 0);
    let lone = record(p.next_seq(), 3);
    p.push(&lone, limit).unwrap();
    let first = p.next_seq();
    let batch: Vec<Vec<u8>> = (0..16).map(|i| record(first + i, 4)).collect();
    p.push_batch(batch.iter().map(Vec::as_slice), limit)
        .unwrap();
    drop(p);
    let staged = ring.copy_engine_stats();
    ring.stop_and_wait(Duration::from_secs(60)).unwrap();
    assert_eq!(staged.fallbacks, 0, "{staged:?}");
    assert_eq!(
        (staged.copies, staged.bytes),
        (2, 17 * 4096),
        "every record after set_stage_after(0) staged: {staged:?}"
    );
    let lane = LaneProduced {
        records,
        seqs: records,
        sum,
        ..LaneProduced::on_lane_of(&ring, ring.lane(0).unwrap())
    };
    check_lanes(&ring, &[lane]);
}

/// `stop` right after staged batches on every lane: the copies and their tails are still queued
/// on the lanes' streams, so the stop word goes there, behind them (an event from each lane's
/// stream), and the consumer checks every record before it exits. With the stop word stored at
/// once, it saw the stop before the last tails and exited without their records.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn stop_right_after_staged_batches_waits_for_their_copies() {
    let gpu = open(false);
    let module = Module::load_ptx(&gpu, RING_PTX).unwrap();
    let stream = Stream::new(&gpu).unwrap();
    const LANES: u32 = 4;
    let limit = Some(Duration::from_secs(30));
    let mut copied = 0;
    for round in 0..20u64 {
        let options = RingOptions {
            lanes: LANES,
            copy_engine: LARGE_ON_COPY_ENGINE,
            ..Default::default()
        };
        let ring = DeviceRing::with_options(&gpu, 8 << 20, options).unwrap();
        launch_check_lanes(&module, &ring, &stream);
        let mut producers: Vec<_> = (0..LANES).map(|_| ring.producer().unwrap()).collect();
        let (mut sum, mut records) = (0u64, 0u64);
        // 32 records of 32 KiB a lane: all but the first 64 KiB staged, a copy of 960 KiB.
        for p in &mut producers {
            let first = p.next_seq();
            let batch: Vec<Vec<u8>> = (0..32)
                .map(|i| {
                    let mut body = vec![(round % 251) as u8; (32 << 10) - 16];
                    sum = sum.wrapping_add(seal_test_payload(&mut body, first + i).unwrap());
                    body
                })
                .collect();
            p.push_batch(batch.iter().map(Vec::as_slice), limit)
                .unwrap();
            records += 32;
        }
        drop(producers);
        ring.stop_and_wait(Duration::from_secs(60)).unwrap();
        let copies = ring.copy_engine_stats();
        assert_eq!(copies.fallbacks, 0, "{copies:?}");
        assert!(
            copies.copies >= u64::from(LANES),
            "a copy a lane: {copies:?}"
        );
        copied += copies.copies;
        let (mut seen, mut seen_sum) = (0u64, 0u64);
        for lane in 0..LANES as usize {
            let res = ring.results_of(lane);
            assert_eq!(res[layout::RESULT_ERRORS], 0, "lane {lane}: {res:?}");
            seen += res[layout::RESULT_RECORDS];
            seen_sum = seen_sum.wrapping_add(res[layout::RESULT_CHECKSUM_SUM]);
        }
        assert_eq!(
            (seen, seen_sum),
            (records, sum),
            "round {round}: the consumer exited before every staged record"
        );
    }
    println!("stop after staged batches: 20 rounds, {copied} copies, every record checked");
}

/// The checking kernel reads every lane of a ring whose lanes are split between the two paths,
/// with the mix of every way of writing.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn lanes_checking_kernel_split_between_bar_and_copy_engine() {
    lanes_persistent(
        false,
        records(),
        WrapMode::Padded,
        8,
        CopyEngine::Split(1024),
    );
}

/// A split ring's lanes keep their paths: eight producers push batches of 1 KiB records, which
/// lanes 0, 3 and 6 write through the BAR and the others stage; then batches of 16 KiB records,
/// which every lane stages. The checking kernel verifies every record.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn split_lanes_keep_small_records_on_the_bar_and_stage_large_ones() {
    lanes_keep_their_paths(CopyEngine::Split(1024));
}

/// The default options' ring ([`CopyEngine::Auto`]) on eight lanes: lanes 0, 3 and 6 write 1 KiB
/// records through the BAR and stage 16 KiB records, the others stage both; a one-lane ring and
/// a ring whose staging would pass the limit keep every lane on the BAR. The checking kernel
/// verifies every record.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn the_default_ring_splits_its_lanes_between_bar_and_copy_engine() {
    let gpu = open(false);
    assert_eq!(RingOptions::default().copy_engine, CopyEngine::Auto);
    let one = DeviceRing::new(&gpu, 1 << 20).unwrap();
    assert_eq!(one.copy_engine(), CopyEngine::Off);
    // Three lanes of 128 MiB, every one of which may stage, would hold more pinned memory than
    // the limit (the two lanes that stage 1 KiB records alone would not).
    const { assert!(3 * (128 << 20) > vkgdr::ring::device::AUTO_MAX_STAGING_BYTES) };
    const { assert!(2 * (128 << 20) <= vkgdr::ring::device::AUTO_MAX_STAGING_BYTES) };
    let options = RingOptions {
        lanes: 3,
        ..Default::default()
    };
    let big = DeviceRing::with_options(&gpu, 128 << 20, options).unwrap();
    assert_eq!(big.copy_engine(), CopyEngine::Off);
    drop((one, big));
    lanes_keep_their_paths(CopyEngine::Auto);
}

/// Eight producers on a ring made with `copy`: batches of 1 KiB records, then of 16 KiB records;
/// which lanes staged which, and every record checked by the kernel.
fn lanes_keep_their_paths(copy: CopyEngine) {
    const BAR_LANES: [usize; 3] = [0, 3, 6];
    let gpu = open(false);
    let module = Module::load_ptx(&gpu, RING_PTX).unwrap();
    let stream = Stream::new(&gpu).unwrap();
    let options = RingOptions {
        lanes: 8,
        copy_engine: copy,
        ..Default::default()
    };
    let ring = DeviceRing::with_options(&gpu, 2 << 20, options).unwrap();
    assert_eq!(ring.copy_engine(), copy);
    launch_check_lanes(&module, &ring, &stream);
    let limit = Some(Duration::from_secs(30));
    // Each thread pushes `batches` batches of `count` records of `size` bytes (header
    // included); the lane, its records and their checksum sum.
    let push_all = |size: usize, count: u64, batches: u64| -> Vec<(usize, u64, u64)> {
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..ring.lanes())
                .map(|_| {
                    let ring = &ring;
                    s.spawn(move || {
                        let mut p = ring.producer().unwrap();
                        let lane = (0..ring.lanes())
                            .find(|&i| std::ptr::eq(ring.lane(i).unwrap(), p.core()))
                            .unwrap();
                        let mut sum = 0u64;
                        for round in 0..batches {
                            let first = p.next_seq();
                            let batch: Vec<Vec<u8>> = (0..count)
                                .map(|i| {
                                    let mut body = vec![(round % 251) as u8; size - 16];
                                    let seal = seal_test_payload(&mut body, first + i).unwrap();
                                    sum = sum.wrapping_add(seal);
                                    body
                                })
                                .collect();
                            p.push_batch(batch.iter().map(Vec::as_slice), limit)
                                .unwrap();
                        }
                        (lane, count * batches, sum)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    let mut expected = vec![(0u64, 0u64); ring.lanes()];
    let mut add = |pushed: Vec<(usize, u64, u64)>| {
        for (lane, records, sum) in pushed {
            expected[lane].0 += records;
            expected[lane].1 = expected[lane].1.wrapping_add(sum);
        }
    };
    // 1 KiB records, 128 to a batch: past the first 64 KiB a copy-engine lane stages them.
    add(push_all(1024, 128, 40));
    let small: Vec<_> = (0..ring.lanes())
        .map(|l| ring.lane_copy_engine_stats(l).unwrap())
        .collect();
    add(push_all(16 << 10, 16, 20));
    let large: Vec<_> = (0..ring.lanes())
        .map(|l| ring.lane_copy_engine_stats(l).unwrap())
        .collect();
    ring.stop_and_wait(Duration::from_secs(60)).unwrap();
    for lane in 0..ring.lanes() {
        let (s, l) = (&small[lane], &large[lane]);
        println!("{copy:?} lane {lane}: after 1 KiB records {s:?}; after 16 KiB records {l:?}");
        assert_eq!((s.fallbacks, l.fallbacks, &l.unavailable), (0, 0, &None));
        if BAR_LANES.contains(&lane) {
            assert_eq!(s.copies, 0, "lane {lane} staged 1 KiB records");
        } else {
            assert!(s.copies > 0, "lane {lane} staged no 1 KiB record");
        }
        // Both choices stage records of SPLIT_BAR_LANE_RECORD bytes and more on every lane.
        const { assert!(16 << 10 >= vkgdr::ring::device::SPLIT_BAR_LANE_RECORD) };
        assert!(l.copies > s.copies, "lane {lane} staged no 16 KiB record");
        let res = ring.results_of(lane);
        assert_eq!(res[layout::RESULT_ERRORS], 0, "lane {lane}: {res:?}");
        assert_eq!(res[layout::RESULT_RECORDS], expected[lane].0, "lane {lane}");
        assert_eq!(
            res[layout::RESULT_CHECKSUM_SUM],
            expected[lane].1,
            "lane {lane}"
        );
    }
}

/// Dropping a ring whose watched consumer still runs tells the kernel to stop and returns without
/// waiting for it; the ring's memory is released only once the consumer has exited.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn dropping_a_ring_stops_its_watched_consumer_and_frees_after_it() {
    let gpu = open(false);
    let module = Module::load_ptx(&gpu, RING_PTX).unwrap();
    let stream = Stream::new(&gpu).unwrap();
    let ring = DeviceRing::with_options(&gpu, 1 << 20, two_lanes_on_copy_engine()).unwrap();
    launch_check_lanes(&module, &ring, &stream);
    let after = Event::new(&gpu).unwrap();
    after.record(&stream).unwrap();
    {
        // A small record through the BAR and a large one through the copy engine, whose staging
        // copy and stream must be kept until their copy has run.
        let mut p = ring.producer().unwrap();
        p.set_policy(FlushPolicy {
            max_pending_bytes: 1 << 20,
            max_delay: None,
        });
        for seq in 0..20 {
            p.write(&seal(vec![3; 4000], seq), None).unwrap();
        }
        // 80 KB pending before it: staged.
        p.push(&seal(vec![4; 20_000], 20), None).unwrap();
    }
    assert_eq!(ring.copy_engine_stats().copies, 1);
    assert!(!after.is_complete().unwrap(), "the consumer is running");
    // (The copy's staging buffer from the producer's first claim is not released: it lives with
    // the ring.)
    assert_eq!(gpu.pending_releases(), 0);
    drop(ring);
    // Released memory implies an exited consumer: read the releases first, the kernel second.
    let pending = gpu.pending_releases();
    let exited = after.is_complete().unwrap();
    assert!(
        pending > 0 || exited,
        "the ring's memory went while its consumer still ran"
    );
    // The stop reaches the kernel, and the memory follows it.
    let t = Instant::now();
    while !after.is_complete().unwrap() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the consumer did not stop"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        gpu.wait_for_releases(Duration::from_secs(60)),
        "the ring's memory was not released after its consumer exited"
    );
}

fn seal(mut payload: Vec<u8>, seq: u64) -> Vec<u8> {
    seal_test_payload(&mut payload, seq).unwrap();
    payload
}

/// Owned producers (what the C and Python faces hold) moved into threads of their own: small
/// records through the BAR, large ones through the copy engine, the ring kept alive by them.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn owned_producers_move_into_threads() {
    let gpu = open(false);
    let module = Module::load_ptx(&gpu, RING_PTX).unwrap();
    let stream = Stream::new(&gpu).unwrap();
    let ring = std::sync::Arc::new(
        DeviceRing::with_options(&gpu, 1 << 20, two_lanes_on_copy_engine()).unwrap(),
    );
    launch_check_lanes(&module, &ring, &stream);
    let producers: Vec<_> = (0..2).map(|_| ring.owned_producer().unwrap()).collect();
    assert!(
        matches!(ring.producer(), Err(Error::Ring(_))),
        "both lanes taken"
    );
    let handles: Vec<_> = producers
        .into_iter()
        .map(|mut p| {
            std::thread::spawn(move || {
                p.set_policy(FlushPolicy {
                    max_pending_bytes: 1 << 20,
                    max_delay: None,
                });
                let mut sum = 0u64;
                for i in 0..2_000u64 {
                    let len = if i % 10 == 0 { 8192 } else { 100 };
                    let mut body = vec![(i % 251) as u8; len];
                    sum = sum.wrapping_add(seal_test_payload(&mut body, p.next_seq()).unwrap());
                    p.write(&body, Some(Duration::from_secs(30))).unwrap();
                }
                p.flush();
                (p.lane(), sum, p.reserved())
            })
        })
        .collect();
    let done: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let copies = ring.copy_engine_stats();
    ring.stop_and_wait(Duration::from_secs(60)).unwrap();
    assert!(copies.copies > 0, "{copies:?}");
    for (lane, sum, end) in done {
        let res = ring.results_of(lane);
        assert_eq!(res[layout::RESULT_ERRORS], 0, "lane {lane}: {res:?}");
        assert_eq!(res[layout::RESULT_RECORDS], 2_000);
        assert_eq!(res[layout::RESULT_CHECKSUM_SUM], sum);
        assert_eq!(res[layout::RESULT_POS], end);
    }
}

/// A ring image of `capacity` bytes with records from `from` up to about nine tenths of the
/// capacity: short bodies, bodies around the consumer's window (4 KiB ones among them), bodies
/// longer than the window, abandoned PADs, wrap PADs where a padded ring's record would cross the
/// end (a mirrored one's runs on over it); then one kind of damage, or none: a byte flipped
/// anywhere, a header's kind or length broken, a seq changed, or the range cut inside a record.
/// Returns the image and `to`.
fn damaged_image(rng: &mut impl Rng, capacity: u64, from: u64, wrap: WrapMode) -> (Vec<u8>, u64) {
    let mask = capacity - 1;
    let mut image = vec![0u8; capacity as usize];
    let put = |image: &mut Vec<u8>, pos: u64, bytes: &[u8]| {
        for (i, b) in bytes.iter().enumerate() {
            image[((pos + i as u64) & mask) as usize] = *b;
        }
    };
    let header = |len: u32, kind: u32, seq: u64| {
        let mut h = [0u8; 16];
        h[..4].copy_from_slice(&len.to_le_bytes());
        h[4..8].copy_from_slice(&kind.to_le_bytes());
        h[8..].copy_from_slice(&seq.to_le_bytes());
        h
    };
    let mut headers = Vec::new();
    let (mut pos, mut seq) = (from, 7u64);
    loop {
        let len: u32 = match rng.gen_range(0..100) {
            0..=39 => rng.gen_range(16..200),
            40..=69 => rng.gen_range(200..5000),
            70..=84 => 4096,
            85..=94 => rng.gen_range(16..20_000),
            _ => rng.gen_range(20_000..70_000),
        };
        let size = (16 + len as u64).next_multiple_of(16);
        let offset = pos & mask;
        if wrap == WrapMode::Padded && offset + size > capacity {
            if pos + (capacity - offset) - from > capacity * 9 / 10 {
                break;
            }
            let pad = (capacity - offset - 16) as u32;
            put(
                &mut image,
                pos,
                &header(pad, layout::KIND_PAD, layout::WRAP_PAD_SEQ),
            );
            pos += capacity - offset;
            continue;
        }
        if pos + size - from > capacity * 9 / 10 {
            break;
        }
        let mut payload: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        let kind = if rng.gen_range(0..20) == 0 {
            layout::KIND_PAD
        } else {
            seal_test_payload(&mut payload, seq).unwrap();
            layout::KIND_DATA
        };
        headers.push(pos);
        put(&mut image, pos, &header(len, kind, seq));
        put(&mut image, pos + 16, &payload);
        pos += size;
        seq += 1;
    }
    let mut to = pos;
    let at = |rng: &mut dyn rand::RngCore| headers[rng.gen_range(0..headers.len())];
    match rng.gen_range(0..6) {
        0 => {}
        1 => {
            let byte = (from + rng.gen_range(0..to - from)) & mask;
            image[byte as usize] ^= 1 << rng.gen_range(0..8);
        }
        2 => {
            let h = at(rng);
            put(&mut image, h + 4, &9u32.to_le_bytes());
        }
        3 => {
            let h = at(rng);
            put(
                &mut image,
                h,
                &rng.gen_range(70_000u32..u32::MAX).to_le_bytes(),
            );
        }
        4 => {
            let h = at(rng);
            put(&mut image, h + 8, &rng.gen::<u64>().to_le_bytes());
        }
        _ => {
            // The range ends inside a record (a tail no producer publishes).
            let h = at(rng);
            to = h + 16 * rng.gen_range(1..4);
        }
    }
    (image, to)
}

/// The batch kernels agree with the CPU's walk (`verify_records_in`) word for word on damaged
/// rings: where a broken chain stops them, how many records and errors they count, the checksum
/// sum and the next seq — windows starting anywhere in the region, wrapping and mirrored.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn batch_kernels_agree_with_the_cpu_walk_on_damaged_rings() {
    let gpu = open(false);
    let module = Module::load_ptx(&gpu, RING_PTX).unwrap();
    let stream = Stream::new(&gpu).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed_7e57);
    let trials = if under_sanitizer() { 6 } else { 120 };
    for (wrap, ring, name) in [
        (
            WrapMode::Padded,
            LaunchRing::new(&gpu, 1 << 20),
            "ring_consume_batch",
        ),
        (
            WrapMode::Mirrored,
            LaunchRing::new_mirrored(&gpu, 2 << 20),
            "ring_consume_batch_mirrored",
        ),
    ] {
        let ring = ring.unwrap();
        let kernel = module.function(name).unwrap();
        let v = ring.ring().device_view();
        let mut damaged = 0;
        for trial in 0..trials {
            let from = rng.gen_range(0..4 * v.capacity / 16) * 16;
            let (image, to) = damaged_image(&mut rng, v.capacity, from, wrap);
            // SAFETY: the image is the ring's whole data region; no kernel is running and no
            // producer writes this ring.
            unsafe {
                gpu.memcpy_htod(v.data, &image).unwrap();
                gpu.memset_d32(v.result, 0, 2 * layout::RESULT_WORDS)
                    .unwrap();
            }
            gpu.synchronize().unwrap();
            launch_batch(&kernel, &v, (from, to), 7, &stream).unwrap();
            stream.synchronize().unwrap();
            let got = ring.ring().results();
            let want = layout::verify_records_in(&image[..], from, to, 7, wrap);
            damaged += u64::from(want.errors != 0);
            assert_eq!(
                [
                    got[layout::RESULT_RECORDS],
                    got[layout::RESULT_CHECKSUM_SUM],
                    got[layout::RESULT_ERRORS],
                    got[layout::RESULT_NEXT_SEQ],
                    got[layout::RESULT_POS],
                ],
                [
                    want.records,
                    want.checksum_sum,
                    want.errors,
                    want.next_seq,
                    want.pos
                ],
                "{name}, trial {trial}: [{from}, {to})"
            );
        }
        println!("{name}: {trials} ranges, {damaged} with errors, every result word as the CPU's");
        assert!(
            damaged > 0 && damaged < trials,
            "both kinds of range were checked"
        );
    }
}
