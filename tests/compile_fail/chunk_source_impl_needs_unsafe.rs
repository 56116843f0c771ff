// A pool carves blocks out of whatever `host_ptr()` and `size()` its chunks report, and
// hands them to safe code. Both seam traits are `unsafe` to implement.
use vkgdr::chunk::{ChunkMemory, ChunkSource};
use vkgdr::{Pool, PoolConfig, Result};

struct Tiny(Box<[u8; 16]>);

impl ChunkMemory for Tiny {
    fn host_ptr(&self) -> *mut u8 {
        self.0.as_ptr().cast_mut()
    }
    fn device_ptr(&self) -> Option<u64> {
        None
    }
    fn size(&self) -> u64 {
        1 << 30
    }
    fn flush_ranges(&self, _: &[(u64, u64)]) -> Result<()> {
        Ok(())
    }
    fn invalidate_ranges(&self, _: &[(u64, u64)]) -> Result<()> {
        Ok(())
    }
}

struct Source;

impl ChunkSource for Source {
    fn allocate_chunk(&self, _: u64) -> Result<Box<dyn ChunkMemory>> {
        Ok(Box::new(Tiny(Box::new([0; 16]))))
    }
    fn atom_size(&self) -> u64 {
        64
    }
    fn is_non_coherent(&self) -> bool {
        false
    }
}

fn main() {
    let _ = Pool::new(Source, PoolConfig::default());
}
