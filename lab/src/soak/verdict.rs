//! The verdict on one device ([`judge`], pure): of what changed in its figures between the
//! warm-up and the end, what is ours, what other processes did and what is left to the driver.
//!
//! NVML's BAR1 used and the free VRAM are figures of the whole device: another process's
//! footprint coming or going moves them as much as ours would (two soaks side by side, one per
//! GPU, each saw the other's 17 MiB start-up footprint come and go). The rule:
//!
//! 1. **Came back**: BAR1 used and the VRAM in use at or below their start. Lower is someone
//!    else's footprint (another process, a cache of the driver's) going away, never a failure.
//! 2. **Ours**, which fails: an item of the library's inventory ([`vkgdr::Retained`]: live raw
//!    allocations, carved granules, completion words, staging buffers and sets, the copy stream,
//!    releases waiting, event fences) holding more than at the start; and, where NVML lists this
//!    process, its device memory per NVML grown by a granule or more: the smallest device memory
//!    the library maps (a VMM granule, 2 MiB on an H100; a 4 KiB page where memory is imported
//!    without VMM). Open fds, a figure of the process, are judged once for all devices.
//! 3. **Other processes**: NVML's per-process lists (compute and graphics: a Vulkan process is a
//!    graphics process) say which pids came, went or changed, and by how much. Their net growth
//!    is taken off the device's (VRAM once, BAR1 twice: BAR-mapped memory counts twice there)
//!    and reported by pid, never failed on.
//! 4. **The driver**: growth left over while nothing of ours grew. Below one granule (BAR1: two)
//!    it is the driver's own (its pools, page tables: no allocation of ours is that small), named
//!    with its size: `driver-internal: +64 KiB BAR1, +64 KiB VRAM, our inventory unchanged`.
//!    More, with NVML saying this process did not grow, is left unattributed (a process NVML does
//!    not list, or the driver) and reported. More without per-process figures (no NVML, or a
//!    container: NVML numbers processes as the host does, and a PID namespace hides this one)
//!    cannot be told from ours and fails: the device-wide rule with its at-or-below relief.

use std::collections::BTreeSet;

use vkgdr::nvml::GpuProcess;
use vkgdr::RetainedItem;

use super::figures::{signed_size, size, Snapshot};
use crate::json::soak::{ProcessChangeJson, ResidualJson, Whose};

/// What NVML's per-process lists say about one device, before and after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PerProcess {
    /// This process's device memory per NVML, before and after.
    pub(super) ours: (u64, u64),
    /// Every other process that came, went or changed, by pid.
    pub(super) others: Vec<ProcessChangeJson>,
}

impl PerProcess {
    /// This process's change.
    pub(super) fn ours_change(&self) -> i64 {
        self.ours.1 as i64 - self.ours.0 as i64
    }

    /// The other processes' net change.
    pub(super) fn others_change(&self) -> i64 {
        self.others.iter().map(|c| c.change_bytes).sum()
    }
}

/// The verdict on one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Judgement {
    /// BAR1 used after minus before (`None`: no NVML).
    pub(super) bar1_change: Option<i64>,
    /// VRAM in use after minus before (free before minus free after).
    pub(super) vram_change: i64,
    /// Whether both are at or below their start.
    pub(super) came_back: bool,
    /// NVML's per-process figures, or why there are none.
    pub(super) per_process: Result<PerProcess, String>,
    /// The inventory items that hold more than at the start: (before, after).
    pub(super) ours_grown: Vec<(RetainedItem, RetainedItem)>,
    /// Event fences the device's releases made during the run (a rare path: no completion word).
    pub(super) event_fences_made: u64,
    /// The most event fences alive at once, by the end of the warm-up and by the end.
    pub(super) event_fences_peak: (u64, u64),
    /// The growth left after other processes' (`None`: none).
    pub(super) residual: Option<ResidualJson>,
    /// Why the device fails (empty: it passes).
    pub(super) failures: Vec<String>,
}

