//! The fallback for kernels without the NBD netlink family: the
//! `nbd-client` program (from the nbd package; on RHEL only in EPEL).

use std::path::Path;

use anyhow::{Context, bail};
use tokio::process::Command;

/// Runs `nbd-client` to attach `device` to the NBD export `name` served on
/// the unix socket `sock`, with `connections` kernel connections, blocks
/// of `block_size` bytes and a request timeout of `timeout` seconds.
pub async fn attach(
    device: &Path,
    sock: &Path,
    name: &str,
    connections: u16,
    block_size: u32,
    timeout: u64,
) -> anyhow::Result<()> {
    let mut cmd = Command::new("nbd-client");
    cmd.arg("-unix")
        .arg(sock)
        .arg(device)
        .args(["-N", name])
        .args(["-C", &connections.to_string()])
        .args(["-b", &block_size.to_string()])
        .args(["-t", &timeout.to_string()]);
    run(cmd, "attach", device).await
}

/// Runs `nbd-client -d`; the kernel finishes the disconnect after it
/// returns (the caller waits for that).
pub async fn detach(device: &Path) -> anyhow::Result<()> {
    let mut cmd = Command::new("nbd-client");
    cmd.arg("-d").arg(device);
    run(cmd, "detach", device).await
}

/// Runs `cmd` (an nbd-client) to `what` `device`; its stderr says why not.
async fn run(mut cmd: Command, what: &str, device: &Path) -> anyhow::Result<()> {
    let out = cmd
        .output()
        .await
        .context("cannot run nbd-client (is the nbd package installed?)")?;
    if !out.status.success() {
        bail!(
            "nbd-client could not {what} {}: {}",
            device.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
