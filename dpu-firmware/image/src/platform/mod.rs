//! The platform module: the only code of the image that touches the
//! machine. Everything `unsafe` in the image is here, each block with its
//! `// SAFETY:` reason; the rest of the image sees a safe interface:
//!
//! - [`Boot`]: what the entry point found — the agent's memory (the agent
//!   area and the pool after it, see `rolex_core::layout::AgentArea`).
//! - [`Pool`] and [`Area`]: bounds-checked access to that memory, both
//!   windows of `rolex_dpu::SharedBytes` (the checked copies and
//!   word atomics every pool implementation shares); `Pool` implements
//!   `rolex_dpu::PoolMemory`.
//! - [`now_ns`], [`cpu_ns`], [`nap`], [`exit`], [`console`]: clock, CPU
//!   time, idling, leaving, and a last-resort console for errors met before
//!   the log ring exists.
//! - the heap (`embedded-alloc` over a static arena) and the panic handler.
//!
//! The arch modules hold the entry point and the system interface:
//! `x86_64_linux` (a freestanding static Linux process: raw syscalls, the
//! memory handed over as a file mapped with `mmap`) and `aarch64` (bare
//! metal on Arm cores, one board module per machine: `bluefield`, whose
//! memory is a window of the map `linker/bluefield-aarch64.ld` reserves,
//! and `qemu_virt`, QEMU's `virt` machine with the memory shared with the
//! host through an `ivshmem` PCI device, `linker/qemu-virt-aarch64.ld`).
//!
//! The invariant every accessor keeps: an access is inside the mapping (or
//! it is refused with an error), and 8-byte atomics are only made on
//! aligned words.

use rolex_dpu::{MemError, PoolMemory, SharedBytes};

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod x86_64_linux;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
use x86_64_linux as arch;

#[cfg(all(target_arch = "aarch64", target_os = "none"))]
mod aarch64;
#[cfg(all(target_arch = "aarch64", target_os = "none"))]
use aarch64 as arch;

pub use arch::{console, cpu_ns, exit, nap, now_ns};

/// Bytes of the heap arena (the agent's vectors: one model's leaves and
/// segments at a time, plus its bookkeeping).
const HEAP_BYTES: usize = 16 << 20;

/// The memory the agent was handed: a base pointer and a length.
pub struct Boot {
    base: *mut u8,
    len: u64,
}

impl Boot {
    /// # Safety
    /// `[base, base + len)` must be mapped readable and writable for the
    /// rest of the process and aligned to 8 bytes; other parties (compute
    /// nodes through a NIC, a host process) may read and write it at any
    /// time, and this process keeps no Rust reference into it.
    pub(crate) unsafe fn new(base: *mut u8, len: u64) -> Self {
        Self { base, len }
    }

    /// Bytes handed over.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Splits the memory into the agent area `[0, pool_offset)` and the
    /// pool `[pool_offset, len)`; `None` if `pool_offset` is not an
    /// 8-byte-aligned offset inside the memory.
    pub fn split(self, pool_offset: u64) -> Option<(Area, Pool)> {
        if !pool_offset.is_multiple_of(8) || pool_offset >= self.len {
            return None;
        }
        // SAFETY: both windows are inside the memory handed over, which is
        // mapped for the rest of the process and shared as `SharedBytes`
        // requires (`Boot::new`'s contract); they do not overlap.
        let (area, pool) = unsafe {
            (
                SharedBytes::new(self.base, pool_offset),
                SharedBytes::new(
                    self.base.wrapping_add(pool_offset as usize),
                    self.len - pool_offset,
                ),
            )
        };
        Some((Area(area), Pool(pool)))
    }

    /// The whole memory as shared bytes, for the atomics probe (which runs
    /// instead of the agent, never beside it).
    pub fn into_shared(self) -> SharedBytes<'static> {
        // SAFETY: the memory handed over, mapped and shared as
        // `SharedBytes` requires (`Boot::new`'s contract); `self` is
        // consumed, so no other window of it is made.
        unsafe { SharedBytes::new(self.base, self.len) }
    }

    /// The first `len` bytes as an area, for reading its header before the
    /// split is known.
    pub fn header(&self, len: u64) -> Option<Area> {
        // SAFETY: `[base, base + len)` is inside the memory handed over
        // (checked here), mapped and shared as `SharedBytes` requires
        // (`Boot::new`'s contract).
        (len <= self.len).then(|| Area(unsafe { SharedBytes::new(self.base, len) }))
    }
}

