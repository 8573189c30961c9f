//! The profiles: which x86_64 system call numbers each refuses, and with
//! which errno. Pure data, so that the rules can be read and tested without
//! installing anything.
//!
//! Every number here was checked against the kernel's table,
//! `arch/x86/entry/syscalls/syscall_64.tbl` in torvalds/linux (read at
//! commit 7237cb3e1544718a972b732e66ebcf0f63b128a5, whose last entry is
//! `462 mseal`; upstream has reached 471 since):
//!
//! ```text
//! 272 unshare                        Linux 2.6.16
//! 333 io_pgetevents, 334 rseq         Linux 4.18: the last two of RHEL 8's kernel
//! 335 uretprobe                       Linux 6.11, put into the old gap
//! 387..=423                           never used on x86_64 (kept free to stay
//!                                     in step with the 32-bit time64 calls)
//! 424 pidfd_send_signal               Linux 5.1
//! 425 io_uring_setup, 426 io_uring_enter, 427 io_uring_register   Linux 5.1
//! 434 pidfd_open, 435 clone3, 436 close_range, 437 openat2,
//! 439 faccessat2, 441 epoll_pwait2
//! 447 memfd_secret                    Linux 5.14: the last of RHEL 9's kernel
//! 448 process_mrelease                Linux 5.15
//! 449 futex_waitv                     Linux 5.16
//! 451 cachestat                       Linux 6.5
//! 512..=547                           the x32 ABI's own numbers (not native calls)
//! ```

use std::fmt;
use std::ops::RangeInclusive;

/// The highest system call number the filters have a rule for.
///
/// seccompiler matches system calls by exact number, not by a comparison, so
/// "everything newer than Linux N" becomes one rule per number up to a bound.
/// The bound sits far past today's last call (471 in 2026; new calls arrive
/// at about eight a year, so 600 lasts well over a decade) so that a program
/// built against a newer kernel's headers than this table still gets ENOSYS
/// for calls nobody here has heard of. Each rule costs five BPF instructions
/// (the kernel allows 4096) and nothing at run time: the kernel caches the
/// verdict of a filter that looks only at the architecture and the number
/// (Linux 5.11+), so allowed calls never run the filter at all.
pub const HIGHEST_RULED_NUMBER: u32 = 600;

/// The last x86_64 system call number upstream Linux has assigned, as far
/// as this table knows; the tests check that the bound above stays far past it.
pub const LAST_KNOWN_NUMBER: u32 = 471;

/// Refused to a container without CAP_SYS_ADMIN by its runtime's profile.
const UNSHARE: u32 = 272;
/// uretprobe (Linux 6.11) took a number below 424, in the gap after rseq.
const URETPROBE: u32 = 335;
const IO_URING_SETUP: u32 = 425;
const IO_URING_REGISTER: u32 = 427;
/// The first call after Linux 5.14 (memfd_secret, 447, is 5.14's last).
const PROCESS_MRELEASE: u32 = 448;

/// A set of refusals that reproduces what one family of RHEL kernels answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Profile {
    /// RHEL 8 (kernel 4.18): nothing newer than 4.18 exists.
    Rhel8,
    /// RHEL 9.0-9.2 (kernel 5.14, built without io_uring).
    Rhel9,
    /// RHEL 9.3+ and 10: io_uring refused with EPERM.
    UringDisabled,
    /// A container under Docker's default seccomp profile (moby/profiles),
    /// without CAP_SYS_ADMIN: io_uring and `unshare` refused with EPERM
    /// (so no thread gets a working directory of its own).
    Container,
}

impl Profile {
    /// Every profile, in the order they are listed to users.
    pub const ALL: [Profile; 4] = [
        Profile::Rhel8,
        Profile::Rhel9,
        Profile::UringDisabled,
        Profile::Container,
    ];

