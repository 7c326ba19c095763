//! The QEMU `virt` board: the image on emulated Cortex-A72 cores
//! (`qemu-system-aarch64 -M virt,highmem=off,gic-version=2 -cpu cortex-a72
//! -semihosting -kernel IMAGE`), laid out by `linker/qemu-virt-aarch64.ld`,
//! the stand-in for a BlueField that `tools/bluefield-emu` runs.
//!
//! QEMU loads the ELF into guest RAM at 0x4000_0000 and starts core 0 at
//! `_start` at EL1 with the MMU off; the other cores stay powered off
//! (PSCI). Before anything else this board:
//!
//! - turns the MMU on with an identity map (RAM and the agent window
//!   normal write-back memory, inner shareable; everything else device
//!   memory), as a BlueField's boot loader leaves it;
//! - finds the agent's memory: an `ivshmem-plain` PCI device on bus 0
//!   whose shared memory (BAR2) QEMU backs with a host file
//!   (`memory-backend-file,share=on`); the board places BAR2 at the agent
//!   window the linker script names, so host processes that map the same
//!   file share every word with the agent, as a BlueField's DRAM is shared
//!   with its host over PCIe;
//! - enables the GIC for the virtual timer's interrupt, so an idle agent
//!   waits in `wfi` (QEMU then parks the vCPU's thread instead of spinning
//!   a host core). IRQs stay masked: the interrupt only wakes the core.
//!
//! Console and exit go through Arm semihosting (`hlt #0xf000`, so QEMU must
//! run with `-semihosting`); the semihosting command line selects the
//! atomics probe (`probe-atomics`, see `crate::probe`) instead of the agent.

use core::arch::asm;
use core::ptr::{addr_of, addr_of_mut, read_volatile, write_volatile};
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::counter;
use crate::platform::Boot;

/// GICv2 distributor and CPU interface of the `virt` machine.
const GICD: usize = 0x0800_0000;
const GICC: usize = 0x0801_0000;
/// The virtual timer's interrupt (PPI 11).
const VTIMER_INTID: u32 = 27;
/// The PCIe configuration space (ECAM) with `highmem=off`: bus 0 only.
const ECAM: usize = 0x3f00_0000;
/// Vendor (low half) and device (high half) of `ivshmem-plain`.
const IVSHMEM_ID: u32 = 0x1110_1af4;
/// Guest RAM, where QEMU loads the image.
const RAM_BASE: u64 = 0x4000_0000;

// Arm semihosting operations.
const SYS_WRITE0: usize = 0x04;
const SYS_GET_CMDLINE: usize = 0x15;
const SYS_EXIT: usize = 0x18;
const ADP_STOPPED_APPLICATION_EXIT: usize = 0x20026;

/// A translation table (4 KiB granule).
#[repr(C, align(4096))]
struct Table([u64; 512]);

static mut L1: Table = Table([0; 512]);
static mut L2: Table = Table([0; 512]);

// Descriptor bits (VMSAv8-64, stage 1, 4 KiB granule).
const BLOCK: u64 = 0b01;
const TABLE: u64 = 0b11;
const ACCESSED: u64 = 1 << 10;
const INNER_SHAREABLE: u64 = 3 << 8;
const ATTR_DEVICE: u64 = 0 << 2;
const ATTR_NORMAL: u64 = 1 << 2;
const EXECUTE_NEVER: u64 = (1 << 53) | (1 << 54);
/// MAIR_EL1: attribute 0 Device-nGnRnE, attribute 1 Normal write-back.
const MAIR: u64 = 0xff << 8;
/// TCR_EL1: 32-bit addresses (T0SZ 32, walks start at level 1), walks
/// write-back inner shareable, 4 KiB granule, no TTBR1 walks, 4 GiB
/// physical addresses.
const TCR: u64 = 32 | (1 << 8) | (1 << 10) | (3 << 12) | (1 << 23);
const SCTLR_M: u64 = 1;
const SCTLR_A: u64 = 1 << 1;
const SCTLR_C: u64 = 1 << 2;
const SCTLR_I: u64 = 1 << 12;

/// Called by `_start` with the agent window.
pub extern "C" fn start(base: *mut u8, end: usize) -> ! {
    let window = (base as u64, end as u64);
    mmu_on(window);
    crate::platform::init_heap();
    gic_init();
    let len = match map_shared_memory(window) {
        Ok(len) => len,
        Err(what) => {
            console("rolex-dpu-image: no agent memory: ");
            console(what);
            console("\n");
            exit(2)
        }
    };
    // SAFETY: `map_shared_memory` placed the ivshmem BAR of `len` bytes at
    // `base` (inside the window, page aligned: the linker script asserts
    // it), which `mmu_on` mapped as normal memory; nothing else in the
    // image uses it, it stays mapped while the core runs, and the host
    // processes sharing the backing file only use atomics and copies.
    let boot = unsafe { Boot::new(base, len) };
    if command_line_has("probe-atomics") {
        exit(crate::probe::atomics(boot.into_shared()))
    }
    exit(crate::run(boot))
}

