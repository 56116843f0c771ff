//! BAR figures: how much BAR-mappable memory a device has, how much is in use, and an estimate of
//! what this process can still map — before an allocation fails.
//!
//! BAR-mappable memory is the scarce resource of this whole approach, and no driver interface
//! states the limit that matters. What is known (measured on an H100 80GB with driver 580):
//! - `DEVICE_LOCAL | HOST_VISIBLE` allocations fail with `VK_ERROR_OUT_OF_DEVICE_MEMORY` at about
//!   **(VRAM total − other VRAM in use) / 2**: 39 GiB on an idle 80 GB H100, 29/19/9 GiB with
//!   20/40/60 GiB of `cuMemAlloc` held;
//! - each mapped byte counts **twice** in NVML's BAR1 `used` (and `nvidia-smi`'s "BAR1 Used");
//! - the Vulkan heap size and `VK_EXT_memory_budget` do not predict it (they say 78.6 GiB).
//!
//! [`estimate_mappable`] turns that into a number from figures anyone can read (NVML's BAR1 and
//! memory figures, or `cuMemGetInfo`), and says which rule produced it. It is an **estimate**:
//! treat `OUT_OF_DEVICE_MEMORY` as a normal outcome anyway, and use a fraction of the estimate
//! ([`BarInfo::budget`], [`PoolConfig::with_bar_budget`](crate::PoolConfig::with_bar_budget)) as a
//! pool's limit.

use std::fmt;

use crate::driver::cuda::{ContextGuard, CuDevice, Driver, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID};
use crate::driver::nvml::{self, Bar1Memory, GpuProcess, Nvml, PciAddress};
use crate::error::{Error, InvalidArgument, Result};
use crate::mapping::gpu::Gpu;

/// `CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID`.
const CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: i32 = 34;
/// `CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID`.
const CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: i32 = 50;

/// Where the VRAM figures of a [`BarInfo`] come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VramSource {
    /// `cuMemGetInfo` in the device's context.
    Cuda,
    /// NVML's `nvmlDeviceGetMemoryInfo` (no context needed).
    Nvml,
}

/// What this process can probably still map, and how that was worked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappableEstimate {
    /// The estimate in bytes.
    pub bytes: u64,
    /// The rule and the figures it used, for humans (`vkgdr info` prints it).
    pub basis: String,
}

/// BAR figures of one CUDA device: NVML's BAR1 numbers when NVML is there, the VRAM in use, and
/// the estimate of what can still be mapped ([`estimate_mappable`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BarInfo {
    /// The device's PCI address (from CUDA).
    pub pci: Option<PciAddress>,
    /// BAR1 total/free/used from NVML, or why they are not available (no NVML, no matching
    /// NVML device, or the call's NVML error).
    pub bar1: std::result::Result<Bar1Memory, String>,
    /// Device memory in bytes.
    pub vram_total: u64,
    /// Device memory in use (every process, the driver's reservation included), in bytes.
    pub vram_used: u64,
    /// Where the VRAM figures come from.
    pub vram_source: VramSource,
    /// What this process can probably still map.
    pub estimate: MappableEstimate,
}

impl BarInfo {
    /// A budget of `fraction` of the estimate, in bytes, for
    /// [`PoolConfig::max_bytes`](crate::PoolConfig::max_bytes). `fraction` must be in `(0, 1]`.
    ///
    /// ```no_run
    /// # fn main() -> vkgdr::Result<()> {
    /// let gpu = vkgdr::Gpu::open(0)?;
    /// let config = vkgdr::PoolConfig {
    ///     max_bytes: gpu.bar_info()?.budget(0.5)?,
    ///     ..Default::default()
    /// };
    /// let pool = vkgdr::Pool::new(gpu, config)?;
    /// # Ok(()) }
    /// ```
    pub fn budget(&self, fraction: f64) -> Result<u64> {
        budget_of(self.estimate.bytes, fraction)
    }
}

