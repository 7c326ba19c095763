//! The verbs domain (design §3, §7): ConnectX NICs over RC through
//! libibverbs, the other platform of the transfer engine beside libfabric.
//!
//! Shape, after the source's ConnectX-7 implementation:
//! - each domain owns a UD queue pair on which peers exchange connection
//!   [`handshake`]s (queue-pair numbers, initial PSNs, LID/GID, qkey);
//! - each peer gets two RC queue pairs: one for send/recv and one for
//!   write, write-with-immediate, read and atomics, because receives and
//!   write-with-immediate both consume posted receives in posting order;
//!   immediates land in a shared receive queue of zero-length receives;
//! - requests are built from per-peer [`wr::WrTemplates`] and up to four are
//!   chained behind one doorbell ([`wr::Chain`]), small writes and sends go
//!   inline, only the last request of a chain is signalled;
//! - registrations ask for `IBV_ACCESS_RELAXED_ORDERING`
//!   ([`bringup::AccessFlags::REGISTRATION`]);
//! - RC retry and timeouts are configurable ([`bringup::RcTiming`]),
//!   initial PSNs are random and each engine draws a random qkey.
//!
//! Everything that needs no device — request building and chaining, the
//! handshake encoding, the address layout ([`addr`]), the queue-pair
//! bring-up sequence (driven through [`bringup::QpDevice`]), the peer table
//! and handshake exchange ([`connect`]), turning one completion per chain
//! back into one outcome per request ([`completions`], [`demux`]) — lives
//! in safe modules tested here, and names a failed call with
//! [`VerbsError`] ([`error`]), the device's capabilities and what is
//! chosen from them ([`caps`]: atomics' byte order and scope, clamped
//! read/atomic limits agreed in the handshake). The calls into libibverbs live in `ffi`, the
//! one module with `unsafe` besides the `Send` of the request chain and
//! templates (`wr`); only the modules that drive a device import it:
//! [`Nic`] (opening one) and the [`VerbsDomain`], which with its
//! [`VerbsEndpoint`] ties the safe modules to the device.

pub mod addr;
pub mod bringup;
pub mod caps;
pub mod completions;
pub mod connect;
pub mod demux;
pub mod dereg;
mod domain;
mod endpoint;
pub mod error;
pub mod ffi;
pub mod gid;
pub mod handshake;
mod nic;
pub mod srq;
pub mod wr;

use std::path::Path;
use std::time::Duration;

use bringup::RcTiming;

use crate::error::TransferError;
use crate::topology::{self, ListedNic, NicChoice, NicSelect};

pub use domain::{open_host, VerbsDomain};
pub use endpoint::VerbsEndpoint;
pub use error::VerbsError;
pub use nic::Nic;

/// UD receives kept posted for handshakes.
pub const UD_RECVS: usize = 32;
/// UD send slots for handshakes (a send waits for a free one).
pub const UD_SENDS: usize = 32;
/// Bytes of one UD slot: the 40-byte GRH a UD receive starts with, then
/// the handshake.
pub const UD_SLOT: usize = 128;
/// The global routing header at the front of every UD receive.
pub const GRH_LEN: usize = 40;

const _: () = assert!(GRH_LEN + handshake::ENCODED_LEN <= UD_SLOT);

/// Where the kernel lists RDMA devices.
pub const SYSFS_DEVICES: &str = "/sys/class/infiniband";