/// Builds the identity map and turns the MMU and caches on.
fn mmu_on((win_start, win_end): (u64, u64)) {
    // SAFETY: the tables are statics that only this function names; it
    // runs once, on the only running core, before the MMU is on (so no
    // translation uses them while they are written). The system register
    // writes install those tables; the map is the identity, so the code,
    // data and stack stay where they are.
    unsafe {
        let l2 = &mut *addr_of_mut!(L2);
        for (i, e) in l2.0.iter_mut().enumerate() {
            let at = (i as u64) << 21;
            let normal = at >= win_start && at + (1 << 21) <= win_end;
            let attr = if normal {
                ATTR_NORMAL | INNER_SHAREABLE
            } else {
                ATTR_DEVICE
            };
            *e = at | BLOCK | ACCESSED | attr | EXECUTE_NEVER;
        }
        let l1 = &mut *addr_of_mut!(L1);
        l1.0[0] = addr_of!(L2) as u64 | TABLE;
        l1.0[1] = RAM_BASE | BLOCK | ACCESSED | ATTR_NORMAL | INNER_SHAREABLE;
        asm!(
            "dsb ish",
            "msr mair_el1, {mair}",
            "msr tcr_el1, {tcr}",
            "msr ttbr0_el1, {ttbr}",
            "isb",
            "tlbi vmalle1",
            "dsb ish",
            "isb",
            mair = in(reg) MAIR,
            tcr = in(reg) TCR,
            ttbr = in(reg) addr_of!(L1) as u64,
            options(nostack),
        );
        let mut sctlr: u64;
        asm!("mrs {s}, sctlr_el1", s = out(reg) sctlr, options(nomem, nostack));
        sctlr = (sctlr | SCTLR_M | SCTLR_C | SCTLR_I) & !SCTLR_A;
        asm!("msr sctlr_el1, {s}", "isb", s = in(reg) sctlr, options(nostack));
    }
}

/// Reads a 32-bit device register.
///
/// # Safety
/// `at` must be a register of the `virt` machine, mapped as device memory.
unsafe fn reg_read(at: usize) -> u32 {
    // SAFETY: the caller's contract.
    unsafe { read_volatile(at as *const u32) }
}

/// Writes a 32-bit device register.
///
/// # Safety
/// As [`reg_read`]; the write must be one the device expects.
unsafe fn reg_write(at: usize, value: u32) {
    // SAFETY: the caller's contract.
    unsafe { write_volatile(at as *mut u32, value) }
}

/// Lets the virtual timer's interrupt reach the core (never taken: IRQs
/// stay masked, it only ends a `wfi`).
fn gic_init() {
    // SAFETY: the GICv2 distributor and CPU interface registers of the
    // `virt` machine (device memory in the identity map): enable the
    // distributor, the timer's PPI, all priorities, the CPU interface.
    unsafe {
        reg_write(GICD, 1);
        reg_write(GICD + 0x100, 1 << VTIMER_INTID);
        reg_write(GICC + 0x004, 0xff);
        reg_write(GICC, 1);
    }
}

/// Address of configuration register `reg` of device `dev` on bus 0.
fn config(dev: usize, reg: usize) -> usize {
    ECAM + (dev << 15) + reg
}

/// Finds the `ivshmem-plain` device, places its shared memory (BAR2, a
/// 64-bit memory BAR) at the window's start and its registers (BAR0) just
/// after the window, and enables memory decoding; returns the shared
/// memory's length.
fn map_shared_memory((win_start, win_end): (u64, u64)) -> Result<u64, &'static str> {
    // SAFETY: reads of the vendor/device word of each slot on bus 0 of the
    // ECAM (absent devices read as all ones).
    let dev = (0..32)
        .find(|&d| unsafe { reg_read(config(d, 0)) } == IVSHMEM_ID)
        .ok_or("no ivshmem-plain device on PCI bus 0 (-device ivshmem-plain,memdev=…)")?;
    let (lo, hi) = (config(dev, 0x18), config(dev, 0x1c));
    // SAFETY: the BAR sizing protocol on the device found above (write all
    // ones, read the size mask back), then its address; memory decoding is
    // still off, so nothing is mapped while the BAR holds the mask.
    let size = unsafe {
        if reg_read(lo) & 0b111 != 0b100 {
            return Err("ivshmem BAR2 is not a 64-bit memory BAR");
        }
        reg_write(lo, u32::MAX);
        reg_write(hi, u32::MAX);
        let mask = (u64::from(reg_read(hi)) << 32) | u64::from(reg_read(lo) & !0xf);
        (!mask).wrapping_add(1)
    };
    if size == 0 || size > win_end - win_start || win_start % size != 0 {
        return Err("the ivshmem memory does not fit the agent window (at most 256 MiB)");
    }
    // SAFETY: programming the BARs of the device found above with
    // addresses inside the PCIe memory window, then turning on memory
    // decoding (command register bit 1).
    unsafe {
        reg_write(lo, win_start as u32);
        reg_write(hi, (win_start >> 32) as u32);
        reg_write(config(dev, 0x10), win_end as u32);
        let command = config(dev, 0x04);
        write_volatile(
            command as *mut u16,
            read_volatile(command as *const u16) | 0b10,
        );
    }
    Ok(size)
}

