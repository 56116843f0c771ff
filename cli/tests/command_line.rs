//! The `vkgdr` command as a user meets it, end to end on a machine without a GPU: parsing errors
//! with suggestions and exit code 2, `--help` and `--version` on every command with defaults and
//! exit codes, shell completions, `--json` documents read back whole, progress drawn only on a
//! terminal and never under `--quiet`, and the README showing the help the program prints.
//!
//! The GPU work itself is not run here: every case that needs the CUDA driver runs with
//! `VKGDR_CUDA_LIBRARY` naming a missing file, so it fails the same way on any machine (the GPU
//! machine runs `vkgdr bench all` and `vkgdr soak` for real). Not part of the GPU bundle: it runs
//! the binary of the build tree and reads the repository (README, docs/bench). Needs lavapipe,
//! bash and util-linux `script` (a pseudo-terminal), which CI has.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{lavapipe_manifest, run, temp_dir, TempDirExt, INHERITED, NO_CUDA};
use serde_json::Value;
use tempfile::TempDir;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

// --- Parsing ---------------------------------------------------------------------------------------

#[test]
fn unknown_options_are_usage_errors_with_exit_code_2() {
    for args in [
        &["soak", "--bogus"][..],
        &["info", "--bogus"],
        &["bench", "copybw", "--bogus"],
        &["--bogus"],
        &["completions", "bash", "--bogus"],
    ] {
        let r = run(args, &[]);
        assert_eq!(r.code, 2, "{args:?}\n{}", r.all());
        assert!(
            r.stderr.contains("unexpected argument '--bogus'"),
            "{args:?}\n{}",
            r.all()
        );
        assert!(r.stderr.contains("Usage: vkgdr"), "{}", r.all());
        assert!(r.stdout.is_empty(), "{}", r.all());
    }
}

#[test]
fn typos_get_a_suggestion() {
    for (args, wrong, right) in [
        (&["soak", "--second", "5"][..], "--second", "--seconds"),
        (&["soak", "--exhaust", "5"], "--exhaust", "--exhaust-every"),
        (&["info", "--chek"], "--chek", "--check"),
        (&["bench", "copybww"], "copybww", "copybw"),
        (&["bench", "pplat", "--quik"], "--quik", "--quick"),
        (&["bnch", "all"], "bnch", "bench"),
        (&["completions", "bsh"], "bsh", "bash"),
    ] {
        let r = run(args, &[]);
        assert_eq!(r.code, 2, "{args:?}\n{}", r.all());
        assert!(r.stderr.contains(&format!("'{wrong}'")), "{}", r.all());
        assert!(
            r.stderr.contains("similar") && r.stderr.contains(&format!("'{right}'")),
            "{args:?}: no suggestion of {right}\n{}",
            r.all()
        );
    }
}

#[test]
fn bad_values_are_named() {
    for (args, says) in [
        (
            &["soak", "--seconds", "ten"][..],
            "invalid value 'ten' for '--seconds <N>'",
        ),
        (&["soak", "--threads", "0"], "must be at least 1"),
        (&["soak", "--exhaust-every", "0"], "must be at least 1"),
        (
            &["soak", "--seconds"],
            "a value is required for '--seconds <N>'",
        ),
        (&["bench"], "Usage: vkgdr bench [OPTIONS] <BENCHMARK>"),
        (&["bench", "plot"], "<DIR>"),
        (&["bench", "all", "--out="], "--out <DIR>"),
        (&["bench", "copybw", "pplat"], "'pplat'"),
        (&["bench", "--quick", "copybw"], "'--quick'"),
        (&["completions"], "<SHELL>"),
        // Devices: an ordinal or a UUID; a list or `all` where several make sense.
        (
            &["soak", "--device", "GPU-12"],
            "invalid value 'GPU-12' for '--device <N|UUID>': \"GPU-12\" is neither a CUDA \
             ordinal (0, 1, ...) nor a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx",
        ),
        (
            &["soak", "--device", "all"],
            "--device names one device; `--devices all` (info, soak) names every one",
        ),
        (
            &["bench", "copylat", "--device", "-1"],
            "unexpected argument '-1'",
        ),
        (
            &["bench", "copylat", "--device", "0,1"],
            "invalid value '0,1' for '--device <N|UUID>'",
        ),
        (
            &["bench", "all", "--devices", "all"],
            "unexpected argument '--devices'",
        ),
        (
            &["soak", "--devices", "0,,1"],
            "invalid value '0,,1' for '--devices <all|LIST>': \"0,,1\" has an empty item",
        ),
        (
            &["soak", "--device", "0", "--devices", "all"],
            "the argument '--device <N|UUID>' cannot be used with '--devices <all|LIST>'",
        ),
        (
            &["info", "--device", "1", "--devices", "0"],
            "cannot be used with '--devices <all|LIST>'",
        ),
    ] {
        let r = run(args, &[]);
        assert_eq!(r.code, 2, "{args:?}\n{}", r.all());
        assert!(r.stderr.contains(says), "{args:?}: {says:?}\n{}", r.all());
    }
}

