//! The kernel's NBD generic-netlink family, "nbd" (Linux 4.12 and later,
//! RHEL 8.1 and later): hand sockets to /dev/nbdN (`NBD_CMD_CONNECT`),
//! let them go (`NBD_CMD_DISCONNECT`), ask whether a device is connected
//! (`NBD_CMD_STATUS`).
//!
//! The attributes are built by pure functions, so the tests can hold them
//! against the kernel's layout byte by byte; neli carries the messages
//! (socket, family id, sequence numbers, acknowledgements, error replies)
//! and parses the status reply. Every call blocks: run them off the
//! runtime's threads.

use std::fmt;
use std::os::fd::RawFd;

use neli::consts::nl::NlmF;
use neli::consts::socket::NlFamily;
use neli::err::RouterError;
use neli::genl::Genlmsghdr;
use neli::nl::NlPayload;
use neli::router::synchronous::NlRouter;
use neli::types::Buffer;
use neli::utils::Groups;

// The numbers of include/uapi/linux/nbd-netlink.h (Linux 4.12; later
// kernels only appended to these lists).

/// `NBD_GENL_FAMILY_NAME`.
pub const FAMILY_NAME: &str = "nbd";
/// `NBD_GENL_VERSION`.
pub const FAMILY_VERSION: u8 = 1;

/// `NBD_CMD_*`.
pub mod cmd {
    pub const CONNECT: u8 = 1;
    pub const DISCONNECT: u8 = 2;
    pub const STATUS: u8 = 5;
}

/// `NBD_ATTR_*`, the top-level attributes. The kernel's policy
/// (drivers/block/nbd.c `nbd_attr_policy`) gives their payloads: INDEX is
/// a u32, the sizes, timeouts and flags are u64s, SOCKETS and DEVICE_LIST
/// nests.
pub mod attr {
    pub const INDEX: u16 = 1;
    pub const SIZE_BYTES: u16 = 2;
    pub const BLOCK_SIZE_BYTES: u16 = 3;
    pub const TIMEOUT: u16 = 4;
    pub const SERVER_FLAGS: u16 = 5;
    pub const SOCKETS: u16 = 7;
    pub const DEAD_CONN_TIMEOUT: u16 = 8;
    pub const DEVICE_LIST: u16 = 9;
}

/// `NBD_SOCK_ITEM`: one socket in `NBD_ATTR_SOCKETS`.
pub const SOCK_ITEM: u16 = 1;
/// `NBD_SOCK_FD`: the socket's file descriptor, a u32, in a `NBD_SOCK_ITEM`.
pub const SOCK_FD: u16 = 1;
/// `NBD_DEVICE_ITEM`: one device in `NBD_ATTR_DEVICE_LIST`.
pub const DEVICE_ITEM: u16 = 1;
/// `NBD_DEVICE_INDEX` (u32) and `NBD_DEVICE_CONNECTED` (u8) in a
/// `NBD_DEVICE_ITEM`.
pub const DEVICE_INDEX: u16 = 1;
pub const DEVICE_CONNECTED: u16 = 2;

/// `NLA_F_NESTED` (include/uapi/linux/netlink.h): marks a nest, as strict
/// attribute validation wants.
const NLA_F_NESTED: u16 = 1 << 15;
/// `NLA_HDRLEN`, and the alignment of every attribute (`NLA_ALIGNTO`).
const NLA_HDRLEN: usize = 4;
const NLA_ALIGNTO: usize = 4;

/// What one `NBD_CMD_CONNECT` asks of the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    /// N of /dev/nbdN.
    pub index: u32,
    pub size_bytes: u64,
    pub block_size_bytes: u64,
    /// The transmission flags the server gave in the handshake.
    pub server_flags: u64,
    /// Seconds a request may take before the kernel gives up on its
    /// connection.
    pub timeout: u64,
    /// Seconds requests wait for a dead connection to be replaced before
    /// they fail.
    pub dead_conn_timeout: u64,
    /// Sockets past the handshake, one per kernel connection.
    pub sockets: Vec<RawFd>,
}

/// Appends one attribute: header (`nla_len` counts header and payload, not
/// the padding), payload, zeroes up to the 4-byte boundary.
fn put(out: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = NLA_HDRLEN + payload.len();
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(payload);
    out.resize(out.len() + len.next_multiple_of(NLA_ALIGNTO) - len, 0);
}

