//! What the workers did ([`Counters`]), counted as they go, and the errors they met.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use indicatif::HumanCount;

use crate::json::soak::SoakCountersJson;
use crate::ui::alert;

/// The most worker errors kept for the JSON document (all are printed).
pub(super) const ERRORS_KEPT: usize = 100;

/// What the workers did.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) pool_ops: AtomicU64,
    pub(super) pool_oom: AtomicU64,
    pub(super) ring_records: AtomicU64,
    pub(super) ring_full_waits: AtomicU64,
    pub(super) arena_cycles: AtomicU64,
    pub(super) arena_oom: AtomicU64,
    pub(super) raw_ops: AtomicU64,
    pub(super) raw_oom: AtomicU64,
    pub(super) exhaustions: AtomicU64,
    /// The most bytes raw allocations held when the BAR refused the next one.
    pub(super) exhausted_at: AtomicU64,
    /// Wrong data found, or a worker's unexpected error: each one is printed.
    pub(super) failures: AtomicU64,
    /// The first [`ERRORS_KEPT`] of them, for the JSON document.
    pub(super) messages: Mutex<Vec<String>>,
}

impl Counters {
    /// Prints an error and counts it (wrong data, or a worker's unexpected error).
    pub(super) fn fail(&self, what: String) {
        alert!("SOAK ERROR: {what}");
        self.failures.fetch_add(1, Ordering::Relaxed);
        let mut kept = self.messages.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() < ERRORS_KEPT {
            kept.push(what);
        }
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
            errors: n(&self.failures),
            warm_up_errors,
        }
    }

    /// One line for the progress bar.
    pub(super) fn progress_line(&self) -> String {
        let n = |a: &AtomicU64| HumanCount(a.load(Ordering::Relaxed));
        format!(
            "pool {} ops · ring {} records · arena {} cycles · raw {} · {} exhaustions · {} errors",
            n(&self.pool_ops),
            n(&self.ring_records),
            n(&self.arena_cycles),
            n(&self.raw_ops),
            n(&self.exhaustions),
            n(&self.failures),
        )
    }
}
