//! `xproc-attach`: what attaching costs a fresh process without CUDA. It opens its Vulkan device
//! by the GPU's UUID (timed on its own: the instance and the device, the first Vulkan use of the
//! process), then attaches the owner's region `--attaches` times, each on a new connection
//! (connect, receive the descriptor and fd, import, map), writes 64 bytes `--writes` times into
//! the last one, leaves [`FINAL_PATTERN`] there for the owner to check, and holds it until told to
//! quit (the owner reads the process's GPU memory meanwhile).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vkgdr::share::Peer;
use vkgdr::vulkan::{DeviceSelector, MemoryOptions, VulkanContext};
use vkgdr::Mapping;

use serde::{Deserialize, Serialize};

use super::protocol::{say, Line};
use super::{Commands, Context, Outcome};

/// How long a peer waits for each answer of the owner.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(20);
/// Writes timed together in one sample (each sample is their mean).
pub const WRITES_PER_SAMPLE: u64 = 64;

/// The 64 bytes the child writes last, for the owner to find in its memory.
pub fn final_pattern() -> [u8; 64] {
    std::array::from_fn(|i| 0xa5 ^ i as u8)
}

/// A GPU UUID as `nvidia-smi -L` or `vkgdr::vulkan::format_uuid` write it.
pub(super) fn uuid(s: &str) -> Result<[u8; 16], String> {
    vkgdr::vulkan::parse_uuid(s).map_err(|e| e.to_string())
}

/// `xproc-attach`'s options.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct AttachArgs {
    /// The owner's socket
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,
    /// The name the owner shares its memory under
    #[arg(long, value_name = "NAME")]
    pub region: String,
    /// The GPU's UUID: the Vulkan device this process opens
    #[arg(long, value_name = "UUID", value_parser = uuid)]
    pub uuid: [u8; 16],
    /// Attaches to time, each on a connection of its own
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub attaches: u64,
    /// 64-byte writes to time into the last attachment
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub writes: u64,
}

/// What an attaching child says once done (its `attach` line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attached {
    /// Opening the GPU's Vulkan device.
    pub vulkan_ns: f64,
    /// Each attach.
    pub attach_ns: Vec<f64>,
    /// Samples of [`WRITES_PER_SAMPLE`] 64-byte writes, ns per write.
    pub write_ns: Vec<f64>,
}

/// The role (see the module docs). Says `attach` ([`Attached`]), then `holding`.
pub fn run(a: &AttachArgs) -> Outcome {
    let commands = Commands::start()?;
    let t = Instant::now();
    let device: Arc<VulkanContext> =
        VulkanContext::new(DeviceSelector::Uuid(a.uuid), MemoryOptions::default())
            .ctx("opening the GPU's Vulkan device")?;
    let vulkan_ns = t.elapsed().as_nanos() as f64;
    let mut attach_ns = Vec::new();
    let mut held = None;
    for k in 0..a.attaches {
        // The last attachment goes first: every attach is a new connection and a new import.
        drop(held.take());
        let t = Instant::now();
        let memory = Peer::connect_with(&a.socket, Some(Arc::clone(&device)), ANSWER_TIMEOUT)
            .and_then(|peer| peer.attach_memory(&a.region))
            .ctx(format_args!("attach {} of {:?}", k + 1, a.region))?;
        attach_ns.push(t.elapsed().as_nanos() as f64);
        held = Some(memory);
    }
    let mut memory = held.ok_or("nothing attached")?;
    let mut write_ns = Vec::new();
    let mut bytes = [0u8; 64];
    for s in 0..a.writes / WRITES_PER_SAMPLE {
        let t = Instant::now();
        for k in 0..WRITES_PER_SAMPLE {
            bytes[..8].copy_from_slice(&(s * WRITES_PER_SAMPLE + k).to_le_bytes());
            memory.write(0, &bytes).ctx("a 64-byte write")?;
        }
        write_ns.push(t.elapsed().as_nanos() as f64 / WRITES_PER_SAMPLE as f64);
    }
    memory.write(0, &final_pattern()).ctx("the last write")?;
    let attached = Attached {
        vulkan_ns,
        attach_ns,
        write_ns,
    };
    say(&Line::of("attach", &attached));
    say(&Line::new("holding").with("pid", std::process::id()));
    commands.wait_quit()?;
    drop(memory);
    Ok(())
}
