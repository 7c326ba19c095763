//! Which NICs an engine opens (design §4, multi-NIC): the devices a
//! backend lists, placed in the machine's PCIe tree and NUMA nodes from
//! sysfs, and chosen by what the user asks for ([`NicChoice`]): every
//! device in the backend's order, named devices, the devices nearest a GPU
//! (by PCI bus id), or those on one NUMA node.
//!
//! Everything here is a pure function of a sysfs root ([`NicSelect::sysfs`],
//! `/sys` unless a test gives a made-up tree) and the backend's list of
//! names, so every rule is tested without a device. A backend lists its
//! devices (libfabric: the distinct domains of `fi_getinfo`'s entries;
//! verbs: `ibv_get_device_list`), asks [`choose`] for the order to use
//! them in, and opens domain `i` on chosen device `i mod k` ([`assign`]):
//! an engine asking for more NICs than were chosen opens some devices
//! twice (two endpoints on one device), as it did before there was a
//! choice. Invariant: [`choose`] returns at least one device or an error
//! naming what is missing.
//!
//! Placement of a device: its sysfs device directory (`class/infiniband/
//! NAME/device`, or `class/net/NAME/device` for an Ethernet interface;
//! an EFA libfabric domain `NAME-rdm` or `NAME-dgrm` is the verbs device
//! `NAME`) resolved to its path under `devices/`, whose components name the
//! host bridge (`pci0000:00`) and every PCI function from the root port
//! down to the device; and its `numa_node` (`-1`: none). Two devices are
//! the nearer the deeper their paths agree ([`Proximity`]), the way NCCL
//! ranks them (same switch, same host bridge, same NUMA node, across the
//! system).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The sysfs root of a running system.
pub const SYSFS: &str = "/sys";

/// A PCI function's address, `domain:bus:device.function`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PciAddr {
    /// PCI domain (segment).
    pub domain: u32,
    /// Bus.
    pub bus: u8,
    /// Device (0 to 31).
    pub device: u8,
    /// Function (0 to 7).
    pub function: u8,
}

/// Why a PCI address did not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadPciAddr(pub String);

impl fmt::Display for BadPciAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a PCI bus id (domain:bus:device.function, e.g. 0000:53:00.0)",
            self.0
        )
    }
}

impl std::error::Error for BadPciAddr {}

impl FromStr for PciAddr {
    type Err = BadPciAddr;

    /// `0000:53:00.0` (sysfs, lspci -D), `00000000:53:00.0` (nvidia-smi)
    /// or `53:00.0` (domain 0), any case.
    fn from_str(s: &str) -> Result<Self, BadPciAddr> {
        let bad = || BadPciAddr(s.to_string());
        let hex = |t: &str, max_digits: usize| {
            if t.is_empty() || t.len() > max_digits {
                return None;
            }
            u32::from_str_radix(t, 16).ok()
        };
        let (rest, function) = s.rsplit_once('.').ok_or_else(bad)?;
        let mut parts: Vec<&str> = rest.split(':').collect();
        let device = parts.pop().and_then(|t| hex(t, 2)).ok_or_else(bad)?;
        let bus = parts.pop().and_then(|t| hex(t, 2)).ok_or_else(bad)?;
        let domain = match parts.as_slice() {
            [] => 0,
            [d] => hex(d, 8).ok_or_else(bad)?,
            _ => return Err(bad()),
        };
        let function = hex(function, 1).ok_or_else(bad)?;
        if device > 31 || function > 7 {
            return Err(bad());
        }
        Ok(PciAddr {
            domain,
            bus: bus as u8,
            device: device as u8,
            function: function as u8,
        })
    }
}

impl fmt::Display for PciAddr {
    /// As sysfs names it: `0000:53:00.0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// One step of a device's path in the PCIe tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PciNode {
    /// A host bridge (root complex), `pciDDDD:BB` in sysfs.
    HostBridge {
        /// Its PCI domain.
        domain: u32,
        /// Its root bus.
        bus: u8,
    },
    /// A PCI function: a root port, a switch port, or the device itself.
    Function(PciAddr),
}

