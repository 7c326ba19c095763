//! The agent area: the memory node's private control words, counters and
//! log ring, placed at the start of the memory the agent is given, with the
//! pool after it at [`AgentArea::pool_offset`] (a page boundary).
//!
//! Compute nodes never see it (it lies outside the registered pool), and
//! the agent finds it without trusting anything in the pool, so a corrupted
//! pool can still be reported in the log. Whoever starts the agent (a
//! test harness, a BlueField loader) writes the header with
//! [`AgentArea::new`], the agent publishes its state and counters in it and
//! appends log records to the ring after it, and `rolex inspect` reads both.
//!
//! The ring holds records `[len: u16 LE][len bytes]` back to back, wrapping
//! around at `log_capacity`. `log_head` and `log_tail` are byte counts that
//! only grow: the live records are those in `[log_tail, log_head)`, and the
//! single writer advances `log_tail` record by record before it overwrites
//! anything, so `log_tail` always starts a record. The invariant
//! [`AgentArea::check`] establishes: `log_tail ≤ log_head ≤ log_tail +
//! log_capacity`. A reader that copies the ring while the writer runs may
//! see a torn record; [`LogRecords`] then stops with an error instead of
//! returning garbage.

use core::fmt;

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The first word of an agent area: `"RLXAGNT\0"` as a little-endian `u64`.
pub const AGENT_MAGIC: u64 = u64::from_le_bytes(*b"RLXAGNT\0");

/// The agent area's layout version.
pub const AGENT_AREA_VERSION: u32 = 1;

/// Why an agent area or its log ring was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AgentAreaError {
    /// Fewer bytes than the header (or the ring it names) needs.
    TooShort {
        /// Bytes needed.
        needed: u64,
        /// Bytes available.
        found: u64,
    },
    /// The area does not start with [`AGENT_MAGIC`].
    BadMagic {
        /// The word found instead.
        found: u64,
    },
    /// The area's version is not [`AGENT_AREA_VERSION`].
    UnsupportedVersion {
        /// The version found.
        found: u32,
    },
    /// The ring's positions break `tail ≤ head ≤ tail + capacity`.
    BadLogPositions {
        /// Ring bytes.
        capacity: u64,
        /// Bytes ever written.
        head: u64,
        /// Start of the oldest live record.
        tail: u64,
    },
    /// A record's length is zero or runs past the live bytes.
    BadRecord {
        /// Byte position (monotonic) of the record.
        at: u64,
        /// The length it claims.
        len: u64,
    },
}

impl fmt::Display for AgentAreaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::TooShort { needed, found } => {
                write!(f, "agent area needs {needed} bytes, found {found}")
            }
            Self::BadMagic { found } => {
                write!(
                    f,
                    "agent area magic is {found:#018x}, not {AGENT_MAGIC:#018x}"
                )
            }
            Self::UnsupportedVersion { found } => write!(
                f,
                "agent area version {found} is not the supported {AGENT_AREA_VERSION}"
            ),
            Self::BadLogPositions {
                capacity,
                head,
                tail,
            } => write!(
                f,
                "log ring positions are inconsistent: tail {tail}, head {head}, capacity {capacity}"
            ),
            Self::BadRecord { at, len } => {
                write!(f, "log record at byte {at} claims {len} bytes")
            }
        }
    }
}

impl core::error::Error for AgentAreaError {}

/// What the agent is doing, as published in [`AgentArea`]'s state field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AgentState {
    /// Laid out, the agent has not attached yet.
    NotStarted,
    /// Attached and serving.
    Running,
    /// Stopped on request, every model consistent.
    Stopped,
    /// Stopped on an error it logged (the pool is as it found it, or as its
    /// last completed retraining left it).
    Failed,
    /// A value no agent writes.
    Unknown(u32),
}

impl AgentState {
    /// The state's code in the header.
    pub const fn code(self) -> u32 {
        match self {
            Self::NotStarted => 0,
            Self::Running => 1,
            Self::Stopped => 2,
            Self::Failed => 3,
            Self::Unknown(c) => c,
        }
    }

    /// The state a code names.
    pub const fn from_code(code: u32) -> Self {
        match code {
            0 => Self::NotStarted,
            1 => Self::Running,
            2 => Self::Stopped,
            3 => Self::Failed,
            c => Self::Unknown(c),
        }
    }
}

impl fmt::Display for AgentState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotStarted => f.write_str("not started"),
            Self::Running => f.write_str("running"),
            Self::Stopped => f.write_str("stopped"),
            Self::Failed => f.write_str("failed"),
            Self::Unknown(c) => write!(f, "unknown state {c}"),
        }
    }
}

