//! The C library as C programs see it: `scripts/install-c` installs the freshly built library
//! under a temporary prefix, then the programs of `tests/c/` are compiled with the system C
//! compiler against the installed header (through pkg-config) and linked against the shared
//! and the static library, and run. `make install PREFIX=/usr DESTDIR=...` (the top-level
//! Makefile, as vkgdr 0.1's users type it) must stage the same files, with a `vkgdr.pc` that
//! names `/usr`.
//!
//! Needs `cc`, `c++`, `make`, `pkg-config` and NVIDIA's `<cuda.h>` (`scripts/cuda-header`
//! fetches it; `scripts/test` runs it), and for the pool and sharing tests a Vulkan driver with
//! exportable memory (lavapipe on CI). The GPU programs of `tests/gpu/` run in `scripts/gpu-check` instead.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Where `<cuda.h>` is: `VKGDR_CUDA_INCLUDE`, `$CUDA_HOME/include`, `/usr/local/cuda/include`, or
/// what `scripts/cuda-header` unpacked into `target/cuda/include`.
fn cuda_include() -> PathBuf {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("VKGDR_CUDA_INCLUDE") {
        candidates.push(d.into());
    }
    if let Some(d) = std::env::var_os("CUDA_HOME") {
        candidates.push(Path::new(&d).join("include"));
    }
    candidates.push("/usr/local/cuda/include".into());
    candidates.push(crate_dir().join("../target/cuda/include"));
    candidates
        .into_iter()
        .find(|d| d.join("cuda.h").is_file())
        .unwrap_or_else(|| {
            panic!(
                "no <cuda.h>: run scripts/cuda-header (NVIDIA's header from PyPI into \
                 target/cuda/include) or set VKGDR_CUDA_INCLUDE"
            )
        })
}

/// Builds `libvkgdr_capi.{so,a}` and returns the directory they are in, the one this test's
/// executable lives under (`deps/`). Cargo builds only the Rust library for a test, so the C
/// libraries are built here, with the profile of this test run (its dependencies are built
/// already).
fn built_lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    // The profile's output directory is named after it, except the dev profile's (`debug`),
    // which tests build with the test profile.
    let profile = match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "test",
        Some(name) => name,
    };
    let out = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "-p", "vkgdr-capi", "--lib"])
        .args(["--profile", profile])
        .current_dir(crate_dir())
        .output()
        .expect("run cargo");
    assert!(
        out.status.success(),
        "building the C library failed: {}",
        text(&out)
    );
    assert!(
        dir.join("libvkgdr_capi.so").is_file() && dir.join("libvkgdr_capi.a").is_file(),
        "libvkgdr_capi.so/.a not found in {}",
        dir.display()
    );
    dir
}

/// The install prefix, installed once per test run with the project's own install command.
fn prefix() -> &'static Path {
    static PREFIX: OnceLock<PathBuf> = OnceLock::new();
    PREFIX.get_or_init(|| {
        let prefix = Path::new(env!("CARGO_TARGET_TMPDIR")).join("capi-prefix");
        let _ = std::fs::remove_dir_all(&prefix);
        let out = Command::new(crate_dir().join("../scripts/install-c"))
            .arg(&prefix)
            .env("VKGDR_LIB_DIR", built_lib_dir())
            .env("CUDA_INCLUDE", cuda_include())
            .output()
            .expect("run scripts/install-c");
        assert!(out.status.success(), "install-c failed: {}", text(&out));
        prefix
    })
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn pkg_config(args: &[&str]) -> Vec<String> {
    pkg_config_in(&prefix().join("lib/pkgconfig"), None, args)
}

