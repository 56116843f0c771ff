//! `vkgdr bench-child ROLE ...` (a hidden command): the processes that `vkgdr bench xproc` and
//! `vkgdr soak --xproc` start, this program run again in another role. Each talks to the process
//! that started it (its owner) over its stdin and stdout ([`protocol`]); the owner's side of a
//! child is [`process::ChildProcess`].
//!
//! The roles:
//! - `xproc-producer`: a producer of a ring lane the owner shares ([`vkgdr::share::Peer`], no
//!   CUDA): batches of records after each `go`, or lone records timed round trip by round trip;
//! - `xproc-attach`: a fresh process's Vulkan device, then attaches of a shared region and 64-byte
//!   writes into it (no CUDA);
//! - `xproc-cuda`: the CUDA IPC path beside it: `cuInit`, a primary context,
//!   `cuIpcOpenMemHandle` of the owner's allocation and `cuMemcpyHtoD` updates;
//! - `xproc-shm`: a producer of a shared-memory queue the owner drains with `cuMemcpyHtoDAsync`
//!   ([`shm`], no CUDA);
//! - `soak-producer`: a ring lane's producer of sealed records until told to stop (or killed).
//!
//! A failing child says an `error` line with its text and exits 1; one whose stdin ends (its
//! owner is gone) stops.

pub mod attach;
pub mod cuda_ipc;
mod lane;
pub mod process;
pub mod protocol;
pub mod shm;

use std::fmt::Display;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::bench::measure::{percentile, Stats};
use protocol::{say, Line, GO, QUIT};

pub use attach::AttachArgs;
pub use cuda_ipc::CudaArgs;
pub use lane::{ProducerArgs, SoakProducerArgs};
pub use shm::ShmArgs;

/// `vkgdr bench-child`'s command line.
#[derive(Debug, Clone, clap::Args)]
pub struct ChildArgs {
    /// What this process does for its owner
    #[command(subcommand)]
    pub role: Role,
}

/// The roles of a child process (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
pub enum Role {
    /// Produce into a ring lane the owner shares (no CUDA)
    XprocProducer(ProducerArgs),
    /// Open a Vulkan device, attach a shared region several times, write into it (no CUDA)
    XprocAttach(AttachArgs),
    /// cuInit, a primary context, cuIpcOpenMemHandle and cuMemcpyHtoD updates
    XprocCuda(CudaArgs),
    /// Produce into a shared-memory queue the owner drains (no CUDA)
    XprocShm(ShmArgs),
    /// Produce sealed records into a ring lane until told to stop (no CUDA)
    SoakProducer(SoakProducerArgs),
}

/// Runs the role; its failure is said as an `error` line (exit 1).
pub fn main(args: &ChildArgs) -> ExitCode {
    let result = match &args.role {
        Role::XprocProducer(a) => lane::producer(a),
        Role::XprocAttach(a) => attach::run(a),
        Role::XprocCuda(a) => cuda_ipc::run(a),
        Role::XprocShm(a) => shm::producer(a),
        Role::SoakProducer(a) => lane::soak_producer(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            say(&Line::error(&e));
            ExitCode::FAILURE
        }
    }
}

/// A child's result: what failed, in words.
type Outcome<T = ()> = Result<T, String>;

/// Names what failed (`attach_lane("in"): ...`).
trait Context<T> {
    fn ctx(self, what: impl Display) -> Outcome<T>;
}

impl<T, E: Display> Context<T> for Result<T, E> {
    fn ctx(self, what: impl Display) -> Outcome<T> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

/// How long a child waits for the owner's `go`.
const GO_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a child that is done waits to be told to quit.
const QUIT_TIMEOUT: Duration = Duration::from_secs(300);

/// The owner's commands, read from stdin on a thread of their own: `go`, and `quit` (or the end
/// of stdin: the owner is gone).
struct Commands {
    go: Receiver<()>,
    quit: Arc<AtomicBool>,
}

impl Commands {
    fn start() -> Outcome<Commands> {
        let (tx, go) = channel();
        let quit = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&quit);
        std::thread::Builder::new()
            .name("vkgdr-commands".into())
            .spawn(move || {
                let mut line = String::new();
                loop {
                    line.clear();
                    match std::io::stdin().read_line(&mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => match line.trim() {
                            GO => {
                                let _ = tx.send(());
                            }
                            QUIT => break,
                            _ => {}
                        },
                    }
                }
                flag.store(true, Ordering::Release);
            })
            .ctx("a thread to read the owner's commands")?;
        Ok(Commands { go, quit })
    }

    /// Waits for `go`.
    fn wait_go(&self) -> Outcome {
        match self.go.recv_timeout(GO_TIMEOUT) {
            Ok(()) => Ok(()),
            Err(RecvTimeoutError::Timeout) => Err(format!(
                "no `go` from the owner within {} s",
                GO_TIMEOUT.as_secs()
            )),
            Err(RecvTimeoutError::Disconnected) => {
                Err("told to quit (or stdin ended) before `go`".into())
            }
        }
    }

    /// Whether the owner said `quit` (or is gone).
    fn quit_requested(&self) -> bool {
        self.quit.load(Ordering::Acquire)
    }

