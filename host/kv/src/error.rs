//! [`KvError`]: every way a key-value operation or a client connection
//! fails, naming what was wrong — and whether the operation may have taken
//! effect ([`KvError::may_have_applied`]).
//!
//! An error is *determinate* unless it says otherwise: the operation that
//! returned it did not take effect. Two variants wrap the error that was
//! met and change what it means:
//! - [`KvError::Indeterminate`]: the operation failed after a write of it
//!   may have reached the pool (its write batch failed part-way, its
//!   unlock did, or an error came after its data was written): it may or
//!   may not have taken effect, and a history checker must treat it as an
//!   operation with an unknown outcome;
//! - [`KvError::LockMaybeHeld`]: a chain lock of this client may still be
//!   held because its lock or its release failed without saying whether it
//!   landed. The client recorded it and releases it itself at the start of
//!   a later operation (see `held`); if the process dies first, the memory
//!   node's lease reaper releases it (leased owners only).

use core::fmt;

use rolex_core::entry::LeafAddr;
use rolex_core::layout::{LayoutError, LeafError};
use rolex_core::model::ModelError;

use rolex_engine::TransferError;

/// A key-value store failure. Whatever it is, the pool is left readable:
/// every key present is found. Unless the error is (or wraps)
/// [`KvError::Indeterminate`], the operation that returned it did not take
/// effect; [`KvError::may_have_applied`] tells.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum KvError {
    /// The transfer engine failed an operation. Determinate as such: a
    /// failure after a write may have landed comes wrapped in
    /// [`KvError::Indeterminate`].
    Transfer {
        /// What the store was doing.
        during: &'static str,
        /// The engine's error.
        error: TransferError,
    },
    /// The pool's layout version is not the one this build reads.
    LayoutVersion {
        /// The version the pool (or its descriptor) announces.
        found: u32,
        /// The version this build reads.
        expected: u32,
    },
    /// The pool's bytes are not a valid layout.
    Layout(LayoutError),
    /// `scan` was asked for 0 keys.
    ScanCountZero,
    /// `range` was given `lo > hi`.
    InvalidRange {
        /// The low bound.
        lo: u64,
        /// The high bound.
        hi: u64,
    },
    /// A configuration value is out of range.
    BadConfig {
        /// Which field.
        field: &'static str,
        /// Why.
        reason: &'static str,
    },
    /// A model's synonym leaf table stayed full for the whole bounded wait
    /// for its retraining; the insert did not happen.
    SltFull {
        /// The model.
        model: u64,
    },
    /// The memory node is out of memory for this write: the model's synonym
    /// leaf table is full and the memory node's agent refused to retrain
    /// the model because its model region has no room for the new record
    /// (it published that in the model's record). The insert did not
    /// happen; reads, updates and deletes of present keys go on.
    PoolFull {
        /// The model.
        model: u64,
        /// Bytes the model's retraining needed.
        needed: u64,
    },
    /// The value region has no room for a value block of `needed` bytes
    /// (a chunk claim went past its `capacity`): out-of-line writes fail
    /// fast; reads, deletes and inline writes go on.
    ValueSpaceFull {
        /// Bytes the claim asked for.
        needed: u64,
        /// Bytes of the value region's block area.
        capacity: u64,
    },
    /// A validated leaf names a value block outside the value region — or
    /// one that did not hold the key's value (another key, length or
    /// generation in its header, or a failed checksum) on every read for
    /// longer than a live writer leaves it so (2 s: a block is freed only
    /// once no leaf names it): the pool is corrupt (or not this store's).
    BadValuePointer {
        /// The key.
        key: u64,
        /// The pointer.
        offset: u64,
        /// The value length it gives.
        len: u32,
    },
    /// A value longer than the store holds
    /// ([`rolex_core::layout::MAX_VALUE_LEN`]).
    ValueTooLong {
        /// Its length.
        len: usize,
        /// The longest value stored.
        max: usize,
    },
    /// A `u64` method (`get`, `insert`, `update`, `delete`, `scan`,
    /// `range`) met a value that is not 8 bytes long: nothing was changed.
    /// Use the byte methods (`get_value`, `put`, …) for such keys.
    ValueNotU64 {
        /// The key.
        key: u64,
        /// Its value's length.
        len: usize,
    },
    /// The retraining queue stayed full for the whole bounded wait of the
    /// insert that had to queue its model (the memory node's agent is not
    /// consuming, or is waiting out abandoned tickets). The insert itself
    /// *was applied*; only its model's retraining request was not queued
    /// (the agent also watches SLT counts, and retrains the model anyway
    /// once it runs).
    CirqFull {
        /// The model that was to be queued.
        model: u64,
        /// The ticket taken and given up.
        ticket: u64,
        /// The head last read.
        head: u64,
        /// Slots of the queue.
        capacity: u64,
        /// Re-reads of the head made.
        attempts: u64,
    },
    /// The leaf region has no leaf left; the insert did not happen.
    LeafRegionFull {
        /// Leaves the region holds.
        capacity: u64,
    },
    /// An operation kept failing (contention, torn leaves, frozen model)
    /// for its whole retry budget; it did not take effect.
    TooManyRetries {
        /// The operation.
        op: &'static str,
        /// Attempts made.
        attempts: u64,
    },
    /// Model `model`'s record could not be read while it was still safe
    /// to use: on each of `tries` tries the record the directory named was
    /// retired (`retired` tries) or its space reused by another record
    /// (`reused`) by the time it was read, and the try took longer than
    /// `KvClientConfig::model_max_age` (`max_age`), past which a retired
    /// record's bytes are no longer known to be its own. The memory node
    /// retrained the model faster than this client's round trips allow
    /// for that age (a fabric or a thread slower than the age assumes);
    /// the pool is sound. Nothing was written.
    ModelFetchStarved {
        /// The model.
        model: u64,
        /// Tries made.
        tries: u64,
        /// Tries that found the record retired, too late to use it.
        retired: u64,
        /// Tries that found the record's space reused.
        reused: u64,
        /// `KvClientConfig::model_max_age`.
        max_age: core::time::Duration,
    },
    /// The models' first keys (the pool's upper blob) cannot be indexed:
    /// they do not increase (the error names the model) or the upper
    /// levels' bound is too large.
    Locator(ModelError),
    /// The superblock describes a pool larger than the region the memory
    /// node registered.
    PoolTooSmall {
        /// Bytes the superblock describes.
        described: u64,
        /// Bytes of the registered region.
        registered: u64,
    },
    /// The topology blob (which model serves which key range; see
    /// `rolex_core::layout::topology`) the superblock names did not
    /// decode, read again and again: the pool is not one this client can
    /// use.
    Topology {
        /// Pool offset of the blob the superblock named last.
        offset: u64,
        /// Its length.
        len: u64,
        /// What was wrong with it.
        error: LayoutError,
    },
    /// An operation of the fabric was not confirmed in time (so far: a
    /// posted unlock, reported as the `release` of a
    /// [`KvError::LockMaybeHeld`]). Determinate as such.
    Timeout {
        /// What the store was doing.
        during: &'static str,
        /// How long it waited.
        waited: core::time::Duration,
    },
    /// A leaf's bytes are not a leaf of this pool — or a leaf stayed torn
    /// (failing its checksum) on every read for longer than a live
    /// writer's write leaves one torn (2 s): damaged, as a write torn by
    /// a crash leaves it (a memory node resumed on its pool file names
    /// such leaves).
    Leaf {
        /// The model whose chain it is in.
        model: u64,
        /// Its address.
        leaf: LeafAddr,
        /// What is wrong with it.
        error: LeafError,
    },
    /// The pool holds something the protocol never produces. Determinate
    /// as such (met before anything was written); met after a write it
    /// comes wrapped in [`KvError::Indeterminate`].
    Inconsistent {
        /// What.
        what: &'static str,
        /// The model concerned.
        model: u64,
    },
    /// This client's lease (`owner`) is no longer valid here (it was not
    /// renewed in time, or was dropped): nothing that writes was posted
    /// (nothing at all with a lease that has a key to the pool of its own,
    /// which the memory node closes when the lease ends there).
    /// Its locks are released by the memory node once the lease ends
    /// there; every write of this client fails until the process acquires
    /// a new lease and connects a new client (see [`crate::lease`]).
    /// Determinate as such: met after a write it comes wrapped in
    /// [`KvError::Indeterminate`].
    LeaseExpired {
        /// The lapsed lease's id.
        owner: u16,
    },
    /// The operation failed after a write of it may have reached the pool:
    /// it may or may not have taken effect (a write or unlock batch failed,
    /// a held lock was found changed after the write, or the retraining
    /// request after a completed split failed). `error` is what failed.
    Indeterminate(Box<KvError>),
    /// A chain lock of this client may still be held: its lock `CAS` or its
    /// release failed (or was not confirmed in time) without saying whether
    /// it landed. The client recorded it and releases it at the start of a
    /// later operation of any of its sessions
    /// ([`crate::KvClient::locks_maybe_held`] counts those not yet
    /// released); the memory node's lease reaper releases it if this
    /// process dies first. Determinate as such: the operation wrote
    /// nothing, unless `after` is indeterminate (its writes failed
    /// part-way) or the whole error comes wrapped in
    /// [`KvError::Indeterminate`] (its writes landed, then the release
    /// failed).
    LockMaybeHeld {
        /// The model whose chain it is.
        model: u64,
        /// Why the release (or the lock) failed.
        release: Box<KvError>,
        /// The error that made the operation release its lock unchanged,
        /// if one did.
        after: Option<Box<KvError>>,
    },
    /// An operation of a cluster client ([`crate::cluster::ClusterSession`])
    /// failed on one memory node: `error` is what failed there, and
    /// whether the operation may have taken effect is `error`'s.
    MemoryNode {
        /// The node's index in the partition map.
        node: usize,
        /// Its name (its bootstrap address, or a local name).
        name: String,
        /// What failed there.
        error: Box<KvError>,
    },
    /// A memory node of a cluster was found gone (its peer failed or
    /// vanished): every operation on its key range fails at once with this,
    /// posting nothing; the other nodes' ranges go on. Determinate.
    MemoryNodeDown {
        /// The node's index in the partition map.
        node: usize,
        /// Its name (its bootstrap address, or a local name).
        name: String,
        /// The key range it serves, inclusive.
        range: (u64, u64),
        /// The failure that showed it gone.
        cause: Box<KvError>,
    },
}

