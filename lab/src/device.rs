//! Which GPUs a command works on: `--device N|UUID` ([`DeviceArg`]) and `--devices all|LIST`
//! ([`Devices`]), checked as the command line is parsed, then matched to the CUDA devices present
//! when the command runs ([`resolve`], pure; [`present`] asks the driver).
//!
//! An ordinal is CUDA's, so `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER` decide which GPU it
//! is; a UUID (`GPU-…` as `nvidia-smi -L` prints it, with or without the prefix, as
//! [`Gpu::open_uuid`](vkgdr::Gpu::open_uuid) takes it) names the same GPU whatever the ordinals.
//! The Vulkan side of each device is found by its UUID either way.

use std::fmt;
use std::str::FromStr;

use vkgdr::vulkan::{format_uuid, parse_uuid};

/// One device as the command line names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceArg {
    /// A CUDA ordinal.
    Ordinal(i32),
    /// A GPU UUID.
    Uuid([u8; 16]),
}

impl FromStr for DeviceArg {
    type Err = String;

    fn from_str(s: &str) -> Result<DeviceArg, String> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("all") {
            return Err(
                "--device names one device; `--devices all` (info, soak) names every one".into(),
            );
        }
        if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
            return t
                .parse::<i32>()
                .map(DeviceArg::Ordinal)
                .map_err(|_| format!("{t} is no CUDA ordinal (too large)"));
        }
        parse_uuid(t).map(DeviceArg::Uuid).map_err(|_| {
            format!(
                "{s:?} is neither a CUDA ordinal (0, 1, ...) nor a GPU UUID \
                     (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, as `nvidia-smi -L` prints it)"
            )
        })
    }
}

impl fmt::Display for DeviceArg {
    /// `N`, or `GPU-…`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceArg::Ordinal(n) => write!(f, "{n}"),
            DeviceArg::Uuid(u) => write!(f, "GPU-{}", format_uuid(u)),
        }
    }
}

/// Several devices: every CUDA device present, or a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Devices {
    /// `all`.
    All,
    /// Devices named one by one (never empty).
    List(Vec<DeviceArg>),
}

impl Devices {
    /// One device.
    pub fn one(d: DeviceArg) -> Devices {
        Devices::List(vec![d])
    }
}

impl FromStr for Devices {
    type Err = String;

    /// `all`, or a comma-separated list of ordinals and UUIDs (`0,2`, `0,GPU-…`).
    fn from_str(s: &str) -> Result<Devices, String> {
        if s.trim().eq_ignore_ascii_case("all") {
            return Ok(Devices::All);
        }
        let list = s
            .split(',')
            .map(|item| {
                if item.trim().is_empty() {
                    Err(format!(
                        "{s:?} has an empty item: give `all` or a list such as 0,1"
                    ))
                } else {
                    item.parse::<DeviceArg>()
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Devices::List(list))
    }
}

impl fmt::Display for Devices {
    /// `all`, or the list as it would be given.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Devices::All => f.write_str("all"),
            Devices::List(l) => {
                let items: Vec<String> = l.iter().map(DeviceArg::to_string).collect();
                f.write_str(&items.join(","))
            }
        }
    }
}

/// A CUDA device present here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Present {
    /// Its CUDA ordinal.
    pub ordinal: i32,
    /// Its UUID (CUDA's, which Vulkan and NVML share).
    pub uuid: [u8; 16],
    /// Its name.
    pub name: String,
}

impl Present {
    /// `GPU-…`, as `nvidia-smi -L` prints it.
    pub fn uuid_text(&self) -> String {
        format!("GPU-{}", format_uuid(&self.uuid))
    }
}

impl fmt::Display for Present {
    /// `[N] NAME (GPU-…)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {} ({})", self.ordinal, self.name, self.uuid_text())
    }
}

/// The CUDA devices present, from the driver (loading it: `cuInit`).
pub fn present() -> vkgdr::Result<Vec<Present>> {
    let driver = vkgdr::cuda::Driver::get()?;
    (0..driver.device_count()?)
        .map(|ordinal| {
            let device = driver.device(ordinal)?;
            Ok(Present {
                ordinal,
                uuid: driver.device_uuid(device)?,
                name: driver.device_name(device)?,
            })
        })
        .collect()
}

/// `present`, as an error message lists it.
fn listing(present: &[Present]) -> String {
    if present.is_empty() {
        "no CUDA device is present".into()
    } else {
        let each: Vec<String> = present.iter().map(Present::to_string).collect();
        format!("present: {}", each.join(", "))
    }
}

/// The devices of `present` that `wanted` names, in the order named (`all`: every one, in
/// ordinal order). Fails naming what is missing and listing what is present: a device that is
/// not there, a device named twice, no device at all.
pub fn resolve(wanted: &Devices, present: &[Present]) -> Result<Vec<Present>, String> {
    let list = match wanted {
        Devices::All if present.is_empty() => {
            return Err(format!("--devices all: {}", listing(present)))
        }
        Devices::All => return Ok(present.to_vec()),
        Devices::List(list) => list,
    };
    let mut chosen: Vec<Present> = Vec::with_capacity(list.len());
    for want in list {
        let found = present.iter().find(|p| match want {
            DeviceArg::Ordinal(n) => p.ordinal == *n,
            DeviceArg::Uuid(u) => p.uuid == *u,
        });
        let Some(found) = found else {
            let what = match want {
                DeviceArg::Ordinal(n) => format!("no CUDA device {n}"),
                DeviceArg::Uuid(u) => format!("no CUDA device with UUID GPU-{}", format_uuid(u)),
            };
            return Err(format!("{what} here; {}", listing(present)));
        };
        if chosen.iter().any(|c| c.ordinal == found.ordinal) {
            return Err(format!("{found} is named twice (as {want} and before)"));
        }
        chosen.push(found.clone());
    }
    Ok(chosen)
}

