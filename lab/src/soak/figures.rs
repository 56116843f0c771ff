//! The figures a soak takes before and after: of each device a [`Snapshot`] (NVML's BAR1 used,
//! the free VRAM from `cuMemGetInfo`, the processes NVML lists on it with their memory, and what
//! the library holds for the device, [`vkgdr::Retained`]), and of the process its open fds
//! ([`open_fds`]); each figure held before against after ([`checks`], [`fds_check`]); sizes for
//! humans ([`size`], [`signed_size`]).

use vkgdr::nvml::GpuProcess;
use vkgdr::{Gpu, ReleaseTimes, Retained};

use crate::json::soak::SoakCheckJson;

/// What one device looks like at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Snapshot {
    /// NVML's BAR1 used, in bytes, every process's (`None`: no NVML).
    pub(super) bar1_used: Option<u64>,
    /// Free device memory (`cuMemGetInfo`), with every process's use taken off.
    pub(super) vram_free: u64,
    /// The processes NVML lists on the device, with their memory, or why there is no list.
    pub(super) processes: Result<Vec<GpuProcess>, String>,
    /// What the library holds for the device, item by item.
    pub(super) retained: Retained,
    /// How the releases of the device's memory went: the oldest waiting now, the slowest so far.
    pub(super) releases: ReleaseTimes,
}

/// Takes the device's figures now.
pub(super) fn snapshot(gpu: &Gpu) -> vkgdr::Result<Snapshot> {
    let bar = gpu.bar_info()?;
    Ok(Snapshot {
        bar1_used: bar.bar1.ok().map(|b| b.used),
        vram_free: gpu.mem_info()?.0,
        processes: gpu.processes().map_err(|e| e.to_string()),
        retained: gpu.retained(),
        releases: gpu.release_times(),
    })
}

/// This process's open file descriptors.
pub(super) fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// One figure held before against after; `more_is_use`: whether a larger figure is more use
/// (fds, BAR1 used) or less (free VRAM). No NVML is not a failure: an unknown side changes
/// nothing.
fn check(
    device: Option<i32>,
    figure: &str,
    unit: &str,
    (before, after): (Option<u64>, Option<u64>),
    more_is_use: bool,
) -> SoakCheckJson {
    let change = match (before, after) {
        (Some(b), Some(a)) => a as i64 - b as i64,
        _ => 0,
    };
    SoakCheckJson {
        device,
        figure: figure.into(),
        unit: unit.into(),
        before,
        after,
        change,
        // Fewer fds or less BAR1 used is another process's (or a cache's) going, not ours
        // staying.
        came_back: if more_is_use {
            change <= 0
        } else {
            change >= 0
        },
    }
}

/// The process's open fds held before against after.
pub(super) fn fds_check(before: usize, after: usize) -> SoakCheckJson {
    let fds = (Some(before as u64), Some(after as u64));
    check(None, "open_fds", "fds", fds, true)
}

/// The BAR1 used and free VRAM of the device of CUDA ordinal `device`, held before against after.
pub(super) fn checks(device: i32, before: &Snapshot, after: &Snapshot) -> [SoakCheckJson; 2] {
    let (bar1, free) = (
        (before.bar1_used, after.bar1_used),
        (Some(before.vram_free), Some(after.vram_free)),
    );
    [
        check(Some(device), "bar1_used", "bytes", bar1, true),
        check(Some(device), "vram_free", "bytes", free, false),
    ]
}

/// What the library holds, item by item, on one line: `raw allocations 0, carved granules 1
/// (2.0 MiB), ...; event fences made so far 0 (at most 0 alive at once)`.
pub(super) fn holdings(r: &Retained) -> String {
    let items: Vec<String> = r
        .items
        .iter()
        .map(|i| match i.bytes {
            0 => format!("{} {}", i.name, i.count),
            b => format!("{} {} ({})", i.name, i.count, size(b)),
        })
        .collect();
    format!(
        "{}; event fences made so far {} (at most {} alive at once)",
        items.join(", "),
        r.event_fences_made,
        r.event_fences_peak
    )
}

