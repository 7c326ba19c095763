//! The memory-node agent as a freestanding firmware image: `#![no_std]`,
//! `#![no_main]`, heap from `embedded-alloc`, logs through `defmt` into the
//! agent area's log ring (see `rolex_core::layout::AgentArea`).
//!
//! The platform module ([`platform`]) is the only code that touches the
//! machine; it finds the agent's memory (the agent area, then the pool)
//! and calls [`run`], which is the service loop of `rolex_dpu::Agent` —
//! the same code the hosted memory node runs. The loop stops when the
//! area's command word says stop (between two steps, so never inside a
//! freeze), and refuses to touch a pool whose magic or layout version is
//! wrong: it logs the error, publishes the failed state and exits.
//!
//! Exit codes: 0 stopped on request; 2 no usable memory or agent area;
//! 3 the pool was refused at attach; 4 the pool went bad while serving;
//! 101 panic; 102 a CPU exception (aarch64).
//!
//! Instead of the agent, a platform may run [`probe::atomics`] (the x86_64
//! process with `probe-atomics` after the file, the QEMU `virt` board with
//! it on the semihosting command line): it checks that the agent's atomics
//! and a host process's agree on the memory they share.
#![no_std]
#![no_main]
#![forbid(unsafe_op_in_unsafe_fn)]

extern crate alloc;

mod log;
mod platform;
#[cfg(any(target_os = "linux", feature = "qemu-virt"))]
mod probe;

use core::fmt::Write as _;

use rolex_core::layout::{AgentArea, AgentState};
use rolex_dpu::{Agent, AgentConfig, AgentError, Notice, RetrainReport};

use platform::{Area, Boot};

/// Longest nap of the idle agent, in nanoseconds.
const MAX_NAP_NS: u64 = 1_000_000;
/// First nap of the idle agent.
const MIN_NAP_NS: u64 = 20_000;

/// An error as text, for a `{=str}` log argument.
fn text(e: &dyn core::fmt::Display) -> heapless::String<256> {
    let mut s = heapless::String::new();
    // Too long a message is cut at the buffer's end; that is fine for a log.
    let _ = write!(s, "{e}");
    s
}

/// The service: check the area, attach, serve until told to stop.
pub fn run(boot: Boot) -> i32 {
    let Some(head) = boot.header(AgentArea::SIZE) else {
        platform::console("rolex-dpu-image: the memory is smaller than an agent area\n");
        return 2;
    };
    let mut hb = [0u8; AgentArea::SIZE as usize];
    if head.read(0, &mut hb).is_err() {
        return 2;
    }
    let header = match AgentArea::read(&hb) {
        Ok(h) => h,
        Err(e) => {
            platform::console("rolex-dpu-image: agent area refused: ");
            platform::console(text(&e).as_str());
            platform::console("\n");
            return 2;
        }
    };
    let total = boot.len();
    let split = header
        .pool_offset()
        .and_then(|at| boot.split(at).map(|s| (at, s)));
    let Some((pool_at, (area, pool))) = split else {
        platform::console("rolex-dpu-image: the memory ends before the pool starts\n");
        return 2;
    };
    log::init(area, &header);
    log::set_state(AgentState::Running);
    defmt::info!(
        "rolex-dpu-image {=str}: pool of {=u64} bytes at offset {=u64}, trigger {=u64}",
        env!("CARGO_PKG_VERSION"),
        total - pool_at,
        pool_at,
        header.retrain_trigger()
    );
    let cfg = AgentConfig {
        retrain_trigger: header.retrain_trigger(),
        ..AgentConfig::default()
    };
    let mut agent = match Agent::attach(pool, cfg, header.next_free()) {
        Ok(a) => a,
        Err(e) => {
            defmt::error!("pool refused, nothing touched: {=str}", text(&e).as_str());
            log::set_state(AgentState::Failed);
            return 3;
        }
    };
    defmt::info!(
        "attached: {=u64} models, next record at {=u64}",
        agent.records().len() as u64,
        agent.next_free()
    );
    let mut nap = MIN_NAP_NS;
    let mut polls = 0u64;
    loop {
        let stop = log::with_area(|a| a.load(AgentArea::COMMAND_OFFSET).unwrap_or(AgentArea::STOP))
            .unwrap_or(AgentArea::STOP);
        if stop == AgentArea::STOP {
            break;
        }
        polls += 1;
        let step = agent.poll();
        while let Some(n) = agent.take_notice() {
            log_notice(n);
        }
        match step {
            Ok(Some(r)) => {
                log_retrain(&r);
                nap = MIN_NAP_NS;
            }
            Ok(None) => {
                publish(&agent, polls);
                platform::nap(nap);
                nap = (nap * 2).min(MAX_NAP_NS);
            }
            Err(e @ AgentError::Layout(_)) => {
                defmt::error!(
                    "pool corrupted, stopping without touching it: {=str}",
                    text(&e).as_str()
                );
                publish(&agent, polls);
                log::set_state(AgentState::Failed);
                return 4;
            }
            Err(e) => {
                // The error says what is left: a thawed model (retried
                // later) or an installed one still rolling forward.
                defmt::error!("retraining failed: {=str}", text(&e).as_str());
                platform::nap(nap);
            }
        }
        publish(&agent, polls);
    }
    publish(&agent, polls);
    let s = agent.stats();
    defmt::info!(
        "stopped: {=u64} retrainings, {=u64} keys, freeze max {=u64} ns",
        s.retrains,
        s.keys_retrained,
        s.freeze_ns_max
    );
    log::set_state(AgentState::Stopped);
    0
}

fn log_retrain(r: &RetrainReport) {
    defmt::info!(
        "model {=u64} retrained: record {=u64} -> {=u64}, {=u64} leaves ({=u64} synonyms absorbed), {=u64} keys, {=u64} segments, frozen {=u64} ns",
        r.model_id,
        r.old_record,
        r.new_record,
        r.leaves,
        r.synonyms_absorbed,
        r.keys,
        r.segments,
        r.freeze_ns
    );
}

fn log_notice(n: Notice) {
    match n {
        Notice::UnknownModel {
            model_id,
            ticket,
            models,
        } => defmt::error!(
            "CirQ ticket {=u64} names model {=u64}, but the directory has {=u64} models: skipped",
            ticket,
            model_id,
            models
        ),
        other => defmt::error!("{=str}", text(&other).as_str()),
    }
}

/// Publishes the agent's counters in the area.
fn publish<M: rolex_dpu::PoolMemory>(agent: &Agent<M>, polls: u64) {
    let s = agent.stats();
    log::with_area(|a: &Area| {
        for (at, v) in [
            (AgentArea::NEXT_FREE_OFFSET, agent.next_free()),
            (AgentArea::POLLS_OFFSET, polls),
            (AgentArea::RETRAINS_OFFSET, s.retrains),
            (AgentArea::KEYS_RETRAINED_OFFSET, s.keys_retrained),
            (AgentArea::FREEZE_MAX_OFFSET, s.freeze_ns_max),
            (AgentArea::FREEZE_TOTAL_OFFSET, s.freeze_ns_total),
            (AgentArea::FAILURES_OFFSET, s.failures),
            (AgentArea::SKIPPED_OFFSET, s.cirq_unknown),
            (AgentArea::CPU_NS_OFFSET, platform::cpu_ns()),
        ] {
            let _ = a.store(at, v);
        }
    });
}
