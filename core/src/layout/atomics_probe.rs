//! The atomics probe block: the words an emulated or new memory-node
//! platform and a host process hammer together, to show that the agent's
//! 8-byte `CAS`/`FAA` and the host's are atomic with respect to each other
//! on memory they share, before a pool is trusted to that memory.
//!
//! It is placed at offset 0 of the shared memory instead of an agent area
//! (the probe runs alone, never beside a pool). The protocol, in order:
//! the agent stores [`AtomicsProbe::READY`] in `ready`; the host stores the
//! number of rounds in `go`; both add 1 to `faa_count` by `FAA` and to
//! `cas_count` by a `CAS` loop, the agent `go` times, the host until it
//! sees `done`; the agent also checks that a `CAS` with a wrong expected
//! value fails and changes nothing (`cas_refused` counts those), stores its
//! rounds in `agent_rounds` and then 1 in `done`. The invariant the host
//! checks: `faa_count == cas_count == agent_rounds + host rounds` and
//! `cas_refused == agent_rounds`. A lost update on either side breaks it.

use zerocopy::little_endian::U64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The probe block, every field an 8-byte aligned word:
///
/// ```text
/// offset  size  field
///      0     8  ready         READY once the agent runs (the agent writes it)
///      8     8  go            rounds the agent makes; 0 = wait (the host writes it)
///     16     8  faa_count     FAA target of both sides
///     24     8  cas_count     CAS-loop target of both sides
///     32     8  cas_refused   wrong-expected CASes that failed untouched
///     40     8  agent_rounds  rounds the agent made (written before `done`)
///     48     8  done          1 once the agent finished
///     56     8  scratch       the word the wrong-expected CASes target
/// ```
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct AtomicsProbe {
    ready: U64,
    go: U64,
    faa_count: U64,
    cas_count: U64,
    cas_refused: U64,
    agent_rounds: U64,
    done: U64,
    scratch: U64,
}

const _: () = assert!(core::mem::size_of::<AtomicsProbe>() == 64);

macro_rules! offsets {
    ($($(#[$m:meta])* $name:ident = $field:ident;)*) => {
        $($(#[$m])* pub const $name: u64 = core::mem::offset_of!(AtomicsProbe, $field) as u64;)*
    };
}

impl AtomicsProbe {
    /// Bytes of the block.
    pub const SIZE: u64 = core::mem::size_of::<Self>() as u64;
    /// The `ready` value: `"RLXPROBE"` as a little-endian `u64`.
    pub const READY: u64 = u64::from_le_bytes(*b"RLXPROBE");
    /// The value `scratch` holds while the agent probes refused `CAS`es
    /// (the host leaves it alone).
    pub const SCRATCH: u64 = 0x5eed_0000_0000_5eed;

    offsets! {
        /// Offset of `ready`.
        READY_OFFSET = ready;
        /// Offset of `go`.
        GO_OFFSET = go;
        /// Offset of `faa_count`.
        FAA_OFFSET = faa_count;
        /// Offset of `cas_count`.
        CAS_OFFSET = cas_count;
        /// Offset of `cas_refused`.
        CAS_REFUSED_OFFSET = cas_refused;
        /// Offset of `agent_rounds`.
        AGENT_ROUNDS_OFFSET = agent_rounds;
        /// Offset of `done`.
        DONE_OFFSET = done;
        /// Offset of `scratch`.
        SCRATCH_OFFSET = scratch;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_is_aligned_and_inside_the_block() {
        let all = [
            AtomicsProbe::READY_OFFSET,
            AtomicsProbe::GO_OFFSET,
            AtomicsProbe::FAA_OFFSET,
            AtomicsProbe::CAS_OFFSET,
            AtomicsProbe::CAS_REFUSED_OFFSET,
            AtomicsProbe::AGENT_ROUNDS_OFFSET,
            AtomicsProbe::DONE_OFFSET,
            AtomicsProbe::SCRATCH_OFFSET,
        ];
        for (i, at) in all.iter().enumerate() {
            assert_eq!(*at, i as u64 * 8);
            assert!(at + 8 <= AtomicsProbe::SIZE);
        }
    }
}
