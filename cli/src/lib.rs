//! `vkgdr`: the command-line tool (options parsed by clap; `vkgdr help` and `--help` on every
//! command tell the rest).
//!
//! - `vkgdr info [--check] [--device N|UUID | --devices all|LIST] [--json]` shows what the
//!   library sees on this machine (Vulkan and CUDA devices, BAR figures, NVML) and diagnoses what
//!   keeps it from working, naming the fix. With `--check` it exits 1 when a problem keeps vkgdr
//!   from opening a device checked (every CUDA device, or those named); without, a report that
//!   could be printed is a success.
//! - `vkgdr bench BENCHMARK [--device N|UUID] [--out DIR] [--quick] [--json]` measures copies,
//!   latencies and API costs on one GPU (CUDA device 0 by default) and writes tables, CSVs, PNG
//!   charts and `results.json` (see [`vkgdr_lab::bench`]); `vkgdr bench plot DIR` redraws the
//!   charts from `DIR/results.json`.
//! - `vkgdr soak [--device N|UUID | --devices all|LIST] [--seconds N] [--threads N]
//!   [--exhaust-every S] [--json]` runs pool churn, rings, arena grow/shrink and BAR exhaustion
//!   together on each device named (10 minutes by default) and checks that nothing of ours stayed
//!   behind (see [`vkgdr_lab::soak`]).
//! - `vkgdr completions SHELL` prints a completion script.
//! - `vkgdr bench-child ROLE ...` (hidden) is this program as a child process of
//!   `vkgdr bench xproc` and `vkgdr soak --xproc` (see [`vkgdr_lab::child`]).
//!
//! `--json` prints one document on stdout ([`vkgdr_lab::json`]); progress is drawn on a terminal
//! only and never under `--quiet` ([`vkgdr_lab::ui`]).
//!
//! The measurements and stress runs behind `bench` and `soak`, with their reports, are the lab's
//! (`lab/`, the crate [`vkgdr_lab`]); this crate holds the command line, its dispatch and `info`.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use vkgdr::diagnose::{diagnose, CudaProbe, Finding, Machine, NvmlProbe, Severity, VulkanProbe};
use vkgdr::vulkan::{self, MemoryOptions, PhysicalDeviceInfo};
use vkgdr_lab::json::document::{to_text, About};
use vkgdr_lab::json::machine::{
    finding_ordinal, memory_flag_names, CheckedJson, InfoDocument, MachineJson,
};
use vkgdr_lab::ui::{alert, say};
use vkgdr_lab::{bench, child, device, soak, ui};

