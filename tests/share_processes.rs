//! Sharing with real processes, on any Vulkan driver with exportable memory (lavapipe on CI,
//! the NVIDIA driver on the GPU machine): an owner shares raw memory, pool blocks and ring lanes
//! over a Unix socket; children of this test binary attach them with no CUDA (the CUDA library
//! they are pointed at does not exist), write, read, give back, are revoked, are killed in the
//! middle of a record, or send the owner garbage.
//!
//! Each test is its own child: the parent re-runs this binary with the test's name and the role
//! in `VKGDR_SHARE_CHILD`, so the child's half of a test runs the same code path the parent
//! checks, in another process.

mod common;

use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vkgdr::ring::layout::{WrapMode, RESULT_ERRORS, RESULT_NEXT_SEQ, RESULT_RECORDS};
use vkgdr::share::wire::{self, LaneDescriptor, Message, Region, RegionDescriptor};
use vkgdr::share::{
    CheckingLanes, Peer, PeerPolicy, RefusalCode, ShareError, ShareEvent, ShareOptions, ShareServer,
};
use vkgdr::vulkan::VulkanContext;
use vkgdr::{Error, Mapping, Pool, PoolConfig};

use common::share::*;

fn word_pattern(i: usize, seed: u32) -> u32 {
    common::pattern(i as u64, seed)
}

fn fill(len: usize, seed: u32) -> Vec<u8> {
    (0..len / 4)
        .flat_map(|i| word_pattern(i, seed).to_le_bytes())
        .collect()
}

fn server(ctx: &Arc<VulkanContext>, test: &str) -> (ShareServer, PathBuf) {
    let path = new_socket(test);
    let server = ShareServer::bind(&path, ctx, ShareOptions::default()).expect("bind");
    (server, path)
}

// --- Raw memory ---------------------------------------------------------------------------------

#[test]
fn a_peer_process_without_cuda_writes_memory_the_owner_reads() {
    let _serial = (child_role().is_none()).then(serial);
    for force_non_coherent in [false, true] {
        if let Some(role) = child_role() {
            let peer = Peer::connect(socket_path()).expect("connect");
            let mut m = peer.attach_memory("params").expect("attach");
            assert_eq!(m.len(), 64 << 10);
            let want_nc: bool = role == "nc";
            assert_eq!(
                m.memory().is_non_coherent(),
                want_nc,
                "the owner's coherence mode"
            );
            let mut seen = vec![0u8; 64 << 10];
            m.read(0, &mut seen).unwrap();
            assert!(
                seen == fill(64 << 10, 1),
                "the owner's bytes, read by the peer"
            );
            m.write(0, &fill(64 << 10, 2)).unwrap();
            // Out of bounds: refused, nothing written.
            assert!(m.write((64 << 10) - 3, &[1, 2, 3, 4]).is_err());
            exit(0);
        }
        common::warm_up_vulkan();
        let fds_before = common::open_fds();
        let ctx = common::vulkan(force_non_coherent);
        let (server, path) = server(&ctx, "memory");
        let mut mem = ctx.allocate(64 << 10).unwrap();
        mem.write(0, &fill(64 << 10, 1)).unwrap();
        server.share_vulkan_memory("params", &mem).unwrap();
        let role = if force_non_coherent { "nc" } else { "c" };
        let child = spawn(
            "a_peer_process_without_cuda_writes_memory_the_owner_reads",
            role,
            &path,
        );
        assert_eq!(
            finish(child, Duration::from_secs(60)),
            0,
            "the child's checks"
        );
        let mut back = vec![0u8; 64 << 10];
        mem.read(0, &mut back).unwrap();
        assert!(
            back == fill(64 << 10, 2),
            "the peer's bytes, read by the owner"
        );
        wait_event(&server, Duration::from_secs(5), |e| {
            matches!(e, ShareEvent::Gone { .. })
        });
        assert!(server.peers().is_empty());
        drop(server);
        drop(mem);
        drop(ctx);
        assert_eq!(
            common::open_fds(),
            fds_before,
            "fds after the owner and its peer are done"
        );
        assert!(!path.exists(), "the socket file is removed");
    }
}

// --- Pool blocks --------------------------------------------------------------------------------

