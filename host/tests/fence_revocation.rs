//! What fencing a lease *at the memory node* needs from the engine on
//! `tcp;ofi_rxm`: closing a memory key so that RMA a fenced compute node
//! posted before its lease lapsed, and that arrives later, is refused at
//! the target. The lease fencing in `rolex-kv`'s `lease` stops a compute
//! node from *posting* writes once its lease lapsed; a write posted before
//! and delivered after the memory node released its locks is not covered
//! (see `rolex-memnode`'s `lease_server`). This test records the two facts
//! that decide how that could be closed:
//! 1. registering the same memory a second time (one key per lease over
//!    the pool) — what happens on `tcp`, whose keys the engine derives
//!    from the region's base address;
//! 2. a second *mapping* of the same pages (another address, so another
//!    key) registered, written through, then deregistered: a write through
//!    the closed key must not change the memory.
//!
//! Then the memory node's use of it (`rolex_memnode::LeaseKeys`): a lease
//! on a file-backed pool comes with a key of its own, the store works
//! through it, and once the lease ended at the memory node, RMA through
//! it — as a stalled compute node's late WRITE would arrive — is refused
//! there.
#![cfg(feature = "libfabric")]

mod common;

use std::ptr::NonNull;

use std::sync::Arc;
use std::time::Duration;

use rolex_host::domain::fabric::{probe, LibfabricConfig};
use rolex_host::kv::lease::LeaseClient;
use rolex_host::kv::{KvClient, KvClientConfig};
use rolex_host::memnode::{
    LeaseConfig, LeaseKeys, LeaseServer, MemoryNode, MemoryNodeConfig, PoolKeys,
};
use rolex_host::{Access, EngineConfig, Fabric, TransferEngine};

const LEN: usize = 4096;

fn tcp_config() -> EngineConfig {
    EngineConfig {
        fabric: Fabric::Libfabric(LibfabricConfig::new("tcp", Some("127.0.0.1"))),
        pin_workers: false,
        ..EngineConfig::default()
    }
}

fn tcp_engine() -> TransferEngine {
    TransferEngine::new(tcp_config()).expect("tcp engine")
}

/// One memfd mapped shared at two addresses: the same pages twice.
struct Twice {
    maps: [NonNull<u8>; 2],
}

impl Twice {
    fn new() -> Twice {
        // SAFETY: plain syscalls on a descriptor this function owns; every
        // result is checked before use.
        unsafe {
            let fd = libc::memfd_create(c"rolex-fence-test".as_ptr(), 0);
            assert!(fd >= 0, "memfd_create");
            assert_eq!(libc::ftruncate(fd, LEN as libc::off_t), 0, "ftruncate");
            let map = || {
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    LEN,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                );
                assert_ne!(p, libc::MAP_FAILED, "mmap");
                NonNull::new(p.cast::<u8>()).expect("a mapping")
            };
            let maps = [map(), map()];
            libc::close(fd);
            Twice { maps }
        }
    }
}

impl Drop for Twice {
    fn drop(&mut self) {
        for m in self.maps {
            // SAFETY: each mapping was made by `new` with `LEN` bytes, and
            // its registrations are gone (the engines are dropped first).
            unsafe { libc::munmap(m.as_ptr().cast(), LEN) };
        }
    }
}

