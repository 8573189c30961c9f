//! # kernel-profile: this machine's kernel answering as RHEL kernels do
//!
//! The workspace is developed on a current kernel but runs on RHEL 8, 9 and
//! 10, whose kernels lack the newer system calls (ENOSYS) or refuse io_uring
//! by policy (EPERM). `kernel-profile PROFILE -- COMMAND` reproduces those
//! answers: it installs a seccomp filter and execs the command, and every
//! process and thread the command starts inherits the filter. Test tier 4
//! (`tests/kernel-profiles/run`, `docs/kernel-profiles.md`) runs the
//! integration suites this way.
//!
//! * [`profile`]: which numbers each profile refuses and with which errno,
//!   as plain data with the kernel's table in the comments.
//! * [`filter`]: the profile compiled to seccomp-bpf (seccompiler, plus a
//!   prologue for the x32 and 32-bit ABIs) and installed.
//! * [`probe`]: the hidden `--probe` subcommand the tests use to ask the
//!   kernel directly what a call returns (raw system calls: the one place
//!   with `unsafe`).
#![deny(unsafe_code)]

pub mod filter;
pub mod probe;
pub mod profile;