impl Judgement {
    /// Whether the device passes.
    pub(super) fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// NVML's per-process figures of one device, before and after; `Err` says why there are none
/// that can be used (no list, this process not in it, no figure for it).
fn per_process(before: &Snapshot, after: &Snapshot, our_pid: u32) -> Result<PerProcess, String> {
    let list = |s: &Snapshot| {
        s.processes
            .clone()
            .map_err(|e| format!("NVML's process lists are not available: {e}"))
    };
    let (b, a) = (list(before)?, list(after)?);
    let ours = |l: &[GpuProcess]| -> Result<u64, String> {
        let me = l.iter().find(|p| p.pid == our_pid).ok_or_else(|| {
            format!(
                "this process (pid {our_pid}) is not among NVML's processes on the device: NVML \
                 numbers processes as the host does, so a PID namespace (a container) hides it"
            )
        })?;
        me.used_bytes
            .ok_or_else(|| "NVML does not tell this process's device memory here".to_string())
    };
    let ours = (ours(&b)?, ours(&a)?);
    let pids: BTreeSet<u32> = b
        .iter()
        .chain(&a)
        .map(|p| p.pid)
        .filter(|&p| p != our_pid)
        .collect();
    let used = |l: &[GpuProcess], pid: u32| {
        l.iter()
            .find(|p| p.pid == pid)
            .map(|p| p.used_bytes.unwrap_or(0))
    };
    let others = pids
        .into_iter()
        .map(|pid| (pid, used(&b, pid), used(&a, pid)))
        .filter(|(_, before, after)| before != after)
        .map(|(pid, before, after)| ProcessChangeJson {
            pid,
            before_bytes: before,
            after_bytes: after,
            // A process not listed counts 0.
            change_bytes: after.unwrap_or(0) as i64 - before.unwrap_or(0) as i64,
        })
        .collect();
    Ok(PerProcess { ours, others })
}

/// Judges one device's figures `before` against `after` for the process `our_pid`, whose
/// smallest device mapping is `granule` bytes (see the module's rule).
pub(super) fn judge(before: &Snapshot, after: &Snapshot, our_pid: u32, granule: u64) -> Judgement {
    let bar1_change = match (before.bar1_used, after.bar1_used) {
        (Some(b), Some(a)) => Some(a as i64 - b as i64),
        _ => None,
    };
    let vram_change = before.vram_free as i64 - after.vram_free as i64;
    let came_back = vram_change <= 0 && bar1_change.is_none_or(|c| c <= 0);
    let ours_grown = after.retained.grown_since(&before.retained);
    let per_process = per_process(before, after, our_pid);
    let g = granule as i64;

    let mut failures: Vec<String> = ours_grown
        .iter()
        .map(|(b, a)| {
            format!(
                "ours: the library holds more {}: {} -> {} ({} -> {})",
                a.name,
                b.count,
                a.count,
                size(b.bytes),
                size(a.bytes)
            )
        })
        .collect();
    if let Ok(p) = &per_process {
        if p.ours_change() >= g {
            failures.push(format!(
                "ours: this process's device memory per NVML {} ({} -> {}), at least a granule \
                 ({}), the smallest mapping of ours",
                signed_size(p.ours_change()),
                size(p.ours.0),
                size(p.ours.1),
                size(granule)
            ));
        }
    }
    let ours = !failures.is_empty();

    let residual = if came_back {
        None
    } else {
        let others = per_process.as_ref().map_or(0, |p| p.others_change().max(0));
        let vram = (vram_change - others).max(0) as u64;
        let bar1 = bar1_change.map_or(0, |c| (c - 2 * others).max(0)) as u64;
        let small = vram < granule && bar1 < 2 * granule;
        let whose = match () {
            _ if vram == 0 && bar1 == 0 => None,
            _ if ours => Some(Whose::Ours),
            _ if small => Some(Whose::Driver),
            _ if per_process.is_ok() => Some(Whose::Unattributed),
            _ => Some(Whose::Unexplained),
        };
        if whose == Some(Whose::Unexplained) {
            failures.push(format!(
                "unexplained: {} BAR1, {} VRAM in use, at least a granule ({}), and no \
                 per-process figures to tell it from ours ({})",
                signed_size(bar1 as i64),
                signed_size(vram as i64),
                size(granule),
                per_process.as_ref().err().map_or("", String::as_str)
            ));
        }
        whose.map(|whose| ResidualJson {
            whose,
            bar1_bytes: bar1,
            vram_bytes: vram,
        })
    };
    Judgement {
        bar1_change,
        vram_change,
        came_back,
        per_process,
        ours_grown,
        event_fences_made: after
            .retained
            .event_fences_made
            .saturating_sub(before.retained.event_fences_made),
        event_fences_peak: (
            before.retained.event_fences_peak,
            after.retained.event_fences_peak,
        ),
        residual,
        failures,
    }
}

impl Judgement {
    /// The verdict as lines of text: device-wide, ours, other processes, what is left, and why
    /// it fails.
    pub(super) fn lines(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "device-wide: BAR1 used {}, VRAM in use {}{}",
            self.bar1_change.map_or("n/a (no NVML)".into(), signed_size),
            signed_size(self.vram_change),
            if self.came_back {
                ": came back (at or below the start)"
            } else {
                ""
            }
        )];
        let inventory = if self.ours_grown.is_empty() {
            "our inventory unchanged".to_string()
        } else {
            let grown: Vec<String> = self
                .ours_grown
                .iter()
                .map(|(b, a)| format!("{} {} -> {}", a.name, b.count, a.count))
                .collect();
            format!("our inventory grew: {}", grown.join(", "))
        };
        let nvml = match &self.per_process {
            Ok(p) => format!(
                "this process per NVML {} -> {} ({})",
                size(p.ours.0),
                size(p.ours.1),
                signed_size(p.ours_change())
            ),
            Err(why) => format!("no per-process figures: {why}"),
        };
        lines.push(format!("ours: {inventory}; {nvml}"));
        if self.event_fences_made > 0 {
            let (warm, end) = self.event_fences_peak;
            lines.push(format!(
                "event fences made during the run: {} (releases without a completion word), at \
                 most {end} alive at once ({warm} by the end of the warm-up{})",
                self.event_fences_made,
                if end > warm {
                    ": a new peak, which a driver's pool of events may keep"
                } else {
                    ""
                }
            ));
        }
        if let Ok(p) = &self.per_process {
            let others: Vec<String> = p
                .others
                .iter()
                .map(|c| match (c.before_bytes, c.after_bytes) {
                    (None, Some(a)) => format!("pid {} came ({})", c.pid, signed_size(a as i64)),
                    (Some(b), None) => format!("pid {} went ({})", c.pid, signed_size(-(b as i64))),
                    _ => format!("pid {} {}", c.pid, signed_size(c.change_bytes)),
                })
                .collect();
            lines.push(if others.is_empty() {
                "other processes: none came, went or changed".into()
            } else {
                format!("other processes: {}", others.join(", "))
            });
        }
        if let Some(r) = &self.residual {
            let amounts = format!(
                "{} BAR1, {} VRAM",
                signed_size(r.bar1_bytes as i64),
                signed_size(r.vram_bytes as i64)
            );
            lines.push(match r.whose {
                Whose::Driver => format!("driver-internal: {amounts}, {inventory}"),
                Whose::Unattributed => format!(
                    "unattributed: {amounts}, {inventory} and this process did not grow per \
                     NVML: a process NVML does not list, or the driver"
                ),
                Whose::Ours => format!("ours: {amounts}"),
                Whose::Unexplained => format!("unexplained: {amounts}"),
            });
        }
        lines.extend(self.failures.iter().map(|f| format!("FAILS: {f}")));
        lines
    }
}

