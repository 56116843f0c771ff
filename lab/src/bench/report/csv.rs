//! A report as CSV ([`to_csv`]: a header, then one line per figure), written with the `csv`
//! crate. Nothing reads it back: `vkgdr bench plot` redraws from `results.json`.

use super::model::Report;

/// CSV header fields.
pub const CSV_HEADER: [&str; 9] = [
    "benchmark",
    "method",
    "size_bytes",
    "unit",
    "median",
    "p10",
    "p90",
    "samples",
    "origin",
];

/// The report as CSV: [`CSV_HEADER`] then one line per figure. Floats are written in Rust's
/// shortest round-trip form.
pub fn to_csv(report: &Report) -> String {
    let mut w = csv::Writer::from_writer(Vec::new());
    // Writing into a Vec fails only on fields serde cannot flatten, and these are all scalars.
    w.write_record(CSV_HEADER).expect("header");
    for f in &report.figures {
        w.serialize((
            &report.name,
            &f.method,
            f.size,
            report.unit,
            f.median,
            f.p10,
            f.p90,
            f.samples,
            f.origin,
        ))
        .expect("a line of scalars");
    }
    String::from_utf8(w.into_inner().expect("in memory")).expect("UTF-8 fields")
}

#[cfg(test)]
mod tests {
    use super::super::model::tests::sample;
    use super::*;

    #[test]
    fn csv_has_a_line_per_figure_quoted_where_needed() {
        let r = sample();
        let text = to_csv(&r);
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some(CSV_HEADER.join(",").as_str()));
        assert_eq!(
            lines.next(),
            Some("copylat,BAR write,8,ns,100.0,90.0,130.0,1000,measured")
        );
        assert_eq!(
            lines.next(),
            Some("copylat,\"cuMemcpyHtoD, \"\"sync\"\"\",8,ns,7008.033333333334,6900.0,8000.0,200,measured")
        );
        assert_eq!(
            text.lines().last(),
            Some("copylat,C library (docs),64,ns,200000.0,200000.0,200000.0,0,reference")
        );
        assert_eq!(text.lines().count(), 1 + r.figures.len());
    }
}
