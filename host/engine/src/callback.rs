//! Initiator-side completion: [`OnDone`] / [`OnValue`] (a callback or a
//! [`CompletionFlag`]), and the engine's callback thread.
//!
//! Invariant: every submitted operation's notification fires exactly once —
//! success, error, or [`TransferError::EngineShutDown`] when the engine
//! goes first. Flags are set by the thread that learns the outcome (no
//! thread hop); callbacks run on the one callback thread, in completion
//! order, so a slow callback delays other callbacks but never a worker.
//!
//! Whoever waits polls (design §4, "Latency"): a flag handed to an engine
//! remembers the `FlagDriver` of the group that carries its operation,
//! and [`CompletionFlag::wait`] runs that group's completion processing
//! itself for up to the engine's spin budget before it parks, so a small
//! operation completes on the waiting thread without waking the worker;
//! [`CompletionFlag::is_done`] and [`CompletionFlag::result`] run it once.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{
    AtomicU64, AtomicU8, Ordering::AcqRel, Ordering::Acquire, Ordering::Release,
};
use std::sync::{Arc, Mutex, Weak};
use std::thread::{self, JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::error::TransferError;

/// A completion callback for operations without a result value.
pub type DoneFn = Box<dyn FnOnce(Result<(), TransferError>) + Send>;
/// A completion callback for atomics: the word's old value.
pub type ValueFn = Box<dyn FnOnce(Result<u64, TransferError>) + Send>;

/// How the initiator learns that an operation finished.
pub enum OnDone {
    /// Called on the engine's callback thread.
    Callback(DoneFn),
    /// Set by the engine; poll or wait on it.
    Flag(Arc<CompletionFlag>),
}

impl OnDone {
    /// A callback completion.
    pub fn callback(f: impl FnOnce(Result<(), TransferError>) + Send + 'static) -> Self {
        OnDone::Callback(Box::new(f))
    }

    /// A flag completion (the flag is shared, not consumed).
    pub fn flag(flag: &Arc<CompletionFlag>) -> Self {
        OnDone::Flag(flag.clone())
    }
}

impl std::fmt::Debug for OnDone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OnDone::Callback(_) => f.write_str("OnDone::Callback"),
            OnDone::Flag(x) => f.debug_tuple("OnDone::Flag").field(x).finish(),
        }
    }
}

/// How the initiator of an atomic learns the old value of the word.
pub enum OnValue {
    /// Called on the engine's callback thread.
    Callback(ValueFn),
    /// Set by the engine with the value; poll or wait on it.
    Flag(Arc<CompletionFlag>),
}

impl OnValue {
    /// A callback completion.
    pub fn callback(f: impl FnOnce(Result<u64, TransferError>) + Send + 'static) -> Self {
        OnValue::Callback(Box::new(f))
    }

    /// A flag completion.
    pub fn flag(flag: &Arc<CompletionFlag>) -> Self {
        OnValue::Flag(flag.clone())
    }
}

impl std::fmt::Debug for OnValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OnValue::Callback(_) => f.write_str("OnValue::Callback"),
            OnValue::Flag(x) => f.debug_tuple("OnValue::Flag").field(x).finish(),
        }
    }
}

const PENDING: u8 = 0;
const OK: u8 = 1;
const FAILED: u8 = 2;
/// Set (with `PENDING`) while a thread sleeps in [`CompletionFlag::wait`]:
/// completing the flag then unparks it.
const SLEEPER: u8 = 4;
/// How many times [`CompletionFlag::wait`] checks the flag before it parks.
const SPINS: u32 = 64;
/// Longest a waiter parks before it looks at the flag again unwoken.
const BACKSTOP: Duration = Duration::from_millis(10);