/// `fraction` of `bytes`, rounded down; `fraction` must be in `(0, 1]`.
pub fn budget_of(bytes: u64, fraction: f64) -> Result<u64> {
    if !(fraction > 0.0 && fraction <= 1.0) {
        return Err(InvalidArgument::BudgetFraction { fraction }.into());
    }
    // f64 holds byte counts below 2^53 exactly; above that the rounding is far below a page.
    Ok(((bytes as f64) * fraction).floor() as u64)
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// The measured capacity rule, applied to the figures at hand.
///
/// With NVML's BAR1 figures: what is already BAR-mapped is `bar1.used / 2` (each mapped byte
/// counts twice there), so the other VRAM in use is `vram_used − mapped`, and
///
/// `estimate = min((vram_total − vram_used − mapped) / 2, bar1.free / 2)`
///
/// — the first term is the measured rule `(total − other use) / 2` less what is already mapped,
/// the second the BAR1 aperture itself at two BAR1 bytes per mapped byte. Without BAR1 figures
/// only `(vram_total − vram_used) / 2` is left, which counts earlier mappings once instead of
/// twice (so it is high by half of what is already mapped).
pub fn estimate_mappable(
    vram_total: u64,
    vram_used: u64,
    bar1: Option<&Bar1Memory>,
) -> MappableEstimate {
    let vram_used = vram_used.min(vram_total);
    match bar1 {
        Some(b) => {
            let mapped = (b.used / 2).min(vram_used);
            let vram_rule = (vram_total - vram_used).saturating_sub(mapped) / 2;
            let bar1_rule = b.free / 2;
            let bytes = vram_rule.min(bar1_rule);
            let limit = if vram_rule <= bar1_rule {
                "VRAM"
            } else {
                "BAR1"
            };
            MappableEstimate {
                bytes,
                basis: format!(
                    "min((VRAM {} total - {} used - {} already mapped) / 2, BAR1 {} free / 2); \
                     {limit} limits. Rule measured on an H100: BAR mappings fail at about \
                     (VRAM total - other use) / 2 and count twice in BAR1 used",
                    gib(vram_total),
                    gib(vram_used),
                    gib(mapped),
                    gib(b.free),
                ),
            }
        }
        None => MappableEstimate {
            bytes: (vram_total - vram_used) / 2,
            basis: format!(
                "(VRAM {} total - {} used) / 2, without BAR1 figures (mappings already made \
                 count once here, so this is high by half of them). Rule measured on an H100: \
                 BAR mappings fail at about (VRAM total - other use) / 2",
                gib(vram_total),
                gib(vram_used),
            ),
        },
    }
}

/// The PCI address CUDA reports for `device`.
pub fn cuda_pci_address(driver: &Driver, device: CuDevice) -> Result<PciAddress> {
    Ok(PciAddress {
        domain: driver.device_attribute(device, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)? as u32,
        bus: driver.device_attribute(device, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)? as u32,
        device: driver.device_attribute(device, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)? as u32,
    })
}

/// NVML's BAR1 and VRAM figures for the CUDA device with `uuid` at `pci`, or why not.
fn nvml_figures(
    uuid: &[u8; 16],
    pci: Option<PciAddress>,
) -> std::result::Result<nvml::NvmlDevice, String> {
    let nvml = Nvml::get().map_err(|e| format!("NVML not available: {e}"))?;
    let devices = nvml.devices().map_err(|e| e.to_string())?;
    nvml::match_device(&devices, uuid, pci)
        .cloned()
        .ok_or_else(|| "no NVML device with this UUID or PCI address".to_string())
}

/// Assembles a [`BarInfo`] from NVML's figures and, where NVML has no VRAM figures, `cuda_vram`
/// (`(free, total)` from `cuMemGetInfo`, asked only when needed).
fn gather(
    uuid: &[u8; 16],
    pci: Option<PciAddress>,
    cuda_vram: impl FnOnce() -> Result<(u64, u64)>,
    prefer_cuda_vram: bool,
) -> Result<BarInfo> {
    let nvml = nvml_figures(uuid, pci);
    let bar1 = nvml
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|d| d.bar1.clone());
    let nvml_vram = nvml.as_ref().ok().and_then(|d| d.vram.clone().ok());
    let (vram_total, vram_used, vram_source) = match nvml_vram {
        Some(v) if !prefer_cuda_vram => (v.total, v.used, VramSource::Nvml),
        _ => {
            let (free, total) = cuda_vram()?;
            (total, total.saturating_sub(free), VramSource::Cuda)
        }
    };
    let estimate = estimate_mappable(vram_total, vram_used, bar1.as_ref().ok());
    Ok(BarInfo {
        pci,
        bar1,
        vram_total,
        vram_used,
        vram_source,
        estimate,
    })
}