#[cfg(test)]
mod tests {
    use vkgdr::retained::names;
    use vkgdr::{Retained, RetainedKind};

    use super::*;
    use crate::soak::figures::tests::snap;

    const ME: u32 = 4242;
    const GRANULE: u64 = 2 << 20;
    const MIB: u64 = 1 << 20;

    fn proc(pid: u32, used: u64) -> GpuProcess {
        GpuProcess {
            pid,
            used_bytes: Some(used),
            compute: true,
            graphics: true,
        }
    }

    fn holding(carved_granules: u64, host_buffers: u64) -> Retained {
        let item = |name, kind, count, bytes| RetainedItem {
            name,
            kind,
            count,
            bytes,
        };
        Retained {
            items: vec![
                item(names::RAW_ALLOCATIONS, RetainedKind::Bar, 0, 0),
                item(
                    names::CARVED_GRANULES,
                    RetainedKind::Bar,
                    carved_granules,
                    carved_granules * GRANULE,
                ),
                item(
                    names::HOST_STAGING_BUFFERS,
                    RetainedKind::Host,
                    host_buffers,
                    host_buffers * 4096,
                ),
            ],
            event_fences_made: 0,
            event_fences_peak: 0,
        }
    }

    /// A device's figures: BAR1 used and VRAM in use (free = 80 GiB - used), NVML's processes
    /// (`None`: no list), what the library holds.
    fn device(
        bar1: u64,
        used: u64,
        procs: Option<Vec<GpuProcess>>,
        retained: Retained,
    ) -> Snapshot {
        Snapshot {
            processes: procs.ok_or_else(|| "NVML not available".to_string()),
            retained,
            ..snap(Some(bar1), (80 << 30) - used)
        }
    }

