//! `vkgdr bench`'s command line ([`BenchArgs`]): one subcommand per registered benchmark, each
//! naming in its `--help` the reports it writes and what they are compared with; `all`, `plot`
//! and `compare`.

use std::path::PathBuf;

use clap::builder::{NonEmptyStringValueParser, TypedValueParser};
use clap::Args as _;

use super::compare;
use super::registry::{all_count, Which, BENCHMARKS};
use super::report::spec::{Anchor, ReportSpec};
use crate::device::DeviceArg;

/// Where results go when `--out` is not given.
pub const DEFAULT_OUT: &str = "bench-out";

/// Exit codes, for `--help`.
const EXIT_CODES: &str = "\
Exit status:
  0  every benchmark ran to the end (and, with --compare, no figure got worse beyond --tolerance)
  1  a benchmark failed (each failure is reported as it happens)
  2  the command line is wrong, or --compare names no results of `vkgdr bench`
  3  with --compare: a figure got worse beyond --tolerance";

/// Exit codes of `vkgdr bench plot`, for its `--help`.
const PLOT_EXIT_CODES: &str = "\
Exit status:
  0  every table printed and every chart drawn
  1  DIR/results.json could not be read, or a chart could not be drawn
  2  the command line is wrong, or DIR holds no results.json";

/// Exit codes of `vkgdr bench compare`, for its `--help`.
const COMPARE_EXIT_CODES: &str = "\
Exit status:
  0  no figure got worse beyond --tolerance
  2  the command line is wrong, or a file is not results of `vkgdr bench`
  3  a figure got worse beyond --tolerance";

/// `vkgdr bench`'s command line: one subcommand per registered benchmark, `all`, `plot` and
/// `compare`.
#[derive(Debug, Clone, clap::Args)]
#[command(
    display_name = "vkgdr",
    subcommand_value_name = "BENCHMARK",
    subcommand_help_heading = "Benchmarks",
    arg_required_else_help = true,
    after_help = EXIT_CODES
)]
pub struct BenchArgs {
    /// The benchmark to run, or `plot`.
    #[command(subcommand)]
    pub command: BenchCommand,
}

impl BenchArgs {
    /// Whether `--json` was given.
    pub fn json(&self) -> bool {
        match &self.command {
            BenchCommand::Run(_, a) => a.json,
            BenchCommand::Compare(_) | BenchCommand::Plot(_) => false,
        }
    }
}

/// The options of every benchmark (and `all`).
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct RunArgs {
    /// Where the CSVs, charts, summary.md and results.json go
    #[arg(
        long,
        value_name = "DIR",
        default_value = DEFAULT_OUT,
        value_parser = NonEmptyStringValueParser::new().map(PathBuf::from)
    )]
    pub out: PathBuf,

    /// Fewer sizes and repetitions: a first look in a fraction of the time
    #[arg(long)]
    pub quick: bool,

    /// Print one JSON document on stdout: the machine, then every figure with its unit and its
    /// anchor measured in the same run (the tables go to stderr)
    #[arg(long)]
    pub json: bool,

    /// Then set every figure beside an earlier run's (a results.json, or the directory that holds
    /// one); exit 3 if one got worse beyond --tolerance
    #[arg(
        long,
        value_name = "PATH",
        value_parser = NonEmptyStringValueParser::new().map(PathBuf::from)
    )]
    pub compare: Option<PathBuf>,

    /// With --compare: the smallest change that counts, in percent
    #[arg(
        long,
        value_name = "PCT",
        default_value_t = compare::DEFAULT_TOLERANCE_PERCENT,
        value_parser = clap::value_parser!(u32).range(0..=1000),
        requires = "compare",
        // Beside --compare, before the global --quiet (clap orders ties by name).
        display_order = 3
    )]
    pub tolerance: u32,

    /// The GPU to measure: a CUDA ordinal or a GPU UUID (GPU-..., as `nvidia-smi -L` prints it;
    /// the prefix may be left out); results.json names it
    // Listed first (clap orders ties by name).
    #[arg(long, value_name = "N|UUID", default_value = "0", display_order = 0)]
    pub device: DeviceArg,
}

