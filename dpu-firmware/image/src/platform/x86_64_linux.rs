//! The image as a freestanding static Linux process on x86_64: no libc, no
//! dynamic loader. `_start` (laid out by `linker/x86_64-linux.ld`) reads
//! `argc`/`argv` from the initial stack; the agent's memory is the file
//! named by `argv[1]` (e.g. in `/dev/shm`), mapped shared, so the host
//! process that laid the pool out sees every word the agent writes. The
//! clock, CPU time, naps, console and exit are raw system calls. With
//! `probe-atomics` as `argv[2]` the image runs the atomics probe on the file
//! instead of the agent.

use core::arch::{asm, global_asm};

use super::Boot;

const SYS_WRITE: usize = 1;
const SYS_CLOSE: usize = 3;
const SYS_LSEEK: usize = 8;
const SYS_MMAP: usize = 9;
const SYS_NANOSLEEP: usize = 35;
const SYS_CLOCK_GETTIME: usize = 228;
const SYS_EXIT_GROUP: usize = 231;
const SYS_OPENAT: usize = 257;

const AT_FDCWD: isize = -100;
const O_RDWR: usize = 2;
const O_CLOEXEC: usize = 0o2_000_000;
const SEEK_END: usize = 2;
const PROT_READ_WRITE: usize = 3;
const MAP_SHARED: usize = 1;
const CLOCK_MONOTONIC: usize = 1;
const CLOCK_PROCESS_CPUTIME_ID: usize = 2;

/// A raw system call with up to six arguments; returns the kernel's value
/// (negative: `-errno`).
///
/// # Safety
/// The call and its arguments must be valid for this process: pointer
/// arguments must point to memory the call may read or write.
unsafe fn syscall(n: usize, a: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY: the `syscall` instruction with the Linux x86_64 convention
    // (number in rax, arguments in rdi, rsi, rdx, r10, r8, r9; rcx and r11
    // clobbered, result in rax); the caller vouches for the arguments.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") n as isize => ret,
            in("rdi") a[0],
            in("rsi") a[1],
            in("rdx") a[2],
            in("r10") a[3],
            in("r8") a[4],
            in("r9") a[5],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

// The entry point: the kernel starts us with `rsp` at `argc`; pass that to
// Rust with the stack aligned as the ABI wants for a call.
global_asm!(
    ".globl _start",
    ".type _start,@function",
    "_start:",
    "xor ebp, ebp",
    "mov rdi, rsp",
    "and rsp, -16",
    "call {entry}",
    "ud2",
    entry = sym start,
);

/// Length of the NUL-terminated string at `p`.
///
/// # Safety
/// `p` must point to a NUL-terminated string.
unsafe fn c_strlen(p: *const u8) -> usize {
    let mut n = 0;
    // SAFETY: the string is NUL-terminated (the caller's contract), so
    // every byte up to and including the NUL is readable. A volatile read
    // keeps the loop from becoming a call to the C `strlen`.
    while unsafe { p.add(n).read_volatile() } != 0 {
        n += 1;
    }
    n
}

/// The bytes of the NUL-terminated string at `p` (without the NUL).
///
/// # Safety
/// `p` must point to a NUL-terminated string that lives for the whole
/// process.
unsafe fn c_str(p: *const u8) -> &'static [u8] {
    // SAFETY: the caller's contract; `c_strlen` stops at the NUL.
    unsafe { core::slice::from_raw_parts(p, c_strlen(p)) }
}

extern "C" fn start(sp: *const usize) -> ! {
    super::init_heap();
    // SAFETY: the kernel's initial stack holds argc followed by argc
    // pointers to NUL-terminated strings (and a NULL); `sp` points at argc.
    let (argc, argv) = unsafe { (*sp, sp.add(1) as *const *const u8) };
    if argc < 2 {
        console("usage: rolex-dpu-image POOL_FILE [probe-atomics]\n");
        exit(2);
    }
    // SAFETY: argc ≥ 2, so argv[1] exists and is a NUL-terminated string.
    let path = unsafe { *argv.add(1) };
    // SAFETY: argv has argc entries, so argv[2] exists when argc ≥ 3 and is
    // a NUL-terminated string that lives for the whole process.
    let probe = argc >= 3 && unsafe { c_str(*argv.add(2)) } == b"probe-atomics";
    match map(path) {
        Ok(boot) if probe => exit(crate::probe::atomics(boot.into_shared())),
        Ok(boot) => exit(crate::run(boot)),
        Err(what) => {
            console("rolex-dpu-image: cannot map ");
            // SAFETY: `path` is argv[1], a NUL-terminated string that
            // lives for the whole process.
            let name = unsafe { c_str(path) };
            console(core::str::from_utf8(name).unwrap_or("the pool file"));
            console(": ");
            console(what);
            console("\n");
            exit(2)
        }
    }
}

