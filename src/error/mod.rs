//! The crate's one error type.
//!
//! Every driver failure carries the call that failed and the driver's own name for the result
//! (`VK_ERROR_OUT_OF_DEVICE_MEMORY`, `CUDA_ERROR_INVALID_VALUE`), so a log line is enough to look the
//! problem up.

use std::fmt;

mod invalid;
pub use invalid::InvalidArgument;

/// `Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which driver returned an out-of-memory result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemorySide {
    /// Vulkan (`VK_ERROR_OUT_OF_DEVICE_MEMORY` from `vkAllocateMemory`; the BAR-mappable capacity).
    Vulkan,
    /// CUDA (`CUDA_ERROR_OUT_OF_MEMORY` while importing or mapping).
    Cuda,
    /// A limit configured on a pool or arena, not the driver.
    Limit,
}

impl fmt::Display for MemorySide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemorySide::Vulkan => "Vulkan",
            MemorySide::Cuda => "CUDA",
            MemorySide::Limit => "configured limit",
        })
    }
}

/// Everything that can go wrong in `vkgdr`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A shared library (the Vulkan loader or `libcuda.so.1`) could not be loaded.
    #[error("library {name} not found: {reason}")]
    LibraryNotFound {
        /// The library's file name.
        name: &'static str,
        /// What the dynamic loader said.
        reason: String,
    },
    /// A symbol the crate needs is missing from a loaded library (a driver too old).
    #[error("symbol {symbol} missing from {library}")]
    MissingSymbol {
        /// The library searched.
        library: &'static str,
        /// The symbol not found.
        symbol: &'static str,
    },
    /// A Vulkan call failed.
    #[error("{call} failed: {result}")]
    Vulkan {
        /// The Vulkan function.
        call: &'static str,
        /// The result name, e.g. `VK_ERROR_INITIALIZATION_FAILED`.
        result: String,
    },
    /// A CUDA driver call failed.
    #[error("{call} failed: {name} ({code})")]
    Cuda {
        /// The CUDA driver function.
        call: &'static str,
        /// The numeric `CUresult`.
        code: i32,
        /// The name from `cuGetErrorName`, e.g. `CUDA_ERROR_INVALID_VALUE`.
        name: String,
    },
    /// An NVML call failed (BAR1 and memory figures; see [`crate::nvml`]).
    #[error("{call} failed: {name} ({code})")]
    Nvml {
        /// The NVML function.
        call: &'static str,
        /// The numeric `nvmlReturn_t`.
        code: i32,
        /// Its name, e.g. `NVML_ERROR_NOT_SUPPORTED`.
        name: String,
    },
    /// A system call failed (`madvise` keeping a mapping out of forked children, `fcntl` making
    /// an exported fd close-on-exec).
    #[error("{call} failed: {errno}")]
    System {
        /// The system call.
        call: &'static str,
        /// The errno's name and text, e.g. `EINVAL (Invalid argument)`.
        errno: String,
    },
    /// No Vulkan physical device matches the requested CUDA device (by UUID) or index.
    #[error("no matching device: {0}")]
    NoMatchingDevice(String),
    /// The device has no memory type with the required property flags.
    #[error("no suitable memory type: {0}")]
    NoSuitableMemoryType(String),
    /// A required Vulkan extension is not offered by the device or instance.
    #[error("Vulkan extension {0} missing")]
    ExtensionMissing(&'static str),
    /// Device memory ran out. This is a normal, recoverable outcome: BAR-mappable memory is capped
    /// at about half of free VRAM and the Vulkan budget does not show it.
    #[error("out of device memory ({side}) in {call} allocating {size} bytes: {result}")]
    OutOfDeviceMemory {
        /// Which side refused.
        side: MemorySide,
        /// The call that failed.
        call: &'static str,
        /// The requested size in bytes.
        size: u64,
        /// The driver's result name (or a description of the limit).
        result: String,
    },
    /// A host allocation the call needs (a vector to read into) could not be made.
    #[error("out of host memory allocating {size} bytes")]
    OutOfHostMemory {
        /// The size asked for, in bytes.
        size: u64,
    },
    /// A caller error: zero size, overflow, range out of bounds, bad alignment, bad option. What
    /// was invalid, with the values refused, is the [`InvalidArgument`].
    #[error("invalid argument: {0}")]
    InvalidArgument(InvalidArgument),
    /// Something that cannot happen did: a bug in this crate, or a driver answer its
    /// specification rules out (a null pointer with a success code). Never a caller error.
    #[error("internal error (please report it): {0}")]
    Internal(String),
    /// An allocator-core error that is not the caller's (those are
    /// [`InvalidArgument`](Error::InvalidArgument)): a bug or exhausted metadata if it ever
    /// surfaces.
    #[error(transparent)]
    Alloc(crate::core::alloc::AllocError),
    /// A dirty-range tracker error (the pool checks ranges first: a bug if it ever surfaces).
    #[error(transparent)]
    Dirty(#[from] crate::core::dirty::DirtyError),
    /// A copy-routine error (length mismatch, unsupported instruction set, thread start failure).
    #[error(transparent)]
    Copy(#[from] crate::copy::CopyError),
    /// A ring buffer error (record too large, full, timeout, bad capacity).
    #[error(transparent)]
    Ring(#[from] crate::core::ring::RingError),
    /// A device → host ring's error (a lane's shape or consumer, or a device that broke the
    /// protocol).
    #[error(transparent)]
    D2h(#[from] crate::core::ring::d2h::D2hError),
    /// Sharing with another process failed: a message, descriptor, fd or peer refused by name
    /// (see [`ShareError`](crate::share::ShareError)).
    #[error(transparent)]
    Share(#[from] crate::core::share::ShareError),
    /// A feature the driver or device does not support (e.g. CUDA VMM).
    #[error("not supported: {0}")]
    Unsupported(String),
    /// A call that works in the calling thread's current CUDA context found none current: the
    /// driver's failure (`cuCtxGetDevice`, `CUDA_ERROR_INVALID_CONTEXT`), with what needed the
    /// context and how to make one current. Made by the drop-ins' allocation
    /// ([`crate::compat::alloc`]), which word the explanation for their own callers; the message
    /// ends with the driver's failure in vkgdr 0.1's form.
    #[error("{explanation}. {call} failed ({name})")]
    NoCurrentContext {
        /// What needed a current context, and how to make one current.
        explanation: &'static str,
        /// The CUDA driver function that found none.
        call: &'static str,
        /// The numeric `CUresult`.
        code: i32,
        /// Its name, `CUDA_ERROR_INVALID_CONTEXT`.
        name: String,
    },
}

impl Error {
    /// Whether this is an out-of-device-memory error (a full BAR or a pool limit).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Error::OutOfDeviceMemory { .. })
    }

    /// The driver call that failed (`cuDeviceGet`, `vkAllocateMemory`), for errors a driver
    /// (or the kernel: `madvise`) returned.
    pub fn driver_call(&self) -> Option<&'static str> {
        match self {
            Error::Vulkan { call, .. }
            | Error::Cuda { call, .. }
            | Error::Nvml { call, .. }
            | Error::System { call, .. }
            | Error::OutOfDeviceMemory { call, .. }
            | Error::NoCurrentContext { call, .. } => Some(call),
            _ => None,
        }
    }

    /// The driver's name for the result (`CUDA_ERROR_INVALID_DEVICE`,
    /// `VK_ERROR_OUT_OF_DEVICE_MEMORY`), for errors a driver returned; `None` for caller errors
    /// and configured limits.
    pub fn result_name(&self) -> Option<&str> {
        match self {
            Error::Vulkan { result, .. } => Some(result),
            Error::Cuda { name, .. }
            | Error::Nvml { name, .. }
            | Error::NoCurrentContext { name, .. } => Some(name),
            Error::System { errno, .. } => errno.split(' ').next(),
            Error::OutOfDeviceMemory { side, result, .. } if *side != MemorySide::Limit => {
                Some(result.split(' ').next().unwrap_or(result))
            }
            _ => None,
        }
    }

    pub(crate) fn internal(msg: impl Into<String>) -> Self {
        Error::Internal(msg.into())
    }
}

/// A caller error ([`Error::InvalidArgument`]).
impl From<InvalidArgument> for Error {
    fn from(e: InvalidArgument) -> Self {
        Error::InvalidArgument(e)
    }
}

/// The allocator core's request and configuration errors are the caller's
/// ([`InvalidArgument::Alloc`], with the core's message); the rest keep their type
/// ([`Error::Alloc`]).
impl From<crate::core::alloc::AllocError> for Error {
    fn from(e: crate::core::alloc::AllocError) -> Self {
        if e.is_caller_error() {
            Error::InvalidArgument(InvalidArgument::Alloc(e))
        } else {
            Error::Alloc(e)
        }
    }
}

/// Ranges, sizes and atoms no mapping can take are the caller's ([`InvalidArgument::Range`],
/// with the core's message).
impl From<crate::core::range::RangeError> for Error {
    fn from(e: crate::core::range::RangeError) -> Self {
        Error::InvalidArgument(InvalidArgument::Range(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::alloc::AllocError;

    #[test]
    fn allocator_errors_split_into_caller_errors_and_the_rest() {
        for caller in [
            AllocError::ZeroSize,
            AllocError::BadAlignment { align: 3 },
            AllocError::AlignmentTooLarge {
                align: 1 << 20,
                max: 1 << 16,
            },
            AllocError::Overflow { size: u64::MAX },
            AllocError::InvalidConfig("min_align"),
        ] {
            let msg = caller.to_string();
            let e = Error::from(caller.clone());
            assert_eq!(e.to_string(), format!("invalid argument: {msg}"));
            assert!(
                matches!(e, Error::InvalidArgument(InvalidArgument::Alloc(a)) if a == caller),
                "{msg}"
            );
        }
        for other in [
            AllocError::MetadataExhausted,
            AllocError::StaleAllocation,
            AllocError::Inconsistent("test"),
        ] {
            assert!(matches!(Error::from(other.clone()), Error::Alloc(e) if e == other));
        }
    }

    #[test]
    fn internal_and_tracker_errors_are_no_driver_results() {
        let e = Error::internal("cuMemHostAlloc returned a null pointer");
        assert_eq!((e.driver_call(), e.result_name()), (None, None));
        assert!(e
            .to_string()
            .contains("cuMemHostAlloc returned a null pointer"));
        let e = Error::from(crate::core::dirty::DirtyError::ZeroSize);
        assert!(matches!(e, Error::Dirty(_)));
        assert_eq!((e.driver_call(), e.result_name()), (None, None));
    }
}