/// CPU access to NVIDIA GPU memory through a BAR mapping: what this machine offers (`info`), how
/// fast it is (`bench`) and whether it holds up (`soak`).
#[derive(Debug, Parser)]
#[command(
    name = "vkgdr",
    version,
    propagate_version = true,
    max_term_width = 100,
    after_help = "Without a command, `vkgdr` runs `vkgdr info`."
)]
pub struct Cli {
    /// What to do (`info` when none is given)
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Show no progress and no status lines: results and errors only
    #[arg(short, long, global = true)]
    pub quiet: bool,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show what vkgdr sees here and diagnose what keeps it from working
    ///
    /// Lists the Vulkan and CUDA devices, their BAR figures (NVML's BAR1, VRAM in use, an estimate
    /// of what this process can still map) and NVML, then names each problem found with its fix.
    Info(InfoArgs),
    /// Measure copies, latencies, API costs and rings on one GPU (--device, 0 by default)
    ///
    /// Each benchmark prints its tables and writes a CSV and a PNG chart per table into the output
    /// directory, with results.json: the device measured (ordinal, UUID, name), every figure with
    /// its unit and the anchor it is compared with, measured in the same run.
    Bench(bench::command_line::BenchArgs),
    /// Run everything at once for a long time, then check that nothing stayed behind
    ///
    /// Pool churn from many threads, a ring fed by four producers into its checking kernel, an
    /// arena grown and shrunk, raw allocations freed every way, and the BAR exhausted now and then,
    /// on each device named (--device, --devices; CUDA device 0 by default), all at once in this
    /// process. Open fds, the library's own holdings and this process's device memory must come
    /// back to their values after the warm-up; what other processes and the driver did meanwhile
    /// is reported, not failed on.
    Soak(soak::command_line::SoakArgs),
    /// Print a completion script for a shell
    ///
    /// Install it where the shell looks for it, for example:
    ///   vkgdr completions bash > ~/.local/share/bash-completion/completions/vkgdr
    ///   vkgdr completions zsh > ~/.zfunc/_vkgdr
    ///   vkgdr completions fish > ~/.config/fish/completions/vkgdr.fish
    #[command(display_name = "vkgdr", verbatim_doc_comment)]
    Completions {
        /// The shell to complete in
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// A child process of `bench xproc` and `soak --xproc` (not a user command)
    #[command(hide = true, name = "bench-child", display_name = "vkgdr")]
    BenchChild(child::ChildArgs),
}

/// Exit codes, for `--help`.
const INFO_EXIT_CODES: &str = "\
Exit status:
  0  vkgdr can open every CUDA device checked; without --check, also any report that was printed
  1  with --check: a problem keeps vkgdr from opening a device checked (an `error:` finding of the
     machine or of that device); --device/--devices named a device that is not here
  2  the command line is wrong";

/// `vkgdr info`'s options.
#[derive(Debug, Default, clap::Args)]
#[command(display_name = "vkgdr", after_help = INFO_EXIT_CODES)]
pub struct InfoArgs {
    /// Exit 1 when a problem keeps vkgdr from opening a device checked (for scripts): every CUDA
    /// device here, or those --device/--devices name
    #[arg(long)]
    pub check: bool,

    /// Check and list only this device: a CUDA ordinal or a GPU UUID (GPU-..., as `nvidia-smi -L`
    /// prints it; the prefix may be left out)
    #[arg(long, value_name = "N|UUID", conflicts_with = "devices")]
    pub device: Option<device::DeviceArg>,

    /// Check and list these devices: `all` (what info does without it) or a list of ordinals
    /// and UUIDs such as 0,2
    #[arg(long, value_name = "all|LIST")]
    pub devices: Option<device::Devices>,

    /// Print one JSON document on stdout (devices, BAR figures, diagnosis) instead of the report
    #[arg(long)]
    pub json: bool,
}

/// The `vkgdr` program: its command line parsed and run; the exit code.
pub fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    // `fastpath` runs this program as a child to time a process's first write; not a user command.
    if (3..=4).contains(&args.len()) && args[1] == "bench" && args[2] == bench::fastpath::CHILD_ARG
    {
        return bench::first_write_child(args.get(3).map(OsString::as_os_str));
    }
    let cli = Cli::parse_from(args);
    if let Some(Command::BenchChild(a)) = &cli.command {
        // Its stdout is the protocol: no progress, no status lines.
        ui::init(ui::Settings {
            json: false,
            quiet: true,
        });
        return child::main(a);
    }
    let json = match &cli.command {
        None | Some(Command::Completions { .. }) | Some(Command::BenchChild(_)) => false,
        Some(Command::Info(a)) => a.json,
        Some(Command::Bench(a)) => a.json(),
        Some(Command::Soak(a)) => a.json,
    };
    ui::init(ui::Settings {
        json,
        quiet: cli.quiet,
    });
    match cli.command {
        None => info(&InfoArgs::default()),
        Some(Command::Info(a)) => info(&a),
        Some(Command::Bench(a)) => bench::main(&a),
        Some(Command::Soak(a)) => soak::main(&a),
        Some(Command::BenchChild(a)) => child::main(&a),
        Some(Command::Completions { shell }) => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "vkgdr", &mut script);
            ui::document(&String::from_utf8_lossy(&script));
            ExitCode::SUCCESS
        }
    }
}

