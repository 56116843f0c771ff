//! The figures that must come back ([`Figures`]): this process's open fds, BAR1 used (NVML) and
//! free VRAM (`cuMemGetInfo`).

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
