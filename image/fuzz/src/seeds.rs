//! Writes the seed inputs of both targets into DIR/apply and DIR/page: every checkpoint of the
//! test chain, and its encoded pages.
use tardi_image_fuzz::{apply_input, chain, page_tag, twins};

fn main() -> std::io::Result<()> {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).unwrap_or("seeds".into()));
    std::fs::create_dir_all(dir.join("apply"))?;
    std::fs::create_dir_all(dir.join("page"))?;
    let ch = chain();
    for (i, ck) in ch.cks.iter().enumerate() {
        std::fs::write(dir.join(format!("apply/{i}")), apply_input(ck))?;
    }
    // Pages of one codec each, against twin 0.
    let twins = twins();
    let mut pc = tardi_image::delta::PageCodec::new().expect("zstd context");
    for (i, codec) in tardi_image::delta::Codec::ALL.into_iter().enumerate() {
        let mut page = twins[0].clone();
        page[100..140].fill(i as u8 + 1);
        let mut bytes = Vec::new();
        let enc = pc.encode_page(codec, Some(&twins[0]), &page, &mut bytes);
        let mut input = vec![page_tag(enc), 0];
        input.extend_from_slice(&bytes);
        std::fs::write(dir.join(format!("page/{codec}")), input)?;
    }
    Ok(())
}