impl PciNode {
    fn parse(component: &str) -> Option<PciNode> {
        if let Some(hb) = component.strip_prefix("pci") {
            let (d, b) = hb.split_once(':')?;
            return Some(PciNode::HostBridge {
                domain: u32::from_str_radix(d, 16).ok()?,
                bus: u8::from_str_radix(b, 16).ok()?,
            });
        }
        // Only full sysfs names (with the domain) are path components.
        if component.len() < 12 {
            return None;
        }
        component.parse().ok().map(PciNode::Function)
    }
}

/// Where a device sits: its path from the host bridge down to its own PCI
/// function, and its NUMA node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// Host bridge first, the device's own function last.
    pub path: Vec<PciNode>,
    /// The NUMA node, where the system says.
    pub numa: Option<u32>,
}

impl Placement {
    /// The device's own PCI address (the last function of its path).
    pub fn pci(&self) -> Option<PciAddr> {
        self.path.iter().rev().find_map(|n| match n {
            PciNode::Function(a) => Some(*a),
            PciNode::HostBridge { .. } => None,
        })
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.pci() {
            Some(a) => write!(f, "PCI {a}")?,
            None => f.write_str("no PCI address")?,
        }
        match self.numa {
            Some(n) => write!(f, ", NUMA node {n}"),
            None => f.write_str(", no NUMA node"),
        }
    }
}

/// The placement of the device whose sysfs directory is `dev` (a symlink
/// into `devices/`); `None` if it is not under a PCI host bridge.
pub fn placement_of(dev: &Path) -> Option<Placement> {
    let real = std::fs::canonicalize(dev).ok()?;
    let mut path = Vec::new();
    // The directory of the last PCI function: `numa_node` lives there (a
    // virtio network device's own directory has none).
    let mut func_dir = None;
    let mut at = PathBuf::new();
    for c in real.components() {
        at.push(c);
        let Some(node) = c.as_os_str().to_str().and_then(PciNode::parse) else {
            continue;
        };
        if let PciNode::Function(_) = node {
            func_dir = Some(at.clone());
        }
        path.push(node);
    }
    if !matches!(path.first(), Some(PciNode::HostBridge { .. })) {
        return None;
    }
    let numa = func_dir.and_then(|d| {
        let text = std::fs::read_to_string(d.join("numa_node")).ok()?;
        u32::try_from(text.trim().parse::<i64>().ok()?).ok()
    });
    Some(Placement { path, numa })
}

/// The sysfs directories that may describe the NIC a backend calls
/// `name`, most specific first.
fn nic_dirs(sysfs: &Path, name: &str) -> Vec<PathBuf> {
    let ib = sysfs.join("class/infiniband");
    let mut v = vec![ib.join(name).join("device")];
    // EFA's libfabric domains are the verbs device plus the endpoint type.
    for suffix in ["-rdm", "-dgrm"] {
        if let Some(dev) = name.strip_suffix(suffix) {
            v.push(ib.join(dev).join("device"));
        }
    }
    v.push(sysfs.join("class/net").join(name).join("device"));
    v
}

/// The placement of the NIC a backend calls `name` (an RDMA device, an
/// EFA domain, a network interface); `None` where sysfs does not place it
/// (the loopback interface, a device in a container without sysfs).
pub fn nic_placement(sysfs: &Path, name: &str) -> Option<Placement> {
    nic_dirs(sysfs, name).iter().find_map(|d| placement_of(d))
}

/// The placement of the PCI function `gpu` (any device: a GPU, usually).
pub fn pci_placement(sysfs: &Path, gpu: PciAddr) -> Result<Placement, NicChoiceError> {
    let dir = sysfs.join("bus/pci/devices").join(gpu.to_string());
    placement_of(&dir).ok_or(NicChoiceError::GpuNotFound { gpu, looked: dir })
}

/// How near a NIC is to a device, nearest first (the order sorts so).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proximity {
    /// Below one PCIe switch or root port: `hops` links up and down from
    /// the nearest common port.
    Switch {
        /// Links between the two through their nearest common port.
        hops: usize,
    },
    /// Under the same host bridge, through the root complex.
    HostBridge,
    /// Under different host bridges of one NUMA node.
    NumaNode,
    /// Across NUMA nodes (sockets), or unknown nodes.
    System,
}

