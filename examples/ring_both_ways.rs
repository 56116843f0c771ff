//! Both directions at once: CPU threads send work to a persistent kernel over a [`DeviceRing`],
//! the kernel sends an answer per record back over a [`DeviceToHostRing`], and other CPU threads
//! check every answer.
//!
//! Four producer threads each claim a lane of the host → device ring (`ring.producer()`) and send
//! work records: `u32` producer, `u32` index, then 2 to 31 `u32` values. `ring_both_ways`
//! (kernels/ring_both_ways.cu, one block per lane, reading with ring.cuh's `BlockReader`) sums
//! each record's values, plain and weighted by position, and publishes a 32-byte answer per record
//! into the device → host lane of the same number (ring_d2h.cuh's `d2h_publish_each`, one warp
//! after another so the answers keep the records' order). Four consumer threads, one per device →
//! host lane, take the answers in order and check each against the sums the CPU computes from
//! the record itself.
//!
//! The end: once the producers are done, `stop_and_wait` stops the host → device ring, the kernel
//! consumes what is left and exits, and the device → host lanes, told by `finish_after` that no
//! more records come once the kernel completed, end (`Poll::Ended`) when they are empty. A
//! watchdog ends the process with a failure if the whole run takes more than two minutes.
//!
//! Prints a summary; exits non-zero on any wrong, missing or refused answer.
//!
//! Run on a machine with an NVIDIA GPU: `cargo run --release --example ring_both_ways`.

// The loom feature (the library's model checks) leaves `DeviceToHostRing` out: built with it, the
// example only says so, and the rest goes unused.
#![cfg_attr(feature = "loom", allow(dead_code, unused_imports))]

use std::ffi::c_void;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use vkgdr::cuda_objects::{LaunchConfig, Module, Stream};
use vkgdr::ring::core::d2h::{D2hDeviceView, LaneShape, Poll};
use vkgdr::ring::core::FlushPolicy;
#[cfg(not(feature = "loom"))]
use vkgdr::ring::DeviceToHostRing;
use vkgdr::ring::{DeviceRing, RingDeviceView};
use vkgdr::Gpu;

const PTX: &str = include_str!("../kernels/ring_both_ways.ptx");
/// Lanes each way (and producer and consumer threads).
const LANES: u32 = 4;
const RECORDS_PER_PRODUCER: u32 = 200_000;
/// The answer records' kind (`BOTH_WAYS_KIND_ANSWER`).
const KIND_ANSWER: u32 = 1;
/// An answer's bytes (`Answer` in the kernel).
const ANSWER_LEN: usize = 32;
/// The whole run's limit, after which the watchdog ends the process.
const WATCHDOG: Duration = Duration::from_secs(120);

/// Value `i` of work record `index` of `producer`.
fn value(producer: u32, index: u32, i: u32) -> u32 {
    index
        .wrapping_mul(2_654_435_761)
        .wrapping_add(producer.wrapping_mul(40_503))
        .wrapping_add(i.wrapping_mul(0x9E37_79B9))
}

/// How many values work record `index` of `producer` carries (2 to 31).
fn value_count(producer: u32, index: u32) -> u32 {
    2 + (index.wrapping_mul(7).wrapping_add(producer)) % 30
}

/// Work record `index` of `producer` into `out`.
fn work_record(producer: u32, index: u32, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&producer.to_le_bytes());
    out.extend_from_slice(&index.to_le_bytes());
    for i in 0..value_count(producer, index) {
        out.extend_from_slice(&value(producer, index, i).to_le_bytes());
    }
}

/// An answer as the kernel sends it (`Answer`), or as the CPU expects it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Answer {
    producer: u32,
    index: u32,
    count: u32,
    malformed: u32,
    sum: u64,
    weighted: u64,
}

