//! The ring-lane producers: `xproc-producer` (the benchmark's: batches after each `go`, or lone
//! records timed round trip by round trip) and `soak-producer` (sealed records of random sizes
//! until told to stop). Both attach a lane of the owner's shared ring through
//! [`vkgdr::share::Peer`]: no CUDA in this process.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use vkgdr::ring::core::RingError;
use vkgdr::share::{AttachedLane, Peer, RefusalCode, ShareError};

use super::protocol::{say, Line};
use super::{spin_until, Commands, Context, Outcome, Rtt};
use crate::bench::ring::{batch_payloads, push_batches, random_batch, Payload};

/// How long a peer waits for each answer of the owner.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a producer keeps trying to attach while every lane is taken or memory is short.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one record may wait for space, or its round trip for the consumer.
const RECORD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a producer waits for the owner to accept what it published.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the soak's producer says how far the owner has accepted its records.
const REPORT_EVERY: Duration = Duration::from_millis(200);

/// A record size the ring benchmarks use: 32 B to 64 KiB (header included), whole 16-byte
/// units.
fn record_size(s: &str) -> Result<u64, String> {
    let n: u64 = s.parse().map_err(|e| format!("{e}"))?;
    if !(32..=64 << 10).contains(&n) || !n.is_multiple_of(16) {
        return Err("a record size of 32 to 65536 bytes, a multiple of 16".into());
    }
    Ok(n)
}

/// `xproc-producer`'s options.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ProducerArgs {
    /// The owner's socket
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,
    /// The name the owner shares its ring under
    #[arg(long, value_name = "NAME")]
    pub ring: String,
    /// Bytes per record, its 16-byte header included
    #[arg(long, value_name = "BYTES", value_parser = record_size)]
    pub size: u64,
    /// Records per `go` (with --lone: round trips)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub records: u64,
    /// How many `go`s to answer
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub reps: u64,
    /// One record at a time, each waited for until the consumer's head passes it
    #[arg(long)]
    pub lone: bool,
}

/// `soak-producer`'s options.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct SoakProducerArgs {
    /// The owner's socket
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,
    /// The name the owner shares its ring under
    #[arg(long, value_name = "NAME")]
    pub ring: String,
    /// Seed of the record sizes
    #[arg(long, value_name = "N")]
    pub seed: u64,
}

/// Whether an attach may succeed if tried again: every lane lent (the owner has not yet taken
/// back a dead producer's), or device memory short for a while (a BAR exhaustion of the soak).
fn worth_retrying(e: &vkgdr::Error) -> bool {
    matches!(
        e,
        vkgdr::Error::Share(ShareError::Refused {
            code: RefusalCode::Busy | RefusalCode::OutOfMemory,
            ..
        })
    ) || e.is_out_of_memory()
        || e.to_string().contains("OUT_OF_DEVICE_MEMORY")
}

/// Connects and attaches a lane of `ring`, trying again for a while when that may help (with
/// `any_error`, whatever failed: a soak's BAR exhaustion can make a Vulkan device or an import
/// fail in ways other than running out of memory, for the second or two it lasts).
fn attach(socket: &std::path::Path, ring: &str, any_error: bool) -> Outcome<AttachedLane> {
    let t = Instant::now();
    // The Vulkan device a failed attempt opened serves the next one.
    let mut device = None;
    loop {
        let attempt = Peer::connect_with(socket, device.clone(), ANSWER_TIMEOUT).and_then(|peer| {
            let lane = peer.attach_lane(ring);
            device = device.take().or_else(|| peer.device());
            lane
        });
        match attempt {
            Ok(lane) => return Ok(lane),
            Err(e) if (any_error || worth_retrying(&e)) && t.elapsed() < ATTACH_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                return Err(format!(
                    "attaching a lane of {ring:?} at {} (after {:.1} s): {e}",
                    socket.display(),
                    t.elapsed().as_secs_f64()
                ))
            }
        }
    }
}

fn ready(lane: &AttachedLane) {
    let start = lane.start();
    say(&Line::new("ready")
        .with("lane", lane.lane())
        .with("tail", start.tail)
        .with("seq", start.seq)
        .with("pid", std::process::id()));
}

/// Why the lane can take no more records, if the owner stopped serving it.
fn stopped(lane: &AttachedLane) -> Outcome {
    match lane.stop_reason() {
        None => Ok(()),
        Some(why) => Err(format!(
            "the owner stopped serving lane {}: {why}",
            lane.lane()
        )),
    }
}

