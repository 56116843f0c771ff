//! What the registry says about each report a benchmark writes ([`ReportSpec`]): its title, its
//! table [`Layout`], the [`Anchor`] its figures are compared with and its rows of the machine
//! alone.

/// How a report is laid out as a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// One row per size, one column per method (medians; latencies with p10–p90).
    Wide,
    /// One row per method and size with median, p10, p90 and sample count.
    #[default]
    Long,
}

/// What the registry ([`BENCHMARKS`](crate::bench::registry::BENCHMARKS)) says about one report a
/// benchmark writes: its file stem, its title, its table layout and what its figures are compared
/// with. Every row it names is a constant of the benchmark that writes the row (its `rows`
/// module), so a renamed row does not compile until the registry follows.
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
    /// The rows that time the driver or the hardware alone, with no code of this library in them
    /// (`cuMemAlloc`, a DMA copy): their origin is `machine` in the JSON results, and a
    /// comparison reports their moves as the machine's, never as a regression (lent machines of
    /// one model differ by a quarter and more on driver calls).
    pub machine: &'static [Rows<'static>],
}

impl ReportSpec {
    /// Whether rows of `method` time the driver or the hardware alone.
    pub fn is_machine(&self, method: &str) -> bool {
        self.machine.iter().any(|p| p.matches(method))
    }
}

/// Rows of a report, as the registry names them: by the constants their benchmark writes them
/// with, one or a family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows<'a> {
    /// The row of this name.
    Is(&'a str),
    /// The rows of these names.
    AnyOf(&'a [&'a str]),
    /// Every row whose name starts with this: a family the benchmark names by a common start
    /// (a driver API's calls, `cu…`).
    StartingWith(&'a str),
    /// Every row whose name ends with this: a row whose count varies with the options
    /// (`16 kernels over separate chunks`).
    EndingWith(&'a str),
}

impl Rows<'_> {
    /// Whether the row `method` is one of these.
    pub fn matches(self, method: &str) -> bool {
        match self {
            Rows::Is(name) => method == name,
            Rows::AnyOf(names) => names.contains(&method),
            Rows::StartingWith(start) => method.starts_with(start),
            Rows::EndingWith(end) => method.ends_with(end),
        }
    }
}

impl std::fmt::Display for Rows<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rows::Is(name) => write!(f, "{name:?}"),
            Rows::AnyOf(names) => write!(f, "{names:?}"),
            Rows::StartingWith(start) => write!(f, "{start:?}…"),
            Rows::EndingWith(end) => write!(f, "…{end:?}"),
        }
    }
}

/// The anchor of a figure: the row it is compared with, measured in the same run at the same
/// size (the driver's own copy, the raw limit, the path it replaces), so a ratio holds even when
/// machines differ from run to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    /// The figures stand alone.
    None,
    /// Every other row is compared with this one.
    Method(&'static str),
    /// Each `(rows, anchor)` pair: those rows are compared with the anchor's row; rows not
    /// listed stand alone.
    Pairs(&'static [(Rows<'static>, Rows<'static>)]),
    /// Each row is compared with the row of the same name in this other report of the same run.
    SameMethodIn(&'static str),
}

impl Anchor {
    /// The report and the row that a row of `method` in report `report` is compared with, if
    /// any.
    pub fn of<'a>(&self, report: &'a str, method: &'a str) -> Option<(&'a str, Rows<'a>)> {
        match *self {
            Anchor::None => None,
            Anchor::Method(m) => (m != method).then_some((report, Rows::Is(m))),
            Anchor::Pairs(pairs) => pairs
                .iter()
                .find(|(rows, _)| rows.matches(method))
                .map(|&(_, a)| (report, a)),
            Anchor::SameMethodIn(other) => (other != report).then_some((other, Rows::Is(method))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchor_rules() {
        let pairs = Anchor::Pairs(&[
            (Rows::Is("a"), Rows::EndingWith(" b")),
            (Rows::EndingWith(" end"), Rows::Is("c")),
        ]);
        assert_eq!(pairs.of("r", "a"), Some(("r", Rows::EndingWith(" b"))));
        assert_eq!(pairs.of("r", "16 at the end"), Some(("r", Rows::Is("c"))));
        assert_eq!(pairs.of("r", "b"), None);
        let method = Anchor::Method("base");
        assert_eq!(method.of("r", "x"), Some(("r", Rows::Is("base"))));
        assert_eq!(method.of("r", "base"), None);
        let same = Anchor::SameMethodIn("idle");
        assert_eq!(same.of("busy", "call"), Some(("idle", Rows::Is("call"))));
        assert_eq!(same.of("idle", "call"), None);
        assert_eq!(Anchor::None.of("r", "x"), None);
    }

    #[test]
    fn rows_match_names_families_and_ends() {
        assert!(Rows::Is("cuMemAlloc").matches("cuMemAlloc"));
        assert!(!Rows::Is("cuMemAlloc").matches("cuMemAlloc_v2"));
        assert!(Rows::AnyOf(&["a", "b"]).matches("b"));
        assert!(!Rows::AnyOf(&["a", "b"]).matches("c"));
        assert!(Rows::EndingWith(" per copy").matches("cuMemcpyHtoDAsync, 256 per copy"));
        assert!(Rows::StartingWith("cu").matches("cuMemFree_v2 (imported buffer)"));
        assert!(!Rows::StartingWith("cu").matches("Gpu::alloc"));
        assert_eq!(Rows::StartingWith("cu").to_string(), "\"cu\"…");
        let spec = ReportSpec {
            name: "r",
            title: "R",
            layout: Layout::Long,
            anchor: Anchor::None,
            machine: &[Rows::AnyOf(&["step: a", "step: b"]), Rows::Is("cuMemAlloc")],
        };
        assert!(spec.is_machine("step: b"));
        assert!(spec.is_machine("cuMemAlloc"));
        assert!(!spec.is_machine("pool chunk alloc"));
    }
}
