// A pinned buffer's bytes may change under a running kernel at any time, so safe code
// reads them with volatile or atomic loads (`read`, `load_u64`); a `&[u8]` over them is an
// `unsafe` view whose caller rules device writes out.
use vkgdr::cuda_objects::PinnedBuffer;

fn main() {
    let gpu = vkgdr::Gpu::open(0).unwrap();
    let mut buffer = PinnedBuffer::new(&gpu, 4096).unwrap();
    let seen = buffer.as_slice()[0];
    buffer.as_mut_slice()[0] = seen;
}