// --- Help, version, completions ----------------------------------------------------------------------

#[test]
fn every_command_has_help_and_version() {
    let version = format!("vkgdr {}\n", env!("CARGO_PKG_VERSION"));
    for cmd in [
        &[][..],
        &["info"],
        &["bench"],
        &["bench", "plot"],
        &["bench", "copybw"],
        &["bench", "all"],
        &["soak"],
        &["completions"],
    ] {
        for flag in ["--help", "-h"] {
            let r = run(&[cmd, &[flag]].concat(), &[]);
            assert_eq!(r.code, 0, "{cmd:?} {flag}\n{}", r.all());
            let usage = format!("Usage: vkgdr {}", cmd.join(" "));
            assert!(r.stdout.contains(usage.trim_end()), "{cmd:?}\n{}", r.all());
        }
        for flag in ["--version", "-V"] {
            let r = run(&[cmd, &[flag]].concat(), &[]);
            assert_eq!(
                (r.code, r.stdout.as_str()),
                (0, version.as_str()),
                "{cmd:?} {flag}"
            );
        }
    }
    // `help` works as a command too.
    let r = run(&["help", "soak"], &[]);
    assert_eq!(r.code, 0);
    assert!(r.stdout.contains("Usage: vkgdr soak"), "{}", r.all());
}

#[test]
fn help_shows_defaults_and_exit_codes() {
    let soak = run(&["soak", "--help"], &[]).stdout;
    for text in [
        "[default: 600]",
        "[default: 8]",
        "[default: 30]",
        "Exit status:",
        "0  SOAK PASSED",
        "1  SOAK FAILED",
        "2  the command line is wrong",
        "--json",
    ] {
        assert!(soak.contains(text), "soak --help lacks {text:?}:\n{soak}");
    }
    let info = run(&["info", "--help"], &[]).stdout;
    for text in ["Exit status:", "1  with --check", "--json"] {
        assert!(info.contains(text), "info --help lacks {text:?}:\n{info}");
    }
    let bench = run(&["bench", "--help"], &[]).stdout;
    for text in [
        "Benchmarks:",
        // Each benchmark with its line of help, in words a user reads.
        "fastpath  the default API's writes, reads and pool cache",
        "all       all 10 but xproc in turn",
        "plot ",
        "Exit status:",
    ] {
        assert!(
            bench.contains(text),
            "bench --help lacks {text:?}:\n{bench}"
        );
    }
    let plot = run(&["bench", "plot", "--help"], &[]).stdout;
    for text in [
        "Exit status:",
        "1  DIR/results.json could not be read, or a chart could not be drawn",
        "2  the command line is wrong, or DIR holds no results.json",
    ] {
        assert!(
            plot.contains(text),
            "bench plot --help lacks {text:?}:\n{plot}"
        );
    }
    let copybw = run(&["bench", "copybw", "--help"], &[]).stdout;
    for text in [
        "[default: bench-out]",
        "--quick",
        "--json",
        "copybw-write.csv and .png: Write bandwidth, host to GPU memory",
        "each figure against \"HtoD pinned\"",
        "Exit status:",
    ] {
        assert!(
            copybw.contains(text),
            "bench copybw --help lacks {text:?}:\n{copybw}"
        );
    }
}

