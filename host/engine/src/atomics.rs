//! How a NIC's 8-byte atomics relate to the host, and how a host applies
//! its own atomics on words that peers update through the NIC (design
//! §5.8).
//!
//! Two facts differ between NICs and decide whether atomics are correct:
//! - **Reply byte order** ([`ReplyOrder`]): the old value a CAS or
//!   fetch-and-add leaves in local memory. Mellanox/NVIDIA ConnectX devices
//!   write it big-endian on little-endian hosts (the reason for Open MPI
//!   #1147 and libfabric #10911 / #10935); other devices write host order.
//!   Backends convert with [`ReplyOrder::to_host`] before a completion
//!   reports the value, so callers always see host order.
//! - **Scope** ([`AtomicScope`]): whether NIC atomics are atomic with the
//!   CPU's atomic instructions on the same word (`IBV_ATOMIC_GLOB`) or only
//!   among NIC operations (`IBV_ATOMIC_HCA`, what ConnectX reports). With
//!   the latter, a memory node that CASes a lock word with the CPU while a
//!   compute node CASes it through the NIC can lose either update.
//!
//! [`SharedWords`] is the hook for that case: the memory node applies its
//! own atomics on shared words (locks, CirQ, counters) through it, and it
//! sends them through the engine's own NIC (a queue pair to itself) where
//! the scope is [`AtomicScope::Nic`], or uses CPU atomics where NIC and CPU
//! agree. Invariant: every atomic a `SharedWords` applies on a word is
//! atomic with every NIC atomic peers apply on it, whatever the device.

use std::sync::Arc;
use std::time::Duration;

use rolex_core::wire::{Access, MrDesc, NetAddr};

use crate::callback::{CompletionFlag, OnValue};
use crate::counters::Counters;
use crate::domain::WorkOp;
use crate::error::{OpKind, TransferError};
use crate::region::MrHandle;
use crate::shared::{remote, EngineShared, Request};

/// The byte order in which a NIC leaves a fetched atomic value in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReplyOrder {
    /// The host's own order: no conversion.
    Host,
    /// Big-endian (network order) whatever the host (ConnectX on x86 and
    /// Arm hosts).
    BigEndian,
}

impl ReplyOrder {
    /// The value the NIC meant, from the word as the host loaded it
    /// natively.
    pub fn to_host(self, raw: u64) -> u64 {
        match self {
            ReplyOrder::Host => raw,
            ReplyOrder::BigEndian => u64::from_be(raw),
        }
    }
}

/// With what a NIC's atomics are atomic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomicScope {
    /// With other NIC atomics and with the CPU's atomic instructions
    /// (`IBV_ATOMIC_GLOB`; the loopback NIC, which uses CPU atomics).
    Global,
    /// Only with other atomics through the same NIC (`IBV_ATOMIC_HCA`):
    /// the host's own atomics on shared words must go through the NIC.
    Nic,
    /// The NIC has no atomics (`IBV_ATOMIC_NONE`): peers' CAS and FAA
    /// fail with an error completion.
    Unsupported,
}

/// What a NIC's atomics are, as the engine uses them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AtomicProfile {
    /// Byte order of fetched values.
    pub reply: ReplyOrder,
    /// Atomic with what.
    pub scope: AtomicScope,
}

/// `ibv_device_attr::atomic_cap`: no atomics.
pub const IBV_ATOMIC_NONE: u32 = 0;
/// `ibv_device_attr::atomic_cap`: atomic among this device's operations.
pub const IBV_ATOMIC_HCA: u32 = 1;
/// `ibv_device_attr::atomic_cap`: atomic with the CPU and other devices.
pub const IBV_ATOMIC_GLOB: u32 = 2;

/// Vendor ids under which Mellanox/NVIDIA ConnectX devices report: the
/// IEEE OUI `ibv_device_attr::vendor_id` carries, and the PCI vendor id.
pub const MELLANOX_VENDOR_IDS: [u32; 2] = [0x02c9, 0x15b3];

impl AtomicProfile {
    /// Host byte order, atomic with the CPU: the loopback NIC, and the
    /// default of backends that say nothing else.
    pub const CPU_COHERENT: AtomicProfile = AtomicProfile {
        reply: ReplyOrder::Host,
        scope: AtomicScope::Global,
    };

    /// The profile of a verbs device from `ibv_query_device`'s `vendor_id`
    /// and `atomic_cap`, on a host that is little-endian or not.
    ///
    /// Mellanox devices answer big-endian on little-endian hosts; every
    /// other device answers in host order. An `atomic_cap` this build does
    /// not know counts as [`AtomicScope::Nic`], the safe reading.
    pub fn from_verbs(vendor_id: u32, atomic_cap: u32, host_little_endian: bool) -> AtomicProfile {
        let reply = if host_little_endian && MELLANOX_VENDOR_IDS.contains(&vendor_id) {
            ReplyOrder::BigEndian
        } else {
            ReplyOrder::Host
        };
        let scope = match atomic_cap {
            IBV_ATOMIC_NONE => AtomicScope::Unsupported,
            IBV_ATOMIC_GLOB => AtomicScope::Global,
            _ => AtomicScope::Nic,
        };
        AtomicProfile { reply, scope }
    }

