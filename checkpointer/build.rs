//! Builds the freestanding restorer (`restorer/main.rs`) with plain `rustc` and checks that the
//! linked binary carries no relocations: it copies itself to another address at run time, so any
//! absolute address in it would be wrong there.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("tardi-restorer");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    println!("cargo:rerun-if-changed=restorer/main.rs");
    println!("cargo:rerun-if-changed=restorer/abi.rs");
    let status = Command::new(&rustc)
        .args([
            "--edition=2024",
            "--crate-type=bin",
            "-Cpanic=abort",
            "-Copt-level=2",
            "-Cdebug-assertions=off",
            "-Coverflow-checks=off",
            "-Crelocation-model=pie",
            "-Clink-arg=-nostartfiles",
            "-Clink-arg=-nostdlib",
            "-Clink-arg=-static-pie",
            "-Clink-arg=-Wl,--no-dynamic-linker",
            "-Clink-arg=-Wl,-z,noexecstack",
            "restorer/main.rs",
            "-o",
        ])
        .arg(&out)
        .status()
        .expect("running rustc for the restorer");
    assert!(status.success(), "building the restorer failed");
    let elf = std::fs::read(&out).unwrap();
    assert!(
        relocation_bytes(&elf) == 0,
        "the restorer has relocations; it must be position independent without them"
    );
}

/// Total size of SHT_RELA/SHT_REL/SHT_RELR sections in a 64-bit little-endian ELF.
fn relocation_bytes(elf: &[u8]) -> u64 {
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap());
    assert_eq!(&elf[..4], b"\x7fELF");
    let shoff = u64_at(0x28) as usize;
    let shentsize = u16_at(0x3a);
    let shnum = u16_at(0x3c);
    (0..shnum)
        .map(|i| shoff + i * shentsize)
        .filter(|&s| matches!(u32_at(s + 4), 4 | 9 | 19))
        .map(|s| u64_at(s + 0x20))
        .sum()
}
