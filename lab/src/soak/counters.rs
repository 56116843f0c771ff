//! What the workers did ([`Counters`]), counted as they go, and the errors they met.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use indicatif::HumanCount;

use crate::json::soak::SoakCountersJson;
use crate::ui::alert;

/// The most worker errors kept for the JSON document (all are printed).
pub(super) const ERRORS_KEPT: usize = 100;

/// What the workers of one device did.
#[derive(Default)]
pub(super) struct Counters {
    /// The device's tag in messages (`[1]`; empty when the soak has one device).
    pub(super) tag: String,
    pub(super) pool_ops: AtomicU64,
    pub(super) pool_oom: AtomicU64,
    pub(super) ring_records: AtomicU64,
    pub(super) ring_full_waits: AtomicU64,
    pub(super) arena_cycles: AtomicU64,
    pub(super) arena_oom: AtomicU64,
    /// What refused each of those growths (the driver call, or `Arena::grow` for the arena's
    /// own limits: a slot whose previous chunk is still being released), and how often.
    pub(super) arena_refused_by: Mutex<std::collections::BTreeMap<String, u64>>,
    pub(super) raw_ops: AtomicU64,
    pub(super) raw_oom: AtomicU64,
    pub(super) exhaustions: AtomicU64,
    /// The most bytes raw allocations held when the BAR refused the next one.
    pub(super) exhausted_at: AtomicU64,
    /// Which driver call refused each exhaustion's last allocation (Vulkan's allocation or
    /// CUDA's import or mapping of it), and how often.
    pub(super) refused_by: Mutex<std::collections::BTreeMap<String, u64>>,
    /// Device → host records checked by the CPU consumers.
    pub(super) d2h_records: AtomicU64,
    /// Pool blocks released by kernels and back (each token redeemed once).
    pub(super) device_releases: AtomicU64,
    /// Spent and forged tokens sent by kernels and refused, as they must be.
    pub(super) hostile_tokens: AtomicU64,
    /// With `--xproc`: producer processes started, and killed.
    pub(super) xproc_started: AtomicU64,
    pub(super) xproc_killed: AtomicU64,
    /// Records the owner accepted from them (their reports), and records the kernel checked.
    pub(super) xproc_accepted: AtomicU64,
    pub(super) xproc_checked: AtomicU64,
    /// Tails of theirs the owner refused.
    pub(super) xproc_lane_faults: AtomicU64,
    /// Wrong data found, or a worker's unexpected error: each one is printed.
    pub(super) failures: AtomicU64,
    /// The first [`ERRORS_KEPT`] of them, for the JSON document.
    pub(super) messages: Mutex<Vec<String>>,
}

impl Counters {
    /// Prints an error and counts it (wrong data, or a worker's unexpected error).
    pub(super) fn fail(&self, what: String) {
        let what = match self.tag.as_str() {
            "" => what,
            tag => format!("{tag} {what}"),
        };
        alert!("SOAK ERROR: {what}");
        self.failures.fetch_add(1, Ordering::Relaxed);
        let mut kept = self.messages.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() < ERRORS_KEPT {
            kept.push(what);
        }
    }

    /// `soak`, or `soak [1]` on a soak of several devices: how its lines start.
    pub(super) fn soak(&self) -> String {
        match self.tag.as_str() {
            "" => "soak".into(),
            tag => format!("soak {tag}"),
        }
    }

    /// Counters for the device tagged `tag`.
    pub(super) fn tagged(tag: &str) -> Counters {
        Counters {
            tag: tag.to_string(),
            ..Default::default()
        }
    }