    /// The profile of a host whose NICs have these profiles: the reply
    /// order of the first, and the narrowest scope (one NIC that is atomic
    /// only with itself makes the host route its atomics through the NIC).
    pub fn combine(profiles: impl IntoIterator<Item = AtomicProfile>) -> AtomicProfile {
        let mut it = profiles.into_iter();
        let Some(mut p) = it.next() else {
            return AtomicProfile::CPU_COHERENT;
        };
        for q in it {
            p.scope = match (p.scope, q.scope) {
                (AtomicScope::Unsupported, _) | (_, AtomicScope::Unsupported) => {
                    AtomicScope::Unsupported
                }
                (AtomicScope::Nic, _) | (_, AtomicScope::Nic) => AtomicScope::Nic,
                _ => AtomicScope::Global,
            };
        }
        p
    }

    /// Where a host with this profile applies its own atomics on shared
    /// words.
    pub fn route(&self) -> AtomicRoute {
        match self.scope {
            AtomicScope::Global => AtomicRoute::Cpu,
            // Without NIC atomics nobody else updates the word atomically.
            AtomicScope::Unsupported => AtomicRoute::Cpu,
            AtomicScope::Nic => AtomicRoute::Nic,
        }
    }
}

/// Where [`SharedWords`] applies an atomic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomicRoute {
    /// CPU atomic instructions on the mapped word.
    Cpu,
    /// A CAS or FAA from this engine's NIC to itself.
    Nic,
}

/// Default bound on one atomic through the NIC in [`SharedWords`].
pub const SHARED_WORD_WAIT: Duration = Duration::from_secs(30);

/// The host's own atomics on words of one of its registered regions that
/// peers also update through the NIC (see the module docs). Made by
/// [`TransferEngine::shared_words`](crate::TransferEngine::shared_words).
///
/// Loads are plain aligned 8-byte loads (a NIC atomic writes the word
/// whole). There is no plain store: on an HCA-only device a CPU store can
/// be overwritten by a NIC atomic that read the word before it, so a store
/// is a CAS from the value last seen ([`SharedWords::swap`]).
pub struct SharedWords {
    shared: Arc<EngineShared>,
    mr: MrHandle,
    desc: MrDesc,
    route: AtomicRoute,
    wait: Duration,
}

impl std::fmt::Debug for SharedWords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedWords")
            .field("len", &self.mr.len())
            .field("route", &self.route)
            .finish()
    }
}

impl SharedWords {
    pub(crate) fn new(
        shared: Arc<EngineShared>,
        mr: MrHandle,
        desc: MrDesc,
        route: AtomicRoute,
    ) -> SharedWords {
        SharedWords {
            shared,
            mr,
            desc,
            route,
            wait: SHARED_WORD_WAIT,
        }
    }

    /// The same words with another bound on one atomic through the NIC
    /// (past it the call fails with [`TransferError::Timeout`]).
    pub fn with_wait(mut self, wait: Duration) -> SharedWords {
        self.wait = wait;
        self
    }

    /// Where the atomics go.
    pub fn route(&self) -> AtomicRoute {
        self.route
    }

    /// The region.
    pub fn handle(&self) -> &MrHandle {
        &self.mr
    }

    /// Compare-and-swap on the aligned word at `offset`; returns the old
    /// value (the swap happened iff it equals `expected`).
    pub fn cas(&self, offset: u64, expected: u64, new: u64) -> Result<u64, TransferError> {
        match self.route {
            AtomicRoute::Cpu => self.cpu(offset, |w| {
                match w.compare_exchange(expected, new, SEQ, SEQ) {
                    Ok(v) | Err(v) => v,
                }
            }),
            AtomicRoute::Nic => self.nic(offset, OpKind::Cas, |remote| WorkOp::Cas {
                remote,
                expected,
                new,
            }),
        }
    }

    /// Fetch-and-add (wrapping) on the aligned word at `offset`; returns
    /// the old value.
    pub fn faa(&self, offset: u64, add: u64) -> Result<u64, TransferError> {
        match self.route {
            AtomicRoute::Cpu => self.cpu(offset, |w| w.fetch_add(add, SEQ)),
            AtomicRoute::Nic => self.nic(offset, OpKind::Faa, |remote| WorkOp::Faa { remote, add }),
        }
    }

    /// Loads the aligned word at `offset`.
    pub fn load(&self, offset: u64) -> Result<u64, TransferError> {
        self.mr.load_u64(offset)
    }

