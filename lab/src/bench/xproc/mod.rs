//! `xproc`: GPU memory shared with other processes of the host ([`vkgdr::share`]) beside what
//! the same work costs inside one process and what a process would do without vkgdr.
//!
//! This process owns the GPU (its CUDA context, its kernels) and runs a
//! [`ShareServer`]; the others are this program started again in a hidden role
//! (`vkgdr bench-child ROLE`, [`crate::child`]), with no CUDA where vkgdr's path needs none
//! (their `VKGDR_CUDA_LIBRARY` names no file, so a CUDA call there would fail, not pass
//! unnoticed). In one run, side by side:
//! - [`lanes`]: 8 producer processes into the lanes of one shareable ring consumed by the ack
//!   kernel, beside 8 producer threads into the same kind of ring; a lone record's round trip
//!   from a process beside one from a thread;
//! - [`shm`]: the queue a user would write instead: records in shared memory that the owner
//!   copies to the GPU with `cuMemcpyHtoDAsync`;
//! - [`attach`]: a fresh process's Vulkan device and attaches, its 64-byte writes and its GPU
//!   memory, beside a CUDA IPC process's context, `cuIpcOpenMemHandle`, `cuMemcpyHtoD` and its
//!   GPU memory.
//!
//! Not part of `all`: it starts a few dozen processes (each a Vulkan instance or a CUDA context)
//! and measures the machine's process start-up as much as the library; run it by name.

mod attach;
mod lanes;
mod shm;

use std::time::Duration;

use vkgdr::cuda_objects::{Module, Stream};
use vkgdr::share::{ShareOptions, ShareServer};
use vkgdr::OpenOptions;

use super::error::{BenchError, BenchResult};
use super::measure::{open_gpu, Stats};
use super::options::Options;
use super::report::format::{fmt_bytes, fmt_ns, fmt_size, sig3};
use super::report::model::{Figure, Report, Unit};
use crate::child::process::{socket_path, ChildError, ChildProcess};
use crate::child::Rtt;
use crate::ui::{self, alert};

/// 8 producer threads of this process into a shareable ring (the in-process figure).
pub const T_THREADS: &str = "8 producer threads, shareable ring, ack kernel";
/// 8 producer processes, a lane each, into one shareable ring.
pub const T_PROCESSES: &str = "8 producer processes, shareable ring, ack kernel";
/// 8 producer processes into a shared-memory queue the owner copies with `cuMemcpyHtoDAsync`.
pub const T_SHM: &str = "8 producer processes, shared-memory queue, cuMemcpyHtoDAsync";
/// A lone record's round trip from a thread.
pub const L_THREAD: &str = "lone record from a thread → ack kernel → producer";
/// ... from another process.
pub const L_PROCESS: &str = "lone record from another process → ack kernel → producer";
/// ... through the shared-memory queue.
pub const L_SHM: &str = "lone record, shared-memory queue → cuMemcpyHtoDAsync + sync → producer";
/// A 64-byte write into an attached region.
pub const U_ATTACHED: &str = "64 B write from an attached process (AttachedMemory::write)";
/// A 64-byte `cuMemcpyHtoD` into an allocation opened through CUDA IPC.
pub const U_IPC: &str = "64 B cuMemcpyHtoD from a CUDA IPC process";
/// A fresh process's Vulkan instance and device.
pub const A_DEVICE: &str = "fresh process: VulkanContext::new (instance + device)";
/// A fresh process's `cuInit` and primary context.
pub const A_CONTEXT: &str = "fresh process: cuInit + cuDevicePrimaryCtxRetain";
/// One attach once the device exists.
pub const A_ATTACH: &str = "attach a region (connect, receive, import, map)";
/// `cuIpcOpenMemHandle` once the context exists.
pub const A_OPEN: &str = "cuIpcOpenMemHandle";
/// A fresh process to its first attached region.
pub const A_FIRST: &str = "fresh process to its first attach (device + attach)";
/// A fresh process to its first opened allocation.
pub const A_FIRST_IPC: &str = "fresh process to its first open (cuInit + context + open)";
/// The GPU memory of a process holding an attached region.
pub const M_ATTACHED: &str = "process with a region attached (Vulkan, no CUDA)";
/// The GPU memory of a process holding an allocation opened through CUDA IPC.
pub const M_IPC: &str = "process with an allocation opened (CUDA IPC)";

