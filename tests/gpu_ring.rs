//! Ring buffers on the GPU: 1,000,000 records of mixed sizes from 4 producer threads, consumed by a
//! persistent kernel and by one launch per batch; the kernels check every record's sequence number
//! and checksum, the CPU checks the totals: nothing lost, duplicated or torn.

mod common;

use std::ffi::c_void;
use std::time::{Duration, Instant};

use common::*;
use rand::{Rng, SeedableRng};
use vkgdr::cuda_objects::{Event, LaunchConfig, Module, Stream};
use vkgdr::ring::core::{Reservation, RingSink};
use vkgdr::ring::layout::{self, seal_test_payload};
use vkgdr::ring::{DeviceRing, LaunchRing};
use vkgdr::{Error, OpenOptions};

const RING_PTX: &str = include_str!("../kernels/ring.ptx");
const RECORDS: u64 = 1_000_000;
const PRODUCERS: u64 = 4;

/// A payload length: mostly small, some medium, a few 4 KiB.
fn payload_len(rng: &mut impl Rng) -> u32 {
    match rng.gen_range(0..100) {
        0..=79 => rng.gen_range(16..=128),
        80..=97 => rng.gen_range(129..=1024),
        _ => 4096,
    }
}

/// Produces `per_thread` sealed records on each of 4 threads; returns the wrapping sum of checksums.
fn produce<'r, S: RingSink + Sync + 'r>(
    per_thread: u64,
    reserve: &(dyn Fn(u32) -> vkgdr::Result<Reservation<'r, S>> + Sync),
) -> u64 {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..PRODUCERS)
            .map(|t| {
                s.spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                    let mut buf = vec![0u8; 4096];
                    let mut sum = 0u64;
                    for _ in 0..per_thread {
                        let len = payload_len(&mut rng);
                        let mut r = reserve(len).expect("reserve");
                        let body = &mut buf[..len as usize];
                        rng.fill(&mut body[layout::TEST_PREFIX_LEN..]);
                        sum =
                            sum.wrapping_add(seal_test_payload(body, r.seq()).expect("len >= 16"));
                        r.write(0, body).expect("write");
                        r.commit();
                    }
                    sum
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .fold(0u64, u64::wrapping_add)
    })
}

fn wait(event: &Event, limit: Duration) {
    let t = Instant::now();
    while !event.is_complete().unwrap() {
        assert!(t.elapsed() < limit, "consumer kernel did not finish");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn persistent(force_non_coherent: bool, records: u64) {
    let gpu = open(force_non_coherent);
    let module = Module::load_ptx(&gpu, RING_PTX).unwrap();
    let kernel = module.function("ring_consume_persistent").unwrap();
    let ring = DeviceRing::new(&gpu, 1 << 20).unwrap();
    let v = ring.device_view();
    let stream = Stream::new(&gpu).unwrap();
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
    // SAFETY: ring_consume_persistent(const u8*, u64, u64*, u32*, u64*, u64*): six 8-byte
    // parameters; all addresses belong to `ring`, which outlives the kernel (we wait below).
    unsafe {
        kernel
            .launch(LaunchConfig::linear(1, 256), Some(&stream), &mut params)
            .unwrap()
    };
    let done = Event::new(&gpu).unwrap();
    done.record(&stream).unwrap();

    let t0 = Instant::now();
    let sum = produce(records / PRODUCERS, &|len| {
        ring.reserve(len, Some(Duration::from_secs(30)))
    });
    ring.stop();
    wait(&done, Duration::from_secs(60));
    let elapsed = t0.elapsed();
    let res = ring.results();
    println!(
        "persistent (non-coherent {force_non_coherent}): {} records in {elapsed:?} ({:.2} M records/s)",
        res[layout::RESULT_RECORDS],
        res[layout::RESULT_RECORDS] as f64 / elapsed.as_secs_f64() / 1e6
    );
    assert_eq!(
        res[layout::RESULT_ERRORS],
        0,
        "kernel found bad records: {res:?}"
    );
    assert_eq!(res[layout::RESULT_RECORDS], records);
    assert_eq!(res[layout::RESULT_NEXT_SEQ], records);
    assert_eq!(res[layout::RESULT_CHECKSUM_SUM], sum);
    assert_eq!(ring.head(), ring.core().committed());
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn persistent_kernel_consumes_a_million_records() {
    persistent(false, RECORDS);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn persistent_kernel_forced_non_coherent() {
    persistent(true, RECORDS / 4);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn launch_mode_consumes_a_million_records() {
    let gpu = open(false);
    let module = Module::load_ptx(&gpu, RING_PTX).unwrap();
    let kernel = module.function("ring_consume_batch").unwrap();
    let ring = LaunchRing::new(&gpu, 1 << 20).unwrap();
    let v = ring.ring().device_view();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut batches = 0u64;
    let sum = std::thread::scope(|s| {
        let launcher = s.spawn(|| {
            let mut n = 0u64;
            let launch_once = || {
                ring.launch_pending(|from, to, stream| {
                    let (mut d, mut c, mut f, mut t, mut r, mut seq) = (
                        v.data,
                        v.capacity,
                        from,
                        to,
                        v.result,
                        layout::SEQ_FROM_RESULT,
                    );
                    let mut p = [
                        arg(&mut d),
                        arg(&mut c),
                        arg(&mut f),
                        arg(&mut t),
                        arg(&mut r),
                        arg(&mut seq),
                    ];
                    // SAFETY: ring_consume_batch(const u8*, u64, u64, u64, u64*, u64): six 8-byte
                    // parameters; the ring outlives the stream's work (drained below).
                    unsafe { kernel.launch(LaunchConfig::linear(1, 256), Some(stream), &mut p) }
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
        let sum = produce(RECORDS / PRODUCERS, &|len| {
            ring.reserve(len, Some(Duration::from_secs(30)))
        });
        stop.store(true, std::sync::atomic::Ordering::Release);
        batches = launcher.join().unwrap();
        sum
    });
    ring.drain().unwrap();
    let res = ring.ring().results();
    println!(
        "launch mode: {} records in {batches} batches",
        res[layout::RESULT_RECORDS]
    );
    assert_eq!(
        res[layout::RESULT_ERRORS],
        0,
        "kernel found bad records: {res:?}"
    );
    assert_eq!(res[layout::RESULT_RECORDS], RECORDS);
    assert_eq!(res[layout::RESULT_NEXT_SEQ], RECORDS);
    assert_eq!(res[layout::RESULT_CHECKSUM_SUM], sum);
    assert_eq!(
        ring.ring().core().reclaimed(),
        ring.ring().core().committed()
    );
    assert!(batches > 1);
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
