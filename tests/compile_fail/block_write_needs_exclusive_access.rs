// Safe writes take `&mut self`: two live shared borrows of one block cannot both write.
use vkgdr::chunk::HostMemorySource;
use vkgdr::{Mapping, Pool, PoolConfig};

fn main() {
    let pool = Pool::new(HostMemorySource, PoolConfig::default()).unwrap();
    let block = pool.alloc(64, 16).unwrap();
    let a = &block;
    a.write(0, &[1]).unwrap();
}
