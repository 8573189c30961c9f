//! Whether io_uring can be used here, asked once: setting up a ring, then
//! `IORING_REGISTER_PROBE` for every opcode the tools submit. A kernel
//! without io_uring (RHEL 8, 9.0–9.2: ENOSYS), one that refuses it (RHEL
//! 9.3+ and 10 by default, `kernel.io_uring_disabled`, SELinux, container
//! seccomp profiles: EPERM), or one whose io_uring lacks an opcode (before
//! Linux 5.11 there is no RENAMEAT) each give a reason in words.

use io_uring::{IoUring, Probe, opcode};

/// The opcodes the engine submits, with the names users see.
const OPCODES: &[(u8, &str)] = &[
    (opcode::Read::CODE, "READ"),
    (opcode::ReadFixed::CODE, "READ_FIXED"),
    (opcode::Write::CODE, "WRITE"),
    (opcode::Fsync::CODE, "FSYNC"),
    (opcode::Fallocate::CODE, "FALLOCATE"),
    (opcode::RenameAt::CODE, "RENAMEAT"),
];

/// `Ok` if the io_uring engine can run here, else why not.
pub(crate) fn uring_usable() -> Result<(), String> {
    let ring = IoUring::new(4).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOSYS) => format!(
            "io_uring_setup: {e}: this kernel has no io_uring \
             (RHEL 8 and 9.0-9.2 kernels are built without it)"
        ),
        Some(libc::EPERM) => format!(
            "io_uring_setup: {e}: io_uring is disabled here \
             (kernel.io_uring_disabled, SELinux or a seccomp filter; \
             RHEL 9.3+ and 10 refuse it by default)"
        ),
        _ => format!("io_uring_setup: {e}"),
    })?;
    let mut probe = Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|e| format!("IORING_REGISTER_PROBE: {e} (a kernel before Linux 5.6)"))?;
    let missing: Vec<&str> = OPCODES
        .iter()
        .filter(|(code, _)| !probe.is_supported(*code))
        .map(|(_, name)| *name)
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "this kernel's io_uring lacks {}",
            missing.join(", ")
        ));
    }
    Ok(())
}