#[test]
fn a_closed_alias_key_drops_late_writes_at_the_target() {
    if let Err(e) = probe("tcp", Some("127.0.0.1")) {
        eprintln!("skipped: libfabric tcp not usable here: {e}");
        return;
    }
    common::bounded(|| {
        let pages = Twice::new();
        let node = tcp_engine();
        let client = tcp_engine();
        // SAFETY: both mappings stay valid until `pages` drops, after the
        // engines; nothing in this test holds references into them.
        let (pool, pool_desc) =
            unsafe { node.reg_mr(pages.maps[0], LEN as u64, Access::all()) }.expect("register");
        // SAFETY: as above.
        let again = unsafe { node.reg_mr(pages.maps[0], LEN as u64, Access::all()) };
        eprintln!(
            "found: registering the same memory a second time: {}",
            match &again {
                Ok((_, d)) => format!("granted, key {:#x}", d.nics[0].1),
                Err(e) => format!("refused: {e}"),
            }
        );
        // SAFETY: as above.
        let (alias, alias_desc) =
            unsafe { node.reg_mr(pages.maps[1], LEN as u64, Access::all()) }.expect("alias");
        assert_ne!(pool_desc.nics[0].1, alias_desc.nics[0].1, "two keys");
        let (src, _) = client.alloc_mr(64, Access::all()).expect("source");
        // Through the alias while it is open: lands in the pool's pages.
        src.fill(0xaa).unwrap();
        let (f, d) = common::flag();
        client
            .submit_single_write(16, None, (&src, 0), (&alias_desc, 0), d)
            .unwrap();
        common::wait(&f).expect("write through the open alias");
        assert_eq!(pool.to_vec(0, 16).unwrap(), vec![0xaa; 16]);
        // Closed: a late WRITE and CAS through it, then a WRITE through the
        // pool's own key on the same connection, after them.
        node.dereg_mr(&alias).expect("close the alias");
        src.fill(0xbb).unwrap();
        let (f, d) = common::flag();
        client
            .submit_single_write(16, None, (&src, 0), (&alias_desc, 64), d)
            .unwrap();
        let late = common::wait(&f);
        let (f, v) = common::vflag();
        client.submit_cas((&alias_desc, 128), 0, 7, v).unwrap();
        let late_cas = common::wait(&f);
        let (f, d) = common::flag();
        client
            .submit_single_write(16, None, (&src, 0), (&pool_desc, 256), d)
            .unwrap();
        let next = common::wait(&f);
        let zero = |off, len: usize| pool.to_vec(off, len).unwrap() == vec![0; len];
        eprintln!(
            "injected: a WRITE and a CAS through a closed alias key, then a WRITE through the open key; \
             found: the initiator saw {late:?}, {late_cas:?}, then {next:?}; the closed key's target bytes {}",
            if zero(64, 16) && zero(128, 8) { "unchanged" } else { "CHANGED" }
        );
        // The target refused them: what it received after them on that
        // connection is dropped with the connection, so nothing of theirs
        // lands later either.
        assert!(zero(64, 16), "a late WRITE through a closed key landed");
        assert!(zero(128, 8), "a late CAS through a closed key landed");
        // Another compute node (its own connection) is not affected.
        let other = tcp_engine();
        let (osrc, _) = other.alloc_mr(64, Access::all()).expect("source");
        osrc.fill(0xcc).unwrap();
        let (f, d) = common::flag();
        other
            .submit_single_write(16, None, (&osrc, 0), (&pool_desc, 512), d)
            .unwrap();
        common::wait(&f).expect("another node's write through the open key");
        assert_eq!(pool.to_vec(512, 16).unwrap(), vec![0xcc; 16]);
        eprintln!("found: another compute node writes through the open key as before");
        drop(other);
        drop((again, client, node));
    });
}