#[test]
fn completions_for_every_shell() {
    for (shell, marks) in [
        ("bash", &["_vkgdr()", "complete -F _vkgdr"][..]),
        ("zsh", &["#compdef vkgdr", "_vkgdr"]),
        ("fish", &["complete -c vkgdr"]),
        ("elvish", &["edit:completion:arg-completer[vkgdr]"]),
        ("powershell", &["Register-ArgumentCompleter"]),
    ] {
        let r = run(&["completions", shell], &[]);
        assert_eq!(r.code, 0, "{shell}\n{}", r.all());
        for m in marks {
            assert!(r.stdout.contains(m), "{shell} script lacks {m:?}");
        }
        for word in ["soak", "bench", "exhaust-every", "copybw"] {
            assert!(r.stdout.contains(word), "{shell} script lacks {word}");
        }
    }
}

/// What bash's completion offers for `words`, the last one being completed.
fn bash_complete(script: &Path, words: &[&str]) -> Vec<String> {
    let line = words.join(" ");
    let program = format!(
        "source {}; COMP_WORDS=({line}); COMP_CWORD={}; COMP_LINE='{line}'; COMP_POINT={}; \
         _vkgdr vkgdr '{}' '{}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        words.len() - 1,
        line.len(),
        words[words.len() - 1],
        words[words.len() - 2],
    );
    let out = Command::new("bash")
        .args(["--norc", "-c", &program])
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect()
}

#[test]
fn bash_completes_commands_options_and_benchmarks() {
    let dir = temp_dir("bash");
    let script = dir.path().join("vkgdr.bash");
    let r = run(&["completions", "bash"], &[]);
    std::fs::write(&script, &r.stdout).unwrap();
    assert_eq!(bash_complete(&script, &["vkgdr", "so"]), ["soak"]);
    assert_eq!(
        bash_complete(&script, &["vkgdr", "soak", "--ex"]),
        ["--exhaust-every"]
    );
    assert_eq!(
        bash_complete(&script, &["vkgdr", "bench", "copy"]),
        ["copybw", "copylat"]
    );
}

// --- JSON ------------------------------------------------------------------------------------------

fn check_opening_without_machine(doc: &Value, format: &str) {
    assert_eq!(doc["format"], format, "{doc:#}");
    assert_eq!(doc["format_version"], 1);
    assert_eq!(doc["vkgdr_version"], env!("CARGO_PKG_VERSION"));
}

fn check_opening(doc: &Value, format: &str) {
    check_opening_without_machine(doc, format);
    let machine = &doc["machine"];
    assert!(machine["cpu"]["hardware_threads"].as_u64().unwrap() >= 1);
    assert!(machine["cpu"]["copy_routines"].is_string());
    let handshake = machine["cpu"]["thread_cache_handshake"].as_str();
    assert!(
        matches!(handshake, Some("membarrier" | "fence")),
        "{handshake:?}"
    );
}

