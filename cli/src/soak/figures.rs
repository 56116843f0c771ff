//! The figures that must come back ([`Figures`]): this process's open fds, BAR1 used (NVML) and
//! free VRAM (`cuMemGetInfo`); each held before against after ([`checks`]).

use vkgdr::Gpu;

/// The figures that must come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Figures {
    pub(super) fds: usize,
    /// NVML's BAR1 used, in bytes (`None`: no NVML).
    pub(super) bar1_used: Option<u64>,
    pub(super) vram_free: u64,
}

/// Takes the figures now.
pub(super) fn figures(gpu: &Gpu) -> vkgdr::Result<Figures> {
    let bar = gpu.bar_info()?;
    Ok(Figures {
        fds: std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count()),
        bar1_used: bar.bar1.ok().map(|b| b.used),
        vram_free: gpu.mem_info()?.0,
    })
}

/// One figure held before against after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Check {
    /// Its name in the JSON document (`open_fds`, `bar1_used`, `vram_free`).
    pub(super) figure: &'static str,
    /// What the text calls it.
    pub(super) what: &'static str,
    /// `fds` or `bytes`.
    pub(super) unit: &'static str,
    /// Before (`None`: not known).
    pub(super) before: Option<u64>,
    /// After.
    pub(super) after: Option<u64>,
    /// After minus before (0 when either is unknown: no NVML is not a failure).
    pub(super) change: i64,
}

impl Check {
    /// Whether it came back.
    pub(super) fn came_back(&self) -> bool {
        self.change == 0
    }
}

/// Each figure held before against after.
pub(super) fn checks(before: &Figures, after: &Figures) -> [Check; 3] {
    let check = |figure, what, unit, before: Option<u64>, after: Option<u64>| Check {
        figure,
        what,
        unit,
        before,
        after,
        change: match (before, after) {
            (Some(b), Some(a)) => a as i64 - b as i64,
            _ => 0,
        },
    };
    [
        check(
            "open_fds",
            "fds",
            "fds",
            Some(before.fds as u64),
            Some(after.fds as u64),
        ),
        check(
            "bar1_used",
            "BAR1 used (bytes)",
            "bytes",
            before.bar1_used,
            after.bar1_used,
        ),
        check(
            "vram_free",
            "free VRAM (bytes)",
            "bytes",
            Some(before.vram_free),
            Some(after.vram_free),
        ),
    ]
}

/// Bytes in MiB, to a tenth.
pub(super) fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "fds {}, BAR1 used {}, free VRAM {}",
            self.fds,
            self.bar1_used.map_or("n/a (no NVML)".into(), mib),
            mib(self.vram_free)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_figure_is_held_before_against_after() {
        let before = Figures {
            fds: 41,
            bar1_used: Some(4 << 20),
            vram_free: 10_000,
        };
        let same = checks(&before, &before);
        assert_eq!(
            same.map(|c| c.figure),
            ["open_fds", "bar1_used", "vram_free"]
        );
        assert!(same.iter().all(|c| c.came_back() && c.change == 0));

        let after = Figures {
            fds: 43,
            bar1_used: Some(2 << 20),
            vram_free: 10_000 - 2048,
        };
        let [fds, bar1, vram] = checks(&before, &after);
        assert_eq!((fds.before, fds.after, fds.change), (Some(41), Some(43), 2));
        assert_eq!((fds.what, fds.unit), ("fds", "fds"));
        assert!(!fds.came_back());
        assert_eq!(bar1.change, -(2 << 20));
        assert_eq!(bar1.what, "BAR1 used (bytes)");
        assert!(!bar1.came_back());
        assert_eq!((vram.change, vram.unit), (-2048, "bytes"));
        assert!(!vram.came_back());

        // No NVML on either side: BAR1 is unknown, which is not a failure.
        let unknown = Figures {
            bar1_used: None,
            ..after
        };
        let [_, bar1, _] = checks(&unknown, &unknown);
        assert_eq!((bar1.before, bar1.after, bar1.change), (None, None, 0));
        assert!(bar1.came_back());
        let [_, bar1, _] = checks(&before, &unknown);
        assert_eq!((bar1.before, bar1.after), (Some(4 << 20), None));
        assert!(bar1.came_back());
    }
}