/// Producers of the throughput rows.
const PRODUCERS: u32 = 8;
/// Record sizes of the throughput rows, header included.
const SIZES: [u64; 2] = [64, 4096];
/// Bytes of each lane of the shared-memory queue.
const SHM_LANE_BYTES: u64 = 4 << 20;
/// How long a child may take to attach and say `ready` (a Vulkan instance and device).
pub(super) const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a round (or a child's report) may take.
pub(super) const DONE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a child may take to exit once told to.
pub(super) const FINISH_TIMEOUT: Duration = Duration::from_secs(20);

/// The targets the rows are held to (said in the notes, never asserted).
const TARGET_RATIO: f64 = 0.9;
const TARGET_RECORDS: f64 = 250e6;
const TARGET_ATTACH_NS: f64 = 5e6;
const TARGET_MEMORY: f64 = 50e6;

/// How much a run does.
struct Plan {
    reps: u64,
    bytes_per_round: u64,
    round_trips: u64,
    attach_children: u32,
    attaches: u64,
    writes: u64,
    cuda_children: u32,
    updates: u64,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                reps: 3,
                bytes_per_round: 128 << 20,
                round_trips: 2_000,
                attach_children: 3,
                attaches: 5,
                writes: 6_400,
                cuda_children: 3,
                updates: 500,
            }
        } else {
            Plan {
                reps: 7,
                bytes_per_round: 1 << 30,
                round_trips: 10_000,
                attach_children: 5,
                attaches: 10,
                writes: 64_000,
                cuda_children: 5,
                updates: 2_000,
            }
        }
    }
}

/// A child's error about what it said (`NAME (pid N) WHAT`).
pub(super) fn child_error(c: &ChildProcess, what: String) -> ChildError {
    ChildError(format!("{} {what}", c.who()))
}

impl Rtt {
    fn row(&self, method: &str, size: u64) -> Figure {
        let s = Stats {
            median: self.median,
            p10: self.p10,
            p90: self.p90,
            n: self.n,
        };
        Figure::measured(method, size, &s)
    }
}

/// The producer processes' own clocks, per round: the slowest child's push time and its time
/// until the owner accepted everything.
#[derive(Debug, Default)]
pub(super) struct ChildClocks {
    push_ns: Vec<f64>,
    accepted_ns: Vec<f64>,
}

impl ChildClocks {
    fn add(&mut self, round: &[(f64, f64)]) {
        let max = |f: fn(&(f64, f64)) -> f64| round.iter().map(f).fold(0.0, f64::max);
        self.push_ns.push(max(|r| r.0));
        self.accepted_ns.push(max(|r| r.1));
    }
}

fn median(v: &[f64]) -> f64 {
    Stats::of(v).map_or(f64::NAN, |s| s.median)
}

fn stats(what: &str, v: &[f64]) -> BenchResult<Stats> {
    Stats::of(v).ok_or_else(|| BenchError::Check(format!("{what}: no samples")))
}

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "missed"
    }
}

fn mrec(gbps: f64, size: u64) -> f64 {
    gbps * 1e9 / size as f64 / 1e6
}

/// A part's outcome: its value, or (unless a kernel may still run, which stops everything) its
/// failure said at once and kept in `failed`, so the other parts still run.
fn part<T>(failed: &mut Vec<String>, what: &str, r: BenchResult<T>) -> BenchResult<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e @ BenchError::KernelStuck(_)) => Err(e),
        Err(e) => {
            alert!("xproc: {what}: {e}");
            failed.push(format!("{what}: {e}"));
            Ok(None)
        }
    }
}

