// A ring's sink writes wherever it is told (a BAR mapping: anywhere in the process) and
// publishes any tail, so safe code must not be able to call it. Its methods are `unsafe`.
use vkgdr::ring::core::{HostSink, RingCore, RingSink};

fn main() {
    let ring = RingCore::new(4096, HostSink::new(4096).unwrap()).unwrap();
    ring.sink().write(1 << 40, &[1]);
    ring.sink().publish(1 << 20);
}