impl KvError {
    /// Whether the operation that returned this error may have taken
    /// effect (`false`: it certainly did not).
    pub fn may_have_applied(&self) -> bool {
        match self {
            Self::Indeterminate(_) => true,
            Self::MemoryNode { error, .. } => error.may_have_applied(),
            Self::LockMaybeHeld { after, .. } => {
                after.as_ref().is_some_and(|e| e.may_have_applied())
            }
            _ => false,
        }
    }

    /// Whether a chain lock of this client may still be held after this
    /// error (the client releases it itself later; see
    /// [`KvError::LockMaybeHeld`]).
    pub fn lock_may_be_held(&self) -> bool {
        match self {
            Self::Indeterminate(e) | Self::MemoryNode { error: e, .. } => e.lock_may_be_held(),
            Self::LockMaybeHeld { .. } => true,
            _ => false,
        }
    }

    /// Whether this error is, or comes from, the lapse of this client's
    /// lease on the memory node ([`KvError::LeaseExpired`]), wherever it
    /// was met: as the error itself, under the cluster's naming of the
    /// node, or as the failed release of a [`KvError::LockMaybeHeld`] (the
    /// lock's release is refused once the lease has lapsed). Every later
    /// write of this client on that node fails the same way.
    pub fn lease_expired(&self) -> bool {
        match self {
            Self::LeaseExpired { .. } => true,
            Self::Indeterminate(e)
            | Self::MemoryNode { error: e, .. }
            | Self::MemoryNodeDown { cause: e, .. } => e.lease_expired(),
            Self::LockMaybeHeld { release, after, .. } => {
                release.lease_expired() || after.as_deref().is_some_and(Self::lease_expired)
            }
            _ => false,
        }
    }

