//! A client's unlocks posted and not awaited, as the client sees them
//! ([`Posted`]), and its **reaper**: a parked thread that releases what a
//! failed unlock left locked while the session that posted it is idle.
//!
//! On an unordered fabric a write posts its unlock `CAS` and returns
//! (module `session::lock`); the unlock is settled later by its own
//! session — once it completed, before that session locks the chain
//! again, or when it flushes or drops — or, once it failed, by another
//! session of the client whose lock meets the chain. An unlock that fails
//! (the memory node refused it, the link dropped) leaves the chain locked
//! by this client. If every session of the client then stays idle, no
//! operation of it would ever release that lock, and writers of other
//! processes — and the memory node's freeze of that model — would wait
//! for it until they run out of attempts.
//!
//! The reaper closes that gap. It is started by the client's first posted
//! unlock. While some session has an unlock posted, or some lock is
//! recorded as maybe held, it looks every [`TICK`]; otherwise it parks for
//! [`IDLE`] (the next post wakes it). Each look takes the unlocks that
//! failed out of their sessions' lists (each is taken out by one session
//! only: settled exactly once) and releases them again through a session
//! of its own, exactly as their session would (`KvSession::lost_release`:
//! the stripe rules hold), or records them as maybe held; then it tries
//! again every lock the client records as maybe held, on each look until
//! none is left. A lock another process's writer waits for is so released
//! within about a tick of the memory node taking operations again.
//!
//! The reaper holds the client only while it has work, through that
//! session, and lets go of it as soon as it has nothing to do, or is the
//! last handle on the client with no lock maybe held (its drop then gives
//! the client's value space back, as the last handle's does). A lock
//! maybe held keeps it trying as the last handle too — nobody else would
//! release it — for at most [`LINGER`]; and the drop of the client's last
//! handle while a lock is maybe held hands the client to the reaper
//! ([`Posted::adopt`]) instead of closing it, so the reaper releases the
//! lock once the memory node takes operations again and then closes it.
//! It ends when the client goes (woken by [`Posted`]'s drop). No thread
//! is started for a client that never posts an unlock (an ordered fabric
//! without splits), and a client whose thread cannot be spawned works as
//! before (its failed unlocks wait for a session).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use crate::client::ClientShared;
use crate::session::{KvSession, PostedUnlocks};

/// How often the reaper looks while some unlock is posted or some lock is
/// maybe held.
const TICK: Duration = Duration::from_millis(50);

/// How often it looks while none is (a post wakes it; one that misses it
/// waits no longer than this).
const IDLE: Duration = Duration::from_secs(1);

/// How long the reaper, once its session is the last handle on the
/// client, goes on trying to release the locks the client records as
/// maybe held (the memory node refusing operations for a while) before it
/// lets go of the client, leaving them to the memory node's lease reaper.
const LINGER: Duration = Duration::from_secs(30);

/// Every live session's posted unlocks, and the reaper that watches them.
#[derive(Default)]
pub(crate) struct Posted {
    /// Each live session's list (dropped sessions' go when a session is
    /// made).
    lists: Mutex<Vec<Weak<PostedUnlocks>>>,
    /// The reaper's thread, once started (`None`: it could not be).
    thread: OnceLock<Option<Thread>>,
    /// Whether the reaper is parked for [`IDLE`] (a post wakes it).
    idle: AtomicBool,
    /// The client, handed over by its last handle's drop while a lock is
    /// maybe held ([`Posted::adopt`]): the reaper takes it at its next
    /// look.
    adopted: Mutex<Option<Arc<ClientShared>>>,
}

impl Posted {
    /// Lists a new session's unlocks.
    pub(crate) fn add(&self, list: &Arc<PostedUnlocks>) {
        let mut lists = self.lists.lock().unwrap_or_else(|e| e.into_inner());
        lists.retain(|l| l.strong_count() > 0);
        lists.push(Arc::downgrade(list));
    }