/// How near a device placed at `nic` is to one placed at `to`.
pub fn proximity(nic: &Placement, to: &Placement) -> Proximity {
    let common = nic
        .path
        .iter()
        .zip(&to.path)
        .take_while(|(a, b)| a == b)
        .count();
    if common >= 2 {
        Proximity::Switch {
            hops: nic.path.len() + to.path.len() - 2 * common,
        }
    } else if common == 1 {
        Proximity::HostBridge
    } else if nic.numa.is_some() && nic.numa == to.numa {
        Proximity::NumaNode
    } else {
        Proximity::System
    }
}

/// The name of the loopback network interface, which a provider on
/// sockets (`tcp`) lists beside the real ones.
pub const LOOPBACK_INTERFACE: &str = "lo";

/// Which devices to use, in which order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NicChoice {
    /// Every device, in the order the backend lists them (the default);
    /// the loopback interface [`LOOPBACK_INTERFACE`] only if nothing else
    /// is listed.
    #[default]
    Listed,
    /// These devices, in this order (`mlx5_0`, `rdmap16s27-rdm`, `eth0`).
    Named(Vec<String>),
    /// The devices nearest the PCI function (a GPU's bus id, as
    /// `nvidia-smi` prints it), nearest first; devices sysfs does not
    /// place are left out. "The 4 NICs nearest GPU 0000:53:00.0" is this
    /// with 4 NICs per group.
    NearPci(PciAddr),
    /// The devices on this NUMA node, in the backend's order ("all NICs
    /// on NUMA node 1").
    NumaNode(u32),
}

impl fmt::Display for NicChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NicChoice::Listed => f.write_str("every listed device"),
            NicChoice::Named(v) => write!(f, "devices {}", v.join(", ")),
            NicChoice::NearPci(a) => write!(f, "the devices nearest PCI {a}"),
            NicChoice::NumaNode(n) => write!(f, "the devices on NUMA node {n}"),
        }
    }
}

impl FromStr for NicChoice {
    type Err = String;

    /// As a command line gives it: `listed`, `near:0000:53:00.0` (a PCI
    /// bus id), `numa:1`, or device names separated by commas
    /// (`mlx5_0,mlx5_1`; `names:lo` for a name that reads as a keyword).
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s == "listed" {
            return Ok(NicChoice::Listed);
        }
        if let Some(bdf) = s.strip_prefix("near:") {
            return bdf
                .parse()
                .map(NicChoice::NearPci)
                .map_err(|e: BadPciAddr| e.to_string());
        }
        if let Some(n) = s.strip_prefix("numa:") {
            return n
                .trim()
                .parse()
                .map(NicChoice::NumaNode)
                .map_err(|_| format!("NUMA node {n:?} is not a number"));
        }
        let names: Vec<String> = s
            .strip_prefix("names:")
            .unwrap_or(s)
            .split(',')
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        if names.is_empty() {
            return Err(format!(
                "{s:?} chooses no NIC: give `listed`, `near:PCI-BUS-ID`, `numa:NODE` or device names"
            ));
        }
        Ok(NicChoice::Named(names))
    }
}

/// A [`NicChoice`] and the sysfs tree it reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NicSelect {
    /// What to choose.
    pub choice: NicChoice,
    /// The sysfs root ([`SYSFS`]; a made-up tree in tests).
    pub sysfs: PathBuf,
}

impl Default for NicSelect {
    fn default() -> Self {
        NicSelect {
            choice: NicChoice::Listed,
            sysfs: PathBuf::from(SYSFS),
        }
    }
}

impl NicSelect {
    /// `choice` on the running system's sysfs.
    pub fn new(choice: NicChoice) -> Self {
        NicSelect {
            choice,
            ..NicSelect::default()
        }
    }
}

/// A device a backend lists, with where sysfs places it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedNic {
    /// The backend's name for it (verbs device, libfabric domain).
    pub name: String,
    /// Its placement, where sysfs gives one.
    pub placement: Option<Placement>,
}

impl fmt::Display for ListedNic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.placement {
            Some(p) => write!(f, "{} ({p})", self.name),
            None => write!(f, "{} (not placed by sysfs)", self.name),
        }
    }
}

