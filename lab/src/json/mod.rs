//! The JSON documents `--json` prints: one per command, each a single object on stdout.
//!
//! Every document opens with `format` (`vkgdr-info`, `vkgdr-bench`, `vkgdr-soak`), `format_version`
//! ([`FORMAT_VERSION`](document::FORMAT_VERSION)) and `vkgdr_version`, and holds the `machine` it
//! ran on: the CPU, the Vulkan and CUDA devices with their BAR figures, NVML and the diagnosis
//! `vkgdr info` prints. Sizes are bytes and their fields end in `_bytes`; a benchmark figure
//! carries its unit (`ns` per operation or `GB/s`, 10⁹ bytes per second) and the anchor it is
//! compared with, measured in the same run. Where something could not be found out, the field says
//! why (`error`) instead of the document failing: `vkgdr info --json` on a machine without a GPU is
//! a valid document.
//!
//! The types deserialize as well as serialize, so a later run can read an earlier one back.
//!
//! - [`document`]: what every document opens with, and its text;
//! - [`machine`]: the machine, and `vkgdr info --json`;
//! - [`bench`](mod@bench): `vkgdr bench --json` and `results.json`;
//! - [`soak`]: `vkgdr soak --json`.

pub mod bench;
pub mod document;
pub mod machine;
pub mod soak;
