//! What a soak leaves for its JSON document ([`Record`], a [`DeviceRecord`] per device), and the
//! document ([`document`]): per device the figures before and after, whose their change is, the
//! counters and the verdict; the process's fds; the totals.

use vkgdr::{RetainedKind, SlowRelease};

use super::command_line::Options;
use super::counters::Counters;
use super::figures::{checks, fds_check, Snapshot};
use super::verdict::Judgement;
use crate::device::Present;
use crate::json::document::About;
use crate::json::machine::{DeviceJson, MachineJson};
use crate::json::soak::{
    ClassificationJson, ProcessJson, RetainedChangeJson, RetainedJson, SlowReleaseJson,
    SoakCountersJson, SoakDeviceFiguresJson, SoakDeviceJson, SoakDocument, SoakFiguresJson,
    SoakOptionsJson,
};

/// What a run leaves for its JSON document.
#[derive(Default)]
pub(super) struct Record {
    /// Each device, in the order named.
    pub(super) devices: Vec<DeviceRecord>,
    /// The process's open fds after the warm-up.
    pub(super) fds_before: Option<usize>,
    /// And at the end.
    pub(super) fds_after: Option<usize>,
    /// How long the measured part ran.
    pub(super) seconds: f64,
    /// The workers' errors, the first [`ERRORS_KEPT`](super::counters::ERRORS_KEPT).
    pub(super) errors: Vec<String>,
}

/// What a run leaves of one device.
pub(super) struct DeviceRecord {
    pub(super) device: Present,
    /// Its smallest mapping ([`super::verdict`]).
    pub(super) granule: u64,
    pub(super) before: Option<Snapshot>,
    pub(super) after: Option<Snapshot>,
    pub(super) judgement: Option<Judgement>,
    /// What its workers did (warm-up errors included).
    pub(super) counters: SoakCountersJson,
}

impl DeviceRecord {
    /// A device about to be soaked.
    pub(super) fn new(device: Present, granule: u64) -> DeviceRecord {
        DeviceRecord {
            device,
            granule,
            before: None,
            after: None,
            judgement: None,
            counters: SoakCountersJson::default(),
        }
    }

    /// Why the device fails: what its figures say, and its workers' errors.
    pub(super) fn failures(&self) -> Vec<String> {
        let mut f = self
            .judgement
            .as_ref()
            .map_or_else(Vec::new, |j| j.failures.clone());
        let errors = self.counters.errors + self.counters.warm_up_errors;
        if errors > 0 {
            f.push(format!("{errors} errors in the workers"));
        }
        f
    }
}

fn figures_json(fds: Option<usize>, s: &Snapshot) -> SoakFiguresJson {
    SoakFiguresJson {
        open_fds: fds.unwrap_or(0) as u64,
        bar1_used_bytes: s.bar1_used,
        vram_free_bytes: s.vram_free,
    }
}

fn device_figures_json(s: &Snapshot) -> SoakDeviceFiguresJson {
    let (processes, processes_error) = match &s.processes {
        Ok(list) => (
            Some(
                list.iter()
                    .map(|p| ProcessJson {
                        pid: p.pid,
                        used_bytes: p.used_bytes,
                        compute: p.compute,
                        graphics: p.graphics,
                    })
                    .collect(),
            ),
            None,
        ),
        Err(e) => (None, Some(e.clone())),
    };
    SoakDeviceFiguresJson {
        bar1_used_bytes: s.bar1_used,
        vram_free_bytes: s.vram_free,
        processes,
        processes_error,
        retained: s
            .retained
            .items
            .iter()
            .map(|i| RetainedJson {
                name: i.name.into(),
                kind: match i.kind {
                    RetainedKind::Bar => "bar",
                    RetainedKind::Host => "host",
                    RetainedKind::DriverObjects => "driver_objects",
                    RetainedKind::Releases => "releases",
                    _ => "other",
                }
                .into(),
                count: i.count,
                bytes: i.bytes,
            })
            .collect(),
        event_fences_made: s.retained.event_fences_made,
        event_fences_peak: s.retained.event_fences_peak,
        longest_release_wait: s.releases.longest_wait.as_ref().map(slow_release_json),
        longest_release_turn: s.releases.longest_turn.as_ref().map(slow_release_json),
        longest_release_drop: s.releases.longest_drop.as_ref().map(slow_release_json),
    }
}

