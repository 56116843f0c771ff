//! `vkgdr soak`'s command line ([`SoakArgs`]) and what it asks for ([`Options`]).

/// Exit codes, for `--help`.
const EXIT_CODES: &str = "\
Exit status:
  0  SOAK PASSED: fds, BAR1 used and free VRAM came back, every check found the right data, no
     worker failed
  1  SOAK FAILED: one of those did not hold, or the soak could not start or finish (no GPU, a
     driver call that failed)
  2  the command line is wrong";

/// `vkgdr soak`'s command line.
#[derive(Debug, Clone, clap::Args)]
#[command(display_name = "vkgdr", after_help = EXIT_CODES)]
pub struct SoakArgs {
    /// How long everything runs together, in seconds (after an 8-second warm-up)
    #[arg(long, value_name = "N", default_value_t = 600)]
    pub seconds: u64,

    /// Threads churning the pool
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = at_least_one::<usize>)]
    pub threads: usize,

    /// Seconds between BAR exhaustions (raw 1 GiB allocations until the BAR refuses one)
    #[arg(long, value_name = "S", default_value_t = 30, value_parser = at_least_one::<u64>)]
    pub exhaust_every: u64,

    /// Print one JSON document on stdout: the figures before and after, the counters, pass or
    /// fail (the status lines go to stderr)
    #[arg(long)]
    pub json: bool,
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
pub(super) struct Options {
    pub(super) seconds: u64,
    pub(super) threads: usize,
    pub(super) exhaust_every: u64,
}

impl From<&SoakArgs> for Options {
    fn from(a: &SoakArgs) -> Options {
        Options {
            seconds: a.seconds,
            threads: a.threads,
            exhaust_every: a.exhaust_every,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Options, clap::Error> {
        use clap::Parser;
        let args = ["vkgdr", "soak"].into_iter().chain(line.split_whitespace());
        match crate::Cli::try_parse_from(args)?.command {
            Some(crate::Command::Soak(a)) => Ok(Options::from(&a)),
            other => panic!("{line:?} is not a soak command: {other:?}"),
        }
    }

    #[test]
    fn options_parse() {
        let o = parse("").unwrap();
        assert_eq!((o.seconds, o.threads, o.exhaust_every), (600, 8, 30));
        let o = parse("--seconds 60 --threads 4 --exhaust-every 10").unwrap();
        assert_eq!((o.seconds, o.threads, o.exhaust_every), (60, 4, 10));
        // The warm-up alone is a valid soak.
        assert_eq!(parse("--seconds 0").unwrap().seconds, 0);
        for bad in [
            "--seconds",
            "--minutes 3",
            "--threads 0",
            "--exhaust-every 0",
            "--seconds -1",
        ] {
            let e = parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
    }
}
