//! Several memory nodes (design §5.6): a [`PartitionMap`] cuts the key
//! space into contiguous ranges, one per memory node, each node with its
//! own pool and retraining agent holding only its range; a
//! [`ClusterClient`] is one [`KvClient`] per node (each with its own
//! engine, so a node that dies stalls nothing of the others), and its
//! [`ClusterSession`]s route every operation by key. The invariant: *a
//! key lives in the pool of the node its range names, and only there*
//! (every write goes through the routing), so a get asks one node, and a
//! scan reads the nodes' ranges in key order, going on to the next node
//! where one node's range ends.
//!
//! # The partition map
//!
//! Node `i` serves `[low(i), low(i + 1) − 1]` (the last one up to
//! `u64::MAX`); node 0's range starts at 0. The boundaries come from the
//! data set's quantiles at load ([`PartitionMap::balanced`]), so the
//! nodes hold the same number of keys (±1). Every node is given the whole
//! data set's description and computes the map itself; a compute node
//! checks that they all name the same map, version included, before it
//! routes anything (`rolex bench --memnode A,B,C` does), and caches it.
//! The text form ([`PartitionMap::encode`]) is what nodes announce.
//!
//! # Moving a boundary (a rebalance; not built)
//!
//! The version is what makes a later move safe. To move the boundary
//! between nodes `i` and `i + 1` from `b` to `b'` (say `b' < b`: keys
//! `[b', b − 1]` go to `i + 1`):
//! 1. Both nodes agree on map `v + 1` and publish it beside `v` (a word in
//!    each superblock: "moving `[b', b − 1]` to node `i + 1`, map `v + 1`").
//! 2. Node `i` freezes the chains that cover `[b', b − 1]` (as retraining
//!    does, with a deadline), copies their keys into node `i + 1`'s pool
//!    through ordinary inserts (node `i + 1` accepts them: its range
//!    already includes them in `v + 1`), then switches its superblock to
//!    `v + 1` and retires the copied chains (grace period as for any
//!    retired record).
//! 3. A compute node reads the map version in the same batch as its first
//!    READ on a node (as a get reads the directory word): a node whose
//!    version is newer than its cached map makes it re-read the map from
//!    any node and redo the operation; a write that meets a frozen chain
//!    backs off as it does during retraining. Scans re-route at the
//!    boundary they meet in the map they hold, and a scan that saw `v` on
//!    one node and `v + 1` on the next restarts from its cursor.
//!
//! Nothing of this is built: the version is checked for agreement only.
//!
//! # A node down
//!
//! An operation whose key range is on a node that failed with an error of
//! its peer (failed, gone, a completion error, a timeout) marks the node
//! down: that operation fails with [`KvError::MemoryNode`] naming the
//! node, and every later one on its range fails at once with
//! [`KvError::MemoryNodeDown`] (nothing posted). The other nodes' ranges
//! go on. A cluster of one node is its [`KvClient`] unchanged: errors are
//! not wrapped and no node is ever marked down.
//!
//! # Counting
//!
//! Each node's client counts the operations of its sessions as always;
//! [`ClusterClient::stats`] adds them up and counts an operation that
//! visited several nodes (a scan across a boundary) once, with the round
//! trips of all its visits. [`ClusterClient::node_stats`] gives one
//! node's counters (its visits). A call that reads or writes on several
//! nodes at once ([`ClusterSession::get_many`], [`ClusterSession::run_many`])
//! posts each round on every node before it waits on any: it takes the
//! round trips of its busiest node, while each node counts its own (so
//! the summed count is the round trips posted, not those waited for).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use rolex_engine::TransferError;

use crate::client::KvClient;
use crate::error::KvError;
use crate::session::{Answer, KvSession, Request, ScanSpec, Scanned, ValueAnswer, ValueRequest};
use crate::stats::{KvOp, KvStats, ModelBytes};

/// A call of scans on several nodes' sessions at once
/// ([`KvSession::scan_many_on`]).
type ScansOn<V> = fn(&mut [&mut KvSession], &[&[ScanSpec]]) -> Vec<Result<Scanned<V>, KvError>>;

/// Which memory node serves which key range (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionMap {
    version: u64,
    /// Each node's lowest key; `lows[0] == 0`, strictly increasing.
    lows: Vec<u64>,
}

/// A partition map that cannot be built or decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PartitionMapError {
    /// A map needs at least one node.
    NoNodes,
    /// Node 0's range must start at key 0.
    FirstNotZero {
        /// The low bound given.
        low: u64,
    },
    /// The low bounds do not increase at this node.
    NotIncreasing {
        /// The node.
        node: usize,
        /// Its low bound.
        low: u64,
        /// The previous node's.
        previous: u64,
    },
    /// The text form is malformed.
    Malformed {
        /// What was wrong.
        what: &'static str,
        /// The text.
        text: String,
    },
}

