//! [`Plug`]: a thread's submissions posted together (like a block
//! device's plugging), so that a loop keeping many transfers in flight
//! pays one post call — and on `tcp` one delivery acknowledgement per
//! peer (`domain::fabric`'s covered writes) — for several of them.
//!
//! While a thread holds a plug, a transfer it submits with a flag to a
//! group that already has transfers in flight is accepted by the group but
//! not posted; it is posted with whatever else is pending by the first of:
//! this thread's next wait on a flag that has to poll, the plug's drop,
//! or any round of the group (its worker's, another waiter's). A
//! submission to a group with nothing in flight is posted at once, so the
//! pipeline starts without delay, and so is one that would make the
//! deferred payload exceed a worker round's (256 KiB: larger posts hold
//! completions back), with everything deferred before it. A deferred submission waits at most
//! for the group's next round, which comes at the latest with the
//! completion of a transfer that was in flight when it was made (rounds
//! post what was deferred before they read completions, under the same
//! lock that deferral takes). A NIC whose completions do not bring that
//! round by themselves (the loopback NIC, which completes an operation as
//! it is posted and tells no one) has its submissions posted at once: a
//! thread waiting for something other than its own transfers (a peer's
//! expectation) would otherwise wait for ever. Invariant: when no plug of the thread
//! is held and the thread is not inside a wait, nothing it submitted is
//! left unposted by it (each group it deferred to is flushed).

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::sync::{Arc, Weak};

use crate::shared::DirectPost;

thread_local! {
    /// Plugs this thread holds (nested plugs count).
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    /// Groups holding this thread's deferred submissions.
    static DEFERRED: RefCell<Vec<Weak<dyn DirectPost>>> = const { RefCell::new(Vec::new()) };
}

/// Batches the calling thread's submissions until dropped (see the module
/// docs); from [`TransferEngine::plug`](crate::TransferEngine::plug).
/// Not `Send`: it belongs to the thread that took it.
#[derive(Debug)]
#[must_use = "submissions are batched only while the plug is held"]
pub struct Plug {
    _thread: PhantomData<*const ()>,
}

impl Plug {
    pub(crate) fn new() -> Plug {
        DEPTH.with(|d| d.set(d.get() + 1));
        Plug {
            _thread: PhantomData,
        }
    }
}

impl Drop for Plug {
    fn drop(&mut self) {
        let depth = DEPTH.with(|d| {
            let v = d.get().saturating_sub(1);
            d.set(v);
            v
        });
        if depth == 0 {
            flush();
        }
    }
}

/// Whether the calling thread holds a plug.
pub(crate) fn plugged() -> bool {
    DEPTH.with(Cell::get) > 0
}

/// Records that `group` holds a submission of this thread not yet posted.
pub(crate) fn deferred(group: &Arc<dyn DirectPost>) {
    DEFERRED.with(|v| {
        let mut v = v.borrow_mut();
        let w = Arc::downgrade(group);
        if !v.iter().any(|g| g.ptr_eq(&w)) {
            v.push(w);
        }
    });
}

/// Posts every submission this thread deferred (a wait that has to poll
/// calls it first: the awaited operation may depend on any of them).
pub(crate) fn flush() {
    let groups = DEFERRED.with(|v| std::mem::take(&mut *v.borrow_mut()));
    for g in groups.iter().filter_map(Weak::upgrade) {
        g.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::Request;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    /// A group that counts its flushes.
    #[derive(Default)]
    struct Counting(AtomicUsize);

    impl DirectPost for Counting {
        fn try_post(&self, req: Request) -> Result<(), Request> {
            Err(req)
        }
        fn flush(&self) {
            self.0.fetch_add(1, SeqCst);
        }
    }

    #[test]
    fn the_outermost_plugs_drop_flushes_each_group_once() {
        let a = Arc::new(Counting::default());
        let b = Arc::new(Counting::default());
        let (ga, gb): (Arc<dyn DirectPost>, Arc<dyn DirectPost>) = (a.clone(), b.clone());
        let counts = || (a.0.load(SeqCst), b.0.load(SeqCst));
        assert!(!plugged());
        let outer = Plug::new();
        {
            let _inner = Plug::new();
            assert!(plugged());
            deferred(&ga);
            deferred(&ga);
            deferred(&gb);
        }
        assert_eq!(counts(), (0, 0), "the inner drop keeps them");
        drop(outer);
        assert!(!plugged());
        assert_eq!(counts(), (1, 1), "one flush per group");
        // Nothing is left to flush.
        flush();
        assert_eq!(counts(), (1, 1));
    }
}