/// Options of the verbs domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerbsConfig {
    /// Device name (`mlx5_0`, `rxe0`); `None` takes the first one listed.
    /// An engine's NICs all open this device when it is given and
    /// [`VerbsConfig::nics`] is left at its default.
    pub device: Option<String>,
    /// Which devices an engine's NICs open, in turn
    /// ([`crate::topology`]: every device `ibv_get_device_list` lists, by
    /// default; named ones; the nearest to a GPU; those on a NUMA node).
    pub nics: NicSelect,
    /// Port number (1-based).
    pub port: u8,
    /// GID index (RoCE v2 is usually 1 or 3; 0 on InfiniBand). With
    /// [`VerbsConfig::auto_gid`] an index of 0 means "choose".
    pub gid_index: u8,
    /// Choose the GID from the port's table ([`gid::choose`]: RoCE v2 with
    /// an IPv4 address first) when `gid_index` is 0; on InfiniBand nothing
    /// is chosen and 0 stays. Off: `gid_index` as given.
    pub auto_gid: bool,
    /// Most peers connected or connecting at once; handshake requests
    /// from new peers beyond it are dropped, so a flood of requests cannot
    /// make the domain create queue pairs without bound.
    pub max_peers: usize,
    /// RC retry and timeouts.
    pub timing: RcTiming,
    /// Writes and sends of at most this many bytes go inline.
    pub max_inline: u32,
    /// Send-queue depth of each RC queue pair.
    pub send_depth: u32,
    /// Zero-length receives kept posted on the shared receive queue
    /// (clamped to the device's `max_srq_wr`), refilled below three
    /// quarters ([`srq::SrqStock`]): a burst of immediates this deep lands
    /// without receiver-not-ready NAKs.
    pub srq_depth: u32,
    /// Signalled chains in flight per domain (one completion-queue entry
    /// each); the completion queue is sized for every request of these
    /// (error flushes), the receives and the UD slots ([`cq_entries`]).
    pub cq_depth: u32,
    /// How long a connection handshake may take before the peer counts as
    /// unreachable.
    pub handshake_timeout: Duration,
    /// Interval between resends of an unanswered handshake request.
    pub handshake_retry: Duration,
    /// How long a posted operation may wait for its completion (or for its
    /// connection) before it fails with
    /// [`TransferError::Timeout`](crate::error::TransferError::Timeout); RC
    /// reports dead peers itself (see [`RcTiming`]), this bounds sends
    /// that wait for a receive buffer with infinite RNR retries.
    pub op_timeout: Duration,
    /// Completion-queue read interval when nothing happened for a while
    /// (no completion channel: the worker polls).
    pub idle_poll: Duration,
    /// Register memory with `IBV_ACCESS_RELAXED_ORDERING` (faster PCIe
    /// writes, the source's choice for bulk transfers). Relaxed ordering
    /// lets the NIC's writes to host memory become visible out of order, so
    /// a domain that uses it does not claim ordered delivery
    /// ([`crate::domain::Domain::ordered`] is `false`): the key-value store
    /// then waits for its leaf writes before unlocking (3 round trips per
    /// write instead of 2). Turn it off on every node of a store (the
    /// memory node, whose pool registration is what the NIC writes into,
    /// and the compute nodes, whose domains decide the path) to get the
    /// ordered path.
    pub relaxed_ordering: bool,
}

impl Default for VerbsConfig {
    fn default() -> Self {
        VerbsConfig {
            device: None,
            nics: NicSelect::default(),
            port: 1,
            gid_index: 0,
            auto_gid: true,
            max_peers: 4096,
            timing: RcTiming::default(),
            max_inline: 64,
            send_depth: 256,
            srq_depth: 4096,
            cq_depth: 4096,
            handshake_timeout: Duration::from_secs(5),
            handshake_retry: Duration::from_millis(100),
            op_timeout: Duration::from_secs(30),
            idle_poll: Duration::from_millis(1),
            relaxed_ordering: true,
        }
    }
}

impl VerbsConfig {
    /// Checks the options' ranges.
    pub fn validate(&self) -> Result<(), &'static str> {
        self.timing.validate()?;
        if self.port == 0 {
            return Err("verbs port numbers start at 1");
        }
        if self.send_depth < wr::MAX_CHAIN as u32 {
            return Err("send queue shallower than one chain");
        }
        if self.max_peers == 0 {
            return Err("max_peers of 0");
        }
        if self.srq_depth == 0 || self.cq_depth == 0 {
            return Err("empty shared receive or completion queue");
        }
        if self.srq_depth > 1 << 20 || self.cq_depth > 1 << 20 {
            return Err("shared receive or completion queue deeper than 2^20");
        }
        if self.handshake_timeout.is_zero()
            || self.handshake_retry.is_zero()
            || self.op_timeout.is_zero()
            || self.idle_poll.is_zero()
        {
            return Err("zero handshake, operation or polling interval");
        }
        Ok(())
    }
}

/// Completion-queue entries for `cfg`: every request of every signalled
/// chain in flight (a chain completes with one entry, but a failing queue
/// pair flushes each of its up to four requests with one), both shared
/// receive queues, and the UD slots.
pub fn cq_entries(cfg: &VerbsConfig) -> u32 {
    let ud = (UD_RECVS + UD_SENDS) as u32;
    cfg.cq_depth
        .saturating_mul(wr::MAX_CHAIN as u32)
        .saturating_add(cfg.srq_depth.saturating_mul(2))
        .saturating_add(ud)
}

/// The devices libibverbs lists, each placed by sysfs (under
/// `cfg.nics.sysfs`).
pub fn list_nics(cfg: &VerbsConfig) -> Result<Vec<ListedNic>, TransferError> {
    Ok(topology::enumerate(&cfg.nics.sysfs, &ffi::device_names()?))
}