/// A parsed `vkgdr bench` subcommand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BenchCommand {
    /// Run benchmarks.
    Run(Which, RunArgs),
    /// Redraw the charts of the CSVs in a directory.
    Plot(PathBuf),
    /// Compare two runs' results.
    Compare(compare::CompareArgs),
}

/// `vkgdr bench NAME --help`: the reports the benchmark writes, with what they are compared with.
fn writes(reports: &[ReportSpec]) -> String {
    let mut text = String::from("Writes, into DIR:");
    for r in reports {
        text += &format!("\n  {}.csv and .png: {}", r.name, r.title);
        match r.anchor {
            Anchor::None => {}
            Anchor::Method(m) => text += &format!("\n    each figure against {m:?}"),
            Anchor::Pairs(pairs) => {
                for (m, a) in pairs {
                    text += &format!("\n    {m} against {a}");
                }
            }
            Anchor::SameMethodIn(other) => {
                text += &format!("\n    each call against the same call in {other}")
            }
        }
    }
    text + "\n\n" + EXIT_CODES
}

fn run_command(name: &'static str, about: String, after: String) -> clap::Command {
    // The options first: their struct's doc would otherwise stand as the command's about.
    RunArgs::augment_args(clap::Command::new(name))
        .about(about)
        .long_about(None)
        .display_name("vkgdr")
        .after_help(after)
}

impl clap::Subcommand for BenchCommand {
    fn augment_subcommands(cmd: clap::Command) -> clap::Command {
        let mut cmd = cmd;
        for b in &BENCHMARKS {
            cmd = cmd.subcommand(run_command(b.name, b.help.to_string(), writes(b.reports)));
        }
        cmd.subcommand(run_command(
            "all",
            format!(
                "all {} but {} in turn ({} first), then DIR/summary.md",
                all_count(),
                BENCHMARKS
                    .iter()
                    .filter(|b| !b.in_all)
                    .map(|b| b.name)
                    .collect::<Vec<_>>()
                    .join(", "),
                BENCHMARKS[0].name
            ),
            EXIT_CODES.to_string(),
        ))
        .subcommand(
            clap::Command::new("plot")
                .about("Redraw the charts of DIR/results.json into DIR and print their tables")
                .display_name("vkgdr")
                .after_help(PLOT_EXIT_CODES)
                .arg(
                    clap::Arg::new("dir")
                        .value_name("DIR")
                        .required(true)
                        .value_parser(clap::value_parser!(PathBuf))
                        .help(
                            "A directory `vkgdr bench --out DIR` wrote (its results.json is read)",
                        ),
                ),
        )
        .subcommand(
            compare::CompareArgs::augment_args(clap::Command::new("compare"))
                .about("Compare two runs' results.json: every figure, its ratio, moves beyond --tolerance")
                .display_name("vkgdr")
                .after_help(COMPARE_EXIT_CODES),
        )
    }

    fn augment_subcommands_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_subcommands(cmd)
    }

    fn has_subcommand(name: &str) -> bool {
        name == "plot" || name == "compare" || Which::parse(name).is_some()
    }
}

impl clap::FromArgMatches for BenchCommand {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        match m.subcommand() {
            Some(("plot", sub)) => Ok(BenchCommand::Plot(
                sub.get_one::<PathBuf>("dir")
                    .cloned()
                    .expect("DIR is required"),
            )),
            Some(("compare", sub)) => Ok(BenchCommand::Compare(
                clap::FromArgMatches::from_arg_matches(sub)?,
            )),
            Some((name, sub)) => match Which::parse(name) {
                Some(which) => Ok(BenchCommand::Run(
                    which,
                    clap::FromArgMatches::from_arg_matches(sub)?,
                )),
                None => Err(clap::Error::raw(
                    clap::error::ErrorKind::InvalidSubcommand,
                    format!("no benchmark called {name:?}\n"),
                )),
            },
            None => Err(clap::Error::raw(
                clap::error::ErrorKind::MissingSubcommand,
                "name a benchmark\n",
            )),
        }
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn parse(line: &str) -> Result<BenchArgs, clap::Error> {
        use clap::Parser;
        let args = std::iter::once("vkgdr").chain(line.split_whitespace());
        match crate::test_cli::Cli::try_parse_from(args)?.command {
            Some(crate::test_cli::Command::Bench(b)) => Ok(b),
            other => panic!("{line:?} is not a bench command: {other:?}"),
        }
    }

