// `Mapping`'s provided methods write through `host_ptr()` after checking offsets against
// `len()` only, so a type that lies about either would let safe code write out of bounds. The
// trait is `unsafe` to implement: its obligations are the implementor's.
use vkgdr::{Mapping, Result};

struct Liar;

impl Mapping for Liar {
    fn host_ptr(&self) -> *mut u8 {
        std::ptr::null_mut()
    }
    fn len(&self) -> u64 {
        u64::MAX
    }
    fn after_write(&mut self, _: u64, _: u64) -> Result<()> {
        Ok(())
    }
    fn before_read(&self, _: u64, _: u64) -> Result<()> {
        Ok(())
    }
}

fn main() {
    let mut liar = Liar;
    liar.write(1 << 40, &[1]).unwrap();
}
