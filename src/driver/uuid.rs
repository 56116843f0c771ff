//! GPU UUIDs as CUDA, Vulkan and NVML spell them: the one identity the three drivers share, by
//! which a CUDA device is matched to its Vulkan device and its NVML figures.

use crate::error::{Error, InvalidArgument, Result};

/// Formats a 16-byte UUID as `8-4-4-4-12` hex digits.
pub fn format_uuid(u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// Parses a GPU UUID as `nvidia-smi -L`, NVML and [`format_uuid`] write it:
/// `GPU-5fd4a7f7-…`, `MIG-…` or no prefix, 32 hex digits with or without dashes, any case.
pub fn parse_uuid(text: &str) -> Result<[u8; 16]> {
    let bad = || {
        Error::from(InvalidArgument::NotAUuid {
            text: text.to_string(),
        })
    };
    let t = text.trim();
    let body = ["GPU-", "MIG-"]
        .iter()
        .find_map(|p| {
            t.get(..4)
                .filter(|head| head.eq_ignore_ascii_case(p))
                .map(|_| &t[4..])
        })
        .unwrap_or(t);
    let digits: Vec<u8> = body.bytes().filter(|&b| b != b'-').collect();
    if digits.len() != 32 {
        return Err(bad());
    }
    let mut out = [0u8; 16];
    for (i, pair) in digits.chunks(2).enumerate() {
        let hex = std::str::from_utf8(pair).map_err(|_| bad())?;
        out[i] = u8::from_str_radix(hex, 16).map_err(|_| bad())?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_format() {
        let u = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8,
        ];
        assert_eq!(format_uuid(&u), "12345678-9abc-def0-0102-030405060708");
    }

    #[test]
    fn uuid_parse() {
        let u = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8,
        ];
        for text in [
            "12345678-9abc-def0-0102-030405060708",
            "GPU-12345678-9abc-def0-0102-030405060708",
            "gpu-12345678-9ABC-DEF0-0102-030405060708",
            "MIG-12345678-9abc-def0-0102-030405060708",
            "123456789abcdef00102030405060708",
            " GPU-12345678-9abc-def0-0102-030405060708\n",
        ] {
            assert_eq!(parse_uuid(text).unwrap(), u, "{text:?}");
        }
        assert_eq!(parse_uuid(&format_uuid(&u)).unwrap(), u);
        for bad in [
            "",
            "GPU-",
            "12345678-9abc-def0-0102-0304050607",
            "12345678-9abc-def0-0102-03040506070809",
            "1234567g-9abc-def0-0102-030405060708",
            "GPU-12345678-9abc-def0-0102-03040506070é",
            "XYZ-12345678-9abc-def0-0102-030405060708",
        ] {
            let e = parse_uuid(bad).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!(
                    "invalid argument: {bad:?} is not a GPU UUID \
                     (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"
                )
            );
            assert!(
                matches!(&e, Error::InvalidArgument(InvalidArgument::NotAUuid { text }) if text == bad),
                "{bad:?}: {e}"
            );
        }
    }
}
