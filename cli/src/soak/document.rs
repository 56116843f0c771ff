//! What a soak leaves for its JSON document ([`Record`]), and the document ([`document`]): the
//! figures before and after, each check, the counters and the verdict.

use super::command_line::Options;
use super::figures::{checks, Figures};
use crate::json::document::About;
use crate::json::machine::MachineJson;
use crate::json::soak::{
    SoakCheckJson, SoakCountersJson, SoakDocument, SoakFiguresJson, SoakOptionsJson,
};

/// What a run leaves for its JSON document.
#[derive(Default)]
pub(super) struct Record {
    pub(super) gpu: Option<String>,
    pub(super) before: Option<Figures>,
    pub(super) after: Option<Figures>,
    pub(super) seconds: f64,
    pub(super) counters: SoakCountersJson,
    pub(super) errors: Vec<String>,
}

fn figures_json(f: &Figures) -> SoakFiguresJson {
    SoakFiguresJson {
        open_fds: f.fds as u64,
        bar1_used_bytes: f.bar1_used,
        vram_free_bytes: f.vram_free,
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
    let checks = match (&record.before, &record.after) {
        (Some(b), Some(a)) => checks(b, a)
            .iter()
            .map(|c| SoakCheckJson {
                figure: c.figure.into(),
                unit: c.unit.into(),
                before: c.before,
                after: c.after,
                change: c.change,
                came_back: c.came_back(),
            })
            .collect(),
        _ => Vec::new(),
    };
    SoakDocument {
        about: About::new("vkgdr-soak"),
        options: SoakOptionsJson {
            seconds: options.seconds,
            threads: options.threads,
            exhaust_every_seconds: options.exhaust_every,
        },
        passed,
        error,
        gpu: record.gpu.clone(),
        seconds: record.seconds,
        before: record.before.as_ref().map(figures_json),
        after: record.after.as_ref().map(figures_json),
        checks,
        counters: record.counters.clone(),
        errors: record.errors.clone(),
        machine,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::document::to_text;
    use crate::json::machine::tests::bare_machine;

    fn options() -> Options {
        Options {
            seconds: 60,
            threads: 4,
            exhaust_every: 10,
        }
    }

    #[test]
    fn a_passed_soak_is_a_document_that_reads_back() {
        let before = Figures {
            fds: 41,
            bar1_used: Some(4 << 20),
            vram_free: 80 << 30,
        };
        let record = Record {
            gpu: Some("NVIDIA H100 80GB HBM3".into()),
            before: Some(before),
            after: Some(before),
            seconds: 60.2,
            counters: SoakCountersJson {
                pool_ops: 1_000_000,
                ring_records: 5_000_000,
                bar_exhaustions: 6,
                most_held_at_exhaustion_bytes: 39 << 30,
                ..Default::default()
            },
            errors: Vec::new(),
        };
        let doc = document(&options(), &record, true, None, bare_machine());
        let text = to_text(&doc);
        let back: SoakDocument = serde_json::from_str(&text).unwrap();
        assert_eq!(back, doc);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["format"], "vkgdr-soak");
        assert_eq!(v["passed"], true);
        assert_eq!(v["options"]["exhaust_every_seconds"], 10);
        assert_eq!(v["before"]["bar1_used_bytes"], 4 << 20);
        assert_eq!(v["counters"]["most_held_at_exhaustion_bytes"], 39u64 << 30);
        let checks = v["checks"].as_array().unwrap();
        assert_eq!(checks.len(), 3);
        assert!(checks
            .iter()
            .all(|c| c["came_back"] == true && c["change"] == 0));
    }

    #[test]
    fn a_figure_that_did_not_come_back_is_named_with_its_change() {
        let before = Figures {
            fds: 41,
            bar1_used: None,
            vram_free: 10_000,
        };
        let after = Figures {
            fds: 43,
            bar1_used: None,
            vram_free: 10_000 - 2 * 1024,
        };
        let record = Record {
            before: Some(before),
            after: Some(after),
            ..Default::default()
        };
        let doc = document(&options(), &record, false, None, bare_machine());
        let by_name = |n: &str| doc.checks.iter().find(|c| c.figure == n).unwrap().clone();
        assert_eq!(by_name("open_fds").change, 2);
        assert!(!by_name("open_fds").came_back);
        assert_eq!(by_name("vram_free").change, -2048);
        assert_eq!(
            (by_name("open_fds").unit, by_name("vram_free").unit),
            ("fds".into(), "bytes".into())
        );
        // No NVML: BAR1 is unknown, which is not a failure.
        assert_eq!(by_name("bar1_used").before, None);
        assert!(by_name("bar1_used").came_back);
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
        assert!(doc.checks.is_empty() && doc.before.is_none());
        let text = to_text(&doc);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"], "no CUDA driver");
        assert_eq!(v["passed"], false);
    }
}
