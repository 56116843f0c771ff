//! The share protocol's message parser on arbitrary bytes (what a hostile peer or owner can
//! send): `decode` never panics, and whatever it accepts is a message whose fields keep their
//! rules and that encodes back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vkgdr::share::wire::{decode, encode, Message, Region};

fuzz_target!(|input: (u8, &[u8])| {
    let (fds, bytes) = input;
    let fds = usize::from(fds % 5);
    let Ok(m) = decode(bytes, fds) else {
        return;
    };
    assert_eq!(m.fd_count(), fds, "an accepted message carries the fds it says");
    assert_eq!(encode(&m), bytes, "an accepted message encodes back to its bytes");
    if let Message::Region(d) = &m {
        assert!(d.attachment != 0 && d.atom.is_power_of_two() && d.memory_type < 32);
        match d.region {
            Region::Memory { size, len } => {
                assert!(size > 0 && size % 4096 == 0 && len > 0 && len <= size)
            }
            Region::RingLane(l) => {
                assert!(l.capacity.is_power_of_two() && l.capacity >= 4096);
                assert!(l.data_offset + l.capacity <= l.data_size);
                assert!(l.head <= l.start_pos && l.start_pos - l.head <= l.capacity);
                assert_eq!(l.start_pos % 16, 0);
            }
            Region::Pool { .. } => {}
        }
    }
});