    /// The error met on the memory node, without the cluster's wrapping
    /// ([`KvError::MemoryNode`]); any other error as it is.
    pub fn on_node(&self) -> &KvError {
        match self {
            Self::MemoryNode { error, .. } => error.on_node(),
            e => e,
        }
    }

    /// This error, marked as one after which the operation may have taken
    /// effect (unchanged if it already is).
    pub(crate) fn indeterminate(self) -> Self {
        if self.may_have_applied() {
            self
        } else {
            Self::Indeterminate(Box::new(self))
        }
    }
}

impl fmt::Display for KvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Transfer { during, error } => write!(f, "{during}: {error}"),
            Self::LayoutVersion { found, expected } => write!(
                f,
                "pool layout version {found}, this client reads version {expected}"
            ),
            Self::Layout(e) => write!(f, "pool layout: {e}"),
            Self::ScanCountZero => f.write_str("scan asked for 0 keys"),
            Self::InvalidRange { lo, hi } => write!(f, "range bounds inverted: lo {lo} > hi {hi}"),
            Self::BadConfig { field, reason } => write!(f, "invalid {field}: {reason}"),
            Self::SltFull { model } => write!(
                f,
                "model {model}: synonym leaf table full and not retrained in time"
            ),
            Self::PoolFull { model, needed } => write!(
                f,
                "pool full: model {model}'s synonym leaf table is full and the memory node has no room to retrain it (a new record needs {needed} bytes)"
            ),
            Self::ValueSpaceFull { needed, capacity } => write!(
                f,
                "value space full: no room for {needed} more bytes of out-of-line values (value region of {capacity} bytes)"
            ),
            Self::BadValuePointer { key, offset, len } => write!(
                f,
                "key {key}'s leaf names a value block of {len} bytes at {offset:#x}, outside the value region (corrupt pool)"
            ),
            Self::ValueTooLong { len, max } => {
                write!(f, "value of {len} bytes is longer than the {max} bytes a value may hold")
            }
            Self::ValueNotU64 { key, len } => write!(
                f,
                "key {key} holds a value of {len} bytes, not a u64 (nothing changed; use the byte methods)"
            ),
            Self::CirqFull {
                model,
                ticket,
                head,
                capacity,
                attempts,
            } => write!(
                f,
                "model {model}: the insert was applied, but the retraining queue stayed full \
                 (ticket {ticket}, head {head}, {capacity} slots, {attempts} re-reads of the head): \
                 retraining not queued"
            ),
            Self::LeafRegionFull { capacity } => {
                write!(f, "leaf region full ({capacity} leaves)")
            }
            Self::TooManyRetries { op, attempts } => {
                write!(f, "{op} gave up after {attempts} attempts")
            }
            Self::ModelFetchStarved {
                model,
                tries,
                retired,
                reused,
                max_age,
            } => write!(
                f,
                "model {model}: retrained faster than it could be fetched: in {tries} tries its \
                 record was read retired {retired} times and reused {reused} times, each try \
                 taking longer than model_max_age ({max_age:?})"
            ),
            Self::Locator(e) => write!(f, "model locator: {e}"),
            Self::PoolTooSmall {
                described,
                registered,
            } => write!(
                f,
                "the superblock describes a pool of {described} bytes, the registered region holds {registered}"
            ),
            Self::Topology { offset, len, error } => write!(
                f,
                "the topology blob ({len} bytes at pool offset {offset}) does not decode: {error}"
            ),
            Self::Timeout { during, waited } => {
                write!(f, "{during}: not confirmed within {waited:?}")
            }
            Self::Leaf { model, leaf, error } => write!(
                f,
                "model {model}, leaf {} of region {}: {error}",
                leaf.leaf(),
                leaf.region()
            ),
            Self::Inconsistent { what, model } => write!(f, "model {model}: {what}"),
            Self::LeaseExpired { owner } => write!(
                f,
                "lease {owner} expired: nothing posted (writes need a new lease)"
            ),
            Self::Indeterminate(e) => write!(f, "{e} (the operation may have taken effect)"),
            Self::LockMaybeHeld {
                model,
                release,
                after: None,
            } => write!(
                f,
                "model {model}: a chain lock may still be held ({release}); the client releases it later"
            ),
            Self::LockMaybeHeld {
                model,
                release,
                after: Some(after),
            } => write!(
                f,
                "{after}; then model {model}: a chain lock may still be held ({release}); the client releases it later"
            ),
            Self::MemoryNode { node, name, error } => {
                write!(f, "memory node {node} ({name}): {error}")
            }
            Self::MemoryNodeDown {
                node,
                name,
                range: (lo, hi),
                cause,
            } => write!(
                f,
                "memory node {node} ({name}) is down: keys {lo}..={hi} are unavailable (it failed with: {cause})"
            ),
        }
    }
}

