//! Why a command ended, as its exit status, from typed errors (never from
//! an error's text):
//!
//! | status | meaning |
//! |---|---|
//! | 0 | a clean stop (SIGTERM or SIGINT: requests in flight answered, an attached device detached first); `rblock detach`: detached, or nothing to do |
//! | 1 | anything else failed (named on stderr) |
//! | 2 | bad usage (including `--listen` beyond loopback without a secret) |
//! | 3 | refused: the server does not serve that export, or turned the connection down |
//! | 5 | a local I/O error: an export, socket or device that cannot be opened or used here |
//! | 6 | the server could not be reached (`rblock connect`) |
//!
//! (4, verification failed, is rcp's; rblock has no status of its own
//! for it.) When several apply, the first of 3, 6, 5 is given.

use rfabric::link::LinkError;
use rfabric::transport::TransportError;

/// The exit statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    Done = 0,
    Failed = 1,
    Usage = 2,
    Refused = 3,
    Io = 5,
    Unreachable = 6,
}

impl Exit {
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The status of a command stopped by `error`.
    pub fn of_error(error: &anyhow::Error) -> Exit {
        if has::<Usage>(error) {
            Exit::Usage
        } else if has::<Refused>(error) {
            Exit::Refused
        } else if has::<LinkError>(error) || has::<TransportError>(error) {
            Exit::Unreachable
        } else if has::<std::io::Error>(error) || has::<rustix::io::Errno>(error) {
            Exit::Io
        } else {
            Exit::Failed
        }
    }
}

/// Whether `error` has a `T`: as a context it was given, or anywhere in
/// its chain of sources.
fn has<T: std::error::Error + Send + Sync + 'static>(error: &anyhow::Error) -> bool {
    error.downcast_ref::<T>().is_some() || error.chain().any(|e| e.is::<T>())
}

/// A combination of options that cannot run (the text says why).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// The server refused (the text says why).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

#[cfg(test)]
mod tests {
    use anyhow::Context;

    use super::*;

    #[test]
    fn a_stop_is_classified_by_the_types_in_its_chain() {
        let refused = anyhow::Error::new(Refused("no export \"x\"".into())).context("cannot open");
        assert_eq!(Exit::of_error(&refused), Exit::Refused);
        let unreachable = anyhow::Error::new(TransportError::Closed("refused".into()))
            .context("cannot connect to 10.0.0.1:10810");
        assert_eq!(Exit::of_error(&unreachable), Exit::Unreachable);
        let io = Err::<(), _>(std::io::Error::from_raw_os_error(libc::ENOENT))
            .context("export disk")
            .unwrap_err();
        assert_eq!(Exit::of_error(&io), Exit::Io);
        assert_eq!(Exit::of_error(&anyhow::anyhow!("x")), Exit::Failed);
    }
}
