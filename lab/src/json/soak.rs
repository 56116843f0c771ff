//! `vkgdr soak --json` ([`SoakDocument`]): the options, per device the figures before and after
//! with what ours, other processes and the driver account for, the counters and the verdict.

use serde::{Deserialize, Serialize};

use super::document::About;
use super::machine::{DeviceJson, MachineJson};

/// `vkgdr soak --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SoakDocument {
    /// `format: "vkgdr-soak"`.
    #[serde(flatten)]
    pub about: About,
    /// What was asked for.
    pub options: SoakOptionsJson,
    /// Whether the soak passed: every figure came back, no check found wrong data, no worker
    /// failed (what exit code 0 says).
    pub passed: bool,
    /// What kept the soak from running or finishing (no GPU, a device named that is not here, a
    /// driver call that failed).
    pub error: Option<String>,
    /// The first device's name (the one device of a soak of one).
    pub gpu: Option<String>,
    /// How long the measured part ran (after the warm-up).
    pub seconds: f64,
    /// The process's fds and the first device's figures after the warm-up (`devices` has
    /// each device's).
    pub before: Option<SoakFiguresJson>,
    /// The same at the end.
    pub after: Option<SoakFiguresJson>,
    /// Each figure held before against after: the process's fds (`device` null), then each
    /// device's BAR1 used and free VRAM.
    pub checks: Vec<SoakCheckJson>,
    /// Each device soaked: its figures before and after, what ours, other processes and the
    /// driver account for, its counters and its verdict.
    #[serde(default)]
    pub devices: Vec<SoakDeviceJson>,
    /// What the workers of every device did, added up.
    pub counters: SoakCountersJson,
    /// The errors the workers met (wrong data, unexpected failures), the first 100.
    pub errors: Vec<String>,
    /// The machine, looked at after the soak.
    pub machine: MachineJson,
}

/// `vkgdr soak`'s options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SoakOptionsJson {
    /// `--seconds`.
    pub seconds: u64,
    /// `--threads`.
    pub threads: usize,
    /// `--exhaust-every`, in seconds.
    pub exhaust_every_seconds: u64,
    /// `--devices` (or `--device`) as given: `all`, or ordinals and UUIDs (`0` by default).
    #[serde(default)]
    pub devices: String,
    /// `--xproc`: producer processes per device (`null`: no producer processes).
    #[serde(default)]
    pub xproc_producers: Option<u32>,
    /// `--kill-every`, in seconds (`null` without `--xproc`).
    #[serde(default)]
    pub kill_every_seconds: Option<u64>,
    /// `--d2h`: the device → host workers ran.
    #[serde(default)]
    pub d2h: bool,
}

/// The figures the soak takes before and after.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SoakFiguresJson {
    /// This process's open file descriptors.
    pub open_fds: u64,
    /// NVML's BAR1 used (`null`: no NVML).
    pub bar1_used_bytes: Option<u64>,
    /// Free device memory (`cuMemGetInfo`).
    pub vram_free_bytes: u64,
}

/// One figure held before against after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SoakCheckJson {
    /// The CUDA ordinal of the device it is a figure of (`null`: the process's, `open_fds`).
    #[serde(default)]
    pub device: Option<i32>,
    /// `open_fds`, `bar1_used` or `vram_free`.
    pub figure: String,
    /// `fds` or `bytes`.
    pub unit: String,
    /// Before (`null`: not known).
    pub before: Option<u64>,
    /// After.
    pub after: Option<u64>,
    /// After minus before (0 when either is unknown).
    pub change: i64,
    /// Whether the use it measures came back to its start or below (fds and BAR1 used at or
    /// below, free VRAM at or above). A device-wide figure that did not is not a failure by
    /// itself: the device's `classification` says whose the growth is.
    pub came_back: bool,
}