impl std::error::Error for KvError {}

impl From<LayoutError> for KvError {
    fn from(e: LayoutError) -> Self {
        Self::Layout(e)
    }
}

/// Wraps an engine error with what the store was doing.
pub(crate) fn transfer(during: &'static str) -> impl Fn(TransferError) -> KvError {
    move |error| KvError::Transfer { during, error }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_whether_they_may_have_applied() {
        let failed = KvError::Transfer {
            during: "writing a split",
            error: TransferError::EngineShutDown,
        };
        assert!(!failed.may_have_applied() && !failed.lock_may_be_held());
        let maybe = failed.clone().indeterminate();
        assert!(maybe.may_have_applied());
        assert_eq!(maybe.clone().indeterminate(), maybe, "wrapped once");
        assert!(maybe
            .to_string()
            .ends_with("(the operation may have taken effect)"));
        let held = |after: Option<KvError>| KvError::LockMaybeHeld {
            model: 3,
            release: Box::new(failed.clone()),
            after: after.map(Box::new),
        };
        assert!(held(None).lock_may_be_held() && !held(None).may_have_applied());
        assert!(!held(Some(failed.clone())).may_have_applied());
        assert!(held(Some(maybe.clone())).may_have_applied());
        let landed = held(None).indeterminate();
        assert!(landed.may_have_applied() && landed.lock_may_be_held());
        assert!(!KvError::SltFull { model: 1 }.may_have_applied());
        assert!(!KvError::PoolFull {
            model: 1,
            needed: 8
        }
        .may_have_applied());
    }

    /// A lapsed lease is found wherever it was met: as the error, named by
    /// the cluster, or as a chain lock's refused release (the shape a
    /// compute node met when a memory node of three was killed mid-run:
    /// its lease lapsed before any post failed).
    #[test]
    fn a_lapsed_lease_is_found_under_any_wrapping() {
        let lapsed = KvError::LeaseExpired { owner: 1 };
        let other = KvError::SltFull { model: 1 };
        let named = |error: KvError| KvError::MemoryNode {
            node: 1,
            name: "127.0.0.1:1".into(),
            error: Box::new(error),
        };
        let held = |release: KvError, after: Option<KvError>| KvError::LockMaybeHeld {
            model: 1,
            release: Box::new(release),
            after: after.map(Box::new),
        };
        assert!(lapsed.lease_expired());
        assert!(named(lapsed.clone()).lease_expired());
        assert!(named(held(lapsed.clone(), None)).lease_expired());
        assert!(held(other.clone(), Some(lapsed.clone().indeterminate())).lease_expired());
        assert!(!named(held(other.clone(), Some(other.clone()))).lease_expired());
        assert!(!other.lease_expired());
    }

    #[test]
    fn pool_errors_say_what_was_found() {
        let e = KvError::PoolTooSmall {
            described: 4096,
            registered: 1024,
        };
        assert_eq!(
            e.to_string(),
            "the superblock describes a pool of 4096 bytes, the registered region holds 1024"
        );
    }
}