#[test]
fn a_peer_fills_pool_blocks_it_asked_for_and_gives_them_back() {
    let _serial = (child_role().is_none()).then(serial);
    if child_role().is_some() {
        let peer = Peer::connect(socket_path()).expect("connect");
        let pool = peer.attach_pool("frames").expect("attach");
        assert_eq!(pool.quota(), 1 << 20);
        // Three blocks asked for, each filled with its own tag, then given back.
        for (k, size) in [100u64, 4096, 70_000].into_iter().enumerate() {
            let mut b = pool.request(size, 256).expect("request");
            assert_eq!(b.len(), size);
            b.write(0, &fill(size as usize & !3, 10 + k as u32))
                .unwrap();
        }
        // Beyond the quota: refused by name.
        match pool.request(2 << 20, 64) {
            Err(Error::Share(ShareError::Refused {
                code: RefusalCode::Quota,
                ..
            })) => {}
            other => panic!("a request past the quota: {other:?}"),
        }
        // A block the owner sends unasked: read its tag, answer with ours.
        let mut b = pool
            .next_block(Duration::from_secs(10))
            .expect("a block from the owner");
        let mut seen = vec![0u8; 512];
        b.read(0, &mut seen).unwrap();
        assert!(seen == fill(512, 77), "the owner's tag in its block");
        b.write(0, &fill(512, 78)).unwrap();
        drop(b);
        exit(0);
    }
    let ctx = common::vulkan(false);
    let pool = Pool::new(Arc::clone(&ctx), PoolConfig::default()).unwrap();
    let (server, path) = server(&ctx, "pool");
    server.share_pool("frames", &pool, 1 << 20).unwrap();
    let child = spawn(
        "a_peer_fills_pool_blocks_it_asked_for_and_gives_them_back",
        "pool",
        &path,
    );
    let peer = match wait_event(&server, Duration::from_secs(30), |e| {
        matches!(e, ShareEvent::Attached { .. })
    }) {
        ShareEvent::Attached { peer, .. } => peer,
        _ => unreachable!(),
    };
    let mut tokens = Vec::new();
    for _ in 0..3 {
        if let ShareEvent::Released { token, .. } =
            wait_event(&server, Duration::from_secs(30), |e| {
                matches!(e, ShareEvent::Released { .. })
            })
        {
            tokens.push(token);
        }
    }
    for (k, (token, size)) in tokens.iter().zip([100u64, 4096, 70_000]).enumerate() {
        let b = server.take_returned(*token).expect("the block came back");
        assert_eq!(b.size(), size);
        let mut seen = vec![0u8; size as usize & !3];
        b.read(0, &mut seen).unwrap();
        assert!(
            seen == fill(seen.len(), 10 + k as u32),
            "block {k} as the peer wrote it"
        );
    }
    let mut b = pool.alloc(512, 64).unwrap();
    b.write(0, &fill(512, 77)).unwrap();
    let token = server.send_block(peer, "frames", b).unwrap();
    wait_event(
        &server,
        Duration::from_secs(30),
        |e| matches!(e, ShareEvent::Released { token: t, .. } if *t == token),
    );
    let b = server.take_returned(token).unwrap();
    let mut seen = vec![0u8; 512];
    b.read(0, &mut seen).unwrap();
    assert!(
        seen == fill(512, 78),
        "the peer's answer in the owner's block"
    );
    assert_eq!(
        finish(child, Duration::from_secs(60)),
        0,
        "the child's checks"
    );
    wait_event(&server, Duration::from_secs(5), |e| {
        matches!(e, ShareEvent::Gone { .. })
    });
    drop(b);
    assert_eq!(
        (pool.stats().bytes_in_use, pool.stats().dedicated_chunks),
        (0, 0),
        "every block went back to the pool"
    );
}

// --- Revocation ---------------------------------------------------------------------------------

