//! Which devices an engine's libfabric NICs open ([`NicSelect`], design
//! §4 multi-NIC), over `tcp` (skipped where it is not usable): `tcp;ofi_rxm`
//! lists one domain per network interface (`lo`, `eth0`), so the choice is
//! real here; a made-up sysfs tree places them.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use rolex_engine::domain::fabric::{list_nics, probe, LibfabricConfig};
use rolex_engine::topology::NicChoiceError;
use rolex_engine::*;

fn usable() -> bool {
    match probe("tcp", Some("127.0.0.1")) {
        Ok(()) => true,
        Err(e) => {
            eprintln!("skipped: libfabric tcp not usable here: {e}");
            false
        }
    }
}

fn cfg(node: Option<&str>, choice: NicChoice, sysfs: &Path) -> LibfabricConfig {
    LibfabricConfig {
        nics: NicSelect {
            choice,
            sysfs: sysfs.to_path_buf(),
        },
        ..LibfabricConfig::new("tcp", node)
    }
}

fn tcp_engine(nics: usize, cfg: LibfabricConfig) -> Result<TransferEngine, TransferError> {
    TransferEngine::new(EngineConfig {
        nics_per_group: nics,
        fabric: Fabric::Libfabric(cfg),
        pin_workers: false,
        ..EngineConfig::default()
    })
}

/// A sysfs tree where `lo` sits on a PCI function on NUMA node 1 (no
/// real system places it; here it stands for a NIC).
struct FakeSysfs(PathBuf);

impl FakeSysfs {
    fn new(tag: &str) -> FakeSysfs {
        let root =
            std::env::temp_dir().join(format!("rolex-nic-choice-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let func = root.join("devices/pci0000:00/0000:00:02.0");
        std::fs::create_dir_all(&func).unwrap();
        std::fs::write(func.join("numa_node"), "1\n").unwrap();
        let gpu = root.join("devices/pci0000:00/0000:00:05.0");
        std::fs::create_dir_all(&gpu).unwrap();
        let bus = root.join("bus/pci/devices");
        std::fs::create_dir_all(&bus).unwrap();
        std::os::unix::fs::symlink(&gpu, bus.join("0000:00:05.0")).unwrap();
        let lo = root.join("class/net/lo");
        std::fs::create_dir_all(&lo).unwrap();
        std::os::unix::fs::symlink(&func, lo.join("device")).unwrap();
        FakeSysfs(root)
    }
}

impl Drop for FakeSysfs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes 4 KiB with an immediate from `a` to `b` and checks it landed.
fn carries_a_write(a: &TransferEngine, b: &TransferEngine, seed: u8) {
    let (src, _) = region(a, 4096);
    let (dst, dd) = region(b, 4096);
    src.write(0, &pattern(4096, seed)).unwrap();
    let (landed, d) = flag();
    b.expect_imm_count(9, 1, d).unwrap();
    let (written, d) = flag();
    a.submit_single_write(4096, Some(9), (&src, 0), (&dd, 0), d)
        .unwrap();
    wait(&written).unwrap();
    wait(&landed).unwrap();
    assert_eq!(dst.to_vec(0, 4096).unwrap(), pattern(4096, seed));
}

#[test]
fn the_provider_lists_its_devices_and_engines_open_the_chosen_ones() {
    if !usable() {
        return;
    }
    let sysfs = FakeSysfs::new("open");
    let root = sysfs.0.clone();
    bounded(move || {
        // On 127.0.0.1 the provider lists the loopback interface alone.
        let listed = list_nics(&cfg(Some("127.0.0.1"), NicChoice::Listed, &root)).unwrap();
        let names: Vec<&str> = listed.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["lo"]);
        let p = listed[0]
            .placement
            .as_ref()
            .expect("lo placed by the fake sysfs");
        assert_eq!(p.numa, Some(1));
        // Without a node, every interface once (several addresses each).
        let all = list_nics(&cfg(None, NicChoice::Listed, &root)).unwrap();
        let mut seen: Vec<&str> = all.iter().map(|l| l.name.as_str()).collect();
        eprintln!("tcp lists: {all:?}");
        assert!(seen.contains(&"lo"), "{seen:?}");
        seen.dedup();
        assert_eq!(seen.len(), all.len(), "a device listed twice: {seen:?}");

        // Chosen by name, by NUMA node and nearest a PCI function: every
        // NIC opens `lo`, and carries traffic.
        let gpu: PciAddr = "0000:00:05.0".parse().unwrap();
        for choice in [
            NicChoice::Named(vec!["lo".into()]),
            NicChoice::NumaNode(1),
            NicChoice::NearPci(gpu),
        ] {
            let c = cfg(Some("127.0.0.1"), choice.clone(), &root);
            let a = tcp_engine(2, c.clone()).unwrap();
            let b = tcp_engine(2, c).unwrap();
            assert_eq!(a.devices(0).unwrap(), ["lo", "lo"], "{choice}");
            carries_a_write(&a, &b, 3);
        }
    });
}

#[test]
fn a_choice_nothing_matches_names_what_is_missing() {
    if !usable() {
        return;
    }
    let sysfs = FakeSysfs::new("missing");
    let root = sysfs.0.clone();
    let err = |choice| match tcp_engine(1, cfg(Some("127.0.0.1"), choice, &root)) {
        Err(TransferError::NicChoice(e)) => e,
        Err(e) => panic!("expected a NIC choice error, got {e}"),
        Ok(_) => panic!("an engine opened on a device that is not there"),
    };
    let e = err(NicChoice::Named(vec!["mlx5_0".into()]));
    assert_eq!(
        e,
        NicChoiceError::NotListed {
            name: "mlx5_0".into(),
            listed: vec!["lo".into()]
        }
    );
    let e = err(NicChoice::NumaNode(0));
    assert!(e.to_string().contains("lo on node 1"), "{e}");
    let e = err(NicChoice::NearPci("0000:99:00.0".parse().unwrap()));
    let text = TransferError::NicChoice(e).to_string();
    assert!(
        text.contains("0000:99:00.0") && text.contains("bus/pci/devices"),
        "{text}"
    );
}
