//! A thread's own state: values only the thread itself can read (injected calls), its XSAVE
//! area fitted to what the restorer restores, its registers as the image keeps them.

#[allow(unused_imports)]
use super::*;

/// clear_child_tid and the alternate signal stack have no outside interface: ask the thread.
pub(super) fn inject_thread_values(
    st: &mut Stopped,
    maps: &[MapEntry],
    tid: Pid,
) -> Result<(u64, AltStack)> {
    let out = inject_ok(
        st,
        maps,
        tid,
        "prctl(PR_GET_TID_ADDRESS)",
        libc::SYS_prctl,
        [libc::PR_GET_TID_ADDRESS as u64, SCRATCH, 0, 0, 0, 0],
        8,
    )?;
    let clear_child_tid = u64::from_le_bytes(out[..8].try_into().unwrap());
    let out = inject_ok(
        st,
        maps,
        tid,
        "sigaltstack",
        libc::SYS_sigaltstack,
        [0, SCRATCH, 0, 0, 0, 0],
        24,
    )?;
    let altstack = AltStack {
        sp: u64::from_le_bytes(out[..8].try_into().unwrap()),
        flags: u32::from_le_bytes(out[8..12].try_into().unwrap()) & !1, // not SS_ONSTACK
        size: u64::from_le_bytes(out[16..24].try_into().unwrap()),
    };
    Ok((clear_child_tid, altstack))
}

/// [`Stopped::inject`] of a call that must succeed; returns the scratch bytes after it.
pub(super) fn inject_ok(
    st: &mut Stopped,
    maps: &[MapEntry],
    tid: Pid,
    call: &'static str,
    nr: i64,
    args: [u64; 6],
    scratch_len: usize,
) -> Result<Vec<u8>> {
    let (r, _, out) = st.inject(maps, tid, nr, args, scratch_len)?;
    if r < 0 {
        return Err(CaptureError::Injected {
            call,
            tid,
            errno: -r,
        });
    }
    Ok(out)
}

/// (SigIgn, SigCgt) of the process, from its `status` text.
pub(super) fn signal_masks(status: &str) -> (u64, u64) {
    let field = |k: &str| {
        procfs::status_value(status, k)
            .and_then(|v| u64::from_str_radix(v, 16).ok())
            .unwrap_or(0)
    };
    (field("SigIgn"), field("SigCgt"))
}

/// Fits a thread's XSAVE area (standard format, as `PTRACE_GETREGSET(NT_X86_XSTATE)` returns
/// it) into what the restore plan carries and what `rt_sigreturn` accepts.
///
/// The kernel reports the area at the size of *every* feature it manages, AMX included (11,008
/// bytes on CPUs with AMX), but a process that never asked for AMX (`ARCH_REQ_XCOMP_PERM`) has
/// a smaller signal-frame size (2,696 bytes with AVX-512 and PKRU), and a frame whose
/// `xstate_size` exceeds it is silently restored as legacy FP/SSE only. So the area is cut at
/// the end of the last component that fits under [`abi::XSTATE_MAX`] and is not dynamic (on
/// this project's machines: 2,816 bytes, AMX's tile configuration included, as the kernel's
/// default size), provided no component beyond the cut is in use (its `XSTATE_BV` bit set);
/// the software-reserved bytes
/// (`struct _fpx_sw_bytes` at offset 464) are rewritten to describe the cut area. Component
/// offsets come from CPUID leaf 0xD, as the kernel's own.
/// The user XSAVE components this CPU supports: (number, size, offset in the standard format,
/// XFD-enabled). From CPUID leaf 0xD, read once: CPUID traps to the hypervisor in a VM (17 µs
/// per call measured on this project's Firecracker VMs, ~1 ms for the 61 sub-leaves), which
/// every pause paid per thread before.
pub(super) fn xsave_components() -> &'static [(u32, usize, usize, bool)] {
    static COMPONENTS: std::sync::OnceLock<Vec<(u32, usize, usize, bool)>> =
        std::sync::OnceLock::new();
    COMPONENTS.get_or_init(|| {
        (2..63u32)
            .filter_map(|i| {
                let r = std::arch::x86_64::__cpuid_count(0xD, i);
                let (size, offset) = (r.eax as usize, r.ebx as usize);
                // Size or offset 0: not supported, or a supervisor component (not in user
                // areas). ECX bit 2: the component is XFD-enabled ("dynamic", AMX tile data):
                // it is part of a process's signal frame only once the process asked for it.
                (size != 0 && offset != 0).then_some((i, size, offset, r.ecx & 4 != 0))
            })
            .collect()
    })
}