fn put_u32(out: &mut Vec<u8>, kind: u16, v: u32) {
    put(out, kind, &v.to_ne_bytes());
}

fn put_u64(out: &mut Vec<u8>, kind: u16, v: u64) {
    put(out, kind, &v.to_ne_bytes());
}

fn put_nest(out: &mut Vec<u8>, kind: u16, inner: &[u8]) {
    put(out, kind | NLA_F_NESTED, inner);
}

/// The attributes of an `NBD_CMD_CONNECT`.
pub fn connect_attrs(c: &Connect) -> Vec<u8> {
    let mut out = Vec::new();
    put_u32(&mut out, attr::INDEX, c.index);
    put_u64(&mut out, attr::SIZE_BYTES, c.size_bytes);
    put_u64(&mut out, attr::BLOCK_SIZE_BYTES, c.block_size_bytes);
    put_u64(&mut out, attr::SERVER_FLAGS, c.server_flags);
    put_u64(&mut out, attr::TIMEOUT, c.timeout);
    put_u64(&mut out, attr::DEAD_CONN_TIMEOUT, c.dead_conn_timeout);
    let mut sockets = Vec::new();
    for &fd in &c.sockets {
        let mut item = Vec::new();
        // The kernel reads the fd as a u32 and casts it back to an int.
        put_u32(&mut item, SOCK_FD, fd as u32);
        put_nest(&mut sockets, SOCK_ITEM, &item);
    }
    put_nest(&mut out, attr::SOCKETS, &sockets);
    out
}

/// The attributes of an `NBD_CMD_DISCONNECT` or `NBD_CMD_STATUS` for
/// /dev/nbd`index`.
pub fn index_attrs(index: u32) -> Vec<u8> {
    let mut out = Vec::new();
    put_u32(&mut out, attr::INDEX, index);
    out
}

/// A generic netlink payload: `struct genlmsghdr` (command, version, two
/// reserved bytes), then the attributes.
pub fn genl_payload(command: u8, attrs: &[u8]) -> Vec<u8> {
    let mut out = vec![command, FAMILY_VERSION, 0, 0];
    out.extend_from_slice(attrs);
    out
}

/// Whether a `NBD_CMD_STATUS` reply lists /dev/nbd`index` as connected. A
/// device the kernel has not created yet is not listed: not connected.
pub fn connected_in(reply: &Genlmsghdr<u8, u16>, index: u32) -> Result<bool, String> {
    let attrs = reply.attrs().get_attr_handle();
    // The kernel nests without NLA_F_NESTED here (nla_nest_start_noflag);
    // neli finds an attribute by its type either way.
    let Ok(list) = attrs.get_nested_attributes::<u16>(attr::DEVICE_LIST) else {
        return Ok(false);
    };
    for item in list.iter() {
        if *item.nla_type().nla_type() != DEVICE_ITEM {
            continue;
        }
        let fields = item
            .get_attr_handle::<u16>()
            .map_err(|e| format!("a device item: {e}"))?;
        let i: u32 = fields
            .get_attr_payload_as(DEVICE_INDEX)
            .map_err(|e| format!("a device index: {e}"))?;
        if i == index {
            let connected: u8 = fields
                .get_attr_payload_as(DEVICE_CONNECTED)
                .map_err(|e| format!("the connected flag: {e}"))?;
            return Ok(connected != 0);
        }
    }
    Ok(false)
}

#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("the kernel has no \"{FAMILY_NAME}\" generic netlink family")]
    FamilyMissing,
    #[error("/dev/nbd{0} is in use")]
    Busy(u32),
    #[error("attaching and detaching NBD devices needs CAP_SYS_ADMIN (run as root)")]
    NotPermitted,
    #[error("the kernel refused {what} for /dev/nbd{index}: {error} (its log, dmesg, says why)")]
    Refused {
        what: &'static str,
        index: u32,
        error: std::io::Error,
    },
    #[error("the kernel's status of /dev/nbd{index} is malformed: {why}")]
    BadStatus { index: u32, why: String },
    #[error("generic netlink: {0}")]
    Socket(String),
}

/// A generic netlink socket that knows the family's id.
pub struct Family {
    router: NlRouter,
    id: u16,
}

