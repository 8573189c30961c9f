//! Attaching an export as a kernel block device (/dev/nbdN), and
//! detaching it.
//!
//! rblock does it itself through the kernel's NBD netlink family
//! ([`netlink`]): one connection to its own NBD socket per kernel
//! connection, each taken through the handshake ([`kernel_socket`]), all
//! handed to the kernel in one `NBD_CMD_CONNECT`. RHEL kernels have
//! nbd.ko (8.1 and later) while nbd-client is only in EPEL, so nothing from
//! outside is needed. A kernel without the family gets `modprobe nbd`
//! once, and if that does not bring it, the nbd-client program
//! ([`nbd_client`]). Either way the device's request queue is then set
//! up for the fabric behind it ([`queue`]).

mod kernel_socket;
mod nbd_client;
pub mod netlink;
pub mod queue;

use std::fmt;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::process::Command;

use netlink::{Connect, Family, NetlinkError};

/// The kernel device's block size: a page, what the server prefers and
/// what filesystems write in.
pub const BLOCK_SIZE: u32 = 4096;

/// How long a detach waits for the kernel to let the device go.
const DETACH_WAIT: Duration = Duration::from_secs(10);
/// How long an attach waits for a device that is open but not attached to
/// be closed: udev probes a device right after it was detached.
const HELD_WAIT: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(100);

/// How a device was attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attached {
    Netlink {
        connections: u16,
    },
    /// Through nbd-client, for the reason given.
    NbdClient {
        connections: u16,
        why: String,
    },
}

impl fmt::Display for Attached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = |n: u16| format!("{n} connection{}", if n == 1 { "" } else { "s" });
        match self {
            Attached::Netlink { connections } => {
                write!(f, "kernel netlink, {}", count(*connections))
            }
            Attached::NbdClient { connections, why } => {
                write!(f, "nbd-client, {}; {why}", count(*connections))
            }
        }
    }
}

/// An attached device: how, and the largest request its queue lets the
/// kernel build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub how: Attached,
    /// `max_sectors_kb` as raised, or why it stayed the kernel's.
    pub request_limit_kb: Result<u32, String>,
}

impl fmt::Display for Attachment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({})", self.how)?;
        match &self.request_limit_kb {
            Ok(kb) => write!(f, ", requests up to {kb} KiB"),
            Err(why) => write!(f, ", requests as large as the kernel's default ({why})"),
        }
    }
}

/// Attaches `device` to the NBD export `name` served on the unix socket
/// `sock`, with `connections` kernel connections and a request timeout of
/// `timeout` seconds, and lets the kernel build requests of up to
/// `request_bytes` (what the fabric carries at once); says how.
pub async fn attach(
    device: &Path,
    sock: &Path,
    name: &str,
    connections: u16,
    timeout: u64,
    request_bytes: u32,
) -> anyhow::Result<Attachment> {
    let index = device_index(device)?;
    let how = attach_sockets(index, device, sock, name, connections, timeout).await?;
    let request_limit_kb =
        blocking(move || queue::raise_request_limit(index, request_bytes)).await?;
    Ok(Attachment {
        how,
        request_limit_kb,
    })
}

/// [`attach`] without the queue's set-up.
async fn attach_sockets(
    index: u32,
    device: &Path,
    sock: &Path,
    name: &str,
    connections: u16,
    timeout: u64,
) -> anyhow::Result<Attached> {
    let family = match open_family(true).await? {
        Ok(family) => family,
        Err(why) => {
            nbd_client::attach(device, sock, name, connections, BLOCK_SIZE, timeout)
                .await
                .with_context(|| format!("{why}; nbd-client was the way left"))?;
            return Ok(Attached::NbdClient { connections, why });
        }
    };
    let family = blocking(move || wait_until_free(&family, index).map(|()| family)).await??;

    if connections == 0 {
        bail!("an NBD device needs at least one connection");
    }
    let mut sockets = Vec::with_capacity(usize::from(connections));
    let mut export = None;
    for _ in 0..connections {
        let (socket, e) = kernel_socket::open(sock, name).await?;
        match export {
            None => export = Some(e),
            Some(first) if (first.size, first.flags) != (e.size, e.flags) => {
                bail!("export {name:?} changed between one connection and the next")
            }
            Some(_) => {}
        }
        sockets.push(socket);
    }
    let export = export.expect("one connection at least");
    if let Some(bs) = export.block_sizes
        && bs.minimum > BLOCK_SIZE
    {
        bail!(
            "export {name:?} takes blocks of {} bytes at least, more than a kernel NBD device's {BLOCK_SIZE}",
            bs.minimum
        );
    }
    let request = Connect {
        index,
        size_bytes: export.size,
        block_size_bytes: BLOCK_SIZE.into(),
        server_flags: export.flags.into(),
        timeout,
        // A lost connection is treated like a slow reply: requests wait
        // for a replacement (NBD_CMD_RECONFIGURE, which nothing sends yet)
        // as long as for an answer, then fail. Without it they would fail
        // at once, while a slow server is given `timeout`.
        dead_conn_timeout: timeout,
        sockets: sockets.iter().map(|s| s.as_raw_fd()).collect(),
    };
    blocking(move || {
        let done = family.connect(&request);
        // The kernel holds its own references once it has answered; ours
        // stay open until then.
        drop(sockets);
        done
    })
    .await??;
    Ok(Attached::Netlink { connections })
}

