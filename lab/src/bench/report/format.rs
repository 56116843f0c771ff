//! Numbers as tables, charts and comparisons show them: three significant digits ([`sig3`]),
//! durations ([`fmt_ns`], [`fmt_ns_range`]), byte counts ([`fmt_size`]) and axis labels
//! ([`trim_zeros`]); and rows of cells as aligned text columns ([`align`]).

/// Three significant digits without an exponent (`0.123`, `1.23`, `12.3`, `123`).
pub fn sig3(x: f64) -> String {
    let a = x.abs();
    if a >= 100.0 || a == 0.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// A duration in nanoseconds with a fitting unit (`85 ns`, `1.23 µs`, `12.3 ms`, `1.50 s`).
pub fn fmt_ns(ns: f64) -> String {
    let a = ns.abs();
    if a < 1e3 {
        format!("{} ns", sig3(ns))
    } else if a < 1e6 {
        format!("{} µs", sig3(ns / 1e3))
    } else if a < 1e9 {
        format!("{} ms", sig3(ns / 1e6))
    } else {
        format!("{} s", sig3(ns / 1e9))
    }
}

/// `median (p10–p90)` with the percentiles in the median's unit: `1.23 µs (1.10–1.50)`.
pub fn fmt_ns_range(median: f64, p10: f64, p90: f64) -> String {
    let m = fmt_ns(median);
    let (_, unit) = m.rsplit_once(' ').expect("value and unit");
    let scale = match unit {
        "ns" => 1.0,
        "µs" => 1e3,
        "ms" => 1e6,
        _ => 1e9,
    };
    format!("{m} ({}–{})", sig3(p10 / scale), sig3(p90 / scale))
}

/// Drops trailing zeros after a decimal point (`10.0 µs` → `10 µs`, `1.50` → `1.5`), for axis
/// labels.
pub fn trim_zeros(label: &str) -> String {
    let (num, rest) = label.split_once(' ').unwrap_or((label, ""));
    let num = if num.contains('.') {
        num.trim_end_matches('0').trim_end_matches('.')
    } else {
        num
    };
    if rest.is_empty() {
        num.to_string()
    } else {
        format!("{num} {rest}")
    }
}

/// A byte count: exact binary units where they fit (`8 B`, `4 KiB`, `1 GiB`), three
/// significant digits otherwise; `-` for 0 (size does not apply).
pub fn fmt_size(bytes: u64) -> String {
    if bytes == 0 {
        return "-".into();
    }
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift {
            return if bytes & ((1 << shift) - 1) == 0 {
                format!("{} {unit}", bytes >> shift)
            } else {
                format!("{} {unit}", sig3(bytes as f64 / (1u64 << shift) as f64))
            };
        }
    }
    format!("{bytes} B")
}

/// An amount of memory with a binary unit and three significant digits (`512 B`, `4.00 KiB`,
/// `57.3 MiB`, `1.50 GiB`); `0 B` for nothing.
pub fn fmt_bytes(bytes: f64) -> String {
    let a = bytes.abs();
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        let scale = (1u64 << shift) as f64;
        if a >= scale {
            return format!("{} {unit}", sig3(bytes / scale));
        }
    }
    format!("{} B", sig3(bytes))
}

/// The width of each column of `rows`: its widest cell, in characters.
pub fn column_widths<R: AsRef<[String]>>(rows: &[R]) -> Vec<usize> {
    let mut widths = Vec::new();
    for r in rows {
        let r = r.as_ref();
        if widths.len() < r.len() {
            widths.resize(r.len(), 0);
        }
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    widths
}

/// Rows of cells as aligned lines: each column as wide as its widest cell ([`column_widths`]),
/// two spaces between columns, the columns numbered in `left_columns` flush left and the others
/// flush right, trailing spaces dropped.
pub fn align<R: AsRef<[String]>>(rows: &[R], left_columns: &[usize]) -> Vec<String> {
    let widths = column_widths(rows);
    rows.iter()
        .map(|r| {
            let cells: Vec<String> = r
                .as_ref()
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(i, (c, w))| {
                    let fill = " ".repeat(w - c.chars().count());
                    if left_columns.contains(&i) {
                        format!("{c}{fill}")
                    } else {
                        format!("{fill}{c}")
                    }
                })
                .collect();
            cells.join("  ").trim_end().to_string()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_sizes_and_durations() {
        assert_eq!(fmt_size(0), "-");
        assert_eq!(fmt_size(8), "8 B");
        assert_eq!(fmt_size(1023), "1023 B");
        assert_eq!(fmt_size(4096), "4 KiB");
        assert_eq!(fmt_size(1536), "1.50 KiB");
        assert_eq!(fmt_size(64 << 20), "64 MiB");
        assert_eq!(fmt_size(1 << 30), "1 GiB");
        assert_eq!(fmt_ns(85.4), "85.4 ns");
        assert_eq!(fmt_ns(1234.0), "1.23 µs");
        assert_eq!(fmt_ns(200_000.0), "200 µs");
        assert_eq!(fmt_ns(12.3e6), "12.3 ms");
        assert_eq!(fmt_ns(1.5e9), "1.50 s");
        assert_eq!(sig3(0.1234), "0.123");
        assert_eq!(sig3(0.0), "0");
        assert_eq!(fmt_bytes(0.0), "0 B");
        assert_eq!(fmt_bytes(512.0), "512 B");
        assert_eq!(fmt_bytes(4096.0), "4.00 KiB");
        assert_eq!(fmt_bytes(60_083_814.0), "57.3 MiB");
        assert_eq!(fmt_bytes(1.5 * (1u64 << 30) as f64), "1.50 GiB");
    }

    #[test]
    fn latency_ranges_share_the_median_unit_and_axis_labels_trim_zeros() {
        assert_eq!(fmt_ns_range(60.9, 54.8, 79.2), "60.9 ns (54.8–79.2)");
        assert_eq!(fmt_ns_range(901.0, 811.0, 1170.0), "901 ns (811–1170)");
        assert_eq!(fmt_ns_range(1234.0, 1100.0, 1500.0), "1.23 µs (1.10–1.50)");
        assert_eq!(fmt_ns_range(2e9, 1e9, 3e9), "2.00 s (1.00–3.00)");
        assert_eq!(trim_zeros("10.0 µs"), "10 µs");
        assert_eq!(trim_zeros("1.50"), "1.5");
        assert_eq!(trim_zeros("100 ns"), "100 ns");
        assert_eq!(trim_zeros("0.500"), "0.5");
    }

    #[test]
    fn columns_align_left_or_right_by_their_widest_cell() {
        let rows = [
            ["method", "size", "µs", ""].map(String::from),
            ["a", "8 B", "1.50", "new"].map(String::from),
            ["longer", "4 KiB", "12.0", ""].map(String::from),
        ];
        assert_eq!(column_widths(&rows), [6, 5, 4, 3]);
        assert_eq!(
            align(&rows, &[0, 3]),
            [
                "method   size    µs",
                "a         8 B  1.50  new",
                "longer  4 KiB  12.0",
            ]
        );
        assert_eq!(align(&rows[1..2], &[]), ["a  8 B  1.50  new"]);
    }
}
