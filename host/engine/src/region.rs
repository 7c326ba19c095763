//! Registered memory: [`Region`] (what a NIC may touch) and [`MrHandle`]
//! (the local owner's handle to it).
//!
//! Invariant: while a [`RegionGuard`] exists the region's memory is valid
//! for reads and writes of `len` bytes. Deregistration first marks the
//! region dead, then waits until no guard is left, so a NIC (the loopback
//! one copies with the CPU) never touches memory after `dereg_mr` returns.
//! Memory the engine allocates is freed only when the last reference to the
//! region goes; memory registered with `Region::external` (through the
//! engine's `reg_mr`) is the caller's, under the contract written there.
//!
//! All of the crate's `unsafe` code that touches registered memory is in
//! this module (the only other `unsafe` is CPU pinning in `group` and the
//! forwarding of `reg_mr`'s contract in `engine`).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use rolex_core::wire::Access;

use crate::counters::{shard_index, SHARDS};
use crate::error::{OpKind, TransferError};

/// Memory the engine allocated for a region; freed on drop.
struct OwnedAlloc {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Drop for OwnedAlloc {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed(layout)` in `Region::alloc`
        // and is freed only here, once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A registered memory region: a byte range, its access rights, and the
/// liveness state that keeps NIC accesses inside its lifetime.
pub struct Region {
    ptr: NonNull<u8>,
    len: u64,
    access: Access,
    engine: u64,
    group: usize,
    alive: AtomicBool,
    /// Guards outstanding, counted on the entering thread's shard (threads
    /// reading one region, such as a pool, would otherwise write one cache
    /// line per access); deregistration waits for their sum to be zero.
    users: Box<[UserCount; SHARDS]>,
    _owned: Option<OwnedAlloc>,
}

// SAFETY: the region is a (pointer, length) plus atomics; the memory it
// names is shared with NICs by design and accessed only through guards,
// whose copies are the DMA-like accesses described on `RegionGuard`. The
// owned allocation is plain heap memory, valid from any thread.
unsafe impl Send for Region {}
// SAFETY: as for `Send`: all shared state is atomic, and memory accesses go
// through raw pointers whose validity the guard protocol maintains.
unsafe impl Sync for Region {}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("access", &self.access)
            .field("alive", &self.alive.load(SeqCst))
            .finish()
    }
}

impl Region {
    /// A zeroed region of `len` bytes that the engine owns, aligned to 64
    /// bytes (4096 from one page up), so 8-byte atomics work at every
    /// multiple-of-8 offset.
    pub(crate) fn alloc(
        len: u64,
        access: Access,
        engine: u64,
        group: usize,
    ) -> Result<Arc<Region>, TransferError> {
        if len == 0 {
            return Err(TransferError::ZeroLength {
                op: OpKind::Register,
            });
        }
        let too_large = TransferError::TooLarge {
            op: OpKind::Register,
            len,
            max: isize::MAX as u64 / 2,
        };
        let size = usize::try_from(len).map_err(|_| too_large.clone())?;
        let align = if size >= 4096 { 4096 } else { 64 };
        let layout = Layout::from_size_align(size, align).map_err(|_| too_large.clone())?;
        // SAFETY: `layout` has a non-zero size (len > 0 checked above).
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(too_large)?;
        Ok(Arc::new(Region {
            ptr,
            len,
            access,
            engine,
            group,
            alive: AtomicBool::new(true),
            users: new_users(),
            _owned: Some(OwnedAlloc { ptr, layout }),
        }))
    }

    /// A region over caller-owned memory.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must be valid for reads and writes, and stay
    /// allocated and unmoved, until the region is deregistered (the engine's
    /// `dereg_mr` returned, or the engine was dropped). The caller accepts
    /// that NICs (other threads) read and write it at any time meanwhile,
    /// like DMA: it must not hold Rust references to that memory across
    /// such accesses.
    pub(crate) unsafe fn external(
        ptr: NonNull<u8>,
        len: u64,
        access: Access,
        engine: u64,
        group: usize,
    ) -> Result<Arc<Region>, TransferError> {
        if len == 0 {
            return Err(TransferError::ZeroLength {
                op: OpKind::Register,
            });
        }
        Ok(Arc::new(Region {
            ptr,
            len,
            access,
            engine,
            group,
            alive: AtomicBool::new(true),
            users: new_users(),
            _owned: None,
        }))
    }

    /// Start address (what an `MrDesc` advertises).
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the region is empty (never: registration rejects length 0).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Access rights.
    pub fn access(&self) -> Access {
        self.access
    }

    /// The engine that registered it.
    pub(crate) fn engine(&self) -> u64 {
        self.engine
    }

    /// The domain group it is registered with.
    pub fn group(&self) -> usize {
        self.group
    }

    /// Whether the region is still registered (new operations may use
    /// it).
    pub(crate) fn alive(&self) -> bool {
        self.alive.load(SeqCst)
    }

    /// Pins the region for an access; `None` once deregistered.
    pub fn enter(&self) -> Option<RegionGuard<'_>> {
        // SeqCst pairs with `kill`: either this sees `alive == false`, or
        // our increment precedes `kill`'s store, hence its scan of our
        // shard, and `kill` waits for the guard to go. A guard leaves on
        // the shard it entered on.
        let shard = shard_index();
        let users = &self.users[shard].0;
        users.fetch_add(1, SeqCst);
        if self.alive.load(SeqCst) {
            Some(RegionGuard {
                region: self,
                shard,
            })
        } else {
            users.fetch_sub(1, SeqCst);
            None
        }
    }

    /// Guards outstanding now (the sum of the shards).
    fn users(&self) -> usize {
        self.users.iter().map(|u| u.0.load(SeqCst)).sum()
    }

    /// Marks the region dead and waits until no access is in progress.
    /// Idempotent.
    pub(crate) fn kill(&self) {
        self.alive.store(false, SeqCst);
        let mut nap = Duration::from_micros(1);
        while self.users() != 0 {
            // Accesses are short copies; sleep rather than spin (2 cores).
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(1));
        }
    }

    /// `[offset, offset + len)` as an in-region range, if it fits.
    pub(crate) fn check(&self, offset: u64, len: u64) -> Result<(), TransferError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(TransferError::LocalOutOfBounds {
                offset,
                len,
                region_len: self.len,
            }),
        }
    }
}

/// Proof that a region is alive and its memory valid; accesses go through
/// it.
///
/// Copies through a guard behave like a NIC's DMA: they race with whatever
/// else touches the same bytes (another NIC, the owner). Applications that
/// need consistency synchronise by completions and immediates (design §3),
/// or validate what they read (the store's checksums).
pub struct RegionGuard<'a> {
    region: &'a Region,
    /// The shard of `region.users` it counts on.
    shard: usize,
}

impl Drop for RegionGuard<'_> {
    fn drop(&mut self) {
        self.region.users[self.shard].0.fetch_sub(1, SeqCst);
    }
}

/// One shard of a region's guard count, alone on its cache line.
#[derive(Default)]
#[repr(align(64))]
struct UserCount(AtomicUsize);

fn new_users() -> Box<[UserCount; SHARDS]> {
    Box::new(std::array::from_fn(|_| UserCount::default()))
}

impl RegionGuard<'_> {
    /// The region.
    pub fn region(&self) -> &Region {
        self.region
    }

    /// Pointer to byte `offset` of a checked range `[offset, offset + len)`.
    fn range_ptr(&self, offset: u64, len: u64) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        if end > self.region.len {
            return None;
        }
        // `offset <= len of the allocation`, which fits in `isize`.
        let off = usize::try_from(offset).ok()?;
        // SAFETY: `off <= region.len`, so the result is inside or one past
        // the region's allocation.
        Some(unsafe { self.region.ptr.as_ptr().add(off) })
    }

    /// Copies `dst.len()` bytes from `offset` into `dst`; `false` (nothing
    /// copied) if the range is not inside the region.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> bool {
        let Some(src) = self.range_ptr(offset, dst.len() as u64) else {
            return false;
        };
        // SAFETY: `src..src+len` is inside the live region (guard held,
        // range checked); `dst` is a distinct Rust buffer, so no overlap.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        true
    }

    /// Copies `src` into the region at `offset`; `false` (nothing copied)
    /// if the range is not inside the region.
    pub fn write(&self, offset: u64, src: &[u8]) -> bool {
        let Some(dst) = self.range_ptr(offset, src.len() as u64) else {
            return false;
        };
        // SAFETY: `dst..dst+len` is inside the live region (guard held,
        // range checked); `src` is a Rust slice, which cannot alias memory
        // that is only reached through raw pointers while registered.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        true
    }

    /// Copies `len` bytes from `self` at `src_offset` to `dst` at
    /// `dst_offset` (the two may be the same region, even overlapping);
    /// `false` (nothing copied) if either range is out of bounds.
    pub fn copy_to(
        &self,
        src_offset: u64,
        dst: &RegionGuard<'_>,
        dst_offset: u64,
        len: u64,
    ) -> bool {
        let (Some(s), Some(d)) = (
            self.range_ptr(src_offset, len),
            dst.range_ptr(dst_offset, len),
        ) else {
            return false;
        };
        // SAFETY: both ranges are inside live regions (guards held, ranges
        // checked); `ptr::copy` allows overlap. `len` fits in `usize`
        // because it is at most a region length.
        unsafe { std::ptr::copy(s, d, len as usize) };
        true
    }

    /// The 8-byte word at `offset` as an atomic, if in bounds and aligned.
    pub fn word(&self, offset: u64) -> Option<&AtomicU64> {
        let p = self.range_ptr(offset, 8)?;
        if (p as usize) % 8 != 0 {
            return None;
        }
        // SAFETY: `p` is 8-byte aligned and 8 bytes inside the live region
        // (the guard, whose lifetime bounds the reference, keeps it valid);
        // `AtomicU64` has the size and alignment of `u64` and any bit
        // pattern is valid. All atomics on registered memory go through
        // this, so CAS/FAA from any thread are atomic with each other.
        Some(unsafe { &*(p as *const AtomicU64) })
    }
}

/// The local handle of a registered region: the source of writes, the
/// destination of reads, and direct access for its owner.
///
/// Cloning is cheap (a reference count). The handle keeps engine-allocated
/// memory alive; its accessors fail with
/// [`TransferError::RegionDeregistered`] after deregistration.
#[derive(Clone, Debug)]
pub struct MrHandle {
    pub(crate) region: Arc<Region>,
}

impl MrHandle {
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.region.len
    }

    /// Whether the region is empty (never: registration rejects length 0).
    pub fn is_empty(&self) -> bool {
        self.region.len == 0
    }

    /// Access rights.
    pub fn access(&self) -> Access {
        self.region.access
    }

    /// The domain group the region is registered with.
    pub fn group(&self) -> usize {
        self.region.group
    }

    /// Start address of the region. Accessing memory through it races with
    /// NICs like any DMA target; prefer the checked accessors.
    pub fn as_ptr(&self) -> *mut u8 {
        self.region.ptr.as_ptr()
    }

    /// The region behind the handle.
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    fn guard(&self) -> Result<RegionGuard<'_>, TransferError> {
        self.region.enter().ok_or(TransferError::RegionDeregistered)
    }

    /// Copies region bytes `[offset, offset + dst.len())` into `dst`.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), TransferError> {
        self.region.check(offset, dst.len() as u64)?;
        self.guard()?.read(offset, dst);
        Ok(())
    }

    /// Calls `f` with region bytes `[offset, offset + len)` where they lie:
    /// one guard, no copy (what [`Self::read`] costs a caller that only
    /// inspects the bytes: a copy and a guard per call).
    ///
    /// # Safety
    ///
    /// Nothing may write those bytes while `f` runs: no operation that
    /// lands there (a READ into them, a peer's WRITE or atomic) may be in
    /// flight, and no one writes them through another handle or pointer.
    /// A NIC's write racing with `f`'s reads would be a data race on a
    /// shared slice. An owner meets this for a buffer only it posts into,
    /// registered without remote write access, between batches it waited
    /// for.
    pub unsafe fn with_bytes<R>(
        &self,
        offset: u64,
        len: u64,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, TransferError> {
        self.region.check(offset, len)?;
        let g = self.guard()?;
        let len_usize = usize::try_from(len).map_err(|_| TransferError::LocalOutOfBounds {
            offset,
            len,
            region_len: self.region.len,
        })?;
        let p = g
            .range_ptr(offset, len)
            .ok_or(TransferError::LocalOutOfBounds {
                offset,
                len,
                region_len: self.region.len,
            })?;
        // SAFETY: `p .. p + len` is inside the live region (guard held for
        // the slice's whole life, range checked), initialised (regions are
        // zeroed or the caller's initialised memory), and by the caller's
        // contract nothing writes it while the slice lives.
        let bytes = unsafe { std::slice::from_raw_parts(p, len_usize) };
        Ok(f(bytes))
    }

    /// Calls `f` with region bytes `[offset, offset + len)` where they lie,
    /// to fill them in place: one guard, no copy (what [`Self::write`]
    /// costs a caller that builds the bytes anyway: a second copy).
    ///
    /// # Safety
    ///
    /// Nothing may read or write those bytes while `f` runs: no operation
    /// that reads them (a WRITE from them) or lands there may be in flight,
    /// and no one uses them through another handle or pointer. An owner
    /// meets this for a buffer only it posts from, registered without
    /// remote access, between batches it waited for.
    pub unsafe fn with_bytes_mut<R>(
        &self,
        offset: u64,
        len: u64,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, TransferError> {
        self.region.check(offset, len)?;
        let g = self.guard()?;
        let out_of_bounds = TransferError::LocalOutOfBounds {
            offset,
            len,
            region_len: self.region.len,
        };
        let len_usize = usize::try_from(len).map_err(|_| out_of_bounds.clone())?;
        let p = g.range_ptr(offset, len).ok_or(out_of_bounds)?;
        // SAFETY: `p .. p + len` is inside the live region (guard held for
        // the slice's whole life, range checked) and initialised (regions
        // are zeroed or the caller's initialised memory); by the caller's
        // contract nothing else reads or writes it while the slice lives.
        let bytes = unsafe { std::slice::from_raw_parts_mut(p, len_usize) };
        Ok(f(bytes))
    }

    /// The region bytes `[offset, offset + len)` as a new vector.
    pub fn to_vec(&self, offset: u64, len: usize) -> Result<Vec<u8>, TransferError> {
        let mut v = vec![0; len];
        self.read(offset, &mut v)?;
        Ok(v)
    }

    /// Copies `src` into the region at `offset`.
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<(), TransferError> {
        self.region.check(offset, src.len() as u64)?;
        self.guard()?.write(offset, src);
        Ok(())
    }

    /// Fills the whole region with `byte`.
    pub fn fill(&self, byte: u8) -> Result<(), TransferError> {
        let chunk = vec![byte; 64 * 1024];
        let mut off = 0;
        while off < self.region.len {
            let n = (self.region.len - off).min(chunk.len() as u64);
            self.write(off, &chunk[..n as usize])?;
            off += n;
        }
        Ok(())
    }

    /// Atomically loads the aligned 8-byte word at `offset`.
    pub fn load_u64(&self, offset: u64) -> Result<u64, TransferError> {
        let g = self.guard()?;
        self.word_check(offset)?;
        Ok(g.word(offset).map_or(0, |w| w.load(SeqCst)))
    }

    /// Atomically stores the aligned 8-byte word at `offset`.
    pub fn store_u64(&self, offset: u64, value: u64) -> Result<(), TransferError> {
        let g = self.guard()?;
        self.word_check(offset)?;
        if let Some(w) = g.word(offset) {
            w.store(value, SeqCst);
        }
        Ok(())
    }

    fn word_check(&self, offset: u64) -> Result<(), TransferError> {
        self.region.check(offset, 8)?;
        if (self.region.addr().wrapping_add(offset)) % 8 != 0 {
            return Err(TransferError::LocalMisaligned { offset });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_bytes_sees_the_bytes_in_place_and_checks_the_range() {
        let r = Region::alloc(64, Access::all(), 1, 0).unwrap();
        let h = MrHandle { region: r.clone() };
        h.write(8, b"in place").unwrap();
        // SAFETY: nothing else writes the region during the calls.
        let got = unsafe { h.with_bytes(8, 8, |b| b.to_vec()) }.unwrap();
        assert_eq!(got, b"in place");
        // SAFETY: as above.
        let past = unsafe { h.with_bytes(60, 8, |b| b.len()) };
        assert!(matches!(past, Err(TransferError::LocalOutOfBounds { .. })));
        r.kill();
        // SAFETY: as above.
        let dead = unsafe { h.with_bytes(0, 8, |b| b.len()) };
        assert!(matches!(dead, Err(TransferError::RegionDeregistered)));
    }

    #[test]
    fn with_bytes_mut_fills_the_bytes_in_place_and_checks_the_range() {
        let r = Region::alloc(64, Access::all(), 1, 0).unwrap();
        let h = MrHandle { region: r.clone() };
        // SAFETY: nothing else uses the region during the calls.
        unsafe { h.with_bytes_mut(8, 8, |b| b.copy_from_slice(b"in place")) }.unwrap();
        assert_eq!(h.to_vec(8, 8).unwrap(), b"in place");
        // SAFETY: as above.
        let past = unsafe { h.with_bytes_mut(60, 8, |b| b.len()) };
        assert!(matches!(past, Err(TransferError::LocalOutOfBounds { .. })));
        r.kill();
        // SAFETY: as above.
        let dead = unsafe { h.with_bytes_mut(0, 8, |b| b.len()) };
        assert!(matches!(dead, Err(TransferError::RegionDeregistered)));
    }

    #[test]
    fn alloc_read_write_and_kill() {
        let r = Region::alloc(100, Access::all(), 1, 0).unwrap();
        let h = MrHandle { region: r.clone() };
        h.write(10, b"hello").unwrap();
        assert_eq!(h.to_vec(10, 5).unwrap(), b"hello");
        assert!(matches!(
            h.write(98, b"abc"),
            Err(TransferError::LocalOutOfBounds { .. })
        ));
        h.store_u64(8, 7).unwrap();
        assert_eq!(h.load_u64(8).unwrap(), 7);
        assert!(h.load_u64(3).is_err());
        r.kill();
        assert_eq!(
            h.read(0, &mut [0; 4]),
            Err(TransferError::RegionDeregistered)
        );
        assert!(Region::alloc(0, Access::all(), 1, 0).is_err());
    }

    #[test]
    fn kill_waits_for_guards_held_on_other_threads() {
        // Guards count on their threads' shards: `kill` must wait for all
        // of them, whichever shard, and refuse every later entry.
        let r = Region::alloc(64, Access::all(), 1, 0).unwrap();
        let released = AtomicUsize::new(0);
        let entered = std::sync::Barrier::new(4);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    let g = r.enter().expect("alive");
                    entered.wait();
                    std::thread::sleep(Duration::from_millis(50));
                    released.fetch_add(1, SeqCst);
                    drop(g);
                });
            }
            entered.wait();
            r.kill();
            assert_eq!(
                released.load(SeqCst),
                3,
                "kill returned while guards were held"
            );
            assert_eq!(r.users(), 0);
        });
        assert!(r.enter().is_none());
        assert_eq!(r.users(), 0, "a refused entry leaves no count behind");
    }

    #[test]
    fn copy_overlapping_in_one_region() {
        let r = Region::alloc(16, Access::all(), 1, 0).unwrap();
        let g = r.enter().unwrap();
        assert!(g.write(0, &[1, 2, 3, 4, 5, 6, 7, 8]));
        assert!(g.copy_to(0, &g, 2, 8));
        let mut out = [0; 10];
        assert!(g.read(0, &mut out));
        assert_eq!(out, [1, 2, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert!(!g.copy_to(10, &g, 0, 8));
    }
}