#[test]
fn revoked_memory_and_blocks_refuse_the_peers_writes() {
    let _serial = (child_role().is_none()).then(serial);
    if child_role().is_some() {
        let peer = Peer::connect(socket_path()).expect("connect");
        let mut m = peer.attach_memory("m").expect("attach");
        let pool = peer.attach_pool("p").expect("attach pool");
        let mut b = pool.next_block(Duration::from_secs(10)).expect("block");
        m.write(0, &[1; 64]).unwrap();
        b.write(0, &[2; 64]).unwrap();
        println!("WROTE");
        // Wait for the revocations.
        let t = Instant::now();
        while !(m.is_revoked() && b.is_revoked()) {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "no revocation arrived"
            );
            peer.poll().unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(matches!(
            m.write(0, &[3; 64]),
            Err(Error::Share(ShareError::Revoked))
        ));
        assert!(matches!(
            b.write(0, &[3; 64]),
            Err(Error::Share(ShareError::Revoked))
        ));
        exit(0);
    }
    let ctx = common::vulkan(false);
    let pool = Pool::new(Arc::clone(&ctx), PoolConfig::default()).unwrap();
    let (server, path) = server(&ctx, "revoke");
    let mut mem = ctx.allocate(4096).unwrap();
    mem.write(0, &[0; 64]).unwrap();
    server.share_vulkan_memory("m", &mem).unwrap();
    server.share_pool("p", &pool, 1 << 20).unwrap();
    let mut child = spawn(
        "revoked_memory_and_blocks_refuse_the_peers_writes",
        "revoke",
        &path,
    );
    let peer = match wait_event(
        &server,
        Duration::from_secs(30),
        |e| matches!(e, ShareEvent::Attached { region, .. } if region == "p"),
    ) {
        ShareEvent::Attached { peer, .. } => peer,
        _ => unreachable!(),
    };
    let token = server
        .send_block(peer, "p", pool.alloc(64, 64).unwrap())
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("WROTE") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the child ended early"
        );
    }
    server.revoke_block(peer, token).unwrap();
    server.revoke(peer).unwrap();
    assert_eq!(
        finish(child, Duration::from_secs(60)),
        0,
        "the child's checks"
    );
    let mut seen = [0u8; 64];
    mem.read(0, &mut seen).unwrap();
    assert_eq!(
        seen, [1; 64],
        "the write before the revocation, and none after"
    );
    wait_event(&server, Duration::from_secs(5), |e| {
        matches!(e, ShareEvent::Gone { .. })
    });
    assert_eq!(
        pool.stats().bytes_in_use,
        0,
        "the revoked block went back once the peer was gone"
    );
    // A revoked block is not returned to the owner: it goes back to its pool.
    assert!(server.take_returned(token).is_none());
}

// --- Ring lanes over Vulkan memory, consumed by the owner's CPU ---------------------------------

/// Lanes consumed by a thread of the owner that checks every record (the library's
/// `CheckingLanes`, the CPU's `ring_check_lanes`).
fn cpu_lanes(ctx: &Arc<VulkanContext>, n: u32, capacity: u64) -> Arc<CheckingLanes> {
    CheckingLanes::new(ctx, capacity, n).expect("checking lanes")
}

/// What the consumer saw of one lane.
#[derive(Default, Debug, Clone, Copy)]
struct Consumed {
    records: u64,
    errors: u64,
    next_seq: u64,
}

/// Stops the lanes' consumer after a last pass over what was published, and says what it saw.
fn consumed(lanes: &CheckingLanes) -> Vec<Consumed> {
    lanes.stop();
    (0..lanes.lanes())
        .map(|i| {
            let r = lanes.results_of(i).expect("a lane");
            Consumed {
                records: r[RESULT_RECORDS],
                errors: r[RESULT_ERRORS],
                next_seq: r[RESULT_NEXT_SEQ],
            }
        })
        .collect()
}

/// A producer child: `records` sealed records of 24 to 1,000 bytes, in batches; then, with
/// `tear`, half of one more record, a line on stdout, and a wait to be killed.
fn produce(records: u64, tear: bool) -> ! {
    let peer = Peer::connect(socket_path()).expect("connect");
    let lane = peer.attach_lane("in").expect("attach a lane");
    println!(
        "LANE {} START {} {}",
        lane.lane(),
        lane.start().tail,
        lane.start().seq
    );
    let mut p = lane.producer().expect("producer");
    let mut k = 0u64;
    while k < records {
        let batch = sealed_records(k, 16.min(records - k), p.next_seq());
        p.push_batch(batch.iter().map(|r| &r[..]), Some(Duration::from_secs(30)))
            .expect("push");
        k += batch.len() as u64;
    }
    if tear {
        tear_mid_record(&mut p, Duration::from_secs(120));
    }
    drop(p);
    // Wait until the owner accepted everything, so the parent's count is exact.
    wait_accepted(&lane);
    exit(0)
}