/// The device each of an engine's `nics` verbs NICs opens, given the
/// devices libibverbs lists: [`VerbsConfig::device`] for every NIC where
/// it is given and [`VerbsConfig::nics`] is the default, else the devices
/// `nics` chooses, in turn. No device listed at all is the error of
/// `ibv_get_device_list` (no device or driver here).
pub fn chosen_devices(
    cfg: &VerbsConfig,
    listed: &[String],
    nics: usize,
) -> Result<Vec<String>, TransferError> {
    if listed.is_empty() {
        return Err(TransferError::Verbs {
            call: "ibv_get_device_list",
            errno: libc::ENODEV,
        });
    }
    let select = match (&cfg.device, &cfg.nics.choice) {
        (Some(d), NicChoice::Listed) => NicSelect {
            choice: NicChoice::Named(vec![d.clone()]),
            ..cfg.nics.clone()
        },
        _ => cfg.nics.clone(),
    };
    let chosen = topology::choose(&select, "verbs", listed).map_err(TransferError::NicChoice)?;
    Ok(topology::assign(&chosen, nics)
        .into_iter()
        .map(|i| listed[i].clone())
        .collect())
}

/// The RDMA devices the kernel lists (SoftRoCE's `rxe*` included), sorted;
/// empty when there are none or no sysfs.
pub fn device_names() -> Vec<String> {
    device_names_in(Path::new(SYSFS_DEVICES))
}

fn device_names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_ranges() {
        assert!(VerbsConfig::default().validate().is_ok());
        let bad = VerbsConfig {
            port: 0,
            ..VerbsConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = VerbsConfig {
            send_depth: 2,
            ..VerbsConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = VerbsConfig {
            handshake_timeout: Duration::ZERO,
            ..VerbsConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = VerbsConfig {
            cq_depth: 1 << 21,
            ..VerbsConfig::default()
        };
        assert!(bad.validate().is_err());
        // Room for every request of every chain, both receive queues, UD.
        assert_eq!(
            cq_entries(&VerbsConfig::default()),
            4 * 4096 + 2 * 4096 + 64
        );
    }

    #[test]
    fn an_engines_nics_open_the_chosen_devices_in_turn() {
        let s = crate::topology::tests::dgx();
        let listed: Vec<String> = (0..6).map(|i| format!("mlx5_{i}")).collect();
        let given = VerbsConfig {
            device: Some("mlx5_3".into()),
            ..VerbsConfig::default()
        };
        // A device given alone: every NIC on it, as before.
        assert_eq!(
            chosen_devices(&given, &listed, 2).unwrap(),
            ["mlx5_3", "mlx5_3"]
        );
        // The default: the devices in the library's order.
        let all = chosen_devices(&VerbsConfig::default(), &listed, 3).unwrap();
        assert_eq!(all, ["mlx5_0", "mlx5_1", "mlx5_2"]);
        // Nearest the GPU wins over `device`.
        let near = VerbsConfig {
            nics: s.select(NicChoice::NearPci("0000:53:00.0".parse().unwrap())),
            ..given.clone()
        };
        assert_eq!(
            chosen_devices(&near, &listed, 3).unwrap(),
            ["mlx5_0", "mlx5_1", "mlx5_2"]
        );
        let node1 = VerbsConfig {
            nics: s.select(NicChoice::NumaNode(1)),
            ..VerbsConfig::default()
        };
        assert_eq!(
            chosen_devices(&node1, &listed, 4).unwrap(),
            ["mlx5_4", "mlx5_5", "mlx5_4", "mlx5_5"]
        );
        // Errors: no device at all names the call; a missing name lists
        // what there is.
        assert!(matches!(
            chosen_devices(&given, &[], 1),
            Err(TransferError::Verbs {
                call: "ibv_get_device_list",
                ..
            })
        ));
        let e = chosen_devices(
            &VerbsConfig {
                device: Some("mlx5_9".into()),
                ..VerbsConfig::default()
            },
            &listed,
            1,
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("mlx5_9 is not listed (listed: mlx5_0"),
            "{e}"
        );
    }

    #[test]
    fn devices_listed_sorted_and_missing_dir_is_none() {
        let dir = std::env::temp_dir().join(format!("rolex-verbs-devs-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("rxe0")).unwrap();
        std::fs::create_dir_all(dir.join("mlx5_0")).unwrap();
        assert_eq!(device_names_in(&dir), ["mlx5_0", "rxe0"]);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(device_names_in(&dir).is_empty());
    }
}