/// The BAR figures of CUDA device `device` without opening it for vkgdr (what `vkgdr info`
/// shows): NVML's figures, or — without NVML — `cuMemGetInfo` in the device's primary context,
/// retained for the call.
pub fn device_bar_info(driver: &Driver, device: CuDevice) -> Result<BarInfo> {
    let uuid = driver.device_uuid(device)?;
    let pci = cuda_pci_address(driver, device).ok();
    gather(
        &uuid,
        pci,
        || primary_context_mem_info(driver, device),
        false,
    )
}

/// `cuMemGetInfo` in `device`'s primary context, retained and released around the call.
fn primary_context_mem_info(driver: &Driver, device: CuDevice) -> Result<(u64, u64)> {
    let ctx = driver.cu_device_primary_ctx_retain(device)?;
    let result = (|| {
        // SAFETY: the primary context is retained until after the guard drops.
        let _guard = unsafe { ContextGuard::push(driver, ctx) }?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: a context is current; valid out-pointers.
        unsafe { driver.cu_mem_get_info(&mut free, &mut total) }?;
        Ok((free as u64, total as u64))
    })();
    // SAFETY: balances the retain above; nothing of ours uses the context any more.
    let _ = unsafe { driver.cu_device_primary_ctx_release(device) };
    result
}

impl Gpu {
    /// This device's BAR figures: BAR1 total/free/used from NVML (when it is there), the VRAM in
    /// use (`cuMemGetInfo` in this handle's context) and the estimate of what this process can
    /// still map ([`estimate_mappable`]).
    ///
    /// Fails only on a CUDA error; a machine without NVML gives figures without BAR1
    /// ([`BarInfo::bar1`] says why).
    ///
    /// ```no_run
    /// # fn main() -> vkgdr::Result<()> {
    /// let gpu = vkgdr::Gpu::open(0)?;
    /// let bar = gpu.bar_info()?;
    /// println!("can probably still map {} bytes ({})", bar.estimate.bytes, bar.estimate.basis);
    /// # Ok(()) }
    /// ```
    pub fn bar_info(&self) -> Result<BarInfo> {
        let pci = cuda_pci_address(self.driver(), self.cu_device()).ok();
        gather(
            &self.uuid(),
            pci,
            || {
                let (free, total) = self.mem_info()?;
                Ok((free, total))
            },
            true,
        )
    }

    /// The processes with a context on this device, as NVML lists them
    /// ([`Nvml::processes`]): each one's pid and the device memory it uses, this process among
    /// them. NVML numbers processes as the host's kernel does, so inside a container (a PID
    /// namespace of its own) this process's `getpid()` is not in the list.
    ///
    /// Without NVML: [`Error::LibraryNotFound`]; without a matching NVML device:
    /// [`Error::NoMatchingDevice`]; a driver without the calls or a device that does not report
    /// them: NVML's error.
    pub fn processes(&self) -> Result<Vec<GpuProcess>> {
        let nvml = Nvml::get()?;
        let pci = cuda_pci_address(self.driver(), self.cu_device()).ok();
        let devices = nvml.devices()?;
        let index = nvml::match_device(&devices, &self.uuid(), pci)
            .ok_or_else(|| {
                Error::NoMatchingDevice(format!(
                    "no NVML device with the UUID or PCI address of {}",
                    self.name()
                ))
            })?
            .index;
        nvml.processes(index)
    }
}

