//! The values `rolex bench` (and `rolex memnode`, for the data set it
//! loads) store: every value stands for a 64-bit *id* — a key's load value
//! or a write's (`ycsb::load_value`, `ycsb::write_value`), which is what
//! the run's checks reason about — and its bytes are made from the id and
//! the key ([`ValueSize::fill`]).
//!
//! With `--value-size 8` (the default) the bytes are the id itself, stored
//! with the store's `u64` methods, as before values had sizes. Otherwise a
//! value is `--value-size B` bytes, or a length drawn uniformly from
//! `MIN..MAX` by hashing (key, id); its first 8 bytes are the id and the
//! rest a pseudo-random pattern of (key, id), so a value read back names
//! its id and is checked byte for byte ([`ValueSize::decode`]): a torn
//! value, another key's, or a write's that never happened does not pass.
//! Values shorter than 8 bytes cannot carry the id and are refused.

use std::fmt;

use rolex_host::kv::{ClusterSession, KvError, Reply, Request, ValueRequest};

/// The value sizes of a run: `min..=max` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueSize {
    min: usize,
    max: usize,
}

impl Default for ValueSize {
    fn default() -> Self {
        Self { min: 8, max: 8 }
    }
}

impl fmt::Display for ValueSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{}..{}", self.min, self.max)
        }
    }
}

impl std::str::FromStr for ValueSize {
    type Err = String;

    /// `B` or `MIN..MAX` (inclusive), each at least 8 and at most the
    /// store's largest value.
    fn from_str(s: &str) -> Result<Self, String> {
        let num = |t: &str| {
            t.trim()
                .parse::<usize>()
                .map_err(|_| format!("value size {t:?} is not a byte count (B or MIN..MAX)"))
        };
        let (min, max) = match s.split_once("..") {
            Some((a, b)) => (num(a)?, num(b)?),
            None => {
                let n = num(s)?;
                (n, n)
            }
        };
        if min > max {
            return Err(format!("value size range {min}..{max} is empty"));
        }
        if min < 8 {
            return Err(format!(
                "value size {min} is below 8 bytes: a value carries its 8-byte writer id for the run's checks"
            ));
        }
        let limit = rolex_core::layout::MAX_VALUE_LEN;
        if max > limit {
            return Err(format!(
                "value size {max} is above the store's largest value ({limit} bytes)"
            ));
        }
        Ok(Self { min, max })
    }
}

/// A 64-bit mix of `a` and `b` (splitmix64's finaliser).
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl ValueSize {
    /// Whether values are the 8-byte ids themselves (the `u64` methods).
    pub fn is_u64(&self) -> bool {
        self.min == 8 && self.max == 8
    }

    /// Bytes of the largest value.
    pub fn max(&self) -> usize {
        self.max
    }

    /// The length of value `id` of `key`.
    pub fn len_for(&self, key: u64, id: u64) -> usize {
        let span = (self.max - self.min) as u64 + 1;
        self.min + (mix(key, id) % span) as usize
    }

    /// Appends the bytes of value `id` of `key` to `out`.
    pub fn fill(&self, key: u64, id: u64, out: &mut Vec<u8>) {
        let len = self.len_for(key, id);
        let start = out.len();
        out.extend_from_slice(&id.to_le_bytes());
        let mut x = mix(id, key) | 1;
        while out.len() - start < len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.extend_from_slice(&x.to_le_bytes());
        }
        out.truncate(start + len);
    }

    /// The id of `bytes` if they are exactly what [`Self::fill`] makes for
    /// `key` and that id.
    pub fn decode(&self, key: u64, bytes: &[u8]) -> Option<u64> {
        let id = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
        if bytes.len() != self.len_for(key, id) {
            return None;
        }
        let mut x = mix(id, key) | 1;
        for chunk in bytes[8..].chunks(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if chunk != &x.to_le_bytes()[..chunk.len()] {
                return None;
            }
        }
        Some(id)
    }
}

/// What a read found for a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Read {
    /// The value of this id.
    Id(u64),
    /// Bytes of this length that are no value of the key (a torn or
    /// foreign value: a problem of the run).
    Foreign(usize),
}