#[test]
fn info_json_on_lavapipe_without_cuda() {
    let manifest = lavapipe_manifest();
    let env = [("VK_DRIVER_FILES", manifest.as_str()), NO_CUDA];
    let r = run(&["info", "--json"], &env);
    assert_eq!(r.code, 0, "{}", r.all());
    let doc = r.json();
    check_opening(&doc, "vkgdr-info");
    let m = &doc["machine"];
    assert_eq!(m["vulkan"]["status"], "ok");
    let dev = &m["vulkan"]["devices"][0];
    assert!(dev["name"].as_str().unwrap().contains("llvmpipe"), "{m:#}");
    assert_eq!(dev["external_memory_fd"], true);
    assert!(dev["max_allocation_size_bytes"].as_u64().unwrap() > 0);
    assert!(dev["memory_types"][0]["flags"]
        .as_array()
        .unwrap()
        .contains(&"HOST_VISIBLE".into()));
    assert_eq!(m["cuda"]["status"], "driver_missing");
    assert!(m["cuda"]["error"]
        .as_str()
        .unwrap()
        .contains("/nonexistent/libcuda.so.1"));
    assert_eq!(m["cuda"]["devices"], Value::Array(vec![]));
    assert_eq!(m["usable"], false);
    let problems: Vec<&str> = m["diagnosis"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["problem"].as_str().unwrap())
        .collect();
    assert!(
        problems.contains(&"no_nvidia_vulkan_device"),
        "{problems:?}"
    );
    assert!(problems.contains(&"no_cuda_driver"), "{problems:?}");
    for f in m["diagnosis"].as_array().unwrap() {
        assert!(!f["fix"].as_str().unwrap().is_empty());
    }
    assert!(r.stderr.is_empty(), "{}", r.all());

    // --check keeps its meaning with --json: exit 1, and still one document.
    let r = run(&["info", "--json", "--check"], &env);
    assert_eq!(r.code, 1, "{}", r.all());
    assert_eq!(r.json()["machine"]["usable"], false);
}

#[test]
fn info_json_without_a_vulkan_loader() {
    let r = run(
        &["info", "--json"],
        &[
            ("VKGDR_VULKAN_LIBRARY", "/nonexistent/libvulkan.so.1"),
            NO_CUDA,
        ],
    );
    assert_eq!(r.code, 0, "{}", r.all());
    let doc = r.json();
    check_opening(&doc, "vkgdr-info");
    assert_eq!(doc["machine"]["vulkan"]["status"], "loader_missing");
    assert_eq!(
        doc["machine"]["diagnosis"][0]["problem"],
        "no_vulkan_loader"
    );
    assert_eq!(doc["machine"]["diagnosis"][0]["severity"], "error");
}

