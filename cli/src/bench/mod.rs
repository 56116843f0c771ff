//! `vkgdr bench`: measurements on a real GPU, modelled on gdrcopy's `copybw`, `copylat`,
//! `apiperf` and ping-pong tools.
//!
//! Each benchmark returns [`Report`]s (one row per method and size); [`main`] prints them as
//! tables, writes one CSV and one PNG chart per report into the output directory, `results.json`
//! (the document `--json` prints: every figure with its unit and its anchor, see
//! [`crate::json`]) and, for `all`, a `summary.md` with markdown tables. While a benchmark runs,
//! a progress line shows its phase and the method and size it is measuring ([`crate::ui`]).
//! With `--compare BASELINE` every figure is then set beside the same figure of an earlier run
//! on the same GPU model, and `vkgdr bench compare` does the same for two files
//! ([`mod@compare`]).
//!
//! Timing: [`std::time::Instant`] around each sample after a warm-up. Operations shorter than
//! [`Budget::min_sample`] are repeated back to back inside one sample (the sample is then the mean
//! of that batch), so the timer's own ~20 ns do not swamp them; medians and p10/p90 are over the
//! samples.

pub mod apiperf;
pub mod arena;
pub mod compare;
pub mod copybw;
pub mod copylat;
pub mod fastpath;
pub mod pplat;
pub mod report;
pub mod ring;
pub mod waits;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::builder::{NonEmptyStringValueParser, TypedValueParser};
use clap::Args as _;
use vkgdr::{Gpu, OpenOptions};

use crate::json::{self, About, BenchDocument, BenchRunJson, MachineJson, ReportJson};
use crate::{alert, say, status, ui};

pub use report::{Anchor, Layout, Report, ReportSpec, Row, Unit};

/// Where results go when `--out` is not given.
pub const DEFAULT_OUT: &str = "bench-out";