/// Detaches `device` and waits until the kernel has let it go.
pub async fn detach(device: &Path) -> anyhow::Result<()> {
    let index = device_index(device)?;
    let pid = pid_file(index);
    match open_family(false).await? {
        Ok(family) => {
            blocking(move || {
                family.disconnect(index)?;
                let start = Instant::now();
                // Both: the kernel drops the pid file a moment after it
                // counts the device free.
                while family.connected(index)? || pid.exists() {
                    if start.elapsed() >= DETACH_WAIT {
                        bail!("/dev/nbd{index} is still attached {DETACH_WAIT:?} after the detach");
                    }
                    std::thread::sleep(POLL);
                }
                Ok(())
            })
            .await?
        }
        Err(_) => {
            nbd_client::detach(device).await?;
            // The kernel finishes the disconnect after nbd-client returns;
            // its pid file goes when it has.
            let start = Instant::now();
            while pid.exists() {
                if start.elapsed() >= DETACH_WAIT {
                    bail!(
                        "{} is still attached {DETACH_WAIT:?} after the detach",
                        device.display()
                    );
                }
                tokio::time::sleep(POLL).await;
            }
            Ok(())
        }
    }
}

/// Detaches `device` if it is attached (whoever attached it); false if it
/// was not.
pub async fn detach_if_attached(device: &Path) -> anyhow::Result<bool> {
    let index = device_index(device)?;
    let attached = match open_family(true).await? {
        Ok(family) => blocking(move || family.connected(index)).await??,
        // Without the family only nbd-client can have attached it.
        Err(_) => pid_file(index).exists(),
    };
    if attached {
        detach(device).await?;
    }
    Ok(attached)
}

/// N of /dev/nbdN: the netlink family names devices by it.
fn device_index(device: &Path) -> anyhow::Result<u32> {
    // An alias (a udev link) names the real node; a node the kernel has not
    // made yet is named as given.
    let real = std::fs::canonicalize(device).unwrap_or_else(|_| device.to_path_buf());
    index_of(&real)
        .with_context(|| format!("{} is not an NBD device (/dev/nbdN)", device.display()))
}

fn index_of(path: &Path) -> Option<u32> {
    let digits = path.file_name()?.to_str()?.strip_prefix("nbd")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The file the kernel keeps while the device is attached (the pid of the
/// process that attached it).
fn pid_file(index: u32) -> PathBuf {
    PathBuf::from(format!("/sys/block/nbd{index}/pid"))
}

/// The family, or why there is none; `load_module`: try `modprobe nbd`
/// first when it is missing.
async fn open_family(load_module: bool) -> anyhow::Result<Result<Family, String>> {
    match blocking(Family::open).await? {
        Ok(family) => return Ok(Ok(family)),
        Err(NetlinkError::FamilyMissing) => {}
        Err(e) => return Err(e.into()),
    }
    let missing = NetlinkError::FamilyMissing;
    if !load_module {
        return Ok(Err(missing.to_string()));
    }
    let loaded = modprobe_nbd().await;
    match blocking(Family::open).await? {
        Ok(family) => Ok(Ok(family)),
        Err(NetlinkError::FamilyMissing) => Ok(Err(match loaded {
            Ok(()) => format!("{missing}, even after modprobe nbd"),
            Err(why) => format!("{missing}, and modprobe nbd failed: {why}"),
        })),
        Err(e) => Err(e.into()),
    }
}

async fn modprobe_nbd() -> Result<(), String> {
    let out = Command::new("modprobe")
        .arg("nbd")
        .output()
        .await
        .map_err(|e| format!("cannot run it: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// Waits until /dev/nbd`index` is neither attached nor held open.
fn wait_until_free(family: &Family, index: u32) -> anyhow::Result<()> {
    let start = Instant::now();
    while family.connected(index)? {
        if let Ok(pid) = std::fs::read_to_string(pid_file(index)) {
            // The task that attached it, which may have exited since
            // (nbd-client does once the kernel has the sockets).
            bail!(
                "{} (attached; /sys/block/nbd{index}/pid says {})",
                NetlinkError::Busy(index),
                pid.trim()
            );
        }
        if start.elapsed() >= HELD_WAIT {
            bail!("{} (open, though not attached)", NetlinkError::Busy(index));
        }
        std::thread::sleep(POLL);
    }
    Ok(())
}

/// Runs `f` (netlink calls, which block) off the runtime's threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .context("a netlink call failed")
}

#[cfg(test)]
mod tests;