/// Opens and maps the file at `path` shared, read-write.
fn map(path: *const u8) -> Result<Boot, &'static str> {
    // SAFETY: `path` is a NUL-terminated string (argv[1]).
    let fd = unsafe {
        syscall(
            SYS_OPENAT,
            [
                AT_FDCWD as usize,
                path as usize,
                O_RDWR | O_CLOEXEC,
                0,
                0,
                0,
            ],
        )
    };
    if fd < 0 {
        return Err("open failed");
    }
    let fd = fd as usize;
    // SAFETY: lseek on our own descriptor touches no memory.
    let len = unsafe { syscall(SYS_LSEEK, [fd, 0, SEEK_END, 0, 0, 0]) };
    if len <= 0 {
        // SAFETY: closing our own descriptor.
        unsafe { syscall(SYS_CLOSE, [fd, 0, 0, 0, 0, 0]) };
        return Err("the file is empty or cannot be sized");
    }
    // SAFETY: a fresh shared mapping of our own descriptor at an address
    // the kernel picks: it aliases no memory this process uses.
    let base = unsafe {
        syscall(
            SYS_MMAP,
            [0, len as usize, PROT_READ_WRITE, MAP_SHARED, fd, 0],
        )
    };
    // SAFETY: the mapping keeps the file referenced; the descriptor is no
    // longer needed.
    unsafe { syscall(SYS_CLOSE, [fd, 0, 0, 0, 0, 0]) };
    if (-4095..0).contains(&base) {
        return Err("mmap failed");
    }
    // SAFETY: the kernel mapped `len` bytes readable and writable at
    // `base` (page aligned), and this process never unmaps them; other
    // processes that map the same file share them, which is the point.
    Ok(unsafe { Boot::new(base as *mut u8, len as u64) })
}

#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

fn clock(id: usize) -> u64 {
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: `ts` is a live, writable timespec for the call.
    let r = unsafe {
        syscall(
            SYS_CLOCK_GETTIME,
            [id, &mut ts as *mut Timespec as usize, 0, 0, 0, 0],
        )
    };
    if r < 0 {
        return 0;
    }
    (ts.sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.nsec as u64)
}

/// A monotonic clock, in nanoseconds.
pub fn now_ns() -> u64 {
    clock(CLOCK_MONOTONIC)
}

/// CPU time the process (the agent) has used, in nanoseconds.
pub fn cpu_ns() -> u64 {
    clock(CLOCK_PROCESS_CPUTIME_ID)
}

/// Sleeps about `ns` nanoseconds (the idle agent's park).
pub fn nap(ns: u64) {
    let ts = Timespec {
        sec: (ns / 1_000_000_000) as i64,
        nsec: (ns % 1_000_000_000) as i64,
    };
    // SAFETY: `ts` is a live timespec; no remainder is asked for.
    unsafe {
        syscall(
            SYS_NANOSLEEP,
            [&ts as *const Timespec as usize, 0, 0, 0, 0, 0],
        )
    };
}

/// Writes `s` to standard error (for errors before the log ring exists).
pub fn console(s: &str) {
    // SAFETY: `s` is readable for its length; fd 2 may be closed, in which
    // case the call fails harmlessly.
    unsafe { syscall(SYS_WRITE, [2, s.as_ptr() as usize, s.len(), 0, 0, 0]) };
}

/// Ends the process with `code`.
pub fn exit(code: i32) -> ! {
    loop {
        // SAFETY: exit_group takes no pointers and does not return.
        unsafe { syscall(SYS_EXIT_GROUP, [code as usize, 0, 0, 0, 0, 0]) };
    }
}

// The C memory routines the compiler emits calls to. With no libc, the
// image brings its own; string instructions keep them from being compiled
// back into calls to themselves.

/// Copies `n` bytes from `src` to `dest` (no overlap).
///
/// # Safety
/// The C contract: both ranges valid for `n` bytes and not overlapping.
#[no_mangle]
pub unsafe extern "C" fn memcpy(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: `rep movsb` copies rcx bytes from [rsi] to [rdi] forwards
    // (the ABI guarantees the direction flag is clear); the caller
    // guarantees both ranges are valid.
    unsafe {
        asm!(
            "rep movsb",
            inout("rcx") n => _,
            inout("rdi") dest => _,
            inout("rsi") src => _,
            options(nostack, preserves_flags),
        );
    }
    dest
}

/// Copies `n` bytes from `src` to `dest`; the ranges may overlap.
///
/// # Safety
/// The C contract: both ranges valid for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn memmove(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dest as usize).wrapping_sub(src as usize) >= n {
        // `dest` is below `src` or past its end: a forward copy is safe.
        // SAFETY: forwarded contract; forward order never reads a byte
        // after overwriting it in this case.
        return unsafe { memcpy(dest, src, n) };
    }
    // SAFETY: a backward copy (direction flag set, from the last byte)
    // handles `dest` inside `[src, src + n)`; the flag is cleared again
    // as the ABI requires.
    unsafe {
        asm!(
            "std",
            "rep movsb",
            "cld",
            inout("rcx") n => _,
            inout("rdi") dest.wrapping_add(n).wrapping_sub(1) => _,
            inout("rsi") src.wrapping_add(n).wrapping_sub(1) => _,
            options(nostack),
        );
    }
    dest
}

/// Fills `n` bytes at `dest` with the low byte of `c`.
///
/// # Safety
/// The C contract: the range is valid for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn memset(dest: *mut u8, c: i32, n: usize) -> *mut u8 {
    // SAFETY: `rep stosb` stores al into rcx bytes from [rdi] forwards;
    // the caller guarantees the range.
    unsafe {
        asm!(
            "rep stosb",
            inout("rcx") n => _,
            inout("rdi") dest => _,
            in("al") c as u8,
            options(nostack, preserves_flags),
        );
    }
    dest
}

/// Compares `n` bytes: negative, zero or positive as in C.
///
/// # Safety
/// The C contract: both ranges valid for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    for i in 0..n {
        // SAFETY: `i < n` and both ranges hold `n` bytes. Volatile reads
        // keep the loop from being turned back into a call to `memcmp`.
        let (x, y) = unsafe { (a.add(i).read_volatile(), b.add(i).read_volatile()) };
        if x != y {
            return i32::from(x) - i32::from(y);
        }
    }
    0
}

/// Compares `n` bytes for equality only (zero iff equal).
///
/// # Safety
/// The C contract: both ranges valid for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: forwarded contract.
    unsafe { memcmp(a, b, n) }
}