/// Everything that can stop a benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A library or driver call failed.
    #[error(transparent)]
    Vkgdr(#[from] vkgdr::Error),
    /// Reading or writing an output file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A CSV file could not be parsed back into a report.
    #[error("{path}: {msg}")]
    Csv {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// Drawing a chart failed.
    #[error("plotting {path}: {msg}")]
    Plot {
        /// The PNG being drawn.
        path: PathBuf,
        /// The plotting library's message.
        msg: String,
    },
    /// The ping-pong kernel stopped answering (the GPU memory it uses has been leaked on purpose
    /// so that nothing is freed under a running kernel).
    #[error("kernel did not respond: {0}")]
    KernelStuck(String),
    /// Data did not arrive where a benchmark checked it.
    #[error("data check failed: {0}")]
    Check(String),
    /// The command line is wrong.
    #[error("{0}")]
    Usage(String),
    /// Some of the benchmarks run by one command failed (each reported as it happened).
    #[error("{0}")]
    Failed(String),
}

impl BenchError {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        BenchError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Result of benchmark code.
pub type BenchResult<T> = Result<T, BenchError>;

/// What a benchmark runs: its reports, or the error that stopped it.
pub type BenchFn = fn(&Options) -> BenchResult<Vec<Report>>;

/// One benchmark of `vkgdr bench`: its command-line name, a line of help, the function that runs
/// it and every report it writes (their titles and table layouts live here, beside the
/// benchmark, so no report falls back to the foreign-CSV path).
#[derive(Debug, Clone, Copy)]
pub struct Benchmark {
    /// The name on the command line (`vkgdr bench NAME`).
    pub name: &'static str,
    /// One line for `vkgdr bench --help`.
    pub help: &'static str,
    /// Runs it.
    pub run: BenchFn,
    /// The reports it writes, by file stem.
    pub reports: &'static [ReportSpec],
}

/// The benchmarks, in the order `all` runs them: `apiperf` first so that its "first
/// `Gpu::open`" really is the first in the process.
pub const BENCHMARKS: [Benchmark; 8] = [
    Benchmark {
        name: "apiperf",
        help: "cost of open, alloc/free, pool alloc/free, flush/invalidate",
        run: apiperf::run,
        reports: &[ReportSpec {
            name: "apiperf",
            title: "API call cost",
            layout: Layout::Long,
            anchor: Anchor::Pairs(&[
                ("RawMemory alloc", "cuMemAlloc"),
                ("RawMemory free", "cuMemFree"),
            ]),
        }],
    },
    Benchmark {
        name: "copybw",
        help: "bandwidth vs size: BAR writes/reads (1-8 threads) vs cuMemcpy",
        run: copybw::run,
        reports: &[
            ReportSpec {
                name: "copybw-write",
                title: "Write bandwidth, host to GPU memory",
                layout: Layout::Wide,
                anchor: Anchor::Method("HtoD pinned"),
            },
            ReportSpec {
                name: "copybw-read",
                title: "Read bandwidth, GPU memory to host",
                layout: Layout::Wide,
                anchor: Anchor::Method("DtoH pinned"),
            },
        ],
    },
    Benchmark {
        name: "copylat",
        help: "write latency vs size: BAR write, confirmed write, cuMemcpy",
        run: copylat::run,
        reports: &[ReportSpec {
            name: "copylat",
            title: "Write latency, host to GPU memory",
            layout: Layout::Wide,
            anchor: Anchor::Method("cuMemcpyHtoD"),
        }],
    },
    Benchmark {
        name: "fastpath",
        help: "the default API's writes, reads and pool cache beside this machine's limits",
        run: fastpath::run,
        reports: &[
            ReportSpec {
                name: "fastpath-write",
                title: "Large writes: RawMemory::write (default API) versus explicit pools and DMA",
                layout: Layout::Long,
                anchor: Anchor::Method("cuMemcpyHtoD pinned (DMA limit)"),
            },
            ReportSpec {
                name: "fastpath-read",
                title: "Large reads into pageable memory: Mapping::read versus cuMemcpyDtoH",
                layout: Layout::Long,
                anchor: Anchor::Method("cuMemcpyDtoH pinned (DMA limit)"),
            },
            ReportSpec {
                name: "fastpath-small",
                title: "Small writes: first write, Block::write, WriteBatch versus the raw store",
                layout: Layout::Long,
                anchor: Anchor::Pairs(&[
                    (
                        "first write in a process (fresh child)",
                        "second write, same process",
                    ),
                    (
                        "Block::write (default API)",
                        "raw store + sfence, same block (limit)",
                    ),
                    (
                        "RawMemory::write (default API)",
                        "raw store + sfence, same block (limit)",
                    ),
                    ("16 blocks: one WriteBatch", "16 blocks: Block::write each"),
                ]),
            },
            ReportSpec {
                name: "fastpath-pool",
                title: "Pool alloc+free with the default thread cache and without",
                layout: Layout::Long,
                anchor: Anchor::Pairs(&[
                    (
                        "alloc+free, 1 thread, default PoolConfig",
                        "alloc+free, 1 thread, thread_cache = 0 (opt-out)",
                    ),
                    (
                        "alloc+free, 8 threads, per pair, default PoolConfig",
                        "alloc+free, 8 threads, per pair, thread_cache = 0 (opt-out)",
                    ),
                ]),
            },
        ],
    },
    Benchmark {
        name: "pplat",
        help: "round trips between the CPU and a running kernel",
        run: pplat::run,
        reports: &[ReportSpec {
            name: "pplat",
            title: "Round trip: CPU writes, running kernel answers in pinned memory",
            layout: Layout::Wide,
            anchor: Anchor::Method("HtoDAsync+sync"),
        }],
    },
    Benchmark {
        name: "ring",
        help: "records from 1/4/8 producer threads into a resident kernel vs cuMemcpyHtoDAsync",
        run: ring::run,
        reports: &[
            ReportSpec {
                name: "ring-throughput",
                title: "Ring throughput: producer threads into a resident kernel",
                layout: Layout::Wide,
                anchor: Anchor::Method("cuMemcpyHtoDAsync, 256 per copy"),
            },
            ReportSpec {
                name: "ring-latency",
                title: "Ring round trip: one record to a resident kernel and back",
                layout: Layout::Long,
                anchor: Anchor::Method("cuMemcpyHtoDAsync + sync"),
            },
            ReportSpec {
                name: "ring-wrap",
                title: "Ring throughput: padded versus mirrored wrap",
                layout: Layout::Wide,
                anchor: Anchor::Pairs(&[(
                    "mirrored ring (records run over the end)",
                    "padded ring (wrap PAD at the end)",
                )]),
            },
        ],
    },
    Benchmark {
        name: "arena",
        help: "growing a VMM arena vs separate chunks; a kernel reading 1 GiB of each",
        run: arena::run,
        reports: &[
            ReportSpec {
                name: "arena-grow",
                title: "Arena growth by one chunk versus a separate chunk",
                layout: Layout::Wide,
                anchor: Anchor::Pairs(&[
                    ("arena grow by one chunk", "separate chunk alloc"),
                    ("arena shrink by one chunk", "separate chunk free"),
                ]),
            },
            ReportSpec {
                name: "arena-read",
                title: "Kernel reads: one contiguous arena versus separate chunks",
                layout: Layout::Long,
                anchor: Anchor::Pairs(&[(
                    "one kernel over the arena",
                    "* kernels over separate chunks",
                )]),
            },
        ],
    },
    Benchmark {
        name: "waits",
        help: "which driver and library calls wait for a running kernel",
        run: waits::run,
        reports: &[
            ReportSpec {
                name: "waits-idle",
                title: "Calls with no kernel running",
                layout: Layout::Long,
                anchor: Anchor::None,
            },
            ReportSpec {
                name: "waits-own-stream",
                title: "Calls while a persistent kernel runs on a non-blocking stream",
                layout: Layout::Long,
                anchor: Anchor::SameMethodIn("waits-idle"),
            },
            ReportSpec {
                name: "waits-legacy-stream",
                title: "Calls while a persistent kernel runs on the legacy default stream",
                layout: Layout::Long,
                anchor: Anchor::SameMethodIn("waits-idle"),
            },
        ],
    },
];

/// The registered benchmark called `name`.
pub fn benchmark(name: &str) -> Option<&'static Benchmark> {
    BENCHMARKS.iter().find(|b| b.name == name)
}

/// The registered report whose file stem is `name` (`None` for foreign CSVs).
pub fn report_spec(name: &str) -> Option<&'static ReportSpec> {
    BENCHMARKS
        .iter()
        .flat_map(|b| b.reports)
        .find(|r| r.name == name)
}

/// Which benchmark(s) to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// The registered benchmark of this name (see [`BENCHMARKS`]).
    One(&'static str),
    /// Every registered benchmark in registry order, then `summary.md`.
    All,
}

impl Which {
    fn parse(s: &str) -> Option<Which> {
        if s == "all" {
            return Some(Which::All);
        }
        benchmark(s).map(|b| Which::One(b.name))
    }

    /// The benchmarks to run, in registry order.
    fn selected(self) -> Vec<&'static Benchmark> {
        BENCHMARKS
            .iter()
            .filter(|b| match self {
                Which::All => true,
                Which::One(name) => b.name == name,
            })
            .collect()
    }
}

