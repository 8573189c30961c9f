//! The region table of the backends that place peer writes in software
//! (tcp, in-process): rkeys handed out as table indices, and the checks a
//! peer's one-sided write or read passes before a byte is touched (rkey,
//! access, bounds, the region's write gate). Verbs hardware keeps its own.

use std::sync::Arc;

use super::{Access, Region, RemoteAddr, RemoteRegion, Segment, TransportError, WriteGate};
use crate::memory::Memory;

/// The first rkey handed out; keys are table indices above it.
const RKEY_BASE: u32 = 0x100;

/// The regions registered on one connection, by rkey.
#[derive(Default)]
pub(crate) struct Regions(Vec<Region>);

impl Regions {
    /// Registers `memory`; its rkey is the next index.
    pub(crate) fn add(
        &mut self,
        memory: &Arc<Memory>,
        access: Access,
        gate: Option<Arc<dyn WriteGate>>,
    ) -> Result<Region, TransportError> {
        let key = u32::try_from(self.0.len())
            .ok()
            .and_then(|i| i.checked_add(RKEY_BASE))
            .ok_or_else(|| TransportError::Invalid("too many regions".into()))?;
        let remote = RemoteRegion {
            addr: memory.as_ptr() as u64,
            len: memory.len() as u64,
            rkey: key,
        };
        let region = Region::new(Arc::clone(memory), key, remote, access, gate);
        self.0.push(region.clone());
        Ok(region)
    }

    fn get(&self, rkey: u32) -> Option<&Region> {
        self.0.get(rkey.checked_sub(RKEY_BASE)? as usize)
    }

    /// Where a peer's write of `len` bytes at `remote` lands (its region
    /// and the offset in it), once its rkey, access, bounds and the
    /// region's gate (`note`: a notified write's) all allow it; else why
    /// not, in the words the peer is told.
    pub(crate) fn writable(
        &self,
        remote: RemoteAddr,
        len: u64,
        note: Option<u32>,
    ) -> Result<(Region, u64), String> {
        let region = self
            .get(remote.rkey)
            .ok_or_else(|| format!("write to unknown rkey {:#x}", remote.rkey))?;
        if !region.access().remote_write {
            return Err(format!(
                "write to rkey {:#x}, which grants no remote write",
                remote.rkey
            ));
        }
        let granted = region.remote();
        let offset = remote
            .addr
            .checked_sub(granted.addr)
            .filter(|&off| region.memory().contains(off, len))
            .ok_or_else(|| {
                format!(
                    "write of {len} bytes at {:#x} falls outside region {:#x}..{:#x}",
                    remote.addr,
                    granted.addr,
                    granted.addr + granted.len
                )
            })?;
        if let Some(gate) = region.gate() {
            gate.admit(Some(offset), len, note)
                .map_err(|why| format!("write refused: {why}"))?;
        }
        Ok((region.clone(), offset))
    }

    /// The `len` bytes at `remote` a peer's read takes, if it was granted
    /// reading them; else why not, in the words the peer is told.
    pub(crate) fn readable(&self, remote: RemoteAddr, len: u64) -> Result<Segment, String> {
        let region = self
            .get(remote.rkey)
            .filter(|r| r.access().remote_read)
            .ok_or_else(|| {
                format!(
                    "read from rkey {:#x}, which grants no remote read",
                    remote.rkey
                )
            })?;
        remote
            .addr
            .checked_sub(region.remote().addr)
            .and_then(|off| region.segment(off as usize, len as usize))
            .ok_or_else(|| format!("read of {len} bytes at {:#x} out of bounds", remote.addr))
    }
}