impl fmt::Display for PartitionMapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoNodes => f.write_str("a partition map needs at least one node"),
            Self::FirstNotZero { low } => {
                write!(f, "node 0's range must start at key 0, not {low}")
            }
            Self::NotIncreasing {
                node,
                low,
                previous,
            } => write!(
                f,
                "node {node}'s range starts at {low}, not above node {}'s start {previous}",
                node - 1
            ),
            Self::Malformed { what, text } => write!(f, "partition map {text:?}: {what}"),
        }
    }
}

impl std::error::Error for PartitionMapError {}

impl PartitionMap {
    /// The map of version `version` whose node `i` starts at `lows[i]`.
    pub fn new(version: u64, lows: Vec<u64>) -> Result<Self, PartitionMapError> {
        match lows.first() {
            None => return Err(PartitionMapError::NoNodes),
            Some(&low) if low != 0 => return Err(PartitionMapError::FirstNotZero { low }),
            Some(_) => {}
        }
        if let Some(i) = lows.windows(2).position(|w| w[0] >= w[1]) {
            return Err(PartitionMapError::NotIncreasing {
                node: i + 1,
                low: lows[i + 1],
                previous: lows[i],
            });
        }
        Ok(Self { version, lows })
    }

    /// One node serving every key (version 1).
    pub fn single() -> Self {
        Self {
            version: 1,
            lows: vec![0],
        }
    }

    /// Version 1 of a map of `nodes` nodes that hold the same number of
    /// `keys` (sorted, distinct) each, ±1: node `i ≥ 1` starts at key
    /// `keys[i·len/nodes]`. With fewer keys than nodes (an empty store)
    /// the key space is cut evenly instead.
    pub fn balanced(keys: &[u64], nodes: usize) -> Result<Self, PartitionMapError> {
        if nodes == 0 {
            return Err(PartitionMapError::NoNodes);
        }
        let lows: Vec<u64> = if keys.len() >= nodes {
            let mut lows = vec![0];
            lows.extend((1..nodes).map(|i| keys[i * keys.len() / nodes]));
            lows
        } else {
            let step = u64::MAX / nodes as u64;
            (0..nodes as u64).map(|i| i * step).collect()
        };
        // Unsorted or repeated keys surface here, as an error.
        Self::new(1, lows)
    }

    /// The map's version.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Nodes in the map.
    pub fn nodes(&self) -> usize {
        self.lows.len()
    }

    /// The node whose range holds `key`.
    pub fn route(&self, key: u64) -> usize {
        // lows[0] == 0 ≤ key: at least one low bound is ≤ key.
        self.lows.partition_point(|&lo| lo <= key) - 1
    }

    /// Node `node`'s key range, inclusive (`None`: no such node).
    pub fn range(&self, node: usize) -> Option<(u64, u64)> {
        let lo = *self.lows.get(node)?;
        let hi = self.lows.get(node + 1).map_or(u64::MAX, |&next| next - 1);
        Some((lo, hi))
    }

    /// How many of `keys` each node's range holds.
    pub fn count(&self, keys: impl IntoIterator<Item = u64>) -> Vec<u64> {
        let mut per = vec![0; self.nodes()];
        for k in keys {
            per[self.route(k)] += 1;
        }
        per
    }

    /// The text form: `VERSION:LOW,LOW,…` (decimal, every node's low
    /// bound, node 0's `0` first).
    pub fn encode(&self) -> String {
        let lows: Vec<String> = self.lows.iter().map(u64::to_string).collect();
        format!("{}:{}", self.version, lows.join(","))
    }

    /// Parses the text form; names what was wrong.
    pub fn decode(text: &str) -> Result<Self, PartitionMapError> {
        let bad = |what| PartitionMapError::Malformed {
            what,
            text: text.to_string(),
        };
        let (version, lows) = text.split_once(':').ok_or(bad("no VERSION: prefix"))?;
        let version = version
            .parse()
            .map_err(|_| bad("the version is not a number"))?;
        let lows = lows
            .split(',')
            .map(|l| l.parse::<u64>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| bad("a low bound is not a number"))?;
        Self::new(version, lows)
    }
}

/// One memory node of a cluster, as a compute node connected to it.
#[derive(Clone, Debug)]
pub struct ClusterNode {
    /// How errors name it (its bootstrap address, or a local name).
    pub name: String,
    /// The client connected to its pool.
    pub client: KvClient,
}

/// What every session of a cluster client shares.
struct ClusterShared {
    map: PartitionMap,
    nodes: Vec<NodeState>,
    /// Per operation kind (as [`KvOp::ALL`]): visits of a node beyond an
    /// operation's first, which the nodes' clients counted as operations.
    extra_visits: [AtomicU64; 5],
}

