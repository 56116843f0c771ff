//! Gives the shared library vkgdr 0.1's SONAME, `libvkgdr.so.1`: this library is ABI-compatible
//! with it (same symbols and signatures; only additions), so programs linked against vkgdr 0.1
//! run against it unchanged. The file cargo writes is `libvkgdr_capi.so`; `scripts/install-c`
//! installs it as `libvkgdr.so.1` with the `libvkgdr.so` development link.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libvkgdr.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
