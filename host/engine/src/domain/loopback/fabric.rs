//! The process-wide loopback fabric: a registry from [`NetAddr`] to the
//! state of each loopback NIC, so engines in one process reach each other
//! like separate hosts.
//!
//! Invariant: a NIC is in the registry exactly while its engine is up;
//! endpoints may cache a NIC's state but check `alive` before every use, so
//! a dropped engine answers [`TransferError::UnknownPeer`] and its memory
//! is never touched after its regions are deregistered.

use std::collections::HashMap;
use std::sync::atomic::{
    AtomicBool, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};
use std::sync::{Arc, OnceLock, RwLock};
use std::thread::Thread;

use crossbeam_queue::SegQueue;
use rolex_core::wire::{Access, NetAddr};

use crate::counters::Counters;
use crate::domain::{ImmSink, Incoming, RecvBuffer, Remote};
use crate::error::{ProtectionCheck, TransferError};
use crate::region::Region;

/// The state of one loopback NIC, shared by its domain, its endpoints and
/// the endpoints of every peer that resolved it.
pub(crate) struct NicState {
    pub(crate) addr: NetAddr,
    regions: RwLock<HashMap<u64, Arc<Region>>>,
    /// Names the current contents of `regions`: a value no other NIC and
    /// no earlier contents of this one had (from [`next_epoch`]), so an
    /// endpoint's [`RegionCache`] entry is good while it still reads it.
    epoch: AtomicU64,
    /// Receive buffers, shared by all NICs of one engine (one pool per
    /// engine: a send to any of its addresses lands in it).
    pub(crate) recvq: Arc<SegQueue<RecvBuffer>>,
    incoming: SegQueue<Incoming>,
    waker: OnceLock<Thread>,
    /// Where immediates go at once, when the engine set it.
    imm_sink: OnceLock<ImmSink>,
    alive: AtomicBool,
    failed: AtomicBool,
    pub(crate) counters: Counters,
}

/// A fabric-wide unique value for [`NicState::epoch`].
fn next_epoch() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Relaxed)
}

/// An endpoint's memory of the last region its operations hit: the
/// protection check of the next operation on the same key skips the
/// registry's lock and the region's reference count (both cache lines
/// every thread reading one pool would otherwise write). Good while the
/// NIC's epoch is the one it was filled under; a region deregistered just
/// after the epoch was read is refused by its guard (`Region::enter`), as
/// it is when the registry lookup races with deregistration.
///
/// Who releases the entry: the endpoint's next operation on any NIC (a
/// NIC's epoch never equals another's, so the entry is replaced) or the
/// endpoint's drop. Until then the entry keeps the region's `Arc`, and with
/// it the memory of an engine-allocated region, also past its
/// deregistration: an idle queue pair of the loopback fabric may hold a
/// deregistered region's memory that long (never touching it: its guard
/// refuses).
#[derive(Default)]
pub(crate) struct RegionCache(Option<(u64, u64, Arc<Region>)>);

fn registry() -> &'static RwLock<HashMap<NetAddr, Arc<NicState>>> {
    static REGISTRY: OnceLock<RwLock<HashMap<NetAddr, Arc<NicState>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

impl NicState {
    /// Creates a NIC and puts it on the fabric.
    pub(crate) fn attach(addr: NetAddr, recvq: Arc<SegQueue<RecvBuffer>>) -> Arc<NicState> {
        let nic = Arc::new(NicState {
            addr,
            regions: RwLock::new(HashMap::new()),
            epoch: AtomicU64::new(next_epoch()),
            recvq,
            incoming: SegQueue::new(),
            waker: OnceLock::new(),
            imm_sink: OnceLock::new(),
            alive: AtomicBool::new(true),
            failed: AtomicBool::new(false),
            counters: Counters::default(),
        });
        registry()
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(addr, nic.clone());
        nic
    }

    /// Takes the NIC off the fabric and forgets its regions and arrivals.
    pub(crate) fn detach(&self) {
        self.alive.store(false, Release);
        let mut reg = registry().write().unwrap_or_else(|e| e.into_inner());
        if reg
            .get(&self.addr)
            .is_some_and(|n| std::ptr::eq(&**n, self))
        {
            reg.remove(&self.addr);
        }
        drop(reg);
        let mut map = self.regions.write().unwrap_or_else(|e| e.into_inner());
        map.clear();
        self.epoch.store(next_epoch(), Release);
        drop(map);
        while self.incoming.pop().is_some() {}
        while self.recvq.pop().is_some() {}
    }

