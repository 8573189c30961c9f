//! How rblock is told where to serve and what to reach: listen addresses,
//! the fabric address, a remote export, the zero-copy policy. Plain values
//! parsed from text (clap's value parsers), in a room of their own so that
//! the command line and the server both depend on them and not on each
//! other.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

/// The port `rblock serve --listen` and `rblock connect` use by default.
pub const FABRIC_PORT: u16 = 10810;

/// Where NBD clients connect: `ADDR:PORT` or `unix:PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::str::FromStr for Listen {
    type Err = String;

    fn from_str(s: &str) -> Result<Listen, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a path".into());
            }
            return Ok(Listen::Unix(PathBuf::from(path)));
        }
        s.parse()
            .map(Listen::Tcp)
            .map_err(|e| format!("{s:?}: expected ADDR:PORT or unix:PATH ({e})"))
    }
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Tcp(a) => write!(f, "{a}"),
            Listen::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// When large reads are sent from the page cache without a copy.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZeroCopy {
    Auto,
    Always,
    Never,
}

/// What `rblock serve --tls` offers NBD clients.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    Off,
    On,
    Require,
}

impl TlsMode {
    pub fn handshake(self) -> crate::nbd::handshake::Tls {
        use crate::nbd::handshake::Tls;
        match self {
            TlsMode::Off => Tls::Off,
            TlsMode::On => Tls::On,
            TlsMode::Require => Tls::Require,
        }
    }
}

/// A text that names no address or export the way rblock expects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("{text:?}: expected ADDR or ADDR:PORT ({why})")]
    NotAnAddress { text: String, why: String },
    #[error("{0:?}: expected HOST[:PORT]/NAME")]
    NoName(String),
    #[error("{0:?}: the host is missing (HOST[:PORT]/NAME)")]
    NoHost(String),
    #[error("{text:?}: {port:?} is not a port ({why})")]
    BadPort {
        text: String,
        port: String,
        why: String,
    },
}

/// Where `rblock serve --listen` takes `rblock connect` clients:
/// `ADDR` or `ADDR:PORT` (a bracketed IPv6 address with a port), port
/// [`FABRIC_PORT`] if left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FabricAddr(pub SocketAddr);

impl std::str::FromStr for FabricAddr {
    type Err = AddressError;

    fn from_str(at: &str) -> Result<FabricAddr, AddressError> {
        if let Ok(a) = at.parse::<SocketAddr>() {
            return Ok(FabricAddr(a));
        }
        let ip: IpAddr = at
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .map_err(|e: std::net::AddrParseError| AddressError::NotAnAddress {
                text: at.to_string(),
                why: e.to_string(),
            })?;
        Ok(FabricAddr(SocketAddr::new(ip, FABRIC_PORT)))
    }
}

impl std::fmt::Display for FabricAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// An export of a remote `rblock serve`: `HOST[:PORT]/NAME`, port
/// [`FABRIC_PORT`] if left out. The host is kept as written (an IPv6
/// address with its brackets): it is resolved when connecting. The empty
/// name is the server's default export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteExport {
    pub host: String,
    pub port: u16,
    pub name: String,
}

impl std::str::FromStr for RemoteExport {
    type Err = AddressError;

    fn from_str(s: &str) -> Result<RemoteExport, AddressError> {
        let (place, name) = s
            .split_once('/')
            .ok_or_else(|| AddressError::NoName(s.to_string()))?;
        if place.is_empty() {
            return Err(AddressError::NoHost(s.to_string()));
        }
        let (host, port) = match place.rsplit_once(':') {
            // A bare IPv6 address has colons but no brackets: no port then.
            Some((h, p)) if !h.contains(':') || h.ends_with(']') => (
                h,
                p.parse()
                    .map_err(|e: std::num::ParseIntError| AddressError::BadPort {
                        text: s.to_string(),
                        port: p.to_string(),
                        why: e.to_string(),
                    })?,
            ),
            _ => (place, FABRIC_PORT),
        };
        Ok(RemoteExport {
            host: host.to_string(),
            port,
            name: name.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(s: &str) -> Result<RemoteExport, AddressError> {
        s.parse()
    }

    fn at(host: &str, port: u16, name: &str) -> RemoteExport {
        RemoteExport {
            host: host.into(),
            port,
            name: name.into(),
        }
    }

    #[test]
    fn remote_exports_parse_with_and_without_a_port() {
        assert_eq!(remote("node2/disk"), Ok(at("node2", FABRIC_PORT, "disk")));
        assert_eq!(remote("node2:7000/disk"), Ok(at("node2", 7000, "disk")));
        assert_eq!(remote("10.0.0.1/d"), Ok(at("10.0.0.1", 10810, "d")));
        // The empty name: the server's default export.
        assert_eq!(remote("node2/"), Ok(at("node2", FABRIC_PORT, "")));
        // Only the first slash ends the place.
        assert_eq!(remote("h/a/b"), Ok(at("h", FABRIC_PORT, "a/b")));
    }

    #[test]
    fn ipv6_hosts_take_a_port_only_in_brackets() {
        assert_eq!(remote("[::1]:7000/d"), Ok(at("[::1]", 7000, "d")));
        assert_eq!(remote("[::1]/d"), Ok(at("[::1]", FABRIC_PORT, "d")));
        assert_eq!(
            remote("[fe80::1%eth0]:9/d"),
            Ok(at("[fe80::1%eth0]", 9, "d"))
        );
        // Unbracketed, the last group is part of the address.
        assert_eq!(remote("fe80::1/d"), Ok(at("fe80::1", FABRIC_PORT, "d")));
    }

    #[test]
    fn bad_remote_exports_say_what_is_wrong() {
        let no_name = remote("no-slash-here").unwrap_err();
        assert_eq!(no_name, AddressError::NoName("no-slash-here".into()));
        assert!(no_name.to_string().contains("HOST[:PORT]/NAME"));
        assert_eq!(remote("/disk"), Err(AddressError::NoHost("/disk".into())));
        for bad in ["h:x/d", "h:/d", "h:70000/d", "[::1]:port/d"] {
            assert!(
                matches!(remote(bad), Err(AddressError::BadPort { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn fabric_addresses_default_to_port_10810() {
        let a = |s: &str| s.parse::<FabricAddr>().map(|a| a.0);
        assert_eq!(a("10.0.0.1"), Ok("10.0.0.1:10810".parse().unwrap()));
        assert_eq!(a("10.0.0.1:7000"), Ok("10.0.0.1:7000".parse().unwrap()));
        assert_eq!(a("::1"), Ok("[::1]:10810".parse().unwrap()));
        assert_eq!(a("[::1]"), Ok("[::1]:10810".parse().unwrap()));
        assert_eq!(a("[::1]:7000"), Ok("[::1]:7000".parse().unwrap()));
        for bad in ["", "node2", "10.0.0.1:x", "10.0.0.1:70000", "[::1]:"] {
            assert!(
                matches!(a(bad), Err(AddressError::NotAnAddress { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn listen_addresses_parse_and_print_back() {
        for s in ["127.0.0.1:10809", "[::1]:10809", "unix:/run/x.sock"] {
            let l: Listen = s.parse().unwrap();
            assert_eq!(l.to_string(), s);
        }
        for bad in ["unix:", "127.0.0.1", "node2:10809"] {
            assert!(bad.parse::<Listen>().is_err(), "{bad}");
        }
    }
}
