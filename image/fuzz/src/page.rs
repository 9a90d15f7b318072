//! AFL++ target: one encoded page, decoded against a twin.
fn main() {
    let mut codec = tardi_image::delta::PageCodec::new().expect("zstd context");
    afl::fuzz!(|data: &[u8]| tardi_image_fuzz::run_page(data, &mut codec));
}