    /// Every live session's list but `except`.
    pub(crate) fn others(&self, except: &Arc<PostedUnlocks>) -> Vec<Arc<PostedUnlocks>> {
        self.lists
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|l| !Arc::ptr_eq(l, except))
            .collect()
    }

    /// After a session of `shared` posted an unlock: starts the reaper if
    /// it is not running yet, wakes it if it is parked for [`IDLE`] (a
    /// load of a word only the reaper writes, and only when it goes idle
    /// or wakes: a post that misses it costs at most [`IDLE`]).
    pub(crate) fn posted(shared: &Arc<ClientShared>) {
        let me = &shared.posted;
        let thread = me.thread.get_or_init(|| spawn(shared));
        if me.idle.load(Relaxed) && me.idle.swap(false, Relaxed) {
            if let Some(t) = thread {
                t.unpark();
            }
        }
    }

    /// The drop of the last handle on `shared` (a session or the client):
    /// while a lock is maybe held, hands the client to its reaper, which
    /// goes on releasing it and then closes the client (as the last
    /// handle, see [`LINGER`]); `true` if it did (the caller does not
    /// close the client), `false` if there is nothing to release or no
    /// reaper.
    pub(crate) fn adopt(shared: &Arc<ClientShared>) -> bool {
        if !worth_lingering(shared) {
            return false;
        }
        let me = &shared.posted;
        let Some(Some(thread)) = me.thread.get() else {
            return false;
        };
        if thread.id() == thread::current().id() {
            // The reaper's own session, dropped once it gave up.
            return false;
        }
        *me.adopted.lock().unwrap_or_else(|e| e.into_inner()) = Some(shared.clone());
        me.idle.store(false, Relaxed);
        thread.unpark();
        true
    }

    /// Whether any session has an unlock posted.
    fn any(&self) -> bool {
        self.lists
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .any(|l| !l.lock().unwrap_or_else(|e| e.into_inner()).is_empty())
    }
}

impl Drop for Posted {
    fn drop(&mut self) {
        // The client is going: a reaper parked for good sees it and ends.
        if let Some(Some(t)) = self.thread.get() {
            t.unpark();
        }
    }
}

/// Starts the reaper of `shared`; `None` if the thread cannot be made.
fn spawn(shared: &Arc<ClientShared>) -> Option<Thread> {
    let client = Arc::downgrade(shared);
    let posted = Arc::downgrade(&shared.posted);
    thread::Builder::new()
        .name("rolex-kv-reaper".into())
        .spawn(move || run(&client, &posted))
        .ok()
        .map(|h| h.thread().clone())
}

/// The reaper's loop (module docs).
fn run(client: &Weak<ClientShared>, posted: &Weak<Posted>) {
    // Its own session, kept while it has work (dropped when it goes idle:
    // a session is a handle on the client, and registers its counters).
    let mut session: Option<KvSession> = None;
    // Whether the last look left a lock recorded as maybe held.
    let mut held = false;
    // When it found its session the last handle with a lock maybe held.
    let mut alone_since: Option<Instant> = None;
    loop {
        let Some(list) = posted.upgrade() else { return };
        let adopted = list
            .adopted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(shared) = adopted {
            // Its last handle went with a lock maybe held.
            held = true;
            if session.is_none() {
                session = KvSession::new(shared).ok();
            }
        }
        // A lock some session recorded as maybe held (a repair its own
        // operation could not finish, say) while every session went idle.
        let recorded = !held && client.upgrade().is_some_and(|c| worth_lingering(&c));
        held |= recorded;
        if held || failed_unlocks(&list) {
            if session.is_none() {
                let Some(shared) = client.upgrade() else {
                    return;
                };
                session = KvSession::new(shared).ok();
            }
            held = session.as_mut().map_or(true, KvSession::reap_for_client);
        }
        if session.as_ref().is_some_and(KvSession::last_handle) {
            // Every other handle on the client went meanwhile: nobody is
            // left to post or wait. Its drop closes the client as the
            // last handle's does — once no lock is maybe held, or after
            // [`LINGER`] of trying: nobody else would release them.
            let alone = *alone_since.get_or_insert_with(Instant::now);
            let linger = session.as_ref().is_some_and(KvSession::worth_lingering);
            if !linger || alone.elapsed() >= LINGER {
                return;
            }
        }
        let busy = held || list.any();
        if busy {
            drop(list);
            thread::park_timeout(TICK);
            continue;
        }
        session = None;
        list.idle.store(true, Relaxed);
        drop(list);
        thread::park_timeout(IDLE);
        if let Some(list) = posted.upgrade() {
            list.idle.store(false, Relaxed);
        }
    }
}

/// Whether the client records a lock as maybe held that the reaper can
/// still release: not once its lease lapsed (the lock is then the memory
/// node's lease reaper's).
pub(crate) fn worth_lingering(shared: &ClientShared) -> bool {
    shared.held.count() > 0 && !shared.cfg.lease.as_ref().is_some_and(|l| !l.valid())
}

/// Whether some session has an unlock posted that failed (looking drives
/// the engine's completions of each once).
fn failed_unlocks(posted: &Posted) -> bool {
    let lists: Vec<Arc<PostedUnlocks>> = posted
        .lists
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    lists.iter().any(|l| {
        l.lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|p| p.failed())
    })
}