#[test]
fn lanes_fed_by_producer_processes_reach_the_consumer_in_order() {
    let _serial = (child_role().is_none()).then(serial);
    if child_role().is_some() {
        produce(5000, false);
    }
    let ctx = common::vulkan(false);
    let lanes = cpu_lanes(&ctx, 3, 64 << 10);
    let (server, path) = server(&ctx, "lanes");
    server.share_lanes("in", lanes.clone()).unwrap();
    let name = "lanes_fed_by_producer_processes_reach_the_consumer_in_order";
    let children: Vec<Child> = (0..3).map(|_| spawn(name, "produce", &path)).collect();
    // Once the three hold a lane each, a fourth finds every lane taken.
    for _ in 0..3 {
        wait_event(&server, Duration::from_secs(30), |e| {
            matches!(e, ShareEvent::Attached { .. })
        });
    }
    let peer = Peer::connect(&path).unwrap();
    match peer.attach_lane("in") {
        Err(Error::Share(ShareError::Refused {
            code: RefusalCode::Busy,
            ..
        })) => {}
        other => panic!("a fourth producer: {other:?}"),
    }
    for c in children {
        assert_eq!(
            finish(c, Duration::from_secs(120)),
            0,
            "a producer's checks"
        );
    }
    drop(peer);
    std::thread::sleep(Duration::from_millis(100));
    let seen = consumed(&lanes);
    for (i, c) in seen.iter().enumerate() {
        assert_eq!(c.errors, 0, "lane {i}: {c:?}");
    }
    for (i, c) in seen.iter().enumerate() {
        assert_eq!((c.records, c.next_seq), (5000, 5000), "lane {i}: {c:?}");
    }
}

#[test]
fn a_producer_killed_mid_record_shows_no_torn_record_and_its_lane_is_reclaimed() {
    let _serial = (child_role().is_none()).then(serial);
    if let Some(role) = child_role() {
        produce(if role == "tear" { 300 } else { 2000 }, role == "tear");
    }
    let name = "a_producer_killed_mid_record_shows_no_torn_record_and_its_lane_is_reclaimed";
    let ctx = common::vulkan(false);
    let lanes = cpu_lanes(&ctx, 2, 64 << 10);
    let (server, path) = server(&ctx, "kill");
    server.share_lanes("in", lanes.clone()).unwrap();
    // The victim takes lane 0, then a bystander streams on lane 1 while it dies.
    let mut victim = spawn(name, "tear", &path);
    let mut out = BufReader::new(victim.stdout.take().unwrap());
    let mut line = String::new();
    let mut start_line = String::new();
    while !line.contains("MID") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the victim ended early"
        );
        // (The test harness starts the line with the test's name.)
        if let Some(at) = line.find("LANE") {
            start_line = line[at..].to_string();
        }
    }
    assert!(start_line.starts_with("LANE 0 START 0 0"), "{start_line}");
    let bystander = spawn(name, "stream", &path);
    // The bystander holds lane 1 before the victim dies (else it could take the victim's).
    let t = Instant::now();
    while !lanes.is_lent(1) {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the bystander never took lane 1"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let victim_pid = victim.id();
    victim.kill().unwrap();
    let _ = victim.wait();
    // The victim's own departure: the bystander may have finished and gone first.
    wait_event(
        &server,
        Duration::from_secs(10),
        |e| matches!(e, ShareEvent::Gone { pid, .. } if *pid as u32 == victim_pid),
    );
    // The lane is free again: a new producer continues where the victim's last accepted
    // record ended (the torn record was never accepted, so it is overwritten).
    assert!(!lanes.is_lent(0), "lane 0 is back");
    assert_eq!(
        lanes.published(0).unwrap().seq,
        300,
        "every whole record of the victim was accepted, the torn one not"
    );
    let heir = spawn(name, "stream", &path);
    assert_eq!(finish(bystander, Duration::from_secs(120)), 0);
    assert_eq!(finish(heir, Duration::from_secs(120)), 0);
    std::thread::sleep(Duration::from_millis(100));
    let seen = consumed(&lanes);
    assert_eq!(
        seen[0].errors, 0,
        "lane 0 (victim, then heir): {:?}",
        seen[0]
    );
    assert_eq!(seen[1].errors, 0, "lane 1 (bystander): {:?}", seen[1]);
    assert_eq!(
        seen[0].records,
        300 + 2000,
        "the victim's whole records and the heir's"
    );
    assert_eq!(seen[0].next_seq, 2300);
    assert_eq!(seen[1].records, 2000, "the bystander was never blocked");
}

