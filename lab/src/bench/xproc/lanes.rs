//! Ring lanes fed from other processes beside the same lanes fed from threads: throughput of 8
//! producers and a lone record's round trip, through a ring made with
//! [`DeviceRing::new_shareable`] and consumed by the ack kernel `ring_ack_lanes`, as the
//! in-process rows of `ring` are.
//!
//! The producer processes (`vkgdr bench-child xproc-producer`, no CUDA) attach one lane each
//! through the owner's [`ShareServer`], claim it and wait; the owner times each round from its
//! `go` (written to every child's stdin) until every lane's head, as the kernel publishes it,
//! reached the end the child's records were accepted to (the time the last head moved there),
//! and counts a child's records only from its `done` (the owner's accepted sequence numbers).

use std::sync::Arc;
use std::time::Instant;

use vkgdr::cuda_objects::{Module, Stream};
use vkgdr::ring::DeviceRing;
use vkgdr::share::ShareServer;
use vkgdr::Gpu;

use super::{child_error, ChildClocks, DONE_TIMEOUT, FINISH_TIMEOUT, READY_TIMEOUT};
use crate::bench::error::{BenchError, BenchResult};
use crate::bench::ring::{
    finish, launch_consumer, round_trips, stream_records, Consumer, Lone, Produce,
};
use crate::child::process::{ChildProcess, Spawn};
use crate::child::Rtt;

/// Bytes of each lane of the throughput rings (as `ring`'s multi-lane rows).
pub(super) const LANE_BYTES: u64 = 16 << 20;
/// The lone-record rings.
pub(super) const LATENCY_RING_BYTES: u64 = 1 << 20;

/// Producer threads of this process: one round of `per_thread` records each into a fresh
/// shareable ring of `lanes` lanes; GB/s of records delivered.
pub(super) fn threads(
    gpu: &Gpu,
    module: &Module,
    stream: &Stream,
    lanes: u32,
    size: u64,
    per_thread: u64,
) -> BenchResult<f64> {
    let ring = DeviceRing::new_shareable(gpu, LANE_BYTES, lanes)?;
    launch_consumer(module, &ring, stream, Consumer::AckLanes)?;
    let r = stream_records(&ring, size, lanes as usize, per_thread, Produce::Batch);
    finish(&ring)?;
    r
}

/// Spawns the producer children of `ring_name` and waits until each has attached its lane;
/// returns them with their lanes.
fn producers(
    server: &ShareServer,
    ring_name: &str,
    n: u32,
    size: u64,
    records: u64,
    reps: u64,
    lone: bool,
) -> BenchResult<Vec<(ChildProcess, usize)>> {
    let mut children = Vec::new();
    for i in 0..n {
        let mut args = vec![
            "xproc-producer".to_string(),
            format!("--socket={}", server.path().display()),
            format!("--ring={ring_name}"),
            format!("--size={size}"),
            format!("--records={records}"),
            format!("--reps={reps}"),
        ];
        if lone {
            args.push("--lone".into());
        }
        children.push(ChildProcess::spawn(Spawn {
            name: format!("producer process {i}"),
            args,
            no_cuda: true,
            keep_fd: None,
        })?);
    }
    let mut out = Vec::new();
    let mut seen = Vec::new();
    for mut c in children {
        let ready = c.expect("ready", READY_TIMEOUT)?;
        let lane = ready.u64("lane").map_err(|e| child_error(&c, e))? as usize;
        if seen.contains(&lane) {
            return Err(
                child_error(&c, format!("was lent lane {lane}, which another holds")).into(),
            );
        }
        seen.push(lane);
        out.push((c, lane));
    }
    Ok(out)
}

/// `n` producer processes, `reps` rounds of `per_child` records each, into one shareable ring
/// of `n` lanes whose kernel runs throughout. Returns GB/s per round and the children's own
/// clocks.
#[allow(clippy::too_many_arguments)]
pub(super) fn processes(
    gpu: &Gpu,
    module: &Module,
    stream: &Stream,
    server: &ShareServer,
    n: u32,
    size: u64,
    per_child: u64,
    reps: u64,
) -> BenchResult<(Vec<f64>, ChildClocks)> {
    let ring = Arc::new(DeviceRing::new_shareable(gpu, LANE_BYTES, n)?);
    launch_consumer(module, &ring, stream, Consumer::AckLanes)?;
    let name = format!("xproc-throughput-{size}");
    let measured = (|| {
        server.share_ring(&name, &ring)?;
        let mut children = producers(server, &name, n, size, per_child, reps, false)?;
        let mut samples = Vec::new();
        let mut clocks = ChildClocks::default();
        for _ in 0..reps {
            let (secs, round) = round(&ring, &mut children, per_child)?;
            samples.push((size * per_child * u64::from(n)) as f64 / secs / 1e9);
            clocks.add(&round);
        }
        for (c, _) in children {
            c.finish(FINISH_TIMEOUT)?;
        }
        Ok::<_, BenchError>((samples, clocks))
    })();
    server.unshare(&name);
    finish(&ring)?;
    measured
}

