//! A report as CSV ([`to_csv`]: [`CSV_HEADER`], then one line per row), and read back
//! ([`from_csv`], [`read_csv`]).

use std::fmt::Write as _;
use std::path::Path;

use super::model::{Report, Row, Unit};
use crate::bench::error::{BenchError, BenchResult};

/// CSV header line (no trailing newline).
pub const CSV_HEADER: &str = "benchmark,method,size_bytes,unit,median,p10,p90,samples,origin";

/// Quotes a CSV field if it needs it (comma, quote, CR or LF).
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The report as CSV: [`CSV_HEADER`] then one line per row. Floats are written in Rust's
/// shortest round-trip form, so reading the file back gives the same values.
pub fn to_csv(report: &Report) -> String {
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for r in &report.rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{}",
            csv_field(&report.name),
            csv_field(&r.method),
            r.size,
            report.unit.csv_name(),
            r.median,
            r.p10,
            r.p90,
            r.samples,
            if r.reference { "reference" } else { "measured" }
        );
    }
    out
}

/// Splits CSV text into records of fields (RFC 4180: quoted fields may hold commas, doubled
/// quotes and line breaks; CRLF or LF line ends; blank lines skipped).
pub fn parse_csv(text: &str) -> Result<Vec<Vec<String>>, String> {
    let mut records = Vec::new();
    let mut record = Vec::new();
    let mut field = String::new();
    let mut chars = text.chars().peekable();
    let mut quoted = false;
    let mut line = 1;
    // Whether the current field was quoted (then it exists even if empty).
    let mut field_started = false;
    while let Some(c) = chars.next() {
        if quoted {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => {
                    quoted = false;
                    if !matches!(chars.peek(), None | Some(',' | '\n' | '\r')) {
                        return Err(format!("line {line}: text after a closing quote"));
                    }
                }
                '\n' => {
                    line += 1;
                    field.push(c);
                }
                _ => field.push(c),
            }
            continue;
        }
        match c {
            '"' if field.is_empty() && !field_started => {
                quoted = true;
                field_started = true;
            }
            '"' => return Err(format!("line {line}: quote inside an unquoted field")),
            ',' => {
                record.push(std::mem::take(&mut field));
                field_started = false;
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' | '\r' => {
                if !record.is_empty() || !field.is_empty() || field_started {
                    record.push(std::mem::take(&mut field));
                    records.push(std::mem::take(&mut record));
                }
                field_started = false;
                line += 1;
            }
            _ => field.push(c),
        }
    }
    if quoted {
        return Err(format!("line {line}: unterminated quoted field"));
    }
    if !record.is_empty() || !field.is_empty() || field_started {
        record.push(field);
        records.push(record);
    }
    Ok(records)
}

/// Parses CSV text written by [`to_csv`] back into a report (without notes).
pub fn from_csv(text: &str) -> Result<Report, String> {
    let records = parse_csv(text)?;
    let (header, body) = records.split_first().ok_or("empty file")?;
    if header.join(",") != CSV_HEADER {
        return Err(format!("unexpected header, want {CSV_HEADER:?}"));
    }
    let mut report: Option<Report> = None;
    for (i, rec) in body.iter().enumerate() {
        let at = |msg: String| format!("data row {}: {msg}", i + 1);
        let [bench, method, size, unit, median, p10, p90, samples, origin] = rec.as_slice() else {
            return Err(at(format!("{} fields, want 9", rec.len())));
        };
        let unit = Unit::parse(unit).ok_or_else(|| at(format!("unknown unit {unit:?}")))?;
        let num = |s: &str, what: &str| {
            s.parse::<f64>()
                .map_err(|_| at(format!("{what} {s:?} is not a number")))
        };
        let row = Row {
            method: method.clone(),
            size: size
                .parse()
                .map_err(|_| at(format!("size {size:?} is not an integer")))?,
            median: num(median, "median")?,
            p10: num(p10, "p10")?,
            p90: num(p90, "p90")?,
            samples: samples
                .parse()
                .map_err(|_| at(format!("samples {samples:?} is not an integer")))?,
            reference: match origin.as_str() {
                "measured" => false,
                "reference" => true,
                o => {
                    return Err(at(format!(
                        "origin {o:?} is neither measured nor reference"
                    )))
                }
            },
        };
        let r = report.get_or_insert_with(|| Report::new(bench, unit));
        if r.name != *bench || r.unit != unit {
            return Err(at(
                "rows of different benchmarks or units in one file".into()
            ));
        }
        r.rows.push(row);
    }
    report.ok_or_else(|| "no data rows".to_string())
}

/// Reads a CSV file into a report.
pub fn read_csv(path: &Path) -> BenchResult<Report> {
    let text = std::fs::read_to_string(path).map_err(|e| BenchError::io(path, e))?;
    from_csv(&text).map_err(|msg| BenchError::Csv {
        path: path.to_path_buf(),
        msg,
    })
}

#[cfg(test)]
mod tests {
    use super::super::model::tests::sample;
    use super::*;

    #[test]
    fn csv_fields_are_quoted_only_when_needed() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("two\nlines"), "\"two\nlines\"");
    }

    #[test]
    fn csv_parser_handles_quotes_crlf_and_empty_fields() {
        let recs = parse_csv("a,\"b,c\",\"d\"\"e\"\r\n,,\n\n\"x\ny\",\"\"\n").unwrap();
        assert_eq!(
            recs,
            vec![vec!["a", "b,c", "d\"e"], vec!["", "", ""], vec!["x\ny", ""],]
        );
        // No trailing newline.
        assert_eq!(parse_csv("1,2").unwrap(), vec![vec!["1", "2"]]);
        assert!(parse_csv("\"open").is_err());
        assert!(parse_csv("a\"b").is_err());
        assert!(parse_csv("\"a\"b").is_err());
    }

    #[test]
    fn csv_round_trips_exactly() {
        let r = sample();
        let text = to_csv(&r);
        assert!(text.starts_with(CSV_HEADER));
        assert_eq!(text.lines().count(), 1 + r.rows.len());
        let back = from_csv(&text).unwrap();
        assert_eq!(back, Report { notes: vec![], ..r });
    }

    #[test]
    fn csv_reader_rejects_malformed_files() {
        let good = to_csv(&sample());
        assert!(from_csv("").is_err());
        assert!(from_csv(CSV_HEADER).is_err(), "no data rows");
        assert!(from_csv(&good.replacen("median", "mean", 1)).is_err());
        assert!(from_csv(&good.replace(",ns,", ",ms,")).is_err());
        assert!(from_csv(&good.replacen(",1000,", ",lots,", 1)).is_err());
        assert!(from_csv(&good.replacen("measured", "guessed", 1)).is_err());
        let mut mixed = good.clone();
        mixed += "copybw-read,x,8,ns,1,1,1,1,measured\n";
        assert!(from_csv(&mixed).is_err());
        assert!(from_csv(&format!("{CSV_HEADER}\ncopylat,x,8\n")).is_err());
    }
}
