//! AFL++ target: a checkpoint's metadata and page data, read and applied by a receiver.
fn main() {
    afl::fuzz!(|data: &[u8]| tardi_image_fuzz::run_apply(data));
}
