//! What the registry says about each report a benchmark writes ([`ReportSpec`]): its title, its
//! table [`Layout`] and the [`Anchor`] its figures are compared with.

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
}

/// The anchor of a figure: the row it is compared with, measured in the same run at the same
/// size (the driver's own copy, the raw limit, the path it replaces), so a ratio holds even when
/// machines differ from run to run. A method pattern is a method name, or `*` and the end of one.
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

/// Whether `method` matches `pattern` (a name, or `*` and the end of one).
pub fn method_matches(pattern: &str, method: &str) -> bool {
    match pattern.strip_prefix('*') {
        Some(end) => method.ends_with(end),
        None => method == pattern,
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
}
