// `Gpu::bind` pushes the context on the calling thread's stack and its guard pops it
// when dropped; dropped on another thread it would pop that thread's context. It is not `Send`.
fn main() {
    let gpu = vkgdr::Gpu::open(0).unwrap();
    let guard = gpu.bind().unwrap();
    std::thread::scope(|s| {
        s.spawn(move || drop(guard));
    });
}
