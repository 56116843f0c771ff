//! The hidden child roles of `vkgdr bench xproc` and `vkgdr soak --xproc` (`vkgdr bench-child
//! ROLE`), each run as a real process of the built binary against an owner in this test (the
//! tool's own owner side, [`ChildProcess`]): on lavapipe, with no CUDA anywhere (the owner's lanes
//! are consumed by a thread of the test, its queue drained by one). What the GPU machine's owner does with CUDA is `vkgdr bench xproc`'s own;
//! the children's side — attaching, the `go`/`done` protocol, the records they write, a killed
//! producer's lane taken over by the next — is proved here.
//!
//! Not part of the GPU bundle: it runs the binary of the build tree. Needs lavapipe.

mod common;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vkgdr::ring::layout::{RESULT_ERRORS, RESULT_NEXT_SEQ, RESULT_RECORDS};
use vkgdr::share::{CheckingLanes, ShareEvent, ShareOptions, ShareServer};
use vkgdr::vulkan::{DeviceSelector, MemoryOptions, VulkanContext};
use vkgdr::Mapping;

use vkgdr_lab::child::attach::Attached;
use vkgdr_lab::child::process::{ChildProcess, COMMAND};
use vkgdr_lab::child::protocol::{Line, QUIT};
use vkgdr_lab::child::Rtt;

use common::{lavapipe_manifest, INHERITED, NO_CUDA};

/// How long a child may take to answer.
const T: Duration = Duration::from_secs(60);

/// `vkgdr bench-child ARGS...` of the built binary on lavapipe, without CUDA, driven by the
/// tool's own owner side.
fn spawn(args: &[String]) -> ChildProcess {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vkgdr"));
    cmd.arg(COMMAND).args(args);
    for v in INHERITED {
        cmd.env_remove(v);
    }
    cmd.env("VK_DRIVER_FILES", lavapipe_manifest())
        .env(NO_CUDA.0, NO_CUDA.1);
    ChildProcess::start(args[0].clone(), cmd, None).expect("start vkgdr bench-child")
}

/// The next protocol line of `kind`; panics on an error line or silence.
fn expect(c: &mut ChildProcess, kind: &str) -> Line {
    c.expect(kind, T).unwrap_or_else(|e| panic!("{e}"))
}

fn num(line: &Line, key: &str) -> u64 {
    line.u64(key).unwrap()
}

fn vulkan() -> Arc<VulkanContext> {
    VulkanContext::new(DeviceSelector::FirstSuitable, MemoryOptions::default()).unwrap_or_else(
        |e| {
            panic!(
                "this test needs lavapipe (`apt-get install libvulkan1 mesa-vulkan-drivers`): {e}"
            )
        },
    )
}

fn socket(test: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("vkgdr-cli-{}-{test}.sock", std::process::id()))
}

// --- Lanes consumed by a thread of the test --------------------------------------------------

/// What the consumer saw of one lane: records, errors, the next seq.
type Seen = (u64, u64, u64);

/// `n` lanes of 256 KiB checked by a thread of the test (the library's `CheckingLanes`).
fn lanes(ctx: &Arc<VulkanContext>, n: u32) -> Arc<CheckingLanes> {
    CheckingLanes::new(ctx, 256 << 10, n).unwrap()
}

/// Stops the lanes' consumer after a last pass and says what it saw of each lane.
fn seen(lanes: &CheckingLanes) -> Vec<Seen> {
    lanes.stop();
    (0..lanes.lanes())
        .map(|i| {
            let r = lanes.results_of(i).unwrap();
            (r[RESULT_RECORDS], r[RESULT_ERRORS], r[RESULT_NEXT_SEQ])
        })
        .collect()
}

fn wait_gone(server: &ShareServer, pid: u32) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(20) {
        if let Some(ShareEvent::Gone { pid: p, .. }) = server.next_event(Duration::from_millis(50))
        {
            if p as u32 == pid {
                return;
            }
        }
    }
    panic!("the owner never saw pid {pid} go");
}