// --- Hostile input ------------------------------------------------------------------------------

/// A fake owner: listens at `path` and answers the first attach with `reply` and `fds`.
fn fake_owner(path: &Path, reply: Vec<u8>, fds: Vec<OwnedFd>) -> std::thread::JoinHandle<()> {
    use rustix::net::{
        AddressFamily, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix,
        SocketFlags, SocketType,
    };
    let _ = std::fs::remove_file(path);
    let listener = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    rustix::net::bind(&listener, &SocketAddrUnix::new(path).unwrap()).unwrap();
    rustix::net::listen(&listener, 4).unwrap();
    std::thread::spawn(move || {
        let conn = rustix::net::accept(&listener).unwrap();
        let mut buf = [0u8; 1024];
        let _ = rustix::net::recv(&conn, &mut buf, rustix::net::RecvFlags::empty());
        let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !borrowed.is_empty() {
            assert!(control.push(SendAncillaryMessage::ScmRights(&borrowed)));
        }
        rustix::net::sendmsg(
            &conn,
            &[std::io::IoSlice::new(&reply)],
            &mut control,
            SendFlags::empty(),
        )
        .unwrap();
        // Hold the connection until the peer has read.
        std::thread::sleep(Duration::from_millis(300));
    })
}

fn memfd(size: u64) -> OwnedFd {
    let fd = rustix::fs::memfd_create("fake", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&fd, size).unwrap();
    fd
}

fn descriptor(ctx: &VulkanContext, region: Region) -> RegionDescriptor {
    RegionDescriptor {
        request: 1,
        attachment: 1,
        device_uuid: ctx.device_info().uuid,
        driver_uuid: ctx.device_info().driver_uuid,
        memory_type: ctx.memory_type().index,
        atom: ctx.atom_size(),
        non_coherent: false,
        region,
    }
}

