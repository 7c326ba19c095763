//! UVM watchers: 64-bit words that any writer (a GPU kernel, another
//! thread) updates, and a watcher thread that calls `cb(old, new)` when it
//! sees a change.
//!
//! The word is reached through the [`WatchedWord`] seam: here a CPU word
//! (host memory, `AtomicU64`); a CUDA/GDRCopy-backed word that reads
//! device-mapped memory plugs in behind the same trait later.
//!
//! Invariants: the thread exists only while at least one watcher was
//! allocated, and its idle cost stays tiny: after a change it polls with a
//! short, growing sleep (2 µs up to 2 ms), never a busy spin; with no
//! watchers it parks. Each callback sees consecutive observed values
//! (`old` is the `new` of the previous call); updates faster than the poll
//! may be coalesced, as with any polled word.

use std::ptr::NonNull;
use std::sync::atomic::{
    AtomicBool, AtomicU64, Ordering::Acquire, Ordering::Release, Ordering::SeqCst,
};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crossbeam_queue::SegQueue;

use crate::error::TransferError;

/// A 64-bit word a watcher polls.
pub trait WatchedWord: Send + Sync {
    /// The current value.
    fn load(&self) -> u64;
}

/// A watched word in host memory.
#[derive(Debug, Default)]
pub struct CpuWord {
    value: AtomicU64,
}

impl WatchedWord for CpuWord {
    fn load(&self) -> u64 {
        self.value.load(Acquire)
    }
}

/// The callback of a watcher: `(old, new)`.
pub type WatchFn = Box<dyn FnMut(u64, u64) + Send>;

struct Entry {
    word: Arc<dyn WatchedWord>,
    last: u64,
    cb: WatchFn,
    dropped: Arc<AtomicBool>,
}

/// A watched word; dropping it stops the watching.
pub struct Watcher {
    word: Arc<CpuWord>,
    dropped: Arc<AtomicBool>,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher")
            .field("value", &self.load())
            .finish()
    }
}

impl Watcher {
    /// The word itself.
    pub fn word(&self) -> &AtomicU64 {
        &self.word.value
    }

    /// Its address, for writers outside Rust (a GPU kernel through UVM);
    /// they must write it with aligned 8-byte stores. Valid while this
    /// handle lives.
    pub fn as_ptr(&self) -> NonNull<u64> {
        NonNull::from(&self.word.value).cast()
    }

    /// Stores a new value.
    pub fn store(&self, value: u64) {
        self.word.value.store(value, Release);
    }

    /// The current value.
    pub fn load(&self) -> u64 {
        self.word.value.load(Acquire)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.dropped.store(true, Release);
    }
}

struct Shared {
    new: SegQueue<Entry>,
    stop: AtomicBool,
}

/// The watcher thread of one engine, started on the first watcher.
pub(crate) struct WatcherSet {
    engine: u64,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl WatcherSet {
    pub(crate) fn new(engine: u64) -> Self {
        WatcherSet {
            engine,
            shared: Arc::new(Shared {
                new: SegQueue::new(),
                stop: AtomicBool::new(false),
            }),
            thread: Mutex::new(None),
        }
    }

    pub(crate) fn add(&self, cb: WatchFn) -> Result<Watcher, TransferError> {
        let word = Arc::new(CpuWord::default());
        let dropped = Arc::new(AtomicBool::new(false));
        self.shared.new.push(Entry {
            word: word.clone(),
            last: 0,
            cb,
            dropped: dropped.clone(),
        });
        let mut t = self.thread.lock().unwrap_or_else(|e| e.into_inner());
        match &*t {
            Some(h) => h.thread().unpark(),
            None => {
                let shared = self.shared.clone();
                let h = thread::Builder::new()
                    .name(format!("rolex-te{}-watch", self.engine))
                    .spawn(move || watch(&shared))
                    .map_err(|_| TransferError::ThreadSpawn { thread: "watcher" })?;
                *t = Some(h);
            }
        }
        Ok(Watcher { word, dropped })
    }

    pub(crate) fn stop(&self) {
        self.shared.stop.store(true, SeqCst);
        if let Some(h) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            h.thread().unpark();
            if thread::current().id() != h.thread().id() {
                let _ = h.join();
            }
        }
    }
}

const NAP_MIN: Duration = Duration::from_micros(2);
const NAP_MAX: Duration = Duration::from_millis(2);

fn watch(shared: &Shared) {
    let mut entries: Vec<Entry> = Vec::new();
    let mut nap = NAP_MIN;
    while !shared.stop.load(SeqCst) {
        while let Some(e) = shared.new.pop() {
            entries.push(e);
        }
        entries.retain(|e| !e.dropped.load(Acquire));
        if entries.is_empty() {
            thread::park();
            continue;
        }
        let mut changed = false;
        for e in &mut entries {
            let v = e.word.load();
            if v != e.last {
                let old = std::mem::replace(&mut e.last, v);
                let cb = &mut e.cb;
                // A panicking callback must not stop the other watchers.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cb(old, v)));
                changed = true;
            }
        }
        if changed {
            nap = NAP_MIN;
        } else {
            thread::park_timeout(nap);
            nap = (nap * 2).min(NAP_MAX);
        }
    }
}
