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
//!   immediates, on every provider, from the `fi_info` it opened with
//!   ([`OrderAttrs`]). Ordering bits in `msg_order` hold only for messages
//!   up to `max_order_{raw,waw}_size` bytes (EFA grants no RMA ordering
//!   bits and sizes only for atomics), and remote CQ data carries a 32-bit
//!   immediate only if `cq_data_size` is at least 4 bytes (EFA: 4).
//! - [`PagedByMessage::from_attrs`]: whether paged writes may travel as
//!   one tagged message that the target's domain places (module `paged`),
//!   from the `fi_info` it opened with ([`PagedAttrs`]).

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

/// The attributes of an `fi_info` that bound ordering and immediates, as
/// the domain reads them when it opens (`ffi::Info::granted`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrderAttrs {
    /// `tx_attr->msg_order` (`FI_ORDER_*` bits): message ordering of
    /// what this endpoint transmits.
    pub tx_msg_order: u64,
    /// `rx_attr->msg_order`: message ordering of what arrives.
    pub rx_msg_order: u64,
    /// `ep_attr->max_msg_size`: the largest message one operation moves.
    pub max_msg_size: usize,
    /// `ep_attr->max_order_raw_size`: data ordering of a read after a
    /// write, both at most this many bytes (0: none; `usize::MAX`: any).
    pub max_order_raw_size: usize,
    /// `ep_attr->max_order_war_size` (write after read; not claimed).
    pub max_order_war_size: usize,
    /// `ep_attr->max_order_waw_size` (write after write).
    pub max_order_waw_size: usize,
    /// `domain_attr->cq_data_size`: bytes of remote CQ data.
    pub cq_data_size: usize,
    /// `tx_attr->inject_size`: the largest message `fi_inject` takes.
    pub inject_size: usize,
}

/// What the domain may claim ([`Domain::ordered`](crate::domain::Domain::ordered),
/// [`Domain::immediates`](crate::domain::Domain::immediates)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claims {
    /// A read after a write and a write after a write to one peer take
    /// effect in posting order, for every size the engine posts.
    pub ordered: bool,
    /// Writes can carry a 32-bit immediate.
    pub immediates: bool,
}

/// `FI_ORDER_RAW`.
const RAW: u64 = 1 << 1;
/// `FI_ORDER_WAR`.
#[cfg(test)]
const WAR: u64 = 1 << 3;
/// `FI_ORDER_WAW`.
const WAW: u64 = 1 << 4;

impl Claims {
    /// The claims for `a`, for an engine that needs order for messages
    /// up to `largest` bytes.
    ///
    /// Ordering needs both kinds libfabric distinguishes (fi_endpoint(3)):
    /// *message* order (`FI_ORDER_RAW` and `FI_ORDER_WAW`, the generic
    /// bits that cover RMA and atomics across each other, on the transmit
    /// and the receive side: the store orders a read after a lock's CAS
    /// and an unlock after leaf writes) and *data* order
    /// (`max_order_raw_size`, `max_order_waw_size` at least `largest`: a
    /// large write split over paths may otherwise land after a later
    /// small one). Write-after-read is not claimed: nothing in the engine
    /// or the store relies on it. Immediates need `cq_data_size >= 4`.
    pub fn from_attrs(a: &OrderAttrs, largest: usize) -> Claims {
        let bits = |order: u64| order & (RAW | WAW) == RAW | WAW;
        let sizes = a.max_order_raw_size >= largest && a.max_order_waw_size >= largest;
        Claims {
            ordered: bits(a.tx_msg_order) && bits(a.rx_msg_order) && sizes,
            immediates: a.cq_data_size >= 4,
        }
    }

    /// The claims of a domain: ordering must hold for every message the
    /// provider moves (`max_msg_size`), since the domain does not know
    /// which sizes its users order.
    pub fn of_domain(a: &OrderAttrs) -> Claims {
        Claims::from_attrs(a, a.max_msg_size)
    }
}

/// The attributes of an `fi_info` that decide the paged-by-message path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedAttrs {
    /// `caps` holds `FI_TAGGED`: a channel of messages apart from the
    /// engine's own (which go to the buffers it posts).
    pub tagged: bool,
    /// `domain_attr->mr_mode` (`FI_MR_*` bits).
    pub mr_mode: u64,
    /// `ep_attr->protocol` is `FI_PROTO_SHM`.
    pub shared_memory: bool,
    /// `domain_attr->data_progress` is `FI_PROGRESS_MANUAL`.
    pub manual_progress: bool,
}