/// Places every name a backend lists.
pub fn enumerate(sysfs: &Path, names: &[String]) -> Vec<ListedNic> {
    names
        .iter()
        .map(|n| ListedNic {
            name: n.clone(),
            placement: nic_placement(sysfs, n),
        })
        .collect()
}

/// Places every device a backend lists where the backend knows some
/// PCI addresses itself (libfabric's `fi_info` NIC attributes): by that
/// address where sysfs has it, else by name ([`nic_placement`]).
pub fn enumerate_at(sysfs: &Path, listed: &[(String, Option<PciAddr>)]) -> Vec<ListedNic> {
    listed
        .iter()
        .map(|(name, pci)| ListedNic {
            name: name.clone(),
            placement: pci
                .and_then(|a| pci_placement(sysfs, a).ok())
                .or_else(|| nic_placement(sysfs, name)),
        })
        .collect()
}

/// Why no device could be chosen.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NicChoiceError {
    /// The backend lists no device at all.
    NoDevices {
        /// The backend (`verbs`, `libfabric tcp;ofi_rxm`).
        backend: String,
    },
    /// A named device is not among those listed.
    NotListed {
        /// The name asked for.
        name: String,
        /// What the backend lists.
        listed: Vec<String>,
    },
    /// [`NicChoice::Named`] with no name.
    NoNames,
    /// The PCI function to be near is not in sysfs.
    GpuNotFound {
        /// The function.
        gpu: PciAddr,
        /// Where it was looked for.
        looked: PathBuf,
    },
    /// No listed device is placed in the PCIe tree, so none can be near.
    NonePlaced {
        /// The function to be near.
        gpu: PciAddr,
        /// The devices listed, none placed.
        listed: Vec<String>,
    },
    /// No listed device is on the NUMA node.
    NoneOnNode {
        /// The node asked for.
        node: u32,
        /// Every listed device with its node.
        seen: Vec<(String, Option<u32>)>,
    },
}

impl fmt::Display for NicChoiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NicChoiceError::NoDevices { backend } => write!(f, "{backend} lists no device"),
            NicChoiceError::NotListed { name, listed } => write!(
                f,
                "device {name} is not listed (listed: {})",
                if listed.is_empty() {
                    "none".to_string()
                } else {
                    listed.join(", ")
                }
            ),
            NicChoiceError::NoNames => f.write_str("an empty list of device names"),
            NicChoiceError::GpuNotFound { gpu, looked } => {
                write!(
                    f,
                    "PCI device {gpu} not found ({} is missing)",
                    looked.display()
                )
            }
            NicChoiceError::NonePlaced { gpu, listed } => write!(
                f,
                "no device is placed in the PCIe tree to choose the nearest to {gpu} \
                 (listed: {}; none has a device link under class/infiniband or class/net)",
                listed.join(", ")
            ),
            NicChoiceError::NoneOnNode { node, seen } => {
                write!(f, "no device on NUMA node {node} (")?;
                for (i, (name, n)) in seen.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    match n {
                        Some(n) => write!(f, "{sep}{name} on node {n}")?,
                        None => write!(f, "{sep}{name} on no node")?,
                    }
                }
                f.write_str(")")
            }
        }
    }
}

impl std::error::Error for NicChoiceError {}

/// The devices of `listed` to use, as indices into it, in the order
/// domains take them (see [`assign`]), each placed by its name in sysfs.
/// `backend` names the lister in errors.
pub fn choose(
    select: &NicSelect,
    backend: &str,
    listed: &[String],
) -> Result<Vec<usize>, NicChoiceError> {
    choose_among(select, backend, || enumerate(&select.sysfs, listed), listed)
}

/// [`choose`] over devices the backend placed itself ([`enumerate_at`]).
pub fn choose_placed(
    select: &NicSelect,
    backend: &str,
    placed: &[ListedNic],
) -> Result<Vec<usize>, NicChoiceError> {
    let names: Vec<String> = placed.iter().map(|l| l.name.clone()).collect();
    choose_among(select, backend, || placed.to_vec(), &names)
}

