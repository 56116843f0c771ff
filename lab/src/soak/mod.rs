//! `vkgdr soak [--device N|UUID | --devices all|LIST] [--seconds N] [--threads N]
//! [--exhaust-every S] [--d2h] [--xproc [--xproc-producers N] [--kill-every S]] [--json]`: everything at
//! once for a long time, then proof that nothing of ours stayed behind (no leaked fds, BAR space,
//! VRAM or cached objects).
//!
//! On CUDA device 0, the device `--device` names, or every device `--devices` names at once in
//! this process (each with workers, figures and checks of its own, one verdict for all), for
//! `--seconds` (default 600), side by side on each device:
//! - **pool churn**: `--threads` threads (default 8) allocate, fill, verify and free blocks of
//!   1 B to 16 MiB (shared, thread-cached and dedicated) in one pool;
//! - **rings**: a 4-lane ring consumed by the checking kernel `ring_check_lanes` (every record
//!   verified on the GPU), fed by 4 producer threads with batches of sealed records; made with
//!   the default options, so lanes 1 and 2 stage a batch's records of 1 KiB and more for the
//!   copy engine once 64 KiB are pending (the BAR's publications after a staged one among them);
//! - **device → host rings** (`--d2h`, off by default; [`d2h`]): rounds of kernels publishing test records (per thread
//!   into 64 B slots, per warp into 4 KiB slots) into 1 to 4 lanes, each lane's CPU consumer
//!   checking every record's sequence, its producer's order and every byte, and every producer's
//!   count;
//! - **device-side releases** (with `--d2h`): rounds of up to 256 pool blocks lent with
//!   `release_many_on_device`, blocks allocated beside them that must not overlap any, a kernel
//!   that releases the tokens (every third round with the previous round's spent tokens and a
//!   forged one), then every block back with its token redeemed once and each hostile token
//!   refused;
//! - **arena**: a CUDA VMM arena grown and shrunk at random, each new chunk written and read back,
//!   mirrored now and then;
//! - **raw allocations**: one thread allocates, writes, reads back and frees raw memory of 4 KiB
//!   to 4 MiB (carved from shared granules and mapped on their own), freeing it by drop,
//!   `release_now` and `release_after(stream)` in turn;
//! - **BAR exhaustion**: every `--exhaust-every` seconds (default 30) raw 1 GiB allocations until
//!   the BAR refuses one, held for a second, then freed; the other workers meet
//!   `OutOfDeviceMemory` meanwhile and must carry on.
//!
//! - **producer processes** (`--xproc`, off by default): a second ring, shared through
//!   `vkgdr::share`, fed by `--xproc-producers` processes (default 4) of sealed records, one of
//!   which is killed with SIGKILL every `--kill-every` seconds (default 3) and replaced
//!   ([`xproc`]): its checking kernel must have checked exactly the records accepted, with no
//!   error, and the owner must have refused no tail.
//!
//! The ring's checking kernel runs from the first second to the last: every free of every other
//! worker happens while a kernel runs.
//!
//! Before (after a warm-up that lets the driver set up what it keeps for the process) and after, it
//! takes this process's open fds and, of each device, BAR1 used (NVML), free VRAM
//! (`cuMemGetInfo`), NVML's processes on it with their memory and the library's own holdings
//! ([`vkgdr::Retained`], printed by name and size). It prints them, a status line every 30 s and
//! the totals, and judges each device ([`verdict`]: what of the change is ours, other processes'
//! or the driver's): it fails (exit 1) when something of ours stayed behind (fds, an item of the
//! library's holdings, this process's memory per NVML), growth cannot be told from ours, a check
//! found wrong data, or a worker failed; another process coming or going is reported by pid. On a
//! terminal a progress line per device shows the elapsed time and the counters between the status
//! lines; `--json` prints the figures, the classification, the counters and the verdict as one
//! document ([`SoakDocument`](crate::json::soak::SoakDocument)).
//!
//! The parts: [`command_line`] (the options), [`run`] (the soak), [`workers`] (what runs side by
//! side), [`d2h`] (the device → host workers), [`xproc`] (the producer processes), [`counters`] (what they did), [`figures`] (what is taken before and after),
//! [`verdict`] (whose a change is) and [`document`](mod@document) (the JSON document).

pub mod command_line;
pub mod counters;
pub mod d2h;
pub mod document;
pub mod figures;
pub mod run;
pub mod verdict;
pub mod workers;
pub mod xproc;

use std::process::ExitCode;

use crate::json::document::to_text;
use crate::json::machine::MachineJson;
use crate::ui::{self, alert};
use command_line::{Options, SoakArgs};
use document::{document, Record};

/// `vkgdr soak ...`.
pub fn main(args: &SoakArgs) -> ExitCode {
    let options = Options::from(args);
    let mut record = Record::default();
    let outcome = run::run(&options, &mut record);
    let passed = matches!(outcome, Ok(true));
    let error = match &outcome {
        Err(e) => {
            alert!("SOAK FAILED: {e}");
            Some(e.to_string())
        }
        Ok(_) => None,
    };
    if args.json {
        let doc = document(&options, &record, passed, error, MachineJson::probe());
        ui::document(&to_text(&doc));
    }
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
