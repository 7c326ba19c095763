//! [`TransferError`]: every way a transfer-engine call or operation fails.
//!
//! One variant per failing check, each naming what failed and where (which
//! peer, which region key, which offset), so a caller can act on it without
//! parsing text. There is deliberately no catch-all string variant.

use core::fmt;
use std::time::Duration;

use rolex_core::wire::{Access, NetAddr, WireError};

/// Which kind of operation an error is about.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// One-sided read.
    Read,
    /// One-sided write (with or without immediate).
    Write,
    /// Paged writes.
    PagedWrite,
    /// Scatter to several peers.
    Scatter,
    /// Two-sided send.
    Send,
    /// Receive-buffer pool.
    Recv,
    /// 8-byte compare-and-swap.
    Cas,
    /// 8-byte fetch-and-add.
    Faa,
    /// Memory registration.
    Register,
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpKind::Read => "read",
            OpKind::Write => "write",
            OpKind::PagedWrite => "paged write",
            OpKind::Scatter => "scatter",
            OpKind::Send => "send",
            OpKind::Recv => "receive",
            OpKind::Cas => "compare-and-swap",
            OpKind::Faa => "fetch-and-add",
            OpKind::Register => "registration",
        })
    }
}

/// The protection check a remote access failed (the NIC's job, §3 of the
/// design): whichever fails, the target memory is left unchanged.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProtectionCheck {
    /// No region with this key is registered on the target NIC.
    UnknownKey,
    /// `[addr, addr + len)` is not wholly inside the region.
    OutOfBounds {
        /// First address accessed.
        addr: u64,
        /// Bytes accessed.
        len: u64,
    },
    /// The region does not grant this right.
    MissingRight(Access),
    /// An 8-byte atomic on an address that is not 8-byte aligned.
    Misaligned {
        /// The address.
        addr: u64,
    },
}

impl fmt::Display for ProtectionCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtectionCheck::UnknownKey => f.write_str("unknown remote key"),
            ProtectionCheck::OutOfBounds { addr, len } => {
                write!(f, "[{addr:#x}, +{len}) is outside the region")
            }
            ProtectionCheck::MissingRight(a) => write!(f, "region lacks access right {a:?}"),
            ProtectionCheck::Misaligned { addr } => {
                write!(f, "atomic address {addr:#x} is not 8-byte aligned")
            }
        }
    }
}

/// A transfer-engine configuration that cannot be honoured.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// A domain group must have 1 to 4 NICs.
    NicsPerGroup(usize),
    /// An engine needs at least one domain group.
    NoGroups,
    /// The unordered window must hold at least one operation.
    ZeroWindow,
    /// The injected bandwidth must be a positive, finite number.
    Bandwidth,
    /// A verbs option out of the range the hardware accepts.
    Verbs(&'static str),
    /// The injected failure probability must be in `[0, 1]`.
    FaultProbability,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::NicsPerGroup(n) => {
                write!(f, "a domain group needs 1 to 4 NICs, {n} requested")
            }
            ConfigError::NoGroups => f.write_str("an engine needs at least one domain group"),
            ConfigError::ZeroWindow => f.write_str("the unordered window must be at least 1"),
            ConfigError::Bandwidth => f.write_str("injected bandwidth must be positive and finite"),
            ConfigError::Verbs(why) => write!(f, "invalid verbs option: {why}"),
            ConfigError::FaultProbability => f.write_str(
                "the injected failure probabilities (failed, torn and their sum) must be in [0, 1]",
            ),
        }
    }
}