    /// Looks a NIC up on the fabric.
    pub(crate) fn lookup(addr: &NetAddr) -> Option<Arc<NicState>> {
        registry()
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(addr)
            .cloned()
    }

    pub(crate) fn alive(&self) -> bool {
        self.alive.load(Acquire)
    }

    pub(crate) fn failed(&self) -> bool {
        self.failed.load(Acquire)
    }

    pub(crate) fn set_failed(&self, failed: bool) {
        self.failed.store(failed, Release);
    }

    pub(crate) fn insert_region(&self, rkey: u64, region: Arc<Region>) -> bool {
        let mut map = self.regions.write().unwrap_or_else(|e| e.into_inner());
        if map.contains_key(&rkey) {
            return false;
        }
        map.insert(rkey, region);
        self.epoch.store(next_epoch(), Release);
        true
    }

    pub(crate) fn remove_region(&self, rkey: u64) {
        let mut map = self.regions.write().unwrap_or_else(|e| e.into_inner());
        map.remove(&rkey);
        self.epoch.store(next_epoch(), Release);
    }

    /// The NIC's protection check: the region named by `remote.rkey` and
    /// the offset of `[remote.addr, +len)` in it, if the key is known, the
    /// range inside the region and `right` granted; for atomics (`len ==
    /// 8` with `REMOTE_ATOMIC`) the address must also be 8-byte aligned.
    /// `cache` remembers the region found for the next check.
    pub(crate) fn check<'c>(
        &self,
        cache: &'c mut RegionCache,
        remote: &Remote,
        len: u64,
        right: Access,
    ) -> Result<(&'c Region, u64), TransferError> {
        let fail = |check| TransferError::Protection {
            peer: self.addr,
            rkey: remote.rkey,
            check,
        };
        let epoch = self.epoch.load(Acquire);
        let hit = matches!(&cache.0, Some((e, k, _)) if *e == epoch && *k == remote.rkey);
        if !hit {
            let found = self
                .regions
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .get(&remote.rkey)
                .cloned();
            cache.0 = found.map(|r| (epoch, remote.rkey, r));
        }
        let region = match &cache.0 {
            Some((_, _, r)) => &**r,
            None => return Err(fail(ProtectionCheck::UnknownKey)),
        };
        let out = || {
            fail(ProtectionCheck::OutOfBounds {
                addr: remote.addr,
                len,
            })
        };
        let offset = remote.addr.checked_sub(region.addr()).ok_or_else(out)?;
        match offset.checked_add(len) {
            Some(end) if end <= region.len() => {}
            _ => return Err(out()),
        }
        if !region.access().contains(right) {
            return Err(fail(ProtectionCheck::MissingRight(right)));
        }
        if right == Access::REMOTE_ATOMIC && remote.addr % 8 != 0 {
            return Err(fail(ProtectionCheck::Misaligned { addr: remote.addr }));
        }
        Ok((region, offset))
    }

    /// Hands an arrival to the owning engine: an immediate to its sink
    /// (on the calling thread, the initiator's), when set; anything else
    /// to its worker. Called after the data it announces is visible: the
    /// sink's lock or the queue's push publishes it.
    pub(crate) fn deliver(&self, event: Incoming) {
        match &event {
            Incoming::Imm(imm) => {
                Counters::bump(&self.counters.imm_arrivals, 1);
                if let Some(sink) = self.imm_sink.get() {
                    if !sink(*imm) {
                        Counters::bump(&self.counters.errors, 1);
                    }
                    return;
                }
            }
            Incoming::Message { .. } => Counters::bump(&self.counters.recvs, 1),
        }
        self.incoming.push(event);
        if let Some(t) = self.waker.get() {
            t.unpark();
        }
    }

    pub(crate) fn pop_incoming(&self) -> Option<Incoming> {
        self.incoming.pop()
    }

    pub(crate) fn set_imm_sink(&self, sink: ImmSink) {
        let _ = self.imm_sink.set(sink);
    }

    pub(crate) fn set_waker(&self, t: Thread) {
        let _ = self.waker.set(t.clone());
        // Arrivals queued before the waker was known: wake now.
        t.unpark();
    }
}