    fn judge_(before: &Snapshot, after: &Snapshot) -> Judgement {
        judge(before, after, ME, GRANULE)
    }

    // --- What must fail ---------------------------------------------------------------------

    #[test]
    fn a_granule_we_kept_fails_as_ours_by_name() {
        let before = device(
            574 * MIB,
            1000 * MIB,
            Some(vec![proc(ME, 600 * MIB)]),
            holding(0, 0),
        );
        let after = device(
            578 * MIB,
            1002 * MIB,
            Some(vec![proc(ME, 602 * MIB)]),
            holding(1, 0),
        );
        let j = judge_(&before, &after);
        assert!(!j.passed());
        assert!(!j.came_back);
        assert!(
            j.failures[0].starts_with("ours: the library holds more carved granules: 0 -> 1"),
            "{:?}",
            j.failures
        );
        assert!(
            j.failures[1].contains("per NVML +2.0 MiB"),
            "{:?}",
            j.failures
        );
        assert_eq!(j.residual.unwrap().whose, Whose::Ours);
    }

    #[test]
    fn our_process_growing_per_nvml_fails_though_our_inventory_did_not() {
        let before = device(
            574 * MIB,
            1000 * MIB,
            Some(vec![proc(ME, 600 * MIB)]),
            holding(0, 0),
        );
        let after = device(
            578 * MIB,
            1002 * MIB,
            Some(vec![proc(ME, 602 * MIB)]),
            holding(0, 0),
        );
        let j = judge_(&before, &after);
        assert!(!j.passed());
        assert_eq!(j.failures.len(), 1, "{:?}", j.failures);
        assert!(j.failures[0].starts_with("ours: this process's device memory per NVML +2.0 MiB"));
    }

    #[test]
    fn our_leak_fails_even_when_another_process_leaving_hides_it_device_wide() {
        let before = device(
            600 * MIB,
            1100 * MIB,
            Some(vec![proc(ME, 600 * MIB), proc(77, 17 * MIB)]),
            holding(0, 0),
        );
        // The other process went (-17 MiB), we grew by 2 MiB: the device is lower than at the
        // start, and the check still fails.
        let after = device(
            587 * MIB,
            1085 * MIB,
            Some(vec![proc(ME, 602 * MIB)]),
            holding(0, 0),
        );
        let j = judge_(&before, &after);
        assert!(j.came_back);
        assert!(!j.passed(), "{j:?}");
        assert!(j.failures[0].contains("per NVML +2.0 MiB"));
    }

