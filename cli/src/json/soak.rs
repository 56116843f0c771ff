//! `vkgdr soak --json` ([`SoakDocument`]): the options, the figures before and after, the
//! counters and the verdict.

use serde::{Deserialize, Serialize};

use super::document::About;
use super::machine::MachineJson;

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
    /// What kept the soak from running or finishing (no GPU, a driver call that failed).
    pub error: Option<String>,
    /// The GPU's name.
    pub gpu: Option<String>,
    /// How long the measured part ran (after the warm-up).
    pub seconds: f64,
    /// The figures after the warm-up.
    pub before: Option<SoakFiguresJson>,
    /// The figures at the end.
    pub after: Option<SoakFiguresJson>,
    /// Each figure that must come back: before, after, change.
    pub checks: Vec<SoakCheckJson>,
    /// What the workers did.
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

/// One figure that must come back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SoakCheckJson {
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
    /// Whether it came back (`change` is 0).
    pub came_back: bool,
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
    /// Errors (wrong data, unexpected failures) in the measured part.
    pub errors: u64,
    /// Errors during the warm-up.
    pub warm_up_errors: u64,
}