fn slow_release_json(s: &SlowRelease) -> SlowReleaseJson {
    SlowReleaseJson {
        micros: s.time.as_micros() as u64,
        what: s.what(),
    }
}

fn classification_json(j: &Judgement) -> ClassificationJson {
    ClassificationJson {
        came_back: j.came_back,
        bar1_used_change_bytes: j.bar1_change,
        vram_used_change_bytes: j.vram_change,
        ours_grown: j
            .ours_grown
            .iter()
            .map(|(b, a)| RetainedChangeJson {
                name: a.name.into(),
                count_before: b.count,
                count_after: a.count,
                bytes_before: b.bytes,
                bytes_after: a.bytes,
            })
            .collect(),
        ours_nvml_change_bytes: j.per_process.as_ref().ok().map(|p| p.ours_change()),
        per_process_error: j.per_process.as_ref().err().cloned(),
        other_processes: j
            .per_process
            .as_ref()
            .map_or_else(|_| Vec::new(), |p| p.others.clone()),
        residual: j.residual,
        event_fences_made: j.event_fences_made,
        event_fences_peak_before: j.event_fences_peak.0,
        event_fences_peak_after: j.event_fences_peak.1,
        lines: j.lines(),
    }
}

/// The soak's JSON document.
pub(super) fn document(
    options: &Options,
    record: &Record,
    passed: bool,
    error: Option<String>,
    machine: MachineJson,
) -> SoakDocument {
    let mut all_checks = Vec::new();
    if let (Some(b), Some(a)) = (record.fds_before, record.fds_after) {
        all_checks.push(fds_check(b, a));
    }
    for d in &record.devices {
        if let (Some(b), Some(a)) = (&d.before, &d.after) {
            all_checks.extend(checks(d.device.ordinal, b, a));
        }
    }
    let first = record.devices.first();
    let each: Vec<SoakCountersJson> = record.devices.iter().map(|d| d.counters.clone()).collect();
    SoakDocument {
        about: About::new("vkgdr-soak"),
        options: SoakOptionsJson {
            seconds: options.seconds,
            threads: options.threads,
            exhaust_every_seconds: options.exhaust_every,
            devices: options.devices.to_string(),
            xproc_producers: options.xproc.map(|x| x.producers),
            kill_every_seconds: options.xproc.map(|x| x.kill_every),
            d2h: options.d2h,
        },
        passed,
        error,
        gpu: first.map(|d| d.device.name.clone()),
        seconds: record.seconds,
        before: first
            .and_then(|d| d.before.as_ref())
            .map(|s| figures_json(record.fds_before, s)),
        after: first
            .and_then(|d| d.after.as_ref())
            .map(|s| figures_json(record.fds_after, s)),
        checks: all_checks,
        devices: record
            .devices
            .iter()
            .map(|d| SoakDeviceJson {
                device: DeviceJson::of(&d.device),
                passed: d.judgement.as_ref().is_some_and(Judgement::passed)
                    && d.counters.errors + d.counters.warm_up_errors == 0,
                granule_bytes: d.granule,
                before: d.before.as_ref().map(device_figures_json),
                after: d.after.as_ref().map(device_figures_json),
                classification: d.judgement.as_ref().map(classification_json),
                failures: d.failures(),
                counters: d.counters.clone(),
            })
            .collect(),
        counters: Counters::total(&each),
        errors: record.errors.clone(),
        machine,
    }
}

#[cfg(test)]
mod tests {
    use vkgdr::nvml::GpuProcess;
    use vkgdr::retained::names;
    use vkgdr::{ReleaseTimes, Retained, RetainedItem};

    use super::*;
    use crate::device::{tests::two_gpus, Devices};
    use crate::json::document::to_text;
    use crate::json::machine::tests::bare_machine;
    use crate::soak::verdict::judge;

    const ME: u32 = 4242;

