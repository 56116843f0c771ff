//! Sharing on the GPU: producer processes with no CUDA (the CUDA library they are pointed at does
//! not exist) attach lanes of a shareable ring and stream records into the owner's persistent
//! checking kernel, which verifies every one; a producer killed in the middle of a record shows
//! the kernel nothing torn, and its lane goes on under a new producer; a peer process writes raw
//! GPU memory a kernel checks, and reads what the owner wrote.

mod common;

use std::ffi::c_void;
use std::io::{BufRead, BufReader};
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::share::*;
use common::*;
use vkgdr::cuda_objects::{LaunchConfig, Module, Stream};
use vkgdr::ring::layout::{self, test_checksum, TEST_PREFIX_LEN};
use vkgdr::ring::{DeviceRing, RingDeviceView};
use vkgdr::share::{Peer, ShareEvent, ShareOptions, ShareServer};
use vkgdr::Mapping;

const RING_PTX: &str = include_str!("../kernels/ring.ptx");

/// What a producer child wrote, as it reports it on stdout: `DONE lane records seqs sum`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Produced {
    lane: u32,
    records: u64,
    seqs: u64,
    sum: u64,
}

fn parse_done(line: &str) -> Option<Produced> {
    let at = line.find("DONE ")?;
    let v: Vec<u64> = line[at + 5..]
        .split_whitespace()
        .map(|w| w.parse().unwrap())
        .collect();
    Some(Produced {
        lane: v[0] as u32,
        records: v[1],
        seqs: v[2],
        sum: v[3],
    })
}

/// A producer child: attaches a lane, pushes `records` sealed records of 24 to 1,000 bytes in
/// batches, waits until the owner accepted them all and reports what it wrote. With `tear` it
/// then writes half of one more record, says `MID`, and waits to be killed (reporting first).
fn producer_child(records: u64, tear: bool) -> ! {
    let peer = Peer::connect(socket_path()).expect("connect");
    let lane = peer.attach_lane("in").expect("attach a lane");
    let device = peer.device().expect("a device");
    assert!(
        device.device_info().is_nvidia() || std::env::var_os("VKGDR_SHARE_ANY_DEVICE").is_some(),
        "the lane's device: {}",
        device.device_info().name
    );
    let mut p = lane.producer().expect("producer");
    let (mut sum, mut k) = (0u64, 0u64);
    while k < records {
        let batch = sealed_records(k, 64.min(records - k), p.next_seq());
        for r in &batch {
            sum = sum.wrapping_add(test_checksum(&r[TEST_PREFIX_LEN..]));
        }
        p.push_batch(batch.iter().map(|r| &r[..]), Some(Duration::from_secs(60)))
            .expect("push");
        k += batch.len() as u64;
    }
    let seqs = p.next_seq();
    wait_accepted(&lane);
    // Seqs count from the lane's start (a lane taken over continues its predecessor's numbers).
    println!(
        "DONE {} {} {} {}",
        lane.lane(),
        k,
        seqs - lane.start().seq,
        sum
    );
    if tear {
        tear_mid_record(&mut p, Duration::from_secs(300));
    }
    drop(p);
    exit(0)
}

/// Reads a child's stdout until `DONE` (and, when `until_mid`, `MID`); returns the report and the
/// rest of the stream.
fn read_report(child: &mut Child, until_mid: bool) -> Produced {
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let mut done = None;
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the child ended early"
        );
        if let Some(p) = parse_done(&line) {
            done = Some(p);
            if !until_mid {
                break;
            }
        }
        if until_mid && line.contains("MID") {
            break;
        }
    }
    done.expect("a report")
}

/// The owner's side: a shareable ring of `lanes` lanes, `ring_check_lanes` on it, and a server.
struct Owner {
    gpu: vkgdr::Gpu,
    ring: Arc<DeviceRing>,
    server: ShareServer,
    path: std::path::PathBuf,
    _module: Module,
    _stream: Stream,
}