struct NodeState {
    name: String,
    client: KvClient,
    /// The failure that showed the node gone, once one did.
    down: OnceLock<KvError>,
}

impl Drop for NodeState {
    fn drop(&mut self) {
        // A node known gone: its client's drop must not wait on it to give
        // value space back (see `KvClient::close`).
        if self.down.get().is_some() {
            self.client.abandon_values();
        }
    }
}

/// A compute node of a cluster of memory nodes: one [`KvClient`] per
/// node, and the partition map that routes keys to them (module docs).
/// Cheap to clone; open one [`ClusterSession`] per thread.
#[derive(Clone)]
pub struct ClusterClient {
    shared: Arc<ClusterShared>,
}

impl fmt::Debug for ClusterClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterClient")
            .field("map", &self.shared.map.encode())
            .field(
                "nodes",
                &self
                    .shared
                    .nodes
                    .iter()
                    .map(|n| &n.name)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl ClusterClient {
    /// A cluster client routing by `map` to `nodes`, in map order (node
    /// `i` serves `map.range(i)`).
    pub fn new(map: PartitionMap, nodes: Vec<ClusterNode>) -> Result<Self, KvError> {
        if nodes.len() != map.nodes() {
            return Err(KvError::BadConfig {
                field: "nodes",
                reason: "a cluster needs exactly one client per node of its partition map",
            });
        }
        Ok(Self {
            shared: Arc::new(ClusterShared {
                map,
                nodes: nodes
                    .into_iter()
                    .map(|n| NodeState {
                        name: n.name,
                        client: n.client,
                        down: OnceLock::new(),
                    })
                    .collect(),
                extra_visits: Default::default(),
            }),
        })
    }

    /// A cluster of the one node `client` serves (every key).
    pub fn single(client: KvClient) -> Self {
        Self {
            shared: Arc::new(ClusterShared {
                map: PartitionMap::single(),
                nodes: vec![NodeState {
                    name: "memory node".into(),
                    client,
                    down: OnceLock::new(),
                }],
                extra_visits: Default::default(),
            }),
        }
    }

    /// A session for one thread: a [`KvSession`] on every node.
    pub fn session(&self) -> Result<ClusterSession, KvError> {
        let sessions = self
            .shared
            .nodes
            .iter()
            .map(|n| n.client.session())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ClusterSession {
            shared: self.shared.clone(),
            sessions,
        })
    }

    /// The partition map this client routes by.
    pub fn map(&self) -> &PartitionMap {
        &self.shared.map
    }

    /// Memory nodes in the cluster.
    pub fn nodes(&self) -> usize {
        self.shared.nodes.len()
    }

    /// Node `node`'s client (`None`: no such node).
    pub fn node(&self, node: usize) -> Option<&KvClient> {
        self.shared.nodes.get(node).map(|n| &n.client)
    }

    /// Node `node`'s name (`None`: no such node).
    pub fn node_name(&self, node: usize) -> Option<&str> {
        self.shared.nodes.get(node).map(|n| n.name.as_str())
    }

    /// Whether node `node` was found gone (see the module docs).
    pub fn is_down(&self, node: usize) -> bool {
        self.shared
            .nodes
            .get(node)
            .is_some_and(|n| n.down.get().is_some())
    }

    /// Whether every node's fabric keeps posting order.
    pub fn ordered(&self) -> bool {
        self.shared.nodes.iter().all(|n| n.client.ordered())
    }

    /// [`KvClient::close`] on every node not known down (whose held value
    /// space is forgotten instead); returns the bytes given back, or the
    /// first error after trying every node.
    pub fn close(&self) -> Result<u64, KvError> {
        let mut given = 0;
        let mut first = None;
        for (node, n) in self.shared.nodes.iter().enumerate() {
            if n.down.get().is_some() {
                n.client.abandon_values();
                continue;
            }
            match n.client.close() {
                Ok(b) => given += b,
                Err(error) => {
                    first.get_or_insert(KvError::MemoryNode {
                        node,
                        name: n.name.clone(),
                        error: Box::new(error),
                    });
                }
            }
        }
        first.map_or(Ok(given), Err)
    }

    /// Chain locks this client may still hold, over every node.
    pub fn locks_maybe_held(&self) -> usize {
        self.shared
            .nodes
            .iter()
            .map(|n| n.client.locks_maybe_held())
            .sum()
    }

    /// Bytes cached for every node.
    pub fn model_bytes(&self) -> ModelBytes {
        let mut b = ModelBytes::default();
        for n in &self.shared.nodes {
            let m = n.client.model_bytes();
            b.total += m.total;
            b.learned += m.learned;
        }
        b
    }

    /// Node `node`'s counters: every visit of its sessions counted as an
    /// operation (`None`: no such node).
    pub fn node_stats(&self, node: usize) -> Option<KvStats> {
        self.shared.nodes.get(node).map(|n| n.client.stats())
    }

    /// Every node's counters summed, an operation that visited several
    /// nodes counted once (module docs).
    pub fn stats(&self) -> KvStats {
        let mut s = KvStats::default();
        for n in &self.shared.nodes {
            s.merge(&n.client.stats());
        }
        for (o, extra) in s.per_op.iter_mut().zip(&self.shared.extra_visits) {
            o.ops = o.ops.saturating_sub(extra.load(Relaxed));
        }
        s
    }
}