#[test]
fn an_ended_leases_key_refuses_late_rma_at_the_memory_node() {
    if let Err(e) = probe("tcp", Some("127.0.0.1")) {
        eprintln!("skipped: libfabric tcp not usable here: {e}");
        return;
    }
    common::bounded(|| {
        let path =
            std::env::temp_dir().join(format!("rolex-test-{}-fence-keys.pool", std::process::id()));
        let pairs: Vec<(u64, u64)> = (0..2000u64).map(|i| (i * 10, i)).collect();
        let node = Arc::new(
            MemoryNode::start(
                MemoryNodeConfig {
                    engine: tcp_config(),
                    pool_file: Some(path.clone()),
                    retraining_thread: false,
                    ..MemoryNodeConfig::default()
                },
                &pairs,
            )
            .expect("memory node"),
        );
        // Unlinked at once, as `rolex memnode` does with the scratch file
        // it keeps a pool in without `--pool-file`: the keys map the open
        // file, not its name.
        std::fs::remove_file(&path).expect("unlinking the pool file");
        let keys = LeaseKeys::new(node.clone()).expect("a file-backed pool");
        let srv = LeaseServer::start_with_keys(
            "127.0.0.1:0",
            LeaseConfig {
                duration: Duration::from_millis(400),
                grace: Duration::from_millis(1),
                linger: Duration::from_millis(1),
                ..LeaseConfig::new("tok")
            },
            node.lock_releaser(),
            Some(keys as Arc<dyn PoolKeys>),
        )
        .expect("lease server");
        let lease = LeaseClient::acquire(&srv.local_addr().to_string(), "tok", common::HANG)
            .expect("lease");
        let key = lease
            .fence()
            .pool()
            .cloned()
            .expect("a key of the lease's own");
        assert_ne!(key.nics[0].1, node.pool().desc.nics[0].1);
        // The store works through it (READs, CASes, WRITEs).
        let client = KvClient::connect(
            KvClientConfig {
                engine: tcp_config(),
                ..KvClientConfig::default()
            }
            .with_lease(&lease),
            &node.pool(),
        )
        .expect("connect");
        let mut s = client.session().expect("session");
        assert_eq!(s.update(100, 7).unwrap(), Some(10));
        assert_eq!(s.insert(105, 8).unwrap(), None);
        assert_eq!(
            (s.get(100).unwrap(), s.get(105).unwrap()),
            (Some(7), Some(8))
        );
        drop(s);
        // A raw initiator with the lease's key, as a compute node stalled
        // with a WRITE posted would be: the pool's last bytes (free room).
        let pool = node.pool_handle();
        let at = pool.len() - 64;
        assert_eq!(pool.to_vec(at, 32).unwrap(), vec![0; 32], "free room");
        let raw = tcp_engine();
        let (src, _) = raw.alloc_mr(64, Access::all()).expect("source");
        src.fill(0xbb).unwrap();
        let (f, d) = common::flag();
        raw.submit_single_write(16, None, (&src, 0), (&key, at), d)
            .unwrap();
        common::wait(&f).expect("a write while the lease holds");
        assert_eq!(pool.to_vec(at, 16).unwrap(), vec![0xbb; 16]);
        pool.write(at, &[0; 16]).unwrap();
        // The lease ends at the memory node (here: its holder dropped it).
        drop(lease);
        let t = std::time::Instant::now();
        while srv.expired() == 0 && t.elapsed() < common::HANG {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(srv.expired(), 1);
        src.fill(0xcc).unwrap();
        let (f, d) = common::flag();
        raw.submit_single_write(16, None, (&src, 0), (&key, at + 16), d)
            .unwrap();
        let late = common::wait(&f);
        let (f, v) = common::vflag();
        raw.submit_cas((&key, at + 32), 0, 7, v).unwrap();
        let late_cas = common::wait(&f);
        let untouched = pool.to_vec(at, 64).unwrap() == vec![0; 64];
        eprintln!(
            "injected: a WRITE and a CAS through lease {}'s key after the lease ended; \
             found: the initiator saw {late:?} and {late_cas:?}; the pool bytes {}",
            lease_id(&key),
            if untouched { "unchanged" } else { "CHANGED" }
        );
        assert!(untouched, "late RMA through an ended lease's key landed");
        // The offer's key still works for everyone else.
        let (f, v) = common::vflag();
        let other = tcp_engine();
        other
            .submit_cas((&node.pool().desc, at + 32), 0, 0, v)
            .unwrap();
        common::wait(&f).expect("the offer's key");
        drop((client, raw, other, srv));
        let _ = std::fs::remove_file(&path);
    });
}

/// A short name for a key in the output.
fn lease_id(key: &rolex_host::MrDesc) -> String {
    format!("{:#x}", key.nics[0].1)
}
