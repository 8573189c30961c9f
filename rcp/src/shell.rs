//! Remote-shell mode, as scp: `rcp SRC host:DEST` runs `rcp` on the far side
//! through `--rsh` (ssh by default). That side starts a one-shot server and
//! prints one line, `RCP-SERVER 1 PORT TOKEN ADDR [NODE [TOPO]]`; the client
//! connects to the same host on that port over the fabric and
//! authenticates with the one-time token (it travelled over the remote
//! shell's own channel). The data never goes through the shell. ADDR is
//! where the server listens (a broadcast's other nodes reach it there),
//! NODE its Slurm node name when Slurm started it, then TOPO its place in
//! Slurm's network topology when Slurm knows one (`SLURM_TOPOLOGY_ADDR`,
//! `top.s1.n1`). (A client from before ADDR reads the first two fields
//! only.)

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::cli::Tuning;

const BANNER: &str = "RCP-SERVER 1";

/// The running remote side.
#[derive(Debug)]
pub struct Remote {
    pub child: Child,
    /// What it printed: where it listens, with what token.
    pub banner: Banner,
}

/// What a one-shot server's banner says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Banner {
    pub port: u16,
    pub token: Vec<u8>,
    pub addr: Option<std::net::IpAddr>,
    pub node: Option<String>,
    pub topology: Option<String>,
}

/// The arguments that start a one-shot server with this side's tuning,
/// for a copy over `streams` connections.
pub fn server_once_args(tuning: &Tuning, streams: u32) -> Vec<String> {
    let mut args = [
        "rcp",
        "server-once",
        "--transport",
        tuning.transport.name(),
        "--chunk-size",
        &tuning.chunk_size.to_string(),
        "--window",
        &tuning.window.to_string(),
        "--io-engine",
        tuning.io_engine.name(),
        "--encrypt",
        tuning.encrypt.name(),
        "--timeout",
        &tuning.timeout.to_string(),
    ]
    .map(String::from)
    .to_vec();
    // (Only when asked for: a far side from before it knows no --streams.)
    if streams > 1 {
        args.extend(["--streams".into(), streams.to_string()]);
    }
    args
}

/// Reads a one-shot server's banner line.
pub fn parse_banner(line: &str) -> anyhow::Result<Banner> {
    let rest = line
        .trim_end()
        .strip_prefix(BANNER)
        .with_context(|| format!("unexpected answer from the remote side: {line:?}"))?;
    let mut parts = rest.split_whitespace();
    let port = parts
        .next()
        .and_then(|p| p.parse().ok())
        .filter(|p| *p != 0)
        .with_context(|| format!("bad port in {line:?}"))?;
    let token = parts
        .next()
        .with_context(|| format!("no token in {line:?}"))?
        .as_bytes()
        .to_vec();
    let addr = match parts.next() {
        Some(a) => Some(
            a.parse()
                .with_context(|| format!("bad address in {line:?}"))?,
        ),
        None => None,
    };
    Ok(Banner {
        port,
        token,
        addr,
        node: parts.next().map(String::from),
        topology: parts.next().map(String::from),
    })
}

/// Starts `rcp server-once` on `login` through `rsh` and reads its banner.
pub async fn start(
    rsh: &str,
    login: &str,
    tuning: &Tuning,
    streams: u32,
) -> anyhow::Result<Remote> {
    let mut words = rsh.split_whitespace();
    let program = words.next().context("--rsh is empty")?;
    let mut child = Command::new(program)
        .args(words)
        .arg(login)
        .args(server_once_args(tuning, streams))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot run remote shell {program:?}"))?;
    let stdout = child.stdout.take().expect("piped");
    let mut line = String::new();
    let mut reader = BufReader::new(stdout);
    let read = reader.read_line(&mut line);
    match tokio::time::timeout(Duration::from_secs(60), read).await {
        Ok(Ok(n)) if n > 0 => {}
        Ok(_) => bail!("the remote side ended without starting rcp (is rcp installed there?)"),
        Err(_) => bail!("the remote side did not answer within 60 s"),
    }
    Ok(Remote {
        child,
        banner: parse_banner(&line)?,
    })
}

