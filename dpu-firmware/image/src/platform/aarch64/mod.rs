//! The image on Arm cores, bare metal (`aarch64-unknown-none`): what every
//! aarch64 board shares — the entry point, the exception vectors and the
//! generic timer — and the board module that knows the machine:
//! `bluefield` (a BlueField DPU's Cortex-A72 cores, the default) or
//! `qemu_virt` (QEMU's `virt` machine, feature `qemu-virt`, which
//! `tools/bluefield-emu` boots). Each board's memory map is written down in
//! its linker script in `linker/`.
//!
//! The entry (`_start`) parks every core but core 0 (the agent's core
//! budget is one core), enables FP/SIMD at EL1 (the compiler uses NEON
//! registers), installs the vectors, zeroes `.bss`, sets the stack and
//! calls the board's `start` with the agent window the linker script
//! names (`__agent_mem_start`, `__agent_mem_end`). Any exception taken
//! afterwards (the image installs no interrupt handler and keeps IRQs
//! masked, so only a fault can get there) marks the agent failed and exits
//! with code 102.

use core::arch::{asm, global_asm};

#[cfg(not(feature = "qemu-virt"))]
pub mod bluefield;
#[cfg(not(feature = "qemu-virt"))]
use bluefield as board;

#[cfg(feature = "qemu-virt")]
pub mod qemu_virt;
#[cfg(feature = "qemu-virt")]
use qemu_virt as board;

pub use board::{console, cpu_ns, exit, nap};

/// Exit code of a CPU exception (a fault in the image).
const EXCEPTION_EXIT: i32 = 102;

global_asm!(
    ".section .text._start, \"ax\"",
    ".globl _start",
    "_start:",
    "mrs x1, mpidr_el1",
    "and x1, x1, #0xff",
    "cbnz x1, 9f",
    "mov x0, #(3 << 20)",
    "msr cpacr_el1, x0",
    "ldr x0, =__rolex_vectors",
    "msr vbar_el1, x0",
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
    // The vector table: 16 entries of 128 bytes, 2 KiB aligned; every one
    // hands the syndrome and the faulting address to `fault`.
    ".section .text.vectors, \"ax\"",
    ".balign 2048",
    "__rolex_vectors:",
    ".rept 16",
    ".balign 128",
    "mrs x0, esr_el1",
    "mrs x1, elr_el1",
    "b {fault}",
    ".endr",
    entry = sym board::start,
    fault = sym fault,
);

/// A CPU exception: report it where the board can, mark the agent failed,
/// and leave.
extern "C" fn fault(esr: u64, elr: u64) -> ! {
    defmt::error!(
        "CPU exception: ESR_EL1 {=u64:#x} at ELR_EL1 {=u64:#x}",
        esr,
        elr
    );
    crate::log::mark_failed();
    let mut msg: heapless::String<96> = heapless::String::new();
    let _ = core::fmt::write(
        &mut msg,
        format_args!("rolex-dpu-image: CPU exception, ESR_EL1 {esr:#x} at {elr:#x}\n"),
    );
    console(msg.as_str());
    exit(EXCEPTION_EXIT)
}

/// The generic timer's virtual count and its frequency.
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