/// Exit codes, for `--help`.
const EXIT_CODES: &str = "\
Exit status:
  0  every benchmark ran to the end (and, with --compare, no figure got worse beyond its noise)
  1  a benchmark failed (each failure is reported as it happens)
  2  the command line is wrong, or --compare names no results of `vkgdr bench`
  3  with --compare: a figure got worse beyond its noise on the same GPU model";

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
            BenchCommand::Compare(a) => a.json,
            BenchCommand::Plot(_) => false,
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

    /// Then set every figure beside an earlier run's (a results.json, or a directory such as
    /// benches/baselines: the one of this GPU model); exit 3 if one got worse beyond its noise
    #[arg(
        long,
        value_name = "PATH",
        value_parser = NonEmptyStringValueParser::new().map(PathBuf::from)
    )]
    pub compare: Option<PathBuf>,

    /// With --compare: the smallest change that counts, in percent (a figure's own spread can
    /// widen it)
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
                    text += &format!("\n    {m:?} against {a:?}");
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
                "all {} in turn ({} first), then DIR/summary.md",
                BENCHMARKS.len(),
                BENCHMARKS[0].name
            ),
            EXIT_CODES.to_string(),
        ))
        .subcommand(
            clap::Command::new("plot")
                .about("Redraw DIR/*.png from the CSVs in DIR and print their tables")
                .display_name("vkgdr")
                .arg(
                    clap::Arg::new("dir")
                        .value_name("DIR")
                        .required(true)
                        .value_parser(clap::value_parser!(PathBuf))
                        .help("A directory `vkgdr bench --out DIR` wrote (or any with CSVs in its format)"),
                ),
        )
        .subcommand(
            compare::CompareArgs::augment_args(clap::Command::new("compare"))
                .about(compare::ABOUT)
                .long_about(compare::LONG_ABOUT)
                .display_name("vkgdr")
                .after_help(compare::EXIT_CODES),
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

/// Settings shared by all benchmarks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Output directory for CSVs, PNGs and the summary.
    pub out: PathBuf,
    /// Smaller sizes and fewer repetitions (a full `all` in a few minutes).
    pub quick: bool,
}

