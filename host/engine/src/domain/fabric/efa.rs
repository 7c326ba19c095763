//! What a libfabric provider may be trusted with, decided from what it
//! reports rather than its name where libfabric reports it (design §7),
//! device-free so tests give made-up attributes:
//! - [`atomic_profile`]: whose atomics the provider's are. EFA emulates
//!   remote atomics in the target's CPU (its provider's progress engine),
//!   which nothing makes atomic with the application's own CPU atomics on
//!   the same word, so a memory node on EFA routes its own atomics on
//!   shared words through its NIC ([`AtomicScope::Nic`]). libfabric has no
//!   attribute saying this, so here, alone, the provider's name decides.
//!   The software providers (`tcp;ofi_rxm`, `shm`, `sockets`) run the
//!   emulation on the same CPU; the conformance case
//!   `cpu_and_nic_atomics_agree` checks them on every run.
//! - [`Claims::from_attrs`]: whether the domain may claim ordering and
//!   immediates. Ordering bits in `msg_order` hold only for messages up to
//!   `max_order_{raw,war,waw}_size` bytes (EFA reports small sizes or 0),
//!   and remote CQ data carries a 32-bit immediate only if `cq_data_size`
//!   is at least 4 bytes.

use crate::atomics::{AtomicProfile, AtomicScope, ReplyOrder};

/// The atomics of `provider` (as `fi_info->fabric_attr->prov_name` names
/// it, e.g. `efa`, `tcp;ofi_rxm`).
pub fn atomic_profile(provider: &str) -> AtomicProfile {
    let core = provider.split(';').next().unwrap_or(provider);
    match core {
        "efa" => AtomicProfile {
            reply: ReplyOrder::Host,
            scope: AtomicScope::Nic,
        },
        _ => AtomicProfile::CPU_COHERENT,
    }
}

/// The attributes of an `fi_info` that bound ordering and immediates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrderAttrs {
    /// `tx_attr->msg_order` (`FI_ORDER_*` bits).
    pub msg_order: u64,
    /// `ep_attr->max_order_raw_size`: read-after-write order holds for
    /// messages up to this many bytes.
    pub max_order_raw_size: usize,
    /// `ep_attr->max_order_war_size`.
    pub max_order_war_size: usize,
    /// `ep_attr->max_order_waw_size`.
    pub max_order_waw_size: usize,
    /// `domain_attr->cq_data_size`: bytes of remote CQ data.
    pub cq_data_size: usize,
}

/// What the domain may claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claims {
    /// Operations to one peer take effect in posting order, for every
    /// size the engine posts.
    pub ordered: bool,
    /// Writes can carry a 32-bit immediate.
    pub immediates: bool,
}

/// `FI_ORDER_RAW`.
const RAW: u64 = 1 << 1;
/// `FI_ORDER_WAR`.
const WAR: u64 = 1 << 3;
/// `FI_ORDER_WAW`.
const WAW: u64 = 1 << 4;

impl Claims {
    /// The claims for `a`, for an engine that needs order for messages
    /// up to `largest` bytes (the largest write or read it orders: a leaf).
    pub fn from_attrs(a: &OrderAttrs, largest: usize) -> Claims {
        let bits = a.msg_order & (RAW | WAR | WAW) == RAW | WAR | WAW;
        let sizes = [
            a.max_order_raw_size,
            a.max_order_war_size,
            a.max_order_waw_size,
        ]
        .iter()
        .all(|&s| s >= largest);
        Claims {
            ordered: bits && sizes,
            immediates: a.cq_data_size >= 4,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::atomics::AtomicRoute;

    #[test]
    fn efa_atomics_are_routed_through_the_nic() {
        assert_eq!(atomic_profile("efa").route(), AtomicRoute::Nic);
        assert_eq!(atomic_profile("efa;ofi_rxr").route(), AtomicRoute::Nic);
        assert_eq!(atomic_profile("tcp;ofi_rxm"), AtomicProfile::CPU_COHERENT);
        assert_eq!(atomic_profile("shm"), AtomicProfile::CPU_COHERENT);
    }

    #[test]
    fn ordering_needs_the_bits_and_the_sizes_immediates_need_four_bytes() {
        let tcp = OrderAttrs {
            msg_order: RAW | WAR | WAW,
            max_order_raw_size: usize::MAX,
            max_order_war_size: usize::MAX,
            max_order_waw_size: usize::MAX,
            cq_data_size: 8,
        };
        assert_eq!(
            Claims::from_attrs(&tcp, 4096),
            Claims {
                ordered: true,
                immediates: true
            }
        );
        // EFA-like: ordering bits for small messages only, 4-byte data.
        let efa = OrderAttrs {
            max_order_waw_size: 64,
            cq_data_size: 4,
            ..tcp
        };
        let c = Claims::from_attrs(&efa, 4096);
        assert!(!c.ordered && c.immediates);
        assert!(Claims::from_attrs(&efa, 64).ordered);
        // A missing bit, or no CQ data at all.
        let c = Claims::from_attrs(
            &OrderAttrs {
                msg_order: RAW | WAW,
                cq_data_size: 0,
                ..tcp
            },
            8,
        );
        assert_eq!(
            c,
            Claims {
                ordered: false,
                immediates: false
            }
        );
    }
}
