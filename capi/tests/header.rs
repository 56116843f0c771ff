//! `include/vkgdr.h` is generated from this crate by cbindgen: this test regenerates it and fails
//! when the committed copy differs (`VKGDR_BLESS=1` rewrites it instead). It also checks that every
//! exported function runs its body inside the panic guard.

use std::path::Path;

fn generate() -> String {
    let crate_dir = env!("CARGO_MANIFEST_DIR");
    let config = cbindgen::Config::from_file(Path::new(crate_dir).join("cbindgen.toml"))
        .expect("capi/cbindgen.toml");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen could not generate the header")
        .write(&mut out);
    String::from_utf8(out).expect("UTF-8 header")
}

#[test]
fn committed_header_matches_the_rust_definitions() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../include/vkgdr.h");
    let generated = generate();
    if std::env::var_os("VKGDR_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write include/vkgdr.h");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let first = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(generated.lines().count()));
        panic!(
            "include/vkgdr.h is out of date (first difference at line {}): regenerate it with \
             VKGDR_BLESS=1 cargo test -p vkgdr-capi --test header",
            first + 1
        );
    }
}

#[test]
fn header_keeps_vkgdr_0_1_names_and_takes_cuda_types_from_cuda_h() {
    let h = generate();
    for needle in [
        "#include <cuda.h>",
        "typedef struct vkgdr *vkgdr_t;",
        "typedef struct vkgdr_memory *vkgdr_memory_t;",
        "VKGDR_OPEN_CURRENT_CONTEXT_BIT = 1,",
        "VKGDR_OPEN_FORCE_NON_COHERENT_BIT = 2,",
        "VKGDR_OPEN_REQUIRE_COHERENT_BIT = 4,",
        "} vkgdr_open_flags;",
        "char *vkgdr_last_error(void);",
        "vkgdr_t vkgdr_open(CUdevice device, uint32_t flags);",
        "void vkgdr_close(vkgdr_t g);",
        "vkgdr_memory_t vkgdr_memory_alloc(vkgdr_t g, size_t size, uint32_t flags);",
        "void vkgdr_memory_free(vkgdr_memory_t mem);",
        "void *vkgdr_memory_get_host_ptr(vkgdr_memory_t mem);",
        "CUdeviceptr vkgdr_memory_get_device_ptr(vkgdr_memory_t mem);",
        "size_t vkgdr_memory_get_size(vkgdr_memory_t mem);",
        "bool vkgdr_memory_is_coherent(vkgdr_memory_t mem);",
        "size_t vkgdr_memory_non_coherent_atom_size(vkgdr_memory_t mem);",
        "void vkgdr_memory_flush(vkgdr_memory_t mem, size_t offset, size_t size);",
        "void vkgdr_memory_invalidate(vkgdr_memory_t mem, size_t offset, size_t size);",
        // The extensions that take CUDA streams use <cuda.h>'s CUstream.
        "int vkgdr_memory_free_after(vkgdr_memory_t mem, CUstream stream);",
        "int vkgdr_ring_watch_consumer(vkgdr_ring_t ring, CUstream stream);",
        // Sharing: the handles are opaque like the others; a peer's calls name no CUDA type.
        "typedef struct vkgdr_share_server *vkgdr_share_server_t;",
        "typedef struct vkgdr_peer *vkgdr_peer_t;",
        "int vkgdr_peer_connect(const char *path, uint64_t timeout_ns, vkgdr_peer_t *out);",
        "char text[VKGDR_SHARE_EVENT_TEXT];",
        "VKGDR_RING_SHAREABLE_BIT = 2,",
        "VKGDR_RING_COPY_ENGINE_SPLIT_BIT = 4,",
    ] {
        assert!(h.contains(needle), "header lacks `{needle}`");
    }
    for clash in [
        "typedef int CUdevice",
        "CUdeviceptr;",
        "CUstream;",
        "CUstream_st",
        "typedef struct vkgdr vkgdr;",
        // Handle structs are declared by their tags only, as vkgdr 0.1's are: no typedef that
        // takes a name from programs.
        "typedef struct vkgdr_ring_reservation vkgdr_ring_reservation;",
        "typedef struct vkgdr_memory vkgdr_memory;",
        "typedef struct vkgdr_pool vkgdr_pool;",
        "typedef struct vkgdr_block vkgdr_block;",
        "typedef struct vkgdr_ring vkgdr_ring;",
        "typedef struct vkgdr_peer vkgdr_peer;",
        "typedef struct vkgdr_share_server vkgdr_share_server;",
    ] {
        assert!(!h.contains(clash), "header defines `{clash}`");
    }
}

#[test]
fn every_exported_function_runs_inside_the_panic_guard() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut checked = 0;
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for (i, _) in text.match_indices("#[no_mangle]") {
            let item = &text[i..];
            let body_start = item.find('{').unwrap() + 1;
            let body = item[body_start..].trim_start();
            let name = item.split("fn ").nth(1).unwrap().split('(').next().unwrap();
            assert!(
                body.starts_with("guard(\"") && body[7..].starts_with(name)
                    || body.starts_with("catch_unwind("),
                "{}: {name} does not start with guard(\"{name}\", ...)",
                path.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 40, "only {checked} exported functions found");
}