/// What a write found before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prior {
    /// The key was absent.
    Absent,
    /// The key was present with this id (the `u64` methods say which).
    Id(u64),
    /// The key was present (the byte methods do not say with what).
    Present,
}

impl Prior {
    /// Whether the key was present.
    pub fn present(&self) -> bool {
        !matches!(self, Prior::Absent)
    }
}

/// What a request of a pipelined call ([`IdSession::run_many`]) found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// A get's value (`None`: absent).
    Read(Option<Read>),
    /// What a write found before it.
    Wrote(Prior),
}

/// A session that speaks ids: the `u64` methods for 8-byte values, the
/// byte methods otherwise.
pub struct IdSession {
    /// The store session.
    pub session: ClusterSession,
    size: ValueSize,
    buf: Vec<u8>,
}

impl IdSession {
    /// `session`, storing values of `size`.
    pub fn new(session: ClusterSession, size: ValueSize) -> Self {
        Self {
            session,
            size,
            buf: Vec::new(),
        }
    }

    /// The value of `key`.
    pub fn get(&mut self, key: u64) -> Result<Option<Read>, KvError> {
        if self.size.is_u64() {
            return Ok(self.session.get(key)?.map(Read::Id));
        }
        if !self.session.get_into(key, &mut self.buf)? {
            return Ok(None);
        }
        Ok(Some(self.read(key)))
    }

    /// The values of `keys`, read together (`ClusterSession::get_many`).
    pub fn get_many(&mut self, keys: &[u64]) -> Result<Vec<Option<Read>>, KvError> {
        if self.size.is_u64() {
            let got = self.session.get_many(keys)?;
            return Ok(got.into_iter().map(|v| v.map(Read::Id)).collect());
        }
        let got = self.session.get_many_values(keys)?;
        Ok(keys
            .iter()
            .zip(got)
            .map(|(&k, v)| {
                v.map(|v| match self.size.decode(k, &v) {
                    Some(id) => Read::Id(id),
                    None => Read::Foreign(v.len()),
                })
            })
            .collect())
    }

    fn read(&self, key: u64) -> Read {
        match self.size.decode(key, &self.buf) {
            Some(id) => Read::Id(id),
            None => Read::Foreign(self.buf.len()),
        }
    }

    fn stage(&mut self, key: u64, id: u64) {
        self.buf.clear();
        self.size.fill(key, id, &mut self.buf);
    }

    /// Sets `key` to value `id`.
    pub fn insert(&mut self, key: u64, id: u64) -> Result<Prior, KvError> {
        if self.size.is_u64() {
            return Ok(self
                .session
                .insert(key, id)?
                .map_or(Prior::Absent, Prior::Id));
        }
        self.stage(key, id);
        Ok(match self.session.put(key, &self.buf)? {
            true => Prior::Present,
            false => Prior::Absent,
        })
    }

    /// Sets `key` to value `id` if present.
    pub fn update(&mut self, key: u64, id: u64) -> Result<Prior, KvError> {
        if self.size.is_u64() {
            return Ok(self
                .session
                .update(key, id)?
                .map_or(Prior::Absent, Prior::Id));
        }
        self.stage(key, id);
        Ok(match self.session.update_value(key, &self.buf)? {
            true => Prior::Present,
            false => Prior::Absent,
        })
    }

    /// Removes `key`.
    pub fn delete(&mut self, key: u64) -> Result<Prior, KvError> {
        if self.size.is_u64() {
            return Ok(self.session.delete(key)?.map_or(Prior::Absent, Prior::Id));
        }
        Ok(match self.session.remove(key)? {
            true => Prior::Present,
            false => Prior::Absent,
        })
    }