/// The completion processing of the domain group that carries a flag's
/// operation, run by the thread that waits on the flag (module docs).
pub(crate) trait FlagDriver: Send + Sync {
    /// Runs one round of the group's completion processing unless another
    /// thread is running one; never blocks.
    fn drive(&self) {
        self.try_drive();
    }
    /// [`FlagDriver::drive`], saying whether the round ran (`false`:
    /// another thread holds the group, or it is closed).
    fn try_drive(&self) -> bool;
    /// Wakes the group's worker (for a round this thread could not run).
    fn wake_worker(&self);
    /// How long a waiter polls before it parks.
    fn spin(&self) -> Duration;
    /// A waiter starts polling: the group's worker may stand aside.
    fn enter(&self);
    /// That waiter stops polling: done, or (`waiting`) about to sleep
    /// while its operation is still in flight, which the worker must then
    /// see to at once (and keep seeing to until the sleeper calls
    /// [`FlagDriver::woke`]).
    fn leave(&self, waiting: bool);
    /// A waiter that left with `waiting` no longer sleeps.
    fn woke(&self);
}

/// A waiter that left its group's polling with `waiting`: tells the
/// driver it no longer sleeps when dropped.
pub(crate) struct Asleep(pub(crate) Option<Arc<dyn FlagDriver>>);

impl Drop for Asleep {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            d.woke();
        }
    }
}

/// Polls between two yields of the CPU while a waiter drives its group.
const POLLS_PER_YIELD: u32 = 4;

/// An atomic completion flag recording success (with a value: the old word
/// of an atomic, 0 otherwise) or the error.
///
/// Waiting ([`CompletionFlag::wait`]) first polls the operation's
/// completion itself (for the engine's spin budget), then parks the
/// waiting thread and the completing thread unparks it: a waiter costs
/// CPU only while it spins, and a completion nobody sleeps on costs one
/// atomic swap.
#[derive(Default)]
pub struct CompletionFlag {
    state: AtomicU8,
    value: AtomicU64,
    error: Mutex<Option<TransferError>>,
    /// The thread sleeping in `wait`, while `SLEEPER` is set.
    sleeper: Mutex<Option<thread::Thread>>,
    /// The group whose completion processing finishes the operation (set
    /// by the engine at submission; a dead engine leaves it dangling).
    driver: Mutex<Option<Weak<dyn FlagDriver>>>,
}

impl std::fmt::Debug for CompletionFlag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionFlag")
            .field("state", &self.state)
            .field("value", &self.value)
            .finish_non_exhaustive()
    }
}

impl CompletionFlag {
    /// A pending flag.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Whether the operation finished (either way). While it has not,
    /// runs its group's completion processing once (see the module docs).
    pub fn is_done(&self) -> bool {
        self.done_driving()
    }

    /// The outcome, once finished. While it has not, runs its group's
    /// completion processing once (see the module docs).
    pub fn result(&self) -> Option<Result<u64, TransferError>> {
        self.done_driving();
        self.outcome()
    }

    fn done(&self) -> bool {
        self.state.load(Acquire) & !SLEEPER != PENDING
    }

    /// [`Self::done`], after one round of the driver while not.
    fn done_driving(&self) -> bool {
        if self.done() {
            return true;
        }
        if let Some(d) = self.driver() {
            d.drive();
        }
        self.done()
    }

    /// The driver, if its engine is still there.
    fn driver(&self) -> Option<Arc<dyn FlagDriver>> {
        self.driver
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(Weak::upgrade)
    }

    /// Called by the engine when it takes an operation notifying this flag.
    pub(crate) fn set_driver(&self, driver: Weak<dyn FlagDriver>) {
        let mut d = self.driver.lock().unwrap_or_else(|e| e.into_inner());
        // Most flags are reused on the same group: skip the store then.
        if !d.as_ref().is_some_and(|old| Weak::ptr_eq(old, &driver)) {
            *d = Some(driver);
        }
    }

    /// The outcome, once finished, without driving.
    fn outcome(&self) -> Option<Result<u64, TransferError>> {
        match self.state.load(Acquire) & !SLEEPER {
            OK => Some(Ok(self.value.load(Acquire))),
            FAILED => Some(Err(self
                .error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .unwrap_or(TransferError::EngineShutDown))),
            _ => None,
        }
    }

