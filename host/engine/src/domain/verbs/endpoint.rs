//! [`VerbsEndpoint`]: a poster on a verbs NIC, as the engine's workers and
//! client channels see it.
//!
//! All endpoints of one NIC share its per-peer queue pairs and its
//! completion queue; each has its own sink, and every operation's record
//! names the sink its completion goes to, so whichever poller reads the
//! queue routes completions right. Invariant: every request handed to
//! [`Endpoint::post`] produces exactly one completion in its sink (see the
//! domain's module docs for the ways).

use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Instant;

use super::domain::{lock, Inner, Sink, HOT};
use crate::domain::{Completion, Endpoint, Progress, WorkRequest};

/// A poster on a verbs NIC (see the module docs).
pub struct VerbsEndpoint {
    inner: Arc<Inner>,
    sink: Arc<Sink>,
}

impl std::fmt::Debug for VerbsEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsEndpoint")
            .field("outstanding", &self.sink.outstanding.load(SeqCst))
            .finish()
    }
}

impl VerbsEndpoint {
    pub(crate) fn new(inner: Arc<Inner>) -> VerbsEndpoint {
        VerbsEndpoint {
            inner,
            sink: Sink::new(),
        }
    }
}

impl Endpoint for VerbsEndpoint {
    fn post(&mut self, batch: &mut Vec<WorkRequest>) {
        self.inner.post(&self.sink, batch);
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> Progress {
        let inner = &self.inner;
        let state = {
            let mut g = lock(&inner.live);
            g.as_mut().map(|live| {
                inner.progress(live);
                (live.last_activity.elapsed(), live.connecting())
            })
        };
        while let Some(c) = self.sink.queue.pop() {
            out.push(c);
        }
        let Some((since, connecting)) = state else {
            return Progress::Idle;
        };
        if self.sink.outstanding.load(SeqCst) > 0 || connecting || since < HOT {
            // The NIC works on its own; the caller backs off briefly.
            Progress::Busy
        } else {
            // Idle: read the queue now and then for arrivals and
            // handshakes (there is no completion channel to wake us).
            Progress::WaitUntil(Instant::now() + inner.cfg().idle_poll)
        }
    }

    fn flush(&mut self, out: &mut Vec<Completion>) {
        self.inner.flush(&self.sink, out);
    }
}