/// Entry point of `vkgdr bench`: exit code 0 on success, 1 if a benchmark failed, 2 for a
/// `--compare` baseline that cannot be read (other usage errors are clap's), 3 if a figure got
/// worse than the baseline's beyond its noise.
pub fn main(args: &BenchArgs) -> ExitCode {
    let result = match &args.command {
        BenchCommand::Plot(dir) => replot(dir),
        BenchCommand::Compare(a) => return compare::main(a),
        BenchCommand::Run(which, a) => {
            // Read before the run: a bad file is said at once, and the baseline may be the
            // results.json this run replaces.
            let baseline = match a.compare.as_deref().map(compare::Baseline::open) {
                None => None,
                Some(Ok(b)) => Some((b, a.tolerance)),
                Some(Err(e)) => {
                    alert!("vkgdr bench: --compare {e}");
                    return ExitCode::from(compare::EXIT_USAGE);
                }
            };
            let opts = Options {
                out: a.out.clone(),
                quick: a.quick,
            };
            match run(*which, &opts, baseline.as_ref()) {
                Ok(code) => return ExitCode::from(code),
                Err(e) => Err(e),
            }
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            alert!("vkgdr bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The child process of `fastpath`'s first-write row (not a user command): `vkgdr bench
/// --first-write-child`, recognised before the command line is parsed.
pub fn first_write_child() -> ExitCode {
    match fastpath::child_main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vkgdr bench {}: {e}", fastpath::CHILD_ARG);
            ExitCode::FAILURE
        }
    }
}

/// One benchmark as it ran: for the summary and the JSON document.
#[derive(Debug, Clone, PartialEq)]
pub struct Ran {
    /// Its name.
    pub name: &'static str,
    /// How long it took.
    pub seconds: f64,
    /// What stopped it.
    pub error: Option<String>,
    /// Its reports (none when it failed).
    pub reports: Vec<Report>,
}

/// The JSON document of a run: `ran` in order, the machine it ran on, what stopped the run
/// outside a benchmark.
pub fn document(
    opts: &Options,
    machine: Option<MachineJson>,
    ran: &[Ran],
    error: Option<String>,
) -> BenchDocument {
    let all: Vec<&Report> = ran.iter().flat_map(|r| &r.reports).collect();
    BenchDocument {
        about: About::new("vkgdr-bench"),
        mode: if opts.quick { "quick" } else { "full" }.to_string(),
        out_dir: opts.out.display().to_string(),
        machine,
        benchmarks: ran
            .iter()
            .map(|r| BenchRunJson {
                name: r.name.to_string(),
                seconds: r.seconds,
                error: r.error.clone(),
                reports: r
                    .reports
                    .iter()
                    .map(|rep| ReportJson::new(rep, &all))
                    .collect(),
            })
            .collect(),
        ok: error.is_none() && ran.iter().all(|r| r.error.is_none()),
        error,
    }
}

/// The file every run leaves beside its CSVs: the JSON document of `--json`.
pub const RESULTS_JSON: &str = "results.json";

/// What a run has done so far: enough for the JSON document whatever stops it.
#[derive(Default)]
struct Session {
    ran: Vec<Ran>,
    /// `benchmark: error` for each failure.
    failures: Vec<String>,
    machine: Option<MachineJson>,
}

/// Runs `which`, then compares with `baseline` (and its noise floor in percent) when given:
/// the exit code when every benchmark ran (0, or [`compare::EXIT_WORSE`]).
fn run(
    which: Which,
    opts: &Options,
    baseline: Option<&(compare::Baseline, u32)>,
) -> BenchResult<u8> {
    let mut session = Session::default();
    let outcome = run_into(which, opts, &mut session);
    let error = outcome.as_ref().err().map(|e| e.to_string());
    let doc = document(opts, session.machine.clone(), &session.ran, error);
    // Only a run whose results were written is compared: its figures are in results.json.
    let comparison = match (baseline, &outcome) {
        (Some((b, tolerance)), Ok(())) => {
            let results = opts.out.join(RESULTS_JSON);
            match compare::Results::of(&doc, &results) {
                Ok(current) => {
                    let c = compare::Comparison::new(b, &current, &results, *tolerance);
                    say!();
                    ui::out(&c.text());
                    let path = opts.out.join(compare::COMPARISON_JSON);
                    match std::fs::write(&path, json::to_text(&c.doc)) {
                        Ok(()) => status!("wrote {}", path.display()),
                        Err(e) => {
                            let e = BenchError::io(&path, e);
                            alert!("{e}");
                            session.failures.push(format!("compare: {e}"));
                        }
                    }
                    Some(c)
                }
                Err(e) => {
                    alert!("compare: {e}");
                    session.failures.push(format!("compare: {e}"));
                    None
                }
            }
        }
        _ => None,
    };
    // The document comes out even when an output file could not be written.
    if ui::settings().json {
        match &comparison {
            Some(c) => ui::document(&json::to_text(&compare::WithComparison {
                results: &doc,
                comparison: &c.doc,
            })),
            None => ui::document(&json::to_text(&doc)),
        }
    }
    outcome?;
    if session.failures.is_empty() {
        Ok(comparison.map_or(0, |c| c.exit_code()))
    } else {
        let names: Vec<&str> = session
            .failures
            .iter()
            .map(|f| f.split_once(':').map_or(f.as_str(), |(n, _)| n))
            .collect();
        Err(BenchError::Failed(format!(
            "failed: {} (errors above)",
            names.join(", ")
        )))
    }
}

fn run_into(which: Which, opts: &Options, session: &mut Session) -> BenchResult<()> {
    std::fs::create_dir_all(&opts.out).map_err(|e| BenchError::io(&opts.out, e))?;
    let selected = which.selected();
    // Gathered once, after the first benchmark (so `apiperf` still sees a cold process).
    let mut machine: Option<Vec<String>> = None;
    let results = opts.out.join(RESULTS_JSON);
    for (
        i,
        &&Benchmark {
            name, run: bench, ..
        },
    ) in selected.iter().enumerate()
    {
        status!("== {name}{} ==", if opts.quick { " (quick)" } else { "" });
        let label = if selected.len() > 1 {
            format!("[{}/{}] {name}", i + 1, selected.len())
        } else {
            name.to_string()
        };
        let task = ui::task(label);
        let started = Instant::now();
        let outcome = bench(opts);
        drop(task);
        let (mut stop, mut stuck) = (false, false);
        let mut this = Ran {
            name,
            seconds: 0.0,
            error: None,
            reports: Vec::new(),
        };
        match outcome {
            Ok(rs) => {
                let mut errors = Vec::new();
                for r in &rs {
                    if let Err(e) = emit(r, &opts.out) {
                        alert!("{name}: {e}");
                        errors.push(e.to_string());
                        session.failures.push(format!("{name}: {e}"));
                    }
                }
                this.reports = rs;
                this.error = (!errors.is_empty()).then(|| errors.join("; "));
            }
            Err(e) => {
                alert!("{name} failed: {e}");
                session.failures.push(format!("{name}: {e}"));
                this.error = Some(e.to_string());
                stuck = matches!(e, BenchError::KernelStuck(_));
                stop = match &e {
                    // A kernel may still be running on the device: stop here.
                    BenchError::KernelStuck(_) => true,
                    // No driver on this machine: every other benchmark would fail the same way.
                    BenchError::Vkgdr(vkgdr::Error::LibraryNotFound { .. }) => true,
                    _ => false,
                };
            }
        }
        this.seconds = started.elapsed().as_secs_f64();
        status!("({name} took {:.1} s)\n", this.seconds);
        session.ran.push(this);
        if session.machine.is_none() && !stuck {
            // Not beside a kernel that may still run: the probe makes driver calls.
            session.machine = Some(MachineJson::probe());
        }
        if which == Which::All {
            // Rewritten after every benchmark so a run cut short still leaves a summary.
            let machine = machine.get_or_insert_with(|| machine_lines(opts));
            let reports: Vec<Report> = session.ran.iter().flat_map(|r| r.reports.clone()).collect();
            write_summary(&opts.out, machine, &reports, &session.failures)?;
        }
        // Likewise the JSON results.
        let doc = document(opts, session.machine.clone(), &session.ran, None);
        std::fs::write(&results, json::to_text(&doc)).map_err(|e| BenchError::io(&results, e))?;
        if stop {
            break;
        }
    }
    if which == Which::All {
        status!("wrote {}", opts.out.join("summary.md").display());
    }
    status!("wrote {}", results.display());
    Ok(())
}

/// Prints a report's table and notes and writes its CSV and PNG.
fn emit(r: &Report, out: &Path) -> BenchResult<()> {
    ui::out(&r.text_table());
    for n in &r.notes {
        say!("  note: {n}");
    }
    let (csv, png) = report::write_outputs(r, out)?;
    status!("  wrote {}", csv.display());
    if let Some(png) = png {
        status!("  wrote {}", png.display());
    }
    say!();
    Ok(())
}

fn write_summary(
    out: &Path,
    machine: &[String],
    reports: &[Report],
    failures: &[String],
) -> BenchResult<()> {
    let text = report::summary_markdown(machine, reports, failures);
    let path = out.join("summary.md");
    std::fs::write(&path, text).map_err(|e| BenchError::io(&path, e))
}

/// Facts about the machine for the summary header; best effort (a missing GPU is a line too).
fn machine_lines(opts: &Options) -> Vec<String> {
    let mut lines = Vec::new();
    match Gpu::open(0) {
        Ok(gpu) => {
            let driver = gpu
                .driver()
                .version()
                .map(|v| format!("CUDA driver API {}.{}", v / 1000, (v % 1000) / 10))
                .unwrap_or_else(|e| format!("driver version unknown ({e})"));
            lines.push(format!(
                "GPU: {} ({driver}; BAR memory {})",
                gpu.name(),
                if gpu.is_non_coherent() {
                    "non-coherent"
                } else {
                    "coherent"
                }
            ));
        }
        Err(e) => lines.push(format!("GPU: not available ({e})")),
    }
    if let Some(cpu) = json::cpu_model() {
        lines.push(format!(
            "CPU: {cpu}, {} hardware threads",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        ));
    }
    lines.push(format!(
        "copy routines: {}; vkgdr {}; mode: {}",
        vkgdr::copy::simd_level(),
        env!("CARGO_PKG_VERSION"),
        if opts.quick { "--quick" } else { "full" }
    ));
    lines
}

/// `vkgdr bench plot DIR`: reads every `*.csv` in `dir`, prints its table and redraws its PNG.
fn replot(dir: &Path) -> BenchResult<()> {
    let mut csvs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| BenchError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .collect();
    csvs.sort();
    if csvs.is_empty() {
        return Err(BenchError::Usage(format!(
            "no .csv files in {}",
            dir.display()
        )));
    }
    let _task = ui::task("plot");
    ui::phase("charts", csvs.len() as u64);
    for csv in csvs {
        ui::step(csv.display().to_string());
        let report = report::read_csv(&csv)?;
        ui::out(&report.text_table());
        match report::plot_png(&report, &csv.with_extension("png"))? {
            true => status!("  wrote {}\n", csv.with_extension("png").display()),
            false => status!("  {}: nothing to plot\n", csv.display()),
        }
    }
    Ok(())
}

static GPU_OPENED: AtomicBool = AtomicBool::new(false);

/// Opens GPU 0 for a benchmark (and remembers that the process has opened one).
pub fn open_gpu(options: OpenOptions) -> BenchResult<Gpu> {
    let gpu = Gpu::open_with(0, options)?;
    GPU_OPENED.store(true, Ordering::Relaxed);
    Ok(gpu)
}

/// Whether a benchmark opened a GPU earlier in this process (driver already loaded).
pub fn gpu_opened_before() -> bool {
    GPU_OPENED.load(Ordering::Relaxed)
}

/// Median, 10th and 90th percentile of a set of samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    /// 50th percentile.
    pub median: f64,
    /// 10th percentile.
    pub p10: f64,
    /// 90th percentile.
    pub p90: f64,
    /// Number of samples.
    pub n: usize,
}

impl Stats {
    /// Statistics of `samples`; `None` if it is empty or holds a NaN.
    pub fn of(samples: &[f64]) -> Option<Stats> {
        if samples.is_empty() || samples.iter().any(|v| v.is_nan()) {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        Some(Stats {
            median: percentile(&sorted, 0.5),
            p10: percentile(&sorted, 0.1),
            p90: percentile(&sorted, 0.9),
            n: sorted.len(),
        })
    }
}

/// The `q`-quantile (0 ≤ q ≤ 1) of ascending `sorted` samples, interpolating linearly between
/// the two nearest ranks (NumPy's default). `sorted` must not be empty.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    debug_assert!(!sorted.is_empty());
    let rank = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

/// Sizes `start, start·factor, …` up to and including `end` (`start ≥ 1`, `factor ≥ 2`).
pub fn ladder(start: u64, end: u64, factor: u64) -> Vec<u64> {
    assert!(
        start >= 1 && factor >= 2,
        "ladder({start}, {end}, {factor})"
    );
    let mut v = Vec::new();
    let mut s = start;
    while s <= end {
        v.push(s);
        match s.checked_mul(factor) {
            Some(next) => s = next,
            None => break,
        }
    }
    v
}

/// How long and how often one measurement is repeated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Warm-up time before any sample (at least one call is always made).
    pub warmup: Duration,
    /// Target total time of the samples.
    pub target: Duration,
    /// Fewest samples, whatever the target.
    pub min_samples: usize,
    /// Most samples.
    pub max_samples: usize,
    /// Calls shorter than this are batched so one sample lasts at least this long.
    pub min_sample: Duration,
}

impl Budget {
    /// A budget with `target` sample time, `min..=max` samples, 10 ms warm-up, 1 µs samples.
    pub fn new(target: Duration, min_samples: usize, max_samples: usize) -> Budget {
        Budget {
            warmup: Duration::from_millis(10),
            target,
            min_samples,
            max_samples,
            min_sample: Duration::from_micros(1),
        }
    }

    /// `(calls per sample, samples)` for an operation estimated to take `est_ns` per call.
    pub fn plan(&self, est_ns: f64) -> (usize, usize) {
        let est = est_ns.max(1.0);
        let batch = (self.min_sample.as_nanos() as f64 / est).ceil().max(1.0);
        let samples = (self.target.as_nanos() as f64 / (est * batch)).floor();
        let samples = (samples.min(self.max_samples as f64) as usize)
            .max(self.min_samples)
            .max(1);
        (batch as usize, samples)
    }
}

/// Times `f`: warm-up, then samples per [`Budget::plan`]. Returns nanoseconds per call, one value
/// per sample (the mean over the sample's batch).
pub fn measure(budget: &Budget, mut f: impl FnMut() -> BenchResult<()>) -> BenchResult<Vec<f64>> {
    let start = Instant::now();
    let mut calls = 0u32;
    loop {
        f()?;
        calls += 1;
        if start.elapsed() >= budget.warmup {
            break;
        }
    }
    let est = start.elapsed().as_nanos() as f64 / f64::from(calls);
    let (batch, n) = budget.plan(est);
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        for _ in 0..batch {
            f()?;
        }
        samples.push(t.elapsed().as_nanos() as f64 / batch as f64);
    }
    Ok(samples)
}

