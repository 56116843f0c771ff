//! The figures of two runs paired by report, method and size ([`pair_up`]), each pair judged
//! against its noise (and, where the registry names the machine work it is made of, against that
//! too: [`anchoring`](super::anchoring)); a figure of one run alone is listed as such.

use std::collections::HashMap;

use super::anchoring::{anchored_move, combined};
use super::document::FigureComparisonJson;
use super::noise::{judge, noise_percent, Verdict};
use super::results::Results;
use vkgdr_lab::bench::registry::report_spec;
use vkgdr_lab::bench::report::model::{Figure, Origin, Report};

type Key<'a> = (&'a str, &'a str, u64);

/// Pairs the figures of both runs by report, method and size: the new run's order, each report
/// followed by the baseline's figures of that report that this run lacks, then the baseline's
/// reports this run lacks. `floor_percent` is the noise floor in percent.
pub(super) fn pair_up(
    old: &Results,
    new: &Results,
    floor_percent: f64,
) -> Vec<FigureComparisonJson> {
    let before = old.figures();
    let mut used = vec![false; before.len()];
    let mut index: HashMap<Key<'_>, Vec<usize>> = HashMap::new();
    for (i, (r, f)) in before.iter().enumerate() {
        index
            .entry((r.name.as_str(), f.method.as_str(), f.size))
            .or_default()
            .push(i);
    }
    let mut out = Vec::new();
    let leftovers = |report: Option<&str>, used: &mut [bool], out: &mut Vec<_>| {
        for (i, (r, f)) in before.iter().enumerate() {
            if !used[i] && report.is_none_or(|name| r.name == name) {
                used[i] = true;
                out.push(one_side(r, f, floor_percent, true));
            }
        }
    };
    let after = new.figures();
    for (k, &(r, f)) in after.iter().enumerate() {
        let key = (r.name.as_str(), f.method.as_str(), f.size);
        let matched = index
            .get_mut(&key)
            .and_then(|v| (!v.is_empty()).then(|| v.remove(0)));
        match matched {
            Some(i) => {
                used[i] = true;
                out.push(both((old, new), before[i], (r, f), floor_percent));
            }
            None => out.push(one_side(r, f, floor_percent, false)),
        }
        let last_of_report = after.get(k + 1).is_none_or(|(next, _)| next.name != r.name);
        if last_of_report {
            leftovers(Some(&r.name), &mut used, &mut out);
        }
    }
    leftovers(None, &mut used, &mut out);
    out
}

/// A figure of one run alone: the baseline's when `in_baseline`, else this run's.
fn one_side(r: &Report, f: &Figure, floor_percent: f64, in_baseline: bool) -> FigureComparisonJson {
    let (verdict, baseline, current) = if in_baseline {
        (Verdict::OnlyInBaseline, Some(f.median), None)
    } else {
        (Verdict::OnlyInCurrent, None, Some(f.median))
    };
    let anchor_ratio = f.anchor.as_ref().and_then(|a| a.ratio);
    FigureComparisonJson {
        report: r.name.clone(),
        method: f.method.clone(),
        size_bytes: f.size,
        higher_is_better: r.unit.higher_is_better(),
        unit: r.unit.csv_name().to_string(),
        baseline,
        current,
        ratio: None,
        tolerance_percent: noise_percent(floor_percent, &[f]),
        verdict,
        driver_work: None,
        anchor_method: f.anchor.as_ref().map(|a| a.method.clone()),
        anchor_ratio_baseline: anchor_ratio.filter(|_| in_baseline),
        anchor_ratio_current: anchor_ratio.filter(|_| !in_baseline),
    }
}

/// A figure of both runs (`runs`: the baseline and this run), judged.
fn both(
    runs: (&Results, &Results),
    (ro, fo): (&Report, &Figure),
    (rn, fn_): (&Report, &Figure),
    floor_percent: f64,
) -> FigureComparisonJson {
    let hib = rn.unit.higher_is_better();
    let tolerance_percent = noise_percent(floor_percent, &[fo, fn_]);
    let raw = if ro.unit == rn.unit {
        judge(fo.median, fn_.median, hib, tolerance_percent / 100.0)
    } else {
        Verdict::NotComparable
    };
    let driver_work = (raw != Verdict::NotComparable)
        .then(|| {
            anchored_move(
                runs,
                &rn.name,
                fo,
                fn_,
                hib,
                floor_percent,
                tolerance_percent,
            )
        })
        .flatten();
    let verdict = combined(raw, driver_work.as_ref().map(|w| w.verdict));
    // A driver or hardware figure: marked so in either run, or named so by the registry (older
    // documents did not mark them).
    let machine = [fo, fn_].iter().any(|f| f.origin == Origin::Machine)
        || report_spec(&rn.name).is_some_and(|s| s.is_machine(&fn_.method));
    let verdict = match verdict {
        Verdict::Worse | Verdict::Better | Verdict::MovedWithDriver if machine => {
            Verdict::MachineMoved
        }
        v => v,
    };
    let ratio = fn_.median / fo.median;
    FigureComparisonJson {
        report: rn.name.clone(),
        method: fn_.method.clone(),
        size_bytes: fn_.size,
        unit: rn.unit.csv_name().to_string(),
        higher_is_better: hib,
        baseline: Some(fo.median),
        current: Some(fn_.median),
        ratio: (verdict != Verdict::NotComparable && ratio.is_finite()).then_some(ratio),
        tolerance_percent,
        verdict,
        driver_work,
        anchor_method: fn_
            .anchor
            .as_ref()
            .or(fo.anchor.as_ref())
            .map(|a| a.method.clone()),
        anchor_ratio_baseline: fo.anchor.as_ref().and_then(|a| a.ratio),
        anchor_ratio_current: fn_.anchor.as_ref().and_then(|a| a.ratio),
    }
}