/// Why a transfer-engine call or operation failed.
///
/// Errors found before anything is posted are returned by the `submit_*`
/// call; errors found by the NIC (protection, unknown or failed peer,
/// missing receive) arrive through the operation's completion.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransferError {
    /// A transfer of zero bytes where bytes are required.
    ZeroLength {
        /// The operation.
        op: OpKind,
    },
    /// A transfer longer than the engine accepts in one operation.
    TooLarge {
        /// The operation.
        op: OpKind,
        /// Bytes requested.
        len: u64,
        /// The most allowed.
        max: u64,
    },
    /// A local range `[offset, offset + len)` not inside the local region.
    LocalOutOfBounds {
        /// Offset in the region.
        offset: u64,
        /// Bytes.
        len: u64,
        /// The region's length.
        region_len: u64,
    },
    /// The local region lacks a right the operation needs (e.g.
    /// `LOCAL_WRITE` for the destination of a read).
    LocalAccess {
        /// The right that is missing.
        missing: Access,
    },
    /// A local 8-byte word access at an offset that is not 8-byte aligned.
    LocalMisaligned {
        /// Offset in the region.
        offset: u64,
    },
    /// The local region was deregistered (or its engine dropped).
    RegionDeregistered,
    /// The local region belongs to another engine.
    ForeignRegion,
    /// A remote access failed the NIC's protection checks; nothing changed.
    Protection {
        /// The target NIC.
        peer: NetAddr,
        /// The remote key used.
        rkey: u64,
        /// Which check failed.
        check: ProtectionCheck,
    },
    /// No engine answers at this address (never existed or was dropped).
    UnknownPeer {
        /// The address.
        peer: NetAddr,
    },
    /// The peer is marked failed: its NICs answer every operation with an
    /// error.
    PeerFailed {
        /// The address.
        peer: NetAddr,
    },
    /// A fault injected by the loopback NIC ([`crate::Faults`]): the
    /// operation completed with an error, and may or may not have taken
    /// effect at the target — as after a real transport error, the
    /// initiator cannot tell which, and an atomic's old value is lost.
    InjectedFault {
        /// The operation.
        op: OpKind,
        /// The peer it was aimed at.
        peer: NetAddr,
    },
    /// A send found no posted receive buffer at the peer within the wait
    /// bound.
    NoReceiveBuffer {
        /// The address.
        peer: NetAddr,
        /// How long the sender waited.
        waited: Duration,
    },
    /// A message longer than the receive buffer the peer posted.
    MessageTooLarge {
        /// The address.
        peer: NetAddr,
        /// Message bytes.
        len: u64,
        /// The receive buffer's bytes.
        buffer_len: u64,
    },
    /// The engine is shutting down or was dropped; the operation did not
    /// run (or its outcome is unknown).
    EngineShutDown,
    /// An expectation is already armed on this immediate.
    ImmAlreadyArmed {
        /// The immediate.
        imm: u32,
    },
    /// More arrivals of one immediate outstanding than a `u32` counts.
    ImmOverflow {
        /// The immediate.
        imm: u32,
    },
    /// The expectation on this immediate was cancelled
    /// ([`TransferEngine::cancel_imm_count`](crate::TransferEngine::cancel_imm_count)).
    ImmCancelled {
        /// The immediate.
        imm: u32,
    },
    /// The expectation's deadline passed before enough arrivals; they
    /// stay counted for the next expectation.
    ImmDeadline {
        /// The immediate.
        imm: u32,
        /// Arrivals counted by then.
        arrived: u32,
        /// Arrivals expected.
        expected: u32,
    },
    /// A sender's transfer carrying this immediate failed part-way and it
    /// said so (an abort notice): the data may be incomplete.
    SenderAborted {
        /// The immediate.
        imm: u32,
    },
    /// An immediate with [`crate::imm_wait::ABORT_BIT`] set, which
    /// [`crate::EngineConfig::abort_notices`] reserves for the engine.
    ImmReserved {
        /// The immediate.
        imm: u32,
    },
    /// A peer group handle this engine never issued.
    UnknownPeerGroup {
        /// The handle's value.
        handle: u64,
    },
    /// A scatter destination outside the peer group named.
    PeerNotInGroup {
        /// The destination's address.
        peer: NetAddr,
        /// The group's handle.
        handle: u64,
    },
    /// Source and destination page lists differ in length.
    PagesMismatch {
        /// Source pages.
        src: usize,
        /// Destination pages.
        dst: usize,
    },
    /// A page offset `offset + index * stride` overflows `u64`.
    PageOffsetOverflow {
        /// Position of the page in the list.
        page: usize,
    },
    /// A scatter or barrier with no destination.
    NoDestinations,
    /// A domain group index this engine does not have.
    UnknownGroup {
        /// The index.
        group: usize,
    },
    /// Bytes from a peer did not decode.
    Malformed {
        /// What was being decoded.
        what: &'static str,
        /// Why it failed.
        error: WireError,
    },
    /// The engine configuration is invalid.
    Config(ConfigError),
    /// The NICs asked for cannot be chosen (none listed, a named device
    /// missing, nothing near the GPU or on the NUMA node).
    NicChoice(crate::topology::NicChoiceError),
    /// The OS refused to start one of the engine's threads.
    ThreadSpawn {
        /// Which thread.
        thread: &'static str,
    },
    /// The backend reported nothing outstanding while an operation had
    /// not completed (a backend fault; the operation's outcome is unknown).
    LostCompletion,
    /// An `MrDesc` that names no NIC (its fields were built by hand).
    NoNics,
    /// A libfabric call failed (domain set-up, registration, posting).
    Libfabric {
        /// The C call, e.g. `fi_getinfo`.
        call: &'static str,
        /// The provider's (positive) error number.
        errno: i32,
        /// `fi_strerror`'s text for it.
        text: String,
    },
    /// libfabric could not be loaded (absent, too old, or not libfabric);
    /// the text says how to install it or point `ROLEX_LIBFABRIC` at it.
    #[cfg(feature = "libfabric")]
    LibfabricLoad(libfabric_sys::LoadError),
    /// A libibverbs call failed (device, queue pair, registration, post).
    Verbs {
        /// The C call, e.g. `ibv_reg_mr`.
        call: &'static str,
        /// Its (positive) errno.
        errno: i32,
    },
    /// The provider completed an operation with an error.
    FabricCompletion {
        /// The operation.
        op: OpKind,
        /// The peer it was aimed at.
        peer: NetAddr,
        /// The provider's (positive) error number.
        errno: i32,
        /// `fi_strerror`'s text for it.
        text: String,
    },
    /// An operation neither completed nor could be posted within the
    /// domain's bound (the peer stopped answering).
    Timeout {
        /// The operation.
        op: OpKind,
        /// The peer it was aimed at.
        peer: NetAddr,
        /// How long it waited.
        waited: Duration,
    },
    /// The provider's memory-registration mode cannot be honoured.
    UnsupportedMrMode {
        /// The provider.
        provider: String,
        /// Its `mr_mode` bits.
        mr_mode: u64,
        /// Why it cannot be used.
        why: &'static str,
    },
    /// A local region used by an operation is not registered with the NIC
    /// that posts it (the provider needs local descriptors).
    LocalNotRegistered,
    /// The provider refused every post to this peer (`-FI_EAGAIN`:
    /// receiver-not-ready back-off on EFA, a full queue elsewhere), or no
    /// bounce slot came free for it, for the domain's bound; the
    /// operation was never posted and took no effect.
    PeerNotReady {
        /// The operation.
        op: OpKind,
        /// The peer.
        peer: NetAddr,
        /// How long the peer's queue made no progress.
        waited: Duration,
        /// Refusals in that time.
        refusals: u64,
        /// Over `*;ofi_rxm`, this process's `FI_OFI_RXM_BUFFER_SIZE` (the
        /// provider's 16 KiB where unset): two processes whose sizes
        /// differ never connect (seen with libfabric 1.17: every post to
        /// the peer, one-sided writes included, is refused until the
        /// bound), and this is what the sender then sees.
        rxm_buffer: Option<u32>,
    },
    /// A write carries an immediate, and the NIC's provider has fewer
    /// than 4 bytes of remote CQ data (`cq_data_size`).
    NoImmediates {
        /// The provider.
        provider: String,
        /// Its `cq_data_size`.
        cq_data_size: usize,
    },
}