/// [`resolve`] against the devices the driver reports; a mismatch is
/// [`vkgdr::Error::NoMatchingDevice`] with the message.
pub fn select(wanted: &Devices) -> vkgdr::Result<Vec<Present>> {
    resolve(wanted, &present()?).map_err(vkgdr::Error::NoMatchingDevice)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const UUID_0: &str = "GPU-5fd4a7f7-1a2b-3c4d-5e6f-708192a3b4c5";
    pub(crate) const UUID_1: &str = "GPU-0badcafe-0000-1111-2222-333344445555";

    pub(crate) fn two_gpus() -> Vec<Present> {
        [UUID_0, UUID_1]
            .iter()
            .enumerate()
            .map(|(i, u)| Present {
                ordinal: i as i32,
                uuid: parse_uuid(u).unwrap(),
                name: "NVIDIA H200".into(),
            })
            .collect()
    }

    #[test]
    fn a_device_is_an_ordinal_or_a_uuid_with_or_without_its_prefix() {
        assert_eq!("3".parse::<DeviceArg>(), Ok(DeviceArg::Ordinal(3)));
        let u = parse_uuid(UUID_0).unwrap();
        for text in [
            UUID_0,
            &UUID_0[4..],
            &UUID_0.to_ascii_uppercase().replace("GPU-", "gpu-"),
            &UUID_0[4..].replace('-', ""),
        ] {
            assert_eq!(text.parse::<DeviceArg>(), Ok(DeviceArg::Uuid(u)), "{text}");
        }
        // Written back as `nvidia-smi -L` prints it.
        assert_eq!(DeviceArg::Uuid(u).to_string(), UUID_0);
        for bad in ["", "-1", "one", "GPU-123", "99999999999", "0x1"] {
            let e = bad.parse::<DeviceArg>().unwrap_err();
            assert!(
                e.contains("CUDA ordinal") || e.contains("too large"),
                "{bad:?}: {e}"
            );
        }
        let e = "all".parse::<DeviceArg>().unwrap_err();
        assert!(e.contains("--devices all"), "{e}");
    }

    #[test]
    fn devices_are_all_or_a_list() {
        assert_eq!("all".parse::<Devices>(), Ok(Devices::All));
        assert_eq!("ALL".parse::<Devices>(), Ok(Devices::All));
        let u = parse_uuid(UUID_1).unwrap();
        assert_eq!(
            format!("0,{UUID_1}").parse::<Devices>(),
            Ok(Devices::List(vec![
                DeviceArg::Ordinal(0),
                DeviceArg::Uuid(u)
            ]))
        );
        assert_eq!("0,1".parse::<Devices>().unwrap().to_string(), "0,1");
        for bad in ["", "0,", ",1", "0,,1", "every", "0;1"] {
            assert!(bad.parse::<Devices>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn resolving_names_what_is_missing_and_lists_what_is_present() {
        let gpus = two_gpus();
        let all = resolve(&Devices::All, &gpus).unwrap();
        assert_eq!(all, gpus);
        let one = resolve(&"1".parse().unwrap(), &gpus).unwrap();
        assert_eq!(one, [gpus[1].clone()]);
        // By UUID, in the order named.
        let both = resolve(&format!("{UUID_1},0").parse().unwrap(), &gpus).unwrap();
        assert_eq!(both.iter().map(|p| p.ordinal).collect::<Vec<_>>(), [1, 0]);
        let e = resolve(&"7".parse().unwrap(), &gpus).unwrap_err();
        assert!(
            e.starts_with("no CUDA device 7 here; present: [0] NVIDIA H200 (GPU-5fd4a7f7"),
            "{e}"
        );
        assert!(
            e.contains("[1] NVIDIA H200 (GPU-0badcafe-0000-1111-2222-333344445555)"),
            "{e}"
        );
        let e = resolve(
            &"GPU-00000000-0000-0000-0000-000000000001".parse().unwrap(),
            &gpus,
        )
        .unwrap_err();
        let want = "no CUDA device with UUID GPU-00000000-0000-0000-0000-000000000001 here; ";
        assert!(e.starts_with(&format!("{want}present: [0]")), "{e}");
        let e = resolve(&format!("0,{UUID_0}").parse().unwrap(), &gpus).unwrap_err();
        assert!(e.contains("named twice"), "{e}");
        let e = resolve(&Devices::All, &[]).unwrap_err();
        assert!(e.contains("no CUDA device is present"), "{e}");
        let e = resolve(&"0".parse().unwrap(), &[]).unwrap_err();
        assert_eq!(e, "no CUDA device 0 here; no CUDA device is present");
    }
}