/// The agent area's header; the log ring's bytes follow it.
///
/// ```text
/// offset  size  field
///      0     8  magic            AGENT_MAGIC
///      8     4  version          AGENT_AREA_VERSION
///     12     4  state            AgentState code (the agent writes it)
///     16     8  command          0 = serve, 1 = stop (the starter writes it)
///     24     8  next_free        first unused model-region byte of the pool
///     32     8  retrain_trigger  SLT slots that make a model due
///     40     8  polls            agent steps taken (a heartbeat)
///     48     8  retrains         models retrained and installed
///     56     8  keys_retrained   keys those models held
///     64     8  freeze_ns_max    longest freeze
///     72     8  freeze_ns_total  all freezes
///     80     8  failures         retrainings or steps that failed
///     88     8  skipped          CirQ entries naming no model
///     96     8  log_capacity     ring bytes after this header
///    104     8  log_head         bytes ever appended (monotonic)
///    112     8  log_tail         start of the oldest live record (monotonic)
///    120     8  cpu_ns           the agent's CPU (or busy) time
/// ```
///
/// Every field is a whole aligned word (or two halves of one) so the agent
/// may update it with one 8-byte store while a reader copies the header.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct AgentArea {
    magic: U64,
    version: U32,
    state: U32,
    command: U64,
    next_free: U64,
    retrain_trigger: U64,
    polls: U64,
    retrains: U64,
    keys_retrained: U64,
    freeze_ns_max: U64,
    freeze_ns_total: U64,
    failures: U64,
    skipped: U64,
    log_capacity: U64,
    log_head: U64,
    log_tail: U64,
    cpu_ns: U64,
}

const _: () = assert!(core::mem::size_of::<AgentArea>() == 128);