/// One timed round: `go` to every child, then the heads watched until each lane's reached the
/// end its child's `done` names. Returns the seconds from `go` to the last head's arrival, and
/// each child's `(push_ns, accepted_ns)`.
fn round(
    ring: &DeviceRing,
    children: &mut [(ChildProcess, usize)],
    per_child: u64,
) -> BenchResult<(f64, Vec<(f64, f64)>)> {
    let n = children.len();
    let mut last: Vec<u64> = children.iter().map(|(_, l)| ring.head_of(*l)).collect();
    for (c, _) in children.iter_mut() {
        c.go()?;
    }
    let t0 = Instant::now();
    let mut arrived = vec![t0; n];
    let mut done: Vec<Option<(u64, f64, f64)>> = vec![None; n];
    let mut spins = 0u64;
    loop {
        for (i, (_, lane)) in children.iter().enumerate() {
            let h = ring.head_of(*lane);
            if h != last[i] {
                last[i] = h;
                arrived[i] = Instant::now();
            }
        }
        spins += 1;
        if spins.is_multiple_of(64) {
            for (i, (c, _)) in children.iter_mut().enumerate() {
                if done[i].is_some() {
                    continue;
                }
                match c.next_line()? {
                    Some(l) if l.kind == "done" => {
                        let parsed = (|| {
                            let records = l.u64("records")?;
                            if records != per_child {
                                return Err(format!(
                                    "the owner accepted {records} of its {per_child} records"
                                ));
                            }
                            Ok((l.u64("tail")?, l.f64("push_ns")?, l.f64("accepted_ns")?))
                        })();
                        done[i] = Some(parsed.map_err(|e| child_error(c, e))?);
                    }
                    Some(_) => {}
                    None => {
                        if let Some(status) = c.has_exited() {
                            return Err(child_error(
                                c,
                                format!("exited ({status}) in the middle of a round"),
                            )
                            .into());
                        }
                    }
                }
            }
            let finished = done
                .iter()
                .zip(&last)
                .all(|(d, h)| matches!(d, Some((tail, _, _)) if h >= tail));
            if finished {
                break;
            }
            if t0.elapsed() > DONE_TIMEOUT {
                let behind: Vec<String> = children
                    .iter()
                    .zip(&done)
                    .zip(&last)
                    .map(|(((c, lane), d), h)| match d {
                        None => format!("{} on lane {lane}: no `done` (head {h})", c.who()),
                        Some((tail, _, _)) => format!("lane {lane}: head {h} of {tail}"),
                    })
                    .collect();
                return Err(BenchError::Check(format!(
                    "a round of producer processes did not end within {} s: {}",
                    DONE_TIMEOUT.as_secs(),
                    behind.join("; ")
                )));
            }
        }
        std::hint::spin_loop();
    }
    let end = arrived.into_iter().max().expect("children");
    let own = done
        .into_iter()
        .map(|d| d.map(|(_, push, acc)| (push, acc)).expect("finished"))
        .collect();
    Ok(((end - t0).as_secs_f64(), own))
}

/// Round trips of a lone record from a producer thread of this process.
pub(super) fn thread_round_trips(
    gpu: &Gpu,
    module: &Module,
    stream: &Stream,
    n: usize,
) -> BenchResult<Vec<f64>> {
    let ring = DeviceRing::new_shareable(gpu, LATENCY_RING_BYTES, 1)?;
    launch_consumer(module, &ring, stream, Consumer::AckLanes)?;
    let r = round_trips(&ring, 64, n, Lone::Push);
    finish(&ring)?;
    r
}

/// Round trips of a lone record from a producer process (its own clock; a tenth dropped as
/// warm-up).
pub(super) fn process_round_trips(
    gpu: &Gpu,
    module: &Module,
    stream: &Stream,
    server: &ShareServer,
    n: u64,
) -> BenchResult<Rtt> {
    let ring = Arc::new(DeviceRing::new_shareable(gpu, LATENCY_RING_BYTES, 1)?);
    launch_consumer(module, &ring, stream, Consumer::AckLanes)?;
    let name = "xproc-latency";
    let measured = (|| {
        server.share_ring(name, &ring)?;
        let mut children = producers(server, name, 1, 64, n, 1, true)?;
        let (mut c, _) = children.pop().expect("one producer");
        c.go()?;
        let lat = c.expect("lat", DONE_TIMEOUT * 2)?;
        let rtt = lat.read::<Rtt>().map_err(|e| child_error(&c, e))?;
        c.finish(FINISH_TIMEOUT)?;
        Ok::<_, BenchError>(rtt)
    })();
    server.unshare(name);
    finish(&ring)?;
    measured
}