impl Answer {
    /// What the kernel must answer to work record `index` of `producer`: the CPU's own sums.
    fn expected(producer: u32, index: u32) -> Answer {
        let count = value_count(producer, index);
        let (mut sum, mut weighted) = (0u64, 0u64);
        for i in 0..count {
            let v = u64::from(value(producer, index, i));
            sum = sum.wrapping_add(v);
            weighted = weighted.wrapping_add(u64::from(i + 1).wrapping_mul(v));
        }
        Answer {
            producer,
            index,
            count,
            malformed: 0,
            sum,
            weighted,
        }
    }

    /// An answer record's payload, or `None` if it is not `ANSWER_LEN` bytes.
    fn parse(payload: &[u8]) -> Option<Answer> {
        let bytes: &[u8; ANSWER_LEN] = payload.try_into().ok()?;
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        Some(Answer {
            producer: u32_at(0),
            index: u32_at(4),
            count: u32_at(8),
            malformed: u32_at(12),
            sum: u64_at(16),
            weighted: u64_at(24),
        })
    }
}

/// What one consumer thread saw on its lane.
#[derive(Debug, Default)]
struct LaneReport {
    /// Answers checked and found right.
    good: u64,
    /// Answers that were wrong, out of order, of another kind or size (each counted).
    bad: u64,
    /// The first problem, described.
    first_problem: Option<String>,
    /// The producer whose records this lane answered.
    producer: Option<u32>,
}

impl LaneReport {
    fn problem(&mut self, what: String) {
        self.bad += 1;
        self.first_problem.get_or_insert(what);
    }

    /// Checks answer record `seq` of lane `lane` (records come in order: the `seq`-th answer
    /// answers the lane's `seq`-th work record, all from the one producer that claimed the lane).
    fn check(&mut self, lane: u32, seq: u64, kind: u32, payload: &[u8]) {
        if kind != KIND_ANSWER {
            return self.problem(format!("lane {lane}: answer {seq} of kind {kind}"));
        }
        let Some(got) = Answer::parse(payload) else {
            let len = payload.len();
            return self.problem(format!("lane {lane}: answer {seq} of {len} bytes"));
        };
        let producer = *self.producer.get_or_insert(got.producer);
        let want = Answer::expected(producer, seq as u32);
        if got == want {
            self.good += 1;
        } else {
            self.problem(format!(
                "lane {lane}: answer {seq} is {got:?}, the CPU computed {want:?}"
            ));
        }
    }
}

fn main() -> ExitCode {
    // The watchdog: a run that hangs (a kernel that never exits, a lane that never ends) fails.
    let (done, watched) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Err(mpsc::RecvTimeoutError::Timeout) = watched.recv_timeout(WATCHDOG) {
            eprintln!("ring_both_ways: no end after {WATCHDOG:?}: hung");
            std::process::exit(2);
        }
    });
    // Print the error's message (it names the driver result and the fix), not its Debug form.
    let code = match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("ring_both_ways: {e}");
            ExitCode::FAILURE
        }
    };
    drop(done);
    code
}

/// Built with the loom feature: no device → host ring to run with.
#[cfg(feature = "loom")]
fn run() -> vkgdr::Result<bool> {
    eprintln!("ring_both_ways: the loom feature leaves DeviceToHostRing out");
    Ok(false)
}

