//! A warmed-up get allocates nothing: the hot path's buffers are reused,
//! the cached model and topology are borrowed, and nothing is hashed into
//! a map (issue 17: the get path's CPU). Counted by a global allocator
//! that counts the calling thread's allocations only (the memory node's
//! own threads allocate as they like meanwhile).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

mod common;

use rolex_host::kv::{KvClient, KvClientConfig};

/// The system allocator, counting each thread's allocations.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// count is a thread-local `Cell` with a const initialiser, which neither
// allocates nor can fail on access during allocation.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this layout (every
        // allocation is forwarded there).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: as `dealloc`, and the caller's new size.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

#[test]
fn a_warmed_up_get_allocates_nothing() {
    let pairs: Vec<(u64, u64)> = (0..4000u64).map(|i| (i * 977 + 5, i)).collect();
    let node = common::small_kv_node(&pairs);
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    // Warm up: every model read and cached, the session's buffers grown.
    for &(k, v) in &pairs {
        assert_eq!(s.get(k).unwrap(), Some(v));
    }
    let before = allocations();
    for round in 0..3u64 {
        for &(k, v) in &pairs {
            assert_eq!(s.get(k).unwrap(), Some(v));
            assert_eq!(s.get(k + 1 + round).unwrap(), None);
        }
    }
    let during = allocations() - before;
    assert_eq!(during, 0, "{during} allocations in 24,000 gets");
    // The count sees this thread's allocations.
    let v = std::hint::black_box(vec![0u8; 64]);
    assert_eq!(allocations() - before, 1);
    drop(v);
}