/// The banner a one-shot server prints (its Slurm node name, and its place
/// in Slurm's topology, when Slurm started it).
pub fn banner(port: u16, token: &str, addr: std::net::IpAddr) -> String {
    let word = |var: &str| {
        std::env::var(var)
            .ok()
            .filter(|v| !v.is_empty() && !v.contains(char::is_whitespace))
    };
    match (word("SLURMD_NODENAME"), word("SLURM_TOPOLOGY_ADDR")) {
        (Some(node), Some(topo)) => format!("{BANNER} {port} {token} {addr} {node} {topo}"),
        (Some(node), None) => format!("{BANNER} {port} {token} {addr} {node}"),
        _ => format!("{BANNER} {port} {token} {addr}"),
    }
}

/// Where a one-shot server listens: the address the remote shell came in
/// on (ssh says so in SSH_CONNECTION); under srun, this node's address
/// toward the node that ran srun (SLURM_LAUNCH_NODE_IPADDR); else
/// loopback.
pub fn listen_ip() -> std::net::IpAddr {
    let env_ip = |var: &str, field: usize| {
        std::env::var(var).ok().and_then(|v| {
            v.split_whitespace()
                .nth(field)
                .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
        })
    };
    if let Some(ip) = env_ip("SSH_CONNECTION", 2) {
        return ip;
    }
    if let Some(launcher) = env_ip("SLURM_LAUNCH_NODE_IPADDR", 0)
        && let Some(ip) = address_toward(launcher)
    {
        return ip;
    }
    std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
}

/// This host's address on the route to `peer` (a UDP socket's after a
/// connect, which sends nothing).
fn address_toward(peer: std::net::IpAddr) -> Option<std::net::IpAddr> {
    let any: std::net::IpAddr = match peer {
        std::net::IpAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
        std::net::IpAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
    };
    let s = std::net::UdpSocket::bind((any, 0)).ok()?;
    s.connect((peer, 9)).ok()?;
    Some(s.local_addr().ok()?.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_far_side_hears_of_streams_only_when_there_are_several() {
        use clap::Parser;
        let parsed = |streams| {
            let tuning = crate::cli::Cli::try_parse_from(["rcp", "a", "b"])
                .unwrap()
                .copy
                .tuning;
            let args = server_once_args(&tuning, streams);
            match crate::cli::Cli::try_parse_from(&args).unwrap().command {
                Some(crate::cli::Cmd::ServerOnce(a)) => (args, a.streams),
                other => panic!("not a server-once: {other:?}"),
            }
        };
        let (args, streams) = parsed(1);
        assert!(!args.iter().any(|a| a == "--streams"), "{args:?}");
        assert_eq!(streams, 1);
        assert_eq!(parsed(4).1, 4);
    }

    #[test]
    fn banners_are_read_old_and_new() {
        let b = parse_banner("RCP-SERVER 1 4000 abc\n").unwrap();
        assert_eq!(
            (b.port, &b.token[..], b.addr, b.node),
            (4000, &b"abc"[..], None, None)
        );
        let b = parse_banner("RCP-SERVER 1 4000 abc 10.0.0.7 n07").unwrap();
        assert_eq!(b.addr, Some("10.0.0.7".parse().unwrap()));
        assert_eq!(b.node.as_deref(), Some("n07"));
        assert_eq!(b.topology, None);
        let b = parse_banner("RCP-SERVER 1 4000 abc 10.0.0.7 n07 top.s2.n07").unwrap();
        assert_eq!(b.topology.as_deref(), Some("top.s2.n07"));
        for bad in [
            "hello",
            "RCP-SERVER 1 0 abc",
            "RCP-SERVER 1 x abc",
            "RCP-SERVER 1 4000",
            "RCP-SERVER 1 1 t nowhere",
        ] {
            assert!(parse_banner(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_address_toward_loopback_is_loopback() {
        let lo: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(address_toward(lo), Some(lo));
    }
}