fn owner(test: &str, lanes: u32) -> Owner {
    let gpu = open(false);
    let module = Module::load_ptx(&gpu, RING_PTX).unwrap();
    let ring = Arc::new(DeviceRing::new_shareable(&gpu, 1 << 20, lanes).unwrap());
    let stream = Stream::new(&gpu).unwrap();
    let kernel = module.function("ring_check_lanes").unwrap();
    let mut view = ring.device_view();
    let mut params: Vec<*mut c_void> = vec![(&mut view as *mut RingDeviceView).cast()];
    // SAFETY: ring_check_lanes(vkgdr_ring_view) takes the 64-byte #[repr(C)] view by value; the
    // ring is watched below, so dropping it stops the kernel and frees its memory after it.
    unsafe {
        kernel
            .launch(
                LaunchConfig::linear(view.lanes, layout::CHECK_THREADS),
                Some(&stream),
                &mut params,
            )
            .unwrap()
    };
    ring.watch_consumer(&stream).unwrap();
    let path = new_socket(test);
    let server = ShareServer::bind(&path, gpu.vulkan(), ShareOptions::default()).unwrap();
    server.share_ring("in", &ring).unwrap();
    Owner {
        gpu,
        ring,
        server,
        path,
        _module: module,
        _stream: stream,
    }
}

