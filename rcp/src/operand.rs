//! Where an operand points: a local path, `[user@]host:path` (through a
//! remote shell, as scp), or `rcp://host[:port]/path` (a running daemon);
//! with a host list in Slurm's syntax for the host
//! (`'node[01-16]:/scratch'`, `rcp://n[1-4]/data`), a broadcast to every
//! node of it.

use std::path::PathBuf;

use anyhow::{Context, bail};

use crate::hostlist;

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
    /// The same `path` on every one of `hosts`, through the remote shell
    /// (as `user@host` when a user is given) or, with `port`, their
    /// daemons.
    Broadcast {
        user: Option<String>,
        hosts: Vec<String>,
        port: Option<u16>,
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
            if hostlist::is_hostlist(&host) {
                return Ok(Operand::Broadcast {
                    user: None,
                    hosts: hostlist::expand(&host).with_context(|| s.to_string())?,
                    port: Some(port.unwrap_or(DEFAULT_PORT)),
                    path: format!("/{path}"),
                });
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
            let path = if path.is_empty() { "." } else { path };
            let (user, list) = match login.rsplit_once('@') {
                Some((u, l)) => (Some(u.to_string()), l),
                None => (None, login),
            };
            if hostlist::is_hostlist(list) {
                return Ok(Operand::Broadcast {
                    user,
                    hosts: hostlist::expand(list).with_context(|| s.to_string())?,
                    port: None,
                    path: path.into(),
                });
            }
            let host = list
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            if host.is_empty() {
                bail!("{s}: no host");
            }
            return Ok(Operand::Shell {
                login: login.to_string(),
                host,
                path: path.into(),
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
        assert_eq!(
            Operand::parse("me@node[01-03]:/scratch/").unwrap(),
            Operand::Broadcast {
                user: Some("me".into()),
                hosts: vec!["node01".into(), "node02".into(), "node03".into()],
                port: None,
                path: "/scratch/".into()
            }
        );
        assert_eq!(
            Operand::parse("a,b:").unwrap(),
            Operand::Broadcast {
                user: None,
                hosts: vec!["a".into(), "b".into()],
                port: None,
                path: ".".into()
            }
        );
        assert_eq!(
            Operand::parse("rcp://n[1-2]:9000/d").unwrap(),
            Operand::Broadcast {
                user: None,
                hosts: vec!["n1".into(), "n2".into()],
                port: Some(9000),
                path: "/d".into()
            }
        );
        assert_eq!(
            Operand::parse("rcp://n[1-2]/d").unwrap(),
            Operand::Broadcast {
                user: None,
                hosts: vec!["n1".into(), "n2".into()],
                port: Some(DEFAULT_PORT),
                path: "/d".into()
            }
        );
        let e = Operand::parse("node[3-1]:/x").unwrap_err();
        assert!(format!("{e:#}").contains("goes down"), "{e:#}");
        assert!(Operand::parse("rcp://h").is_err());
        assert!(Operand::parse("rcp://h:x/p").is_err());
        assert!(Operand::parse("").is_err());
    }
}