impl fmt::Display for BarInfo {
    /// Two lines: the BAR1 figures (or why there are none) and the estimate with its basis.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.bar1 {
            Ok(b) => writeln!(
                f,
                "BAR1 {} total, {} used, {} free (NVML)",
                gib(b.total),
                gib(b.used),
                gib(b.free)
            )?,
            Err(why) => writeln!(f, "BAR1 figures unavailable: {why}")?,
        }
        write!(
            f,
            "can probably still map {} (estimate: {})",
            gib(self.estimate.bytes),
            self.estimate.basis
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    const GIB: u64 = 1 << 30;

    #[test]
    fn idle_h100_matches_the_measured_ceiling() {
        // An idle 80 GB H100: ≈ 0.5 GiB in use, BAR1 128 GiB with a few MiB used. Measured: ≈ 39 GiB.
        let bar1 = Bar1Memory {
            total: 128 * GIB,
            used: 4 << 20,
            free: 128 * GIB - (4 << 20),
        };
        let e = estimate_mappable(79 * GIB + GIB / 2, GIB / 2, Some(&bar1));
        assert!(e.bytes > 38 * GIB && e.bytes < 40 * GIB, "{}", e.bytes);
        assert!(e.basis.contains("VRAM limits"), "{}", e.basis);
    }

    #[test]
    fn cuda_allocations_lower_the_estimate_by_half_of_themselves() {
        // Measured: 20/40/60 GiB of cuMemAlloc held leave 29/19/9 GiB mappable.
        let bar1 = Bar1Memory {
            total: 128 * GIB,
            used: 0,
            free: 128 * GIB,
        };
        for (held, measured) in [(20, 29), (40, 19), (60, 9)] {
            let e = estimate_mappable(80 * GIB, (held * GIB) + GIB, Some(&bar1));
            let got = e.bytes as f64 / GIB as f64;
            assert!(
                (got - measured as f64).abs() < 1.0,
                "{held} GiB held: estimate {got:.2} GiB, measured {measured}"
            );
        }
    }

    #[test]
    fn mappings_already_made_count_fully() {
        // 10 GiB mapped: VRAM used grows by 10 GiB, BAR1 used by 20 GiB; the estimate drops by 10.
        let before = estimate_mappable(
            80 * GIB,
            GIB,
            Some(&Bar1Memory {
                total: 128 * GIB,
                used: 0,
                free: 128 * GIB,
            }),
        );
        let after = estimate_mappable(
            80 * GIB,
            11 * GIB,
            Some(&Bar1Memory {
                total: 128 * GIB,
                used: 20 * GIB,
                free: 108 * GIB,
            }),
        );
        assert_eq!(before.bytes - after.bytes, 10 * GIB);
    }

    #[test]
    fn a_small_bar_limits_by_bar1() {
        // A GeForce card without resizable BAR: 256 MiB of BAR1, 24 GiB of VRAM.
        let bar1 = Bar1Memory {
            total: 256 << 20,
            used: 6 << 20,
            free: 250 << 20,
        };
        let e = estimate_mappable(24 * GIB, GIB, Some(&bar1));
        assert_eq!(e.bytes, 125 << 20);
        assert!(e.basis.contains("BAR1 limits"), "{}", e.basis);
    }

    #[test]
    fn without_bar1_half_the_free_vram() {
        let e = estimate_mappable(80 * GIB, 2 * GIB, None);
        assert_eq!(e.bytes, 39 * GIB);
        assert!(e.basis.contains("without BAR1 figures"), "{}", e.basis);
    }

    #[test]
    fn figures_that_do_not_add_up_never_underflow() {
        let bar1 = Bar1Memory {
            total: GIB,
            used: 10 * GIB,
            free: 0,
        };
        assert_eq!(estimate_mappable(GIB, 5 * GIB, Some(&bar1)).bytes, 0);
        assert_eq!(estimate_mappable(GIB, 5 * GIB, None).bytes, 0);
        assert_eq!(estimate_mappable(0, 0, None).bytes, 0);
    }

    #[test]
    fn budgets() {
        assert_eq!(budget_of(1000, 0.5).unwrap(), 500);
        assert_eq!(budget_of(1000, 1.0).unwrap(), 1000);
        assert_eq!(budget_of(999, 0.5).unwrap(), 499);
        assert_eq!(budget_of(u64::MAX, 1.0).unwrap(), u64::MAX);
        for bad in [0.0, -0.1, 1.01, f64::NAN, f64::INFINITY] {
            let e = budget_of(1000, bad).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("invalid argument: a BAR budget fraction must be in (0, 1], not {bad}")
            );
            assert!(
                matches!(
                    e,
                    Error::InvalidArgument(InvalidArgument::BudgetFraction { .. })
                ),
                "{bad}: {e}"
            );
        }
    }
}
