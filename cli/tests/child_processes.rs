//! The hidden child roles of `vkgdr bench xproc` and `vkgdr soak --xproc` (`vkgdr bench-child
//! ROLE`), each run as a real process of the built binary against an owner in this test: on
//! lavapipe, with no CUDA anywhere (the owner's lanes are consumed by a thread of the test, its
//! queue drained by one). What the GPU machine's owner does with CUDA is `vkgdr bench xproc`'s own;
//! the children's side — attaching, the `go`/`done` protocol, the records they write, a killed
//! producer's lane taken over by the next — is proved here.
//!
//! Not part of the GPU bundle: it runs the binary of the build tree. Needs lavapipe.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vkgdr::ring::layout::{RESULT_ERRORS, RESULT_NEXT_SEQ, RESULT_RECORDS};
use vkgdr::share::{CheckingLanes, ShareEvent, ShareOptions, ShareServer};
use vkgdr::vulkan::{DeviceSelector, MemoryOptions, VulkanContext};
use vkgdr::Mapping;

use serde_json::Value;

use common::{lavapipe_manifest, INHERITED, NO_CUDA};

/// One child of the binary: stdin to write commands, its protocol lines from a reader thread.
struct Kid {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Kid {
    fn spawn(args: &[String], cuda: bool) -> Kid {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vkgdr"));
        cmd.arg("bench-child")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for v in INHERITED {
            cmd.env_remove(v);
        }
        cmd.env("VK_DRIVER_FILES", lavapipe_manifest());
        if !cuda {
            cmd.env(NO_CUDA.0, NO_CUDA.1);
        }
        let mut child = cmd.spawn().expect("start vkgdr bench-child");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Kid {
            stdin: child.stdin.take(),
            child,
            lines,
        }
    }

    /// The next protocol line of `kind` (a JSON object); panics on an error line, another kind,
    /// or silence.
    fn expect(&mut self, kind: &str) -> Value {
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("no `{kind}` line from the child: {e}"));
        let fields: Value = line
            .strip_prefix("@vkgdr ")
            .and_then(|rest| serde_json::from_str(rest).ok())
            .unwrap_or_else(|| panic!("not a protocol line: {line:?}"));
        assert_eq!(fields["kind"], kind, "the child said {line:?}");
        fields
    }

    fn send(&mut self, command: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{command}").unwrap();
        stdin.flush().unwrap();
    }