/// [`choose`], placing the devices (reading sysfs) only for a choice by
/// topology.
fn choose_among(
    select: &NicSelect,
    backend: &str,
    place: impl FnOnce() -> Vec<ListedNic>,
    listed: &[String],
) -> Result<Vec<usize>, NicChoiceError> {
    if listed.is_empty() {
        return Err(NicChoiceError::NoDevices {
            backend: backend.to_string(),
        });
    }
    match &select.choice {
        NicChoice::Listed => {
            // The loopback interface reaches no other host: only where
            // nothing else is listed (a provider on 127.0.0.1).
            let reach: Vec<usize> = (0..listed.len())
                .filter(|&i| listed[i] != LOOPBACK_INTERFACE)
                .collect();
            Ok(if reach.is_empty() {
                (0..listed.len()).collect()
            } else {
                reach
            })
        }
        NicChoice::Named(names) => {
            if names.is_empty() {
                return Err(NicChoiceError::NoNames);
            }
            names
                .iter()
                .map(|n| {
                    listed
                        .iter()
                        .position(|l| l == n)
                        .ok_or_else(|| NicChoiceError::NotListed {
                            name: n.clone(),
                            listed: listed.to_vec(),
                        })
                })
                .collect()
        }
        NicChoice::NearPci(gpu) => {
            let to = pci_placement(&select.sysfs, *gpu)?;
            let placed = place();
            let mut near: Vec<(Proximity, usize)> = placed
                .iter()
                .enumerate()
                .filter_map(|(i, l)| l.placement.as_ref().map(|p| (proximity(p, &to), i)))
                .collect();
            if near.is_empty() {
                return Err(NicChoiceError::NonePlaced {
                    gpu: *gpu,
                    listed: listed.to_vec(),
                });
            }
            near.sort();
            Ok(near.into_iter().map(|(_, i)| i).collect())
        }
        NicChoice::NumaNode(node) => {
            let placed = place();
            let on: Vec<usize> = placed
                .iter()
                .enumerate()
                .filter(|(_, l)| l.placement.as_ref().and_then(|p| p.numa) == Some(*node))
                .map(|(i, _)| i)
                .collect();
            if on.is_empty() {
                return Err(NicChoiceError::NoneOnNode {
                    node: *node,
                    seen: placed
                        .into_iter()
                        .map(|l| (l.name, l.placement.and_then(|p| p.numa)))
                        .collect(),
                });
            }
            Ok(on)
        }
    }
}

/// The chosen device each of `nics` domains opens: domain `i` takes
/// `chosen[i mod k]` (empty if nothing was chosen).
pub fn assign(chosen: &[usize], nics: usize) -> Vec<usize> {
    if chosen.is_empty() {
        return Vec::new();
    }
    (0..nics).map(|i| chosen[i % chosen.len()]).collect()
}