/// One device of a soak.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SoakDeviceJson {
    /// Which device: CUDA ordinal, UUID, name.
    pub device: DeviceJson,
    /// Whether nothing of ours stayed behind on it and its workers met no error.
    pub passed: bool,
    /// The smallest device memory the library maps on it (a VMM granule, or a 4 KiB page
    /// without VMM): growth below it with nothing of ours grown is the driver's.
    pub granule_bytes: u64,
    /// Its figures after the warm-up.
    pub before: Option<SoakDeviceFiguresJson>,
    /// Its figures at the end.
    pub after: Option<SoakDeviceFiguresJson>,
    /// What ours, other processes and the driver account for (`null`: the soak did not get to
    /// the end).
    pub classification: Option<ClassificationJson>,
    /// Why it failed (empty: it passed): what of ours stayed, growth nothing accounts for, the
    /// workers' errors.
    pub failures: Vec<String>,
    /// What its workers did.
    pub counters: SoakCountersJson,
}

/// One device's figures at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SoakDeviceFiguresJson {
    /// NVML's BAR1 used, every process's (`null`: no NVML).
    pub bar1_used_bytes: Option<u64>,
    /// Free device memory (`cuMemGetInfo`).
    pub vram_free_bytes: u64,
    /// NVML's processes on the device, compute and graphics merged (`null`: see
    /// `processes_error`).
    pub processes: Option<Vec<ProcessJson>>,
    /// Why there is no process list.
    pub processes_error: Option<String>,
    /// What the library holds for the device, item by item (`vkgdr::Retained`).
    pub retained: Vec<RetainedJson>,
    /// Event fences the device's releases made since it was opened.
    pub event_fences_made: u64,
    /// The most of them alive at once since it was opened.
    pub event_fences_peak: u64,
    /// The longest a release of the device's memory waited in the release queue for the GPU
    /// work queued before it (`vkgdr::ReleaseTimes`; `null`: none waited).
    #[serde(default)]
    pub longest_release_wait: Option<SlowReleaseJson>,
    /// The longest a release whose GPU work was done waited for its turn to be dropped.
    #[serde(default)]
    pub longest_release_turn: Option<SlowReleaseJson>,
    /// The longest the drop of a released value took once its work was done.
    #[serde(default)]
    pub longest_release_drop: Option<SlowReleaseJson>,
}

/// One release and how long it took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlowReleaseJson {
    /// Microseconds.
    pub micros: u64,
    /// What it released: the value's Rust type without module paths.
    pub what: String,
}

/// A process NVML lists on a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessJson {
    /// The host's pid.
    pub pid: u32,
    /// Its device memory (`null`: NVML cannot tell).
    pub used_bytes: Option<u64>,
    /// A compute (CUDA) process.
    pub compute: bool,
    /// A graphics (Vulkan) process.
    pub graphics: bool,
}

/// One item the library holds for a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetainedJson {
    /// Its name (`raw allocations`, `carved granules`, ...).
    pub name: String,
    /// How it shows in the device's figures: `bar` (VRAM once, BAR1 twice), `host` (neither),
    /// `driver_objects`, `releases`.
    pub kind: String,
    /// How many.
    pub count: u64,
    /// How many bytes.
    pub bytes: u64,
}

/// Whose the change of a device's figures is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassificationJson {
    /// Whether BAR1 used and the VRAM in use are at or below their start.
    pub came_back: bool,
    /// BAR1 used, after minus before (`null`: no NVML).
    pub bar1_used_change_bytes: Option<i64>,
    /// VRAM in use, after minus before.
    pub vram_used_change_bytes: i64,
    /// The library's items that hold more than at the start (each one a failure).
    pub ours_grown: Vec<RetainedChangeJson>,
    /// This process's device memory per NVML, after minus before (`null`: no per-process
    /// figures, see `per_process_error`).
    pub ours_nvml_change_bytes: Option<i64>,
    /// Why there are no per-process figures (no NVML; a container, whose PID namespace hides
    /// this process from NVML's list).
    pub per_process_error: Option<String>,
    /// Other processes that came, went or changed.
    pub other_processes: Vec<ProcessChangeJson>,
    /// The device-wide growth left after other processes' (`null`: none).
    pub residual: Option<ResidualJson>,
    /// Event fences made during the run (releases without a completion word).
    pub event_fences_made: u64,
    /// The most event fences alive at once by the end of the warm-up, and by the end: a new
    /// peak late in the run is where a driver's pool of events would grow.
    pub event_fences_peak_before: u64,
    /// See `event_fences_peak_before`.
    pub event_fences_peak_after: u64,
    /// The same, as the text says it.
    pub lines: Vec<String>,
}

