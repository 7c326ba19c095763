//! Bounce pools: memory registered once when a NIC opens, lent slot by
//! slot to the operations whose buffers are the domain's own (atomics'
//! operand, compare and result words; sent messages; receives), so that a
//! provider that wants a descriptor for every local buffer
//! (`FI_MR_LOCAL`: `verbs;ofi_rxm`, EFA's device path) gets one without a
//! memory registration per operation.
//!
//! Invariants:
//! - a pool is one allocation of `slots × slot_size` bytes (8-byte
//!   aligned), registered once; it never grows: at most `slots` leases
//!   exist at a time;
//! - a [`Lease`] is the only access to its slot and gives the slot back
//!   when dropped, whatever path drops it (completion, a failed post, a
//!   flushed or timed-out operation reclaimed after the endpoint closed):
//!   a slot cannot leak while its lease is owned by an operation context;
//! - the registration (and the memory) outlives every lease: each lease
//!   holds the pool, and the pool drops its registration before its
//!   memory.
//!
//! When a pool is exhausted [`BouncePool::lease`] answers `None` and the
//! domain treats the post like one the provider refused (`-FI_EAGAIN`):
//! the operation waits in its peer's retry queue (module `retry`) and is
//! posted once a completion gave a slot back. Buffers larger than a
//! message slot are not bounced: the domain registers them for that
//! operation, as before pools existed.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

/// The slots' memory: an owned allocation reached only through raw
/// pointers (leases write it while the pool is shared).
struct SlotMem {
    ptr: NonNull<u64>,
    words: usize,
}

// SAFETY: the allocation is plain memory owned by this value; which
// thread touches which bytes is governed by the leases (one per slot).
unsafe impl Send for SlotMem {}
// SAFETY: as for `Send`: shared access only hands out raw pointers, and
// each slot is written through one lease at a time.
unsafe impl Sync for SlotMem {}

impl SlotMem {
    fn new(words: usize) -> SlotMem {
        let b: Box<[u64]> = vec![0u64; words].into_boxed_slice();
        let ptr = NonNull::new(Box::into_raw(b) as *mut u64).unwrap_or(NonNull::dangling());
        SlotMem { ptr, words }
    }
}

impl Drop for SlotMem {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `words` come from the boxed slice leaked in
        // `new` (a zero-length one included), freed only here.
        drop(unsafe {
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.ptr.as_ptr(),
                self.words,
            ))
        });
    }
}

/// One pool of fixed-size, pre-registered slots. `R` keeps the
/// registration alive (the domain's `Mr`; `()` in tests).
pub(crate) struct BouncePool<R> {
    /// Dropped before `mem` (declaration order): the registration goes
    /// first.
    _reg: R,
    desc: usize,
    slot_size: usize,
    slots: usize,
    free: Mutex<Vec<u32>>,
    /// The slots' memory, `slots × slot_size` bytes, 8-byte aligned.
    mem: SlotMem,
}

impl<R> BouncePool<R> {
    /// A pool of `slots` slots of `slot_size` bytes (rounded up to 8),
    /// registered by `register(address, length)`, which returns the
    /// registration and its local descriptor.
    pub(crate) fn new<E>(
        slots: usize,
        slot_size: usize,
        register: impl FnOnce(u64, u64) -> Result<(R, usize), E>,
    ) -> Result<Arc<BouncePool<R>>, E> {
        let slot_size = slot_size.div_ceil(8).max(1) * 8;
        let slots = slots.min(u32::MAX as usize);
        let mem = SlotMem::new(slots * slot_size / 8);
        let (reg, desc) = register(mem.ptr.as_ptr() as u64, (slots * slot_size) as u64)?;
        Ok(Arc::new(BouncePool {
            _reg: reg,
            desc,
            slot_size,
            slots,
            free: Mutex::new((0..slots as u32).rev().collect()),
            mem,
        }))
    }

    /// Bytes per slot.
    pub(crate) fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Slots not lent now.
    #[cfg(test)]
    pub(crate) fn available(&self) -> usize {
        super::lock(&self.free).len()
    }