macro_rules! offsets {
    ($($(#[$m:meta])* $name:ident = $field:ident;)*) => {
        $($(#[$m])* pub const $name: u64 = core::mem::offset_of!(AgentArea, $field) as u64;)*
    };
}

macro_rules! getters {
    ($($(#[$m:meta])* $field:ident;)*) => {
        $($(#[$m])* pub fn $field(&self) -> u64 { self.$field.get() })*
    };
}

impl AgentArea {
    /// Bytes of the header.
    pub const SIZE: u64 = core::mem::size_of::<Self>() as u64;
    /// Command value: keep serving.
    pub const SERVE: u64 = 0;
    /// Command value: finish the current step and stop.
    pub const STOP: u64 = 1;

    offsets! {
        /// Offset of the word holding version (low half) and state (high half).
        VERSION_STATE_OFFSET = version;
        /// Offset of `command`.
        COMMAND_OFFSET = command;
        /// Offset of `next_free`.
        NEXT_FREE_OFFSET = next_free;
        /// Offset of `polls`.
        POLLS_OFFSET = polls;
        /// Offset of `retrains`.
        RETRAINS_OFFSET = retrains;
        /// Offset of `keys_retrained`.
        KEYS_RETRAINED_OFFSET = keys_retrained;
        /// Offset of `freeze_ns_max`.
        FREEZE_MAX_OFFSET = freeze_ns_max;
        /// Offset of `freeze_ns_total`.
        FREEZE_TOTAL_OFFSET = freeze_ns_total;
        /// Offset of `failures`.
        FAILURES_OFFSET = failures;
        /// Offset of `skipped`.
        SKIPPED_OFFSET = skipped;
        /// Offset of `log_head`.
        LOG_HEAD_OFFSET = log_head;
        /// Offset of `log_tail`.
        LOG_TAIL_OFFSET = log_tail;
        /// Offset of `cpu_ns`.
        CPU_NS_OFFSET = cpu_ns;
    }

    /// Where the pool starts after an area whose ring has `log_capacity`
    /// bytes: the first page (4 KiB) boundary past the ring, so the area and
    /// the pool never share a page.
    pub const fn pool_offset_for(log_capacity: u64) -> Option<u64> {
        match Self::SIZE.checked_add(log_capacity) {
            Some(n) => match n.checked_add(4095) {
                Some(n) => Some(n & !4095),
                None => None,
            },
            None => None,
        }
    }

    /// Where the pool starts after this area (see
    /// [`AgentArea::pool_offset_for`]).
    pub fn pool_offset(&self) -> Option<u64> {
        Self::pool_offset_for(self.log_capacity())
    }

    /// A fresh header: not started, serve, empty ring of `log_capacity`
    /// bytes.
    pub fn new(next_free: u64, retrain_trigger: u64, log_capacity: u64) -> Self {
        Self {
            magic: U64::new(AGENT_MAGIC),
            version: U32::new(AGENT_AREA_VERSION),
            state: U32::new(AgentState::NotStarted.code()),
            command: U64::new(Self::SERVE),
            next_free: U64::new(next_free),
            retrain_trigger: U64::new(retrain_trigger),
            polls: U64::ZERO,
            retrains: U64::ZERO,
            keys_retrained: U64::ZERO,
            freeze_ns_max: U64::ZERO,
            freeze_ns_total: U64::ZERO,
            failures: U64::ZERO,
            skipped: U64::ZERO,
            log_capacity: U64::new(log_capacity),
            log_head: U64::ZERO,
            log_tail: U64::ZERO,
            cpu_ns: U64::ZERO,
        }
    }

    /// Decodes and checks the header at the start of `bytes` (`bytes` may
    /// also hold the ring; only the header is needed).
    pub fn read(bytes: &[u8]) -> Result<Self, AgentAreaError> {
        let (a, _) = Self::read_from_prefix(bytes).map_err(|_| AgentAreaError::TooShort {
            needed: Self::SIZE,
            found: bytes.len() as u64,
        })?;
        a.check()?;
        Ok(a)
    }

    /// Checks magic, version and the ring positions.
    pub fn check(&self) -> Result<(), AgentAreaError> {
        if self.magic.get() != AGENT_MAGIC {
            return Err(AgentAreaError::BadMagic {
                found: self.magic.get(),
            });
        }
        if self.version.get() != AGENT_AREA_VERSION {
            return Err(AgentAreaError::UnsupportedVersion {
                found: self.version.get(),
            });
        }
        let (capacity, head, tail) = (self.log_capacity(), self.log_head(), self.log_tail());
        if tail > head || head - tail > capacity {
            return Err(AgentAreaError::BadLogPositions {
                capacity,
                head,
                tail,
            });
        }
        Ok(())
    }

    /// Bytes of the whole area (header and ring).
    pub fn len(&self) -> u64 {
        Self::SIZE.saturating_add(self.log_capacity())
    }

    /// Whether the ring has no bytes at all.
    pub fn is_empty(&self) -> bool {
        self.log_capacity() == 0
    }

    /// The agent's published state.
    pub fn state(&self) -> AgentState {
        AgentState::from_code(self.state.get())
    }

    /// The word at [`AgentArea::VERSION_STATE_OFFSET`] for `state`.
    pub const fn version_state_word(state: AgentState) -> u64 {
        AGENT_AREA_VERSION as u64 | ((state.code() as u64) << 32)
    }

    getters! {
        /// The starter's command.
        command;
        /// First unused model-region byte.
        next_free;
        /// SLT slots that make a model due.
        retrain_trigger;
        /// Agent steps taken.
        polls;
        /// Models retrained.
        retrains;
        /// Keys held by the retrained models.
        keys_retrained;
        /// Longest freeze, ns.
        freeze_ns_max;
        /// All freezes, ns.
        freeze_ns_total;
        /// Failed steps.
        failures;
        /// CirQ entries that named no model.
        skipped;
        /// Ring bytes.
        log_capacity;
        /// Bytes ever appended.
        log_head;
        /// Start of the oldest live record.
        log_tail;
        /// The agent's CPU time, ns.
        cpu_ns;
    }

    /// The live records of `ring` (the `log_capacity` bytes after the
    /// header), oldest first.
    pub fn records<'a>(&self, ring: &'a [u8]) -> Result<LogRecords<'a>, AgentAreaError> {
        self.check()?;
        let capacity = self.log_capacity();
        if (ring.len() as u64) < capacity {
            return Err(AgentAreaError::TooShort {
                needed: capacity,
                found: ring.len() as u64,
            });
        }
        Ok(LogRecords {
            ring: &ring[..capacity as usize],
            at: self.log_tail(),
            head: self.log_head(),
        })
    }
}

/// Bytes a record of `len` payload bytes takes in the ring.
pub const fn log_record_size(len: usize) -> u64 {
    2 + len as u64
}

/// The ring byte (index into the ring) of monotonic position `pos`.
pub const fn log_ring_index(pos: u64, capacity: u64) -> usize {
    if capacity == 0 {
        0
    } else {
        (pos % capacity) as usize
    }
}

/// A walk over a ring's live records (see the module docs), oldest first.
#[derive(Clone, Debug)]
pub struct LogRecords<'a> {
    ring: &'a [u8],
    at: u64,
    head: u64,
}

/// One record of the ring: its payload, in two parts because it may wrap
/// around the ring's end (`second` is empty when it does not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogRecord<'a> {
    /// Byte position (monotonic) of the record.
    pub at: u64,
    /// The payload up to the ring's end.
    pub first: &'a [u8],
    /// The rest of the payload, from the ring's start.
    pub second: &'a [u8],
}

impl<'a> LogRecords<'a> {
    fn byte(&self, pos: u64) -> u8 {
        self.ring[log_ring_index(pos, self.ring.len() as u64)]
    }

    /// The next record: `Ok(None)` at the end, or an error for a torn or
    /// corrupted record (after which the walk is finished).
    pub fn next_record(&mut self) -> Result<Option<LogRecord<'a>>, AgentAreaError> {
        if self.at >= self.head {
            return Ok(None);
        }
        let at = self.at;
        // Whatever happens next, this walk does not continue past an error.
        self.at = self.head;
        if self.head - at < 2 {
            return Err(AgentAreaError::BadRecord { at, len: 0 });
        }
        let len = u16::from_le_bytes([self.byte(at), self.byte(at + 1)]);
        if len == 0 || log_record_size(len.into()) > self.head - at {
            return Err(AgentAreaError::BadRecord {
                at,
                len: len.into(),
            });
        }
        let cap = self.ring.len();
        let start = log_ring_index(at + 2, cap as u64);
        let n = usize::from(len);
        let first_len = n.min(cap - start);
        let record = LogRecord {
            at,
            first: &self.ring[start..start + first_len],
            second: &self.ring[..n - first_len],
        };
        self.at = at + log_record_size(n);
        Ok(Some(record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    /// Appends records the way the agent does: free space by advancing the
    /// tail record by record, then write length and bytes, wrapping.
    fn append(ring: &mut [u8], head: &mut u64, tail: &mut u64, rec: &[u8]) {
        let cap = ring.len() as u64;
        let size = log_record_size(rec.len());
        while *head + size - *tail > cap {
            let l = u16::from_le_bytes([
                ring[log_ring_index(*tail, cap)],
                ring[log_ring_index(*tail + 1, cap)],
            ]);
            *tail += log_record_size(l.into());
        }
        let bytes = (rec.len() as u16).to_le_bytes();
        for (i, b) in bytes.iter().chain(rec).enumerate() {
            ring[log_ring_index(*head + i as u64, cap)] = *b;
        }
        *head += size;
    }

    #[test]
    fn records_survive_wrapping() {
        let mut ring = [0u8; 37];
        let (mut head, mut tail) = (0u64, 0u64);
        let mut all: Vec<Vec<u8>> = Vec::new();
        for i in 0..40u8 {
            let rec: Vec<u8> = (0..(i % 7 + 1)).map(|j| i ^ j).collect();
            append(&mut ring, &mut head, &mut tail, &rec);
            all.push(rec);
        }
        let mut a = AgentArea::new(4096, 8, ring.len() as u64);
        a.log_head = U64::new(head);
        a.log_tail = U64::new(tail);
        let bytes = a.as_bytes();
        let a = AgentArea::read(bytes).unwrap();
        let mut it = a.records(&ring).unwrap();
        let mut got = Vec::new();
        while let Some(r) = it.next_record().unwrap() {
            got.push([r.first, r.second].concat());
        }
        assert!(!got.is_empty());
        assert_eq!(&all[all.len() - got.len()..], &got[..]);
    }

    #[test]
    fn bad_headers_and_records_are_named() {
        let mut a = AgentArea::new(0, 1, 16);
        assert_eq!(
            AgentArea::read(&a.as_bytes()[..8]).unwrap_err(),
            AgentAreaError::TooShort {
                needed: 128,
                found: 8
            }
        );
        a.log_head = U64::new(40);
        assert!(matches!(
            a.check(),
            Err(AgentAreaError::BadLogPositions { .. })
        ));
        a.log_head = U64::new(10);
        let ring = [0u8; 16];
        let mut it = a.records(&ring).unwrap();
        assert_eq!(
            it.next_record(),
            Err(AgentAreaError::BadRecord { at: 0, len: 0 })
        );
        assert_eq!(it.next_record(), Ok(None));
        a.magic = U64::new(1);
        assert_eq!(a.check(), Err(AgentAreaError::BadMagic { found: 1 }));
        let mut b = AgentArea::new(0, 1, 16);
        b.version = U32::new(9);
        assert_eq!(
            b.check(),
            Err(AgentAreaError::UnsupportedVersion { found: 9 })
        );
        assert_eq!(AgentArea::pool_offset_for(1), Some(4096));
        assert_eq!(AgentArea::pool_offset_for(4096 - 128), Some(4096));
        assert_eq!(AgentArea::pool_offset_for(4096), Some(8192));
        assert_eq!(AgentArea::pool_offset_for(u64::MAX), None);
        assert_eq!(
            AgentState::from_code(AgentState::Failed.code()),
            AgentState::Failed
        );
        assert_eq!(AgentArea::version_state_word(AgentState::Running) >> 32, 1);
    }
}
