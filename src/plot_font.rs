//! The plots' font, shared by `tardi profile` and the benchmark programs (`examples/` include
//! this file with `#[path]`): plotters renders text with ab_glyph from a TrueType file found at
//! run time, so building needs no fontconfig or freetype.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Makes a TrueType font available to the plots (their text is rendered by ab_glyph, not by the
/// system): `$TARDI_PLOT_FONT`, else DejaVu Sans or another common sans font, else whatever
/// fontconfig's `fc-match` names, else any .ttf under /usr/share/fonts.
pub fn load_font() -> Result<(), String> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Some(p) = std::env::var_os("TARDI_PLOT_FONT") {
            candidates.push(p.into());
        }
        for p in [
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/TTF/DejaVuSans.ttf",
            "/usr/share/fonts/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
            "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
            "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
            "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
            "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
        ] {
            candidates.push(p.into());
        }
        if let Ok(out) = Command::new("fc-match")
            .args(["-f", "%{file}", "sans-serif"])
            .stderr(Stdio::null())
            .output()
            && out.status.success()
        {
            candidates.push(String::from_utf8_lossy(&out.stdout).trim().into());
        }
        find_ttf(Path::new("/usr/share/fonts"), &mut candidates, 3);
        for p in candidates {
            let Ok(bytes) = std::fs::read(&p) else {
                continue;
            };
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            let ok = ["sans-serif", "serif", "monospace"].iter().all(|family| {
                plotters::style::register_font(family, plotters::style::FontStyle::Normal, bytes)
                    .is_ok()
            });
            if ok {
                tracing::debug!(font = %p.display(), "plot font");
                return Ok(());
            }
        }
        Err("no usable TrueType font for the plots' text: install one (Debian: apt-get install fonts-dejavu-core) or set TARDI_PLOT_FONT to a .ttf file".into())
    })
    .clone()
}

fn find_ttf(dir: &Path, out: &mut Vec<PathBuf>, depth: u32) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            if depth > 0 {
                find_ttf(&p, out, depth - 1);
            }
        } else if p.extension().is_some_and(|e| e.eq_ignore_ascii_case("ttf")) {
            out.push(p);
        }
    }
}
