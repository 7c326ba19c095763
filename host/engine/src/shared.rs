//! The state an engine's API, its group workers and its client channels
//! share: [`EngineShared`], one [`GroupShared`] per domain group, the
//! [`Request`]s queued to a group's worker, and [`remote`], the check of a
//! remote range against a peer's descriptor made before anything is posted.
//!
//! This module sits below `engine` (the API), `group` (the workers) and
//! `batch` (client channels) and imports none of them, so those three
//! depend on it and never on one another's internals. Invariant: nothing
//! here posts work or fires a notification except [`EngineShared::fail`];
//! the owners of each piece of state are the modules above.

use std::cell::Cell;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::thread::Thread;

use crossbeam_queue::SegQueue;
use rolex_core::wire::{Access, MrDesc, NetAddr};

use crate::callback::{CallbackQueue, FlagDriver, Notify};
use crate::counters::Counters;
use crate::domain::{AnyDomain, Domain, Local, Remote, WorkOp};
use crate::error::{OpKind, ProtectionCheck, TransferError};
use crate::imm_wait::{ImmWaits, ABORT_BIT};
use crate::region::{MrHandle, Region};

/// A region registered with every NIC of its group, with the key each NIC
/// gave it (same order as the group's domains).
pub(crate) struct Registered {
    pub(crate) region: Arc<Region>,
    pub(crate) rkeys: Vec<u64>,
}

/// What the API, the workers and the client channels share.
pub(crate) struct EngineShared {
    pub(crate) id: u64,
    pub(crate) groups: Vec<GroupShared>,
    /// The ImmCounter and its expectations' deadlines, shared with the
    /// NICs' immediate sinks.
    pub(crate) imm: Arc<Mutex<ImmWaits>>,
    /// [`crate::EngineConfig::abort_notices`].
    pub(crate) abort_notices: bool,
    pub(crate) cbq: CallbackQueue,
    pub(crate) counters: Counters,
    pub(crate) shutdown: AtomicBool,
    pub(crate) max_transfer: u64,
    /// Regions registered and not yet deregistered (the engine kills them
    /// all on drop).
    pub(crate) regions: Mutex<Vec<Registered>>,
    /// Peer groups; handle `h` is index `h - 1`.
    pub(crate) peer_groups: RwLock<Vec<HashSet<NetAddr>>>,
}

impl EngineShared {
    /// The state of a new engine `id` over `groups`, notifying through
    /// `cbq`, nothing registered yet.
    pub(crate) fn new(
        id: u64,
        groups: Vec<GroupShared>,
        cbq: CallbackQueue,
        max_transfer: u64,
    ) -> Self {
        EngineShared {
            id,
            groups,
            imm: Arc::new(Mutex::new(ImmWaits::default())),
            abort_notices: false,
            cbq,
            counters: Counters::default(),
            shutdown: AtomicBool::new(false),
            max_transfer,
            regions: Mutex::new(Vec::new()),
            peer_groups: RwLock::new(Vec::new()),
        }
    }

    pub(crate) fn check_len(&self, op: OpKind, len: u64) -> Result<(), TransferError> {
        if len == 0 {
            return Err(TransferError::ZeroLength { op });
        }
        if len > self.max_transfer {
            return Err(TransferError::TooLarge {
                op,
                len,
                max: self.max_transfer,
            });
        }
        Ok(())
    }

    /// A local range of one of this engine's regions, still registered.
    pub(crate) fn local(
        &self,
        mr: &MrHandle,
        offset: u64,
        len: u64,
    ) -> Result<Local, TransferError> {
        if mr.region.engine() != self.id {
            return Err(TransferError::ForeignRegion);
        }
        if !mr.region.alive() {
            return Err(TransferError::RegionDeregistered);
        }
        mr.region.check(offset, len)?;
        Ok(Local {
            region: mr.region.clone(),
            offset,
        })
    }

    /// Fails the notification (counted as an error).
    pub(crate) fn fail(&self, notify: Notify, err: TransferError) {
        Counters::bump(&self.counters.errors, 1);
        notify.fire(Err(err), &self.cbq);
    }

    /// Refuses an application immediate that abort notices reserve.
    pub(crate) fn check_imm(&self, imm: Option<u32>) -> Result<(), TransferError> {
        match imm {
            Some(imm) if self.abort_notices && imm & ABORT_BIT != 0 => {
                Err(TransferError::ImmReserved { imm })
            }
            _ => Ok(()),
        }
    }

    /// The next NIC index, round-robin, for operations not tied to one
    /// (the caller takes it modulo its NIC count). The counter is the
    /// calling thread's own: one shared by the engine was a cache line
    /// every submitting thread wrote, 9% of two loopback threads' CPU at
    /// 4 KiB; each thread still spreads its own operations evenly.
    pub(crate) fn nic(&self) -> usize {
        thread_local!(static NEXT: Cell<usize> = const { Cell::new(0) });
        NEXT.with(|c| {
            let n = c.get();
            c.set(n.wrapping_add(1));
            n
        })
    }
}

