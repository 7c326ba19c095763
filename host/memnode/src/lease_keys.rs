//! Per-lease keys to a file-backed pool: what fences a compute node's late
//! RMA at the memory node itself. Each lease is granted a key of its own —
//! the pool file mapped a second time (other addresses, the same pages)
//! and registered — and the key is closed (deregistered) the moment the
//! lease ends, before any of its locks is released. A compute node that
//! uses its lease's key (`rolex_kv::lease::LeaseFence::pool`) then has
//! every operation it posted and that arrives after the end refused by the
//! provider: on `tcp;ofi_rxm` the target drops the connection, nothing
//! lands (`host/tests/fence_revocation.rs`). A second *registration* of
//! the same mapping is not possible on offset-key providers (the key is
//! derived from the base address), hence the second mapping.
//!
//! The closed key's mapping stays mapped until the lease's id is freed
//! (after the last release pass): a transfer the provider had accepted
//! before the close may still be placing its bytes — under the stalled
//! holder's lock, which is released only after the grace period.
//!
//! Only a pool in a file (`MemoryNodeConfig::pool_file`) can be mapped
//! again; an anonymous pool gets no per-lease keys ([`LeaseKeys::new`]
//! returns `None`) and its compute nodes use the offer's key.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

use rolex_core::entry::LockOwner;
use rolex_core::wire::MrDesc;
use rolex_engine::MrHandle;

use crate::lease_server::PoolKeys;
use crate::node::{pool_access, MemoryNode};

/// One lease's mapping of the pool file and, while open, its registration.
struct Alias {
    map: NonNull<u8>,
    len: usize,
    mr: Option<MrHandle>,
}

/// The per-lease keys of one memory node's file-backed pool.
pub struct LeaseKeys {
    node: Arc<MemoryNode>,
    file: std::fs::File,
    file_len: usize,
    pool_at: usize,
    pool_len: u64,
    aliases: Mutex<HashMap<u16, Alias>>,
}

// SAFETY: the raw pointers in `aliases` are mappings this type made and
// alone unmaps (under the mutex); no Rust reference into them exists.
unsafe impl Send for LeaseKeys {}
// SAFETY: as for `Send`; every access to `aliases` holds its mutex.
unsafe impl Sync for LeaseKeys {}

impl std::fmt::Debug for LeaseKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseKeys")
            .field("open", &self.lock().len())
            .finish_non_exhaustive()
    }
}

impl LeaseKeys {
    /// Per-lease keys for `node`'s pool, if it lives in a file.
    pub fn new(node: Arc<MemoryNode>) -> Option<Arc<LeaseKeys>> {
        let (file, file_len, pool_at) = node.pool_file()?;
        let file = file.try_clone().ok()?;
        let pool_len = node.pool_handle().len();
        Some(Arc::new(LeaseKeys {
            node,
            file,
            file_len,
            pool_at,
            pool_len,
            aliases: Mutex::new(HashMap::new()),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u16, Alias>> {
        self.aliases.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn deregister(&self, a: &mut Alias) {
        if let Some(mr) = a.mr.take() {
            if let Err(e) = self.node.engine().dereg_mr(&mr) {
                eprintln!("lease keys: closing a lease's key failed: {e}");
            }
        }
    }

    fn unmap(a: &Alias) {
        // SAFETY: `a.map` is a mapping of `a.len` bytes made by `open` and
        // deregistered before (callers close first); unmapped once, as
        // its `Alias` is being removed.
        unsafe { libc::munmap(a.map.as_ptr().cast(), a.len) };
    }
}

impl PoolKeys for LeaseKeys {
    fn open(&self, owner: LockOwner) -> Result<Option<MrDesc>, String> {
        // SAFETY: a fresh shared mapping of our own open file at an address
        // the kernel picks; it aliases no Rust object.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                self.file_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!(
                "mapping the pool file again: {}",
                std::io::Error::last_os_error()
            ));
        }
        let map = NonNull::new(p.cast::<u8>()).ok_or("mmap returned null")?;
        let mut alias = Alias {
            map,
            len: self.file_len,
            mr: None,
        };
        // SAFETY: `pool_at + pool_len <= file_len` (the node's own pool
        // lies there in its mapping of the same file); the mapping stays
        // until `forget` or drop, after the registration is closed; no
        // Rust reference into it exists, all access goes through the
        // engine (and the node's own pool, the same pages, through its
        // checked atomics).
        let registered = unsafe {
            let ptr = NonNull::new_unchecked(map.as_ptr().add(self.pool_at));
            self.node.engine().reg_mr(ptr, self.pool_len, pool_access())
        };
        match registered {
            Ok((mr, desc)) => {
                alias.mr = Some(mr);
                if let Some(old) = self.lock().insert(owner.0, alias) {
                    // An id is never granted twice while its alias lives;
                    // should it be, the old key is closed first.
                    let mut old = old;
                    self.deregister(&mut old);
                    Self::unmap(&old);
                }
                Ok(Some(desc))
            }
            Err(e) => {
                Self::unmap(&alias);
                Err(format!("registering the pool for lease {}: {e}", owner.0))
            }
        }
    }

    fn close(&self, owner: LockOwner) {
        let mut g = self.lock();
        if let Some(a) = g.get_mut(&owner.0) {
            self.deregister(a);
        }
    }

    fn forget(&self, owner: LockOwner) {
        let removed = self.lock().remove(&owner.0);
        if let Some(mut a) = removed {
            self.deregister(&mut a);
            Self::unmap(&a);
        }
    }
}

impl Drop for LeaseKeys {
    fn drop(&mut self) {
        let all: Vec<Alias> = self.lock().drain().map(|(_, a)| a).collect();
        for mut a in all {
            self.deregister(&mut a);
            Self::unmap(&a);
        }
    }
}