    /// `reqs` in one pipelined call, their values ids (`Request`'s
    /// `u64`s): the `u64` requests for 8-byte values
    /// (`ClusterSession::run_many`), byte requests otherwise
    /// (`ClusterSession::run_many_values`). One answer per request, in
    /// order.
    pub fn run_many(&mut self, reqs: &[Request]) -> Vec<Result<Found, KvError>> {
        let wrote = |v: Option<u64>| Found::Wrote(v.map_or(Prior::Absent, Prior::Id));
        if self.size.is_u64() {
            return reqs
                .iter()
                .zip(self.session.run_many(reqs))
                .map(|(r, a)| {
                    a.map(|v| match r {
                        Request::Get(_) => Found::Read(v.map(Read::Id)),
                        _ => wrote(v),
                    })
                })
                .collect();
        }
        let values: Vec<Vec<u8>> = reqs
            .iter()
            .map(|r| {
                let mut out = Vec::new();
                if let Request::Insert(key, id) | Request::Update(key, id) = *r {
                    self.size.fill(key, id, &mut out);
                }
                out
            })
            .collect();
        let vreqs: Vec<ValueRequest<'_>> = reqs
            .iter()
            .zip(&values)
            .map(|(r, v)| match *r {
                Request::Get(key) => ValueRequest::Get(key),
                Request::Insert(key, _) => ValueRequest::Put(key, v),
                Request::Update(key, _) => ValueRequest::Update(key, v),
                Request::Delete(key) => ValueRequest::Remove(key),
            })
            .collect();
        let size = self.size;
        reqs.iter()
            .zip(self.session.run_many_values(&vreqs))
            .map(|(r, a)| {
                a.map(|reply| match reply {
                    Reply::Value(v) => Found::Read(v.map(|v| match size.decode(r.key(), &v) {
                        Some(id) => Read::Id(id),
                        None => Read::Foreign(v.len()),
                    })),
                    Reply::Present(true) => Found::Wrote(Prior::Present),
                    Reply::Present(false) => Found::Wrote(Prior::Absent),
                })
            })
            .collect()
    }

    /// Up to `n` pairs from `from` for each scan `(from, n)`, with what
    /// each value reads as: the scans read together
    /// (`ClusterSession::scan_many`; one alone is a plain scan).
    pub fn scan_many(&mut self, scans: &[(u64, usize)]) -> Result<Vec<Vec<(u64, Read)>>, KvError> {
        if self.size.is_u64() {
            let found = match scans {
                [(from, n)] => vec![self.session.scan(*from, *n)?],
                _ => self.session.scan_many(scans)?,
            };
            return Ok(found
                .into_iter()
                .map(|pairs| pairs.into_iter().map(|(k, v)| (k, Read::Id(v))).collect())
                .collect());
        }
        let found = match scans {
            [(from, n)] => vec![self.session.scan_values(*from, *n)?],
            _ => self.session.scan_many_values(scans)?,
        };
        let size = self.size;
        Ok(found
            .into_iter()
            .map(|pairs| {
                pairs
                    .into_iter()
                    .map(|(k, v)| {
                        let r = match size.decode(k, &v) {
                            Some(id) => Read::Id(id),
                            None => Read::Foreign(v.len()),
                        };
                        (k, r)
                    })
                    .collect()
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_bad_ones_are_named() {
        assert_eq!("8".parse::<ValueSize>(), Ok(ValueSize::default()));
        assert!("8".parse::<ValueSize>().unwrap().is_u64());
        let r: ValueSize = "64..65536".parse().unwrap();
        assert_eq!(
            (r.min, r.max, r.to_string()),
            (64, 65536, "64..65536".into())
        );
        assert!("7".parse::<ValueSize>().unwrap_err().contains("below 8"));
        assert!("9..8".parse::<ValueSize>().unwrap_err().contains("empty"));
        assert!("x".parse::<ValueSize>().unwrap_err().contains("byte count"));
        assert!("99999999999"
            .parse::<ValueSize>()
            .unwrap_err()
            .contains("largest"));
    }

    #[test]
    fn values_decode_to_their_id_and_nothing_else_does() {
        let size: ValueSize = "8..5000".parse().unwrap();
        let mut v = Vec::new();
        for (key, id) in [(1u64, 2u64), (7, 1 << 40), (u64::MAX, 0)] {
            v.clear();
            size.fill(key, id, &mut v);
            assert_eq!(v.len(), size.len_for(key, id));
            assert_eq!(size.decode(key, &v), Some(id));
            assert_eq!(size.decode(key ^ 1, &v), None, "another key's");
            if v.len() > 8 {
                let last = v.len() - 1;
                v[last] ^= 1;
                assert_eq!(size.decode(key, &v), None, "a changed byte");
            }
            assert_eq!(size.decode(key, &v[..v.len() - 1]), None, "a short one");
        }
    }
}
