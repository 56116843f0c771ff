//! `vkgdr soak`'s command line ([`SoakArgs`]) and what it asks for ([`Options`]).

use super::xproc::XprocOptions;
use crate::device::{DeviceArg, Devices};

/// Exit codes, for `--help`.
const EXIT_CODES: &str = "\
Exit status:
  0  SOAK PASSED: on every device nothing of ours stayed behind (fds, the library's holdings,
     this process's device memory per NVML; device-wide BAR1 used and free VRAM back at or below
     their start, or their growth another process's or the driver's), every check found the right
     data, no worker failed
  1  SOAK FAILED: one of those did not hold, or the soak could not start or finish (no GPU, a
     device named that is not here, a driver call that failed)
  2  the command line is wrong";

/// `vkgdr soak`'s command line.
#[derive(Debug, Clone, clap::Args)]
#[command(display_name = "vkgdr", after_help = EXIT_CODES)]
pub struct SoakArgs {
    /// How long everything runs together, in seconds (after an 8-second warm-up)
    #[arg(long, value_name = "N", default_value_t = 600)]
    pub seconds: u64,

    /// Threads churning the pool, on each device
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = at_least_one::<usize>)]
    pub threads: usize,

    /// Seconds between BAR exhaustions (raw 1 GiB allocations until the BAR refuses one)
    #[arg(long, value_name = "S", default_value_t = 30, value_parser = at_least_one::<u64>)]
    pub exhaust_every: u64,

    /// Print one JSON document on stdout: per device the figures before and after, what ours,
    /// other processes and the driver account for, the counters; pass or fail (the status lines
    /// go to stderr)
    // After the --xproc options, before the global --quiet (clap orders ties by name).
    #[arg(long, display_order = 5)]
    pub json: bool,

    /// Also feed a second ring on each device from producer processes (this program started
    /// again, attached through vkgdr::share, no CUDA in them), killing one with SIGKILL every
    /// --kill-every seconds and starting another in its place; off by default
    // Beside --exhaust-every.
    #[arg(long, display_order = 3)]
    pub xproc: bool,

    /// Also run, on each device, device → host rings whose records the CPU checks byte for byte
    /// and pool blocks released by kernels with their tokens (spent and forged ones among them);
    /// off by default
    // Beside --exhaust-every.
    #[arg(long, display_order = 3)]
    pub d2h: bool,

    /// With --xproc: producer processes on each device, a lane each
    #[arg(
        long,
        value_name = "N",
        default_value_t = 4,
        requires = "xproc",
        display_order = 4,
        value_parser = clap::value_parser!(u32).range(1..=64)
    )]
    pub xproc_producers: u32,

    /// With --xproc: seconds between kills of a producer process (at a random moment of each
    /// period)
    #[arg(
        long,
        value_name = "S",
        default_value_t = 3,
        requires = "xproc",
        display_order = 4,
        value_parser = at_least_one::<u64>
    )]
    pub kill_every: u64,

    // Listed first (clap orders ties by name).
    /// The GPU to soak: a CUDA ordinal or a GPU UUID (GPU-..., as `nvidia-smi -L` prints it; the
    /// prefix may be left out) [default: 0]
    #[arg(
        long,
        value_name = "N|UUID",
        conflicts_with = "devices",
        display_order = 0
    )]
    pub device: Option<DeviceArg>,

    /// Soak several GPUs at once in this process: `all`, or a list of ordinals and UUIDs such as
    /// 0,2. Each device gets its own workers, figures and checks; one verdict for all
    #[arg(long, value_name = "all|LIST", display_order = 0)]
    pub devices: Option<Devices>,
}

/// A whole number of at least 1.
fn at_least_one<T: std::str::FromStr<Err = std::num::ParseIntError> + From<u8> + PartialOrd>(
    s: &str,
) -> Result<T, String> {
    match s.parse::<T>() {
        Ok(n) if n >= T::from(1) => Ok(n),
        Ok(_) => Err("must be at least 1".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// What the soak was asked for.
#[derive(Clone)]
pub(super) struct Options {
    /// The devices to soak (CUDA device 0 unless `--device`/`--devices` say otherwise).
    pub(super) devices: Devices,
    pub(super) seconds: u64,
    pub(super) threads: usize,
    pub(super) exhaust_every: u64,
    /// Producer processes and their kills (`--xproc`).
    pub(super) xproc: Option<XprocOptions>,
    /// The device → host workers (`--d2h`).
    pub(super) d2h: bool,
}

impl From<&SoakArgs> for Options {
    fn from(a: &SoakArgs) -> Options {
        Options {
            devices: match (&a.device, &a.devices) {
                (Some(d), _) => Devices::one(*d),
                (None, Some(d)) => d.clone(),
                (None, None) => Devices::one(DeviceArg::Ordinal(0)),
            },
            seconds: a.seconds,
            threads: a.threads,
            exhaust_every: a.exhaust_every,
            xproc: a.xproc.then_some(XprocOptions {
                producers: a.xproc_producers,
                kill_every: a.kill_every,
            }),
            d2h: a.d2h,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Options, clap::Error> {
        use clap::Parser;
        let args = ["vkgdr", "soak"].into_iter().chain(line.split_whitespace());
        match crate::test_cli::Cli::try_parse_from(args)?.command {
            Some(crate::test_cli::Command::Soak(a)) => Ok(Options::from(&a)),
            other => panic!("{line:?} is not a soak command: {other:?}"),
        }
    }

    #[test]
    fn options_parse() {
        let o = parse("").unwrap();
        assert_eq!((o.seconds, o.threads, o.exhaust_every), (600, 8, 30));
        assert_eq!(o.devices.to_string(), "0", "device 0 unless told");
        let o = parse("--seconds 60 --threads 4 --exhaust-every 10").unwrap();
        assert_eq!((o.seconds, o.threads, o.exhaust_every), (60, 4, 10));
        // The warm-up alone is a valid soak.
        assert_eq!(parse("--seconds 0").unwrap().seconds, 0);
        // One device, several, or every one.
        let uuid = crate::device::tests::UUID_1;
        assert_eq!(parse("--device 1").unwrap().devices.to_string(), "1");
        assert_eq!(
            parse(&format!("--device {}", &uuid[4..]))
                .unwrap()
                .devices
                .to_string(),
            uuid
        );
        assert_eq!(parse("--devices all").unwrap().devices, Devices::All);
        assert_eq!(parse("--devices=0,1").unwrap().devices.to_string(), "0,1");
        // Producer processes: off unless asked for.
        assert_eq!(parse("").unwrap().xproc, None);
        assert_eq!(
            parse("--xproc").unwrap().xproc,
            Some(XprocOptions {
                producers: 4,
                kill_every: 3
            })
        );
        assert_eq!(
            parse("--xproc --xproc-producers 8 --kill-every 10")
                .unwrap()
                .xproc,
            Some(XprocOptions {
                producers: 8,
                kill_every: 10
            })
        );
        for bad in [
            "--seconds",
            "--minutes 3",
            "--threads 0",
            "--exhaust-every 0",
            "--seconds -1",
            "--device",
            "--device all",
            "--device GPU-12",
            "--devices",
            "--devices 0,,1",
            "--devices none",
            "--device 0 --devices all",
            "--kill-every 5",
            "--xproc-producers 2",
            "--xproc --kill-every 0",
            "--xproc --xproc-producers 0",
            "--xproc --xproc-producers 65",
        ] {
            let e = parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
    }
}