impl fmt::Display for TransferError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use TransferError::*;
        match self {
            ZeroLength { op } => write!(f, "{op} of zero bytes"),
            TooLarge { op, len, max } => {
                write!(f, "{op} of {len} bytes exceeds the limit of {max} bytes")
            }
            LocalOutOfBounds {
                offset,
                len,
                region_len,
            } => write!(
                f,
                "local range [{offset}, +{len}) is outside the {region_len}-byte region"
            ),
            LocalAccess { missing } => write!(f, "local region lacks access right {missing:?}"),
            LocalMisaligned { offset } => {
                write!(f, "local word at offset {offset} is not 8-byte aligned")
            }
            RegionDeregistered => f.write_str("local region is deregistered"),
            ForeignRegion => f.write_str("local region belongs to another engine"),
            Protection { peer, rkey, check } => {
                write!(
                    f,
                    "protection error at peer {peer}, rkey {rkey:#x}: {check}"
                )
            }
            UnknownPeer { peer } => write!(f, "unknown peer {peer}"),
            PeerFailed { peer } => write!(f, "peer {peer} has failed"),
            InjectedFault { op, peer } => write!(
                f,
                "injected fault: {op} at peer {peer} failed (it may have taken effect)"
            ),
            NoReceiveBuffer { peer, waited } => write!(
                f,
                "peer {peer} posted no receive buffer within {} ms",
                waited.as_millis()
            ),
            MessageTooLarge {
                peer,
                len,
                buffer_len,
            } => write!(
                f,
                "message of {len} bytes exceeds peer {peer}'s {buffer_len}-byte receive buffer"
            ),
            EngineShutDown => f.write_str("transfer engine shut down"),
            ImmAlreadyArmed { imm } => {
                write!(f, "an expectation is already armed on immediate {imm:#x}")
            }
            ImmOverflow { imm } => write!(f, "arrival count of immediate {imm:#x} overflows"),
            ImmCancelled { imm } => write!(f, "expectation on immediate {imm:#x} cancelled"),
            ImmDeadline {
                imm,
                arrived,
                expected,
            } => write!(
                f,
                "deadline passed on immediate {imm:#x} with {arrived} of {expected} arrivals"
            ),
            SenderAborted { imm } => write!(
                f,
                "the sender of immediate {imm:#x} reported its transfer failed part-way"
            ),
            ImmReserved { imm } => write!(
                f,
                "immediate {imm:#x} has the abort bit set, reserved for abort notices"
            ),
            UnknownPeerGroup { handle } => write!(f, "unknown peer group {handle}"),
            PeerNotInGroup { peer, handle } => {
                write!(f, "peer {peer} is not in peer group {handle}")
            }
            PagesMismatch { src, dst } => {
                write!(f, "source has {src} pages but destination has {dst}")
            }
            PageOffsetOverflow { page } => write!(f, "offset of page #{page} overflows"),
            NoDestinations => f.write_str("no destinations given"),
            UnknownGroup { group } => write!(f, "no domain group {group}"),
            Malformed { what, error } => write!(f, "malformed {what} from peer: {error}"),
            Config(e) => write!(f, "invalid engine configuration: {e}"),
            NicChoice(e) => write!(f, "cannot choose NICs: {e}"),
            ThreadSpawn { thread } => write!(f, "could not start the {thread} thread"),
            LostCompletion => f.write_str("the NIC lost an operation's completion"),
            NoNics => f.write_str("memory descriptor names no NIC"),
            Libfabric { call, errno, text } => {
                write!(f, "libfabric call {call} failed: {text} (error {errno})")
            }
            #[cfg(feature = "libfabric")]
            LibfabricLoad(e) => write!(f, "{e}"),
            Verbs { call, errno } => {
                // io::Error's text already ends with "(os error N)".
                write!(
                    f,
                    "libibverbs call {call} failed: {}",
                    std::io::Error::from_raw_os_error(*errno)
                )?;
                if *call == "ibv_get_device_list" {
                    write!(f, " (no RDMA device or driver on this machine?)")?;
                }
                Ok(())
            }
            FabricCompletion {
                op,
                peer,
                errno,
                text,
            } => write!(f, "{op} to peer {peer} failed: {text} (error {errno})"),
            Timeout { op, peer, waited } => write!(
                f,
                "{op} to peer {peer} did not complete within {} ms",
                waited.as_millis()
            ),
            UnsupportedMrMode {
                provider,
                mr_mode,
                why,
            } => write!(
                f,
                "provider {provider} needs mr_mode {mr_mode:#x}, which is not supported: {why}"
            ),
            LocalNotRegistered => {
                f.write_str("local region is not registered with the NIC posting the operation")
            }
            PeerNotReady {
                op,
                peer,
                waited,
                refusals,
                rxm_buffer,
            } => {
                write!(
                    f,
                    "{op} never posted: peer {peer} refused every post for {} ms \
                     ({refusals} refusals, -FI_EAGAIN); not applied",
                    waited.as_millis()
                )?;
                match rxm_buffer {
                    Some(n) => write!(
                        f,
                        " (is the peer alive, and is its FI_OFI_RXM_BUFFER_SIZE {n} as here? \
                         ofi_rxm processes whose sizes differ never connect)"
                    ),
                    None => Ok(()),
                }
            }
            NoImmediates {
                provider,
                cq_data_size,
            } => write!(
                f,
                "provider {provider} carries {cq_data_size} bytes of remote CQ data: \
                 a 32-bit immediate needs 4"
            ),
        }
    }
}

impl std::error::Error for TransferError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TransferError::Malformed { error, .. } => Some(error),
            TransferError::Config(e) => Some(e),
            TransferError::NicChoice(e) => Some(e),
            #[cfg(feature = "libfabric")]
            TransferError::LibfabricLoad(e) => Some(e),
            _ => None,
        }
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_that_refused_every_post_names_the_rxm_buffer_where_it_applies() {
        let e = |rxm_buffer| {
            TransferError::PeerNotReady {
                op: OpKind::Write,
                peer: NetAddr::new(b"peer").unwrap(),
                waited: Duration::from_secs(10),
                refusals: 3,
                rxm_buffer,
            }
            .to_string()
        };
        let over_rxm = e(Some(32768));
        assert!(over_rxm.contains("not applied"), "{over_rxm}");
        assert!(
            over_rxm.contains("FI_OFI_RXM_BUFFER_SIZE 32768"),
            "{over_rxm}"
        );
        assert!(!e(None).contains("FI_OFI_RXM_BUFFER_SIZE"));
    }
}