    /// Lends a slot, or `None` when all `slots` are out.
    pub(crate) fn lease(self: &Arc<Self>) -> Option<Lease<R>> {
        let index = super::lock(&self.free).pop()?;
        Some(Lease {
            pool: self.clone(),
            index,
        })
    }

    fn slot_ptr(&self, index: u32) -> *mut u8 {
        debug_assert!((index as usize) < self.slots);
        // In bounds: `index < slots` and the allocation holds `slots ×
        // slot_size` bytes.
        (self.mem.ptr.as_ptr() as *mut u8).wrapping_add(index as usize * self.slot_size)
    }
}

/// One lent slot; gives it back when dropped.
pub(crate) struct Lease<R> {
    pool: Arc<BouncePool<R>>,
    index: u32,
}

impl<R> Lease<R> {
    /// The slot's address (what the provider is given).
    pub(crate) fn addr(&self) -> u64 {
        self.pool.slot_ptr(self.index) as u64
    }

    /// The pool's local descriptor (`fi_mr_desc` of its registration).
    pub(crate) fn desc(&self) -> usize {
        self.pool.desc
    }

    /// The slot's bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the slot is `slot_size` bytes inside the pool's
        // allocation, which the lease keeps alive, and only this lease
        // reaches it (one lease per index at a time). The provider writes
        // it only between a post and its completion, while no Rust code
        // reads it (the context that owns the lease is the provider's).
        unsafe { std::slice::from_raw_parts(self.pool.slot_ptr(self.index), self.pool.slot_size) }
    }

    /// The slot's bytes, writable.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `bytes`, and `&mut self` makes the access unique.
        unsafe {
            std::slice::from_raw_parts_mut(self.pool.slot_ptr(self.index), self.pool.slot_size)
        }
    }

    /// The `i`-th 8-byte word of the slot (an atomic's operand, compare
    /// or result word).
    pub(crate) fn word(&self, i: usize) -> u64 {
        let b = &self.bytes()[i * 8..i * 8 + 8];
        u64::from_ne_bytes(b.try_into().unwrap_or([0; 8]))
    }

    /// Sets the `i`-th 8-byte word.
    pub(crate) fn set_word(&mut self, i: usize, v: u64) {
        self.bytes_mut()[i * 8..i * 8 + 8].copy_from_slice(&v.to_ne_bytes());
    }
}

