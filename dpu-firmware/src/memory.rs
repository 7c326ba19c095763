//! The agent's view of its own memory: the pool it serves, as a trait.
//!
//! The retraining logic is `no_std` and never touches a NIC: it reads and
//! writes the pool through [`PoolMemory`], which a hosted build implements
//! over a registered region (so its 8-byte atomics are the very words the
//! NIC's remote `CAS`/`FAA` act on) and a freestanding build over raw
//! memory. The invariant every implementation keeps: `load`, `store`, `cas`
//! and `faa` are atomic with respect to each other and to remote atomics on
//! the same aligned word; `read` and `write` are plain copies that may race
//! with remote one-sided operations (leaves are validated by checksum).
//!
//! [`SharedBytes`] is that contract over a base pointer and a length,
//! written once: the bounds check, the alignment check and the `AtomicU64`
//! on the word. Every implementation whose memory is a plain address range
//! (the hosted pool over a registered region, the firmware image's mapped
//! window, the tests' word array) makes its atomics through it.

use core::fmt;
use core::marker::PhantomData;
use core::sync::atomic::{AtomicU64, Ordering::SeqCst};

/// An access the memory refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemError {
    /// `[offset, offset + len)` is not inside the pool.
    OutOfBounds {
        /// First byte.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// An atomic on a word that is not 8-byte aligned.
    Misaligned {
        /// The offset.
        offset: u64,
    },
    /// The memory is gone (the region was deregistered).
    Unavailable,
}

impl fmt::Display for MemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::OutOfBounds { offset, len } => {
                write!(f, "pool access [{offset:#x}, +{len}) is out of bounds")
            }
            Self::Misaligned { offset } => write!(f, "pool word at {offset:#x} is not aligned"),
            Self::Unavailable => f.write_str("pool memory is no longer available"),
        }
    }
}

impl core::error::Error for MemError {}

/// The pool as the memory node sees it (see the module docs).
pub trait PoolMemory {
    /// Bytes of the pool.
    fn size(&self) -> u64;
    /// Copies pool bytes at `offset` into `buf`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), MemError>;
    /// Copies `buf` into the pool at `offset`.
    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), MemError>;
    /// Atomically loads the aligned word at `offset`.
    fn load(&self, offset: u64) -> Result<u64, MemError>;
    /// Atomically stores the aligned word at `offset`.
    fn store(&self, offset: u64, value: u64) -> Result<(), MemError>;
    /// Compare-and-swap on the aligned word at `offset`; returns the old
    /// value (the swap happened iff it equals `expected`).
    fn cas(&self, offset: u64, expected: u64, new: u64) -> Result<u64, MemError>;
    /// Fetch-and-add (wrapping) on the aligned word at `offset`; returns the
    /// old value.
    fn faa(&self, offset: u64, add: u64) -> Result<u64, MemError>;
    /// Waits a little before the `attempt`-th retry of something another
    /// party must finish (a writer's lock, a torn leaf): spin, yield or
    /// sleep, as the platform prefers. Never called on the data path.
    fn relax(&self, attempt: u32);
    /// A monotonic clock in nanoseconds: freeze-time statistics, the
    /// freeze's deadline, the CirQ's abandoned-ticket timeout and the
    /// backoff of failing models all read it. A platform without one may
    /// return 0, and then gets none of those timeouts (a freeze waits for
    /// every writer, an unwritten CirQ ticket is waited for, a failing
    /// model is not retried by [`crate::Agent::poll`]).
    fn now_ns(&self) -> u64;
    /// The agent enters (`true`) or leaves (`false`) a model's frozen
    /// section (retraining steps 2–6), during which every writer of the
    /// model waits for it: a platform may keep the agent from being
    /// preempted meanwhile (the hosted memory node raises its thread to a
    /// real-time priority), and [`PoolMemory::relax`] inside it must still
    /// let the writers it waits for run. The default does nothing.
    fn frozen(&self, _on: bool) {}
}