/// One transfer handed to a worker: its work requests (domain index, op)
/// and how to notify when all have completed.
pub(crate) struct Request {
    pub(crate) ops: Vec<(usize, WorkOp)>,
    pub(crate) notify: Notify,
    /// With abort notices on, who receives each op's immediate: the first
    /// NIC address of the descriptor it targets, which names the receiving
    /// engine whichever of its NICs the op reaches, so a failed transfer
    /// sends each receiver one notice. Empty: each op's own target NIC.
    pub(crate) receivers: Vec<NetAddr>,
}

/// Who receives the immediate of writes to `desc` (see
/// [`Request::receivers`]).
pub(crate) fn receiver(desc: &MrDesc) -> Option<NetAddr> {
    desc.nics.first().map(|(a, _)| *a)
}

/// Posting from the submitting thread, without the worker (implemented
/// by the group's worker state, in `group`).
pub(crate) trait DirectPost: Send + Sync {
    /// Posts `req` now, or hands it back to be queued for the worker (the
    /// group is busy, closed, has requests queued before it, or its NICs
    /// do not allow it).
    fn try_post(&self, req: Request) -> Result<(), Request>;
    /// Posts what was accepted under a [`Plug`](crate::Plug) and not
    /// posted yet.
    fn flush(&self);
}

/// What the engine and the worker of one group share.
pub(crate) struct GroupShared {
    pub(crate) domains: Vec<AnyDomain>,
    pub(crate) queue: SegQueue<Request>,
    pub(crate) waker: OnceLock<Thread>,
    /// Raised while the worker blocks on its NICs' wait objects
    /// ([`Domain::take_wait`]) instead of parking: a wake-up then signals
    /// the first NIC's object.
    pub(crate) sleeping: Arc<AtomicBool>,
    /// Client channels opened on this group, for round-robin NIC choice.
    pub(crate) channels: AtomicUsize,
    /// The group's completion processing, for threads waiting on a flag
    /// (set when the worker starts).
    pub(crate) flag_driver: OnceLock<Weak<dyn FlagDriver>>,
    /// Posting from the submitting thread (set when the worker starts).
    pub(crate) direct: OnceLock<Weak<dyn DirectPost>>,
}

impl GroupShared {
    pub(crate) fn new(domains: Vec<AnyDomain>) -> Self {
        GroupShared {
            domains,
            queue: SegQueue::new(),
            waker: OnceLock::new(),
            sleeping: Arc::new(AtomicBool::new(false)),
            channels: AtomicUsize::new(0),
            flag_driver: OnceLock::new(),
            direct: OnceLock::new(),
        }
    }

    /// Takes a request: a flag's waiter will drive the group itself, and
    /// such a request is posted by the calling thread when the group
    /// allows it (no hand-off to the worker); anything else is queued
    /// for the worker. Returns whether it was posted here.
    pub(crate) fn submit(&self, req: Request) -> bool {
        let Some(flag) = req.notify.flag() else {
            self.push(req);
            return false;
        };
        if let Some(d) = self.flag_driver.get() {
            flag.set_driver(d.clone());
        }
        let req = match self.direct.get().and_then(Weak::upgrade) {
            Some(d) if self.queue.is_empty() => match d.try_post(req) {
                Ok(()) => {
                    if crate::plug::plugged() {
                        crate::plug::deferred(&d);
                    }
                    return true;
                }
                Err(req) => req,
            },
            _ => req,
        };
        self.push(req);
        false
    }

    pub(crate) fn push(&self, req: Request) {
        self.queue.push(req);
        self.wake();
    }

    pub(crate) fn wake(&self) {
        // Cheap when the worker is awake: `unpark` only leaves a token.
        if let Some(t) = self.waker.get() {
            t.unpark();
        }
        // Pairs with the worker's fence between raising `sleeping` and
        // looking at its queue (`Worker::sleep`).
        std::sync::atomic::fence(SeqCst);
        if self.sleeping.load(SeqCst) {
            if let Some(d) = self.domains.first() {
                d.signal();
            }
        }
    }
}

/// The check of a remote range against the peer's descriptor, made before
/// posting (software providers do not enforce protection, design §7):
/// the `(addr, rkey)` of NIC `nic mod count` and the absolute address.
pub(crate) fn remote(
    desc: &MrDesc,
    nic: usize,
    offset: u64,
    len: u64,
    right: Access,
) -> Result<Remote, TransferError> {
    let (peer, rkey) = *desc
        .nics
        .get(nic % desc.nics.len().max(1))
        .ok_or(TransferError::NoNics)?;
    let fail = |check| TransferError::Protection { peer, rkey, check };
    if !desc.access.contains(right) {
        return Err(fail(ProtectionCheck::MissingRight(right)));
    }
    let addr = desc
        .checked_addr(offset, len)
        .ok_or(fail(ProtectionCheck::OutOfBounds {
            addr: desc.ptr.wrapping_add(offset),
            len,
        }))?;
    if right == Access::REMOTE_ATOMIC && addr % 8 != 0 {
        return Err(fail(ProtectionCheck::Misaligned { addr }));
    }
    Ok(Remote { peer, rkey, addr })
}
