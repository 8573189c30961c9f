//! The hidden `--probe` subcommand: makes system calls with harmless
//! arguments and prints what the kernel (or the filter above it) answered,
//! one line per call:
//!
//! ```text
//! 425 io_uring_setup EFAULT (errno 14)
//! 39 getpid ok (returned 4242)
//! ```
//!
//! A token is a system call number (`425`), `x32:N` for the same call
//! through the x32 ABI (the number with bit 30 set), `thread:N` for the call
//! made on a thread spawned for it, or `i386:20` for getpid through
//! `int 0x80` (the 32-bit ABI). Only numbers listed here are accepted: a
//! call with made-up arguments could exit, fork or block, so every call has
//! arguments that make it fail early (a bad descriptor, a zero size,
//! unknown flags) or do nothing that matters.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::thread;

/// What a call returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It returned this non-negative value.
    Returned(i64),
    /// It failed with this errno.
    Failed(i32),
}

impl Outcome {
    /// The probe's spelling: `ok (returned N)` or `ENAME (errno N)`.
    pub fn describe(self) -> String {
        match self {
            Outcome::Returned(value) => format!("ok (returned {value})"),
            Outcome::Failed(errno) => format!("{} (errno {errno})", errno_name(errno)),
        }
    }
}

/// The symbolic name of the errno values these calls can give.
pub fn errno_name(errno: i32) -> String {
    let name = match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EINTR => "EINTR",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EINVAL => "EINVAL",
        libc::EMFILE => "EMFILE",
        libc::ENOSYS => "ENOSYS",
        libc::E2BIG => "E2BIG",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        _ => return format!("errno{errno}"),
    };
    name.to_owned()
}

/// One token of the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Native(u32),
    X32(u32),
    OnThread(u32),
    I386Getpid,
}

/// `__X32_SYSCALL_BIT`.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// `AT_FDCWD`, as the kernel reads it from a register.
const AT_FDCWD: i64 = libc::AT_FDCWD as i64;
/// getpid in the i386 table.
const I386_GETPID: &str = "20";

/// Scratch files for the calls that really move a byte.
#[derive(Debug)]
struct Scratch {
    zero: File,
    null: File,
    buffer: [u8; 8],
}

impl Scratch {
    fn open() -> io::Result<Scratch> {
        Ok(Scratch {
            zero: File::open("/dev/zero")?,
            null: OpenOptions::new().write(true).open("/dev/null")?,
            buffer: [0; 8],
        })
    }
}

/// The name and the six arguments of a harmless call, or `None` when no
/// harmless arguments are known for the number.
fn harmless_call(number: u32, scratch: &mut Scratch) -> Option<(&'static str, [i64; 6])> {
    let buffer = scratch.buffer.as_mut_ptr() as i64;
    let root = c"/".as_ptr() as i64;
    let bad_fd = -1;
    let all_flags = i64::from(u32::MAX);
    Some(match number {
        0 => (
            "read",
            [scratch.zero.as_raw_fd().into(), buffer, 1, 0, 0, 0],
        ),
        1 => (
            "write",
            [scratch.null.as_raw_fd().into(), buffer, 1, 0, 0, 0],
        ),
        39 => ("getpid", [0; 6]),
        // Unknown flag bits: EINVAL before anything is unshared.
        272 => ("unshare", [all_flags, 0, 0, 0, 0, 0]),
        424 => ("pidfd_send_signal", [bad_fd, 0, 0, 0, 0, 0]),
        // No entries, NULL params: EFAULT (or EINVAL) where io_uring is
        // there, EPERM where it is disabled.
        425 => ("io_uring_setup", [0, 0, 0, 0, 0, 0]),
        426 => ("io_uring_enter", [bad_fd, 0, 0, 0, 0, 0]),
        427 => ("io_uring_register", [bad_fd, 0, 0, 0, 0, 0]),
        434 => ("pidfd_open", [0, 0, 0, 0, 0, 0]),
        // A size below CLONE_ARGS_SIZE_VER0 is refused before anything is read.
        435 => ("clone3", [0, 0, 0, 0, 0, 0]),
        436 => ("close_range", [1, 0, 0, 0, 0, 0]),
        437 => ("openat2", [AT_FDCWD, 0, 0, 0, 0, 0]),
        439 => ("faccessat2", [AT_FDCWD, root, libc::F_OK.into(), 0, 0, 0]),
        441 => ("epoll_pwait2", [bad_fd, 0, 1, 0, 0, 0]),
        447 => ("memfd_secret", [all_flags, 0, 0, 0, 0, 0]),
        448 => ("process_mrelease", [bad_fd, 0, 0, 0, 0, 0]),
        449 => ("futex_waitv", [0, 0, 0, 0, 0, 0]),
        450 => ("set_mempolicy_home_node", [0, 0, 0, 1, 0, 0]),
        451 => ("cachestat", [bad_fd, 0, 0, 0, 0, 0]),
        452 => ("fchmodat2", [AT_FDCWD, 0, 0, all_flags, 0, 0]),
        462 => ("mseal", [0, 0, 1, 0, 0, 0]),
        _ => return None,
    })
}

