//! The image on a BlueField's Arm cores, bare metal (`aarch64-unknown-none`,
//! laid out by `linker/bluefield-aarch64.ld`). The boot loader (ATF BL33 or
//! UEFI, at EL1) loads the ELF at the image window and jumps to `_start`.
//! Core 0 runs the agent (the default core budget of one core); any other
//! core that enters parks. The agent's memory is the window the memory map
//! reserves for the agent area and the pool (`__agent_mem_start` ..
//! `__agent_mem_end`), which the host reaches over PCIe; the clock is the
//! generic timer; there is no console (the log ring is the only output)
//! and "exit" parks the core.
//!
//! Not built on machines without the `aarch64-unknown-none` target
//! (`tools/firmware` says so when it skips it).

use core::arch::{asm, global_asm};

use super::Boot;

// Entry: park secondary cores, enable FP/SIMD at EL1 (the compiler uses
// NEON registers), zero .bss, set the stack, and pass the agent window to
// Rust.
global_asm!(
    ".section .text._start, \"ax\"",
    ".globl _start",
    "_start:",
    "mrs x1, mpidr_el1",
    "and x1, x1, #0xff",
    "cbnz x1, 9f",
    "mov x0, #(3 << 20)",
    "msr cpacr_el1, x0",
    "isb",
    "ldr x0, =__bss_start",
    "ldr x1, =__bss_end",
    "1:",
    "cmp x0, x1",
    "b.hs 2f",
    "str xzr, [x0], #8",
    "b 1b",
    "2:",
    "ldr x0, =__stack_top",
    "mov sp, x0",
    "ldr x0, =__agent_mem_start",
    "ldr x1, =__agent_mem_end",
    "bl {entry}",
    "9:",
    "wfe",
    "b 9b",
    entry = sym start,
);

extern "C" fn start(base: *mut u8, end: usize) -> ! {
    super::init_heap();
    let len = end.saturating_sub(base as usize) as u64;
    // SAFETY: the memory map reserves `[base, end)` for the agent area and
    // the pool (normal, cacheable, shared with the host over PCIe); nothing
    // else in the image uses it, it stays mapped while the core runs, and
    // its start is page aligned (the linker script asserts it).
    let boot = unsafe { Boot::new(base, len) };
    exit(crate::run(boot))
}

fn counter() -> (u64, u64) {
    let (cnt, frq): (u64, u64);
    // SAFETY: reading the generic timer's virtual count and frequency
    // registers, accessible at EL1; no memory is touched.
    unsafe {
        asm!("isb", "mrs {c}, cntvct_el0", c = out(reg) cnt, options(nomem, nostack));
        asm!("mrs {f}, cntfrq_el0", f = out(reg) frq, options(nomem, nostack));
    }
    (cnt, frq)
}

/// A monotonic clock, in nanoseconds (the generic timer).
pub fn now_ns() -> u64 {
    let (cnt, frq) = counter();
    if frq == 0 {
        return 0;
    }
    (u128::from(cnt) * 1_000_000_000 / u128::from(frq)) as u64
}

/// The agent's CPU time: the core runs nothing else, so its busy time is
/// all the time since boot.
pub fn cpu_ns() -> u64 {
    now_ns()
}

/// Waits about `ns` nanoseconds, hinting the core that it is idle.
pub fn nap(ns: u64) {
    let until = now_ns().saturating_add(ns);
    while now_ns() < until {
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