impl fmt::Debug for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Family").field("id", &self.id).finish()
    }
}

/// The errno of a netlink error reply.
fn errno<T, P>(e: &RouterError<T, P>) -> Option<i32> {
    match e {
        // Error replies carry the negative errno.
        RouterError::Nlmsgerr(m) => Some(-*m.error()),
        _ => None,
    }
}

impl Family {
    /// Opens a generic netlink socket and resolves the family; no
    /// privileges needed.
    pub fn open() -> Result<Family, NetlinkError> {
        let (router, _multicast) = NlRouter::connect(NlFamily::Generic, None, Groups::empty())
            .map_err(|e| NetlinkError::Socket(format!("cannot open a socket: {e}")))?;
        let id = router
            .resolve_genl_family(FAMILY_NAME)
            .map_err(|e| match errno(&e) {
                // What the controller answers for a family nobody registered.
                Some(libc::ENOENT) => NetlinkError::FamilyMissing,
                _ => NetlinkError::Socket(format!("cannot resolve \"{FAMILY_NAME}\": {e}")),
            })?;
        Ok(Family { router, id })
    }

    /// Sends one command and collects its replies up to the
    /// acknowledgement.
    fn request(&self, command: u8, attrs: &[u8]) -> Result<Vec<Genlmsghdr<u8, u16>>, Failure> {
        let payload = Buffer::from(genl_payload(command, attrs));
        let replies = self
            .router
            .send::<u16, Buffer, u16, Genlmsghdr<u8, u16>>(
                self.id,
                NlmF::ACK,
                NlPayload::Payload(payload),
            )
            .map_err(|e| Failure::Socket(format!("cannot send: {e}")))?;
        let mut got = Vec::new();
        for reply in replies {
            let msg = reply.map_err(|e| match errno(&e) {
                Some(n) => Failure::Errno(n),
                None => Failure::Socket(format!("no answer: {e}")),
            })?;
            if let NlPayload::Payload(p) = msg.nl_payload() {
                got.push(p.clone());
            }
        }
        Ok(got)
    }

    /// Hands `c.sockets` to the kernel as /dev/nbd`c.index`. The kernel
    /// takes its own reference to each socket before it answers: the
    /// caller may close them once this returns.
    pub fn connect(&self, c: &Connect) -> Result<(), NetlinkError> {
        self.request(cmd::CONNECT, &connect_attrs(c))
            .map(drop)
            .map_err(|e| refused(e, "NBD_CMD_CONNECT", c.index))
    }

    /// Asks the kernel to disconnect /dev/nbd`index`: it sends a
    /// disconnect to the server on each socket and lets them go; the
    /// device is free once [`Family::connected`] says no.
    pub fn disconnect(&self, index: u32) -> Result<(), NetlinkError> {
        self.request(cmd::DISCONNECT, &index_attrs(index))
            .map(drop)
            .map_err(|e| refused(e, "NBD_CMD_DISCONNECT", index))
    }

    /// Whether /dev/nbd`index` is connected, or otherwise held: the kernel
    /// counts a device someone has open as connected too, and refuses to
    /// connect it.
    pub fn connected(&self, index: u32) -> Result<bool, NetlinkError> {
        let replies = self
            .request(cmd::STATUS, &index_attrs(index))
            .map_err(|e| refused(e, "NBD_CMD_STATUS", index))?;
        let mut connected = false;
        for r in &replies {
            connected |=
                connected_in(r, index).map_err(|why| NetlinkError::BadStatus { index, why })?;
        }
        Ok(connected)
    }
}

/// Why a command failed.
enum Failure {
    /// The kernel answered with this errno.
    Errno(i32),
    Socket(String),
}

/// The error for `what` on /dev/nbd`index` that failed so.
fn refused(f: Failure, what: &'static str, index: u32) -> NetlinkError {
    match f {
        Failure::Socket(why) => NetlinkError::Socket(why),
        Failure::Errno(libc::EBUSY) => NetlinkError::Busy(index),
        Failure::Errno(libc::EPERM) => NetlinkError::NotPermitted,
        Failure::Errno(n) => NetlinkError::Refused {
            what,
            index,
            error: std::io::Error::from_raw_os_error(n),
        },
    }
}

#[cfg(test)]
mod tests;