    /// Says `quit`, closes stdin and waits (60 s at most) for the exit code.
    fn finish(mut self) -> i32 {
        let _ = self.send_quit();
        self.stdin = None;
        let t = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code().unwrap_or(-1);
            }
            if t.elapsed() > Duration::from_secs(60) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("a child did not exit within 60 s");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn send_quit(&mut self) -> std::io::Result<()> {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "quit")?;
        stdin.flush()
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn num(fields: &Value, key: &str) -> u64 {
    (fields[key].as_u64()).unwrap_or_else(|| panic!("no whole number {key} in {fields}"))
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
    let mut kids: Vec<Kid> = (0..2)
        .map(|_| Kid::spawn(&args(&["--size=64", "--records=3000", "--reps=2"]), false))
        .collect();
    let mut held = Vec::new();
    for k in &mut kids {
        let ready = k.expect("ready");
        held.push(num(&ready, "lane"));
        assert_eq!((num(&ready, "tail"), num(&ready, "seq")), (0, 0));
    }
    held.sort();
    held.dedup();
    assert_eq!(held.len(), 2, "a lane each");
    for rep in 0..2u64 {
        for k in &mut kids {
            k.send("go");
        }
        for k in &mut kids {
            let done = k.expect("done");
            assert_eq!(num(&done, "rep"), rep);
            assert_eq!(num(&done, "records"), 3000);
            assert_eq!(num(&done, "seq"), 3000 * (rep + 1));
            assert_eq!(num(&done, "tail"), 64 * 3000 * (rep + 1));
            assert!(num(&done, "accepted_ns") >= num(&done, "push_ns"));
        }
    }
    // A lone producer on the third lane: round trips through the test's consumer.
    let mut lone = Kid::spawn(&args(&["--size=64", "--records=200", "--lone"]), false);
    lone.expect("ready");
    lone.send("go");
    let lat = lone.expect("lat");
    assert_eq!(num(&lat, "n"), 180, "a tenth dropped as warm-up");
    let median = lat["median"].as_f64().unwrap();
    let p99 = lat["p99"].as_f64().unwrap();
    assert!(median > 0.0 && p99 >= median, "{lat:?}");
    for k in kids.into_iter().chain([lone]) {
        assert_eq!(k.finish(), 0);
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
    let mut a = Kid::spawn(&args(1), false);
    let mut b = Kid::spawn(&args(2), false);
    let lane_a = num(&a.expect("ready"), "lane");
    b.expect("ready");
    // Let them write, then kill one wherever it is (often in the middle of a batch).
    let accepted = a.expect("accepted");
    assert_eq!(num(&accepted, "tail") % 16, 0);
    std::thread::sleep(Duration::from_millis(300));
    let pid = a.child.id();
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    wait_gone(&server, pid);
    let mut c = Kid::spawn(&args(3), false);
    let ready = c.expect("ready");
    assert_eq!(num(&ready, "lane"), lane_a, "the free lane");
    let start = num(&ready, "seq");
    assert!(
        start >= num(&accepted, "seq"),
        "it goes on where the owner stopped"
    );
    std::thread::sleep(Duration::from_millis(300));
    let mut finals = Vec::new();
    for mut k in [b, c] {
        k.send("quit");
        // `accepted` lines come first; the last line is `done`.
        let done = loop {
            let line = k.lines.recv_timeout(Duration::from_secs(60)).unwrap();
            if line.starts_with(r#"@vkgdr {"kind":"done""#) {
                break line;
            }
            assert!(line.starts_with(r#"@vkgdr {"kind":"accepted""#), "{line}");
        };
        let done: Value = serde_json::from_str(&done["@vkgdr ".len()..]).unwrap();
        finals.push(num(&done, "seq"));
        assert_eq!(k.finish(), 0);
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
    let mut k = Kid::spawn(&args(&["--records=5000", "--reps=2"]), false);
    assert_eq!(num(&k.expect("ready"), "tail"), 0);
    for rep in 1..=2u64 {
        k.send("go");
        let done = k.expect("done");
        assert_eq!(num(&done, "tail"), rep * 5000 * 64);
    }
    assert_eq!(k.finish(), 0);
    // The last record carries its number, 9999, at its place in lane 1's records.
    let last = 2 * 4096 + CAP + (9999 * 64) % CAP;
    // SAFETY: 8 bytes inside the mapping.
    let n = unsafe { ((base + last as usize) as *const u64).read_unaligned() };
    assert_eq!(n, 9999);
    assert_eq!(word(0).load(Ordering::Acquire), 0, "lane 0 untouched");
    let mut lone = Kid::spawn(&args(&["--records=100", "--lone"]), false);
    assert_eq!(
        num(&lone.expect("ready"), "tail"),
        10000 * 64,
        "it goes on from the tail"
    );
    lone.send("go");
    assert_eq!(num(&lone.expect("lat"), "n"), 90);
    assert_eq!(lone.finish(), 0);
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
    let mut k = Kid::spawn(
        &[
            "xproc-attach".into(),
            format!("--socket={}", path.display()),
            "--region=region".into(),
            format!("--uuid={uuid}"),
            "--attaches=3".into(),
            "--writes=640".into(),
        ],
        false,
    );
    let line = k.expect("attach");
    assert!(line["vulkan_ns"].as_f64().unwrap() > 0.0);
    assert_eq!(line["attach_ns"].as_array().unwrap().len(), 3);
    assert_eq!(line["write_ns"].as_array().unwrap().len(), 10);
    assert_eq!(num(&k.expect("holding"), "pid"), u64::from(k.child.id()));
    let mut seen = [0u8; 64];
    mem.read(0, &mut seen).unwrap();
    let want: [u8; 64] = std::array::from_fn(|i| 0xa5 ^ i as u8);
    assert_eq!(seen, want, "the child's last write, in the owner's memory");
    assert_eq!(k.finish(), 0);
}

#[test]
fn the_cuda_role_without_cuda_says_what_failed() {
    let k = Kid::spawn(
        &[
            "xproc-cuda".into(),
            "--uuid=00112233-4455-6677-8899-aabbccddeeff".into(),
            format!("--handle={}", "00".repeat(64)),
            "--updates=1".into(),
        ],
        false,
    );
    let line = k.lines.recv_timeout(Duration::from_secs(60)).unwrap();
    assert!(
        line.starts_with(r#"@vkgdr {"kind":"error","text":"loading libcuda and cuInit: "#),
        "{line}"
    );
    assert_eq!(k.finish(), 1);
}
