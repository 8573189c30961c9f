//! A profile turned into a seccomp-bpf program, and installed.
//!
//! The program is a short hand-written prologue followed by what
//! seccompiler compiles from the profile's rules:
//!
//! ```text
//! 0  load arch
//! 1  arch == AUDIT_ARCH_X86_64 ? skip 1
//! 2  return KILL_PROCESS                 i386 (int 0x80, 32-bit binaries), anything else
//! 3  load nr
//! 4  nr >= __X32_SYSCALL_BIT ? 0 : skip 1
//! 5  return ERRNO(ENOSYS)                the x32 ABI
//! 6  seccompiler: its own arch check, then one rule per refused number
//! ```
//!
//! Why these two answers for calls that are not native x86_64 calls:
//!
//! * **x32** calls arrive with the x86_64 audit arch and bit 30 set in the
//!   number. seccompiler matches exact numbers, so `0x4000_0000 | 425` would
//!   pass every rule and reach io_uring_setup on a kernel with the x32 ABI.
//!   They get ENOSYS: what RHEL kernels answer (built without the x32 ABI,
//!   as Fedora's are) and what this machine's kernel answers already
//!   (`# CONFIG_X86_X32_ABI is not set`), so nothing changes here except
//!   that the door stays shut on a host that has x32.
//! * **Other audit arches** (i386 through `int 0x80` or a 32-bit binary)
//!   number their calls differently below 424, so the x86_64 rules cannot
//!   be applied to them. The profiles do not model 32-bit programs; such a
//!   call kills the process (SIGSYS, "Bad system call") at once, loud,
//!   instead of running unfiltered. This is seccompiler's own arch check;
//!   the prologue repeats it only because the x32 test must come after it.

use seccompiler::{
    BackendError, BpfProgram, SeccompAction, SeccompFilter, SeccompRule, TargetArch, sock_filter,
};
use std::collections::BTreeMap;
use std::fmt;

use crate::profile::Profile;

/// `AUDIT_ARCH_X86_64` (`EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE`).
pub const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
/// `__X32_SYSCALL_BIT`: set in the number of every x32 system call.
pub const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// The kernel's limit on a filter's length (`BPF_MAXINSNS`).
pub const MAX_INSTRUCTIONS: usize = 4096;

// Offsets into `struct seccomp_data` and the classic BPF opcodes used.
const SECCOMP_DATA_NR: u32 = 0;
const SECCOMP_DATA_ARCH: u32 = 4;
const LOAD_WORD_ABS: u16 = 0x20; // BPF_LD (0) | BPF_W (0) | BPF_ABS (0x20)
const JUMP_IF_EQUAL: u16 = 0x05 | 0x10; // BPF_JMP | BPF_JEQ | BPF_K
const JUMP_IF_AT_LEAST: u16 = 0x05 | 0x30; // BPF_JMP | BPF_JGE | BPF_K
const RETURN: u16 = 0x06; // BPF_RET | BPF_K

/// Why a profile could not be compiled or installed.
#[derive(Debug)]
pub enum FilterError {
    /// seccompiler refused the rules.
    Compile(BackendError),
    /// The program is longer than the kernel accepts.
    TooLong(usize),
    /// `prctl(PR_SET_NO_NEW_PRIVS)` or `seccomp(SECCOMP_SET_MODE_FILTER)` failed.
    Install(seccompiler::Error),
}

impl fmt::Display for FilterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FilterError::Compile(e) => write!(f, "cannot compile the seccomp filter: {e}"),
            FilterError::TooLong(len) => write!(
                f,
                "the seccomp filter has {len} instructions, more than the kernel's {MAX_INSTRUCTIONS}"
            ),
            FilterError::Install(e) => write!(f, "cannot install the seccomp filter: {e}"),
        }
    }
}

impl std::error::Error for FilterError {}