/// Waits until the owner has accepted everything up to `end`.
fn wait_accepted(lane: &AttachedLane, end: u64) -> Outcome {
    let t = Instant::now();
    while lane.accepted().tail < end {
        stopped(lane)?;
        if t.elapsed() > ACCEPT_TIMEOUT {
            return Err(format!(
                "the owner accepted lane {} up to {} of {end} within {} s",
                lane.lane(),
                lane.accepted().tail,
                ACCEPT_TIMEOUT.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    Ok(())
}

/// Waits (spinning) until the consumer's head, as the owner mirrors it, reaches `end`.
fn wait_head(lane: &AttachedLane, end: u64) -> Outcome {
    spin_until(
        || lane.head() >= end,
        RECORD_TIMEOUT,
        || stopped(lane),
        || {
            format!(
                "lane {}: the consumer's head stayed at {} below {end} for {} s",
                lane.lane(),
                lane.head(),
                RECORD_TIMEOUT.as_secs()
            )
        },
    )
}

/// `xproc-producer`: attaches, says `ready`, then per `go` pushes `--records` records in batches
/// (`done` once the owner accepted them all: records, this process's push and accept times) or,
/// with `--lone`, times `--records` round trips (`lat`: median, p10, p90, p99 after a tenth of
/// warm-up); then waits for `quit`.
pub fn producer(a: &ProducerArgs) -> Outcome {
    let commands = Commands::start()?;
    let lane = attach(&a.socket, &a.ring, false)?;
    ready(&lane);
    let mut p = lane.producer().ctx("claiming the lane")?;
    let limit = Some(RECORD_TIMEOUT);
    if a.lone {
        commands.wait_go()?;
        let mut payload = Payload::new(a.size);
        let mut samples = Vec::with_capacity(a.records as usize);
        for _ in 0..a.records {
            let t = Instant::now();
            let seq = p.next_seq();
            p.push(payload.stamped(seq), limit)
                .ctx(format_args!("pushing record {seq}"))?;
            wait_head(&lane, p.core().published())?;
            samples.push(t.elapsed().as_nanos() as f64);
        }
        let rtt = Rtt::of_samples(samples).ok_or("no round trips")?;
        say(&Line::of("lat", &rtt));
    } else {
        let mut bufs = batch_payloads(a.size);
        for rep in 0..a.reps {
            commands.wait_go()?;
            let start = lane.accepted();
            let t = Instant::now();
            push_batches(&mut p, &mut bufs, a.records, limit).ctx(format_args!(
                "pushing {} records of {} B",
                a.records, a.size
            ))?;
            let push_ns = t.elapsed().as_nanos();
            wait_accepted(&lane, p.core().published())?;
            let accepted_ns = t.elapsed().as_nanos();
            let end = lane.accepted();
            say(&Line::new("done")
                .with("rep", rep)
                .with("records", end.seq - start.seq)
                .with("push_ns", push_ns)
                .with("accepted_ns", accepted_ns)
                .with("tail", end.tail)
                .with("seq", end.seq));
        }
    }
    commands.wait_quit()?;
    drop(p);
    Ok(())
}

/// `soak-producer`: attaches, says `ready`, then pushes batches of 1 to 64 sealed records of
/// 16 to 4080 payload bytes (the checking kernel verifies each one's seq and checksum) until told
/// to quit, saying every 200 ms how far the owner has accepted them (`accepted`); at the end it
/// publishes what it wrote, waits until the owner accepted all of it and says `done`.
pub fn soak_producer(a: &SoakProducerArgs) -> Outcome {
    let commands = Commands::start()?;
    let lane = attach(&a.socket, &a.ring, true)?;
    ready(&lane);
    let mut p = lane.producer().ctx("claiming the lane")?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed);
    let mut last_report = Instant::now();
    let mut full_waits = 0u64;
    while !commands.quit_requested() {
        let first = p.next_seq();
        let records = random_batch(&mut rng, first);
        match p.push_batch(records.iter().map(|r| &r[..]), Some(Duration::from_secs(2))) {
            Ok(_) => {}
            Err(RingError::Timeout) => full_waits += 1,
            Err(e) => {
                stopped(&lane)?;
                return Err(format!("pushing records from seq {first}: {e}"));
            }
        }
        if last_report.elapsed() >= REPORT_EVERY {
            last_report = Instant::now();
            let at = lane.accepted();
            say(&Line::new("accepted")
                .with("tail", at.tail)
                .with("seq", at.seq));
        }
    }
    p.flush();
    let end = p.core().published();
    drop(p);
    wait_accepted(&lane, end)?;
    let at = lane.accepted();
    say(&Line::new("done")
        .with("tail", at.tail)
        .with("seq", at.seq)
        .with("full_waits", full_waits));
    Ok(())
}