    /// The errors kept so far.
    pub(super) fn kept(&self) -> Vec<String> {
        self.messages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Several devices' counters added up, as the JSON document has them (the most held at an
    /// exhaustion: the most on any device).
    pub(super) fn total(each: &[SoakCountersJson]) -> SoakCountersJson {
        each.iter()
            .fold(SoakCountersJson::default(), |t, c| SoakCountersJson {
                pool_ops: t.pool_ops + c.pool_ops,
                pool_out_of_memory: t.pool_out_of_memory + c.pool_out_of_memory,
                ring_records: t.ring_records + c.ring_records,
                ring_full_waits: t.ring_full_waits + c.ring_full_waits,
                arena_cycles: t.arena_cycles + c.arena_cycles,
                arena_out_of_memory: t.arena_out_of_memory + c.arena_out_of_memory,
                raw_allocations: t.raw_allocations + c.raw_allocations,
                raw_out_of_memory: t.raw_out_of_memory + c.raw_out_of_memory,
                bar_exhaustions: t.bar_exhaustions + c.bar_exhaustions,
                most_held_at_exhaustion_bytes: t
                    .most_held_at_exhaustion_bytes
                    .max(c.most_held_at_exhaustion_bytes),
                exhaustions_refused_by: merged(t.exhaustions_refused_by, &c.exhaustions_refused_by),
                arena_refused_by: merged(t.arena_refused_by, &c.arena_refused_by),
                d2h_records_checked: t.d2h_records_checked + c.d2h_records_checked,
                device_releases: t.device_releases + c.device_releases,
                hostile_tokens_refused: t.hostile_tokens_refused + c.hostile_tokens_refused,
                xproc_producers_started: t.xproc_producers_started + c.xproc_producers_started,
                xproc_producers_killed: t.xproc_producers_killed + c.xproc_producers_killed,
                xproc_records_accepted: t.xproc_records_accepted + c.xproc_records_accepted,
                xproc_records_checked: t.xproc_records_checked + c.xproc_records_checked,
                xproc_lane_faults: t.xproc_lane_faults + c.xproc_lane_faults,
                errors: t.errors + c.errors,
                warm_up_errors: t.warm_up_errors + c.warm_up_errors,
            })
    }

    /// The counters as the JSON document has them.
    pub(super) fn json(&self, warm_up_errors: u64) -> SoakCountersJson {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SoakCountersJson {
            pool_ops: n(&self.pool_ops),
            pool_out_of_memory: n(&self.pool_oom),
            ring_records: n(&self.ring_records),
            ring_full_waits: n(&self.ring_full_waits),
            arena_cycles: n(&self.arena_cycles),
            arena_out_of_memory: n(&self.arena_oom),
            raw_allocations: n(&self.raw_ops),
            raw_out_of_memory: n(&self.raw_oom),
            bar_exhaustions: n(&self.exhaustions),
            most_held_at_exhaustion_bytes: n(&self.exhausted_at),
            exhaustions_refused_by: self
                .refused_by
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            arena_refused_by: self
                .arena_refused_by
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            d2h_records_checked: n(&self.d2h_records),
            device_releases: n(&self.device_releases),
            hostile_tokens_refused: n(&self.hostile_tokens),
            xproc_producers_started: n(&self.xproc_started),
            xproc_producers_killed: n(&self.xproc_killed),
            xproc_records_accepted: n(&self.xproc_accepted),
            xproc_records_checked: n(&self.xproc_checked),
            xproc_lane_faults: n(&self.xproc_lane_faults),
            errors: n(&self.failures),
            warm_up_errors,
        }
    }

    /// One line for the progress bar.
    pub(super) fn progress_line(&self) -> String {
        let n = |a: &AtomicU64| HumanCount(a.load(Ordering::Relaxed));
        let xproc = if self.xproc_started.load(Ordering::Relaxed) > 0 {
            format!(
                " · xproc {} started {} killed {} records",
                n(&self.xproc_started),
                n(&self.xproc_killed),
                n(&self.xproc_accepted)
            )
        } else {
            String::new()
        };
        format!(
            "pool {} ops · ring {} records · d2h {} records · {} device releases · arena {} cycles · raw {} · {} exhaustions{xproc} · {} errors",
            n(&self.pool_ops),
            n(&self.ring_records),
            n(&self.d2h_records),
            n(&self.device_releases),
            n(&self.arena_cycles),
            n(&self.raw_ops),
            n(&self.exhaustions),
            n(&self.failures),
        )
    }

    /// With `--d2h`: what the device → host workers did, for the summary.
    pub(super) fn d2h_line(&self) -> String {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "{} records from kernels checked by CPU consumers, {} blocks released by kernels and \
             back, {} hostile tokens refused",
            n(&self.d2h_records),
            n(&self.device_releases),
            n(&self.hostile_tokens)
        )
    }

    /// With `--xproc`: what the producer processes did, for the status lines.
    pub(super) fn xproc_line(&self) -> String {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "{} producer processes started, {} killed, {} records accepted, {} checked by the kernel, {} lane faults",
            n(&self.xproc_started),
            n(&self.xproc_killed),
            n(&self.xproc_accepted),
            n(&self.xproc_checked),
            n(&self.xproc_lane_faults)
        )
    }
}

/// `into` with `from`'s counts added, key by key.
fn merged(
    mut into: std::collections::BTreeMap<String, u64>,
    from: &std::collections::BTreeMap<String, u64>,
) -> std::collections::BTreeMap<String, u64> {
    for (key, n) in from {
        *into.entry(key.clone()).or_default() += n;
    }
    into
}