/// One session's gets ([`KvSession::get_many`] or its values form).
type OneGets<T> = fn(&mut KvSession, &[u64]) -> Result<Vec<Option<T>>, KvError>;

/// Several sessions' gets at once, `keys[i]` on `sessions[i]`
/// ([`KvSession::get_many`]'s, across nodes): one result per session.
type ManyGets<T> = fn(&mut [&mut KvSession], &[&[u64]]) -> Vec<Result<Vec<Option<T>>, KvError>>;

/// Whether `e` says the node's peer failed or vanished (not a problem of
/// the operation or of this client). A peer that refused every post for
/// the whole operation timeout (`PeerNotReady`) counts as gone as one
/// that never completed an operation (`Timeout`) does: over
/// `tcp;ofi_rxm` that is what a memory node killed mid-run looks like.
fn peer_gone(e: &KvError) -> bool {
    match e {
        KvError::Transfer { error, .. } => matches!(
            error,
            TransferError::PeerFailed { .. }
                | TransferError::UnknownPeer { .. }
                | TransferError::FabricCompletion { .. }
                | TransferError::Timeout { .. }
                | TransferError::PeerNotReady { .. }
                | TransferError::LostCompletion
        ),
        KvError::Indeterminate(e) => peer_gone(e),
        KvError::LockMaybeHeld { release, after, .. } => {
            peer_gone(release) || after.as_deref().is_some_and(peer_gone)
        }
        _ => false,
    }
}

/// One thread's session on a cluster: a [`KvSession`] per node. The same
/// operations as [`KvSession`], routed by key; scans and ranges cross the
/// nodes' ranges in key order. Not atomic across nodes (as a scan is not
/// atomic on one).
pub struct ClusterSession {
    shared: Arc<ClusterShared>,
    sessions: Vec<KvSession>,
}

impl fmt::Debug for ClusterSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterSession")
            .field("nodes", &self.sessions.len())
            .finish_non_exhaustive()
    }
}

impl ClusterSession {
    /// Runs `f` on node `node`'s session: at once, for a cluster of one;
    /// else refused if the node is down, its error named by the node (and
    /// marking it down if it says the node is gone).
    fn on<T>(
        &mut self,
        node: usize,
        f: impl FnOnce(&mut KvSession) -> Result<T, KvError>,
    ) -> Result<T, KvError> {
        let Some(session) = self.sessions.get_mut(node) else {
            return Err(KvError::BadConfig {
                field: "node",
                reason: "routed to a node the cluster does not have",
            });
        };
        if self.shared.nodes.len() == 1 {
            return f(session);
        }
        let state = &self.shared.nodes[node];
        if let Some(cause) = state.down.get() {
            return Err(KvError::MemoryNodeDown {
                node,
                name: state.name.clone(),
                range: self.shared.map.range(node).unwrap_or((0, u64::MAX)),
                cause: Box::new(cause.clone()),
            });
        }
        let r = f(session);
        r.map_err(|error| self.node_error(node, error))
    }

    /// `error`, met on node `node` of a cluster of several, named by the
    /// node (and marking it down if it says the node is gone).
    fn node_error(&self, node: usize, error: KvError) -> KvError {
        let Some(state) = self.shared.nodes.get(node) else {
            return error;
        };
        if self.shared.nodes.len() == 1 {
            return error;
        }
        if peer_gone(&error) {
            let _ = state.down.set(error.clone());
        }
        KvError::MemoryNode {
            node,
            name: state.name.clone(),
            error: Box::new(error),
        }
    }

    /// Counts a visit of a node beyond an operation's first.
    fn extra_visit(&self, op: KvOp) {
        self.shared.extra_visits[KvOp::ALL.iter().position(|&o| o == op).unwrap_or(0)]
            .fetch_add(1, Relaxed);
    }

    /// The node that serves `key`.
    pub fn node_of(&self, key: u64) -> usize {
        self.shared.map.route(key)
    }

    /// As [`KvSession::get`].
    pub fn get(&mut self, key: u64) -> Result<Option<u64>, KvError> {
        self.on(self.node_of(key), |s| s.get(key))
    }

    /// As [`KvSession::get_reads`], with the node whose pool they read.
    pub fn get_reads(&mut self, key: u64) -> Result<(usize, Vec<(u64, u64)>), KvError> {
        let node = self.node_of(key);
        self.on(node, |s| s.get_reads(key)).map(|r| (node, r))
    }