/// Times a setup/teardown pair that cannot be batched (allocation and free): `open` returns a
/// value, `close` consumes it; both are timed separately, one sample per pair. Returns
/// `(open_ns, close_ns)`.
pub fn measure_pair<T>(
    budget: &Budget,
    mut open: impl FnMut() -> BenchResult<T>,
    mut close: impl FnMut(T),
) -> BenchResult<(Vec<f64>, Vec<f64>)> {
    let start = Instant::now();
    let mut calls = 0u32;
    loop {
        close(open()?);
        calls += 1;
        if start.elapsed() >= budget.warmup {
            break;
        }
    }
    let est = start.elapsed().as_nanos() as f64 / f64::from(calls);
    // No batching: each pair is one sample of each.
    let n = Budget {
        min_sample: Duration::ZERO,
        ..*budget
    }
    .plan(est)
    .1;
    let (mut a, mut b) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let t0 = Instant::now();
        let v = open()?;
        let t1 = Instant::now();
        close(v);
        let t2 = Instant::now();
        a.push((t1 - t0).as_nanos() as f64);
        b.push((t2 - t1).as_nanos() as f64);
    }
    Ok((a, b))
}

/// Turns per-call times of `size`-byte copies into GB/s samples (bytes per ns = GB/s).
pub fn to_bandwidth(size: u64, ns: &[f64]) -> Vec<f64> {
    ns.iter().map(|t| size as f64 / t.max(1e-3)).collect()
}