/// Bytes in MiB, to a tenth.
pub(super) fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

/// Bytes as a person reads them: `512 B`, `64 KiB`, `1.5 KiB`, `17.0 MiB`, `2.00 GiB`.
pub(super) fn size(b: u64) -> String {
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    match b {
        _ if b < KIB => format!("{b} B"),
        _ if b < MIB && b.is_multiple_of(KIB) => format!("{} KiB", b / KIB),
        _ if b < MIB => format!("{:.1} KiB", b as f64 / KIB as f64),
        _ if b < GIB => mib(b),
        _ => format!("{:.2} GiB", b as f64 / GIB as f64),
    }
}

/// A change in bytes with its sign: `+64 KiB`, `-17.0 MiB`, `0 B`.
pub(super) fn signed_size(change: i64) -> String {
    match change {
        0 => "0 B".into(),
        c if c > 0 => format!("+{}", size(c as u64)),
        c => format!("-{}", size(c.unsigned_abs())),
    }
}

impl std::fmt::Display for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "BAR1 used {}, free VRAM {}",
            self.bar1_used.map_or("n/a (no NVML)".into(), mib),
            mib(self.vram_free)
        )
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A snapshot of made-up figures: no processes known, the library holding nothing.
    pub(crate) fn snap(bar1_used: Option<u64>, vram_free: u64) -> Snapshot {
        Snapshot {
            bar1_used,
            vram_free,
            processes: Err("NVML not available".into()),
            retained: Retained {
                items: Vec::new(),
                event_fences_made: 0,
                event_fences_peak: 0,
            },
            releases: ReleaseTimes::default(),
        }
    }

    #[test]
    fn each_figure_is_held_before_against_after_and_comes_back_at_or_below() {
        let before = snap(Some(4 << 20), 10_000);
        let same = checks(0, &before, &before);
        assert_eq!(same.clone().map(|c| c.figure), ["bar1_used", "vram_free"]);
        assert!(same.iter().all(|c| c.came_back && c.change == 0));

        // Less BAR1 used and more free VRAM: another process went away. Came back.
        let lower = snap(Some(2 << 20), 12_000);
        let [bar1, vram] = checks(0, &before, &lower);
        assert_eq!((bar1.change, vram.change), (-(2 << 20), 2000));
        assert!(bar1.came_back && vram.came_back);

        // More used, less free: not back.
        let higher = snap(Some(6 << 20), 10_000 - 2048);
        let [bar1, vram] = checks(0, &before, &higher);
        assert_eq!((bar1.change, vram.change), (2 << 20, -2048));
        assert!(!bar1.came_back && !vram.came_back);
        assert_eq!([bar1.unit, vram.unit], ["bytes", "bytes"]);
        assert_eq!([bar1.device, vram.device], [Some(0); 2]);

        // No NVML on either side: BAR1 is unknown, which is not a failure.
        let unknown = snap(None, 10_000);
        let [bar1, _] = checks(0, &unknown, &unknown);
        assert_eq!((bar1.before, bar1.after, bar1.change), (None, None, 0));
        assert!(bar1.came_back);
        let [bar1, _] = checks(0, &before, &unknown);
        assert_eq!((bar1.before, bar1.after), (Some(4 << 20), None));
        assert!(bar1.came_back);

        // Fds: fewer is back, more is not.
        assert!(fds_check(41, 41).came_back && fds_check(41, 40).came_back);
        assert_eq!(fds_check(41, 41).device, None);
        let more = fds_check(41, 43);
        assert_eq!((more.change, more.came_back), (2, false));
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(size(512), "512 B");
        assert_eq!(size(64 << 10), "64 KiB");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(17 << 20), "17.0 MiB");
        assert_eq!(size(3 << 30), "3.00 GiB");
        assert_eq!(signed_size(64 << 10), "+64 KiB");
        assert_eq!(signed_size(-(17 << 20)), "-17.0 MiB");
        assert_eq!(signed_size(0), "0 B");
        assert_eq!(mib(574 << 20), "574.0 MiB");
    }
}
