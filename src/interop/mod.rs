//! The faces other code meets the library through: vkgdr 0.1's semantics for the C and Python
//! drop-ins ([`compat`]) and cudarc interop (`cudarc`, cargo feature `cudarc`).

pub mod compat;
#[cfg(feature = "cudarc")]
pub mod cudarc;