fn flags(f: ash::vk::MemoryPropertyFlags) -> String {
    memory_flag_names(f).join("|")
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

fn print_vulkan(devs: &[PhysicalDeviceInfo]) {
    for d in devs {
        say!(
            "  [{}] {} ({:?}), Vulkan {}",
            d.index,
            d.name,
            d.device_type,
            d.api_version
        );
        say!("      uuid {}", d.uuid_string());
        say!("      driver {}", d.driver);
        say!(
            "      nonCoherentAtomSize {}, maxMemoryAllocationSize {}, VK_KHR_external_memory_fd: {}",
            d.non_coherent_atom_size,
            gib(d.max_allocation_size),
            if d.has_external_memory_fd { "yes" } else { "NO" }
        );
        for (i, h) in d.memory_heaps.iter().enumerate() {
            say!("      heap {i}: {} {:?}", gib(h.size), h.flags);
        }
        for t in &d.memory_types {
            say!("      type {}: heap {} {}", t.index, t.heap, flags(t.flags));
        }
        match d.choose_memory_type(MemoryOptions::default()) {
            Ok(t) if d.has_external_memory_fd => say!(
                "      -> vkgdr uses memory type {} ({})",
                t.index,
                if t.is_coherent() {
                    "coherent"
                } else {
                    "non-coherent: flushes issued"
                }
            ),
            Ok(_) => say!("      -> unusable: VK_KHR_external_memory_fd missing"),
            Err(e) => say!("      -> unusable: {e}"),
        }
    }
}

/// The CUDA ordinals `info` checks: those `--device`/`--devices` name, or every device the probe
/// found. `Err`: a device named is not here (the message lists those that are).
fn checked_devices(args: &InfoArgs, machine: &Machine) -> Result<Vec<i32>, String> {
    let present: Vec<device::Present> = machine
        .cuda_devices()
        .iter()
        .map(|d| device::Present {
            ordinal: d.ordinal,
            uuid: d.uuid,
            name: d.name.clone(),
        })
        .collect();
    let wanted = match (&args.device, &args.devices) {
        (Some(d), _) => device::Devices::one(*d),
        // Every device there is, none included: what info does by default.
        (None, Some(device::Devices::All)) | (None, None) => {
            return Ok(present.iter().map(|p| p.ordinal).collect())
        }
        (None, Some(d)) => d.clone(),
    };
    device::resolve(&wanted, &present)
        .map(|chosen| chosen.iter().map(|p| p.ordinal).collect())
        .map_err(|e| match &machine.cuda {
            CudaProbe::DriverMissing(why) | CudaProbe::Failed(why) => format!("{e} (CUDA: {why})"),
            CudaProbe::Devices { .. } => e,
        })
}

/// Whether a finding counts for `devices`: the machine's, or one of theirs.
fn concerns(f: &Finding, devices: &[i32]) -> bool {
    finding_ordinal(f).is_none_or(|o| devices.contains(&o))
}

/// `vkgdr info`: what the library sees, then the diagnosis (or both as JSON), for every CUDA
/// device or those `--device`/`--devices` name. With `--check`, exits 1 when a problem keeps
/// vkgdr from opening a device checked (an error finding of the machine or of the device); a
/// device named that is not here is exit 1 too.
fn info(args: &InfoArgs) -> ExitCode {
    let check = args.check;
    let machine = Machine::probe();
    let checked = checked_devices(args, &machine);
    let findings = diagnose(&machine);
    let errors = |devices: &[i32]| {
        findings
            .iter()
            .filter(|f| f.severity == Severity::Error && concerns(f, devices))
            .count()
    };
    if args.json {
        let (checked_json, error) = match &checked {
            Ok(devices) => (
                Some(CheckedJson {
                    devices: devices.clone(),
                    usable: errors(devices) == 0,
                }),
                None,
            ),
            Err(e) => (None, Some(e.clone())),
        };
        let usable = checked_json.as_ref().is_some_and(|c| c.usable);
        ui::document(&to_text(&InfoDocument {
            about: About::new("vkgdr-info"),
            machine: MachineJson::from_machine(&machine),
            checked: checked_json,
            error,
        }));
        return match &checked {
            Err(e) => {
                alert!("vkgdr info: {e}");
                ExitCode::FAILURE
            }
            Ok(_) if usable || !check => ExitCode::SUCCESS,
            Ok(_) => ExitCode::FAILURE,
        };
    }
    let devices = match checked {
        Ok(d) => d,
        Err(e) => {
            alert!("vkgdr info: {e}");
            return ExitCode::FAILURE;
        }
    };
    say!("vkgdr {}", env!("CARGO_PKG_VERSION"));
    say!("CPU copy routines: {}", vkgdr::copy::simd_level());
    say!("Pool thread caches: {}", vkgdr::pool::magazine::handshake());
    say!("Vulkan:");
    match &machine.vulkan {
        VulkanProbe::Devices(d) if d.is_empty() => say!("  no Vulkan physical devices"),
        VulkanProbe::Devices(d) => print_vulkan(d),
        VulkanProbe::LoaderMissing(why) | VulkanProbe::NoDriver(why) | VulkanProbe::Failed(why) => {
            say!("  not available: {why}")
        }
    }
    say!("CUDA:");
    print_cuda(&machine, &devices);
    say!("NVML:");
    match &machine.nvml {
        NvmlProbe::Devices {
            driver_version,
            devices,
        } => say!("  driver {driver_version}, {} device(s)", devices.len()),
        NvmlProbe::Unavailable(why) => say!("  not available: {why}"),
    }
    say!("Diagnosis:");
    for f in findings.iter().filter(|f| concerns(f, &devices)) {
        say!("  {}", f.to_string().replace('\n', "\n  "));
    }
    let all = machine.cuda_devices().len();
    if errors(&devices) == 0 {
        if devices.len() == all {
            say!("  ok: vkgdr can open every CUDA device here ({all})");
        } else {
            say!(
                "  ok: vkgdr can open every CUDA device checked ({} of {all})",
                devices.len()
            );
        }
        ExitCode::SUCCESS
    } else if check {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The CUDA side: the driver, then each device of `only` with its Vulkan twin, VMM and BAR
/// figures.
fn print_cuda(machine: &Machine, only: &[i32]) {
    let devices = match &machine.cuda {
        CudaProbe::DriverMissing(why) | CudaProbe::Failed(why) => {
            say!("  not available: {why}");
            return;
        }
        CudaProbe::Devices { version, devices } => {
            say!(
                "  driver CUDA version {}.{}, {} device(s)",
                version / 1000,
                (version % 1000) / 10,
                devices.len()
            );
            devices
        }
    };
    if only.len() < devices.len() {
        let listed: Vec<String> = only.iter().map(i32::to_string).collect();
        say!("  checking {} only (--device/--devices)", listed.join(", "));
    }
    for d in devices.iter().filter(|d| only.contains(&d.ordinal)) {
        let pci = d.pci.map(|p| format!(", PCI {p}")).unwrap_or_default();
        say!(
            "  [{}] {}, {} total, uuid {}{pci}",
            d.ordinal,
            d.name,
            gib(d.total_mem),
            vulkan::format_uuid(&d.uuid)
        );
        match machine.vulkan_twin(d) {
            Some(v) => {
                say!("      matches Vulkan device [{}] {}", v.index, v.name);
                if let Ok(t) = v.choose_memory_type(Default::default()) {
                    let spares = vkgdr::SpareLimits::for_heap(v.heap_size(t));
                    say!(
                        "      freed raw allocations of up to {} MiB keep their mapping for the \
                         next of their size ({} MiB in all; OpenOptions::spare_limits)",
                        spares.each >> 20,
                        spares.total >> 20
                    );
                }
            }
            None => say!("      no Vulkan device with this UUID: vkgdr cannot open it"),
        }
        let yes = |b: bool| if b { "yes" } else { "no" };
        say!(
            "      VMM: {}, POSIX fd handles: {}, granularity: {}",
            yes(d.vmm),
            yes(d.posix_fd),
            match &d.granularity {
                Ok(g) => format!("{} KiB", g >> 10),
                Err(e) => format!("unknown ({e})"),
            }
        );
        match &d.bar {
            Ok(bar) => {
                for line in bar.to_string().lines() {
                    say!("      {line}");
                }
            }
            Err(e) => say!("      BAR figures unavailable: {e}"),
        }
    }
}
