//! What the registry says about each report a benchmark writes ([`ReportSpec`]): its title, its
//! table [`Layout`], the [`Anchor`] its figures are compared with, and the [`MachineWork`] that
//! rows of this library are made of (driver calls, BAR stores and loads).

/// How a report is laid out as a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One row per size, one column per method (medians; latencies with p10–p90).
    Wide,
    /// One row per method and size with median, p10, p90 and sample count.
    Long,
}

/// What the registry ([`BENCHMARKS`](crate::bench::registry::BENCHMARKS)) says about one report a
/// benchmark writes: its file stem, its title, its table layout and what its figures are compared
/// with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportSpec {
    /// File stem of the CSV and PNG, and [`Report::name`](super::model::Report::name).
    pub name: &'static str,
    /// Human title of tables and charts.
    pub title: &'static str,
    /// How the table is laid out.
    pub layout: Layout,
    /// The row each figure is compared with in the JSON results.
    pub anchor: Anchor,
    /// Method patterns of the rows that time the driver or the hardware alone, with no code of
    /// this library in them (`cuMemAlloc`, a DMA copy): their origin is `machine` in the JSON
    /// results, and a comparison reports their moves as the machine's, never as a regression
    /// (lent machines of one model differ by a quarter and more on driver calls).
    pub machine: &'static [&'static str],
    /// Rows of this library that are mostly the machine's work (driver calls: an allocation of
    /// whole chunks, a drop that gives them back, a module load; or the CPU's stores and loads
    /// through the BAR), each with the machine rows that time that work in the same run: a
    /// comparison judges such a row's move against theirs as well as on its own, so a machine
    /// whose driver or BAR is slower does not make the library look worse. The first entry whose
    /// pattern matches a method applies.
    pub machine_work: &'static [MachineWork],
}

impl ReportSpec {
    /// Whether rows of `method` time the driver or the hardware alone.
    pub fn is_machine(&self, method: &str) -> bool {
        self.machine.iter().any(|p| method_matches(p, method))
    }

    /// The machine work that rows of `method` are made of, if the registry names it.
    pub fn machine_work_of(&self, method: &str) -> Option<&'static MachineWork> {
        self.machine_work
            .iter()
            .find(|w| method_matches(w.rows, method))
    }
}

/// The machine work a library row is made of: machine rows (origin `machine`) of the same report,
/// measured beside it in the same run at the row's size, whose medians add up to what the
/// library's call leaves to the machine (the driver calls it makes, or the same bytes stored or
/// loaded through the BAR by a plain loop). A comparison divides the row's move by the move of
/// that sum (its *anchored* move): a machine whose driver or BAR is 40 % slower moves both alike,
/// and the library's own share stays put.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MachineWork {
    /// Method pattern of the library's rows (see [`method_matches`]).
    pub rows: &'static str,
    /// Method patterns of the machine rows of the same report, one per driver call (or group of
    /// calls timed together, or raw copy); every one must be found at the row's size, else the
    /// row stands alone.
    pub made_of: &'static [&'static str],
}

/// The anchor of a figure: the row it is compared with, measured in the same run at the same
/// size (the driver's own copy, the raw limit, the path it replaces), so a ratio holds even when
/// machines differ from run to run. A method pattern: see [`method_matches`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    /// The figures stand alone.
    None,
    /// Every other method is compared with this one.
    Method(&'static str),
    /// Each `(method, anchor)` pair: rows of the first are compared with the second; methods not
    /// listed stand alone.
    Pairs(&'static [(&'static str, &'static str)]),
    /// Each method is compared with the same method in this other report of the same run.
    SameMethodIn(&'static str),
}

/// Whether `method` matches `pattern`: a name, `*` and the end of one, or the start of one and
/// `*`.
pub fn method_matches(pattern: &str, method: &str) -> bool {
    if let Some(end) = pattern.strip_prefix('*') {
        method.ends_with(end)
    } else if let Some(start) = pattern.strip_suffix('*') {
        method.starts_with(start)
    } else {
        method == pattern
    }
}

impl Anchor {
    /// The report and the method pattern that a row of `method` in report `report` is compared
    /// with, if any.
    pub fn of<'a>(&self, report: &'a str, method: &'a str) -> Option<(&'a str, &'a str)> {
        match *self {
            Anchor::None => None,
            Anchor::Method(m) => (!method_matches(m, method)).then_some((report, m)),
            Anchor::Pairs(pairs) => pairs
                .iter()
                .find(|(m, _)| method_matches(m, method))
                .map(|&(_, a)| (report, a)),
            Anchor::SameMethodIn(other) => (other != report).then_some((other, method)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchor_rules() {
        let pairs = Anchor::Pairs(&[("a", "b"), ("* end", "c")]);
        assert_eq!(pairs.of("r", "a"), Some(("r", "b")));
        assert_eq!(pairs.of("r", "16 at the end"), Some(("r", "c")));
        assert_eq!(pairs.of("r", "b"), None);
        let method = Anchor::Method("base");
        assert_eq!(method.of("r", "x"), Some(("r", "base")));
        assert_eq!(method.of("r", "base"), None);
        let same = Anchor::SameMethodIn("idle");
        assert_eq!(same.of("busy", "call"), Some(("idle", "call")));
        assert_eq!(same.of("idle", "call"), None);
        assert_eq!(Anchor::None.of("r", "x"), None);
    }

    #[test]
    fn patterns_match_names_ends_and_starts() {
        assert!(method_matches("cuMemAlloc", "cuMemAlloc"));
        assert!(!method_matches("cuMemAlloc", "cuMemAlloc_v2"));
        assert!(method_matches(
            "* per copy",
            "cuMemcpyHtoDAsync, 256 per copy"
        ));
        assert!(method_matches("cu*", "cuMemFree_v2 (imported buffer)"));
        assert!(!method_matches("cu*", "Gpu::alloc"));
        let spec = ReportSpec {
            name: "r",
            title: "R",
            layout: Layout::Long,
            anchor: Anchor::None,
            machine: &["step: *", "cuMemAlloc"],
            machine_work: &[
                MachineWork {
                    rows: "pool chunk alloc*",
                    made_of: &["step: vkAllocateMemory*", "step: cuMemMap*"],
                },
                MachineWork {
                    rows: "pool chunk *",
                    made_of: &["step: cuMemUnmap"],
                },
            ],
        };
        assert!(spec.is_machine("step: cuMemMap + cuMemSetAccess"));
        assert!(spec.is_machine("cuMemAlloc"));
        assert!(!spec.is_machine("pool chunk alloc (library, whole)"));
        // The first machine-work entry that matches applies.
        let alloc = spec
            .machine_work_of("pool chunk alloc (library, whole)")
            .unwrap();
        assert_eq!(alloc.made_of.len(), 2);
        let free = spec.machine_work_of("pool chunk free").unwrap();
        assert_eq!(free.made_of, ["step: cuMemUnmap"]);
        assert!(spec.machine_work_of("cuMemAlloc").is_none());
    }
}