/// The numbers `--probe` accepts.
pub fn known_numbers() -> Vec<u32> {
    let mut scratch = Scratch::open().expect("/dev/zero and /dev/null open");
    (0..1024)
        .filter(|&n| harmless_call(n, &mut scratch).is_some())
        .collect()
}

fn raw_syscall(number: u32, args: [i64; 6]) -> Outcome {
    // SAFETY: every call that `harmless_call` lists either fails before it
    // touches memory (bad descriptor, size or flags) or reads/writes only
    // `Scratch::buffer` (8 bytes, alive for the call) and the static "/".
    let ret = unsafe {
        libc::syscall(
            libc::c_long::from(number),
            args[0],
            args[1],
            args[2],
            args[3],
            args[4],
            args[5],
        )
    };
    if ret < 0 {
        Outcome::Failed(io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Outcome::Returned(ret)
    }
}

fn call(number: u32, abi_bit: u32) -> Result<(&'static str, Outcome), String> {
    let mut scratch = Scratch::open().map_err(|e| format!("cannot open scratch files: {e}"))?;
    let (name, args) = harmless_call(number, &mut scratch).ok_or_else(|| {
        format!(
            "no harmless call known for system call {number} (known: {:?})",
            known_numbers()
        )
    })?;
    Ok((name, raw_syscall(abi_bit | number, args)))
}

#[cfg(target_arch = "x86_64")]
fn i386_getpid() -> Outcome {
    // A profile kills the process for this call: no core file for that.
    // SAFETY: PR_SET_DUMPABLE takes integers only.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    let ret: i64;
    // SAFETY: getpid takes no arguments and touches no memory; `int 0x80`
    // from 64-bit code enters the kernel's 32-bit entry, which returns in
    // rax and may clear r8-r11 (declared as clobbered).
    unsafe {
        std::arch::asm!(
            "int 0x80",
            inlateout("rax") 20i64 => ret,
            lateout("r8") _, lateout("r9") _, lateout("r10") _, lateout("r11") _,
        );
    }
    // The 32-bit entry answers in eax: a negative value is -errno.
    let ret = i64::from(ret as i32);
    if ret < 0 {
        Outcome::Failed(i32::try_from(-ret).unwrap_or(0))
    } else {
        Outcome::Returned(ret)
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn i386_getpid() -> Outcome {
    Outcome::Failed(libc::ENOSYS)
}

fn parse(token: &str) -> Result<Target, String> {
    let number = |text: &str| {
        text.parse::<u32>().map_err(|_| {
            format!("'{token}' is not a system call number, x32:N, thread:N or i386:20")
        })
    };
    if let Some(rest) = token.strip_prefix("x32:") {
        Ok(Target::X32(number(rest)?))
    } else if let Some(rest) = token.strip_prefix("thread:") {
        Ok(Target::OnThread(number(rest)?))
    } else if let Some(rest) = token.strip_prefix("i386:") {
        if rest == I386_GETPID {
            Ok(Target::I386Getpid)
        } else {
            Err(format!(
                "only i386:{I386_GETPID} (getpid) is probed through int 0x80"
            ))
        }
    } else {
        Ok(Target::Native(number(token)?))
    }
}

fn probe_one(token: &str) -> Result<(&'static str, Outcome), String> {
    match parse(token)? {
        Target::Native(number) => call(number, 0),
        Target::X32(number) => call(number, X32_SYSCALL_BIT),
        Target::OnThread(number) => thread::Builder::new()
            .name(format!("probe-{number}"))
            .spawn(move || call(number, 0))
            .map_err(|e| format!("cannot start a thread: {e}"))?
            .join()
            .map_err(|_| "the probe thread panicked".to_owned())?,
        Target::I386Getpid => Ok(("getpid", i386_getpid())),
    }
}

/// Runs the probe for each token, printing one line each. Stops at the
/// first token it cannot probe (before making any call for it).
pub fn run(tokens: &[String]) -> Result<(), String> {
    if tokens.is_empty() {
        return Err("--probe needs system call numbers".to_owned());
    }
    for token in tokens {
        let (name, outcome) = probe_one(token)?;
        println!("{token} {name} {}", outcome.describe());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_parse() {
        assert_eq!(parse("425"), Ok(Target::Native(425)));
        assert_eq!(parse("x32:39"), Ok(Target::X32(39)));
        assert_eq!(parse("thread:435"), Ok(Target::OnThread(435)));
        assert_eq!(parse("i386:20"), Ok(Target::I386Getpid));
        assert!(parse("i386:5").is_err());
        assert!(parse("io_uring").is_err());
    }

    #[test]
    fn unknown_numbers_are_refused_before_any_call() {
        let error = call(60, 0).unwrap_err(); // exit: not harmless
        assert!(
            error.contains("no harmless call known for system call 60"),
            "{error}"
        );
    }

    #[test]
    fn unfiltered_calls_reach_the_kernel() {
        assert_eq!(call(0, 0).unwrap(), ("read", Outcome::Returned(1)));
        assert_eq!(call(1, 0).unwrap(), ("write", Outcome::Returned(1)));
        assert_eq!(
            call(39, 0).unwrap().1,
            Outcome::Returned(i64::from(std::process::id()))
        );
    }
}