/// The whole run; `Ok(false)` if any answer was wrong, missing or refused.
#[cfg(not(feature = "loom"))]
fn run() -> vkgdr::Result<bool> {
    let gpu = Gpu::open(0)?;
    // Modules load before the kernel starts: loading one waits for running kernels.
    let module = Module::load_ptx(&gpu, PTX)?;
    let kernel = module.function("ring_both_ways")?;
    // Host → device: 4 lanes of 1 MiB. Device → host: 4 lanes of 4096 slots of 64 bytes; a
    // kernel finding its lane full gives up after 5 million looks at a head that did not move
    // (seconds), so a consumer that stopped never leaves it hanging.
    let work = DeviceRing::with_lanes(&gpu, 1 << 20, LANES, Default::default())?;
    let answers = DeviceToHostRing::new(&gpu, LANES, LaneShape::new(4096, 64)?, 5_000_000)?;
    let consumers = answers.consumers()?;
    let stream = Stream::new(&gpu)?;

    let mut in_view: RingDeviceView = work.device_view();
    let mut out_view: D2hDeviceView = answers.device_view();
    let mut params = [
        (&mut in_view as *mut RingDeviceView).cast::<c_void>(),
        (&mut out_view as *mut D2hDeviceView).cast::<c_void>(),
    ];
    // SAFETY: ring_both_ways(vkgdr_ring_view, vkgdr_d2h_view) takes both views by value, and
    // `params` points at one of each. Both rings outlive the kernel: the host → device ring is
    // watched right after (its drop keeps its memory until the kernel exited), and the run waits
    // for the kernel (stop_and_wait) before either ring is dropped.
    unsafe { kernel.launch(LaunchConfig::linear(LANES, 256), Some(&stream), &mut params)? };
    work.watch_consumer(&stream)?;
    // The device → host lanes end once the kernel has completed and they are empty.
    answers.finish_after(&stream)?;

    let sent = AtomicU64::new(0);
    let started = Instant::now();
    let (reports, ended) = std::thread::scope(|s| {
        let takers: Vec<_> = consumers
            .into_iter()
            .enumerate()
            .map(|(lane, mut consumer)| {
                s.spawn(move || -> vkgdr::Result<LaneReport> {
                    let lane = lane as u32;
                    let mut report = LaneReport::default();
                    loop {
                        // Everything that has arrived (up to a quarter of the lane), one head
                        // store for all of it; then wait for more, or for the end.
                        consumer.drain(1024, |rec| {
                            report.check(lane, rec.seq, rec.kind, rec.payload);
                        })?;
                        match consumer.next_timeout(Duration::from_millis(100))? {
                            Poll::Record(rec) => {
                                report.check(lane, rec.seq, rec.kind, rec.payload);
                            }
                            Poll::Pending => {}
                            Poll::Ended => return Ok(report),
                        }
                    }
                })
            })
            .collect();
        let producers: Vec<_> = (0..LANES)
            .map(|producer| {
                let (work, sent) = (&work, &sent);
                s.spawn(move || -> vkgdr::Result<()> {
                    // A lane of its own (no locks), published every 64 KiB or 100 µs: one
                    // tail store per batch.
                    let mut lane = work.producer()?;
                    lane.set_policy(FlushPolicy {
                        max_pending_bytes: 64 << 10,
                        max_delay: Some(Duration::from_micros(100)),
                    });
                    let mut buf = Vec::new();
                    for index in 0..RECORDS_PER_PRODUCER {
                        work_record(producer, index, &mut buf);
                        lane.write(&buf, Some(Duration::from_secs(10)))?;
                        sent.fetch_add(1, Ordering::Relaxed);
                    }
                    lane.flush();
                    Ok(())
                })
            })
            .collect();
        let mut sending = Ok(());
        for p in producers {
            let r = p.join().expect("producer thread");
            sending = sending.and(r);
        }
        // Everything is sent (or a producer failed): the kernel takes what is left and exits,
        // which ends the device → host lanes.
        let stopped = work.stop_and_wait(Duration::from_secs(30));
        let reports: Vec<vkgdr::Result<LaneReport>> = takers
            .into_iter()
            .map(|t| t.join().expect("consumer thread"))
            .collect();
        (reports, sending.and(stopped))
    });
    let elapsed = started.elapsed();

    let total = u64::from(LANES * RECORDS_PER_PRODUCER);
    let sent = sent.load(Ordering::Relaxed);
    let mut ok = sent == total;
    if let Err(e) = ended {
        eprintln!("ring_both_ways: {e}");
        ok = false;
    }
    let mut checked = 0u64;
    let mut producers_seen = Vec::new();
    for (lane, report) in reports.into_iter().enumerate() {
        let report = match report {
            Ok(r) => r,
            Err(e) => {
                eprintln!("ring_both_ways: {e}");
                ok = false;
                continue;
            }
        };
        checked += report.good;
        producers_seen.extend(report.producer);
        // The kernel's counters for the host → device lane of the same number.
        let k = work.results_of(lane);
        let (processed, published, refused, malformed, broken) = (k[0], k[1], k[2], k[3], k[4]);
        println!(
            "lane {lane}: {} answers right, {} wrong; kernel: {processed} records, \
             {published} answers sent, {refused} refused, {malformed} malformed, {broken} broken",
            report.good, report.bad
        );
        if let Some(problem) = &report.first_problem {
            eprintln!("ring_both_ways: first problem: {problem}");
        }
        let want = u64::from(RECORDS_PER_PRODUCER);
        ok &= report.bad == 0
            && report.good == want
            && (processed, published, refused, malformed, broken) == (want, want, 0, 0, 0);
    }
    producers_seen.sort_unstable();
    ok &= producers_seen == (0..LANES).collect::<Vec<_>>();
    println!(
        "{sent} of {total} work records sent, {checked} answers checked right, in {elapsed:?} \
         ({:.1} M round trips/s); every producer answered on one lane: {}",
        checked as f64 / elapsed.as_secs_f64() / 1e6,
        producers_seen == (0..LANES).collect::<Vec<_>>()
    );
    println!("{}", if ok { "ALL ANSWERS RIGHT" } else { "FAILED" });
    Ok(ok)
}