    /// Sets the word at `offset` to `new` whatever it held (a CAS loop, see
    /// the type's docs); returns the value it replaced.
    pub fn swap(&self, offset: u64, new: u64) -> Result<u64, TransferError> {
        let mut seen = self.load(offset)?;
        loop {
            let old = self.cas(offset, seen, new)?;
            if old == seen {
                return Ok(old);
            }
            seen = old;
        }
    }

    fn cpu(
        &self,
        offset: u64,
        f: impl FnOnce(&std::sync::atomic::AtomicU64) -> u64,
    ) -> Result<u64, TransferError> {
        let g = self
            .mr
            .region()
            .enter()
            .ok_or(TransferError::RegionDeregistered)?;
        self.mr.load_u64(offset)?; // bounds and alignment, as errors
        g.word(offset)
            .map(f)
            .ok_or(TransferError::LocalMisaligned { offset })
    }

    fn nic(
        &self,
        offset: u64,
        op: OpKind,
        make: impl FnOnce(crate::domain::Remote) -> WorkOp,
    ) -> Result<u64, TransferError> {
        if self.shared.shutdown.load(SEQ) {
            return Err(TransferError::EngineShutDown);
        }
        let group = self
            .shared
            .groups
            .get(self.mr.group())
            .ok_or(TransferError::UnknownGroup {
                group: self.mr.group(),
            })?;
        let nic = self.shared.nic() % group.domains.len().max(1);
        let r = remote(&self.desc, nic, offset, 8, Access::REMOTE_ATOMIC)?;
        let peer: NetAddr = r.peer;
        let flag = CompletionFlag::new();
        Counters::bump(&self.shared.counters.rtts, 1);
        group.push(Request {
            ops: vec![(nic, make(r))],
            notify: OnValue::flag(&flag).into(),
            receivers: Vec::new(),
        });
        flag.wait(self.wait).unwrap_or(Err(TransferError::Timeout {
            op,
            peer,
            waited: self.wait,
        }))
    }
}

const SEQ: std::sync::atomic::Ordering = std::sync::atomic::Ordering::SeqCst;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mellanox_replies_big_endian_on_little_endian_hosts_only() {
        let p = AtomicProfile::from_verbs(0x02c9, IBV_ATOMIC_HCA, true);
        assert_eq!(p.reply, ReplyOrder::BigEndian);
        assert_eq!(p.scope, AtomicScope::Nic);
        assert_eq!(p.route(), AtomicRoute::Nic);
        // The PCI vendor id too.
        let p = AtomicProfile::from_verbs(0x15b3, IBV_ATOMIC_GLOB, true);
        assert_eq!(p.reply, ReplyOrder::BigEndian);
        assert_eq!(p.route(), AtomicRoute::Cpu);
        // A big-endian host reads the big-endian reply as is.
        let p = AtomicProfile::from_verbs(0x02c9, IBV_ATOMIC_HCA, false);
        assert_eq!(p.reply, ReplyOrder::Host);
        // Another vendor (SoftRoCE reports 0xffffff here, Broadcom 0x14e4).
        for v in [0, 0x14e4, 0xff_ffff] {
            assert_eq!(
                AtomicProfile::from_verbs(v, IBV_ATOMIC_GLOB, true),
                AtomicProfile::CPU_COHERENT
            );
        }
        assert_eq!(
            AtomicProfile::from_verbs(0x14e4, IBV_ATOMIC_NONE, true).scope,
            AtomicScope::Unsupported
        );
        // Unknown capability codes are read the safe way.
        assert_eq!(
            AtomicProfile::from_verbs(0x14e4, 7, true).scope,
            AtomicScope::Nic
        );
    }

    #[test]
    fn byte_order_conversion() {
        let v = 0x0102_0304_0506_0708u64;
        assert_eq!(ReplyOrder::Host.to_host(v), v);
        // What a big-endian writer leaves, loaded natively, converts back.
        let raw = u64::from_ne_bytes(v.to_be_bytes());
        assert_eq!(ReplyOrder::BigEndian.to_host(raw), v);
    }

    #[test]
    fn a_host_routes_through_the_nic_if_any_nic_needs_it() {
        let hca = AtomicProfile {
            reply: ReplyOrder::BigEndian,
            scope: AtomicScope::Nic,
        };
        assert_eq!(
            AtomicProfile::combine([AtomicProfile::CPU_COHERENT, hca]).route(),
            AtomicRoute::Nic
        );
        assert_eq!(
            AtomicProfile::combine([AtomicProfile::CPU_COHERENT; 3]),
            AtomicProfile::CPU_COHERENT
        );
        assert_eq!(AtomicProfile::combine([]), AtomicProfile::CPU_COHERENT);
    }
}