/// `pkg-config ARGS vkgdr` with `vkgdr.pc` from `dir`, and `PKG_CONFIG_SYSROOT_DIR` if given.
fn pkg_config_in(dir: &Path, sysroot: Option<&Path>, args: &[&str]) -> Vec<String> {
    let mut cmd = Command::new("pkg-config");
    cmd.args(args)
        .arg("vkgdr")
        .env("PKG_CONFIG_PATH", dir)
        .env_remove("PKG_CONFIG_SYSROOT_DIR");
    if let Some(root) = sysroot {
        cmd.env("PKG_CONFIG_SYSROOT_DIR", root);
    }
    let out = cmd.output().expect("run pkg-config");
    assert!(out.status.success(), "pkg-config {args:?}: {}", text(&out));
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Every file and link under `dir`, relative, sorted, with its contents (a link's target).
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.push((rel, target.into_os_string().into_encoded_bytes()));
            } else if meta.is_dir() {
                walk(root, &path, out);
            } else {
                out.push((rel, std::fs::read(&path).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Link {
    Shared,
    Static,
}

/// Compiles `source` (from `tests/c/`) with warnings as errors and links it against the installed
/// library; returns the executable.
fn build(source: &str, link: Link) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("capi-programs");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join(format!("{source}-{link:?}").replace('.', "_"));
    let cxx = source.ends_with(".cpp");
    let mut cmd = Command::new(if cxx { "c++" } else { "cc" });
    cmd.arg(if cxx { "-std=c++11" } else { "-std=c11" })
        .args(["-Wall", "-Wextra", "-Werror", "-pedantic", "-pthread", "-o"])
        .arg(&exe)
        .arg(crate_dir().join("tests/c").join(source))
        .args(pkg_config(&["--cflags"]));
    let lib = prefix().join("lib");
    match link {
        Link::Shared => {
            cmd.args(pkg_config(&["--libs"]))
                .arg(format!("-Wl,-rpath,{}", lib.display()));
        }
        Link::Static => {
            cmd.arg(lib.join("libvkgdr.a")).args(
                pkg_config(&["--static", "--libs-only-l"])
                    .into_iter()
                    .filter(|l| l != "-lvkgdr"),
            );
        }
    }
    cmd.arg("-ldl");
    let out = cmd.output().expect("run the C compiler");
    assert!(
        out.status.success(),
        "{source} ({link:?}) did not build:\n{}",
        text(&out)
    );
    exe
}

/// Runs a test program with `args`; it must exit 0 and print its summary.
fn run(exe: &Path, args: &[&Path], expect: &str) -> String {
    let out = Command::new(exe)
        .args(args)
        .output()
        .expect("run the test program");
    let all = text(&out);
    assert!(out.status.success(), "{} failed:\n{all}", exe.display());
    assert!(
        all.contains(expect),
        "{} printed no `{expect}`:\n{all}",
        exe.display()
    );
    all
}

/// The `NEEDED` entries of an executable (`readelf -d`).
fn needed(exe: &Path) -> String {
    let out = Command::new("readelf").arg("-d").arg(exe).output().unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn install_lays_out_libraries_header_and_pkg_config() {
    let p = prefix();
    for f in [
        "lib/libvkgdr.so.1",
        "lib/libvkgdr.a",
        "include/vkgdr.h",
        "include/vkgdr/ordering.cuh",
        "include/vkgdr/ring.cuh",
        "include/vkgdr/ring_d2h.cuh",
        "lib/pkgconfig/vkgdr.pc",
    ] {
        assert!(p.join(f).is_file(), "{f} not installed");
    }
    let link = std::fs::read_link(p.join("lib/libvkgdr.so")).unwrap();
    assert_eq!(link, Path::new("libvkgdr.so.1"));
    let out = Command::new("readelf")
        .arg("-d")
        .arg(p.join("lib/libvkgdr.so.1"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Library soname: [libvkgdr.so.1]"),
        "SONAME is not vkgdr 0.1's libvkgdr.so.1"
    );
    assert_eq!(
        std::fs::read(p.join("include/vkgdr.h")).unwrap(),
        std::fs::read(crate_dir().join("../include/vkgdr.h")).unwrap()
    );
    let cflags = pkg_config(&["--cflags"]);
    assert!(cflags.contains(&format!("-I{}", p.join("include").display())));
    assert!(cflags
        .iter()
        .any(|f| Path::new(&f[2..]).join("cuda.h").is_file()));
    assert_eq!(
        pkg_config(&["--libs"]),
        [format!("-L{}", p.join("lib").display()), "-lvkgdr".into()]
    );

    // The shared library exports exactly the functions the header declares.
    let header = std::fs::read_to_string(crate_dir().join("../include/vkgdr.h")).unwrap();
    let mut declared: Vec<&str> = header
        .split("vkgdr_")
        .skip(1)
        .filter_map(|rest| {
            let name = rest
                .split(|c: char| !c.is_alphanumeric() && c != '_')
                .next()?;
            rest[name.len()..].starts_with('(').then_some(name)
        })
        .collect();
    declared.sort_unstable();
    declared.dedup();
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(p.join("lib/libvkgdr.so.1"))
        .output()
        .unwrap();
    let nm = String::from_utf8_lossy(&out.stdout);
    let mut exported: Vec<&str> = nm
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2)?.strip_prefix("vkgdr_"))
        .collect();
    exported.sort_unstable();
    assert_eq!(exported, declared);
    assert!(declared.len() >= 45, "{declared:?}");
}

#[test]
fn make_install_with_destdir_stages_what_install_c_installs_for_the_prefix() {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let (by_make, by_script) = (tmp.join("stage-make"), tmp.join("stage-script"));
    for d in [&by_make, &by_script] {
        let _ = std::fs::remove_dir_all(d);
    }
    let lib_dir = built_lib_dir();
    // As a packager types it; VKGDR_LIB_DIR reuses the library this test run built.
    let out = Command::new("make")
        .arg("-C")
        .arg(crate_dir().join(".."))
        .arg("install")
        .arg("PREFIX=/usr")
        .arg(format!("DESTDIR={}", by_make.display()))
        .arg(format!("VKGDR_LIB_DIR={}", lib_dir.display()))
        .arg(format!("CUDA_INCLUDE={}", cuda_include().display()))
        .env_remove("PREFIX")
        .env_remove("DESTDIR")
        .output()
        .expect("run make");
    assert!(out.status.success(), "make install failed: {}", text(&out));
    // The script with the same knobs in its environment stages the very same files.
    let out = Command::new(crate_dir().join("../scripts/install-c"))
        .arg("/usr")
        .env("DESTDIR", &by_script)
        .env("VKGDR_LIB_DIR", &lib_dir)
        .env("CUDA_INCLUDE", cuda_include())
        .output()
        .expect("run scripts/install-c");
    assert!(
        out.status.success(),
        "install-c with DESTDIR failed: {}",
        text(&out)
    );
    assert!(
        tree(&by_make) == tree(&by_script),
        "make install and scripts/install-c staged different files"
    );

    // Everything lies under DESTDIR/usr, nothing elsewhere.
    let names: Vec<PathBuf> = tree(&by_make).into_iter().map(|(p, _)| p).collect();
    let expect: Vec<PathBuf> = [
        "usr/include/vkgdr/ordering.cuh",
        "usr/include/vkgdr/ring.cuh",
        "usr/include/vkgdr/ring_d2h.cuh",
        "usr/include/vkgdr.h",
        "usr/lib/libvkgdr.a",
        "usr/lib/libvkgdr.so",
        "usr/lib/libvkgdr.so.1",
        "usr/lib/pkgconfig/vkgdr.pc",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    assert_eq!(names, expect);
    let staged = by_make.join("usr");
    assert_eq!(
        std::fs::read_link(staged.join("lib/libvkgdr.so")).unwrap(),
        Path::new("libvkgdr.so.1")
    );
    assert_eq!(
        std::fs::read(staged.join("include/vkgdr.h")).unwrap(),
        std::fs::read(crate_dir().join("../include/vkgdr.h")).unwrap()
    );

    // vkgdr.pc names the prefix, not the staging directory.
    let pc = staged.join("lib/pkgconfig");
    let pc_text = std::fs::read_to_string(pc.join("vkgdr.pc")).unwrap();
    assert!(
        pc_text.starts_with(
            "prefix=/usr
"
        ),
        "{pc_text}"
    );
    assert!(!pc_text.contains(&*by_make.to_string_lossy()), "{pc_text}");
    assert_eq!(pkg_config_in(&pc, None, &["--variable=prefix"]), ["/usr"]);
    // Read through the staging directory as a sysroot, the paths land inside it.
    assert_eq!(
        pkg_config_in(&pc, Some(&by_make), &["--libs"]),
        [
            format!("-L{}", staged.join("lib").display()),
            "-lvkgdr".into()
        ]
    );
    let cflags = pkg_config_in(
        &pc,
        None,
        &[
            "--cflags",
            &format!("--define-variable=prefix={}", staged.display()),
        ],
    );
    assert_eq!(
        cflags,
        [
            format!("-I{}", staged.join("include").display()),
            format!("-I{}", cuda_include().canonicalize().unwrap().display()),
        ]
    );

    // A program compiles with those flags, links against the staged library and runs.
    let exe = tmp.join("capi-programs/no_driver-staged");
    std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
    let out = Command::new("cc")
        .args([
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            "-pthread",
            "-o",
        ])
        .arg(&exe)
        .arg(crate_dir().join("tests/c/no_driver.c"))
        .args(&cflags)
        .arg(format!("-L{}", staged.join("lib").display()))
        .arg("-lvkgdr")
        .arg(format!("-Wl,-rpath,{}", staged.join("lib").display()))
        .arg("-ldl")
        .output()
        .expect("run the C compiler");
    assert!(
        out.status.success(),
        "no_driver.c against the staged library: {}",
        text(&out)
    );
    assert!(needed(&exe).contains("libvkgdr.so.1"));
    run(&exe, &[], "no_driver: ");
}

#[test]
fn without_a_driver_open_names_libcuda_and_bad_handles_are_errors() {
    for link in [Link::Shared, Link::Static] {
        let exe = build("no_driver.c", link);
        let needs = needed(&exe);
        assert_eq!(
            needs.contains("libvkgdr.so.1"),
            link == Link::Shared,
            "{needs}"
        );
        run(&exe, &[], "no_driver: ");
    }
}

#[test]
fn pools_work_from_c_threads_over_a_vulkan_only_device() {
    for link in [Link::Shared, Link::Static] {
        run(&build("pool_vulkan.c", link), &[], " 0 failed");
    }
}

#[test]
fn a_peer_process_without_cuda_attaches_what_a_vulkan_only_owner_shares() {
    // The program forks and execs itself as the peer (tests/c/peer_process.h), pointing it at
    // a CUDA library that does not exist.
    for link in [Link::Shared, Link::Static] {
        let out = run(&build("share_vulkan.c", link), &[], "share_vulkan: ");
        assert!(
            out.contains("share_vulkan (peer): ") && !out.contains("FAIL"),
            "{out}"
        );
    }
}

#[test]
fn a_vkgdr_0_1_program_builds_and_links_unchanged() {
    // The kernel it needs where a driver is present (it runs its GPU flow then).
    let ptx = crate_dir().join("../kernels/mapping.ptx");
    let out = run(
        &build("compat_v0_1.c", Link::Shared),
        &[&ptx],
        "compat_v0_1: 0 failed",
    );
    assert!(
        out.contains("libcuda.so.1") || out.contains("flow (flags 2)"),
        "{out}"
    );
    run(
        &build("compat_v0_1.c", Link::Static),
        &[&ptx],
        "compat_v0_1: 0 failed",
    );
}

#[test]
fn the_header_compiles_as_cpp_with_c_linkage() {
    run(
        &build("header.cpp", Link::Shared),
        &[],
        "header_cxx: 1 passed, 0 failed",
    );
}
