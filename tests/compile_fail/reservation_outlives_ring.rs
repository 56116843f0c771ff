// A ring reservation borrows its ring: the ring cannot be dropped while a record is half written.
use vkgdr::ring::core::{HostSink, RingCore};

fn main() {
    let ring = RingCore::new(4096, HostSink::new(4096).unwrap()).unwrap();
    let r = ring.try_reserve(16).unwrap();
    drop(ring);
    r.commit();
}