    #[test]
    fn a_host_buffer_we_kept_fails_though_no_device_figure_moved() {
        let before = device(574 * MIB, 1000 * MIB, None, holding(0, 0));
        let after = device(574 * MIB, 1000 * MIB, None, holding(0, 1));
        let j = judge_(&before, &after);
        assert!(j.came_back && j.residual.is_none());
        assert!(!j.passed());
        assert!(j.failures[0].contains("host staging buffers: 0 -> 1 (0 B -> 4 KiB)"));
    }

    #[test]
    fn growth_of_a_granule_without_per_process_figures_cannot_pass() {
        // In a container (this pid not in NVML's list) or without NVML: a granule or more is
        // not told from ours.
        for procs in [None, Some(vec![proc(1, 600 * MIB)])] {
            let before = device(574 * MIB, 1000 * MIB, procs.clone(), holding(0, 0));
            let after = device(591 * MIB, 1017 * MIB, procs.clone(), holding(0, 0));
            let j = judge_(&before, &after);
            assert!(!j.passed(), "{procs:?}");
            assert_eq!(j.residual.unwrap().whose, Whose::Unexplained);
            assert!(j.failures[0].starts_with("unexplained: +17.0 MiB BAR1, +17.0 MiB VRAM"));
        }
        // No NVML at all (no BAR1 either): the VRAM alone decides.
        let mut before = device(0, 1000 * MIB, None, holding(0, 0));
        let mut after = device(0, 1002 * MIB, None, holding(0, 0));
        before.bar1_used = None;
        after.bar1_used = None;
        let j = judge_(&before, &after);
        assert_eq!(j.bar1_change, None);
        assert!(!j.passed());
    }

    // --- What must pass ---------------------------------------------------------------------

    #[test]
    fn another_process_going_away_is_a_came_back_not_a_failure() {
        // The two-soak case: the other process's 17 MiB start-up footprint went away.
        let before = device(
            591 * MIB,
            1017 * MIB,
            Some(vec![proc(ME, 600 * MIB), proc(77, 17 * MIB)]),
            holding(0, 0),
        );
        let after = device(
            574 * MIB,
            1000 * MIB,
            Some(vec![proc(ME, 600 * MIB)]),
            holding(0, 0),
        );
        let j = judge_(&before, &after);
        assert!(j.passed(), "{:?}", j.failures);
        assert!(j.came_back && j.residual.is_none());
        assert_eq!(j.vram_change, -(17 * MIB as i64));
        let lines = j.lines();
        assert!(
            lines.contains(&"other processes: pid 77 went (-17.0 MiB)".to_string()),
            "{lines:?}"
        );
        // The same without per-process figures: lower is back, whoever went.
        let before = device(591 * MIB, 1017 * MIB, None, holding(0, 0));
        let after = device(574 * MIB, 1000 * MIB, None, holding(0, 0));
        assert!(judge_(&before, &after).passed());
    }

    #[test]
    fn another_process_coming_is_reported_by_pid_not_failed_on() {
        let before = device(
            574 * MIB,
            1000 * MIB,
            Some(vec![proc(ME, 600 * MIB)]),
            holding(0, 0),
        );
        let after = device(
            591 * MIB,
            1017 * MIB,
            Some(vec![proc(ME, 600 * MIB), proc(99, 17 * MIB)]),
            holding(0, 0),
        );
        let j = judge_(&before, &after);
        assert!(j.passed(), "{:?}", j.failures);
        assert!(!j.came_back);
        assert_eq!(j.residual, None, "the newcomer accounts for all of it");
        let p = j.per_process.as_ref().unwrap();
        assert_eq!(
            p.others,
            [ProcessChangeJson {
                pid: 99,
                before_bytes: None,
                after_bytes: Some(17 * MIB),
                change_bytes: 17 * MIB as i64,
            }]
        );
        assert!(j
            .lines()
            .contains(&"other processes: pid 99 came (+17.0 MiB)".to_string()));
    }