/// Whether a domain moves the pages of a paged write to one peer as one
/// message (module `paged`), decided from [`PagedAttrs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedByMessage {
    /// The path can work here: tagged messages are granted and remote
    /// keys are the application's, checked by the provider's software in
    /// the target's CPU (no `FI_MR_PROV_KEY`, no `FI_MR_LOCAL`, no
    /// `FI_MR_ALLOCATED`), not by a NIC, and the endpoint does not hand
    /// peers its memory directly (`shm`). The target's domain then checks
    /// and places each page itself, no less than the provider would.
    pub possible: bool,
    /// The path is the better one: where it is possible and the
    /// provider's data progress is manual (`tcp;ofi_rxm`): the target's
    /// engine reads its queue to move a one-sided write anyway, its CPU
    /// copies the bytes anyway, and one message costs it one receive
    /// where chained writes cost a receive per `iov_limit` pages and an
    /// acknowledgement each. With automatic progress (`sockets`) the
    /// provider's own thread places one-sided writes and the message path
    /// would add the engine's worker to every write (measured slower on
    /// 1.17's `sockets`). Hardware RMA (verbs, EFA) never takes it: there
    /// it would add the target's CPU to a path that has none.
    pub preferred: bool,
}

impl PagedByMessage {
    /// The path's standing on a provider with attributes `a`.
    pub fn from_attrs(a: &PagedAttrs) -> PagedByMessage {
        let hardware_keys = a.mr_mode & (MR_LOCAL | MR_PROV_KEY | MR_ALLOCATED) != 0;
        let possible = a.tagged && !hardware_keys && !a.shared_memory;
        PagedByMessage {
            possible,
            preferred: possible && a.manual_progress,
        }
    }
}

/// `FI_MR_LOCAL`.
const MR_LOCAL: u64 = 1 << 2;
/// `FI_MR_ALLOCATED`.
const MR_ALLOCATED: u64 = 1 << 5;
/// `FI_MR_PROV_KEY`.
const MR_PROV_KEY: u64 = 1 << 6;

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

    fn tcp_without_atomics() -> OrderAttrs {
        OrderAttrs {
            tx_msg_order: RAW | WAW,
            rx_msg_order: RAW | WAW,
            max_msg_size: usize::MAX,
            max_order_raw_size: usize::MAX,
            max_order_war_size: 0,
            max_order_waw_size: usize::MAX,
            cq_data_size: 8,
            inject_size: 64,
        }
    }

    #[test]
    fn ordering_needs_the_bits_on_both_sides_and_the_sizes() {
        let tcp = tcp_without_atomics();
        assert_eq!(
            Claims::of_domain(&tcp),
            Claims {
                ordered: true,
                immediates: true
            }
        );
        // Write-after-read is not needed.
        assert_eq!(tcp.tx_msg_order & WAR, 0);
        // EFA-like: ordered data for small messages only, 4-byte data.
        let efa = OrderAttrs {
            max_order_waw_size: 64,
            cq_data_size: 4,
            ..tcp
        };
        let c = Claims::of_domain(&efa);
        assert!(!c.ordered && c.immediates);
        assert!(Claims::from_attrs(&efa, 64).ordered);
        assert!(!Claims::from_attrs(&efa, 65).ordered);
        // `sockets`: sizes just under 2^64, as large as its messages.
        let sockets = OrderAttrs {
            max_msg_size: usize::MAX - 4096,
            max_order_raw_size: usize::MAX - 4096,
            max_order_waw_size: usize::MAX - 4096,
            ..tcp
        };
        assert!(Claims::of_domain(&sockets).ordered);
        // `shm`: the transmit side orders only sends.
        let shm = OrderAttrs {
            tx_msg_order: 1 << 8,
            ..tcp
        };
        assert!(!Claims::of_domain(&shm).ordered);
        // A missing bit, or no CQ data at all.
        let c = Claims::of_domain(&OrderAttrs {
            rx_msg_order: RAW,
            cq_data_size: 0,
            ..tcp
        });
        assert_eq!(
            c,
            Claims {
                ordered: false,
                immediates: false
            }
        );
        // Immediates need 4 bytes.
        let three = OrderAttrs {
            cq_data_size: 3,
            ..tcp
        };
        assert!(!Claims::of_domain(&three).immediates);
    }

    #[test]
    fn paged_by_message_only_where_software_checks_keys() {
        let tcp = PagedAttrs {
            tagged: true,
            mr_mode: 0,
            shared_memory: false,
            manual_progress: true,
        };
        let on = PagedByMessage::from_attrs(&tcp);
        assert!(on.possible && on.preferred);
        // `sockets`: possible (forced on in tests), not preferred.
        let sockets = PagedByMessage::from_attrs(&PagedAttrs {
            manual_progress: false,
            ..tcp
        });
        assert!(sockets.possible && !sockets.preferred);
        // verbs / EFA: provider keys and local descriptors.
        let verbs = PagedAttrs {
            mr_mode: MR_LOCAL | MR_PROV_KEY | MR_ALLOCATED | (1 << 4),
            ..tcp
        };
        assert!(!PagedByMessage::from_attrs(&verbs).possible);
        assert!(
            !PagedByMessage::from_attrs(&PagedAttrs {
                mr_mode: MR_PROV_KEY,
                ..tcp
            })
            .possible
        );
        // shm hands peers its memory; no tagged messages, no path.
        assert!(
            !PagedByMessage::from_attrs(&PagedAttrs {
                shared_memory: true,
                ..tcp
            })
            .possible
        );
        assert!(
            !PagedByMessage::from_attrs(&PagedAttrs {
                tagged: false,
                ..tcp
            })
            .possible
        );
    }
}
