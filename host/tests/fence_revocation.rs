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
#![cfg(feature = "libfabric")]

mod common;

use std::ptr::NonNull;

use rolex_host::domain::fabric::{probe, LibfabricConfig};
use rolex_host::{Access, EngineConfig, Fabric, TransferEngine};

const LEN: usize = 4096;

fn tcp_engine() -> TransferEngine {
    TransferEngine::new(EngineConfig {
        fabric: Fabric::Libfabric(LibfabricConfig::new("tcp", Some("127.0.0.1"))),
        pin_workers: false,
        ..EngineConfig::default()
    })
    .expect("tcp engine")
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
        let zero = |off, len| pool.to_vec(off, len).unwrap() == vec![0; len as usize];
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