/// The pool: what compute nodes see through their NIC.
pub struct Pool(SharedBytes<'static>);

impl PoolMemory for Pool {
    fn size(&self) -> u64 {
        self.0.len()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.0.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), MemError> {
        self.0.write(offset, buf)
    }
    fn load(&self, offset: u64) -> Result<u64, MemError> {
        self.0.load(offset)
    }
    fn store(&self, offset: u64, value: u64) -> Result<(), MemError> {
        self.0.store(offset, value)
    }
    fn cas(&self, offset: u64, expected: u64, new: u64) -> Result<u64, MemError> {
        self.0.cas(offset, expected, new)
    }
    fn faa(&self, offset: u64, add: u64) -> Result<u64, MemError> {
        self.0.faa(offset, add)
    }
    fn relax(&self, attempt: u32) {
        // Writers hold a chain for microseconds: spin briefly, then nap.
        if attempt < 64 {
            core::hint::spin_loop();
        } else {
            nap(u64::from(attempt.min(1000)) * 1000);
        }
    }
    fn now_ns(&self) -> u64 {
        now_ns()
    }
}

/// The agent area (header and log ring) in front of the pool.
pub struct Area(SharedBytes<'static>);

impl Area {
    /// Bytes of the area.
    pub fn len(&self) -> u64 {
        self.0.len()
    }

    /// Copies area bytes at `offset` into `buf`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.0.read(offset, buf)
    }

    /// Copies `buf` into the area at `offset`.
    pub fn write(&self, offset: u64, buf: &[u8]) -> Result<(), MemError> {
        self.0.write(offset, buf)
    }

    /// Atomically loads the word at `offset`.
    pub fn load(&self, offset: u64) -> Result<u64, MemError> {
        self.0.load(offset)
    }

    /// Atomically stores the word at `offset`.
    pub fn store(&self, offset: u64, value: u64) -> Result<(), MemError> {
        self.0.store(offset, value)
    }
}

// The heap: a static arena handed to `embedded-alloc` once at start.
#[global_allocator]
static HEAP: embedded_alloc::LlffHeap = embedded_alloc::LlffHeap::empty();

/// The arena's bytes (8-aligned through the `u64` element type).
static mut ARENA: [u64; HEAP_BYTES / 8] = [0; HEAP_BYTES / 8];

/// Hands the arena to the allocator. Called once, by the arch entry point,
/// before any allocation.
fn init_heap() {
    // SAFETY: called exactly once, first thing after entry and before any
    // allocation (the entry points call it before anything else); the
    // arena is a static that nothing else names, so the allocator owns it
    // exclusively for the rest of the process.
    unsafe {
        let start = core::ptr::addr_of_mut!(ARENA) as usize;
        HEAP.init(start, HEAP_BYTES);
    }
}

/// The heap's and the logger's lock. The image runs one thread and takes
/// no interrupts or signals it handles, so a critical section needs no
/// masking: it is a no-op.
struct SingleThread;
critical_section::set_impl!(SingleThread);

// SAFETY: the image is single-threaded and installs no interrupt or
// signal handler, so no code can run concurrently with a critical
// section; acquiring one therefore needs to do nothing.
unsafe impl critical_section::Impl for SingleThread {
    unsafe fn acquire() -> critical_section::RawRestoreState {}
    unsafe fn release(_token: critical_section::RawRestoreState) {}
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    let mut msg: heapless::String<192> = heapless::String::new();
    let _ = core::fmt::write(&mut msg, format_args!("{info}"));
    defmt::error!("panic: {=str}", msg.as_str());
    crate::log::mark_failed();
    console("rolex-dpu-image: panic: ");
    console(msg.as_str());
    console("\n");
    exit(101)
}