/// Runs the benchmark: `xproc-throughput`, `xproc-latency`, `xproc-attach`, `xproc-memory`.
/// A part that fails (its children, its driver calls) is said and the others still run; the
/// benchmark then fails with what the others measured ([`BenchError::Partial`]).
pub fn run(opts: &Options) -> BenchResult<Vec<Report>> {
    let plan = Plan::new(opts.quick);
    let gpu = open_gpu(OpenOptions::new())?;
    let module = Module::load_ptx(&gpu, super::ring::PTX)?;
    let stream = Stream::new(&gpu)?;
    let _ctx = gpu.bind()?;
    let server = ShareServer::bind(socket_path("xproc"), gpu.vulkan(), ShareOptions::default())?;
    let mut failed = Vec::new();

    let mut tput = Report::new("xproc-throughput", Unit::GigabytesPerSecond);
    let mut lat = Report::new("xproc-latency", Unit::Nanoseconds);
    let mut att = Report::new("xproc-attach", Unit::Nanoseconds);
    let mut mem = Report::new("xproc-memory", Unit::Bytes);
    let mut rates = Vec::new();
    let mut shm_path = String::new();
    let mut clocks_note = Vec::new();

    ui::phase("throughput", 3 * SIZES.len() as u64);
    for size in SIZES {
        let per = plan.bytes_per_round / size / u64::from(PRODUCERS);
        let cell = |method: &str| format!("{method} · {}", fmt_size(size));
        ui::step(cell(T_THREADS));
        let threads = (0..plan.reps)
            .map(|_| lanes::threads(&gpu, &module, &stream, PRODUCERS, size, per))
            .collect::<BenchResult<Vec<f64>>>()
            .and_then(|v| stats(T_THREADS, &v));
        let threads = part(&mut failed, &cell(T_THREADS), threads)?;
        if let Some(t) = &threads {
            tput.figures.push(Figure::measured(T_THREADS, size, t));
        }
        ui::step(cell(T_PROCESSES));
        let procs = lanes::processes(
            &gpu, &module, &stream, &server, PRODUCERS, size, per, plan.reps,
        )
        .and_then(|(v, clocks)| Ok((stats(T_PROCESSES, &v)?, clocks)));
        let procs = part(&mut failed, &cell(T_PROCESSES), procs)?;
        if let Some((p, clocks)) = &procs {
            tput.figures.push(Figure::measured(T_PROCESSES, size, p));
            clocks_note.push(format!(
                "{}: the owner's round {} (median), the slowest child's own push {} and push until accepted {}",
                fmt_size(size),
                fmt_ns((size * per * u64::from(PRODUCERS)) as f64 / p.median),
                fmt_ns(median(&clocks.push_ns)),
                fmt_ns(median(&clocks.accepted_ns)),
            ));
        }
        ui::step(cell(T_SHM));
        let shm = shm::run(&gpu, PRODUCERS, SHM_LANE_BYTES, size, per, plan.reps, false).and_then(
            |(run, path)| match run {
                shm::ShmRun::Rates(v) => Ok((stats(T_SHM, &v)?, path)),
                shm::ShmRun::Latency(_) => Err(BenchError::Check("no rates".into())),
            },
        );
        let shm = part(&mut failed, &cell(T_SHM), shm)?;
        if let Some((s, path)) = &shm {
            tput.figures.push(Figure::measured(T_SHM, size, s));
            shm_path.clone_from(path);
        }
        rates.push((
            size,
            threads.map(|t| t.median),
            procs.map(|p| p.0.median),
            shm.map(|s| s.0.median),
        ));
    }

    ui::phase("round trips", 3);
    let n = plan.round_trips;
    ui::step(L_THREAD);
    let thread = lanes::thread_round_trips(&gpu, &module, &stream, n as usize)
        .and_then(|v| Rtt::of_samples(v).ok_or_else(|| BenchError::Check("no samples".into())));
    let thread = part(&mut failed, L_THREAD, thread)?;
    ui::step(L_PROCESS);
    let process = lanes::process_round_trips(&gpu, &module, &stream, &server, n);
    let process = part(&mut failed, L_PROCESS, process)?;
    ui::step(L_SHM);
    let shm_lat = shm::run(&gpu, 1, 1 << 20, 64, n, 1, true).and_then(|(run, _)| match run {
        shm::ShmRun::Latency(r) => Ok(r),
        shm::ShmRun::Rates(_) => Err(BenchError::Check("no round trips".into())),
    });
    let shm_lat = part(&mut failed, L_SHM, shm_lat)?;
    for (r, method) in [
        (&thread, L_THREAD),
        (&process, L_PROCESS),
        (&shm_lat, L_SHM),
    ] {
        if let Some(r) = r {
            lat.figures.push(r.row(method, 64));
        }
    }

    ui::phase("attach", 2);
    ui::step("processes attaching a region through Vulkan");
    let vk = attach::vulkan(
        &gpu,
        &server,
        plan.attach_children,
        plan.attaches,
        plan.writes,
    );
    let vk = part(&mut failed, "processes attaching through Vulkan", vk)?;
    ui::step("processes opening an allocation through CUDA IPC");
    let cu = attach::cuda(&gpu, plan.cuda_children, plan.updates);
    let cu = part(&mut failed, "processes opening through CUDA IPC", cu)?;
    let region = attach::REGION_BYTES;
    let sum = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x + y).collect::<Vec<f64>>();
    let mut attach_median = None;
    if let Some(vk) = &vk {
        let rows = (|| {
            let attach = stats(A_ATTACH, &vk.attach_ns)?;
            attach_median = Some(attach.median);
            Ok::<_, BenchError>([
                (
                    true,
                    Figure::measured(U_ATTACHED, 64, &stats(U_ATTACHED, &vk.write_ns)?),
                ),
                (
                    false,
                    Figure::measured(A_DEVICE, 0, &stats(A_DEVICE, &vk.device_ns)?),
                ),
                (false, Figure::measured(A_ATTACH, region, &attach)),
                (
                    false,
                    Figure::measured(A_FIRST, region, &stats(A_FIRST, &vk.first_ns)?),
                ),
            ])
        })();
        if let Some(rows) = part(&mut failed, "the Vulkan side's figures", rows)? {
            for (latency, row) in rows {
                if latency {
                    lat.figures.push(row)
                } else {
                    att.figures.push(row)
                }
            }
        }
    }
    if let Some(cu) = &cu {
        let context = sum(&cu.init_ns, &cu.context_ns);
        let rows = (|| {
            Ok::<_, BenchError>([
                (
                    true,
                    Figure::measured(U_IPC, 64, &stats(U_IPC, &cu.update_ns)?),
                ),
                (
                    false,
                    Figure::measured(A_CONTEXT, 0, &stats(A_CONTEXT, &context)?),
                ),
                (
                    false,
                    Figure::measured(A_OPEN, region, &stats(A_OPEN, &cu.open_ns)?),
                ),
                (
                    false,
                    Figure::measured(
                        A_FIRST_IPC,
                        region,
                        &stats(A_FIRST_IPC, &sum(&context, &cu.open_ns))?,
                    ),
                ),
            ])
        })();
        if let Some(rows) = part(&mut failed, "the CUDA IPC side's figures", rows)? {
            for (latency, row) in rows {
                if latency {
                    lat.figures.push(row)
                } else {
                    att.figures.push(row)
                }
            }
        }
    }
    // One source for both sides' memory: NVML's per-process figures where it has them for every
    // child, the drop of the free VRAM otherwise.
    let held: Vec<&attach::Held> = vk
        .iter()
        .flat_map(|v| &v.held)
        .chain(cu.iter().flat_map(|c| &c.held))
        .collect();
    let nvml = !held.is_empty() && held.iter().all(|h| h.nvml.is_some());
    let figure = |h: &attach::Held| if nvml { h.nvml.unwrap_or(0) } else { h.vram_drop } as f64;
    let mut memory = [None, None];
    for (i, (side, method)) in [
        (vk.as_ref().map(|v| &v.held), M_ATTACHED),
        (cu.as_ref().map(|c| &c.held), M_IPC),
    ]
    .into_iter()
    .enumerate()
    {
        if let Some(side) = side {
            let v: Vec<f64> = side.iter().map(figure).collect();
            if let Some(s) = part(&mut failed, method, stats(method, &v))? {
                mem.figures.push(Figure::measured(method, region, &s));
                memory[i] = Some(s.median);
            }
        }
    }

    // Nothing a producer published may have been refused, and no peer may have broken the
    // protocol: the benchmark's children are well-behaved.
    let share = server.stats();
    drop(server);
    if share.lane_faults != 0 || share.misbehaved != 0 {
        let e = BenchError::Check(format!(
            "the share server counted {} lane faults and {} misbehaving peers: {share:?}",
            share.lane_faults, share.misbehaved
        ));
        part::<()>(&mut failed, "the share server", Err(e))?;
    }

    tput.notes.push(format!(
        "{T_PROCESSES}: {PRODUCERS} processes `vkgdr bench-child xproc-producer` (this program, no CUDA: VKGDR_CUDA_LIBRARY names no file), each attached to one lane of a DeviceRing::new_shareable ring of {PRODUCERS} lanes × {} MiB through ShareServer and Peer, Producer::push_batch of 64 KiB or 256 records as `ring`'s rows; {} rounds of {} MiB with one set of children; each round timed by the owner from `go` (written to every child's stdin once all had attached) until the last lane's head, published by the ack kernel, reached the end the owner had accepted; records counted from the owner's accepted sequence numbers (each child's `done`)",
        lanes::LANE_BYTES >> 20,
        plan.reps,
        plan.bytes_per_round >> 20
    ));
    tput.notes.push(format!("{T_THREADS}: the same ring setup and kernel, {PRODUCERS} threads of this process with Producer::push_batch (`ring`'s streaming code), a fresh ring per round: the in-process figure the processes are held to"));
    tput.notes.push(format!(
        "{T_SHM}: what a user would build without vkgdr: {PRODUCERS} processes (`xproc-shm`, no CUDA) write fixed-size records into their lane of a memfd queue ({} MiB per lane; the same batches) and publish a tail; one owner thread polls the tails, copies what is new with one cuMemcpyHtoDAsync per lane (two where it wraps), cuStreamSynchronize, then publishes the heads the producers wait on; {shm_path}; timed from `go` until every head reached its end; no kernel reads these records, so it is an upper bound of that path",
        SHM_LANE_BYTES >> 20
    ));
    let mrecs = |v: Option<f64>, size: u64| {
        v.map_or("not measured".to_string(), |g| {
            format!("{} M records/s ({} GB/s)", sig3(mrec(g, size)), sig3(g))
        })
    };
    for (size, threads, procs, shm) in &rates {
        let verdict = match (procs, threads) {
            (Some(p), Some(t)) => format!(
                ": {:.1} % of the threads (target ≥ {:.0} %: {}); ≥ {:.0} M records/s: {}",
                100.0 * p / t,
                100.0 * TARGET_RATIO,
                met(p / t >= TARGET_RATIO),
                TARGET_RECORDS / 1e6,
                met(mrec(*p, *size) * 1e6 >= TARGET_RECORDS),
            ),
            _ => String::new(),
        };
        tput.notes.push(format!(
            "{}: processes {}, threads {}{verdict}; shared-memory queue {}",
            fmt_size(*size),
            mrecs(*procs, *size),
            mrecs(*threads, *size),
            mrecs(*shm, *size),
        ));
    }
    if !clocks_note.is_empty() {
        tput.notes.push(format!(
            "the producer processes' own clocks: {}",
            clocks_note.join("; ")
        ));
    }
    tput.notes.push("records include their 16-byte header; GB/s = record bytes delivered per second; records/s = GB/s / size".into());

    lat.notes.push(format!("{L_THREAD} / {L_PROCESS}: one 64-byte record pushed alone (Producer::push) into a 1-lane shareable ring of 1 MiB, then waited for until the consumer's head passes it: in this process the head the kernel writes into pinned memory; in the other process the head the owner's relay mirrors into the lane's owner page (AttachedLane::head), after the relay checked and passed the tail on; {} round trips, the first tenth dropped", plan.round_trips));
    lat.notes.push(format!("{L_SHM}: one 64-byte record written into a 1-lane shared-memory queue and its tail published; the owner's drain thread copies it (cuMemcpyHtoDAsync, cuStreamSynchronize) and publishes the head the producer waits for: no kernel in the loop"));
    let p99 = |r: &Option<Rtt>| r.map_or("not measured".to_string(), |r| fmt_ns(r.p99));
    lat.notes.push(format!(
        "p99: {L_THREAD} {}, {L_PROCESS} {}, {L_SHM} {}",
        p99(&thread),
        p99(&process),
        p99(&shm_lat)
    ));
    lat.notes.push(format!("{U_ATTACHED}: Mapping::write of 64 bytes into an attached 2 MiB region, timed in batches of {}, ns per write (store + sfence, no flush on coherent memory); {U_IPC}: one synchronous cuMemcpyHtoD of 64 bytes from a pageable buffer into the opened allocation, each timed; a tenth of each child's samples dropped as warm-up; the owner found each child's last 64 bytes in its memory", crate::child::attach::WRITES_PER_SAMPLE));

    att.notes.push(format!(
        "each of {} processes (`xproc-attach`, no CUDA) opened its Vulkan device by the GPU's UUID (VulkanContext::new: loader, instance, device: its first Vulkan use), then attached a {} region {} times, each on a new connection (Peer::connect_with + attach_memory: the descriptor and fd received, imported, mapped); {A_FIRST} = its device + its first attach",
        plan.attach_children,
        fmt_size(region),
        plan.attaches
    ));
    if let Some(cu) = &cu {
        att.notes.push(format!(
            "each of {} processes (`xproc-cuda`) loaded libcuda and called cuInit ({} median), retained and pushed the primary context ({} median), then cuIpcOpenMemHandle of the owner's {} cuMemAlloc allocation",
            plan.cuda_children,
            fmt_ns(median(&cu.init_ns)),
            fmt_ns(median(&cu.context_ns)),
            fmt_size(region)
        ));
    }
    if let Some(m) = attach_median {
        att.notes.push(format!(
            "{A_ATTACH}: median {} (target ≤ {}: {})",
            fmt_ns(m),
            fmt_ns(TARGET_ATTACH_NS),
            met(m <= TARGET_ATTACH_NS)
        ));
    }
    mem.notes.push(if nvml {
        "NVML's per-process figure (nvmlDeviceGetComputeRunningProcesses / GraphicsRunningProcesses, the larger) for the child's pid while it holds what it attached, one sample per child".to_string()
    } else {
        "NVML gave no per-process figure for every child here: the drop of the free VRAM (cuMemGetInfo) from before the child started to while it holds what it attached, one sample per child (other processes' changes meanwhile count too)".to_string()
    });
    if let [Some(v), c] = memory {
        mem.notes.push(format!(
            "{M_ATTACHED}: median {} (target ≤ 50 MB: {}); {M_IPC}: {}",
            fmt_bytes(v),
            met(v <= TARGET_MEMORY),
            c.map_or("not measured".to_string(), fmt_bytes)
        ));
    }
    let reports = vec![tput, lat, att, mem];
    if failed.is_empty() {
        Ok(reports)
    } else {
        Err(BenchError::Partial {
            reports: reports
                .into_iter()
                .map(|mut r| {
                    r.notes
                        .push(format!("not all measured: {}", failed.join("; ")));
                    r
                })
                .collect(),
            error: failed.join("; "),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::registry::benchmark;
    use crate::bench::report::spec::{Anchor, Rows};

    /// Every method each report writes.
    fn methods(report: &str) -> Vec<&'static str> {
        match report {
            "xproc-throughput" => vec![T_THREADS, T_PROCESSES, T_SHM],
            "xproc-latency" => vec![L_THREAD, L_PROCESS, L_SHM, U_ATTACHED, U_IPC],
            "xproc-attach" => vec![A_DEVICE, A_CONTEXT, A_ATTACH, A_OPEN, A_FIRST, A_FIRST_IPC],
            "xproc-memory" => vec![M_ATTACHED, M_IPC],
            other => panic!("{other} is no xproc report"),
        }
    }

    #[test]
    fn every_anchor_and_machine_row_is_a_method_the_benchmark_writes() {
        let b = benchmark("xproc").expect("registered");
        assert_eq!(b.reports.len(), 4);
        for spec in b.reports {
            let ms = methods(spec.name);
            let Anchor::Pairs(pairs) = spec.anchor else {
                panic!("{}: anchored in pairs", spec.name)
            };
            let name = |rows: Rows<'static>| -> &'static str {
                match rows {
                    Rows::Is(name) => name,
                    other => panic!("{}: {other} is no single row", spec.name),
                }
            };
            for &(m, a) in pairs {
                let (m, a) = (name(m), name(a));
                assert!(
                    ms.contains(&m) && ms.contains(&a),
                    "{}: {m} / {a}",
                    spec.name
                );
            }
            // The rows of other paths are the machine's: never a regression of the library's.
            assert!(!spec.is_machine(name(pairs[0].0)), "{}", spec.name);
            for p in spec.machine {
                assert!(ms.iter().any(|m| p.matches(m)), "{}: {p}", spec.name);
            }
            // Every row that is no anchor of another is anchored itself.
            for m in &ms {
                assert!(
                    pairs.iter().any(|&(x, y)| x.matches(m) || y.matches(m)),
                    "{}: {m} stands alone",
                    spec.name
                );
            }
        }
    }

    #[test]
    fn round_trip_figures_drop_the_warm_up() {
        let samples: Vec<f64> = (0..100)
            .map(|i| if i < 10 { 1e6 } else { 100.0 + f64::from(i) })
            .collect();
        let r = Rtt::of_samples(samples).unwrap();
        assert_eq!(r.n, 90);
        assert!(r.median > 100.0 && r.p99 < 1e6 && r.p99 >= r.p90);
        assert_eq!(r.row(L_PROCESS, 64).samples, 90);
    }

    #[test]
    fn the_plans_and_sizes_fit_the_rings_and_queues() {
        for quick in [false, true] {
            let p = Plan::new(quick);
            assert!(p.writes >= crate::child::attach::WRITES_PER_SAMPLE);
            for size in SIZES {
                let per = p.bytes_per_round / size / u64::from(PRODUCERS);
                assert!(per > 1000, "{size}: {per} records per producer");
                assert!(SHM_LANE_BYTES.is_multiple_of(size));
                assert!(lanes::LANE_BYTES.is_multiple_of(size));
            }
        }
        assert!(socket_path("xproc").as_os_str().len() < 108);
    }
}
