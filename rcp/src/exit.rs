//! Why a run ended, as its exit status, from typed errors (never from an
//! error's text):
//!
//! | status | meaning |
//! |---|---|
//! | 0 | every file arrived and was verified (unless `--no-verify`) |
//! | 1 | the copy ran, and some files failed (each is named on stderr; a source file gone since the walk found it is named as vanished, and is no failure) |
//! | 2 | bad usage (the command line; `--digest blake3` on a FIPS-mode host) |
//! | 3 | refused: authentication failed, or the server turned the request down (outside its roots, busy) |
//! | 4 | verification failed: data arrived corrupted (a chunk or file digest differed); nothing corrupted is under its final name |
//! | 5 | a local I/O error stopped the copy (a file or directory that cannot be read or written here) |
//! | 6 | the peer could not be reached, or was lost mid-copy |
//!
//! A stop caused by several is reported as the first that applies in the
//! order 3, 4, 6, 5; anything else that stops a run is 1.

use rfabric::link::LinkError;
use rfabric::transport::TransportError;

use crate::proto::FailKind;

/// The exit statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    Complete = 0,
    Partial = 1,
    Usage = 2,
    Refused = 3,
    Corrupted = 4,
    Io = 5,
    PeerLost = 6,
}

impl Exit {
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The status of a run that ended with these entries failed.
    pub fn of_failures<'a>(kinds: impl IntoIterator<Item = &'a FailKind>) -> Exit {
        let mut exit = Exit::Complete;
        for k in kinds {
            match k {
                FailKind::Corrupted => return Exit::Corrupted,
                FailKind::Io | FailKind::Other => exit = Exit::Partial,
                // (Said, as rsync says it; the copy of the rest stands.)
                FailKind::Vanished => {}
            }
        }
        exit
    }

    /// The status of a run stopped by `error`, from the typed errors in
    /// its chain.
    pub fn of_error(error: &anyhow::Error) -> Exit {
        if has::<crate::digest::FipsRefusesBlake3>(error)
            || has::<crate::filter::FilterError>(error)
            || has::<crate::idmap::MapError>(error)
            || has::<crate::listed::ListError>(error)
            || has::<crate::listed::RelativeError>(error)
            || has::<crate::hostlist::HostlistError>(error)
            || has::<crate::app::PlanError>(error)
            || has::<crate::broadcast::Usage>(error)
            || has::<crate::send::SameName>(error)
            || has::<crate::chmod::BadChmod>(error)
        {
            Exit::Usage
        } else if has::<Refused>(error) {
            Exit::Refused
        } else if has::<Corrupted>(error) || tampered(error) {
            Exit::Corrupted
        } else if has::<LinkError>(error) || has::<TransportError>(error) || has::<PeerLost>(error)
        {
            Exit::PeerLost
        } else if has::<std::io::Error>(error) || has::<rustix::io::Errno>(error) {
            Exit::Io
        } else {
            Exit::Partial
        }
    }
}

/// Whether a link in `error`'s chain ended on a failed session check:
/// data or messages changed on the path count as corrupted.
fn tampered(error: &anyhow::Error) -> bool {
    error
        .chain()
        .filter_map(|e| e.downcast_ref::<LinkError>())
        .any(LinkError::is_tampering)
}

/// Whether `error` has a `T`: as a context it was given, or anywhere in
/// its chain of sources.
fn has<T: std::error::Error + Send + Sync + 'static>(error: &anyhow::Error) -> bool {
    error.downcast_ref::<T>().is_some() || error.chain().any(|e| e.is::<T>())
}

/// The peer refused: authentication failed, or the request was turned
/// down (the text says why).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// Data arrived corrupted.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Corrupted(pub String);

/// The peer went away (the text says when).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PeerLost(pub String);

#[cfg(test)]
mod tests {
    use anyhow::Context;

    use super::*;

    #[test]
    fn failed_entries_give_partial_or_corrupted() {
        assert_eq!(Exit::of_failures(&[]), Exit::Complete);
        assert_eq!(
            Exit::of_failures(&[FailKind::Io, FailKind::Other]),
            Exit::Partial
        );
        assert_eq!(
            Exit::of_failures(&[FailKind::Io, FailKind::Corrupted]),
            Exit::Corrupted
        );
    }

    #[test]
    fn a_stop_is_classified_by_the_types_in_its_chain() {
        let io = || -> anyhow::Result<()> {
            Err(std::io::Error::from_raw_os_error(libc::EACCES)).context("opening x")
        };
        assert_eq!(Exit::of_error(&io().unwrap_err()), Exit::Io);
        let lost = anyhow::Error::new(LinkError::Transport(TransportError::Closed("reset".into())))
            .context("sending");
        assert_eq!(Exit::of_error(&lost), Exit::PeerLost);
        let refused = anyhow::Error::new(Refused("busy".into())).context("the request");
        assert_eq!(Exit::of_error(&refused), Exit::Refused);
        assert_eq!(
            Exit::of_error(&anyhow::Error::new(Corrupted("chunk".into()))),
            Exit::Corrupted
        );
        assert_eq!(Exit::of_error(&anyhow::anyhow!("other")), Exit::Partial);
        let usage: anyhow::Error = crate::broadcast::Usage("a broadcast's".into()).into();
        assert_eq!(Exit::of_error(&usage), Exit::Usage);
        let usage = crate::hostlist::expand("n[2-1]").context("an operand");
        assert_eq!(Exit::of_error(&usage.unwrap_err()), Exit::Usage);
        let tampered = anyhow::Error::new(LinkError::Peer {
            code: rfabric::wire::ErrorCode::Tampered,
            text: "chunk 3 failed its session check".into(),
        })
        .context("receiving");
        assert_eq!(Exit::of_error(&tampered), Exit::Corrupted);
        // A refusal wins over the link error it came with.
        let both = anyhow::Error::new(LinkError::Finished).context(Refused("no".into()));
        assert_eq!(Exit::of_error(&both), Exit::Refused);
    }
}