    fn options() -> Options {
        Options {
            devices: Devices::All,
            seconds: 60,
            threads: 4,
            exhaust_every: 10,
            xproc: Some(crate::soak::xproc::XprocOptions {
                producers: 4,
                kill_every: 3,
            }),
            d2h: true,
        }
    }

    fn snapshot(bar1: u64, free: u64, others: &[(u32, u64)]) -> Snapshot {
        let mut procs = vec![GpuProcess {
            pid: ME,
            used_bytes: Some(600 << 20),
            compute: true,
            graphics: true,
        }];
        procs.extend(others.iter().map(|&(pid, used)| GpuProcess {
            pid,
            used_bytes: Some(used),
            compute: false,
            graphics: true,
        }));
        Snapshot {
            bar1_used: Some(bar1),
            vram_free: free,
            processes: Ok(procs),
            retained: Retained {
                items: vec![RetainedItem {
                    name: names::CARVED_GRANULES,
                    kind: RetainedKind::Bar,
                    count: 0,
                    bytes: 0,
                }],
                event_fences_made: 0,
                event_fences_peak: 0,
            },
            releases: ReleaseTimes {
                longest_wait: Some(SlowRelease {
                    time: std::time::Duration::from_micros(1500),
                    type_name: "vkgdr::mapping::arena::ReleasedChunk",
                }),
                ..ReleaseTimes::default()
            },
        }
    }

    fn device(ordinal: usize, before: Snapshot, after: Snapshot) -> DeviceRecord {
        let judgement = judge(&before, &after, ME, 2 << 20);
        DeviceRecord {
            before: Some(before),
            after: Some(after),
            judgement: Some(judgement),
            counters: SoakCountersJson {
                pool_ops: 1_000_000,
                ring_records: 5_000_000,
                bar_exhaustions: 6,
                most_held_at_exhaustion_bytes: (39 + ordinal as u64) << 30,
                exhaustions_refused_by: [("vkAllocateMemory".to_string(), 6)].into(),
                arena_refused_by: [
                    ("Arena::grow".to_string(), 3 + ordinal as u64),
                    ("vkAllocateMemory".to_string(), 5),
                ]
                .into(),
                xproc_producers_started: 12,
                xproc_producers_killed: 8,
                xproc_records_accepted: 700_000,
                xproc_records_checked: 700_000,
                ..Default::default()
            },
            ..DeviceRecord::new(two_gpus()[ordinal].clone(), 2 << 20)
        }
    }