/// The names of a backend's listing, each once, in first-listed order
/// (libfabric lists a domain once per address family and endpoint type).
pub fn distinct(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for n in names {
        if !v.contains(&n) {
            v.push(n);
        }
    }
    v
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A made-up sysfs tree in a fresh temporary directory, removed on
    /// drop.
    pub(crate) struct FakeSysfs {
        pub(crate) root: PathBuf,
    }

    impl FakeSysfs {
        pub(crate) fn new(tag: &str) -> FakeSysfs {
            use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
            static N: AtomicU64 = AtomicU64::new(0);
            let root = std::env::temp_dir().join(format!(
                "rolex-sysfs-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(&root).unwrap();
            FakeSysfs { root }
        }

        /// A PCI function at `path` (below `devices/`, e.g.
        /// `pci0000:00/0000:00:01.0/0000:01:00.0`) on `numa` (-1: none),
        /// linked from `bus/pci/devices`.
        pub(crate) fn function(&self, path: &str, numa: i32) -> PathBuf {
            let dir = self.root.join("devices").join(path);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("numa_node"), format!("{numa}\n")).unwrap();
            let name = path.rsplit('/').next().unwrap();
            let bus = self.root.join("bus/pci/devices");
            std::fs::create_dir_all(&bus).unwrap();
            let _ = std::os::unix::fs::symlink(&dir, bus.join(name));
            dir
        }

        /// An RDMA device `name` whose `device` link points at `path`.
        pub(crate) fn rdma(&self, name: &str, path: &str, numa: i32) {
            let dir = self.function(path, numa);
            let cls = self.root.join("class/infiniband").join(name);
            std::fs::create_dir_all(&cls).unwrap();
            std::os::unix::fs::symlink(dir, cls.join("device")).unwrap();
        }

        /// A network interface `name` whose `device` link points at `dir`
        /// (below `devices/`), if any.
        pub(crate) fn net(&self, name: &str, dir: Option<&str>) {
            let cls = self.root.join("class/net").join(name);
            std::fs::create_dir_all(&cls).unwrap();
            if let Some(d) = dir {
                let d = self.root.join("devices").join(d);
                std::fs::create_dir_all(&d).unwrap();
                std::os::unix::fs::symlink(d, cls.join("device")).unwrap();
            }
        }

        pub(crate) fn select(&self, choice: NicChoice) -> NicSelect {
            NicSelect {
                choice,
                sysfs: self.root.clone(),
            }
        }
    }

    impl Drop for FakeSysfs {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    fn pci(s: &str) -> PciAddr {
        s.parse().unwrap()
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// A DGX-like node: two sockets; on socket 0 a switch holding GPU
    /// 0000:53:00.0 with mlx5_0 and mlx5_1, another root port of the same
    /// host bridge with mlx5_2; a second host bridge of node 0 with
    /// mlx5_3; socket 1 with mlx5_4 and mlx5_5.
    pub(crate) fn dgx() -> FakeSysfs {
        let s = FakeSysfs::new("dgx");
        let sw = "pci0000:50/0000:50:01.0/0000:51:00.0";
        s.function(&format!("{sw}/0000:52:00.0/0000:53:00.0"), 0);
        s.rdma("mlx5_0", &format!("{sw}/0000:52:04.0/0000:54:00.0"), 0);
        s.rdma("mlx5_1", &format!("{sw}/0000:52:08.0/0000:55:00.0"), 0);
        s.rdma("mlx5_2", "pci0000:50/0000:50:03.0/0000:57:00.0", 0);
        s.rdma("mlx5_3", "pci0000:60/0000:60:01.0/0000:61:00.0", 0);
        s.rdma("mlx5_4", "pci0000:a0/0000:a0:01.0/0000:a1:00.0", 1);
        s.rdma("mlx5_5", "pci0000:b0/0000:b0:01.0/0000:b1:00.0", 1);
        s
    }

    #[test]
    fn pci_addresses_parse_as_tools_print_them() {
        let a = PciAddr {
            domain: 0,
            bus: 0x53,
            device: 0,
            function: 0,
        };
        assert_eq!(pci("0000:53:00.0"), a);
        assert_eq!(pci("00000000:53:00.0"), a);
        assert_eq!(pci("53:00.0"), a);
        assert_eq!(pci("0000:A1:1f.7").bus, 0xa1);
        assert_eq!(pci("0000:a1:1f.7").to_string(), "0000:a1:1f.7");
        for bad in [
            "",
            "53:00",
            "0000:53:20.0",
            "0000:53:00.8",
            "x:53:00.0",
            "1:2:3:00.0",
        ] {
            assert!(bad.parse::<PciAddr>().is_err(), "{bad}");
        }
        assert!(BadPciAddr("zz".into()).to_string().contains("0000:53:00.0"));
    }

    #[test]
    fn placement_reads_the_path_and_the_numa_node() {
        let s = dgx();
        let p = nic_placement(&s.root, "mlx5_0").unwrap();
        assert_eq!(p.numa, Some(0));
        assert_eq!(p.pci(), Some(pci("0000:54:00.0")));
        assert_eq!(p.path.len(), 5);
        assert_eq!(
            p.path[0],
            PciNode::HostBridge {
                domain: 0,
                bus: 0x50
            }
        );
        assert_eq!(p.to_string(), "PCI 0000:54:00.0, NUMA node 0");
        // EFA's libfabric domain names, and an interface on a virtio
        // device (its directory has no numa_node: the function's counts).
        s.rdma("rdmap16s27", "pci0000:10/0000:10:1b.0", -1);
        assert_eq!(
            nic_placement(&s.root, "rdmap16s27-rdm").unwrap().pci(),
            Some(pci("0000:10:1b.0"))
        );
        assert_eq!(nic_placement(&s.root, "rdmap16s27-rdm").unwrap().numa, None);
        s.function("pci0000:00/0000:00:03.0", 0);
        s.net("eth0", Some("pci0000:00/0000:00:03.0/virtio2"));
        let eth = nic_placement(&s.root, "eth0").unwrap();
        assert_eq!((eth.pci(), eth.numa), (Some(pci("0000:00:03.0")), Some(0)));
        // The loopback interface has no device; unknown names none.
        s.net("lo", None);
        assert_eq!(nic_placement(&s.root, "lo"), None);
        assert_eq!(nic_placement(&s.root, "mlx5_9"), None);
    }

    #[test]
    fn proximity_ranks_switch_then_host_bridge_then_node_then_system() {
        let s = dgx();
        let gpu = pci_placement(&s.root, pci("0000:53:00.0")).unwrap();
        let near = |n| proximity(&nic_placement(&s.root, n).unwrap(), &gpu);
        assert_eq!(near("mlx5_0"), Proximity::Switch { hops: 4 });
        assert_eq!(near("mlx5_2"), Proximity::HostBridge);
        assert_eq!(near("mlx5_3"), Proximity::NumaNode);
        assert_eq!(near("mlx5_4"), Proximity::System);
        assert!(Proximity::Switch { hops: 9 } < Proximity::HostBridge);
        // Unknown nodes are never "the same node".
        let a = Placement {
            path: vec![PciNode::HostBridge { domain: 0, bus: 1 }],
            numa: None,
        };
        let b = Placement {
            path: vec![PciNode::HostBridge { domain: 0, bus: 2 }],
            numa: None,
        };
        assert_eq!(proximity(&a, &b), Proximity::System);
    }

    #[test]
    fn nearest_to_a_gpu_first_then_by_listing_order() {
        let s = dgx();
        let listed = names(&[
            "mlx5_5", "mlx5_4", "mlx5_3", "mlx5_2", "mlx5_1", "mlx5_0", "lo",
        ]);
        let sel = s.select(NicChoice::NearPci(pci("0000:53:00.0")));
        let order = choose(&sel, "verbs", &listed).unwrap();
        let got: Vec<&str> = order.iter().map(|&i| listed[i].as_str()).collect();
        // Both on the GPU's switch (listing order among equals), the other
        // root port, the other host bridge of node 0, then socket 1; `lo`
        // (not placed) left out.
        assert_eq!(
            got,
            ["mlx5_1", "mlx5_0", "mlx5_2", "mlx5_3", "mlx5_5", "mlx5_4"]
        );
        // "The 2 NICs nearest the GPU": the first two domains.
        assert_eq!(assign(&order, 2), [4, 5]);
        // A GPU sysfs does not know, and devices sysfs does not place.
        let missing = s.select(NicChoice::NearPci(pci("0000:99:00.0")));
        let e = choose(&missing, "verbs", &listed).unwrap_err();
        assert!(matches!(e, NicChoiceError::GpuNotFound { .. }), "{e}");
        assert!(e.to_string().contains("0000:99:00.0"), "{e}");
        let e = choose(&sel, "libfabric tcp", &names(&["lo"])).unwrap_err();
        assert!(matches!(e, NicChoiceError::NonePlaced { .. }));
        assert!(e.to_string().contains("lo"), "{e}");
    }

    #[test]
    fn numa_node_keeps_listing_order_and_names_every_node_when_empty() {
        let s = dgx();
        let listed = names(&["mlx5_0", "mlx5_4", "mlx5_1", "mlx5_5"]);
        let order = choose(&s.select(NicChoice::NumaNode(1)), "verbs", &listed).unwrap();
        assert_eq!(order, [1, 3]);
        let e = choose(&s.select(NicChoice::NumaNode(2)), "verbs", &listed).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no device on NUMA node 2 (mlx5_0 on node 0, mlx5_4 on node 1, \
             mlx5_1 on node 0, mlx5_5 on node 1)"
        );
    }

    #[test]
    fn named_listed_and_their_errors() {
        let s = FakeSysfs::new("named");
        let listed = names(&["efa0", "efa1", "efa2"]);
        assert_eq!(
            choose(&s.select(NicChoice::Listed), "libfabric efa", &listed).unwrap(),
            [0, 1, 2]
        );
        let named = s.select(NicChoice::Named(names(&["efa2", "efa0"])));
        assert_eq!(choose(&named, "libfabric efa", &listed).unwrap(), [2, 0]);
        // `lo` only when it is all there is; by name always.
        let tcp = names(&["eth0", "lo", "eth1"]);
        assert_eq!(
            choose(&s.select(NicChoice::Listed), "tcp", &tcp).unwrap(),
            [0, 2]
        );
        assert_eq!(
            choose(&s.select(NicChoice::Listed), "tcp", &tcp[1..2]).unwrap(),
            [0]
        );
        let lo = s.select(NicChoice::Named(names(&["lo"])));
        assert_eq!(choose(&lo, "tcp", &tcp).unwrap(), [1]);
        let e = choose(&s.select(NicChoice::Named(names(&["efa7"]))), "x", &listed).unwrap_err();
        assert_eq!(
            e.to_string(),
            "device efa7 is not listed (listed: efa0, efa1, efa2)"
        );
        assert_eq!(
            choose(&s.select(NicChoice::Named(vec![])), "x", &listed),
            Err(NicChoiceError::NoNames)
        );
        assert_eq!(
            choose(&s.select(NicChoice::Listed), "verbs", &[])
                .unwrap_err()
                .to_string(),
            "verbs lists no device"
        );
    }

    #[test]
    fn choices_parse_from_the_command_line() {
        let p = |s: &str| s.parse::<NicChoice>();
        assert_eq!(p("listed"), Ok(NicChoice::Listed));
        assert_eq!(
            p("near:00000000:53:00.0"),
            Ok(NicChoice::NearPci(pci("0000:53:00.0")))
        );
        assert_eq!(p("numa:1"), Ok(NicChoice::NumaNode(1)));
        assert_eq!(
            p("mlx5_0, mlx5_1"),
            Ok(NicChoice::Named(names(&["mlx5_0", "mlx5_1"])))
        );
        assert_eq!(p("names:listed"), Ok(NicChoice::Named(names(&["listed"]))));
        assert!(p("near:53").unwrap_err().contains("PCI bus id"));
        assert!(p("numa:x").is_err());
        assert!(p(" , ").unwrap_err().contains("chooses no NIC"));
        // Printed as errors and logs name them.
        assert_eq!(
            NicChoice::NumaNode(1).to_string(),
            "the devices on NUMA node 1"
        );
    }

    #[test]
    fn a_bus_address_from_the_backend_places_a_device_sysfs_cannot_name() {
        let s = dgx();
        // An EFA-like domain whose name sysfs does not know, with its bus
        // address from the provider; one with a wrong address falls back
        // to its name; one with neither stays unplaced.
        let listed = vec![
            ("efa-x".to_string(), Some(pci("0000:55:00.0"))),
            ("mlx5_4".to_string(), Some(pci("0000:ee:00.0"))),
            ("nowhere".to_string(), None),
        ];
        let placed = enumerate_at(&s.root, &listed);
        assert_eq!(
            placed[0].placement.as_ref().unwrap().pci(),
            Some(pci("0000:55:00.0"))
        );
        assert_eq!(placed[1].placement.as_ref().unwrap().numa, Some(1));
        assert_eq!(placed[2].placement, None);
        let near = s.select(NicChoice::NearPci(pci("0000:53:00.0")));
        assert_eq!(
            choose_placed(&near, "libfabric efa", &placed).unwrap(),
            [0, 1]
        );
        let named = s.select(NicChoice::Named(names(&["nowhere"])));
        assert_eq!(
            choose_placed(&named, "libfabric efa", &placed).unwrap(),
            [2]
        );
    }

    #[test]
    fn domains_cycle_over_the_chosen_devices() {
        assert_eq!(assign(&[2, 0], 5), [2, 0, 2, 0, 2]);
        assert_eq!(assign(&[0, 1, 2, 3], 2), [0, 1]);
        assert!(assign(&[], 3).is_empty());
        assert_eq!(
            distinct(names(&["eth0", "eth0", "lo", "eth0", "lo"])),
            ["eth0", "lo"]
        );
    }
}
