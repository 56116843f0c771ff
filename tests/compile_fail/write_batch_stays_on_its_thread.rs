// A `WriteBatch` fences the stores of the thread that made them: it cannot move to another
// thread, which would fence the wrong core's write-combining buffers.
use vkgdr::WriteBatch;

fn main() {
    let batch = WriteBatch::new();
    std::thread::spawn(move || batch.finish());
}
