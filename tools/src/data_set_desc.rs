//! The description of its data set that a memory node attaches to its
//! bootstrap offer ([`DataSetDesc`]), and its place in a cluster
//! ([`Shard`]). Compute nodes parse it from the offer, `--resume` from
//! the file beside the pool: [`DataSetDesc::parse`] never panics (the
//! fuzz target `data_set_desc` includes this module and `values.rs`).

use rolex_host::kv::PartitionMap;

use crate::values::ValueSize;

/// What a memory node serving other processes loaded, attached to its
/// bootstrap offer so a compute node can check it runs against the data
/// set (and pool shape) it was asked for.
///
/// Text form: `key=value` words separated by spaces — `source` (`dist:D`
/// or `keys`), `n`, `seed`, `keyhash` (FNV-1a of the keys' little-endian
/// bytes, in hex), `leaf_slots`, `fill`, `epsilon`, `values` (the value
/// sizes, `B` or `MIN..MAX`; 8 when absent), `shard` and `map` (a node
/// of a cluster: its index and the node count, `I/N`, and the partition
/// map every node computed from the whole data set,
/// `rolex_kv::cluster::PartitionMap`'s text form; both absent for a lone
/// node) and `lease` (the memory node's lease port, on the bootstrap's
/// address; optional). `n` and `keyhash` are the whole data set's, on
/// every node of a cluster: each node holds its range of it.
#[derive(Debug, Clone, PartialEq)]
pub struct DataSetDesc {
    /// `dist:NAME` for a generated set, `keys` for a file's.
    pub source: String,
    /// Keys loaded.
    pub n: u64,
    /// Generator seed (meaningful for `dist:` sources).
    pub seed: u64,
    /// FNV-1a of the keys.
    pub keyhash: u64,
    /// Slots per leaf.
    pub leaf_slots: u32,
    /// Fill factor at load.
    pub fill: f64,
    /// Error bound of the models.
    pub epsilon: u64,
    /// The values' sizes (`crate::values`).
    pub value_size: ValueSize,
    /// This node's place in a cluster (`None`: a lone node).
    pub shard: Option<Shard>,
    /// The cluster's partition map (with `shard`).
    pub map: Option<PartitionMap>,
    /// Port of the memory node's lease server (on the bootstrap's host),
    /// where each compute process gets the id its chain locks carry.
    pub lease: Option<u16>,
}