#[cfg(test)]
pub(crate) mod testutil {
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fresh, empty directory under the system temp dir, removed on drop.
    pub struct TempDir(pub PathBuf);

    impl TempDir {
        pub fn new(tag: &str) -> TempDir {
            static N: AtomicUsize = AtomicUsize::new(0);
            let p = std::env::temp_dir().join(format!(
                "vkgdr-bench-test-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_interpolates_between_ranks() {
        let v = [10.0, 20.0, 30.0, 40.0, 50.0];
        assert_eq!(percentile(&v, 0.0), 10.0);
        assert_eq!(percentile(&v, 0.5), 30.0);
        assert_eq!(percentile(&v, 1.0), 50.0);
        assert_eq!(percentile(&v, 0.1), 14.0);
        assert_eq!(percentile(&v, 0.9), 46.0);
        assert_eq!(percentile(&[7.0], 0.9), 7.0);
        // Out-of-range quantiles clamp.
        assert_eq!(percentile(&v, 1.5), 50.0);
    }

    #[test]
    fn stats_sort_their_input_and_match_a_naive_model() {
        let s = Stats::of(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!(s.median, 2.5);
        assert_eq!(s.n, 4);
        assert!((s.p10 - 1.3).abs() < 1e-12);
        assert!((s.p90 - 3.7).abs() < 1e-12);

        // Against a naive model over many shuffled inputs: the median of 1..=n.
        for n in 1..40u32 {
            let mut v: Vec<f64> = (1..=n).map(f64::from).collect();
            v.reverse();
            v.rotate_left((n / 3) as usize);
            let s = Stats::of(&v).unwrap();
            assert_eq!(s.median, f64::from(n + 1) / 2.0, "n = {n}");
            assert!(s.p10 <= s.median && s.median <= s.p90);
        }
        assert_eq!(Stats::of(&[]), None);
        assert_eq!(Stats::of(&[1.0, f64::NAN]), None);
    }

    #[test]
    fn ladders_are_inclusive_geometric_sequences() {
        assert_eq!(ladder(4096, 1 << 30, 4).len(), 10);
        assert_eq!(ladder(4096, 1 << 30, 4).last(), Some(&(1 << 30)));
        assert_eq!(ladder(4096, 64 << 20, 4).last(), Some(&(64 << 20)));
        assert_eq!(ladder(8, 4 << 20, 2).len(), 20);
        assert_eq!(ladder(8, 100, 2), vec![8, 16, 32, 64]);
        assert_eq!(ladder(8, 7, 2), Vec::<u64>::new());
        // No overflow at the top of the range.
        assert_eq!(ladder(1 << 62, u64::MAX, 4), vec![1 << 62]);
    }

    #[test]
    fn plan_batches_short_calls_and_bounds_sample_counts() {
        let b = Budget::new(Duration::from_millis(100), 10, 1000);
        // 50 ns calls: 20 per 1 µs sample; 100 ms / 1 µs = 100k samples, capped at 1000.
        assert_eq!(b.plan(50.0), (20, 1000));
        // 1 ms calls: no batching, 100 samples.
        assert_eq!(b.plan(1e6), (1, 100));
        // 1 s calls: the minimum applies.
        assert_eq!(b.plan(1e9), (1, 10));
        // A zero estimate does not divide by zero.
        assert_eq!(b.plan(0.0).0, 1000);
    }

    #[test]
    fn measure_calls_the_closure_batch_times_samples_plus_warmup() {
        let b = Budget {
            warmup: Duration::ZERO,
            target: Duration::ZERO,
            min_samples: 5,
            max_samples: 5,
            min_sample: Duration::ZERO,
        };
        let mut calls = 0;
        let s = measure(&b, || {
            calls += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(s.len(), 5);
        assert_eq!(calls, 6);
        assert!(s.iter().all(|v| *v >= 0.0));

        let (mut opened, mut closed) = (0, 0);
        let (a, c) = measure_pair(
            &b,
            || {
                opened += 1;
                Ok(opened)
            },
            |_| closed += 1,
        )
        .unwrap();
        assert_eq!((a.len(), c.len(), opened, closed), (5, 5, 6, 6));

        let err = measure(&b, || Err(BenchError::Usage("boom".into())));
        assert!(matches!(err, Err(BenchError::Usage(m)) if m == "boom"));
    }

    #[test]
    fn bandwidth_is_bytes_per_nanosecond() {
        assert_eq!(to_bandwidth(1000, &[100.0, 50.0]), vec![10.0, 20.0]);
    }

    #[test]
    fn every_benchmark_and_report_is_registered_once() {
        let mut names: Vec<&str> = BENCHMARKS.iter().map(|b| b.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), BENCHMARKS.len(), "duplicate benchmark name");
        let mut reports: Vec<&str> = BENCHMARKS
            .iter()
            .flat_map(|b| b.reports.iter().map(|r| r.name))
            .collect();
        let n = reports.len();
        reports.sort_unstable();
        reports.dedup();
        assert_eq!(reports.len(), n, "two benchmarks claim one report");
        for b in &BENCHMARKS {
            assert!(!b.reports.is_empty(), "{} writes no report", b.name);
            assert_eq!(Which::parse(b.name), Some(Which::One(b.name)));
            let one: Vec<&str> = Which::One(b.name)
                .selected()
                .iter()
                .map(|s| s.name)
                .collect();
            assert_eq!(one, [b.name]);
        }
    }

    #[test]
    fn all_runs_the_registry_in_order_with_apiperf_first() {
        let all: Vec<&str> = Which::All.selected().iter().map(|b| b.name).collect();
        let registry: Vec<&str> = BENCHMARKS.iter().map(|b| b.name).collect();
        assert_eq!(all, registry);
        assert_eq!(all[0], "apiperf", "apiperf must see a cold process");
    }

    #[test]
    fn the_published_results_are_all_registered_reports() {
        // docs/bench holds the CSVs of the last full run: each must be one of our reports, shown
        // with its registered title and layout, not as a foreign CSV.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/bench");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|x| x != "csv") {
                continue;
            }
            let report = report::read_csv(&path).unwrap();
            assert_eq!(
                path.file_stem().unwrap().to_str(),
                Some(report.name.as_str())
            );
            let spec = report_spec(&report.name)
                .unwrap_or_else(|| panic!("{} is no registered report", path.display()));
            assert_eq!(report.title(), spec.title);
            assert_eq!(report.layout(), spec.layout);
            seen += 1;
        }
        assert!(seen >= 10, "only {seen} CSVs in {}", dir.display());
    }

    fn parse(line: &str) -> Result<BenchArgs, clap::Error> {
        use clap::Parser;
        let args = std::iter::once("vkgdr").chain(line.split_whitespace());
        match crate::Cli::try_parse_from(args)?.command {
            Some(crate::Command::Bench(b)) => Ok(b),
            other => panic!("{line:?} is not a bench command: {other:?}"),
        }
    }

    #[test]
    fn command_line_parses() {
        let x = RunArgs {
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
        let b = parse("bench compare old new --json").unwrap();
        assert!(b.json());
        assert_eq!(
            b.command,
            BenchCommand::Compare(compare::CompareArgs {
                baseline: PathBuf::from("old"),
                current: PathBuf::from("new"),
                tolerance: compare::DEFAULT_TOLERANCE_PERCENT,
                json: true,
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
            "bench all --tolerance 5",
            "bench all --compare",
            "bench all --compare=",
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

    /// A made-up `copylat` run: two methods at two sizes, the driver's copy the anchor.
    fn made_up_run() -> Vec<Ran> {
        let mut lat = Report::new("copylat", Unit::Nanoseconds);
        for (size, bar, memcpy) in [(8, 150.0, 6000.0), (4096, 450.0, 9000.0)] {
            let s = |m: f64| Stats {
                median: m,
                p10: m * 0.9,
                p90: m * 1.2,
                n: 100,
            };
            lat.rows.push(Row::measured("BAR write", size, &s(bar)));
            lat.rows
                .push(Row::measured("cuMemcpyHtoD", size, &s(memcpy)));
        }
        // A size the anchor lacks: no anchor there.
        lat.rows.push(Row::measured(
            "BAR write",
            1 << 20,
            &Stats::of(&[1e5]).unwrap(),
        ));
        lat.notes.push("made up".into());
        let mut api = Report::new("apiperf", Unit::Nanoseconds);
        api.rows.push(Row::measured(
            "RawMemory alloc",
            64 << 10,
            &Stats::of(&[200_000.0]).unwrap(),
        ));
        api.rows.push(Row::measured(
            "cuMemAlloc",
            64 << 10,
            &Stats::of(&[50_000.0]).unwrap(),
        ));
        api.rows
            .push(Row::reference("C vkgdr alloc (docs)", 64 << 10, 200_000.0));
        vec![
            Ran {
                name: "apiperf",
                seconds: 1.5,
                error: None,
                reports: vec![api],
            },
            Ran {
                name: "copylat",
                seconds: 2.5,
                error: None,
                reports: vec![lat],
            },
            Ran {
                name: "pplat",
                seconds: 0.1,
                error: Some("kernel did not respond: made up".into()),
                reports: Vec::new(),
            },
        ]
    }

    #[test]
    fn the_document_has_every_figure_with_its_unit_and_anchor() {
        let opts = Options {
            out: PathBuf::from("out"),
            quick: true,
        };
        let ran = made_up_run();
        let doc = document(&opts, Some(json::tests::bare_machine()), &ran, None);
        let text = json::to_text(&doc);
        let back: BenchDocument = serde_json::from_str(&text).unwrap();
        assert_eq!(back, doc);
        // Every report reads back into the report it was made from.
        for (r, j) in ran
            .iter()
            .flat_map(|r| &r.reports)
            .zip(back.benchmarks.iter().flat_map(|b| &b.reports))
        {
            assert_eq!(&json::tests::to_report(j).unwrap(), r);
        }

        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["format"], "vkgdr-bench");
        assert_eq!(v["mode"], "quick");
        assert_eq!(v["ok"], false, "pplat failed");
        assert_eq!(
            v["benchmarks"][2]["error"],
            "kernel did not respond: made up"
        );
        assert_eq!(v["machine"]["cuda"]["status"], "driver_missing");
        let lat = &v["benchmarks"][1]["reports"][0];
        assert_eq!(lat["unit"], "ns");
        assert_eq!(lat["higher_is_better"], false);
        assert_eq!(lat["title"], "Write latency, host to GPU memory");
        let f = &lat["figures"][0];
        assert_eq!(
            (&f["method"], &f["size_bytes"], &f["unit"], &f["origin"]),
            (
                &"BAR write".into(),
                &8.into(),
                &"ns".into(),
                &"measured".into()
            )
        );
        assert_eq!(f["anchor"]["method"], "cuMemcpyHtoD");
        assert_eq!(f["anchor"]["report"], "copylat");
        assert_eq!(f["anchor"]["median"], 6000.0);
        assert_eq!(f["anchor"]["ratio"], 0.025);
        // The anchor itself, and a size the anchor was not measured at, stand alone.
        assert!(lat["figures"][1]["anchor"].is_null());
        assert!(lat["figures"][4]["anchor"].is_null());
        let api = &v["benchmarks"][0]["reports"][0]["figures"];
        assert_eq!(api[0]["anchor"]["method"], "cuMemAlloc");
        assert_eq!(api[0]["anchor"]["ratio"], 4.0);
        assert_eq!(api[2]["origin"], "reference");
        assert!(
            api[2]["anchor"].is_null(),
            "reference values are not anchored"
        );
    }

    #[test]
    fn a_run_compares_with_its_own_document() {
        // The document a run writes reads back as a comparison's baseline: each measured figure
        // paired with itself, reference values left out.
        let opts = Options {
            out: PathBuf::from("out"),
            quick: false,
        };
        let doc = document(
            &opts,
            Some(json::tests::bare_machine()),
            &made_up_run(),
            None,
        );
        let text = json::to_text(&doc);
        let path = Path::new("results.json");
        let read = compare::Results::parse(path, &text).unwrap();
        assert_eq!(read, compare::Results::of(&doc, path).unwrap());
        assert_eq!(read.mode.as_deref(), Some("full"));
        assert_eq!(read.benchmarks.len(), 3);
        let base = compare::Baseline::File(compare::Loaded {
            path: path.into(),
            results: read.clone(),
        });
        let c = compare::Comparison::new(&base, &read, path, 10);
        let d = &c.doc;
        // 5 measured copylat figures and 2 apiperf ones; the quoted C figure is not compared.
        assert_eq!(d.summary.compared, 7);
        assert_eq!(d.summary.within_noise, 7);
        assert!(d.figures.iter().all(|f| f.ratio == Some(1.0)));
        assert!(!d.figures.iter().any(|f| f.method.contains("docs")));
        // The machine without drivers names no GPU: shown, not judged.
        assert_eq!(d.gpu_match, "unknown_gpu");
        assert!(!d.regressed);
        assert_eq!(d.current.failed_benchmarks, ["pplat"]);
        // The comparison document reads back too.
        let back: compare::ComparisonDocument =
            serde_json::from_str(&json::to_text(&c.doc)).unwrap();
        assert_eq!(&back, d);
    }

    #[test]
    fn anchors_name_methods_the_benchmarks_measure() {
        // Every anchor pattern matches a method of the published results (where the report is
        // among them), so no figure loses its anchor to a typo.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/bench");
        let mut checked = 0;
        for spec in BENCHMARKS.iter().flat_map(|b| b.reports) {
            let path = dir.join(format!("{}.csv", spec.name));
            let Ok(report) = report::read_csv(&path) else {
                continue;
            };
            let methods = report.methods();
            let patterns: Vec<&str> = match spec.anchor {
                Anchor::None | Anchor::SameMethodIn(_) => continue,
                Anchor::Method(m) => vec![m],
                Anchor::Pairs(p) => p.iter().flat_map(|&(a, b)| [a, b]).collect(),
            };
            for p in patterns {
                assert!(
                    methods.iter().any(|m| report::method_matches(p, m)),
                    "{}: no method matches {p:?} (methods: {methods:?})",
                    spec.name
                );
            }
            checked += 1;
        }
        assert!(checked >= 10, "only {checked} reports checked");
    }

    #[test]
    fn anchor_rules() {
        let pairs = Anchor::Pairs(&[("a", "b"), ("* end", "c")]);
        assert_eq!(pairs.of("r", "a"), Some(("r", "b")));
        assert_eq!(pairs.of("r", "16 at the end"), Some(("r", "c")));
        assert_eq!(pairs.of("r", "b"), None);
        let method = Anchor::Method("base");
        assert_eq!(method.of("r", "x"), Some(("r", "base")));
        assert_eq!(method.of("r", "base"), None);
        let same = Anchor::SameMethodIn("idle");
        assert_eq!(same.of("busy", "call"), Some(("idle", "call")));
        assert_eq!(same.of("idle", "call"), None);
        assert_eq!(Anchor::None.of("r", "x"), None);
    }
}
