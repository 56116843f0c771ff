//! Helpers of the tests that share memory with child processes (`tests/share_processes.rs` on
//! any Vulkan driver, `tests/gpu_share.rs` on the GPU): each test re-runs its own binary as the
//! child, with the test's name and a role.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use vkgdr::ring::core::{Producer, RingSink};
use vkgdr::ring::layout::seal_test_payload;
use vkgdr::share::{AttachedLane, ShareEvent, ShareServer};

pub const ROLE: &str = "VKGDR_SHARE_CHILD";
pub const SOCKET: &str = "VKGDR_SHARE_SOCKET";

/// The role this process plays, if it is a child.
pub fn child_role() -> Option<String> {
    std::env::var(ROLE).ok()
}

pub fn socket_path() -> PathBuf {
    PathBuf::from(std::env::var(SOCKET).expect("the parent names the socket"))
}

/// A socket path of this test's own.
pub fn new_socket(test: &str) -> PathBuf {
    std::env::temp_dir().join(format!("vkgdr-{}-{test}.sock", std::process::id()))
}

/// Runs this binary's test `test` as a child in `role`, connected to `socket`, with no CUDA
/// library to be found.
pub fn spawn(test: &str, role: &str, socket: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            test,
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "--include-ignored",
        ])
        .env(ROLE, role)
        .env(SOCKET, socket)
        .env("VKGDR_CUDA_LIBRARY", "/nonexistent/libcuda.so.1")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn a child of this test binary")
}

/// Waits for `child` (at most `limit`), killing it on a hang; returns its exit code.
pub fn finish(mut child: Child, limit: Duration) -> i32 {
    let t = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("a child hung for {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The child's end: exit with `code` (0 = its checks passed).
pub fn exit(code: i32) -> ! {
    std::process::exit(code)
}

/// Waits for an event that `want` accepts, failing after `limit`.
pub fn wait_event(
    server: &ShareServer,
    limit: Duration,
    want: impl Fn(&ShareEvent) -> bool,
) -> ShareEvent {
    let t = Instant::now();
    while t.elapsed() < limit {
        if let Some(e) = server.next_event(Duration::from_millis(50)) {
            if want(&e) {
                return e;
            }
        }
    }
    panic!("no such event within {limit:?}");
}

/// The tests of this binary one at a time: two of them count the process's fds.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records `k..k + n` of a producer child, sealed with the sequence numbers from `first_seq` on:
/// record `k` holds 24 to 1,000 bytes (`24 + k * 37 % 977`).
pub fn sealed_records(k: u64, n: u64, first_seq: u64) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let mut payload = vec![0u8; 24 + ((k + i) * 37 % 977) as usize];
            seal_test_payload(&mut payload, first_seq + i);
            payload
        })
        .collect()
}

/// Waits (at most 30 s) until the owner has accepted every record `lane`'s producer published.
pub fn wait_accepted(lane: &AttachedLane) {
    let t = Instant::now();
    while lane.accepted().tail < lane.core().published() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the owner never accepted the tail"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The end of a producer child that dies in the middle of a record: reserves a sealed record of
/// 2,000 bytes, writes its first half, says `MID` on stdout and waits up to `wait` to be killed
/// by the parent.
pub fn tear_mid_record<S: RingSink>(p: &mut Producer<'_, S>, wait: Duration) -> ! {
    let mut payload = vec![0u8; 2000];
    seal_test_payload(&mut payload, p.next_seq());
    let mut r = p
        .reserve(2000, Some(Duration::from_secs(30)))
        .expect("reserve");
    r.write(0, &payload[..1000]).unwrap();
    println!("MID");
    std::thread::sleep(wait);
    unreachable!("killed by the parent");
}