#[test]
fn forged_descriptors_and_fds_of_the_wrong_kind_are_refused_by_name() {
    let _serial = (child_role().is_none()).then(serial);
    common::warm_up_vulkan();
    let ctx = common::vulkan(false);
    let path = new_socket("forged");
    // Each case's fds are closed with it: what is open now is open at the end.
    let fds_before = common::open_fds();
    let memory = Region::Memory {
        size: 8192,
        len: 8192,
    };
    let good = Message::Region(descriptor(&ctx, memory.clone()));
    let mut other_version = wire::encode(&good);
    other_version[4] = 9;
    let bytes = wire::encode(&good);
    let truncated = bytes[..bytes.len() - 5].to_vec();
    let file = {
        let p = std::env::temp_dir().join(format!("vkgdr-forged-{}", std::process::id()));
        std::fs::write(&p, vec![0u8; 8192]).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        OwnedFd::from(f)
    };
    let wrong_gpu = Message::Region(RegionDescriptor {
        device_uuid: [0xee; 16],
        ..descriptor(&ctx, memory.clone())
    });
    let wrong_driver = Message::Region(RegionDescriptor {
        driver_uuid: [0xdd; 16],
        ..descriptor(&ctx, memory.clone())
    });
    let lane = Region::RingLane(LaneDescriptor {
        lane: 0,
        wrap: WrapMode::Padded,
        capacity: 4096,
        data_size: 4096,
        data_offset: 0,
        start_pos: 0,
        start_seq: 0,
        head: 0,
    });
    type Case = (&'static str, Vec<u8>, Vec<OwnedFd>, fn(&Error) -> bool);
    let cases: Vec<Case> = vec![
        ("another version", other_version, vec![memfd(8192)], |e| {
            matches!(e, Error::Share(ShareError::UnknownVersion { got: 9, .. }))
        }),
        ("truncated", truncated, vec![memfd(8192)], |e| {
            matches!(e, Error::Share(ShareError::Truncated { .. }))
        }),
        ("no fd", bytes.clone(), vec![], |e| {
            matches!(
                e,
                Error::Share(ShareError::FdCount {
                    expected: 1,
                    got: 0,
                    ..
                })
            )
        }),
        ("a regular file", bytes.clone(), vec![file], |e| {
            matches!(e, Error::Share(ShareError::WrongFdKind { .. }))
        }),
        ("a memfd too small", bytes.clone(), vec![memfd(4096)], |e| {
            matches!(
                e,
                Error::Share(ShareError::SizeMismatch {
                    declared: 8192,
                    actual: 4096,
                    ..
                })
            )
        }),
        (
            "another GPU",
            wire::encode(&wrong_gpu),
            vec![memfd(8192)],
            |e| {
                matches!(
                    e,
                    Error::NoMatchingDevice(_) | Error::Share(ShareError::WrongDevice { .. })
                )
            },
        ),
        (
            "another driver",
            wire::encode(&wrong_driver),
            vec![memfd(8192)],
            |e| matches!(e, Error::Share(ShareError::WrongDriver { .. })),
        ),
        (
            "lane pages that are no sealed memfds",
            wire::encode(&Message::Region(descriptor(&ctx, lane))),
            vec![
                ctx.allocate(4096).unwrap().export_fd().unwrap(),
                memfd(4096),
                memfd(4096),
            ],
            |e| matches!(e, Error::Share(ShareError::WrongFdKind { .. })),
        ),
    ];
    for (what, reply, fds, expect) in cases {
        let owner = fake_owner(&path, reply, fds);
        let peer =
            Peer::connect_with(&path, Some(Arc::clone(&ctx)), Duration::from_secs(5)).unwrap();
        let e = if what.starts_with("lane") {
            peer.attach_lane("x").map(|_| ()).unwrap_err()
        } else {
            peer.attach_memory("x").map(|_| ()).unwrap_err()
        };
        assert!(expect(&e), "{what}: {e:?}");
        println!("{what}: {e}");
        drop(peer);
        owner.join().unwrap();
    }
    let _ = std::fs::remove_file(&path);
    assert_eq!(
        common::open_fds(),
        fds_before,
        "no fd of a refused message stays open"
    );
}

#[test]
fn a_peer_that_sends_garbage_is_disconnected_and_the_owner_serves_others() {
    let _serial = (child_role().is_none()).then(serial);
    use rustix::net::{AddressFamily, SendFlags, SocketAddrUnix, SocketFlags, SocketType};
    let ctx = common::vulkan(false);
    let (server, path) = server(&ctx, "garbage");
    let mem = ctx.allocate(4096).unwrap();
    server.share_vulkan_memory("m", &mem).unwrap();
    let raw = || {
        let s = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        rustix::net::connect(&s, &SocketAddrUnix::new(&path).unwrap()).unwrap();
        s
    };
    // Garbage, a message only the owner sends, a release of a block never held, a detach of
    // nothing: each disconnects its sender.
    let hostile: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        wire::encode(&Message::Revoke {
            attachment: 1,
            token: 0,
        }),
        wire::encode(&Message::Release {
            attachment: 1,
            token: 5,
        }),
        wire::encode(&Message::Detach { attachment: 3 }),
    ];
    for bytes in hostile {
        let s = raw();
        rustix::net::send(&s, &bytes, SendFlags::empty()).unwrap();
        wait_event(&server, Duration::from_secs(5), |e| {
            matches!(e, ShareEvent::Misbehaved { .. })
        });
        wait_event(&server, Duration::from_secs(5), |e| {
            matches!(e, ShareEvent::Gone { .. })
        });
    }
    // A peer that asks and hangs up before the answer.
    {
        let s = raw();
        let ask = wire::encode(&Message::Attach {
            request: 1,
            name: "m".into(),
        });
        rustix::net::send(&s, &ask, SendFlags::empty()).unwrap();
    }
    wait_event(&server, Duration::from_secs(5), |e| {
        matches!(e, ShareEvent::Gone { .. })
    });
    assert!(server.peers().is_empty(), "{:?}", server.peers());
    assert_eq!(server.stats().misbehaved, 4);
    // And a well-behaved peer is still served.
    let peer = Peer::connect(&path).unwrap();
    let m = peer.attach_memory("m").unwrap();
    assert_eq!(m.len(), 4096);
    // Unknown region: refused by name.
    match peer.attach_memory("nope") {
        Err(Error::Share(ShareError::Refused {
            code: RefusalCode::NoSuchRegion,
            ..
        })) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_peer_policy_turns_other_users_away() {
    let _serial = (child_role().is_none()).then(serial);
    let ctx = common::vulkan(false);
    let path = new_socket("policy");
    let me = rustix::process::geteuid().as_raw();
    let options = ShareOptions {
        peers: PeerPolicy::Uids(vec![me.wrapping_add(1)]),
        ..Default::default()
    };
    let server = ShareServer::bind(&path, &ctx, options).unwrap();
    let mode = std::fs::metadata(&path).map(|m| {
        use std::os::unix::fs::PermissionsExt;
        m.permissions().mode() & 0o777
    });
    assert_eq!(mode.unwrap(), 0o600, "the socket file's mode");
    let mem = ctx.allocate(4096).unwrap();
    server.share_vulkan_memory("m", &mem).unwrap();
    let peer = Peer::connect_with(&path, None, Duration::from_secs(5)).unwrap();
    match peer.attach_memory("m") {
        Err(Error::Share(ShareError::Refused {
            code: RefusalCode::NotAllowed,
            ..
        }))
        | Err(Error::Share(ShareError::Disconnected)) => {}
        other => panic!("{other:?}"),
    }
    wait_event(&server, Duration::from_secs(5), |e| {
        matches!(e, ShareEvent::Refused { .. })
    });
    assert_eq!(server.stats().refused, 1);
}

#[test]
fn a_producer_that_publishes_a_bad_tail_loses_its_lane_and_the_consumer_sees_nothing() {
    use rustix::net::{
        AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendFlags,
        SocketAddrUnix, SocketFlags, SocketType,
    };
    let _serial = serial();
    let ctx = common::vulkan(false);
    let lanes = cpu_lanes(&ctx, 1, 64 << 10);
    let (server, path) = server(&ctx, "badtail");
    server.share_lanes("in", lanes.clone()).unwrap();
    // A producer that writes its page by hand: the tail it publishes runs four capacities
    // ahead of anything the consumer has room for.
    let s = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    rustix::net::connect(&s, &SocketAddrUnix::new(&path).unwrap()).unwrap();
    let ask = wire::encode(&Message::Attach {
        request: 1,
        name: "in".into(),
    });
    rustix::net::send(&s, &ask, SendFlags::empty()).unwrap();
    let mut buf = [0u8; 1024];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        &s,
        &mut [std::io::IoSliceMut::new(&mut buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .unwrap();
    let fds: Vec<OwnedFd> = control
        .drain()
        .flat_map(|m| match m {
            RecvAncillaryMessage::ScmRights(f) => f.collect::<Vec<_>>(),
            _ => Vec::new(),
        })
        .collect();
    let Message::Region(RegionDescriptor {
        region: Region::RingLane(l),
        ..
    }) = wire::decode(&buf[..got.bytes], fds.len()).unwrap()
    else {
        panic!("a lane was expected");
    };
    // SAFETY: a new shared mapping of the producer page (a 4 KiB memfd this test received).
    let page = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            4096,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::SHARED,
            &fds[1],
            0,
        )
    }
    .unwrap()
    .cast::<AtomicU64>();
    // SAFETY: word 1 and 2 of the live page, touched only through atomics.
    let word = |i: usize| unsafe { &*page.add(i) };
    word(2).store(1, Ordering::Relaxed);
    word(1).store(4 * l.capacity, Ordering::Relaxed);
    word(0).store(2, Ordering::Release);
    let e = wait_event(&server, Duration::from_secs(5), |e| {
        matches!(e, ShareEvent::LaneFault { .. })
    });
    println!("{e:?}");
    assert_eq!(
        lanes.published(0).unwrap().tail,
        0,
        "nothing reached the consumer"
    );
    assert_eq!(server.stats().lane_faults, 1);
    // The owner page tells the producer why (read-only there).
    // SAFETY: a read-only mapping of the owner page.
    let owner = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            4096,
            rustix::mm::ProtFlags::READ,
            rustix::mm::MapFlags::SHARED,
            &fds[2],
            0,
        )
    }
    .unwrap()
    .cast::<AtomicU64>();
    // SAFETY: word 1 of the live owner page.
    assert_eq!(
        unsafe { &*owner.add(1) }.load(Ordering::Acquire),
        vkgdr::share::FAULTED
    );
    // Still lent while the faulty producer lives; back once it hangs up.
    assert!(lanes.is_lent(0));
    drop(fds);
    drop(s);
    wait_event(&server, Duration::from_secs(5), |e| {
        matches!(e, ShareEvent::Gone { .. })
    });
    assert!(!lanes.is_lent(0), "the lane went back");
    // SAFETY: the two probe mappings, unmapped once.
    unsafe {
        rustix::mm::munmap(page.cast(), 4096).unwrap();
        rustix::mm::munmap(owner.cast(), 4096).unwrap();
    }
}
