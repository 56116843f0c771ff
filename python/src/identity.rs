//! Which device, driver and memory type memory lives on: what a `ShareServer` and a `Pool` check
//! the memory they are handed against.

use pyo3::prelude::*;
use vkgdr::vulkan::VulkanContext;

use crate::errors::invalid_argument;

/// What a `ShareServer` checks the memory it shares against: the regions' device, driver and
/// memory type are named once, in the server's descriptors, so every region must match them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Identity {
    uuid: [u8; 16],
    driver_uuid: [u8; 16],
    memory_type: u32,
    non_coherent: bool,
}

impl Identity {
    pub(crate) fn of(context: &VulkanContext) -> Identity {
        let info = context.device_info();
        Identity {
            uuid: info.uuid,
            driver_uuid: info.driver_uuid,
            memory_type: context.memory_type().index,
            non_coherent: context.is_non_coherent(),
        }
    }

    /// Whether memory of the device needs flushes and invalidates.
    pub(crate) fn non_coherent(&self) -> bool {
        self.non_coherent
    }

    fn describe(&self) -> String {
        format!(
            "GPU-{} (driver {}), memory type {}, {}",
            vkgdr::vulkan::format_uuid(&self.uuid),
            vkgdr::vulkan::format_uuid(&self.driver_uuid),
            self.memory_type,
            if self.non_coherent {
                "non-coherent"
            } else {
                "coherent"
            }
        )
    }

    /// `Ok` if memory of `other` (a `what`) may be shared by a server of `self`.
    pub(crate) fn check(&self, other: Identity, what: &str) -> PyResult<()> {
        if *self == other {
            return Ok(());
        }
        Err(invalid_argument(format!(
            "the {what} lives on {}, and the ShareServer's device is {}: share memory of the \
             owner the server was made with (and its coherence flags)",
            other.describe(),
            self.describe()
        )))
    }
}