    #[test]
    fn a_soak_of_two_devices_reads_back_with_each_devices_verdict() {
        // Device 0: another process went away (lower is back). Device 1: the driver kept 64 KiB.
        let d0 = device(
            0,
            snapshot(591 << 20, 80 << 30, &[(77, 17 << 20)]),
            snapshot(574 << 20, (80 << 30) + (17 << 20), &[]),
        );
        let d1 = device(
            1,
            snapshot(574 << 20, 80 << 30, &[]),
            snapshot((574 << 20) + (64 << 10), (80 << 30) - (64 << 10), &[]),
        );
        let record = Record {
            devices: vec![d0, d1],
            fds_before: Some(68),
            fds_after: Some(68),
            seconds: 60.2,
            errors: Vec::new(),
        };
        let doc = document(&options(), &record, true, None, bare_machine());
        let text = to_text(&doc);
        let back: SoakDocument = serde_json::from_str(&text).unwrap();
        assert_eq!(back, doc);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["format"], "vkgdr-soak");
        assert_eq!(v["passed"], true);
        assert_eq!(v["options"]["devices"], "all");
        assert_eq!(v["gpu"], "NVIDIA H200");
        assert_eq!(v["before"]["open_fds"], 68);
        assert_eq!(v["before"]["bar1_used_bytes"], 591u64 << 20);
        // fds, then two figures per device.
        let checks = v["checks"].as_array().unwrap();
        assert_eq!(checks.len(), 5);
        assert!(checks[0]["device"].is_null() && checks[0]["figure"] == "open_fds");
        assert_eq!(checks[1]["device"], 0);
        assert_eq!(checks[4]["device"], 1);
        assert_eq!(checks[1]["came_back"], true, "lower is back");
        assert_eq!(checks[3]["came_back"], false);
        // The totals add the devices up.
        assert_eq!(v["counters"]["pool_ops"], 2_000_000);
        assert_eq!(v["options"]["xproc_producers"], 4);
        assert_eq!(v["options"]["d2h"], true);
        assert_eq!(v["options"]["kill_every_seconds"], 3);
        assert_eq!(v["counters"]["xproc_producers_killed"], 16);
        assert_eq!(v["counters"]["xproc_records_checked"], 1_400_000);
        assert_eq!(v["counters"]["xproc_lane_faults"], 0);
        assert_eq!(v["counters"]["most_held_at_exhaustion_bytes"], 40u64 << 30);
        assert_eq!(
            v["counters"]["exhaustions_refused_by"]["vkAllocateMemory"],
            12
        );
        assert_eq!(v["counters"]["arena_refused_by"]["Arena::grow"], 7);
        assert_eq!(v["counters"]["arena_refused_by"]["vkAllocateMemory"], 10);
        let devices = v["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 2);
        let wait = &devices[0]["after"]["longest_release_wait"];
        assert_eq!(
            (wait["micros"].as_u64(), wait["what"].as_str()),
            (Some(1500), Some("ReleasedChunk"))
        );
        assert!(devices[0]["after"]["longest_release_drop"].is_null());
        assert_eq!(devices[1]["device"]["ordinal"], 1);
        assert_eq!(
            devices[1]["device"]["uuid"],
            "0badcafe-0000-1111-2222-333344445555"
        );
        assert_eq!(devices[0]["passed"], true);
        let c0 = &devices[0]["classification"];
        assert_eq!(c0["came_back"], true);
        assert_eq!(c0["other_processes"][0]["pid"], 77);
        assert!(c0["other_processes"][0]["after_bytes"].is_null());
        assert_eq!(c0["other_processes"][0]["change_bytes"], -(17i64 << 20));
        assert_eq!(c0["ours_nvml_change_bytes"], 0);
        let c1 = &devices[1]["classification"];
        assert_eq!(c1["residual"]["whose"], "driver");
        assert_eq!(c1["residual"]["bar1_bytes"], 64 << 10);
        assert!(c1["lines"].as_array().unwrap().contains(
            &"driver-internal: +64 KiB BAR1, +64 KiB VRAM, our inventory unchanged".into()
        ));
        assert_eq!(
            devices[1]["after"]["retained"][0]["name"],
            "carved granules"
        );
        assert_eq!(devices[1]["after"]["processes"][0]["pid"], ME);
    }

    #[test]
    fn a_device_that_kept_something_fails_with_its_reason() {
        let before = snapshot(574 << 20, 80 << 30, &[]);
        let mut after = snapshot(578 << 20, (80 << 30) - (2 << 20), &[]);
        after.retained.items[0].count = 1;
        after.retained.items[0].bytes = 2 << 20;
        let record = Record {
            devices: vec![device(0, before, after)],
            fds_before: Some(41),
            fds_after: Some(43),
            ..Default::default()
        };
        let doc = document(&options(), &record, false, None, bare_machine());
        let d = &doc.devices[0];
        assert!(!d.passed);
        assert!(
            d.failures[0].contains("carved granules: 0 -> 1"),
            "{:?}",
            d.failures
        );
        let c = d.classification.as_ref().unwrap();
        assert_eq!(c.ours_grown[0].bytes_after, 2 << 20);
        assert_eq!(c.residual.unwrap().whose, crate::json::soak::Whose::Ours);
        let fds = &doc.checks[0];
        assert_eq!((fds.device, fds.change, fds.came_back), (None, 2, false));
        assert_eq!(doc.checks[1].device, Some(0));
    }

    #[test]
    fn a_soak_that_could_not_start_says_why() {
        let doc = document(
            &options(),
            &Record::default(),
            false,
            Some("no CUDA driver".into()),
            bare_machine(),
        );
        assert!(doc.checks.is_empty() && doc.before.is_none() && doc.devices.is_empty());
        let text = to_text(&doc);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"], "no CUDA driver");
        assert_eq!(v["passed"], false);
    }
}