    #[test]
    fn a_small_growth_with_nothing_of_ours_grown_is_named_the_drivers() {
        // The H100 case: 64 KiB more BAR1 used and VRAM in use after 540 s, our inventory the
        // same; NVML may charge it to this process, below a granule.
        for (ours_after, procs) in [
            (600 * MIB + (64 << 10), true),
            (600 * MIB, true),
            (0, false),
        ] {
            let list = |used| procs.then(|| vec![proc(ME, used)]);
            let before = device(574 * MIB, 1000 * MIB, list(600 * MIB), holding(1, 0));
            let after = device(
                574 * MIB + (64 << 10),
                1000 * MIB + (64 << 10),
                list(ours_after),
                holding(1, 0),
            );
            let j = judge_(&before, &after);
            assert!(j.passed(), "{:?}", j.failures);
            assert_eq!(
                j.residual,
                Some(ResidualJson {
                    whose: Whose::Driver,
                    bar1_bytes: 64 << 10,
                    vram_bytes: 64 << 10
                })
            );
            assert!(
                j.lines().contains(
                    &"driver-internal: +64 KiB BAR1, +64 KiB VRAM, our inventory unchanged"
                        .to_string()
                ),
                "{:?}",
                j.lines()
            );
        }
    }

    #[test]
    fn large_growth_nvml_does_not_charge_to_us_is_reported_unattributed() {
        let before = device(
            574 * MIB,
            1000 * MIB,
            Some(vec![proc(ME, 600 * MIB)]),
            holding(0, 0),
        );
        let after = device(
            600 * MIB,
            1030 * MIB,
            Some(vec![proc(ME, 600 * MIB)]),
            holding(0, 0),
        );
        let j = judge_(&before, &after);
        assert!(j.passed(), "{:?}", j.failures);
        assert_eq!(j.residual.unwrap().whose, Whose::Unattributed);
    }

    #[test]
    fn event_fences_made_during_the_run_are_reported_with_their_peak() {
        let mut before = device(574 * MIB, 1000 * MIB, None, holding(0, 0));
        before.retained.event_fences_made = 2;
        before.retained.event_fences_peak = 1;
        let mut after = before.clone();
        assert!(!judge_(&before, &after)
            .lines()
            .iter()
            .any(|l| l.starts_with("event fences")));
        after.retained.event_fences_made = 40;
        after.retained.event_fences_peak = 9;
        let j = judge_(&before, &after);
        assert!(
            j.passed(),
            "alive ones are an item; made ones are a path taken"
        );
        assert_eq!((j.event_fences_made, j.event_fences_peak), (38, (1, 9)));
        let line = j
            .lines()
            .into_iter()
            .find(|l| l.starts_with("event fences"))
            .unwrap();
        assert!(line.contains("at most 9 alive at once (1 by the end of the warm-up: a new peak"));
    }

    #[test]
    fn per_process_figures_say_why_they_are_missing() {
        let no_list = device(0, 0, None, holding(0, 0));
        let j = judge_(&no_list, &no_list);
        assert!(j.per_process.unwrap_err().contains("NVML not available"));
        let not_me = device(0, 0, Some(vec![proc(1, 0)]), holding(0, 0));
        let j = judge_(&not_me, &not_me);
        assert!(j.per_process.unwrap_err().contains("PID namespace"));
        let unknown = device(
            0,
            0,
            Some(vec![GpuProcess {
                used_bytes: None,
                ..proc(ME, 0)
            }]),
            holding(0, 0),
        );
        let j = judge_(&unknown, &unknown);
        assert!(j.per_process.unwrap_err().contains("does not tell"));
    }
}