    /// As [`KvSession::get_many`]: the keys of each node read together
    /// (one batch per node that holds some of them, every node's batch
    /// posted before any is waited for: the round trips of one node, not
    /// their sum), answers in `keys`' order. The first error in node
    /// order is the call's (each node's is named by it, as a single
    /// operation's).
    pub fn get_many(&mut self, keys: &[u64]) -> Result<Vec<Option<u64>>, KvError> {
        self.many(keys, KvSession::get_many, KvSession::get_many_on)
    }

    /// As [`KvSession::get_many_values`], per node as [`Self::get_many`].
    pub fn get_many_values(&mut self, keys: &[u64]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        self.many(
            keys,
            KvSession::get_many_values,
            KvSession::get_many_values_on,
        )
    }

    /// Each node's share of `items` (by `key`): the indexes of its items
    /// and the items, for every node that serves some.
    fn shares<T: Copy>(
        &self,
        items: &[T],
        key: impl Fn(&T) -> u64,
    ) -> Vec<(usize, Vec<usize>, Vec<T>)> {
        let mut per: Vec<(Vec<usize>, Vec<T>)> =
            vec![(Vec::new(), Vec::new()); self.sessions.len()];
        for (i, item) in items.iter().enumerate() {
            if let Some((idx, mine)) = per.get_mut(self.node_of(key(item))) {
                idx.push(i);
                mine.push(*item);
            }
        }
        per.into_iter()
            .enumerate()
            .filter(|(_, (idx, _))| !idx.is_empty())
            .map(|(node, (idx, mine))| (node, idx, mine))
            .collect()
    }

    /// The error of a call on node `node` while it is down (`None`: it is
    /// not known down).
    fn down_error(&self, node: usize) -> Option<KvError> {
        let state = self.shared.nodes.get(node)?;
        let cause = state.down.get()?;
        Some(KvError::MemoryNodeDown {
            node,
            name: state.name.clone(),
            range: self.shared.map.range(node).unwrap_or((0, u64::MAX)),
            cause: Box::new(cause.clone()),
        })
    }

    /// Runs `f` on the sessions of the nodes in `shares` (node, item
    /// indexes, items) that are not down, all in one call, and returns
    /// each share's outcome, in `shares`' order: a node down refuses its
    /// share at once, a node's error is named by it (marking it down if it
    /// says the node is gone), as [`Self::on`] does.
    fn on_each<T, A>(
        &mut self,
        shares: &[(usize, Vec<usize>, Vec<T>)],
        f: impl FnOnce(&mut [&mut KvSession], &[&[T]]) -> Vec<Result<A, KvError>>,
    ) -> Vec<Result<A, KvError>> {
        let several = self.shared.nodes.len() > 1;
        let down: Vec<Option<KvError>> = shares
            .iter()
            .map(|(node, ..)| several.then(|| self.down_error(*node)).flatten())
            .collect();
        let mut sessions: Vec<&mut KvSession> = Vec::with_capacity(shares.len());
        let mut mine: Vec<&[T]> = Vec::with_capacity(shares.len());
        let mut wanted = shares
            .iter()
            .zip(&down)
            .filter(|(_, d)| d.is_none())
            .map(|((node, _, items), _)| (*node, items.as_slice()))
            .peekable();
        for (node, s) in self.sessions.iter_mut().enumerate() {
            if wanted.peek().is_some_and(|(n, _)| *n == node) {
                if let Some((_, items)) = wanted.next() {
                    sessions.push(s);
                    mine.push(items);
                }
            }
        }
        let mut got = f(&mut sessions, &mine).into_iter();
        drop(sessions);
        shares
            .iter()
            .zip(down)
            .map(|((node, ..), down)| match down {
                Some(e) => Err(e),
                None => got
                    .next()
                    .unwrap_or(Err(KvError::BadConfig {
                        field: "node",
                        reason: "routed to a node the cluster does not have",
                    }))
                    .map_err(|e| self.node_error(*node, e)),
            })
            .collect()
    }

    /// `f` on each node's share of `keys`, all nodes' batches together,
    /// the answers put back in order; the first error in node order is
    /// the call's. Keys of one node only: `one` on its session.
    fn many<T: Clone>(
        &mut self,
        keys: &[u64],
        one: OneGets<T>,
        f: ManyGets<T>,
    ) -> Result<Vec<Option<T>>, KvError> {
        let shares = self.shares(keys, |&k| k);
        if let [(node, _, mine)] = shares.as_slice() {
            return self.on(*node, |s| one(s, mine));
        }
        let got = self.on_each(&shares, f);
        let mut out: Vec<Option<T>> = vec![None; keys.len()];
        for ((_, idx, _), got) in shares.into_iter().zip(got) {
            for (i, v) in idx.into_iter().zip(got?) {
                out[i] = v;
            }
        }
        Ok(out)
    }