/// A byte range other parties read and write at any time (compute nodes
/// through a NIC, a host process): bounds-checked copies and 8-byte atomics
/// on aligned words, the access [`PoolMemory`] promises, over a base pointer
/// and a length.
///
/// Every access is checked before memory is touched: a range that is not
/// inside `[0, len)` is refused with [`MemError::OutOfBounds`], an atomic
/// on a word whose address is not 8-byte aligned with
/// [`MemError::Misaligned`]. Cheap to make (two words): an implementation
/// that owns its memory through a handle may build one per access.
#[derive(Clone, Copy, Debug)]
pub struct SharedBytes<'a> {
    base: *mut u8,
    len: u64,
    /// The range is valid for `'a` (`new`'s contract).
    valid: PhantomData<&'a [AtomicU64]>,
}

// SAFETY: `SharedBytes` names memory that is, by design (`new`'s contract),
// accessed from anywhere — other threads, processes, NICs — with atomics
// for words and copies for bytes; which thread holds the pointer changes
// nothing about that, and `&SharedBytes` gives no access that another
// party could not make at the same time anyway.
unsafe impl Send for SharedBytes<'_> {}
// SAFETY: as for `Send`.
unsafe impl Sync for SharedBytes<'_> {}

impl<'a> SharedBytes<'a> {
    /// The `len` bytes at `base`.
    ///
    /// # Safety
    /// `[base, base + len)` must be valid for reads and writes, and stay
    /// allocated and unmoved, for `'a`. Others may access it concurrently only with atomics on its
    /// aligned words or with copies (as a NIC does); no Rust reference to
    /// it may be alive while it is accessed through this value.
    pub const unsafe fn new(base: *mut u8, len: u64) -> Self {
        Self {
            base,
            len,
            valid: PhantomData,
        }
    }

    /// Bytes of the range.
    pub const fn len(&self) -> u64 {
        self.len
    }