    /// Waits until the owner says `quit` (or is gone).
    fn wait_quit(&self) -> Outcome {
        let t = std::time::Instant::now();
        while !self.quit_requested() {
            if t.elapsed() > QUIT_TIMEOUT {
                return Err(format!(
                    "not told to quit within {} s of finishing",
                    QUIT_TIMEOUT.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }
}

/// Spins until `reached()`, for a producer waiting on a word another process moves: every 4096
/// spins `check` may end the wait with its error, and after `timeout` the wait ends with
/// `late()`'s message.
fn spin_until(
    mut reached: impl FnMut() -> bool,
    timeout: Duration,
    mut check: impl FnMut() -> Outcome,
    late: impl FnOnce() -> String,
) -> Outcome {
    let t = std::time::Instant::now();
    let mut spins = 0u32;
    while !reached() {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(4096) {
            check()?;
            if t.elapsed() > timeout {
                return Err(late());
            }
        }
        std::hint::spin_loop();
    }
    Ok(())
}

/// Round-trip figures (ns) over `n` round trips, the first tenth dropped as warm-up: what a
/// child's `lat` line says, and what the owner measures itself.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Rtt {
    /// 50th percentile.
    pub median: f64,
    /// 10th percentile.
    pub p10: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Round trips counted.
    pub n: usize,
}

impl Rtt {
    /// The figures of `samples` (ns), after dropping the first tenth; `None` if none are left.
    pub fn of_samples(mut samples: Vec<f64>) -> Option<Rtt> {
        samples.drain(..samples.len() / 10);
        let s = Stats::of(&samples)?;
        samples.sort_by(f64::total_cmp);
        Some(Rtt {
            median: s.median,
            p10: s.p10,
            p90: s.p90,
            p99: percentile(&samples, 0.99),
            n: s.n,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Role, clap::Error> {
        use clap::Parser;
        let args = std::iter::once("vkgdr").chain(line.split_whitespace());
        match crate::test_cli::Cli::try_parse_from(args)?.command {
            Some(crate::test_cli::Command::BenchChild(c)) => Ok(c.role),
            other => panic!("{line:?} is not a child command: {other:?}"),
        }
    }

    #[test]
    fn the_roles_parse() {
        let r = parse(
            "bench-child xproc-producer --socket /tmp/s --ring in --size 64 --records 1000 --reps 3",
        )
        .unwrap();
        assert_eq!(
            r,
            Role::XprocProducer(ProducerArgs {
                socket: "/tmp/s".into(),
                ring: "in".into(),
                size: 64,
                records: 1000,
                reps: 3,
                lone: false,
            })
        );
        let r =
            parse("bench-child xproc-producer --socket s --ring r --size 64 --records 9 --lone")
                .unwrap();
        assert!(matches!(
            r,
            Role::XprocProducer(ProducerArgs {
                lone: true,
                reps: 1,
                ..
            })
        ));
        assert!(matches!(
            parse("bench-child soak-producer --socket s --ring r --seed 7").unwrap(),
            Role::SoakProducer(SoakProducerArgs { seed: 7, .. })
        ));
        assert!(matches!(
            parse("bench-child xproc-attach --socket s --region m --uuid 00112233-4455-6677-8899-aabbccddeeff --attaches 4 --writes 1000").unwrap(),
            Role::XprocAttach(AttachArgs { attaches: 4, writes: 1000, .. })
        ));
        assert!(matches!(
            parse("bench-child xproc-shm --fd 7 --lanes 8 --lane 2 --capacity 1048576 --size 64 --records 10").unwrap(),
            Role::XprocShm(ShmArgs { fd: 7, lane: 2, lanes: 8, .. })
        ));
        let handle = "ab".repeat(64);
        assert!(matches!(
            parse(&format!("bench-child xproc-cuda --uuid 00112233-4455-6677-8899-aabbccddeeff --handle {handle} --updates 5")).unwrap(),
            Role::XprocCuda(CudaArgs { updates: 5, .. })
        ));
        for bad in [
            "bench-child",
            "bench-child nope",
            "bench-child xproc-producer --socket s --ring r --size 64",
            "bench-child xproc-producer --socket s --ring r --size 8 --records 1",
            "bench-child xproc-producer --socket s --ring r --size 100 --records 1",
            "bench-child xproc-producer --socket s --ring r --size 64 --records 0",
            "bench-child soak-producer --socket s",
            "bench-child xproc-cuda --uuid x --handle ab --updates 1",
        ] {
            let e = parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert_eq!(e.exit_code(), 2, "{bad:?}: {e}");
        }
    }

    #[test]
    fn round_trip_figures_drop_the_warm_up_and_take_percentiles() {
        let samples: Vec<f64> = (0..110)
            .map(|i| if i < 11 { 1e9 } else { f64::from(i) })
            .collect();
        let r = Rtt::of_samples(samples).unwrap();
        assert_eq!((r.n, r.median), (99, 60.0));
        assert!(r.p10 < r.median && r.median < r.p90 && r.p90 < r.p99 && r.p99 < 1e9);
        assert_eq!(Rtt::of_samples(Vec::new()), None);
        let back = Line::parse(&Line::of("lat", &r).to_text()).unwrap();
        assert_eq!(back.read(), Ok(r));
        assert!(Line::new("lat").with("n", 1).read::<Rtt>().is_err());
    }
}