fn statement(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

fn errno_action(errno: i32) -> u32 {
    libc::SECCOMP_RET_ERRNO | (errno as u32 & libc::SECCOMP_RET_DATA)
}

/// The instructions in front of seccompiler's program (see the module docs).
fn abi_prologue() -> BpfProgram {
    vec![
        statement(LOAD_WORD_ABS, SECCOMP_DATA_ARCH),
        jump(JUMP_IF_EQUAL, AUDIT_ARCH_X86_64, 1, 0),
        statement(RETURN, libc::SECCOMP_RET_KILL_PROCESS),
        statement(LOAD_WORD_ABS, SECCOMP_DATA_NR),
        jump(JUMP_IF_AT_LEAST, X32_SYSCALL_BIT, 0, 1),
        statement(RETURN, errno_action(libc::ENOSYS)),
    ]
}

/// The whole seccomp-bpf program for a profile.
pub fn compile(profile: Profile) -> Result<BpfProgram, FilterError> {
    let rules: BTreeMap<i64, Vec<SeccompRule>> = profile
        .refused_numbers()
        .map(|number| (i64::from(number), Vec::new()))
        .collect();
    let errno = u32::try_from(profile.errno()).expect("errno values are positive");
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno),
        TargetArch::x86_64,
    )
    .map_err(FilterError::Compile)?;
    let body: BpfProgram = filter.try_into().map_err(FilterError::Compile)?;

    let mut program = abi_prologue();
    program.extend(body);
    if program.len() > MAX_INSTRUCTIONS {
        return Err(FilterError::TooLong(program.len()));
    }
    Ok(program)
}

/// Installs the program on the calling thread. seccompiler sets
/// `PR_SET_NO_NEW_PRIVS` first (the kernel requires it of an unprivileged
/// caller, and it keeps a set-uid program from shedding the filter); the
/// filter then stays with the thread through `execve` and is inherited by
/// every thread and process it creates. No way exists to remove it.
pub fn install(program: &BpfProgram) -> Result<(), FilterError> {
    seccompiler::apply_filter(program).map_err(FilterError::Install)
}

#[cfg(test)]
mod tests {
    use super::*;

    const AUDIT_ARCH_I386: u32 = 3 | 0x4000_0000;
    const AUDIT_ARCH_AARCH64: u32 = 183 | 0x8000_0000 | 0x4000_0000;
    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
    const KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;

    /// What the kernel would answer: a classic-BPF interpreter for the
    /// instructions these programs are made of (any other opcode fails the
    /// test, so a change in seccompiler's output is noticed).
    fn verdict(program: &BpfProgram, arch: u32, number: u32) -> u32 {
        let mut accumulator = 0u32;
        let mut pc = 0usize;
        loop {
            let insn = &program[pc];
            pc += 1;
            match insn.code {
                LOAD_WORD_ABS => {
                    accumulator = match insn.k {
                        SECCOMP_DATA_NR => number,
                        SECCOMP_DATA_ARCH => arch,
                        other => panic!("load from offset {other}"),
                    }
                }
                0x05 => pc += insn.k as usize, // BPF_JMP | BPF_JA
                JUMP_IF_EQUAL | JUMP_IF_AT_LEAST | 0x25 /* JGT */ => {
                    let taken = match insn.code {
                        JUMP_IF_EQUAL => accumulator == insn.k,
                        JUMP_IF_AT_LEAST => accumulator >= insn.k,
                        _ => accumulator > insn.k,
                    };
                    pc += usize::from(if taken { insn.jt } else { insn.jf });
                }
                RETURN => return insn.k,
                other => panic!("opcode {other:#x} at {}", pc - 1),
            }
        }
    }

    fn programs() -> Vec<(Profile, BpfProgram)> {
        Profile::ALL
            .into_iter()
            .map(|p| (p, compile(p).expect("compiles")))
            .collect()
    }

    #[test]
    fn every_number_gets_the_profiles_answer() {
        for (profile, program) in programs() {
            let refused = errno_action(profile.errno());
            for number in 0..=crate::profile::HIGHEST_RULED_NUMBER + 50 {
                let expected = if profile.refuses(number) {
                    refused
                } else {
                    ALLOW
                };
                assert_eq!(
                    verdict(&program, AUDIT_ARCH_X86_64, number),
                    expected,
                    "{profile} {number}"
                );
            }
        }
    }

    #[test]
    fn x32_calls_get_enosys_and_other_arches_are_killed() {
        for (profile, program) in programs() {
            for number in [0, 39, 425, 435, 451, 520] {
                assert_eq!(
                    verdict(&program, AUDIT_ARCH_X86_64, X32_SYSCALL_BIT | number),
                    errno_action(libc::ENOSYS),
                    "{profile} x32 {number}"
                );
                assert_eq!(verdict(&program, AUDIT_ARCH_I386, number), KILL);
                assert_eq!(verdict(&program, AUDIT_ARCH_AARCH64, number), KILL);
            }
        }
    }

    #[test]
    fn programs_fit_the_kernels_limit() {
        for (profile, program) in programs() {
            assert!(
                program.len() <= MAX_INSTRUCTIONS,
                "{profile}: {}",
                program.len()
            );
        }
    }
}