pub(super) fn fit_xstate(mut xs: Vec<u8>) -> std::result::Result<Vec<u8>, String> {
    const HEADER_END: usize = 512 + 64; // legacy area + XSAVE header
    if xs.len() <= abi::XSTATE_MAX {
        return Ok(xs);
    }
    let word = |xs: &[u8], off: usize| u64::from_le_bytes(xs[off..off + 8].try_into().unwrap());
    let in_use = word(&xs, 512); // XSTATE_BV
    let mut cut = HEADER_END;
    let mut kept: u64 = 0b11; // x87 and SSE live in the legacy area
    for &(i, size, offset, dynamic) in xsave_components() {
        let end = offset + size;
        if !dynamic && end <= abi::XSTATE_MAX && end <= xs.len() {
            cut = cut.max(end);
            kept |= 1 << i;
        } else if in_use & (1 << i) != 0 {
            return Err(format!(
                "it uses XSAVE component {i} ({size} bytes at offset {offset}; AMX tiles are \
                 components 17-18), which does not fit the {} bytes a checkpoint carries",
                abi::XSTATE_MAX
            ));
        }
    }
    xs.truncate(cut);
    // _fpx_sw_bytes: magic1 (u32), extended_size (u32), xfeatures (u64), xstate_size (u32).
    if u32::from_le_bytes(xs[464..468].try_into().unwrap()) == 0x4650_5853 {
        let features = word(&xs, 472) & kept;
        xs[468..472].copy_from_slice(&(cut as u32 + 4).to_le_bytes());
        xs[472..480].copy_from_slice(&features.to_le_bytes());
        xs[480..484].copy_from_slice(&(cut as u32).to_le_bytes());
    }
    Ok(xs)
}

#[cfg(test)]
mod xstate_tests {
    use super::*;

    /// On a CPU whose XSAVE area exceeds what a checkpoint carries (AMX), an area whose AMX
    /// components are unused is cut and described as cut; one that uses them is refused.
    #[test]
    fn large_xsave_areas_are_cut_or_refused() {
        let tile = std::arch::x86_64::__cpuid_count(0xD, 18);
        let full = (tile.ebx + tile.eax) as usize;
        if tile.eax == 0 || full <= abi::XSTATE_MAX {
            eprintln!("no AMX on this CPU: nothing to cut");
            return;
        }
        let mut xs = vec![0u8; full];
        xs[464..468].copy_from_slice(&0x4650_5853u32.to_le_bytes());
        xs[472..480].copy_from_slice(&((1u64 << 19) - 1).to_le_bytes());
        xs[512..520].copy_from_slice(&0b111u64.to_le_bytes()); // x87, SSE, AVX in use
        let cut = fit_xstate(xs.clone()).expect("unused AMX state is cut");
        assert!(
            cut.len() <= abi::XSTATE_MAX && cut.len() >= 832,
            "{}",
            cut.len()
        );
        let sw = |o: usize| u32::from_le_bytes(cut[o..o + 4].try_into().unwrap());
        assert_eq!(
            sw(480) as usize,
            cut.len(),
            "xstate_size describes the cut area"
        );
        let features = u64::from_le_bytes(cut[472..480].try_into().unwrap());
        assert_eq!(
            features & (1 << 18),
            0,
            "AMX tile data dropped from xfeatures"
        );
        assert_eq!(features & 0b111, 0b111);
        xs[512..520].copy_from_slice(&(0b111u64 | 1 << 18).to_le_bytes());
        assert!(fit_xstate(xs).is_err(), "live AMX tiles are refused");
    }

    /// Each group of the periodic check is read again once per period (each thread's values
    /// too), and with a period of ten epochs or more no pause reads more than one group.
    #[test]
    fn staggered_refresh_reads_each_group_once_per_period_one_group_a_pause() {
        let groups = |r: Refresh| {
            [
                r.layout,
                r.children,
                r.threads != Threads::None,
                r.signals,
                r.process,
                r.fds,
                r.creds,
                r.timers,
                r.seccomp,
                r.pending,
            ]
        };
        for every in [1u64, 3, 5, 10, 16, 25, 100, 250] {
            let mut count = [0u32; 10];
            let mut per_thread = [0u32; 13];
            for epoch in 1..=2 * every {
                let r = Refresh::staggered(epoch, every);
                let due = groups(r);
                let n = due.iter().filter(|&&d| d).count();
                if every >= 10 {
                    assert!(
                        n <= 1,
                        "period {every}, epoch {epoch}: {n} groups in one pause"
                    );
                }
                for (c, d) in count.iter_mut().zip(due) {
                    *c += d as u32;
                }
                for (i, c) in per_thread.iter_mut().enumerate() {
                    *c += r.threads.due(i) as u32;
                }
            }
            count[2] = 2; // counted per thread below
            assert_eq!(
                count, [2; 10],
                "period {every}: each group twice in two periods"
            );
            assert_eq!(
                per_thread, [2; 13],
                "period {every}: each thread's values twice in two periods"
            );
        }
        assert!(Refresh::staggered(100, 100).layout);
        assert_eq!(Refresh::staggered(7, 0), Refresh::NONE, "0: never");
        assert!(Refresh::ALL.threads.due(12));
    }
}