#[test]
fn producer_processes_answer_go_with_done_and_their_records_arrive_in_order() {
    let ctx = vulkan();
    let lanes = lanes(&ctx, 3);
    let path = socket("producers");
    let server = ShareServer::bind(&path, &ctx, ShareOptions::default()).unwrap();
    server.share_lanes("in", lanes.clone()).unwrap();
    let args = |extra: &[&str]| -> Vec<String> {
        [
            "xproc-producer",
            &format!("--socket={}", path.display()),
            "--ring=in",
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
    };
    let mut kids: Vec<ChildProcess> = (0..2)
        .map(|_| spawn(&args(&["--size=64", "--records=3000", "--reps=2"])))
        .collect();
    let mut held = Vec::new();
    for k in &mut kids {
        let ready = expect(k, "ready");
        held.push(num(&ready, "lane"));
        assert_eq!((num(&ready, "tail"), num(&ready, "seq")), (0, 0));
    }
    held.sort();
    held.dedup();
    assert_eq!(held.len(), 2, "a lane each");
    for rep in 0..2u64 {
        for k in &mut kids {
            k.go().unwrap();
        }
        for k in &mut kids {
            let done = expect(k, "done");
            assert_eq!(num(&done, "rep"), rep);
            assert_eq!(num(&done, "records"), 3000);
            assert_eq!(num(&done, "seq"), 3000 * (rep + 1));
            assert_eq!(num(&done, "tail"), 64 * 3000 * (rep + 1));
            assert!(num(&done, "accepted_ns") >= num(&done, "push_ns"));
        }
    }
    // A lone producer on the third lane: round trips through the test's consumer.
    let mut lone = spawn(&args(&["--size=64", "--records=200", "--lone"]));
    expect(&mut lone, "ready");
    lone.go().unwrap();
    let lat: Rtt = expect(&mut lone, "lat").read().unwrap();
    assert_eq!(lat.n, 180, "a tenth dropped as warm-up");
    assert!(lat.median > 0.0 && lat.p99 >= lat.median, "{lat:?}");
    for k in kids.into_iter().chain([lone]) {
        k.finish(T).unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    let seen = seen(&lanes);
    let mut counts: Vec<u64> = seen.iter().map(|s| s.0).collect();
    counts.sort();
    assert_eq!(counts, [200, 6000, 6000], "{seen:?}");
    assert!(
        seen.iter().all(|s| s.1 == 0),
        "no record was wrong: {seen:?}"
    );
    assert_eq!(server.stats().lane_faults, 0);
}

#[test]
fn a_killed_soak_producer_s_lane_goes_on_with_the_next_one() {
    let ctx = vulkan();
    let lanes = lanes(&ctx, 2);
    let path = socket("soak");
    let server = ShareServer::bind(&path, &ctx, ShareOptions::default()).unwrap();
    server.share_lanes("soak", lanes.clone()).unwrap();
    let args = |seed: u64| -> Vec<String> {
        vec![
            "soak-producer".into(),
            format!("--socket={}", path.display()),
            "--ring=soak".into(),
            format!("--seed={seed}"),
        ]
    };
    let mut a = spawn(&args(1));
    let mut b = spawn(&args(2));
    let lane_a = num(&expect(&mut a, "ready"), "lane");
    expect(&mut b, "ready");
    // Let them write, then kill one wherever it is (often in the middle of a batch).
    let accepted = expect(&mut a, "accepted");
    assert_eq!(num(&accepted, "tail") % 16, 0);
    std::thread::sleep(Duration::from_millis(300));
    let pid = a.pid();
    a.kill().unwrap();
    wait_gone(&server, pid);
    let mut c = spawn(&args(3));
    let ready = expect(&mut c, "ready");
    assert_eq!(num(&ready, "lane"), lane_a, "the free lane");
    let start = num(&ready, "seq");
    assert!(
        start >= num(&accepted, "seq"),
        "it goes on where the owner stopped"
    );
    std::thread::sleep(Duration::from_millis(300));
    let mut finals = Vec::new();
    for mut k in [b, c] {
        k.send(QUIT).unwrap();
        // `accepted` lines come first; the last line is `done`.
        finals.push(num(&expect(&mut k, "done"), "seq"));
        k.finish(T).unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    let seen = seen(&lanes);
    assert!(
        seen.iter().all(|s| s.1 == 0),
        "no torn or wrong record: {seen:?}"
    );
    // Each lane's records are exactly what its last producer saw accepted.
    let mut want = finals.clone();
    want.sort();
    let mut got: Vec<u64> = seen.iter().map(|s| s.0).collect();
    got.sort();
    assert_eq!(got, want, "{seen:?}");
    assert!(seen.iter().all(|s| s.0 == s.2), "{seen:?}");
    assert_eq!(server.stats().lane_faults, 0);
}

// --- The shared-memory queue -------------------------------------------------------------------

#[test]
fn a_shared_memory_producer_fills_its_lane_of_an_inherited_memfd() {
    const CAP: u64 = 64 << 10;
    // Inherited by the child (no close-on-exec), as the owner hands it over.
    // SAFETY: a NUL-terminated name and flags.
    let fd = unsafe { libc::memfd_create(c"test-queue".as_ptr(), 0) };
    assert!(fd >= 0);
    // SAFETY: a new fd nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let size = 2 * (4096 + CAP);
    // SAFETY: a valid fd.
    assert_eq!(
        unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) },
        0
    );
    // SAFETY: a shared mapping of the whole file.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    let base = base.cast::<u8>() as usize;
    // SAFETY: aligned words of the live mapping, touched through atomics only.
    let word = |at: u64| unsafe { &*((base + at as usize) as *const AtomicU64) };
    // Lane 1: its tail at 4096, its head at 4096 + 128, its records after both control pages.
    let (tail, head) = (word(4096), word(4096 + 128));
    let stop = Arc::new(AtomicBool::new(false));
    let drainer = {
        let stop = stop.clone();
        let (tail, head) = (
            tail as *const AtomicU64 as usize,
            head as *const AtomicU64 as usize,
        );
        std::thread::spawn(move || {
            // SAFETY: as above; the mapping outlives the thread (joined before the unmap).
            let (tail, head) =
                unsafe { (&*(tail as *const AtomicU64), &*(head as *const AtomicU64)) };
            while !stop.load(Ordering::Acquire) {
                head.store(tail.load(Ordering::Acquire), Ordering::Release);
                std::hint::spin_loop();
            }
        })
    };
    let args = |extra: &[&str]| -> Vec<String> {
        [
            "xproc-shm",
            &format!("--fd={}", fd.as_raw_fd()),
            "--lanes=2",
            "--lane=1",
            &format!("--capacity={CAP}"),
            "--size=64",
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
    };
    let mut k = spawn(&args(&["--records=5000", "--reps=2"]));
    assert_eq!(num(&expect(&mut k, "ready"), "tail"), 0);
    for rep in 1..=2u64 {
        k.go().unwrap();
        let done = expect(&mut k, "done");
        assert_eq!(num(&done, "tail"), rep * 5000 * 64);
    }
    k.finish(T).unwrap();
    // The last record carries its number, 9999, at its place in lane 1's records.
    let last = 2 * 4096 + CAP + (9999 * 64) % CAP;
    // SAFETY: 8 bytes inside the mapping.
    let n = unsafe { ((base + last as usize) as *const u64).read_unaligned() };
    assert_eq!(n, 9999);
    assert_eq!(word(0).load(Ordering::Acquire), 0, "lane 0 untouched");
    let mut lone = spawn(&args(&["--records=100", "--lone"]));
    assert_eq!(
        num(&expect(&mut lone, "ready"), "tail"),
        10000 * 64,
        "it goes on from the tail"
    );
    lone.go().unwrap();
    assert_eq!(num(&expect(&mut lone, "lat"), "n"), 90);
    lone.finish(T).unwrap();
    stop.store(true, Ordering::Release);
    drainer.join().unwrap();
    // SAFETY: the mapping made above, unmapped once; nothing uses it any more.
    unsafe { libc::munmap(base as *mut libc::c_void, size as usize) };
}

// --- Attaching, and the CUDA role without CUDA -------------------------------------------------

#[test]
fn an_attaching_process_times_its_device_and_attaches_and_leaves_its_bytes() {
    let ctx = vulkan();
    let path = socket("attach");
    let server = ShareServer::bind(&path, &ctx, ShareOptions::default()).unwrap();
    let mut mem = ctx.allocate(2 << 20).unwrap();
    mem.write(0, &[0; 64]).unwrap();
    server.share_vulkan_memory("region", &mem).unwrap();
    let uuid = vkgdr::vulkan::format_uuid(&ctx.device_info().uuid);
    let mut k = spawn(&[
        "xproc-attach".into(),
        format!("--socket={}", path.display()),
        "--region=region".into(),
        format!("--uuid={uuid}"),
        "--attaches=3".into(),
        "--writes=640".into(),
    ]);
    let done: Attached = expect(&mut k, "attach").read().unwrap();
    assert!(done.vulkan_ns > 0.0);
    assert_eq!((done.attach_ns.len(), done.write_ns.len()), (3, 10));
    assert_eq!(num(&expect(&mut k, "holding"), "pid"), u64::from(k.pid()));
    let mut seen = [0u8; 64];
    mem.read(0, &mut seen).unwrap();
    let want: [u8; 64] = std::array::from_fn(|i| 0xa5 ^ i as u8);
    assert_eq!(seen, want, "the child's last write, in the owner's memory");
    k.finish(T).unwrap();
}

#[test]
fn the_cuda_role_without_cuda_says_what_failed() {
    let mut k = spawn(&[
        "xproc-cuda".into(),
        "--uuid=00112233-4455-6677-8899-aabbccddeeff".into(),
        format!("--handle={}", "00".repeat(64)),
        "--updates=1".into(),
    ]);
    let e = k.expect("cuda", T).unwrap_err().0;
    assert!(e.contains("failed: loading libcuda and cuInit: "), "{e}");
    assert!(k.has_exited().is_some_and(|s| s.code() == Some(1)), "{e}");
}