/// An Arm semihosting call.
///
/// # Safety
/// `arg` must be what operation `op` expects (a pointer to its parameter
/// block, valid for the call).
unsafe fn semihost(op: usize, arg: usize) -> usize {
    let ret: usize;
    // SAFETY: `hlt #0xf000` traps to the emulator's semihosting; it reads
    // or writes only the parameter block the caller vouches for.
    unsafe {
        asm!("hlt #0xf000", inout("x0") op => ret, in("x1") arg, options(nostack));
    }
    ret
}

/// Whether the semihosting command line (the image's name, then QEMU's
/// `-append`) has `word` among its blank-separated words.
fn command_line_has(word: &str) -> bool {
    let mut buf = [0u8; 256];
    let mut block = [buf.as_mut_ptr() as usize, buf.len()];
    // SAFETY: the block names `buf` and its length; the call writes at most
    // that many bytes into it and the length it wrote into the block.
    if unsafe { semihost(SYS_GET_CMDLINE, block.as_mut_ptr() as usize) } != 0 {
        return false;
    }
    let n = block[1].min(buf.len());
    buf[..n]
        .split(|&b| b == b' ' || b == 0)
        .any(|w| w == word.as_bytes())
}

/// Counter ticks in `ns` nanoseconds at frequency `frq`.
fn ticks_for(ns: u64, frq: u64) -> u64 {
    (u128::from(ns) * u128::from(frq) / 1_000_000_000).min(u128::from(u64::MAX)) as u64
}

/// Nanoseconds spent waiting in [`nap`] (the core's only idle time).
static NAPPED_NS: AtomicU64 = AtomicU64::new(0);

/// The agent's CPU time: the time since boot less its naps in `wfi`.
pub fn cpu_ns() -> u64 {
    super::now_ns().saturating_sub(NAPPED_NS.load(Relaxed))
}

/// Waits about `ns` nanoseconds in `wfi`, woken by the virtual timer.
pub fn nap(ns: u64) {
    let started = super::now_ns();
    let (now, frq) = counter();
    let until = now.saturating_add(ticks_for(ns, frq));
    // SAFETY: arming the core's own virtual timer (compare value, enable,
    // interrupt unmasked at the timer); no memory is touched.
    unsafe {
        asm!("msr cntv_cval_el0, {v}", "msr cntv_ctl_el0, {on}", "isb",
            v = in(reg) until, on = in(reg) 1u64, options(nomem, nostack));
    }
    while counter().0 < until {
        // SAFETY: `wfi` waits for an interrupt to be pending (the timer's,
        // armed above); IRQs are masked, so none is taken.
        unsafe { asm!("wfi", options(nomem, nostack)) };
    }
    // SAFETY: disarming the timer lowers its interrupt line; the pending
    // interrupt is then acknowledged and ended at the GIC CPU interface
    // (IAR, EOIR), so the next `wfi` waits again.
    unsafe {
        asm!("msr cntv_ctl_el0, xzr", "isb", options(nomem, nostack));
        loop {
            let id = reg_read(GICC + 0x0c);
            if id & 0x3ff >= 1020 {
                break;
            }
            reg_write(GICC + 0x10, id);
        }
    }
    NAPPED_NS.fetch_add(super::now_ns().saturating_sub(started), Relaxed);
}

/// Writes `s` to QEMU's semihosting console.
pub fn console(s: &str) {
    for chunk in s.as_bytes().chunks(127) {
        let mut buf = [0u8; 128];
        buf[..chunk.len()].copy_from_slice(chunk);
        // SAFETY: `buf` is NUL-terminated (its last byte at least).
        unsafe { semihost(SYS_WRITE0, buf.as_ptr() as usize) };
    }
}

/// Ends the emulation with `code` (semihosting `SYS_EXIT`); if that
/// returns, powers the machine off (PSCI `SYSTEM_OFF`), then parks.
pub fn exit(code: i32) -> ! {
    let block = [ADP_STOPPED_APPLICATION_EXIT, code as u32 as usize];
    // SAFETY: the block is the two words `SYS_EXIT` reads on AArch64.
    unsafe { semihost(SYS_EXIT, block.as_ptr() as usize) };
    // SAFETY: PSCI SYSTEM_OFF through QEMU's HVC conduit; it takes no
    // memory and does not return where PSCI is present.
    unsafe { asm!("hvc #0", inout("x0") 0x8400_0008usize => _, options(nomem, nostack)) };
    loop {
        // SAFETY: `wfi` waits; it touches no memory.
        unsafe { asm!("wfi", options(nomem, nostack)) };
    }
}