impl<R> Drop for Lease<R> {
    fn drop(&mut self) {
        super::lock(&self.pool.free).push(self.index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    /// A registration that counts how many are alive.
    struct Reg(Arc<AtomicUsize>);

    impl Drop for Reg {
        fn drop(&mut self) {
            self.0.fetch_sub(1, SeqCst);
        }
    }

    fn pool(
        slots: usize,
        size: usize,
    ) -> (Arc<BouncePool<Reg>>, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let regs = Arc::new(AtomicUsize::new(0));
        let calls = Arc::new(AtomicUsize::new(0));
        let (r, c) = (regs.clone(), calls.clone());
        let p = BouncePool::new(slots, size, |addr, len| {
            assert_eq!(addr % 8, 0);
            assert_eq!(len as usize, slots * size.div_ceil(8) * 8);
            r.fetch_add(1, SeqCst);
            c.fetch_add(1, SeqCst);
            Ok::<_, ()>((Reg(r.clone()), 0xd0))
        })
        .expect("pool");
        (p, regs, calls)
    }

    #[test]
    fn registered_once_and_exhausted_after_its_slots() {
        let (p, _, calls) = pool(3, 24);
        let mut held: Vec<_> = (0..3).map(|_| p.lease().expect("a slot")).collect();
        assert!(p.lease().is_none(), "bounded: three slots");
        // Slots are distinct and inside the pool.
        let mut addrs: Vec<u64> = held.iter().map(Lease::addr).collect();
        addrs.sort();
        addrs.dedup();
        assert_eq!(addrs.len(), 3);
        assert!(held.iter().all(|l| l.desc() == 0xd0));
        // One back, one out again.
        held.pop();
        assert_eq!(p.available(), 1);
        held.push(p.lease().expect("the slot given back"));
        assert!(p.lease().is_none());
        drop(held);
        assert_eq!(p.available(), 3);
        // Thousands of operations later, still one registration.
        for _ in 0..10_000 {
            let mut l = p.lease().expect("slot");
            l.set_word(2, 7);
            assert_eq!(l.word(2), 7);
        }
        assert_eq!(calls.load(SeqCst), 1);
    }

    #[test]
    fn a_slot_returns_on_every_path_that_drops_its_owner() {
        let (p, regs, _) = pool(2, 64);
        // An operation context that owns a lease, dropped on an error
        // path (a failed post), on completion, or reclaimed late.
        struct Ctx {
            _bounce: Option<Lease<Reg>>,
        }
        let failed = Ctx { _bounce: p.lease() };
        let completed = Ctx { _bounce: p.lease() };
        assert_eq!(p.available(), 0);
        drop(failed);
        assert_eq!(p.available(), 1);
        let boxed = Box::new(completed);
        let raw = Box::into_raw(boxed); // lent to the "provider"
                                        // SAFETY: from `Box::into_raw` just above, reclaimed once.
        drop(unsafe { Box::from_raw(raw) });
        assert_eq!(p.available(), 2);
        // The registration lives while any lease does, and goes with the
        // last holder.
        let last = p.lease().expect("slot");
        drop(p);
        assert_eq!(regs.load(SeqCst), 1, "a lease keeps the registration");
        drop(last);
        assert_eq!(regs.load(SeqCst), 0);
    }

    #[test]
    fn slots_keep_their_bytes_apart() {
        let (p, _, _) = pool(4, 10); // rounded up to 16 bytes
        assert_eq!(p.slot_size(), 16);
        let mut ls: Vec<_> = (0..4).map(|_| p.lease().expect("slot")).collect();
        for (i, l) in ls.iter_mut().enumerate() {
            l.bytes_mut().fill(i as u8 + 1);
        }
        for (i, l) in ls.iter().enumerate() {
            assert!(l.bytes().iter().all(|&b| b == i as u8 + 1));
        }
    }

    #[test]
    fn threads_share_a_pool_without_handing_a_slot_out_twice() {
        let (p, _, _) = pool(8, 8);
        let hs: Vec<_> = (0..4)
            .map(|t| {
                let p = p.clone();
                std::thread::spawn(move || {
                    for i in 0..2000u64 {
                        if let Some(mut l) = p.lease() {
                            let v = (t << 32) | i;
                            l.set_word(0, v);
                            std::hint::spin_loop();
                            assert_eq!(l.word(0), v, "another lease wrote this slot");
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().expect("thread");
        }
        assert_eq!(p.available(), 8);
    }
}

/// The pools in a NIC, on `tcp` with `local_mr` (the `FI_MR_LOCAL` path a
/// device takes, without the device): pools of two slots serve dozens of
/// atomics, sends and receives in flight, every result is right, the
/// slots all come back, and only buffers larger than a slot are
/// registered per operation. Skipped where `tcp` is not usable.
#[cfg(test)]
mod on_tcp {
    use std::collections::BTreeSet;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use crate::domain::fabric::{probe, BounceConfig, LibfabricConfig, LibfabricDomain};
    use crate::domain::{
        Domain, Endpoint, Incoming, Progress, RecvBuffer, Remote, WorkOp, WorkRequest,
    };
    use crate::region::Region;
    use crate::Access;

    /// A hang guard, not a timing assertion.
    const GUARD: Duration = Duration::from_secs(60);

    fn nic() -> LibfabricDomain {
        LibfabricDomain::open(&LibfabricConfig {
            local_mr: true,
            bounce: BounceConfig {
                words: 2,
                sends: 2,
                recvs: 2,
                msg_size: 64,
            },
            ..LibfabricConfig::new("tcp", Some("127.0.0.1"))
        })
        .expect("open a tcp NIC")
    }

    #[test]
    fn small_pools_serve_many_operations_without_registering_per_operation() {
        if let Err(e) = probe("tcp", Some("127.0.0.1")) {
            eprintln!("skipped: libfabric tcp not usable here: {e}");
            return;
        }
        let (a, b) = (nic(), nic());
        assert!(a.inner.pools.is_some() && a.inner.mr_local);
        let word = Region::alloc(8, Access::all(), 1, 0).expect("region");
        let rkey = b.register(&word).expect("register");
        // Receives at `b`: four that fit a slot (two posted at a time, the
        // others wait for a slot), one larger (registered).
        let got = Arc::new(Mutex::new(Vec::new()));
        for len in [64usize, 64, 64, 64, 4096] {
            b.post_recv(RecvBuffer {
                data: vec![0; len].into_boxed_slice(),
                pool: Arc::new(|_: &[u8]| {}),
            });
        }
        assert_eq!(b.inner.op_registrations.load(super::super::Relaxed), 1);
        let mut ep = a.open_endpoint().expect("endpoint");
        let remote = Remote {
            peer: b.address(),
            rkey,
            addr: word.addr(),
        };
        let mut batch: Vec<WorkRequest> = (0..40)
            .map(|i| WorkRequest {
                wr_id: i,
                op: WorkOp::Faa { remote, add: 1 },
            })
            .collect();
        // Sends: four small (bounced), one of 1000 bytes (registered).
        for (i, len) in [10usize, 20, 30, 64, 1000].into_iter().enumerate() {
            batch.push(WorkRequest {
                wr_id: 100 + i as u64,
                op: WorkOp::Send {
                    peer: b.address(),
                    data: vec![i as u8 + 1; len],
                },
            });
        }
        ep.post(&mut batch);
        let start = Instant::now();
        let (mut done, mut out, mut inc) = (Vec::new(), Vec::new(), Vec::new());
        while done.len() < 45 || got.lock().expect("got").len() < 5 {
            assert!(start.elapsed() < GUARD, "{} completions", done.len());
            if let Progress::WaitUntil(_) | Progress::Busy = ep.poll(&mut out) {
                std::thread::sleep(Duration::from_micros(200));
            }
            done.append(&mut out);
            b.poll_incoming(&mut inc);
            for e in inc.drain(..) {
                if let Incoming::Message { buf, len } = e {
                    got.lock().expect("got").push(buf.data[..len].to_vec());
                }
            }
        }
        // Every fetch-and-add ran once, each saw a distinct old value.
        let mut olds = BTreeSet::new();
        for c in &done {
            let v = c.result.clone().expect("operation");
            if c.wr_id < 100 {
                olds.insert(v);
            }
        }
        assert_eq!(olds, (0..40).collect());
        let mut w = [0u8; 8];
        assert!(word.enter().expect("word").read(0, &mut w));
        assert_eq!(u64::from_ne_bytes(w), 40);
        // Messages arrived whole (bounced ones copied out of their slot).
        let mut msgs = got.lock().expect("got").clone();
        msgs.sort_by_key(|m| m.len());
        let lens: Vec<usize> = msgs.iter().map(Vec::len).collect();
        assert_eq!(lens, vec![10, 20, 30, 64, 1000]);
        for (i, m) in msgs.iter().enumerate() {
            assert!(m.iter().all(|&x| x == i as u8 + 1), "message {i}");
        }
        // One registration per pool at open, per operation only for the
        // large send and the large receive buffer.
        assert_eq!(a.inner.op_registrations.load(super::super::Relaxed), 1);
        assert_eq!(b.inner.op_registrations.load(super::super::Relaxed), 1);
        for d in [&a, &b] {
            let p = d.inner.pools.as_ref().expect("pools");
            assert_eq!(p.words.available(), 2, "atomic slots back");
            assert_eq!(p.sends.available(), 2, "send slots back");
            assert_eq!(p.recvs.available(), 2, "receive slots back");
        }
    }
}