    #[test]
    fn command_line_parses() {
        let x = RunArgs {
            device: DeviceArg::Ordinal(0),
            out: PathBuf::from("x"),
            quick: true,
            json: false,
            compare: None,
            tolerance: compare::DEFAULT_TOLERANCE_PERCENT,
        };
        for line in [
            "bench copybw --quick --out x",
            "bench copybw --out=x --quick",
        ] {
            let b = parse(line).unwrap();
            assert_eq!(
                b.command,
                BenchCommand::Run(Which::One("copybw"), x.clone()),
                "{line}"
            );
            assert!(!b.json());
        }
        let b = parse("bench all --json").unwrap();
        assert_eq!(
            b.command,
            BenchCommand::Run(
                Which::All,
                RunArgs {
                    device: DeviceArg::Ordinal(0),
                    out: PathBuf::from(DEFAULT_OUT),
                    quick: false,
                    json: true,
                    compare: None,
                    tolerance: compare::DEFAULT_TOLERANCE_PERCENT,
                }
            )
        );
        assert!(b.json());
        assert_eq!(
            parse("bench plot d").unwrap().command,
            BenchCommand::Plot(PathBuf::from("d"))
        );
        let b = parse("bench all --compare base --tolerance 25 --json").unwrap();
        assert!(b.json());
        assert!(matches!(
            b.command,
            BenchCommand::Run(Which::All, RunArgs { compare: Some(ref p), tolerance: 25, .. })
                if p == Path::new("base")
        ));
        // One chosen device, by ordinal or UUID (with or without its prefix).
        let uuid = "GPU-5fd4a7f7-1a2b-3c4d-5e6f-708192a3b4c5";
        for (line, want) in [
            ("bench copylat --device 1".to_string(), "1"),
            (format!("bench all --device {uuid}"), uuid),
            (format!("bench ring --device={}", &uuid[4..]), uuid),
        ] {
            match parse(&line).unwrap().command {
                BenchCommand::Run(_, a) => assert_eq!(a.device.to_string(), want, "{line}"),
                other => panic!("{line}: {other:?}"),
            }
        }
        let b = parse("bench compare old new").unwrap();
        assert!(!b.json());
        assert_eq!(
            b.command,
            BenchCommand::Compare(compare::CompareArgs {
                baseline: PathBuf::from("old"),
                current: PathBuf::from("new"),
                tolerance: compare::DEFAULT_TOLERANCE_PERCENT,
            })
        );
        for name in BENCHMARKS.iter().map(|b| b.name) {
            assert!(matches!(
                parse(&format!("bench {name}")).unwrap().command,
                BenchCommand::Run(Which::One(n), _) if n == name
            ));
        }
        for bad in [
            "bench",
            "bench nope",
            "bench plot",
            "bench plot a b",
            "bench pplat --out",
            "bench pplat --fast",
            "bench all --out=",
            "bench copybw pplat",
            "bench --quick copybw",
            "bench plot d --quick",
            "bench compare",
            "bench compare old",
            "bench compare old new extra",
            "bench compare old new --tolerance x",
            "bench compare old new --tolerance 1001",
            "bench compare old new --quick",
            "bench compare old new --json",
            "bench all --tolerance 5",
            "bench all --compare",
            "bench all --compare=",
            "bench all --device",
            "bench all --device GPU-1234",
            "bench all --device -1",
            "bench all --device 0,1",
            "bench all --devices all",
            "bench plot d --device 0",
        ] {
            let e = parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert_eq!(e.exit_code(), 2, "{bad:?}: {e}");
        }
    }

    #[test]
    fn a_misspelt_benchmark_gets_a_suggestion() {
        let e = parse("bench copybww").err().unwrap().render().to_string();
        assert!(e.contains("copybw"), "{e}");
        assert!(e.contains("similar"), "{e}");
    }
}