/// Checks lane `lane`'s results against what its producers wrote.
fn check_lane(ring: &DeviceRing, lane: u32, records: u64, seqs: u64, sum: u64) {
    let res = ring.results_of(lane as usize);
    println!("lane {lane}: kernel {res:?}; producers {records} records, {seqs} seqs");
    assert_eq!(res[layout::RESULT_ERRORS], 0, "lane {lane}: {res:?}");
    assert_eq!(res[layout::RESULT_RECORDS], records, "lane {lane}");
    assert_eq!(res[layout::RESULT_NEXT_SEQ], seqs, "lane {lane}");
    assert_eq!(res[layout::RESULT_CHECKSUM_SUM], sum, "lane {lane}");
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn eight_producer_processes_feed_one_checking_kernel() {
    if child_role().is_some() {
        producer_child(if under_sanitizer() { 2_000 } else { 100_000 }, false);
    }
    let name = "eight_producer_processes_feed_one_checking_kernel";
    let o = owner(name, 8);
    let t = Instant::now();
    let mut children: Vec<Child> = (0..8).map(|_| spawn(name, "produce", &o.path)).collect();
    let reports: Vec<Produced> = children.iter_mut().map(|c| read_report(c, false)).collect();
    for c in children {
        assert_eq!(
            finish(c, Duration::from_secs(120)),
            0,
            "a producer's checks"
        );
    }
    let elapsed = t.elapsed();
    o.ring.stop_and_wait(Duration::from_secs(60)).unwrap();
    let total: u64 = reports.iter().map(|r| r.records).sum();
    println!(
        "shared ring (8 producer processes, no CUDA there): {total} records in {elapsed:?} \
         ({:.2} M records/s with process start-up), {} lane faults",
        total as f64 / elapsed.as_secs_f64() / 1e6,
        o.server.stats().lane_faults
    );
    let mut lanes: Vec<u32> = reports.iter().map(|r| r.lane).collect();
    lanes.sort_unstable();
    assert_eq!(lanes, (0..8).collect::<Vec<_>>(), "one lane each");
    for r in &reports {
        check_lane(&o.ring, r.lane, r.records, r.seqs, r.sum);
    }
    assert_eq!(o.server.stats().lane_faults, 0);
    // The checks can fail: a producer's count one off does not match the kernel's.
    let r = reports[0];
    let res = o.ring.results_of(r.lane as usize);
    assert_ne!(res[layout::RESULT_CHECKSUM_SUM], r.sum.wrapping_add(1));
    drop(o.server);
    let _ = std::fs::remove_file(&o.path);
    settle(&o.gpu);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn a_producer_killed_mid_record_shows_the_kernel_nothing_torn() {
    if let Some(role) = child_role() {
        producer_child(if role == "tear" { 3_000 } else { 20_000 }, role == "tear");
    }
    let name = "a_producer_killed_mid_record_shows_the_kernel_nothing_torn";
    let o = owner(name, 2);
    let mut victim = spawn(name, "tear", &o.path);
    let first = read_report(&mut victim, true);
    let mut bystander = spawn(name, "stream", &o.path);
    // The bystander holds the other lane before the victim dies (else it could take the
    // victim's).
    let t = Instant::now();
    while !o.ring.lane(1 - first.lane as usize).unwrap().is_lent() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the bystander never took its lane"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    victim.kill().unwrap();
    let _ = victim.wait();
    wait_event(&o.server, Duration::from_secs(10), |e| {
        matches!(e, ShareEvent::Gone { .. })
    });
    let mut heir = spawn(name, "stream", &o.path);
    let second = read_report(&mut heir, false);
    let other = read_report(&mut bystander, false);
    assert_eq!(finish(heir, Duration::from_secs(120)), 0);
    assert_eq!(finish(bystander, Duration::from_secs(120)), 0);
    assert_eq!(second.lane, first.lane, "the heir took the victim's lane");
    assert_ne!(other.lane, first.lane);
    o.ring.stop_and_wait(Duration::from_secs(60)).unwrap();
    check_lane(
        &o.ring,
        first.lane,
        first.records + second.records,
        first.seqs + second.seqs,
        first.sum.wrapping_add(second.sum),
    );
    check_lane(&o.ring, other.lane, other.records, other.seqs, other.sum);
    drop(o.server);
    let _ = std::fs::remove_file(&o.path);
    settle(&o.gpu);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored (scripts/gpu-check run)"]
fn a_peer_process_writes_gpu_memory_a_kernel_checks() {
    const WORDS: usize = (2 << 20) / 4;
    if child_role().is_some() {
        let peer = Peer::connect(socket_path()).expect("connect");
        let mut m = peer.attach_memory("m").expect("attach");
        let mut seen = vec![0u32; WORDS];
        m.read_pod(0, &mut seen).unwrap();
        let bad = (0..WORDS)
            .filter(|&i| seen[i] != pattern(i as u64, 11))
            .count();
        assert_eq!(bad, 0, "the owner's words, read by the peer");
        let words: Vec<u32> = (0..WORDS).map(|i| pattern(i as u64, 12)).collect();
        m.write_pod(0, &words).unwrap();
        exit(0);
    }
    let name = "a_peer_process_writes_gpu_memory_a_kernel_checks";
    let gpu = open(false);
    let module = Module::load_ptx(&gpu, MAPPING_PTX).unwrap();
    let mut mem = gpu.alloc_shareable(2 << 20).unwrap();
    let words: Vec<u32> = (0..WORDS).map(|i| pattern(i as u64, 11)).collect();
    mem.write_pod(0, &words).unwrap();
    let path = new_socket(name);
    let server = ShareServer::bind(&path, gpu.vulkan(), ShareOptions::default()).unwrap();
    server.share_memory("m", &mem).unwrap();
    let child = spawn(name, "peer", &path);
    assert_eq!(
        finish(child, Duration::from_secs(120)),
        0,
        "the peer's checks"
    );
    let mut errors = gpu.alloc(8).unwrap();
    let mismatches = |seed: u32, errors: &mut vkgdr::RawMemory| -> u64 {
        errors.write_pod(0, &[0u64]).unwrap();
        let (mut p, mut n, mut first, mut seed, mut out) = (
            mem.device_ptr(),
            WORDS as u64,
            0u64,
            seed,
            errors.device_ptr(),
        );
        launch(
            &gpu,
            &module,
            "count_mismatches",
            64,
            256,
            &mut [
                arg(&mut p),
                arg(&mut n),
                arg(&mut first),
                arg(&mut seed),
                arg(&mut out),
            ],
        );
        let mut v = [0u64];
        errors.read_pod(0, &mut v).unwrap();
        v[0]
    };
    assert_eq!(
        mismatches(12, &mut errors),
        0,
        "the peer's words, read by the kernel"
    );
    assert_eq!(
        mismatches(11, &mut errors),
        WORDS as u64,
        "the check can fail"
    );
    drop(server);
}
