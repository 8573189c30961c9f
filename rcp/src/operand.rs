//! Where an operand points: a local path, `[user@]host:path` (through a
//! remote shell, as scp), or `rcp://host[:port]/path` (a running daemon).

use std::path::PathBuf;

use anyhow::{Context, bail};

/// The daemon's port when an `rcp://` operand names none.
pub const DEFAULT_PORT: u16 = 7470;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operand {
    Local(PathBuf),
    /// `user@host` as given (for the remote shell) and the path there.
    Shell {
        login: String,
        host: String,
        path: String,
    },
    Daemon {
        host: String,
        port: u16,
        path: String,
    },
}

impl Operand {
    pub fn parse(s: &str) -> anyhow::Result<Operand> {
        if let Some(rest) = s.strip_prefix("rcp://") {
            let (authority, path) = rest
                .split_once('/')
                .with_context(|| format!("{s}: expected rcp://host[:port]/path"))?;
            let (host, port) = split_port(authority)?;
            if host.is_empty() {
                bail!("{s}: no host");
            }
            return Ok(Operand::Daemon {
                host,
                port: port.unwrap_or(DEFAULT_PORT),
                path: format!("/{path}"),
            });
        }
        // As scp: a colon before any slash makes it remote; `./a:b` is local.
        if let Some((login, path)) = s.split_once(':')
            && !login.contains('/')
            && !login.is_empty()
        {
            let host = login.rsplit('@').next().unwrap_or(login).to_string();
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            if host.is_empty() {
                bail!("{s}: no host");
            }
            return Ok(Operand::Shell {
                login: login.to_string(),
                host,
                path: if path.is_empty() {
                    ".".into()
                } else {
                    path.into()
                },
            });
        }
        if s.is_empty() {
            bail!("empty path");
        }
        Ok(Operand::Local(PathBuf::from(s)))
    }

    pub fn is_local(&self) -> bool {
        matches!(self, Operand::Local(_))
    }
}

fn split_port(authority: &str) -> anyhow::Result<(String, Option<u16>)> {
    // [v6]:port, host:port, host
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, tail) = rest.split_once(']').context("unclosed [ in host")?;
        let port = match tail.strip_prefix(':') {
            Some(p) => Some(p.parse().with_context(|| format!("bad port {p:?}"))?),
            None if tail.is_empty() => None,
            None => bail!("bad text after ]: {tail:?}"),
        };
        return Ok((host.to_string(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Ok((
            h.to_string(),
            Some(p.parse().with_context(|| format!("bad port {p:?}"))?),
        )),
        None => Ok((authority.to_string(), None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operands_parse_as_users_expect() {
        assert_eq!(Operand::parse("a/b").unwrap(), Operand::Local("a/b".into()));
        assert_eq!(
            Operand::parse("./a:b").unwrap(),
            Operand::Local("./a:b".into())
        );
        assert_eq!(
            Operand::parse("me@node2:/data").unwrap(),
            Operand::Shell {
                login: "me@node2".into(),
                host: "node2".into(),
                path: "/data".into()
            }
        );
        assert_eq!(
            Operand::parse("node2:").unwrap(),
            Operand::Shell {
                login: "node2".into(),
                host: "node2".into(),
                path: ".".into()
            }
        );
        assert_eq!(
            Operand::parse("rcp://h:9000/x/y").unwrap(),
            Operand::Daemon {
                host: "h".into(),
                port: 9000,
                path: "/x/y".into()
            }
        );
        assert_eq!(
            Operand::parse("rcp://[::1]/x").unwrap(),
            Operand::Daemon {
                host: "::1".into(),
                port: DEFAULT_PORT,
                path: "/x".into()
            }
        );
        assert!(Operand::parse("rcp://h").is_err());
        assert!(Operand::parse("rcp://h:x/p").is_err());
        assert!(Operand::parse("").is_err());
    }
}
