//! The topology blob: which model serves which key range.
//!
//! Models are not fixed at bulk load: a retraining may cut a model that
//! grew too large into several, each in a directory slot of its own. The
//! blob lists every model's first key in key order with its directory
//! slot; model `i` of the blob serves `[first_keys[i], first_keys[i + 1] −
//! 1]` (the last one up to `u64::MAX`), so the first keys tile the key
//! space from 0. Compute nodes cache it whole and fit their upper levels
//! over the first keys (`crate::model::Locator`).
//!
//! It changes like a model does, by shadow redirection: the agent writes a
//! new blob in free model-region space, then points the superblock at it
//! (`upper_len` first, then `upper_offset`: one 8-byte write makes it the
//! blob). A compute node reads both words in one READ and the blob in a
//! second; a READ that met the two words half-updated finds a length that
//! does not match the blob's count, or a checksum that does not match, and
//! reads again. The old blob's space is reused only after the agent's
//! grace period, as a retired record's.
//!
//! The invariant [`decode`] establishes: the epoch, the count matching the
//! length, the checksum, first keys strictly increasing from 0, and
//! directory slots all below the capacity given.

#[cfg(feature = "alloc")]
use alloc::vec::Vec;

#[cfg(feature = "alloc")]
use xxhash_rust::xxh3::xxh3_64;

#[cfg(feature = "alloc")]
use super::{Field, LayoutError, Part};

/// Bytes before the entries: count, epoch, checksum.
///
/// ```text
/// offset      size  field
///      0         8  count     models listed, n (at least 1)
///      8         8  epoch     bumped by every change of the topology
///     16         8  checksum  xxh3-64 of bytes [24, end)
///     24        8n  first keys, strictly increasing, the first 0
///  24 + 8n      8n  directory slots, in the same order
/// ```
pub const HEADER_SIZE: u64 = 24;

/// Bytes of a blob listing `count` models.
pub const fn len_for(count: u64) -> Option<u64> {
    match count.checked_mul(16) {
        Some(n) => n.checked_add(HEADER_SIZE),
        None => None,
    }
}

/// The blob listing `entries` (first key, directory slot), in key order,
/// at `epoch`. Not checked here: [`decode`] checks what it reads.
#[cfg(feature = "alloc")]
pub fn encode(epoch: u64, entries: &[(u64, u64)]) -> Vec<u8> {
    let mut body = Vec::with_capacity(entries.len() * 16);
    for (first, _) in entries {
        body.extend_from_slice(&first.to_le_bytes());
    }
    for (_, id) in entries {
        body.extend_from_slice(&id.to_le_bytes());
    }
    let mut out = Vec::with_capacity(HEADER_SIZE as usize + body.len());
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    out.extend_from_slice(&epoch.to_le_bytes());
    out.extend_from_slice(&xxh3_64(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// A decoded blob.
#[cfg(feature = "alloc")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    /// Its epoch.
    pub epoch: u64,
    /// Every model's first key, in key order (the first is 0).
    pub first_keys: Vec<u64>,
    /// Their directory slots.
    pub ids: Vec<u64>,
}

#[cfg(feature = "alloc")]
fn word(bytes: &[u8], i: usize) -> u64 {
    bytes
        .get(8 * i..8 * i + 8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// Decodes and checks a blob (the module docs' invariant): `bytes` must be
/// exactly the blob, and every slot below `directory_capacity`.
#[cfg(feature = "alloc")]
pub fn decode(bytes: &[u8], directory_capacity: u64) -> Result<Topology, LayoutError> {
    let too_short = |needed| LayoutError::TooShort {
        part: Part::UpperLevels,
        needed,
        found: bytes.len() as u64,
    };
    if (bytes.len() as u64) < HEADER_SIZE {
        return Err(too_short(HEADER_SIZE));
    }
    let count = word(bytes, 0);
    let invalid = |field, value| LayoutError::InvalidField { field, value };
    let len = len_for(count).ok_or(invalid(Field::ModelCount, count))?;
    if count == 0 || len != bytes.len() as u64 {
        return Err(invalid(Field::ModelCount, count));
    }
    let body = &bytes[HEADER_SIZE as usize..];
    let sum = xxh3_64(body);
    if sum != word(bytes, 2) {
        return Err(invalid(Field::Checksum, word(bytes, 2)));
    }
    let n = count as usize;
    let first_keys: Vec<u64> = (0..n).map(|i| word(body, i)).collect();
    let ids: Vec<u64> = (0..n).map(|i| word(body, n + i)).collect();
    if first_keys[0] != 0 || first_keys.windows(2).any(|w| w[0] >= w[1]) {
        return Err(invalid(Field::KeyRange, first_keys[0]));
    }
    if let Some(&id) = ids.iter().find(|&&id| id >= directory_capacity) {
        return Err(invalid(Field::DirectoryCapacity, id));
    }
    Ok(Topology {
        epoch: word(bytes, 1),
        first_keys,
        ids,
    })
}

#[cfg(all(test, feature = "alloc"))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_blob_round_trips_and_a_flipped_bit_is_refused() {
        let entries = [(0, 3), (100, 0), (250, 7)];
        let mut b = encode(9, &entries);
        assert_eq!(b.len() as u64, len_for(3).unwrap());
        let t = decode(&b, 8).unwrap();
        assert_eq!(
            (t.epoch, t.first_keys, t.ids),
            (9, vec![0, 100, 250], vec![3, 0, 7])
        );
        assert!(decode(&b, 7).is_err(), "slot 7 beyond a directory of 7");
        assert!(decode(&b[..b.len() - 8], 8).is_err(), "truncated");
        b[30] ^= 1;
        assert!(decode(&b, 8).is_err(), "checksum");
    }

    #[test]
    fn unsorted_or_not_from_zero_is_refused() {
        assert!(decode(&encode(1, &[(1, 0)]), 8).is_err());
        assert!(decode(&encode(1, &[(0, 0), (5, 1), (5, 2)]), 8).is_err());
        assert!(decode(&encode(1, &[]), 8).is_err());
    }

    proptest! {
        #[test]
        fn decoding_any_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&bytes, 16);
        }
    }
}