#[test]
fn bench_json_without_a_gpu_says_what_stopped_it() {
    let out = temp_dir("bench-json");
    let r = run(&["bench", "all", "--json", "--out", out.arg()], &[NO_CUDA]);
    assert_eq!(r.code, 1, "{}", r.all());
    let doc = r.json();
    check_opening(&doc, "vkgdr-bench");
    assert_eq!(doc["ok"], false);
    assert!(doc["error"].is_null(), "the run itself was not stopped");
    assert_eq!(doc["mode"], "full");
    assert_eq!(doc["out_dir"], out.arg());
    // The first benchmark finds no driver; the rest are not tried.
    let runs = doc["benchmarks"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{doc:#}");
    assert_eq!(runs[0]["name"], "apiperf");
    assert!(runs[0]["error"].as_str().unwrap().contains("libcuda.so.1"));
    assert_eq!(doc["machine"]["cuda"]["status"], "driver_missing");
    // The human text went to stderr, and the same document to DIR/results.json.
    assert!(r.stderr.contains("apiperf failed"), "{}", r.all());
    let file = std::fs::read_to_string(out.path().join("results.json")).unwrap();
    assert_eq!(serde_json::from_str::<Value>(&file).unwrap(), doc);
    assert!(out.path().join("summary.md").exists());
}

#[test]
fn bench_json_when_the_output_cannot_be_written() {
    let dir = temp_dir("bench-unwritable");
    // A file where the output directory should be.
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let r = run(
        &[
            "bench",
            "copylat",
            "--json",
            "--out",
            file.to_str().unwrap(),
        ],
        &[NO_CUDA],
    );
    assert_eq!(r.code, 1, "{}", r.all());
    let doc = r.json();
    check_opening_without_machine(&doc, "vkgdr-bench");
    assert_eq!(doc["ok"], false);
    assert!(doc["error"].as_str().unwrap().contains("a-file"), "{doc:#}");
    assert_eq!(doc["benchmarks"], Value::Array(vec![]));
    assert!(r.stderr.contains("vkgdr bench: "), "{}", r.all());
}

#[test]
fn soak_json_without_a_gpu_fails_with_the_reason() {
    let r = run(&["soak", "--seconds", "1", "--json"], &[NO_CUDA]);
    assert_eq!(r.code, 1, "{}", r.all());
    let doc = r.json();
    check_opening(&doc, "vkgdr-soak");
    assert_eq!(doc["passed"], false);
    assert!(doc["error"].as_str().unwrap().contains("libcuda.so.1"));
    assert_eq!(doc["options"]["seconds"], 1);
    assert_eq!(doc["options"]["threads"], 8);
    assert_eq!(doc["options"]["exhaust_every_seconds"], 30);
    assert!(doc["before"].is_null() && doc["checks"] == Value::Array(vec![]));
    assert!(r.stderr.contains("SOAK FAILED"), "{}", r.all());
}

#[test]
fn device_options_parse_and_meet_a_machine_without_cuda() {
    let uuid = "GPU-00000000-0000-0000-0000-000000000001";
    // Every device of a soak in one process: `--devices all` parses; without CUDA it cannot
    // start, and says why in its document.
    let r = run(
        &["soak", "--devices", "all", "--seconds", "1", "--json"],
        &[NO_CUDA],
    );
    assert_eq!(r.code, 1, "{}", r.all());
    let doc = r.json();
    assert_eq!(doc["options"]["devices"], "all");
    assert!(
        doc["error"].as_str().unwrap().contains("libcuda.so.1"),
        "{doc:#}"
    );
    assert_eq!(doc["devices"], Value::Array(vec![]));
    // One device by UUID, with or without its prefix; a list.
    for device in [uuid, &uuid[4..]] {
        let r = run(&["soak", "--device", device, "--json"], &[NO_CUDA]);
        assert_eq!(r.code, 1, "{}", r.all());
        assert_eq!(r.json()["options"]["devices"], uuid);
    }
    let r = run(
        &["soak", "--devices", &format!("1,{uuid}"), "--json"],
        &[NO_CUDA],
    );
    assert_eq!(r.json()["options"]["devices"], format!("1,{uuid}"));
    // The benchmarks' device: named in their document once one is opened; without CUDA none is.
    let out = temp_dir("bench-device");
    let r = run(
        &[
            "bench",
            "copylat",
            "--device",
            uuid,
            "--json",
            "--out",
            out.arg(),
        ],
        &[NO_CUDA],
    );
    assert_eq!(r.code, 1, "{}", r.all());
    let doc = r.json();
    assert!(doc["device"].is_null(), "{doc:#}");
    assert!(doc["benchmarks"][0]["error"]
        .as_str()
        .unwrap()
        .contains("libcuda.so.1"));
}

#[test]
fn info_names_a_device_that_is_not_here_and_the_devices_that_are() {
    let manifest = lavapipe_manifest();
    let env = [("VK_DRIVER_FILES", manifest.as_str()), NO_CUDA];
    let uuid = "GPU-00000000-0000-0000-0000-000000000001";
    for args in [
        &["info", "--device", uuid][..],
        &["info", "--check", "--devices", &format!("0,{uuid}")],
    ] {
        let r = run(args, &env);
        assert_eq!(
            r.code,
            1,
            "{args:?}
{}",
            r.all()
        );
        assert!(
            r.stderr.contains("vkgdr info: no CUDA device ")
                && r.stderr
                    .contains(" here; no CUDA device is present (CUDA: ")
                && r.stderr.contains("/nonexistent/libcuda.so.1"),
            "{args:?}
{}",
            r.all()
        );
        assert!(r.stdout.is_empty(), "{}", r.all());
    }
    // The document says so too, and which devices it would have checked is left empty.
    let r = run(&["info", "--device", "3", "--json"], &env);
    assert_eq!(r.code, 1, "{}", r.all());
    let doc = r.json();
    assert!(doc["checked"].is_null());
    assert!(doc["error"]
        .as_str()
        .unwrap()
        .starts_with("no CUDA device 3 here; no CUDA device is present"));
    // `--devices all` is what info does anyway: every device there is, none here.
    let r = run(&["info", "--devices", "all", "--json"], &env);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(r.json()["checked"]["devices"], Value::Array(vec![]));
    assert_eq!(r.json()["checked"]["usable"], false);
}

#[test]
fn soak_without_a_gpu_exits_1() {
    let r = run(&["soak", "--seconds", "1"], &[NO_CUDA]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stderr.contains("SOAK FAILED"), "{}", r.all());
    assert!(r.stdout.is_empty(), "{}", r.all());
}

// --- Progress --------------------------------------------------------------------------------------

/// A directory holding the published results.json, for `vkgdr bench plot` (which shows
/// progress and needs no GPU).
fn plot_dir() -> TempDir {
    let dir = temp_dir("plot");
    let results = repo().join("docs/bench/results.json");
    std::fs::copy(results, dir.path().join("results.json")).unwrap();
    dir
}

#[test]
fn plot_redraws_every_chart_of_results_json() {
    let dir = plot_dir();
    let r = run(&["bench", "plot", dir.arg()], &[]);
    assert_eq!(r.code, 0, "{}", r.all());
    for name in ["copylat", "waits-idle", "ring-wrap"] {
        let png = std::fs::read(dir.path().join(format!("{name}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{name}");
    }
}

#[test]
fn compare_sets_two_runs_side_by_side() {
    // docs/bench/results.json against itself: every figure paired, nothing moved.
    let dir = plot_dir();
    let r = run(&["bench", "compare", dir.arg(), dir.arg()], &[]);
    assert_eq!(r.code, 0, "{}", r.all());
    let last = r.stdout.lines().last().unwrap_or_default();
    assert!(
        last.contains("figures compared: 0 worse and 0 better beyond 10 %"),
        "{}",
        r.all()
    );
    // A run that doubles every median: times worse, rates better; exit 3.
    let mut doc: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("results.json")).unwrap())
            .unwrap();
    for run in doc["benchmarks"].as_array_mut().unwrap() {
        for report in run["reports"].as_array_mut().unwrap() {
            for f in report["figures"].as_array_mut().unwrap() {
                f["median"] = Value::from(f["median"].as_f64().unwrap_or(0.0) * 2.0);
            }
        }
    }
    let slower = dir.doc("slower.json", &doc);
    let r = run(&["bench", "compare", dir.arg(), &slower], &[]);
    assert_eq!(r.code, 3, "{}", r.all());
    assert!(r.stdout.contains(" worse"), "{}", r.all());
    assert!(r.stdout.contains(" better"), "{}", r.all());
    // A file that is no results, or none at all: exit 2, named.
    let soak = dir.file("soak.json", "{\"format\": \"vkgdr-soak\"}");
    for bad in [soak.as_str(), "/nonexistent/results.json"] {
        let r = run(&["bench", "compare", dir.arg(), bad], &[]);
        assert_eq!(r.code, 2, "{}", r.all());
        assert!(r.stderr.contains(bad), "{}", r.all());
    }
    // A run with --compare: the benchmark fails without a driver (exit 1) and the comparison
    // of what it wrote still comes; a baseline that cannot be read stops it before it runs.
    let out = dir.path().join("out");
    let r = run(
        &[
            "bench",
            "copylat",
            "--out",
            out.to_str().unwrap(),
            "--compare",
            dir.arg(),
        ],
        &[NO_CUDA],
    );
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stdout.contains("0 figures compared"), "{}", r.all());
    assert!(out.join("results.json").is_file());
    let out2 = dir.path().join("out2");
    let r = run(
        &[
            "bench",
            "copylat",
            "--out",
            out2.to_str().unwrap(),
            "--compare",
            &soak,
        ],
        &[NO_CUDA],
    );
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(
        r.stderr.contains(&format!("vkgdr bench: --compare {soak}")),
        "{}",
        r.all()
    );
    assert!(!out2.exists(), "a benchmark ran");
}

#[test]
fn plot_without_results_is_a_usage_error() {
    let dir = temp_dir("plot-empty");
    let r = run(&["bench", "plot", dir.arg()], &[]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(
        r.stderr
            .contains(&format!("vkgdr bench: no results.json in {}", dir.arg())),
        "{}",
        r.all()
    );
    // A file that is no results of `vkgdr bench` is named.
    std::fs::write(
        dir.path().join("results.json"),
        "{\"format\": \"vkgdr-soak\"}",
    )
    .unwrap();
    let r = run(&["bench", "plot", dir.arg()], &[]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(
        r.stderr.contains("not results of `vkgdr bench`"),
        "{}",
        r.all()
    );
}

/// Whether `text` holds what indicatif draws on a terminal: carriage returns and the
/// erase-line escape between redraws.
fn has_progress(text: &str) -> bool {
    text.contains("\x1b[2K")
}

#[test]
fn no_progress_when_output_is_not_a_terminal() {
    let dir = plot_dir();
    let r = run(&["bench", "plot", dir.arg()], &[]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert!(
        r.stdout.contains("Write latency, host to GPU memory"),
        "{}",
        r.all()
    );
    assert!(r.stdout.contains("wrote "), "{}", r.all());
    for text in [&r.stdout, &r.stderr] {
        assert!(
            !text.contains('\x1b') && !text.contains('\r'),
            "{}",
            r.all()
        );
    }
}

/// Runs `vkgdr ARGS` on a pseudo-terminal (util-linux `script`), returning what the terminal
/// showed.
fn on_a_terminal(args: &[&str]) -> String {
    let exe = env!("CARGO_BIN_EXE_vkgdr");
    let line = std::iter::once(exe)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let mut cmd = Command::new("script");
    cmd.args(["-qec", &line, "/dev/null"])
        .env("TERM", "xterm")
        .env("COLUMNS", "100")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for v in INHERITED.iter().filter(|v| **v != "COLUMNS") {
        cmd.env_remove(v);
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| {
        panic!("util-linux `script` is needed to run vkgdr on a terminal ({e})")
    });
    drop(child.stdin.take().map(|mut s| s.flush()));
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn progress_on_a_terminal_and_never_under_quiet() {
    let dir = plot_dir();
    let shown = on_a_terminal(&["bench", "plot", dir.arg()]);
    assert!(
        has_progress(&shown),
        "no progress drawn on a terminal:\n{shown:?}"
    );
    assert!(shown.contains("plot charts"), "{shown:?}");
    assert!(shown.contains("wrote "), "{shown:?}");

    let quiet = on_a_terminal(&["bench", "plot", dir.arg(), "--quiet"]);
    assert!(
        !has_progress(&quiet),
        "progress drawn under --quiet:\n{quiet:?}"
    );
    assert!(
        !quiet.contains("wrote "),
        "status lines under --quiet:\n{quiet:?}"
    );
    assert!(
        quiet.contains("Write latency, host to GPU memory"),
        "{quiet:?}"
    );
}

// --- The README ------------------------------------------------------------------------------------

#[test]
fn the_readme_shows_the_help_the_program_prints() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    for args in [
        &["--help"][..],
        &["info", "-h"],
        &["bench", "-h"],
        &["bench", "copylat", "-h"],
        &["soak", "-h"],
    ] {
        let r = run(args, &[]);
        assert_eq!(r.code, 0);
        let block = format!("$ vkgdr {}\n{}```", args.join(" "), r.stdout);
        assert!(
            readme.contains(&block),
            "README.md does not show `vkgdr {}` as the program prints it; paste this into the \
             README's command-line section:\n```text\n{block}\n",
            args.join(" ")
        );
    }
}
