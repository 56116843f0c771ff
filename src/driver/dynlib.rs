//! Finding the driver libraries at run time, with documented environment overrides.
//!
//! Every driver library is opened by its soname through the dynamic loader, unless an environment
//! variable names another file:
//!
//! | library | default | override |
//! |---------|---------|----------|
//! | CUDA driver | `libcuda.so.1` | `VKGDR_CUDA_LIBRARY` |
//! | Vulkan loader | `libvulkan.so.1` | `VKGDR_VULKAN_LIBRARY` |
//! | NVML | `libnvidia-ml.so.1` | `VKGDR_NVML_LIBRARY` |
//!
//! An override serves a driver installed outside the loader's path, and lets tests and
//! `vkgdr info` show what happens on a machine without one of them (name a file that does not
//! exist) without uninstalling anything.

use crate::error::{Error, Result};

/// Environment variable naming the CUDA driver library to load instead of `libcuda.so.1`.
pub const CUDA_ENV: &str = "VKGDR_CUDA_LIBRARY";
/// Environment variable naming the Vulkan loader to load instead of `libvulkan.so.1`.
pub const VULKAN_ENV: &str = "VKGDR_VULKAN_LIBRARY";
/// Environment variable naming the NVML library to load instead of `libnvidia-ml.so.1`.
pub const NVML_ENV: &str = "VKGDR_NVML_LIBRARY";

/// What to open: the override from `env` when it is set and not empty, else `default`.
pub fn library_name(default: &str, env: &str) -> String {
    match std::env::var(env) {
        Ok(v) if !v.is_empty() => v,
        _ => default.to_string(),
    }
}

/// Opens `default`, or the file named by the environment variable `env`.
///
/// A library that cannot be opened is [`Error::LibraryNotFound`] naming `default` and, in the
/// reason, the file tried and what the dynamic loader said.
pub(crate) fn load(default: &'static str, env: &str) -> Result<libloading::Library> {
    let name = library_name(default, env);
    // SAFETY: the driver libraries' initialisers are designed to run in arbitrary processes (every
    // CUDA, Vulkan and NVML program loads them this way); an override names the same kind of
    // library by the user's choice.
    unsafe { libloading::Library::new(&name) }.map_err(|e| not_found(default, env, &name, e))
}

/// The error for a library that could not be opened.
pub(crate) fn not_found(
    default: &'static str,
    env: &str,
    tried: &str,
    why: impl std::fmt::Display,
) -> Error {
    let reason = if tried == default {
        why.to_string()
    } else {
        format!("{env}={tried}: {why}")
    };
    Error::LibraryNotFound {
        name: default,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unset_override_keeps_the_default() {
        assert_eq!(
            library_name("libcuda.so.1", "VKGDR_TEST_UNSET_VARIABLE"),
            "libcuda.so.1"
        );
    }

    #[test]
    fn a_missing_library_names_what_was_tried() {
        let e = load(
            "/nonexistent/libnvidia-ml.so.1",
            "VKGDR_TEST_UNSET_VARIABLE",
        )
        .unwrap_err();
        assert!(matches!(e, Error::LibraryNotFound { .. }), "{e}");
        assert!(
            e.to_string().contains("/nonexistent/libnvidia-ml.so.1"),
            "{e}"
        );
        let e = not_found("libcuda.so.1", CUDA_ENV, "/x/libcuda.so", "no such file");
        assert_eq!(
            e.to_string(),
            "library libcuda.so.1 not found: VKGDR_CUDA_LIBRARY=/x/libcuda.so: no such file"
        );
    }
}
