//! Producer threads stream records to a persistent kernel that processes them and reports back.
//!
//! Four threads each take a lane of one [`DeviceRing`] (`ring.producer()`) and send batches of
//! sensor samples (`u32` sensor id, `u32` count, `count` values): mostly short ones, which go
//! through the BAR, and every 64th a long waveform of 8 KiB, which the ring hands to a copy engine
//! (turned on with `RingOptions::copy_engine`: records of 4 KiB and more in a batch of 64 KiB or
//! more);
//! `ring_stream_consumer`
//! (kernels/ring_stream.cu, built on include/vkgdr/ring.cuh) sums every record's values, one
//! thread per record, and adds per lane how many records it saw and their total to the lane's
//! result words in pinned host memory. The CPU checks both against what it sent.
//!
//! Run on a machine with an NVIDIA GPU: `cargo run --release --example ring_stream`.

use std::ffi::c_void;
use std::time::{Duration, Instant};

use vkgdr::cuda_objects::{LaunchConfig, Module, Stream};
use vkgdr::ring::core::FlushPolicy;
use vkgdr::ring::device::DEFAULT_COPY_ENGINE_RECORD;
use vkgdr::ring::layout::WrapMode;
use vkgdr::ring::{CopyEngine, DeviceRing, RingDeviceView, RingOptions};
use vkgdr::Gpu;

const PTX: &str = include_str!("../kernels/ring_stream.ptx");
const LANES: u32 = 4;
const RECORDS_PER_THREAD: u32 = 250_000;

/// One record: sensor id, count, then `count` samples.
fn record(sensor: u32, n: u32, out: &mut Vec<u8>) -> u64 {
    out.clear();
    out.extend_from_slice(&sensor.to_le_bytes());
    // 4..=31 samples (24 to 132 bytes of payload), or a 2048-sample waveform (8 KiB).
    let count = if n % 64 == 63 { 2048 } else { 4 + n % 28 };
    out.extend_from_slice(&count.to_le_bytes());
    let mut sum = 0u64;
    for i in 0..count {
        let v = n.wrapping_mul(2654435761).wrapping_add(i);
        out.extend_from_slice(&v.to_le_bytes());
        sum += u64::from(v);
    }
    sum
}

fn main() -> std::process::ExitCode {
    // Print the error's message (it names the driver result and the fix), not its Debug form.
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ring_stream: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> vkgdr::Result<()> {
    let gpu = Gpu::open(0)?;
    let module = Module::load_ptx(&gpu, PTX)?;
    let consumer = module.function("ring_stream_consumer")?;
    // Every lane stages records of 4 KiB and more (the default would keep three lanes in eight
    // on the BAR).
    let options = RingOptions {
        lanes: LANES,
        wrap: WrapMode::Padded,
        copy_engine: CopyEngine::FromRecord(DEFAULT_COPY_ENGINE_RECORD),
    };
    let ring = DeviceRing::with_options(&gpu, 4 << 20, options)?;
    let stream = Stream::new(&gpu)?;

    let mut view: RingDeviceView = ring.device_view();
    let mut params = [(&mut view as *mut RingDeviceView).cast::<c_void>()];
    // SAFETY: ring_stream_consumer(vkgdr_ring_view) takes the 64-byte view by value; the ring is
    // watched right after, so it cannot be freed under the running kernel.
    unsafe { consumer.launch(LaunchConfig::linear(LANES, 256), Some(&stream), &mut params)? };
    ring.watch_consumer(&stream)?;

    let t = Instant::now();
    let sent: Vec<(usize, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..LANES)
            .map(|sensor| {
                let ring = &ring;
                s.spawn(move || -> vkgdr::Result<(usize, u64)> {
                    let mut producer = ring.producer()?;
                    let lane = (0..ring.lanes())
                        .find(|&i| {
                            ring.lane(i)
                                .is_some_and(|l| std::ptr::eq(l, producer.core()))
                        })
                        .expect("the producer's lane");
                    // Publish every 1 MiB or 200 µs: one publication per batch, long enough
                    // for the copy engine to take the waveforms (it waits for 64 KiB pending).
                    producer.set_policy(FlushPolicy {
                        max_pending_bytes: 1 << 20,
                        max_delay: Some(Duration::from_micros(200)),
                    });
                    let (mut buf, mut sum) = (Vec::new(), 0u64);
                    for n in 0..RECORDS_PER_THREAD {
                        sum += record(sensor, n, &mut buf);
                        producer.write(&buf, Some(Duration::from_secs(10)))?;
                    }
                    producer.flush();
                    Ok((lane, sum))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("producer thread"))
            .collect::<vkgdr::Result<_>>()
    })?;
    ring.stop_and_wait(Duration::from_secs(30))?;
    let elapsed = t.elapsed();

    let total = u64::from(LANES * RECORDS_PER_THREAD);
    println!(
        "{total} records through {LANES} lanes in {elapsed:?} ({:.1} M records/s)",
        total as f64 / elapsed.as_secs_f64() / 1e6
    );
    // What the copy engine carried: the waveforms (and the short records written after one in
    // the same batch).
    let copies = ring.copy_engine_stats();
    println!(
        "copy engine: {} copies, {} MiB{}",
        copies.copies,
        copies.bytes >> 20,
        copies
            .unavailable
            .map(|why| format!(" (unavailable: {why})"))
            .unwrap_or_default()
    );
    for (lane, sum) in sent {
        let r = ring.results_of(lane);
        println!(
            "lane {lane}: kernel saw {} records, sum {} (sent {sum}), {} malformed",
            r[0], r[1], r[2]
        );
        assert_eq!(
            (r[0], r[1], r[2]),
            (u64::from(RECORDS_PER_THREAD), sum, 0),
            "lane {lane}"
        );
    }
    Ok(())
}