    /// Waits up to `timeout` for the outcome: polls the operation's
    /// completion itself for the engine's spin budget (yielding the CPU
    /// every few polls), then parks until the completing thread unparks it.
    /// One thread at a time may wait on a flag.
    pub fn wait(&self, timeout: Duration) -> Option<Result<u64, TransferError>> {
        let start = Instant::now();
        let deadline = start.checked_add(timeout);
        let mut _asleep = Asleep(None);
        if let Some(d) = self.driver().filter(|_| !self.done()) {
            // What this thread holds back under a plug may be what the
            // operation waits for.
            if crate::plug::plugged() {
                crate::plug::flush();
            }
            let budget = d.spin().min(timeout);
            d.enter();
            let mut polls = 0u32;
            while !self.done() && start.elapsed() < budget {
                d.drive();
                polls += 1;
                if polls % POLLS_PER_YIELD == 0 {
                    thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            let waiting = !self.done();
            d.leave(waiting);
            if waiting {
                _asleep = Asleep(Some(d));
            }
        }
        for _ in 0..SPINS {
            if let Some(r) = self.outcome() {
                return Some(r);
            }
            std::hint::spin_loop();
        }
        *self.sleeper.lock().unwrap_or_else(|e| e.into_inner()) = Some(thread::current());
        // Announce the sleeper; fails when the flag completed meanwhile.
        let _ = self
            .state
            .compare_exchange(PENDING, PENDING | SLEEPER, AcqRel, Acquire);
        let r = loop {
            if let Some(r) = self.outcome() {
                break Some(r);
            }
            // The backstop covers a second thread waiting on the same flag
            // (only the last to arrive is unparked).
            let mut nap = BACKSTOP;
            if let Some(d) = deadline {
                let now = Instant::now();
                if now >= d {
                    break None;
                }
                nap = nap.min(d - now);
            }
            thread::park_timeout(nap);
        };
        let _ = self
            .state
            .compare_exchange(PENDING | SLEEPER, PENDING, AcqRel, Acquire);
        r
    }

    /// Makes the flag pending again, for reuse.
    pub fn reset(&self) {
        if self.state.load(Acquire) == FAILED {
            *self.error.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        self.state.store(PENDING, Release);
    }

    pub(crate) fn complete(&self, result: Result<u64, TransferError>) {
        let old = match result {
            Ok(v) => {
                self.value.store(v, Release);
                self.state.swap(OK, AcqRel)
            }
            Err(e) => {
                *self.error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                self.state.swap(FAILED, AcqRel)
            }
        };
        if old & SLEEPER != 0 {
            let t = self
                .sleeper
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            if let Some(t) = t {
                t.unpark();
            }
        }
    }
}

/// A notification of either kind, as the engine carries it.
pub(crate) enum Notify {
    Done(OnDone),
    Value(OnValue),
}

impl From<OnDone> for Notify {
    fn from(d: OnDone) -> Self {
        Notify::Done(d)
    }
}

impl From<OnValue> for Notify {
    fn from(v: OnValue) -> Self {
        Notify::Value(v)
    }
}

impl Notify {
    /// The flag, when the notification is one.
    pub(crate) fn flag(&self) -> Option<&Arc<CompletionFlag>> {
        match self {
            Notify::Done(OnDone::Flag(f)) | Notify::Value(OnValue::Flag(f)) => Some(f),
            _ => None,
        }
    }

    /// Delivers the outcome: flags at once, callbacks through `cbq`.
    pub(crate) fn fire(self, result: Result<u64, TransferError>, cbq: &CallbackQueue) {
        match self {
            Notify::Done(OnDone::Flag(f)) | Notify::Value(OnValue::Flag(f)) => f.complete(result),
            Notify::Done(OnDone::Callback(cb)) => cbq.push(Job::Done(cb, result.map(|_| ()))),
            Notify::Value(OnValue::Callback(cb)) => cbq.push(Job::Value(cb, result)),
        }
    }
}

/// Work for the callback thread.
pub(crate) enum Job {
    Done(DoneFn, Result<(), TransferError>),
    Value(ValueFn, Result<u64, TransferError>),
    Run(Box<dyn FnOnce() + Send>),
    /// Ends the callback thread (other senders may outlive it).
    Stop,
}

impl Job {
    fn run(self) {
        // A panicking user callback must not take the callback thread down.
        let _ = catch_unwind(AssertUnwindSafe(move || match self {
            Job::Done(f, r) => f(r),
            Job::Value(f, r) => f(r),
            Job::Run(f) => f(),
            Job::Stop => {}
        }));
    }
}

/// The sending side of the callback thread's queue.
#[derive(Clone)]
pub(crate) struct CallbackQueue {
    tx: Sender<Job>,
}

impl CallbackQueue {
    pub(crate) fn push(&self, job: Job) {
        // Only fails once the thread is gone (after shutdown): run here.
        if let Err(e) = self.tx.send(job) {
            e.into_inner().run();
        }
    }
}

/// The engine's callback thread; it blocks on its queue when idle (no CPU).
pub(crate) struct CallbackThread {
    queue: Option<CallbackQueue>,
    handle: Option<JoinHandle<()>>,
    id: ThreadId,
}

impl CallbackThread {
    pub(crate) fn spawn(name: String) -> std::io::Result<Self> {
        let (tx, rx): (Sender<Job>, Receiver<Job>) = crossbeam_channel::unbounded();
        let handle = thread::Builder::new().name(name).spawn(move || {
            for job in rx.iter() {
                if matches!(job, Job::Stop) {
                    // Whatever was queued before the stop still runs.
                    while let Ok(job) = rx.try_recv() {
                        job.run();
                    }
                    break;
                }
                job.run();
            }
        })?;
        Ok(CallbackThread {
            id: handle.thread().id(),
            queue: Some(CallbackQueue { tx }),
            handle: Some(handle),
        })
    }

    pub(crate) fn queue(&self) -> CallbackQueue {
        match &self.queue {
            Some(q) => q.clone(),
            None => {
                // After `stop`: a queue whose thread is gone runs jobs inline.
                let (tx, _) = crossbeam_channel::unbounded();
                CallbackQueue { tx }
            }
        }
    }

    /// Lets the thread finish the queued jobs and exit; joins it unless
    /// called from the callback thread itself (a callback that drops the
    /// last engine handle), which then exits after returning.
    pub(crate) fn stop(&mut self) {
        if let Some(q) = self.queue.take() {
            let _ = q.tx.send(Job::Stop);
        }
        if let Some(h) = self.handle.take() {
            if thread::current().id() != self.id {
                let _ = h.join();
            }
        }
    }
}

impl Drop for CallbackThread {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_records_value_and_error() {
        let f = CompletionFlag::new();
        assert!(!f.is_done());
        assert_eq!(f.wait(Duration::from_millis(1)), None);
        f.complete(Ok(5));
        assert_eq!(f.result(), Some(Ok(5)));
        f.reset();
        f.complete(Err(TransferError::EngineShutDown));
        assert_eq!(
            f.wait(Duration::ZERO),
            Some(Err(TransferError::EngineShutDown))
        );
    }

    #[test]
    fn callbacks_run_on_thread_even_after_a_panic() {
        let mut t = CallbackThread::spawn("cb-test".into()).unwrap();
        let q = t.queue();
        let (tx, rx) = std::sync::mpsc::channel();
        q.push(Job::Run(Box::new(|| panic!("user callback panics"))));
        let tx2 = tx.clone();
        q.push(Job::Done(
            Box::new(move |r| tx2.send(r.is_ok()).unwrap()),
            Ok(()),
        ));
        assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap());
        t.stop();
        // After stop, jobs run inline.
        t.queue().push(Job::Done(
            Box::new(move |r| tx.send(r.is_ok()).unwrap()),
            Ok(()),
        ));
        assert!(rx.recv_timeout(Duration::from_secs(1)).unwrap());
    }
}
