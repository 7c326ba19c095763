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

use core::fmt;

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
    /// A monotonic clock in nanoseconds, for freeze-time statistics (a
    /// platform without one may return 0).
    fn now_ns(&self) -> u64;
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
}

#[cfg(test)]
pub(crate) mod testing {
    //! A word-array pool for unit tests: every access goes through
    //! `AtomicU64`, so tests may race threads against it.
    use super::*;
    use alloc::vec::Vec;
    use core::sync::atomic::{AtomicU64, Ordering::SeqCst};

    pub(crate) struct VecPool {
        words: Vec<AtomicU64>,
    }

    impl VecPool {
        pub(crate) fn new(size: u64) -> Self {
            let n = size.div_ceil(8) as usize;
            Self {
                words: (0..n).map(|_| AtomicU64::new(0)).collect(),
            }
        }

        fn check(&self, offset: u64, len: u64) -> Result<(), MemError> {
            match offset.checked_add(len) {
                Some(end) if end <= self.size() => Ok(()),
                _ => Err(MemError::OutOfBounds { offset, len }),
            }
        }

        fn word(&self, offset: u64) -> Result<&AtomicU64, MemError> {
            self.check(offset, 8)?;
            if offset % 8 != 0 {
                return Err(MemError::Misaligned { offset });
            }
            Ok(&self.words[(offset / 8) as usize])
        }
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
            Ok(self.word(offset)?.load(SeqCst))
        }
        fn store(&self, offset: u64, value: u64) -> Result<(), MemError> {
            self.word(offset)?.store(value, SeqCst);
            Ok(())
        }
        fn cas(&self, offset: u64, expected: u64, new: u64) -> Result<u64, MemError> {
            Ok(
                match self
                    .word(offset)?
                    .compare_exchange(expected, new, SeqCst, SeqCst)
                {
                    Ok(v) | Err(v) => v,
                },
            )
        }
        fn faa(&self, offset: u64, add: u64) -> Result<u64, MemError> {
            Ok(self.word(offset)?.fetch_add(add, SeqCst))
        }
        fn relax(&self, _attempt: u32) {
            std::thread::yield_now();
        }
        fn now_ns(&self) -> u64 {
            0
        }
    }
}