    /// Whether the range is empty.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `offset` as an index, if `[offset, offset + len)` is inside.
    fn check(&self, offset: u64, len: u64) -> Result<usize, MemError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(offset as usize),
            _ => Err(MemError::OutOfBounds { offset, len }),
        }
    }

    /// The aligned word at `offset`.
    fn word(&self, offset: u64) -> Result<&'a AtomicU64, MemError> {
        let at = self.check(offset, 8)?;
        let p = self.base.wrapping_add(at);
        if (p as usize) % 8 != 0 {
            return Err(MemError::Misaligned { offset });
        }
        // SAFETY: `[p, p + 8)` is inside the range (checked above), which is
        // valid for `'a` (`new`'s contract), and 8-byte aligned.
        // `AtomicU64` has the size and alignment of `u64` and every bit
        // pattern is valid. Other parties access these words with atomics
        // too (a NIC's CAS/FAA, the loopback NIC's `AtomicU64`), so this is
        // the shared-memory protocol the pool is built on.
        Ok(unsafe { &*(p as *const AtomicU64) })
    }

    /// Copies the bytes at `offset` into `buf`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let at = self.check(offset, buf.len() as u64)?;
        // SAFETY: the source range is inside the range (checked above) and
        // `buf` is a distinct Rust buffer, so they cannot overlap. Other
        // parties may write the source meanwhile (like DMA): the copy may
        // then be torn, which every reader of leaves detects by checksum;
        // no Rust reference to the range exists (`new`'s contract).
        unsafe { core::ptr::copy_nonoverlapping(self.base.add(at), buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    /// Copies `buf` into the range at `offset`.
    pub fn write(&self, offset: u64, buf: &[u8]) -> Result<(), MemError> {
        let at = self.check(offset, buf.len() as u64)?;
        // SAFETY: as for `read`, with source and destination swapped; the
        // range is writable (`new`'s contract).
        unsafe { core::ptr::copy_nonoverlapping(buf.as_ptr(), self.base.add(at), buf.len()) };
        Ok(())
    }

    /// Atomically loads the aligned word at `offset`.
    pub fn load(&self, offset: u64) -> Result<u64, MemError> {
        Ok(self.word(offset)?.load(SeqCst))
    }

    /// Atomically stores the aligned word at `offset`.
    pub fn store(&self, offset: u64, value: u64) -> Result<(), MemError> {
        self.word(offset)?.store(value, SeqCst);
        Ok(())
    }

    /// Compare-and-swap on the aligned word at `offset`; returns the old
    /// value (the swap happened iff it equals `expected`).
    pub fn cas(&self, offset: u64, expected: u64, new: u64) -> Result<u64, MemError> {
        Ok(
            match self
                .word(offset)?
                .compare_exchange(expected, new, SeqCst, SeqCst)
            {
                Ok(v) | Err(v) => v,
            },
        )
    }

    /// Fetch-and-add (wrapping) on the aligned word at `offset`; returns
    /// the old value.
    pub fn faa(&self, offset: u64, add: u64) -> Result<u64, MemError> {
        Ok(self.word(offset)?.fetch_add(add, SeqCst))
    }
}

/// A shared reference to a pool is a pool (several parties — the agent and
/// a test, or two agents' phases — may hold one).
impl<M: PoolMemory + ?Sized> PoolMemory for &M {
    fn size(&self) -> u64 {
        (**self).size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), MemError> {
        (**self).read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), MemError> {
        (**self).write(offset, buf)
    }
    fn load(&self, offset: u64) -> Result<u64, MemError> {
        (**self).load(offset)
    }
    fn store(&self, offset: u64, value: u64) -> Result<(), MemError> {
        (**self).store(offset, value)
    }
    fn cas(&self, offset: u64, expected: u64, new: u64) -> Result<u64, MemError> {
        (**self).cas(offset, expected, new)
    }
    fn faa(&self, offset: u64, add: u64) -> Result<u64, MemError> {
        (**self).faa(offset, add)
    }
    fn relax(&self, attempt: u32) {
        (**self).relax(attempt)
    }
    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }
    fn frozen(&self, on: bool) {
        (**self).frozen(on)
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! A word-array pool for unit tests: every access goes through
    //! `AtomicU64` (words through [`SharedBytes`], bytes word by word), so
    //! tests may race threads against it. Its clock is the test's: it
    //! stands still unless the test moves it ([`VecPool::advance`]) or
    //! asks every `relax` to move it ([`VecPool::tick_on_relax`]), so a
    //! test drives timeouts step by step, never by waiting. It can also fail
    //! writes to a range on purpose ([`VecPool::fail_writes`]).
    use super::*;
    use alloc::vec::Vec;
    use core::sync::atomic::AtomicU32;

    pub(crate) struct VecPool {
        words: Vec<AtomicU64>,
        clock: AtomicU64,
        tick: AtomicU64,
        /// Writes and stores touching `[fail_from, fail_to)` fail while
        /// `fail_left` is not 0 (each failure counts one down).
        fail_from: AtomicU64,
        fail_to: AtomicU64,
        fail_left: AtomicU32,
        /// Mutations (writes, stores, CAS, FAA) left before the pool
        /// refuses every one (the agent "died"); `u64::MAX`: never.
        crash_left: AtomicU64,
        /// Frozen sections entered and left ([`PoolMemory::frozen`]), and
        /// `relax` calls made inside one.
        pub(crate) frozen_in: AtomicU64,
        pub(crate) frozen_out: AtomicU64,
        pub(crate) relax_frozen: AtomicU64,
    }

    impl VecPool {
        pub(crate) fn new(size: u64) -> Self {
            let n = size.div_ceil(8) as usize;
            Self {
                words: (0..n).map(|_| AtomicU64::new(0)).collect(),
                clock: AtomicU64::new(0),
                tick: AtomicU64::new(0),
                fail_from: AtomicU64::new(0),
                fail_to: AtomicU64::new(0),
                fail_left: AtomicU32::new(0),
                crash_left: AtomicU64::new(u64::MAX),
                frozen_in: AtomicU64::new(0),
                frozen_out: AtomicU64::new(0),
                relax_frozen: AtomicU64::new(0),
            }
        }

        /// Moves the clock `ns` forward.
        pub(crate) fn advance(&self, ns: u64) {
            self.clock.fetch_add(ns, SeqCst);
        }

        /// Every later `relax` moves the clock `ns` forward (a waiting
        /// agent sees time pass as it waits).
        pub(crate) fn tick_on_relax(&self, ns: u64) {
            self.tick.store(ns, SeqCst);
        }

        /// The next `times` writes or stores that touch `range` fail with
        /// [`MemError::Unavailable`], changing nothing.
        pub(crate) fn fail_writes(&self, range: core::ops::Range<u64>, times: u32) {
            self.fail_from.store(range.start, SeqCst);
            self.fail_to.store(range.end, SeqCst);
            self.fail_left.store(times, SeqCst);
        }

        /// After `n` more mutations every one fails, changing nothing: the
        /// agent using the pool died there (each mutation lands whole or
        /// not at all). [`Self::revive`] ends it.
        pub(crate) fn crash_after(&self, n: u64) {
            self.crash_left.store(n, SeqCst);
        }

        /// Mutations succeed again (a new agent attaches).
        pub(crate) fn revive(&self) {
            self.crash_left.store(u64::MAX, SeqCst);
        }

        /// Whether the pool is past its crash point.
        fn crashed(&self) -> Result<(), MemError> {
            match self.crash_left.fetch_update(SeqCst, SeqCst, |n| match n {
                u64::MAX => Some(n),
                0 => None,
                n => Some(n - 1),
            }) {
                Ok(_) => Ok(()),
                Err(_) => Err(MemError::Unavailable),
            }
        }

        /// An injected failure for a write of `len` bytes at `offset`.
        fn injected(&self, offset: u64, len: u64) -> Result<(), MemError> {
            self.crashed()?;
            let hits =
                offset < self.fail_to.load(SeqCst) && offset + len > self.fail_from.load(SeqCst);
            if hits
                && self
                    .fail_left
                    .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                    .is_ok()
            {
                return Err(MemError::Unavailable);
            }
            Ok(())
        }

        fn check(&self, offset: u64, len: u64) -> Result<(), MemError> {
            self.words().check(offset, len).map(|_| ())
        }

        /// The words as shared bytes, for the checked atomics.
        fn words(&self) -> SharedBytes<'_> {
            // SAFETY: `self.words` is allocated, `8 * len` bytes, aligned to
            // 8 and never moved while `self` is borrowed; every access
            // through it is atomic on a word (`AtomicU64` is interior
            // mutable, so writing through a pointer from `&self` is allowed),
            // and the byte copies of this pool go word by word through the
            // same atomics, so nothing races non-atomically.
            unsafe { SharedBytes::new(self.words.as_ptr() as *mut u8, self.size()) }
        }
    }

    /// A pool bulk-loaded with keys `0, 10, …, 10 (n − 1)` (value: the
    /// key's index): leaves of 4 slots holding 2 keys, models of at most
    /// 4 leaves, ε = 1, leaf region 2, 64 spare leaves and 64 spare
    /// directory slots; with the first free model-region byte.
    pub(crate) fn small_pool(n: u64) -> (VecPool, u64) {
        let cfg = crate::bulk::BulkConfig {
            leaf_region_id: 2,
            leaf_slots: 4,
            keys_per_leaf: 2,
            epsilon: 1,
            max_model_leaves: 4,
            spare_leaves: 64,
            model_region_spare: 1 << 16,
            directory_spare: 64,
            value_capacity: 1 << 16,
            redo_blocks: 4,
            redo_slots: 4,
        };
        let pairs: Vec<(u64, u64)> = (0..n).map(|i| (i * 10, i)).collect();
        let keys: Vec<u64> = pairs.iter().map(|p| p.0).collect();
        let plan = crate::bulk::BulkPlan::new(&cfg, &keys).expect("a small plan");
        let mem = VecPool::new(plan.pool_size());
        plan.write(&mem, &pairs).expect("writing a small pool");
        (mem, plan.next_free())
    }

    impl PoolMemory for VecPool {
        fn size(&self) -> u64 {
            self.words.len() as u64 * 8
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), MemError> {
            self.check(offset, buf.len() as u64)?;
            for (i, b) in buf.iter_mut().enumerate() {
                let at = offset + i as u64;
                let w = self.words[(at / 8) as usize].load(SeqCst);
                *b = w.to_le_bytes()[(at % 8) as usize];
            }
            Ok(())
        }
        fn write(&self, offset: u64, buf: &[u8]) -> Result<(), MemError> {
            self.check(offset, buf.len() as u64)?;
            self.injected(offset, buf.len() as u64)?;
            for (i, b) in buf.iter().enumerate() {
                let at = offset + i as u64;
                let w = &self.words[(at / 8) as usize];
                let mut bytes = w.load(SeqCst).to_le_bytes();
                bytes[(at % 8) as usize] = *b;
                w.store(u64::from_le_bytes(bytes), SeqCst);
            }
            Ok(())
        }
        fn load(&self, offset: u64) -> Result<u64, MemError> {
            self.words().load(offset)
        }
        fn store(&self, offset: u64, value: u64) -> Result<(), MemError> {
            self.injected(offset, 8)?;
            self.words().store(offset, value)
        }
        fn cas(&self, offset: u64, expected: u64, new: u64) -> Result<u64, MemError> {
            self.crashed()?;
            self.words().cas(offset, expected, new)
        }
        fn faa(&self, offset: u64, add: u64) -> Result<u64, MemError> {
            self.crashed()?;
            self.words().faa(offset, add)
        }
        fn relax(&self, _attempt: u32) {
            if self.frozen_in.load(SeqCst) > self.frozen_out.load(SeqCst) {
                self.relax_frozen.fetch_add(1, SeqCst);
            }
            self.advance(self.tick.load(SeqCst));
            std::thread::yield_now();
        }
        fn now_ns(&self) -> u64 {
            self.clock.load(SeqCst)
        }
        fn frozen(&self, on: bool) {
            let (i, o) = (self.frozen_in.load(SeqCst), self.frozen_out.load(SeqCst));
            // Sections never nest, and are only left once entered.
            assert_eq!(i, o + u64::from(!on), "frozen({on}) after {i} in, {o} out");
            if on {
                self.frozen_in.fetch_add(1, SeqCst);
            } else {
                self.frozen_out.fetch_add(1, SeqCst);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    #[test]
    fn shared_bytes_checks_bounds_and_alignment_before_touching_memory() {
        let mut words = vec![0u64; 4];
        // SAFETY: `words` is 32 bytes, 8-aligned, outlives `m`, and is only
        // accessed through `m` meanwhile.
        let m = unsafe { SharedBytes::new(words.as_mut_ptr().cast(), 32) };
        assert_eq!(m.len(), 32);
        assert_eq!(m.faa(8, 5), Ok(0));
        assert_eq!(m.cas(8, 5, 7), Ok(5));
        assert_eq!(m.cas(8, 5, 9), Ok(7));
        m.store(24, u64::MAX).unwrap();
        assert_eq!(m.load(24), Ok(u64::MAX));
        m.write(3, &[1, 2]).unwrap();
        let mut b = [0u8; 2];
        m.read(3, &mut b).unwrap();
        assert_eq!(b, [1, 2]);
        assert_eq!(
            m.load(32),
            Err(MemError::OutOfBounds { offset: 32, len: 8 })
        );
        assert_eq!(
            m.faa(u64::MAX - 3, 1),
            Err(MemError::OutOfBounds {
                offset: u64::MAX - 3,
                len: 8
            })
        );
        assert_eq!(m.cas(4, 0, 1), Err(MemError::Misaligned { offset: 4 }));
        assert_eq!(
            m.write(31, &[0, 0]),
            Err(MemError::OutOfBounds { offset: 31, len: 2 })
        );
        assert_eq!(words[1], 7);
    }
}