    /// As [`KvSession::run_many`]: each node's requests run together, and
    /// every node's batches together (each round posted on every node
    /// that serves some of the requests before any is waited for: the
    /// round trips of the busiest node, not their sum; requests of
    /// distinct nodes touch distinct keys), answers in `reqs`' order.
    /// Each error is named by its node, as a single operation's (and a
    /// node whose error says it is gone is marked down); a node's share
    /// that ran nothing (the node is down, or its session's posted unlock
    /// failed) answers each of its requests with that error. One node's
    /// errors never touch another node's requests or locks.
    pub fn run_many(&mut self, reqs: &[Request]) -> Vec<Answer> {
        self.spread(
            reqs,
            |r| r.key(),
            KvSession::run_many,
            KvSession::run_many_on,
        )
    }

    /// As [`KvSession::run_many_values`], across nodes as
    /// [`Self::run_many`]: each round (and the round of the gets'
    /// out-of-line values) posted on every node that serves some of the
    /// requests before any is waited for.
    pub fn run_many_values(&mut self, reqs: &[ValueRequest<'_>]) -> Vec<ValueAnswer> {
        self.spread(
            reqs,
            |r| r.key(),
            KvSession::run_many_values,
            KvSession::run_many_values_on,
        )
    }

    /// A pipelined call of `reqs` cut into each node's share: `one` on
    /// the node's session when a single node serves them all, else
    /// `many` on every node's session at once; answers in `reqs`' order,
    /// each error named by its node (see [`Self::run_many`]).
    fn spread<T: Copy, A: Clone>(
        &mut self,
        reqs: &[T],
        key: impl Fn(&T) -> u64,
        one: impl FnOnce(&mut KvSession, &[T]) -> Result<Vec<Result<A, KvError>>, KvError>,
        many: impl FnOnce(
            &mut [&mut KvSession],
            &[&[T]],
        ) -> Vec<Result<Vec<Result<A, KvError>>, KvError>>,
    ) -> Vec<Result<A, KvError>> {
        let shares = self.shares(reqs, key);
        let got = match shares.as_slice() {
            [(node, _, mine)] => vec![self.on(*node, |s| one(s, mine))],
            _ => self.on_each(&shares, many),
        };
        let mut out: Vec<Option<Result<A, KvError>>> = vec![None; reqs.len()];
        for ((node, idx, _), got) in shares.into_iter().zip(got) {
            match got {
                Ok(got) => {
                    for (i, a) in idx.into_iter().zip(got) {
                        out[i] = Some(a.map_err(|e| self.node_error(node, e)));
                    }
                }
                Err(e) => {
                    for i in idx {
                        out[i] = Some(Err(e.clone()));
                    }
                }
            }
        }
        out.into_iter().flatten().collect()
    }

    /// As [`KvSession::insert`].
    pub fn insert(&mut self, key: u64, value: u64) -> Result<Option<u64>, KvError> {
        self.on(self.node_of(key), |s| s.insert(key, value))
    }

    /// As [`KvSession::update`].
    pub fn update(&mut self, key: u64, value: u64) -> Result<Option<u64>, KvError> {
        self.on(self.node_of(key), |s| s.update(key, value))
    }

    /// As [`KvSession::delete`].
    pub fn delete(&mut self, key: u64) -> Result<Option<u64>, KvError> {
        self.on(self.node_of(key), |s| s.delete(key))
    }

    /// As [`KvSession::put`].
    pub fn put(&mut self, key: u64, value: &[u8]) -> Result<bool, KvError> {
        self.on(self.node_of(key), |s| s.put(key, value))
    }

    /// As [`KvSession::update_value`].
    pub fn update_value(&mut self, key: u64, value: &[u8]) -> Result<bool, KvError> {
        self.on(self.node_of(key), |s| s.update_value(key, value))
    }

    /// As [`KvSession::remove`].
    pub fn remove(&mut self, key: u64) -> Result<bool, KvError> {
        self.on(self.node_of(key), |s| s.remove(key))
    }

    /// As [`KvSession::get_value`].
    pub fn get_value(&mut self, key: u64) -> Result<Option<Vec<u8>>, KvError> {
        self.on(self.node_of(key), |s| s.get_value(key))
    }

    /// As [`KvSession::get_into`].
    pub fn get_into(&mut self, key: u64, out: &mut Vec<u8>) -> Result<bool, KvError> {
        self.on(self.node_of(key), |s| s.get_into(key, out))
    }

    /// As [`KvSession::scan`], across the nodes' ranges in key order.
    pub fn scan(&mut self, from: u64, n: usize) -> Result<Vec<(u64, u64)>, KvError> {
        self.scan_with(from, n, KvSession::scan)
    }

    /// As [`KvSession::scan_values`], across the nodes' ranges in key
    /// order.
    pub fn scan_values(&mut self, from: u64, n: usize) -> Result<Vec<(u64, Vec<u8>)>, KvError> {
        self.scan_with(from, n, KvSession::scan_values)
    }

    /// As [`KvSession::scan_many`], across the nodes' ranges in key order:
    /// each scan starts on the node of its `from` and goes on from the
    /// next nodes' range starts while it has fewer than its `n` pairs (as
    /// [`Self::scan`]). The scans of every node are read together, each
    /// round posted on every node before any is waited for: `D` short
    /// scans cost the round trips of one, wherever they start. The first
    /// error in node order is the call's (named by its node).
    pub fn scan_many(&mut self, scans: &[(u64, usize)]) -> Result<Scanned<u64>, KvError> {
        self.scans(scans, KvSession::scan_many_on)
    }

    /// As [`KvSession::scan_many_values`], across the nodes' ranges as
    /// [`Self::scan_many`].
    pub fn scan_many_values(
        &mut self,
        scans: &[(u64, usize)],
    ) -> Result<Scanned<Vec<u8>>, KvError> {
        self.scans(scans, KvSession::scan_many_values_on)
    }

    /// As [`KvSession::range`], across the nodes' ranges in key order.
    pub fn range(&mut self, lo: u64, hi: u64) -> Result<Vec<(u64, u64)>, KvError> {
        self.range_with(lo, hi, KvSession::range)
    }

    /// As [`KvSession::range_values`], across the nodes' ranges in key
    /// order.
    pub fn range_values(&mut self, lo: u64, hi: u64) -> Result<Vec<(u64, Vec<u8>)>, KvError> {
        self.range_with(lo, hi, KvSession::range_values)
    }

    /// As [`KvSession::flush`], on every node that is not down; the first
    /// error is returned once every node was flushed.
    pub fn flush(&mut self) -> Result<(), KvError> {
        let mut first = Ok(());
        for node in 0..self.sessions.len() {
            if self.shared.nodes[node].down.get().is_some() {
                continue;
            }
            if let Err(e) = self.on(node, KvSession::flush) {
                first = first.and(Err(e));
            }
        }
        first
    }

    /// Up to `n` pairs from `from`: the node of `from` first, then the
    /// next nodes from their range's start while fewer than `n` were
    /// found. A node's answer is cut at its range's end (keys beyond it
    /// are never written there; this keeps the order if one were).
    fn scan_with<V>(
        &mut self,
        from: u64,
        n: usize,
        mut scan: impl FnMut(&mut KvSession, u64, usize) -> Result<Vec<(u64, V)>, KvError>,
    ) -> Result<Vec<(u64, V)>, KvError> {
        if n == 0 {
            return Err(KvError::ScanCountZero);
        }
        let mut node = self.node_of(from);
        let mut at = from;
        let mut out = Vec::new();
        loop {
            let (_, hi) = self.shared.map.range(node).unwrap_or((at, u64::MAX));
            let want = n - out.len();
            let found = self.on(node, |s| scan(s, at, want))?;
            out.extend(found.into_iter().filter(|(k, _)| *k <= hi));
            node += 1;
            match self.shared.map.range(node) {
                Some((lo, _)) if out.len() < n => {
                    at = lo;
                    self.extra_visit(KvOp::Scan);
                }
                _ => return Ok(out),
            }
        }
    }

    /// The scans `(from, n)` of a [`Self::scan_many`] call: in steps, each
    /// running every scan still short of its `n` pairs on one node (`on`:
    /// every node's share together), cut at the node's range end; a scan
    /// still short then goes on from the next node's range start.
    fn scans<V: Clone>(
        &mut self,
        scans: &[(u64, usize)],
        on: ScansOn<V>,
    ) -> Result<Scanned<V>, KvError> {
        if scans.iter().any(|&(_, n)| n == 0) {
            return Err(KvError::ScanCountZero);
        }
        let mut out: Scanned<V> = vec![Vec::new(); scans.len()];
        // The scans still short: each one's index and where it goes on.
        let mut going: Vec<(usize, u64)> = scans
            .iter()
            .enumerate()
            .map(|(i, &(from, _))| (i, from))
            .collect();
        while !going.is_empty() {
            let shares: Vec<(usize, Vec<usize>, Vec<ScanSpec>)> = self
                .shares(&going, |&(_, at)| at)
                .into_iter()
                .map(|(node, idx, mine)| {
                    let hi = self.shared.map.range(node).map_or(u64::MAX, |(_, hi)| hi);
                    let specs = mine
                        .iter()
                        .map(|&(i, from)| ScanSpec {
                            from,
                            hi,
                            n: scans[i].1 - out[i].len(),
                        })
                        .collect();
                    (node, idx, specs)
                })
                .collect();
            let got = self.on_each(&shares, on);
            let mut next = Vec::new();
            for ((node, idx, _), got) in shares.iter().zip(got) {
                for (&g, found) in idx.iter().zip(got?) {
                    let i = going[g].0;
                    out[i].extend(found);
                    let next_range = self.shared.map.range(node + 1);
                    if let Some((lo, _)) = next_range.filter(|_| out[i].len() < scans[i].1) {
                        self.extra_visit(KvOp::Scan);
                        next.push((i, lo));
                    }
                }
            }
            going = next;
        }
        Ok(out)
    }

    /// Every pair in `[lo, hi]`: each node's share of it, in node order.
    fn range_with<V>(
        &mut self,
        lo: u64,
        hi: u64,
        mut range: impl FnMut(&mut KvSession, u64, u64) -> Result<Vec<(u64, V)>, KvError>,
    ) -> Result<Vec<(u64, V)>, KvError> {
        if lo > hi {
            return Err(KvError::InvalidRange { lo, hi });
        }
        let (first, last) = (self.node_of(lo), self.node_of(hi));
        let mut out = Vec::new();
        for node in first..=last {
            let (nlo, nhi) = self.shared.map.range(node).unwrap_or((lo, hi));
            if node > first {
                self.extra_visit(KvOp::Scan);
            }
            out.extend(self.on(node, |s| range(s, lo.max(nlo), hi.min(nhi)))?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn maps_are_checked_and_round_trip() {
        assert_eq!(
            PartitionMap::new(1, vec![]),
            Err(PartitionMapError::NoNodes)
        );
        assert_eq!(
            PartitionMap::new(1, vec![5, 9]),
            Err(PartitionMapError::FirstNotZero { low: 5 })
        );
        let e = PartitionMap::new(1, vec![0, 9, 9]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "node 2's range starts at 9, not above node 1's start 9"
        );
        let m = PartitionMap::new(3, vec![0, 100, 200]).unwrap();
        assert_eq!(m.encode(), "3:0,100,200");
        assert_eq!(PartitionMap::decode(&m.encode()).unwrap(), m);
        assert!(PartitionMap::decode("0,100")
            .unwrap_err()
            .to_string()
            .contains("no VERSION"));
        assert!(PartitionMap::decode("1:0,x").is_err());
        assert_eq!(m.range(0), Some((0, 99)));
        assert_eq!(m.range(2), Some((200, u64::MAX)));
        assert_eq!(m.range(3), None);
        assert_eq!(PartitionMap::single().route(u64::MAX), 0);
    }

    #[test]
    fn an_empty_store_is_cut_evenly() {
        let m = PartitionMap::balanced(&[], 3).unwrap();
        assert_eq!(m.nodes(), 3);
        assert_eq!(m.route(0), 0);
        assert_eq!(m.route(u64::MAX), 2);
        assert_eq!(
            PartitionMap::balanced(&[1, 2], 0),
            Err(PartitionMapError::NoNodes)
        );
    }

    proptest! {
        /// Routing: every key goes to the one node whose range holds it,
        /// and the ranges tile the key space in order.
        #[test]
        fn every_key_routes_to_the_range_that_holds_it(
            mut lows in proptest::collection::btree_set(1u64.., 0..8),
            keys in proptest::collection::vec(any::<u64>(), 1..64),
        ) {
            let mut v = vec![0];
            v.extend(std::mem::take(&mut lows));
            let m = PartitionMap::new(7, v).unwrap();
            let mut next = 0u64;
            for i in 0..m.nodes() {
                let (lo, hi) = m.range(i).unwrap();
                prop_assert_eq!(lo, next);
                prop_assert!(lo <= hi);
                next = hi.wrapping_add(1);
            }
            prop_assert_eq!(next, 0, "the last range ends at u64::MAX");
            for k in keys.into_iter().chain([0, u64::MAX]) {
                let i = m.route(k);
                let (lo, hi) = m.range(i).unwrap();
                prop_assert!(lo <= k && k <= hi);
            }
        }

        /// Balance: quantile boundaries give each node len/N keys, ±1.
        #[test]
        fn balanced_maps_hold_equal_shares(
            keys in proptest::collection::btree_set(any::<u64>(), 0..2000),
            nodes in 1usize..8,
        ) {
            let keys: Vec<u64> = keys.into_iter().collect();
            let m = PartitionMap::balanced(&keys, nodes).unwrap();
            prop_assert_eq!(m.nodes(), nodes);
            if keys.len() >= nodes {
                let per = m.count(keys.iter().copied());
                let (min, max) = (per.iter().min().unwrap(), per.iter().max().unwrap());
                prop_assert!(max - min <= 1, "{:?}", per);
            }
        }
    }
}