/// The checker, without a GPU: a model of the kernel's sums over the work record's bytes
/// (`answer`) passes, and a wrong sum, an answer out of order, another producer's answer and a
/// short answer are each refused.
#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's answer, computed from the record's bytes as `both_ways_process` does.
    fn kernel_model(record: &[u8]) -> [u8; ANSWER_LEN] {
        let word = |k: usize| u32::from_le_bytes(record[4 * k..4 * k + 4].try_into().unwrap());
        let (mut sum, mut weighted) = (0u64, 0u64);
        for (i, k) in (2..record.len() / 4).enumerate() {
            let v = u64::from(word(k));
            sum = sum.wrapping_add(v);
            weighted = weighted.wrapping_add((i as u64 + 1).wrapping_mul(v));
        }
        let count = (record.len() / 4 - 2) as u32;
        let mut out = [0u8; ANSWER_LEN];
        out[0..4].copy_from_slice(&word(0).to_le_bytes());
        out[4..8].copy_from_slice(&word(1).to_le_bytes());
        out[8..12].copy_from_slice(&count.to_le_bytes());
        out[16..24].copy_from_slice(&sum.to_le_bytes());
        out[24..32].copy_from_slice(&weighted.to_le_bytes());
        out
    }

    fn answer(producer: u32, index: u32) -> [u8; ANSWER_LEN] {
        let mut buf = Vec::new();
        work_record(producer, index, &mut buf);
        kernel_model(&buf)
    }

    #[test]
    fn the_kernel_s_answers_pass_the_check() {
        let mut report = LaneReport::default();
        for index in 0..1000 {
            report.check(2, u64::from(index), KIND_ANSWER, &answer(3, index));
        }
        assert_eq!(
            (report.good, report.bad, report.producer),
            (1000, 0, Some(3))
        );
    }

    #[test]
    fn wrong_missing_foreign_and_short_answers_are_refused() {
        let mut wrong = answer(1, 1);
        wrong[24] ^= 1; // the weighted sum
        let cases: [(u64, Vec<u8>); 4] = [
            (1, wrong.to_vec()),
            (1, answer(1, 2).to_vec()), // answer 2 where 1 was due: one went missing
            (1, answer(0, 1).to_vec()), // another producer's
            (1, answer(1, 1)[..24].to_vec()),
        ];
        for (seq, payload) in cases {
            let mut report = LaneReport::default();
            report.check(0, 0, KIND_ANSWER, &answer(1, 0));
            report.check(0, seq, KIND_ANSWER, &payload);
            assert_eq!((report.good, report.bad), (1, 1), "{payload:?}");
        }
        let mut report = LaneReport::default();
        report.check(0, 0, KIND_ANSWER + 1, &answer(1, 0));
        assert_eq!(report.bad, 1, "an answer of another kind");
    }
}
