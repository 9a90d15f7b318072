//! Builds the two freestanding blobs with plain `rustc` and checks that neither carries a
//! relocation (each runs at an address chosen at run time, so any absolute address in it would
//! be wrong there):
//! - the restorer (`restorer/main.rs`), exec'd by the restore child;
//! - the write-tracking agent (`agent/main.rs`), loaded into a running process by the
//!   supervisor. For it this also writes a flat image (`tardi-agent.bin`: the loadable segments'
//!   file bytes at their offsets; the zero-filled rest is left to a fresh anonymous mapping) and
//!   `agent_layout.rs` (entry point, control block offset, segments).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-changed=restorer/main.rs");
    println!("cargo:rerun-if-changed=restorer/abi.rs");
    println!("cargo:rerun-if-changed=agent/main.rs");
    println!("cargo:rerun-if-changed=agent/abi.rs");
    println!("cargo:rerun-if-changed=freestanding/syscall.rs");
    build_blob("restorer/main.rs", &out_dir.join("tardi-restorer"));
    let agent = out_dir.join("tardi-agent");
    build_blob("agent/main.rs", &agent);
    agent_layout(&std::fs::read(&agent).unwrap(), &out_dir);
}

fn build_blob(src: &str, out: &Path) {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
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
            src,
            "-o",
        ])
        .arg(out)
        .status()
        .expect("running rustc for a freestanding blob");
    assert!(status.success(), "building {src} failed");
    let elf = std::fs::read(out).unwrap();
    assert!(
        relocation_bytes(&elf) == 0,
        "{src} has relocations; it must be position independent without them"
    );
}

/// Writes the agent's flat image and `agent_layout.rs`.
fn agent_layout(elf: &[u8], out_dir: &Path) {
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap());
    let entry = u64_at(0x18);
    let (phoff, phentsize, phnum) = (u64_at(0x20) as usize, u16_at(0x36), u16_at(0x38));
    let mut segments = Vec::new();
    let mut flat = Vec::new();
    let mut span = 0u64;
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        if u32_at(ph) != 1 {
            continue; // not PT_LOAD
        }
        let (flags, off, vaddr) = (u32_at(ph + 4), u64_at(ph + 8) as usize, u64_at(ph + 0x10));
        let (filesz, memsz) = (u64_at(ph + 0x20) as usize, u64_at(ph + 0x28));
        let end = vaddr as usize + filesz;
        if flat.len() < end {
            flat.resize(end, 0);
        }
        flat[vaddr as usize..end].copy_from_slice(&elf[off..off + filesz]);
        // PF_X=1, PF_W=2, PF_R=4 -> PROT_EXEC=4, PROT_WRITE=2, PROT_READ=1.
        let prot = (flags & 4 != 0) as u32
            | ((flags & 2 != 0) as u32) << 1
            | ((flags & 1 != 0) as u32) << 2;
        let (mstart, mend) = (vaddr & !4095, (vaddr + memsz).div_ceil(4096) * 4096);
        if let Some(&(_, prev_end, _)) = segments.last() {
            assert!(
                mstart >= prev_end,
                "agent segments share a page; cannot protect them apart"
            );
        }
        segments.push((mstart, mend, prot));
        span = span.max(mend);
    }
    // The control block, by name in the symbol table.
    let (shoff, shentsize, shnum) = (u64_at(0x28) as usize, u16_at(0x3a), u16_at(0x3c));
    let mut control = None;
    let mut syscall = None;
    for i in 0..shnum {
        let sh = shoff + i * shentsize;
        if u32_at(sh + 4) != 2 {
            continue; // not SHT_SYMTAB
        }
        let (off, size, link) = (
            u64_at(sh + 0x18) as usize,
            u64_at(sh + 0x20) as usize,
            u32_at(sh + 0x28) as usize,
        );
        let strtab = u64_at(shoff + link * shentsize + 0x18) as usize;
        for s in (off..off + size).step_by(24) {
            let name_at = strtab + u32_at(s) as usize;
            let name_end = name_at + elf[name_at..].iter().position(|&b| b == 0).unwrap();
            let name = std::str::from_utf8(&elf[name_at..name_end]).unwrap_or("");
            if name.contains("TARDI_AGENT_CONTROL") {
                control = Some(u64_at(s + 8));
            }
            if name == "tardi_agent_syscall" {
                syscall = Some(u64_at(s + 8));
            }
        }
    }
    let control = control.expect("the agent's symbol table names TARDI_AGENT_CONTROL");
    let syscall = syscall.expect("the agent's symbol table names tardi_agent_syscall");
    std::fs::write(out_dir.join("tardi-agent.bin"), &flat).unwrap();
    let segs: Vec<String> = segments
        .iter()
        .map(|(s, e, p)| format!("({s:#x}, {e:#x}, {p})"))
        .collect();
    std::fs::write(
        out_dir.join("agent_layout.rs"),
        format!(
            "/// Entry point (`_start`), offset from the load address.\n\
             pub const ENTRY: u64 = {entry:#x};\n\
             /// The control block, offset from the load address.\n\
             pub const CONTROL: u64 = {control:#x};\n\
             /// A `syscall` instruction, offset from the load address.\n\
             pub const SYSCALL: u64 = {syscall:#x};\n\
             /// Bytes to reserve (the zero-filled tail included).\n\
             pub const SPAN: u64 = {span:#x};\n\
             /// (start, end, PROT_*) of each loadable segment, page-aligned offsets.\n\
             pub const SEGMENTS: &[(u64, u64, u32)] = &[{}];\n",
            segs.join(", ")
        ),
    )
    .unwrap();
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
