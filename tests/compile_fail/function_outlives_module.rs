// A kernel handle borrows its module: it cannot be used after the module is dropped (unloaded).
use vkgdr::cuda_objects::Module;

fn main() {
    let gpu = vkgdr::Gpu::open(0).unwrap();
    let f = {
        let module = Module::load_ptx(&gpu, "").unwrap();
        module.function("k").unwrap()
    };
    drop(f);
}
