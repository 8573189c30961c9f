//! Attaching an export as a kernel block device with the kernel's
//! `nbd-client` (from the nbd package), and detaching it.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::process::Command;

/// Runs `nbd-client` to attach `device` to the NBD export `name` served on
/// the unix socket `sock`, with `connections` kernel connections and a
/// request timeout of `timeout` seconds.
pub async fn attach(
    device: &Path,
    sock: &Path,
    name: &str,
    connections: u16,
    timeout: u64,
) -> anyhow::Result<()> {
    let mut cmd = Command::new("nbd-client");
    cmd.arg("-unix")
        .arg(sock)
        .arg(device)
        .args(["-N", name])
        .args(["-C", &connections.to_string()])
        .args(["-b", "4096"])
        .args(["-t", &timeout.to_string()]);
    nbd_client(cmd, "attach", device).await
}

/// Detaches `device` and waits until the kernel has let it go.
pub async fn detach(device: &Path) -> anyhow::Result<()> {
    let mut cmd = Command::new("nbd-client");
    cmd.arg("-d").arg(device);
    nbd_client(cmd, "detach", device).await?;
    // The kernel finishes the disconnect after nbd-client returns; its
    // pid file goes when it has.
    let Some(dev) = device.file_name() else {
        return Ok(());
    };
    let pid = Path::new("/sys/block").join(dev).join("pid");
    for _ in 0..100 {
        if !pid.exists() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!(
        "{} is still attached 10 s after the detach",
        device.display()
    )
}

/// Runs `cmd` (an nbd-client) to `what` `device`; its stderr says why not.
async fn nbd_client(mut cmd: Command, what: &str, device: &Path) -> anyhow::Result<()> {
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
