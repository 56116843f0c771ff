//! `vkgdr._vkgdr`, the extension module behind the Python package `vkgdr` (python/vkgdr).
//!
//! - [`device`]: `_Vkgdr`, held by vkgdr 0.1's `Vkgdr`, the reading of `owner` arguments, and
//!   `ReleaseTimes` and `SlowRelease` (`Vkgdr.release_times()`);
//! - [`compat`]: `_RawMemory`, on [`vkgdr::compat`], held by vkgdr 0.1's `RawMemory` (`Vkgdr`
//!   and `RawMemory` are plain Python classes in python/vkgdr, which programs may subclass);
//! - [`pool`]: `Pool` and `Block` (NumPy, CUDA array interface, DLPack);
//! - [`ring`]: `DeviceRing` and `RingProducer`, thin wrappers of [`vkgdr::ring::DeviceRing`] and
//!   [`vkgdr::ring::OwnedProducer`]; [`d2h`]: `DeviceToHostRing` and its `LaneConsumer`, on
//!   [`vkgdr::ring::DeviceToHostRing`] (records from kernels to Python threads);
//! - [`share`]: `ShareServer` and `ShareEvent`, the owner's side of sharing with other processes
//!   ([`vkgdr::share`]); [`peer`]: `Peer` and what it attaches (`AttachedMemory`,
//!   `AttachedPool`, `SharedBlock`, `AttachedLane`), the side that needs no CUDA; [`vulkan`]:
//!   `VulkanDevice`, `VulkanMemory` and `CheckingRing`, a Vulkan-only owner (CPU-only owners, and
//!   the sharing tests on lavapipe); [`fork`]: what those classes do in a forked child;
//! - [`errors`]: `VkgdrError` and its subclasses, the one conversion of library errors;
//! - [`dlpack`], [`interface`]: the array protocols;
//! - [`exports`]: the exact rule of `Block.free()`, `AttachedMemory.detach()` and
//!   `SharedBlock.release()`: memory goes back when its use ended and no export of it (a NumPy
//!   array, a DLPack tensor, a pin of the CUDA array interface) is alive;
//! - [`lifetime`]: the reference-count rule of vkgdr 0.1's `vkgdr.RawMemory.free` (and so
//!   `vkgdr.pycuda.Memory`'s), whose consumers hold the object itself, which no export count can
//!   see (the module says why);
//! - [`stream`]: CUDA streams named by Python arguments, and `RawStream`, the one way a raw
//!   handle is passed (a bare int is refused).
//!
//! Every class here (and `vkgdr.Vkgdr`, `vkgdr.RawMemory`) refuses `copy.copy`,
//! `copy.deepcopy` and pickling with a `TypeError`: python/vkgdr/__init__.py installs the same
//! four methods on each (`_refuse_copies`), as they are handles to GPU memory and driver state.
//!
//! Calls that may take long (driver calls, waits, large copies) release the GIL. No Rust panic
//! can cross into Python: PyO3 turns one into a `PanicException`, and the DLPack deleters, which C
//! code calls, catch them.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use pyo3::prelude::*;

mod compat;
mod d2h;
mod device;
mod dlpack;
mod errors;
mod exports;
mod fork;
mod identity;
mod interface;
mod lifetime;
mod peer;
mod pool;
mod ring;
mod share;
mod stream;
mod thread_exit;
mod thread_slot;
mod vulkan;

#[pymodule]
fn _vkgdr(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<device::Vkgdr>()?;
    m.add_class::<device::ReleaseTimes>()?;
    m.add_class::<device::SlowRelease>()?;
    m.add_class::<compat::RawMemory>()?;
    m.add_class::<compat::FreeMethod>()?;
    m.add_class::<compat::BoundFree>()?;
    m.add_class::<pool::Pool>()?;
    m.add_class::<pool::Block>()?;
    m.add_class::<ring::DeviceRing>()?;
    m.add_class::<ring::RingDeviceView>()?;
    m.add_class::<ring::RingProducer>()?;
    m.add_class::<d2h::DeviceToHostRing>()?;
    m.add_class::<d2h::DeviceToHostView>()?;
    m.add_class::<d2h::LaneConsumer>()?;
    m.add_class::<d2h::LaneRecord>()?;
    m.add_class::<stream::RawStream>()?;
    m.add_class::<share::ShareServer>()?;
    m.add_class::<share::ShareEvent>()?;
    m.add_class::<peer::Peer>()?;
    m.add_class::<peer::AttachedMemory>()?;
    m.add_class::<peer::AttachedPool>()?;
    m.add_class::<peer::SharedBlock>()?;
    m.add_class::<peer::AttachedLane>()?;
    m.add_class::<vulkan::VulkanDevice>()?;
    m.add_class::<vulkan::VulkanMemory>()?;
    m.add_class::<vulkan::CheckingRing>()?;
    m.add_function(wrap_pyfunction!(fork::after_fork_in_child, m)?)?;
    compat::init(m.py())?;
    m.add(
        "OPEN_CURRENT_CONTEXT_BIT",
        vkgdr::compat::OPEN_CURRENT_CONTEXT_BIT,
    )?;
    m.add(
        "OPEN_FORCE_NON_COHERENT_BIT",
        vkgdr::compat::OPEN_FORCE_NON_COHERENT_BIT,
    )?;
    m.add(
        "OPEN_REQUIRE_COHERENT_BIT",
        vkgdr::compat::OPEN_REQUIRE_COHERENT_BIT,
    )?;
    m.add("DLPACK_DEVICE_CPU", dlpack::DEVICE_CPU)?;
    m.add("DLPACK_DEVICE_CUDA", dlpack::DEVICE_CUDA)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