/// FNV-1a over the keys' little-endian bytes.
pub fn key_hash(keys: &[u64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for k in keys {
        for b in k.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

impl DataSetDesc {
    /// The text form.
    pub fn encode(&self) -> String {
        let mut s = format!(
            "source={} n={} seed={} keyhash={:016x} leaf_slots={} fill={} epsilon={} values={}",
            self.source,
            self.n,
            self.seed,
            self.keyhash,
            self.leaf_slots,
            self.fill,
            self.epsilon,
            self.value_size
        );
        if let Some(shard) = self.shard {
            s.push_str(&format!(" shard={shard}"));
        }
        if let Some(map) = &self.map {
            s.push_str(&format!(" map={}", map.encode()));
        }
        if let Some(p) = self.lease {
            s.push_str(&format!(" lease={p}"));
        }
        s
    }

    /// This description with what differs between the nodes of one
    /// cluster (the shard index, the lease port) left out: the nodes of a
    /// cluster agree on it.
    pub fn cluster_part(&self) -> DataSetDesc {
        DataSetDesc {
            shard: self.shard.map(|s| Shard { index: 0, ..s }),
            lease: None,
            ..self.clone()
        }
    }

    /// Parses the text form; names what is missing or malformed.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut m = std::collections::HashMap::new();
        for w in s.split_whitespace() {
            let (k, v) = w.split_once('=').ok_or_else(|| {
                // The start of it is enough to find it (a stray word
                // may be a whole file's worth of bytes).
                let start: String = w.chars().take(64).collect();
                let more = if start.len() < w.len() { "…" } else { "" };
                format!("data-set description word {start:?}{more} is not key=value")
            })?;
            m.insert(k, v);
        }
        let get = |k: &str| {
            m.get(k)
                .copied()
                .ok_or_else(|| format!("data-set description lacks {k}"))
        };
        let bad = |k: &str| format!("data-set description: {k} is malformed");
        Ok(DataSetDesc {
            source: get("source")?.to_string(),
            n: get("n")?.parse().map_err(|_| bad("n"))?,
            seed: get("seed")?.parse().map_err(|_| bad("seed"))?,
            keyhash: u64::from_str_radix(get("keyhash")?, 16).map_err(|_| bad("keyhash"))?,
            leaf_slots: get("leaf_slots")?.parse().map_err(|_| bad("leaf_slots"))?,
            fill: get("fill")?.parse().map_err(|_| bad("fill"))?,
            epsilon: get("epsilon")?.parse().map_err(|_| bad("epsilon"))?,
            value_size: match m.get("values") {
                Some(v) => v.parse().map_err(|_| bad("values"))?,
                None => ValueSize::default(),
            },
            shard: match m.get("shard") {
                Some(v) => Some(
                    v.parse()
                        .map_err(|e| format!("data-set description: {e}"))?,
                ),
                None => None,
            },
            map: match m.get("map") {
                Some(v) => Some(
                    PartitionMap::decode(v).map_err(|e| format!("data-set description: {e}"))?,
                ),
                None => None,
            },
            lease: match m.get("lease") {
                Some(p) => Some(p.parse().map_err(|_| bad("lease"))?),
                None => None,
            },
        })
    }
}

/// A memory node's place in a cluster: node `index` of `count`, serving
/// the `index`-th key range of the partition map (`--shard I/N`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// This node's index, `0..count`.
    pub index: usize,
    /// Nodes in the cluster.
    pub count: usize,
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl std::str::FromStr for Shard {
    type Err = String;

    /// `I/N`, with `I < N` and `N` at least 1.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("shard {s:?} is not I/N (this node's index, then the node count)");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count): (usize, usize) = (
            i.trim().parse().map_err(|_| bad())?,
            n.trim().parse().map_err(|_| bad())?,
        );
        if count == 0 || index >= count {
            return Err(format!(
                "shard {s:?}: the index must be below the node count (0/{count} … {}/{count})",
                count.saturating_sub(1)
            ));
        }
        Ok(Shard { index, count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_set_descriptions_round_trip_and_bad_ones_are_named() {
        let d = DataSetDesc {
            source: "dist:uniform".into(),
            n: 1000,
            seed: 7,
            keyhash: key_hash(&[1, 2, 3]),
            leaf_slots: 16,
            fill: 0.75,
            epsilon: 32,
            value_size: "64..65536".parse().unwrap(),
            shard: None,
            map: None,
            lease: Some(4000),
        };
        assert_eq!(DataSetDesc::parse(&d.encode()).unwrap(), d);
        let node = DataSetDesc {
            shard: Some("2/3".parse().unwrap()),
            map: Some(PartitionMap::new(1, vec![0, 10, 20]).unwrap()),
            ..d.clone()
        };
        assert!(node.encode().contains(" shard=2/3 map=1:0,10,20 "));
        assert_eq!(DataSetDesc::parse(&node.encode()).unwrap(), node);
        assert_eq!(
            node.cluster_part().shard,
            Some("0/3".parse().unwrap()),
            "the index is what differs between the nodes"
        );
        assert!("3/3"
            .parse::<Shard>()
            .unwrap_err()
            .contains("below the node count"));
        assert!("x".parse::<Shard>().unwrap_err().contains("not I/N"));
        assert!(
            DataSetDesc::parse(&d.encode().replace("lease=", "map=9:1 lease="))
                .unwrap_err()
                .contains("start at key 0")
        );
        let old = d.encode().replace(" values=64..65536", "");
        assert_eq!(
            DataSetDesc::parse(&old).unwrap().value_size,
            ValueSize::default(),
            "a description without values has 8-byte values"
        );
        assert_ne!(key_hash(&[1, 2, 3]), key_hash(&[1, 2, 4]));
        assert!(DataSetDesc::parse("source=keys n=1")
            .unwrap_err()
            .contains("lacks seed"));
        assert!(DataSetDesc::parse("junk")
            .unwrap_err()
            .contains("key=value"));
    }
}
