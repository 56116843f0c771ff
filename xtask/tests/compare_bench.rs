//! `cargo xtask compare-bench`, end to end on synthetic documents and
//! without a GPU: verdicts in each unit's direction (better, worse beyond noise, within noise),
//! figures missing on either side, another GPU shown as information only, a baseline chosen from
//! a directory by GPU, malformed files named with a clear error and exit code 2, and the JSON
//! document read back.
//!
//! Needs no GPU and no Vulkan driver.

mod common;

use common::{run, temp_dir, Run, TempDirExt};
use serde_json::{json, Value};
use tempfile::TempDir;

const H100: &str = "NVIDIA H100 80GB HBM3";

/// One figure: `(method, size, median, spread)`, p10 and p90 at ∓`spread` of the median.
type Fig = (&'static str, u64, f64, f64);

fn figures(unit: &str, figs: &[Fig]) -> Value {
    figs.iter()
        .map(|&(method, size, median, spread)| {
            json!({
                "method": method, "size_bytes": size, "unit": unit, "median": median,
                "p10": median * (1.0 - spread), "p90": median * (1.0 + spread),
                "samples": 100, "origin": "measured", "anchor": null
            })
        })
        .collect()
}

/// A `vkgdr-bench` document as the program writes it: `copylat` latencies (ns) and
/// `copybw-write` bandwidths (GB/s) on a GPU of this name and UUID.
fn doc(gpu: &str, uuid: &str, latencies: &[Fig], bandwidths: &[Fig]) -> Value {
    json!({
        "format": "vkgdr-bench", "format_version": 1, "vkgdr_version": "0.1.0",
        "mode": "full", "out_dir": "bench-out",
        "machine": {
            "cpu": { "model": "Intel Xeon", "hardware_threads": 16, "copy_routines": "avx512" },
            "vulkan": { "status": "ok", "error": null, "devices": [] },
            "cuda": {
                "status": "ok", "error": null, "driver_cuda_version": "13.0",
                "devices": [{ "ordinal": 0, "name": gpu, "uuid": uuid, "pci": null,
                              "total_memory_bytes": 85_000_000_000u64 }]
            },
            "nvml": { "status": "ok", "error": null, "driver_version": "580.159.04", "devices": 1 },
            "environment": { "icd_manifests": [], "driver_capabilities": null, "in_container": false },
            "diagnosis": [], "usable": true
        },
        "benchmarks": [
            { "name": "copylat", "seconds": 1.0, "error": null, "reports": [{
                "name": "copylat", "title": "Write latency, host to GPU memory", "unit": "ns",
                "higher_is_better": false, "notes": [], "figures": figures("ns", latencies) }] },
            { "name": "copybw", "seconds": 2.0, "error": null, "reports": [{
                "name": "copybw-write", "title": "Write bandwidth, host to GPU memory",
                "unit": "GB/s", "higher_is_better": true, "notes": [],
                "figures": figures("GB/s", bandwidths) }] }
        ],
        "error": null, "ok": true
    })
}

/// The baseline: BAR writes at 150 ns, 8 threads writing at 33 GB/s, tight samples (±2 %).
fn baseline(gpu: &str, uuid: &str) -> Value {
    doc(
        gpu,
        uuid,
        &[
            ("BAR write", 8, 150.0, 0.02),
            ("cuMemcpyHtoD", 8, 6000.0, 0.02),
        ],
        &[("BAR write 8 thr", 256 << 20, 33.0, 0.02)],
    )
}

/// `xtask compare-bench OLD NEW --json`, both documents written to a fresh directory.
fn compare(old: &Value, new: &Value, extra: &[&str]) -> (Run, TempDir) {
    let dir = temp_dir("pair");
    let old = dir.doc("old.json", old);
    let new = dir.doc("new.json", new);
    let args: Vec<&str> = ["compare-bench", &old, &new, "--json"]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    (run(&args, &[]), dir)
}

/// The verdicts of the comparison document, as `(report, method, verdict)`.
fn verdicts(doc: &Value) -> Vec<(String, String, String)> {
    doc["figures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["report"].as_str().unwrap().to_string(),
                f["method"].as_str().unwrap().to_string(),
                f["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn check_opening(doc: &Value) {
    assert_eq!(doc["format"], "vkgdr-bench-comparison", "{doc:#}");
    assert_eq!(doc["format_version"], 1);
    // The version of the vkgdr-lab library that writes every document (the workspace's).
    assert_eq!(doc["vkgdr_version"], env!("CARGO_PKG_VERSION"));
}

#[test]
fn better_figures_exit_0() {
    // Latencies down, bandwidth up: better in both directions.
    let new = doc(
        H100,
        "GPU-1",
        &[
            ("BAR write", 8, 100.0, 0.02),
            ("cuMemcpyHtoD", 8, 5000.0, 0.02),
        ],
        &[("BAR write 8 thr", 256 << 20, 40.0, 0.02)],
    );
    let (r, _dir) = compare(&baseline(H100, "GPU-1"), &new, &[]);
    assert_eq!(r.code, 0, "{}", r.all());
    let d = r.json();
    check_opening(&d);
    assert_eq!(d["gpu_match"], "same_gpu");
    assert_eq!(d["judged"], true);
    assert_eq!(d["regressed"], false);
    // cuMemcpyHtoD times the driver alone (the registry says so, whatever the document's
    // origin): the machine's move.
    assert_eq!(d["summary"]["better"], 2);
    assert_eq!(d["summary"]["machine_moved"], 1);
    assert_eq!(d["summary"]["worse"], 0);
    assert!(verdicts(&d).iter().all(|(_, m, v)| if m == "cuMemcpyHtoD" {
        v == "machine_moved"
    } else {
        v == "better"
    }));
    let bw = &d["figures"][2];
    assert_eq!(bw["report"], "copybw-write");
    assert_eq!(bw["unit"], "GB/s");
    assert_eq!(bw["higher_is_better"], true);
    assert_eq!(bw["baseline"], 33.0);
    assert_eq!(bw["current"], 40.0);
    assert!((bw["ratio"].as_f64().unwrap() - 40.0 / 33.0).abs() < 1e-12);
    // Under --json the table goes to stderr.
    assert!(
        r.stderr.contains("No figure got worse beyond its noise."),
        "{}",
        r.all()
    );
    assert!(r.stderr.contains("better"), "{}", r.all());
}

#[test]
fn worse_beyond_noise_exits_3_and_names_the_figure() {
    // The cached path 1.8× slower; the bandwidth halved (worse, the other way round).
    let new = doc(
        H100,
        "GPU-2",
        &[
            ("BAR write", 8, 270.0, 0.02),
            ("cuMemcpyHtoD", 8, 6100.0, 0.02),
        ],
        &[("BAR write 8 thr", 256 << 20, 16.5, 0.02)],
    );
    // The slower write against the driver's copy in each run: the code moved, not the machine.
    let mut new = new;
    let mut old = baseline(H100, "GPU-1");
    for (d, copy) in [(&mut old, 6000.0), (&mut new, 6100.0)] {
        let f = &mut d["benchmarks"][0]["reports"][0]["figures"][0];
        f["anchor"] = json!({
            "report": "copylat", "method": "cuMemcpyHtoD", "median": copy,
            "ratio": f["median"].as_f64().unwrap() / copy
        });
    }
    let (r, dir) = compare(&old, &new, &[]);
    assert_eq!(r.code, 3, "{}", r.all());
    let d = r.json();
    check_opening(&d);
    // Another card of the same model: judged.
    assert_eq!(d["gpu_match"], "same_model");
    assert_eq!(d["judged"], true);
    assert_eq!(d["regressed"], true);
    assert_eq!(
        verdicts(&d),
        [
            ("copylat".into(), "BAR write".into(), "worse".into()),
            (
                "copylat".into(),
                "cuMemcpyHtoD".into(),
                "within_noise".into()
            ),
            (
                "copybw-write".into(),
                "BAR write 8 thr".into(),
                "worse".into()
            ),
        ]
    );
    assert_eq!(d["figures"][0]["ratio"], 1.8);
    assert_eq!(d["figures"][0]["anchor_method"], "cuMemcpyHtoD");
    assert_eq!(d["figures"][0]["anchor_ratio_baseline"], 0.025);
    assert!(d["figures"][1]["anchor_method"].is_null());
    assert_eq!(d["figures"][0]["tolerance_percent"], 10.0);
    assert_eq!(d["summary"]["worse"], 2);
    assert_eq!(d["summary"]["compared"], 3);
    assert_eq!(d["baseline"]["gpu"]["uuid"], "GPU-1");
    assert_eq!(d["current"]["gpu"]["uuid"], "GPU-2");
    for text in [
        "REGRESSION: 2 figure(s)",
        "copylat / BAR write @ 8 B: 150 ns → 270 ns (1.80× the time; noise ±10 %)",
        "copybw-write / BAR write 8 thr @ 256 MiB: 33.0 GB/s → 16.5 GB/s (0.500× the rate",
        "against \"cuMemcpyHtoD\" in the same run: 0.025× before, 0.044× now",
        "WORSE",
    ] {
        assert!(r.stderr.contains(text), "no {text:?}:\n{}", r.all());
    }

    // Without --json: the same text on stdout, the same exit code.
    let old = dir.path().join("old.json");
    let new = dir.path().join("new.json");
    let plain = run(
        &[
            "compare-bench",
            old.to_str().unwrap(),
            new.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(plain.code, 3, "{}", plain.all());
    assert!(plain.stdout.contains("REGRESSION"), "{}", plain.all());
    assert!(plain.stderr.is_empty(), "{}", plain.all());

    // A floor of 90 % forgives a 1.8× slowdown but not a halved bandwidth (2×).
    let loose = run(
        &[
            "compare-bench",
            old.to_str().unwrap(),
            new.to_str().unwrap(),
            "--tolerance",
            "90",
            "--json",
        ],
        &[],
    );
    assert_eq!(loose.code, 3, "{}", loose.all());
    let v = verdicts(&loose.json());
    assert_eq!(v[0].2, "within_noise");
    assert_eq!(v[2].2, "worse");
}

#[test]
fn moves_within_noise_exit_0() {
    // 8 % slower, 5 % less bandwidth: within the 10 % floor. 25 % slower, but its samples
    // scatter ±30 %: within its own noise.
    let old = doc(
        H100,
        "GPU-1",
        &[("BAR write", 8, 150.0, 0.02), ("flush", 0, 1000.0, 0.3)],
        &[("BAR write 8 thr", 256 << 20, 33.0, 0.02)],
    );
    let new = doc(
        H100,
        "GPU-1",
        &[("BAR write", 8, 162.0, 0.02), ("flush", 0, 1250.0, 0.05)],
        &[("BAR write 8 thr", 256 << 20, 31.35, 0.02)],
    );
    let (r, _dir) = compare(&old, &new, &[]);
    assert_eq!(r.code, 0, "{}", r.all());
    let d = r.json();
    assert!(
        verdicts(&d).iter().all(|(_, _, v)| v == "within_noise"),
        "{d:#}"
    );
    assert!((d["figures"][1]["tolerance_percent"].as_f64().unwrap() - 30.0).abs() < 1e-9);
    assert_eq!(d["summary"]["within_noise"], 3);
    assert_eq!(d["regressed"], false);

    // A 5 % floor still forgives the scattered figure, not the 8 % slower write.
    let (r, _dir) = compare(&old, &new, &["--tolerance", "5"]);
    assert_eq!(r.code, 3, "{}", r.all());
    let v = verdicts(&r.json());
    assert_eq!(v[0].2, "worse");
    assert_eq!(v[1].2, "within_noise");

    // The floor is reported as given (7, not 7.000000000000001), for the comparison and for
    // each figure its own spread does not widen.
    let (r, _dir) = compare(&old, &new, &["--tolerance", "7"]);
    assert_eq!(r.code, 3, "{}", r.all());
    let d = r.json();
    assert_eq!(d["tolerance_percent"], 7.0, "{d:#}");
    assert_eq!(d["figures"][0]["tolerance_percent"], 7.0, "{d:#}");
    assert!((d["figures"][1]["tolerance_percent"].as_f64().unwrap() - 30.0).abs() < 1e-9);
    assert!(
        r.stdout.contains("\"tolerance_percent\": 7.0,"),
        "{}",
        r.all()
    );
    assert!(
        r.stderr.contains("noise: the larger of 7 % and"),
        "{}",
        r.all()
    );
}

#[test]
fn missing_figures_are_listed_not_judged() {
    let old = doc(
        H100,
        "GPU-1",
        &[
            ("BAR write", 8, 150.0, 0.02),
            ("BAR write", 64, 146.0, 0.02),
        ],
        &[("BAR write 8 thr", 256 << 20, 33.0, 0.02)],
    );
    // 64 B gone, 4 KiB new; the bandwidth report gone entirely (a benchmark that failed).
    let mut new = doc(
        H100,
        "GPU-1",
        &[
            ("BAR write", 8, 150.0, 0.02),
            ("BAR write", 4096, 450.0, 0.02),
        ],
        &[],
    );
    new["benchmarks"][1]["error"] = "kernel did not respond: made up".into();
    new["benchmarks"][1]["reports"] = json!([]);
    let (r, _dir) = compare(&old, &new, &[]);
    assert_eq!(r.code, 0, "{}", r.all());
    let d = r.json();
    assert_eq!(
        verdicts(&d),
        [
            ("copylat".into(), "BAR write".into(), "within_noise".into()),
            (
                "copylat".into(),
                "BAR write".into(),
                "only_in_current".into()
            ),
            (
                "copylat".into(),
                "BAR write".into(),
                "only_in_baseline".into()
            ),
            (
                "copybw-write".into(),
                "BAR write 8 thr".into(),
                "only_in_baseline".into()
            ),
        ]
    );
    assert_eq!(d["figures"][1]["size_bytes"], 4096);
    assert!(d["figures"][1]["baseline"].is_null());
    assert_eq!(d["figures"][2]["size_bytes"], 64);
    assert!(d["figures"][2]["current"].is_null());
    assert!(d["figures"][2]["ratio"].is_null());
    assert_eq!(d["summary"]["only_in_baseline"], 2);
    assert_eq!(d["summary"]["only_in_current"], 1);
    assert_eq!(d["current"]["failed_benchmarks"], json!(["copybw"]));
    assert!(r.stderr.contains("only before"), "{}", r.all());
    assert!(r.stderr.contains("failed: copybw"), "{}", r.all());
}

#[test]
fn another_gpu_is_information_only() {
    let slower = doc(
        "NVIDIA L4",
        "GPU-9",
        &[
            ("BAR write", 8, 400.0, 0.02),
            ("cuMemcpyHtoD", 8, 9000.0, 0.02),
        ],
        &[("BAR write 8 thr", 256 << 20, 12.0, 0.02)],
    );
    let (r, _dir) = compare(&baseline(H100, "GPU-1"), &slower, &[]);
    assert_eq!(r.code, 0, "{}", r.all());
    let d = r.json();
    assert_eq!(d["gpu_match"], "different_gpu");
    assert_eq!(d["judged"], false);
    assert_eq!(d["regressed"], false);
    // The verdicts are still there, as information (cuMemcpyHtoD's as the machine's).
    assert_eq!(d["summary"]["worse"], 2);
    assert_eq!(d["summary"]["machine_moved"], 1);
    assert!(d["notes"][0]
        .as_str()
        .unwrap()
        .contains("different GPUs (NVIDIA H100 80GB HBM3 before, NVIDIA L4 now)"));
    assert!(r.stderr.contains("information only"), "{}", r.all());
    assert!(!r.stderr.contains("REGRESSION"), "{}", r.all());

    // A document without a GPU (no machine section): information only as well.
    let mut unknown = baseline(H100, "GPU-1");
    unknown["machine"] = Value::Null;
    unknown["benchmarks"][0]["reports"][0]["figures"][0]["median"] = 999.0.into();
    let (r, _dir) = compare(&baseline(H100, "GPU-1"), &unknown, &[]);
    assert_eq!(r.code, 0, "{}", r.all());
    let d = r.json();
    assert_eq!(d["gpu_match"], "unknown_gpu");
    assert_eq!(d["summary"]["worse"], 1);
    assert_eq!(d["regressed"], false);
}

#[test]
fn a_baseline_directory_gives_the_one_of_this_gpu_model() {
    let dir = temp_dir("baselines");
    dir.file("README.md", "not a document\n");
    dir.doc("nvidia-l4.json", &baseline("NVIDIA L4", "GPU-9"));
    let h100 = dir.doc("nvidia-h100-80gb-hbm3.json", &baseline(H100, "GPU-1"));
    // Another JSON document (a comparison left here) is passed over.
    dir.doc(
        "comparison.json",
        &json!({ "format": "vkgdr-bench-comparison" }),
    );
    let runs = temp_dir("runs");
    let slow = doc(
        H100,
        "GPU-7",
        &[("BAR write", 8, 300.0, 0.02)],
        &[("BAR write 8 thr", 256 << 20, 33.0, 0.02)],
    );
    // NEW may be the --out directory holding results.json.
    runs.doc("out/results.json", &slow);
    let out = runs.path().join("out");
    let r = run(
        &["compare-bench", dir.arg(), out.to_str().unwrap(), "--json"],
        &[],
    );
    assert_eq!(r.code, 3, "{}", r.all());
    let d = r.json();
    assert_eq!(d["baseline"]["file"], h100.as_str());
    assert_eq!(d["gpu_match"], "same_model");
    assert_eq!(
        d["current"]["file"],
        out.join("results.json").to_str().unwrap()
    );

    // A GPU without a baseline: nothing compared, the file to record named, exit 0.
    let l40 = runs.doc("l40.json", &baseline("NVIDIA L40S", "GPU-3"));
    let r = run(&["compare-bench", dir.arg(), &l40, "--json"], &[]);
    assert_eq!(r.code, 0, "{}", r.all());
    let d = r.json();
    check_opening(&d);
    assert!(d["baseline"].is_null());
    assert_eq!(d["gpu_match"], "no_baseline");
    assert_eq!(d["figures"], json!([]));
    let note = d["notes"][0].as_str().unwrap();
    assert!(
        note.contains("no baseline recorded on NVIDIA L40S") && note.contains("nvidia-l40s.json"),
        "{note}"
    );
    assert!(r.stderr.contains("no baseline"), "{}", r.all());
}

#[test]
fn malformed_files_are_named_with_exit_code_2() {
    let dir = temp_dir("malformed");
    let good = dir.doc("good.json", &baseline(H100, "GPU-1"));
    let mut no_median = baseline(H100, "GPU-1");
    no_median["benchmarks"][0]["reports"][0]["figures"][1]
        .as_object_mut()
        .unwrap()
        .remove("median");
    let mut newer = baseline(H100, "GPU-1");
    newer["format_version"] = 99.into();
    let info = json!({ "format": "vkgdr-info", "format_version": 1, "machine": {} });
    let cases = [
        (
            dir.file("truncated.json", "{\"format\": \"vkgdr-bench\", "),
            "not JSON (",
        ),
        (dir.file("empty.json", ""), "not JSON ("),
        (
            dir.file("notes.txt", "hello"),
            "not JSON (expected value at line 1 column 1)",
        ),
        (
            dir.doc("info.json", &info),
            "a vkgdr-info document, not results of `vkgdr bench`",
        ),
        (
            dir.doc("array.json", &json!([1, 2])),
            "not a JSON object, not results of `vkgdr bench`",
        ),
        (
            dir.doc("no-format.json", &json!({ "benchmarks": [] })),
            "a JSON object without a \"format\"",
        ),
        (
            dir.doc("no-median.json", &no_median),
            "malformed `vkgdr bench` results: missing field `median` at line",
        ),
        (dir.doc("newer.json", &newer), "format_version 99 is newer"),
        (
            dir.path()
                .join("missing.json")
                .to_str()
                .unwrap()
                .to_string(),
            "No such file or directory",
        ),
    ];
    for (bad, says) in &cases {
        for args in [
            ["compare-bench", bad.as_str(), good.as_str()],
            ["compare-bench", good.as_str(), bad.as_str()],
        ] {
            let mut args = args.to_vec();
            args.push("--json");
            let r = run(&args, &[]);
            assert_eq!(r.code, 2, "{args:?}\n{}", r.all());
            assert!(r.stdout.is_empty(), "{args:?}\n{}", r.all());
            let line = format!("xtask compare-bench: {bad}: ");
            assert!(
                r.stderr.contains(&line) && r.stderr.contains(says),
                "{args:?}: want {line:?} and {says:?}\n{}",
                r.all()
            );
        }
    }
    // A broken document in a baseline directory is an error too, named.
    let baselines = temp_dir("broken-baselines");
    let broken = baselines.file("nvidia-h100.json", "{");
    let r = run(&["compare-bench", baselines.arg(), &good], &[]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(
        r.stderr.contains(&format!("{broken}: not JSON")),
        "{}",
        r.all()
    );
    // A directory as NEW must hold results.json.
    let r = run(&["compare-bench", &good, baselines.arg()], &[]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(
        r.stderr.contains("no results.json in this directory"),
        "{}",
        r.all()
    );
}

#[test]
fn usage_errors_exit_2() {
    for (args, says) in [
        (&["compare-bench"][..], "<BASELINE>"),
        (&["compare-bench", "a"], "<NEW>"),
        (&["compare-bench", "a", "b", "c"], "'c'"),
        (
            &["compare-bench", "a", "b", "--tolerance", "x"],
            "--tolerance <PCT>",
        ),
        (&["compare-bench", "a", "b", "--tolerance", "1001"], "1001"),
    ] {
        let r = run(args, &[]);
        assert_eq!(r.code, 2, "{args:?}\n{}", r.all());
        assert!(r.stderr.contains(says), "{args:?}: {says:?}\n{}", r.all());
    }
    let r = run(&["compare-bench", "--help"], &[]);
    assert_eq!(r.code, 0, "{}", r.all());
    for text in [
        "Usage: xtask compare-bench [OPTIONS] <BASELINE> <NEW>",
        "[default: 10]",
        "3  a figure got worse",
    ] {
        assert!(r.stdout.contains(text), "{text:?}\n{}", r.all());
    }
}
