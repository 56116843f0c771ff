//! A report as a table: aligned plain text for the console ([`Report::text_table`]), markdown
//! ([`Report::markdown`]), and `summary.md`, every report's markdown under the machine's facts
//! ([`summary_markdown`]).

use std::fmt::Write as _;

use super::format::{align, column_widths, fmt_bytes, fmt_ns, fmt_ns_range, fmt_size, sig3};
use super::model::{Figure, Report, Unit};
use super::spec::Layout;

impl Report {
    fn cells(&self) -> (Vec<String>, Vec<Vec<String>>) {
        match self.layout() {
            Layout::Wide => {
                let methods = self.methods();
                let mut header = vec!["size".to_string()];
                header.extend(methods.iter().map(|m| m.to_string()));
                let body = self
                    .sizes()
                    .into_iter()
                    .map(|size| {
                        let mut line = vec![fmt_size(size)];
                        line.extend(methods.iter().map(|m| match self.get(m, size) {
                            Some(r) => self.wide_cell(r),
                            None => "–".to_string(),
                        }));
                        line
                    })
                    .collect();
                (header, body)
            }
            Layout::Long => {
                let u = self.unit.csv_name();
                let header = vec![
                    "method".to_string(),
                    "size".to_string(),
                    format!("median {u}"),
                    "p10".to_string(),
                    "p90".to_string(),
                    "samples".to_string(),
                ];
                let body = self
                    .figures
                    .iter()
                    .map(|r| {
                        let f = |v| self.unit.format(v);
                        if r.is_reference() {
                            vec![
                                r.method.clone(),
                                fmt_size(r.size),
                                f(r.median),
                                "".into(),
                                "".into(),
                                "reference".into(),
                            ]
                        } else {
                            vec![
                                r.method.clone(),
                                fmt_size(r.size),
                                f(r.median),
                                f(r.p10),
                                f(r.p90),
                                r.samples.to_string(),
                            ]
                        }
                    })
                    .collect();
                (header, body)
            }
        }
    }

    fn wide_cell(&self, r: &Figure) -> String {
        match self.unit {
            Unit::GigabytesPerSecond => sig3(r.median),
            Unit::Bytes => fmt_bytes(r.median),
            Unit::Nanoseconds if r.is_reference() => fmt_ns(r.median),
            Unit::Nanoseconds => fmt_ns_range(r.median, r.p10, r.p90),
        }
    }

    fn legend(&self) -> String {
        match (self.unit, self.layout()) {
            (Unit::GigabytesPerSecond, _) => "GB/s (10⁹ bytes/s), median over samples".into(),
            (Unit::Bytes, _) => "memory held, median over samples".into(),
            (Unit::Nanoseconds, Layout::Wide) => "median (p10–p90) per operation".into(),
            (Unit::Nanoseconds, Layout::Long) => "time per call".into(),
        }
    }

    /// The table as aligned plain text, title first.
    pub fn text_table(&self) -> String {
        let (header, body) = self.cells();
        let rows: Vec<Vec<String>> = std::iter::once(header).chain(body).collect();
        let widths = column_widths(&rows);
        let mut out = format!("{} [{}]\n", self.title, self.legend());
        for (i, line) in align(&rows, &[0]).iter().enumerate() {
            out += line;
            out.push('\n');
            if i == 0 {
                let total = widths.iter().sum::<usize>() + 2 * widths.len().saturating_sub(1);
                out += &"-".repeat(total);
                out.push('\n');
            }
        }
        out
    }

    /// The table in markdown, with a heading and the notes as a list.
    pub fn markdown(&self) -> String {
        let (header, body) = self.cells();
        let esc = |s: &str| s.replace('|', "\\|");
        let mut out = format!("## {} (`{}`)\n\n{}.\n\n", self.title, self.name, {
            let l = self.legend();
            let mut c = l.chars();
            c.next()
                .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
                .unwrap_or_default()
        });
        let _ = writeln!(
            out,
            "| {} |",
            header
                .iter()
                .map(|h| esc(h))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        let align: Vec<&str> = (0..header.len())
            .map(|i| if i == 0 { ":---" } else { "---:" })
            .collect();
        let _ = writeln!(out, "|{}|", align.join("|"));
        for line in &body {
            let _ = writeln!(
                out,
                "| {} |",
                line.iter().map(|c| esc(c)).collect::<Vec<_>>().join(" | ")
            );
        }
        if !self.notes.is_empty() {
            out.push('\n');
            for n in &self.notes {
                let _ = writeln!(out, "- {n}");
            }
        }
        out.push('\n');
        out
    }
}

/// `summary.md`: a header with the machine, every report's markdown table, and failures.
pub fn summary_markdown(machine: &[String], reports: &[Report], failures: &[String]) -> String {
    let mut out = String::from("# vkgdr benchmarks\n\n");
    for m in machine {
        let _ = writeln!(out, "- {m}");
    }
    out += "\nProduced by `vkgdr bench all`; CSVs and PNG charts lie next to this file.\n\n";
    for r in reports {
        out += &r.markdown();
    }
    if !failures.is_empty() {
        out += "## Failures\n\n";
        for f in failures {
            let _ = writeln!(out, "- {f}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::model::tests::sample;
    use super::*;

    #[test]
    fn wide_table_has_one_line_per_size_and_one_column_per_method() {
        let r = sample();
        let t = r.text_table();
        let lines: Vec<&str> = t.lines().collect();
        // Title, header, rule, one line per size (8, 64, 4096).
        assert_eq!(lines.len(), 3 + 3);
        assert!(lines[1].starts_with("size"));
        assert!(lines[1].contains("C library (docs)"));
        assert!(lines[3].starts_with("8 B"));
        assert!(lines[3].contains("100 ns (90.0–130)"));
        // The reference exists only at 64 B.
        assert!(lines[3].trim_end().ends_with('–'));
        assert!(lines[4].contains("200 µs"));
        assert!(lines[5].starts_with("4 KiB"));
    }

    #[test]
    fn long_table_and_markdown_list_every_row() {
        let mut r = Report {
            figures: sample().figures,
            title: "API call cost".into(),
            ..Report::new("apiperf", Unit::Nanoseconds)
        };
        r.notes.push("a note".into());
        let t = r.text_table();
        assert_eq!(t.lines().count(), 3 + r.figures.len());
        assert!(t.contains("reference"));
        let md = r.markdown();
        assert!(md.starts_with("## API call cost (`apiperf`)"));
        let table_lines = md.lines().filter(|l| l.starts_with('|')).count();
        assert_eq!(table_lines, 2 + r.figures.len());
        assert!(md.contains("\n- a note\n"));
        // A pipe in a method name is escaped.
        r.figures[0].method = "a|b".into();
        assert!(r.markdown().contains("a\\|b"));

        let s = summary_markdown(&["GPU: test".into()], &[r], &["pplat: boom".into()]);
        assert!(s.starts_with("# vkgdr benchmarks\n\n- GPU: test\n"));
        assert!(s.contains("## Failures\n\n- pplat: boom\n"));
    }
}
