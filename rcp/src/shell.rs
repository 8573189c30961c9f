//! Remote-shell mode, as scp: `rcp SRC host:DEST` runs `rcp` on the far side
//! through `--rsh` (ssh by default). That side starts a one-shot server and
//! prints one line, `RCP-SERVER 1 PORT TOKEN`; the client connects to the
//! same host on that port over the fabric and authenticates with the
//! one-time token (it travelled over the remote shell's own channel). The
//! data never goes through the shell.

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
    pub port: u16,
    pub token: Vec<u8>,
}

/// Starts `rcp server-once` on `login` through `rsh` and reads its banner.
pub async fn start(rsh: &str, login: &str, tuning: &Tuning) -> anyhow::Result<Remote> {
    let mut words = rsh.split_whitespace();
    let program = words.next().context("--rsh is empty")?;
    let mut child = Command::new(program)
        .args(words)
        .arg(login)
        .args(["rcp", "server-once", "--transport", tuning.transport.name()])
        .args([
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
        ])
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
    let rest = line
        .trim_end()
        .strip_prefix(BANNER)
        .with_context(|| format!("unexpected answer from the remote side: {line:?}"))?;
    let mut parts = rest.split_whitespace();
    let port = parts
        .next()
        .and_then(|p| p.parse().ok())
        .with_context(|| format!("bad port in {line:?}"))?;
    let token = parts
        .next()
        .with_context(|| format!("no token in {line:?}"))?
        .as_bytes()
        .to_vec();
    Ok(Remote { child, port, token })
}

/// The banner a one-shot server prints.
pub fn banner(port: u16, token: &str) -> String {
    format!("{BANNER} {port} {token}")
}

/// Where a one-shot server listens: the address the remote shell came in
/// on (ssh says so in SSH_CONNECTION), else loopback.
pub fn listen_ip() -> std::net::IpAddr {
    std::env::var("SSH_CONNECTION")
        .ok()
        .and_then(|v| v.split_whitespace().nth(2).and_then(|ip| ip.parse().ok()))
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
}
