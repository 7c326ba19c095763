//! The BlueField board: the image on a BlueField DPU's Arm cores, laid out
//! by `linker/bluefield-aarch64.ld`. The boot loader (ATF BL33 or UEFI, at
//! EL1, MMU on with its identity map) loads the ELF at the image window
//! and jumps to `_start`. The agent's memory is the window the memory map
//! reserves for the agent area and the pool (`__agent_mem_start` ..
//! `__agent_mem_end`), which the host reaches over PCIe; there is no
//! console (the log ring is the only output) and "exit" parks the core.
//!
//! Built by `tools/firmware`, never run: this project has no BlueField.
//! The memory map and the loader's state at entry are assumptions.

use core::arch::asm;

use crate::platform::Boot;

/// Called by `_start` with the agent window.
pub extern "C" fn start(base: *mut u8, end: usize) -> ! {
    crate::platform::init_heap();
    let len = end.saturating_sub(base as usize) as u64;
    // SAFETY: the memory map reserves `[base, end)` for the agent area and
    // the pool (normal, cacheable, shared with the host over PCIe); nothing
    // else in the image uses it, it stays mapped while the core runs, and
    // its start is page aligned (the linker script asserts it).
    let boot = unsafe { Boot::new(base, len) };
    exit(crate::run(boot))
}

/// The agent's CPU time: its core runs nothing else and naps by spinning,
/// so its busy time is all the time since boot.
pub fn cpu_ns() -> u64 {
    super::now_ns()
}

/// Waits about `ns` nanoseconds, hinting the core that it is idle (the
/// core is the agent's own: nothing else would run on it).
pub fn nap(ns: u64) {
    let until = super::now_ns().saturating_add(ns);
    while super::now_ns() < until {
        // SAFETY: `yield` is a hint with no effect on memory or registers.
        unsafe { asm!("yield", options(nomem, nostack)) };
    }
}

/// No console on the bare-metal image: the log ring is its only output.
pub fn console(_s: &str) {}

/// Parks the core for good (the agent area's state says how it ended).
pub fn exit(_code: i32) -> ! {
    loop {
        // SAFETY: `wfe` waits for an event; it touches no memory.
        unsafe { asm!("wfe", options(nomem, nostack)) };
    }
}