/// An item of the library's that grew.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetainedChangeJson {
    /// Its name.
    pub name: String,
    /// How many before.
    pub count_before: u64,
    /// How many after.
    pub count_after: u64,
    /// Bytes before.
    pub bytes_before: u64,
    /// Bytes after.
    pub bytes_after: u64,
}

/// Another process whose device memory changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessChangeJson {
    /// Its pid (the host's numbering).
    pub pid: u32,
    /// Its device memory before (`null`: not listed then, it came; a listed process whose memory
    /// NVML cannot tell counts 0).
    pub before_bytes: Option<u64>,
    /// After (`null`: not listed any more, it went).
    pub after_bytes: Option<u64>,
    /// After minus before, a process not listed counting 0.
    pub change_bytes: i64,
}

/// Growth left after other processes'.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResidualJson {
    /// Whose it is.
    pub whose: Whose,
    /// BAR1 used, in bytes.
    pub bar1_bytes: u64,
    /// VRAM in use, in bytes.
    pub vram_bytes: u64,
}

/// Whose the device-wide growth left after other processes' is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Whose {
    /// `ours`: something of ours grew too (already a failure).
    Ours,
    /// `driver`: the driver's own, below a granule while nothing of ours grew.
    Driver,
    /// `unattributed`: at least a granule, but NVML says this process did not grow: a process
    /// NVML does not list, or the driver.
    Unattributed,
    /// `unexplained`: at least a granule, with no per-process figures to tell it from ours: a
    /// failure.
    Unexplained,
}

/// What the soak's workers did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SoakCountersJson {
    /// Pool allocations and frees.
    pub pool_ops: u64,
    /// Pool allocations refused for lack of memory.
    pub pool_out_of_memory: u64,
    /// Ring records produced (each checked by the kernel).
    pub ring_records: u64,
    /// Ring pushes that timed out waiting for space.
    pub ring_full_waits: u64,
    /// Arena grow/shrink cycles.
    pub arena_cycles: u64,
    /// Arena growths refused for lack of memory.
    pub arena_out_of_memory: u64,
    /// Raw allocations made, checked and freed.
    pub raw_allocations: u64,
    /// Raw allocations refused for lack of memory.
    pub raw_out_of_memory: u64,
    /// BAR exhaustions.
    pub bar_exhaustions: u64,
    /// The most bytes raw allocations held when the BAR refused the next one.
    pub most_held_at_exhaustion_bytes: u64,
    /// Which driver call refused each exhaustion's last allocation, and how often
    /// (`vkAllocateMemory`, `cuMemImportFromShareableHandle`, `cuMemMap`, ...).
    #[serde(default)]
    pub exhaustions_refused_by: std::collections::BTreeMap<String, u64>,
    /// What refused each arena growth counted in `arena_out_of_memory`, and how often: the
    /// driver call (`vkAllocateMemory`, `cuMemMap`, ...) or `Arena::grow` (a slot whose previous
    /// chunk is still being released).
    #[serde(default)]
    pub arena_refused_by: std::collections::BTreeMap<String, u64>,
    /// Device → host records (kernels to CPU consumers) checked, every byte.
    #[serde(default)]
    pub d2h_records_checked: u64,
    /// Pool blocks kernels released with their tokens, each back once.
    #[serde(default)]
    pub device_releases: u64,
    /// Spent and forged release tokens kernels sent, each refused (freeing nothing).
    #[serde(default)]
    pub hostile_tokens_refused: u64,
    /// With `--xproc`: producer processes started (the killed ones' successors included).
    #[serde(default)]
    pub xproc_producers_started: u64,
    /// With `--xproc`: producer processes killed with SIGKILL.
    #[serde(default)]
    pub xproc_producers_killed: u64,
    /// With `--xproc`: records the owner accepted from them (the producers' reports).
    #[serde(default)]
    pub xproc_records_accepted: u64,
    /// With `--xproc`: records the shared ring's checking kernel checked (equal to those
    /// accepted when the soak passes).
    #[serde(default)]
    pub xproc_records_checked: u64,
    /// With `--xproc`: tails a producer published that the owner refused.
    #[serde(default)]
    pub xproc_lane_faults: u64,
    /// Errors (wrong data, unexpected failures) in the measured part.
    pub errors: u64,
    /// Errors during the warm-up.
    pub warm_up_errors: u64,
}