    /// The name given on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Rhel8 => "rhel8",
            Profile::Rhel9 => "rhel9",
            Profile::UringDisabled => "uring-disabled",
            Profile::Container => "container",
        }
    }

    /// The profile a command-line name stands for.
    pub fn from_name(name: &str) -> Result<Profile, UnknownProfile> {
        Profile::ALL
            .into_iter()
            .find(|profile| profile.name() == name)
            .ok_or_else(|| UnknownProfile(name.to_owned()))
    }

    /// One line for `--list` and the docs.
    pub fn summary(self) -> &'static str {
        match self {
            Profile::Rhel8 => {
                "RHEL 8 (Linux 4.18): ENOSYS for uretprobe (335) and every call from 424 up \
                 (pidfd_*, io_uring_*, clone3, close_range, openat2, faccessat2, cachestat, ...)"
            }
            Profile::Rhel9 => {
                "RHEL 9.0-9.2 (Linux 5.14, no io_uring): ENOSYS for io_uring_* (425-427), \
                 uretprobe (335) and every call from 448 up (futex_waitv, cachestat, ...)"
            }
            Profile::UringDisabled => {
                "RHEL 9.3+ and 10 (kernel.io_uring_disabled): \
                 EPERM for io_uring_setup/enter/register (425-427)"
            }
            Profile::Container => {
                "a container under Docker's default seccomp profile, without \
                 CAP_SYS_ADMIN: EPERM for unshare (272) and io_uring_setup/enter/register (425-427)"
            }
        }
    }

    /// What a refused call returns. A kernel that lacks a call says ENOSYS;
    /// one that has io_uring but refuses it by policy says EPERM (the
    /// `io_uring_disabled` sysctl, SELinux, a runtime's seccomp profile).
    pub fn errno(self) -> i32 {
        match self {
            Profile::Rhel8 | Profile::Rhel9 => libc::ENOSYS,
            Profile::UringDisabled | Profile::Container => libc::EPERM,
        }
    }

    /// The refused x86_64 system call numbers, as ranges.
    pub fn refused_ranges(self) -> Vec<RangeInclusive<u32>> {
        match self {
            // 336..=423 were never assigned (the kernel answers ENOSYS itself):
            // refusing them too means a call someday put into that gap, as
            // uretprobe was, is refused without a change here.
            Profile::Rhel8 => vec![URETPROBE..=HIGHEST_RULED_NUMBER],
            Profile::Rhel9 => vec![
                URETPROBE..=URETPROBE,
                IO_URING_SETUP..=IO_URING_REGISTER,
                PROCESS_MRELEASE..=HIGHEST_RULED_NUMBER,
            ],
            Profile::UringDisabled => vec![IO_URING_SETUP..=IO_URING_REGISTER],
            Profile::Container => vec![UNSHARE..=UNSHARE, IO_URING_SETUP..=IO_URING_REGISTER],
        }
    }

    /// Every refused number, ascending.
    pub fn refused_numbers(self) -> impl Iterator<Item = u32> {
        self.refused_ranges().into_iter().flatten()
    }

    /// Whether the profile refuses this x86_64 system call number.
    pub fn refuses(self, number: u32) -> bool {
        self.refused_ranges()
            .iter()
            .any(|range| range.contains(&number))
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A profile name that is not one of [`Profile::ALL`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownProfile(pub String);

impl fmt::Display for UnknownProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let known: Vec<&str> = Profile::ALL.iter().map(|p| p.name()).collect();
        write!(
            f,
            "unknown profile '{}' (known profiles: {})",
            self.0,
            known.join(", ")
        )
    }
}

impl std::error::Error for UnknownProfile {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_known_ones() {
        for profile in Profile::ALL {
            assert_eq!(Profile::from_name(profile.name()), Ok(profile));
        }
        let message = Profile::from_name("rhel7").unwrap_err().to_string();
        assert_eq!(
            message,
            "unknown profile 'rhel7' (known profiles: rhel8, rhel9, uring-disabled, container)"
        );
    }

    #[test]
    fn rhel8_refuses_everything_after_4_18() {
        let p = Profile::Rhel8;
        for allowed in [0, 1, 39, 56, 57, 59, 318, 326, 332, 333, 334] {
            assert!(!p.refuses(allowed), "{allowed}");
        }
        for refused in [
            335, 423, 424, 425, 426, 427, 434, 435, 436, 437, 439, 441, 447, 451,
        ] {
            assert!(p.refuses(refused), "{refused}");
        }
        assert!((424..=HIGHEST_RULED_NUMBER).all(|n| p.refuses(n)));
        assert!(!p.refuses(HIGHEST_RULED_NUMBER + 1));
        assert_eq!(p.errno(), libc::ENOSYS);
    }

    #[test]
    fn rhel9_refuses_io_uring_and_everything_after_5_14() {
        let p = Profile::Rhel9;
        // 5.14 has these: pidfd_send_signal, the mount API, pidfd_open,
        // clone3 ... landlock, memfd_secret.
        for allowed in (424..=424).chain(428..=447) {
            assert!(!p.refuses(allowed), "{allowed}");
        }
        for refused in [335, 425, 426, 427, 448, 449, 450, 451, 452, 462, 471] {
            assert!(p.refuses(refused), "{refused}");
        }
        assert_eq!(p.errno(), libc::ENOSYS);
    }

    #[test]
    fn uring_disabled_refuses_only_io_uring_with_eperm() {
        let p = Profile::UringDisabled;
        let refused: Vec<u32> = p.refused_numbers().collect();
        assert_eq!(refused, [425, 426, 427]);
        assert_eq!(p.errno(), libc::EPERM);
    }

    #[test]
    fn container_refuses_unshare_and_io_uring_with_eperm() {
        let p = Profile::Container;
        let refused: Vec<u32> = p.refused_numbers().collect();
        assert_eq!(refused, [272, 425, 426, 427]);
        assert_eq!(p.errno(), libc::EPERM);
    }

    #[test]
    fn the_rule_bound_stays_far_past_the_last_known_call() {
        // Raise HIGHEST_RULED_NUMBER when Linux comes within 100 of it.
        const _: () = assert!(HIGHEST_RULED_NUMBER >= LAST_KNOWN_NUMBER + 100);
        assert!(Profile::Rhel8.refuses(LAST_KNOWN_NUMBER));
        assert!(Profile::Rhel9.refuses(LAST_KNOWN_NUMBER));
    }
}
