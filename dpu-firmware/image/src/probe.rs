//! The atomics probe: the agent's side of `rolex_core::layout::AtomicsProbe`.
//! It makes its `FAA`s and `CAS` loops through `rolex_dpu::SharedBytes`,
//! the very atomics the agent's pool uses, on memory a host process
//! hammers at the same time, so a platform whose atomics are not atomic
//! with the host's (an emulator's, a new board's) shows a lost update
//! before a pool is trusted to it. It runs instead of the agent.
//!
//! Exit codes: 0 probed (the host judges the counts); 2 the memory is
//! smaller than the probe block or refused an access.

use rolex_core::layout::AtomicsProbe as P;
use rolex_dpu::{MemError, SharedBytes};

use crate::platform;

/// Most rounds the probe makes, whatever `go` says.
const MAX_ROUNDS: u64 = 1 << 24;
/// How long the probe naps between looks at `go`.
const WAIT_NS: u64 = 200_000;

/// Runs the probe on `mem` (the block at offset 0) and returns the exit
/// code.
pub fn atomics(mem: SharedBytes<'static>) -> i32 {
    if mem.len() < P::SIZE {
        platform::console("rolex-dpu-image: the memory is smaller than the probe block\n");
        return 2;
    }
    match probe(&mem) {
        Ok(()) => 0,
        Err(_) => {
            platform::console("rolex-dpu-image: the probe block refused an access\n");
            2
        }
    }
}

fn probe(mem: &SharedBytes<'static>) -> Result<(), MemError> {
    mem.store(P::SCRATCH_OFFSET, P::SCRATCH)?;
    mem.store(P::READY_OFFSET, P::READY)?;
    let rounds = loop {
        let go = mem.load(P::GO_OFFSET)?;
        if go != 0 {
            break go.min(MAX_ROUNDS);
        }
        platform::nap(WAIT_NS);
    };
    for _ in 0..rounds {
        mem.faa(P::FAA_OFFSET, 1)?;
        let mut seen = mem.load(P::CAS_OFFSET)?;
        loop {
            let was = mem.cas(P::CAS_OFFSET, seen, seen.wrapping_add(1))?;
            if was == seen {
                break;
            }
            seen = was;
        }
        // A CAS whose expected value is wrong must fail and change nothing.
        let was = mem.cas(P::SCRATCH_OFFSET, P::SCRATCH ^ 1, 0)?;
        if was == P::SCRATCH && mem.load(P::SCRATCH_OFFSET)? == P::SCRATCH {
            mem.faa(P::CAS_REFUSED_OFFSET, 1)?;
        }
    }
    mem.store(P::AGENT_ROUNDS_OFFSET, rounds)?;
    mem.store(P::DONE_OFFSET, 1)
}
