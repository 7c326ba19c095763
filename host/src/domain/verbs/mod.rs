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
//! handshake encoding, the queue-pair bring-up sequence (driven through
//! [`bringup::QpDevice`]), turning one completion per chain back into one
//! outcome per request ([`completions`]) — lives in safe modules tested
//! here; the calls
//! into libibverbs live in `ffi`, the one module with `unsafe` besides the
//! chain's `Send`.

pub mod bringup;
pub mod completions;
pub mod ffi;
pub mod handshake;
pub mod wr;

use std::path::Path;
use std::sync::Arc;

use bringup::{BroughtUp, RcTiming};
use ffi::{Context, Cq, Device, Pd, Qp, Srq};

use crate::error::TransferError;

/// Where the kernel lists RDMA devices.
pub const SYSFS_DEVICES: &str = "/sys/class/infiniband";

/// Options of the verbs domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerbsConfig {
    /// Device name (`mlx5_0`, `rxe0`); `None` takes the first one listed.
    pub device: Option<String>,
    /// Port number (1-based).
    pub port: u8,
    /// GID index (RoCE v2 is usually 1 or 3; 0 on InfiniBand).
    pub gid_index: u8,
    /// RC retry and timeouts.
    pub timing: RcTiming,
    /// Writes and sends of at most this many bytes go inline.
    pub max_inline: u32,
    /// Send-queue depth of each RC queue pair.
    pub send_depth: u32,
    /// Zero-length receives kept posted on the shared receive queue.
    pub srq_depth: u32,
    /// Completion-queue depth.
    pub cq_depth: u32,
}

impl Default for VerbsConfig {
    fn default() -> Self {
        VerbsConfig {
            device: None,
            port: 1,
            gid_index: 0,
            timing: RcTiming::default(),
            max_inline: 64,
            send_depth: 256,
            srq_depth: 1024,
            cq_depth: 4096,
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
        if self.srq_depth == 0 || self.cq_depth == 0 {
            return Err("empty shared receive or completion queue");
        }
        Ok(())
    }
}

/// One opened NIC: device context, protection domain, completion queue,
/// shared receive queue stocked with zero-length receives, and the UD
/// queue pair (at RTS, under a random qkey) on which handshakes travel.
#[derive(Debug)]
pub struct Nic {
    /// The device layer that creates and moves queue pairs.
    pub device: Device,
    /// The UD queue pair.
    pub ud: BroughtUp<Qp>,
    /// This engine's qkey.
    pub qkey: u32,
    /// The port's LID.
    pub lid: u16,
    /// The port's GID at the configured index.
    pub gid: [u8; 16],
    /// The port's active MTU code.
    pub mtu: u8,
}

impl Nic {
    /// Opens the configured device and brings its UD queue pair up.
    pub fn open(cfg: &VerbsConfig) -> Result<Nic, TransferError> {
        cfg.validate()
            .map_err(|why| TransferError::Config(crate::error::ConfigError::Verbs(why)))?;
        let ctx: Arc<Context> = Context::open(cfg.device.as_deref())?;
        let (lid, mtu, _state) = ctx.port(cfg.port)?;
        let gid = ctx.gid(cfg.port, cfg.gid_index)?;
        let pd = Pd::new(&ctx)?;
        let cq = Cq::new(&ctx, cfg.cq_depth)?;
        let srq = Srq::new(&pd, cfg.srq_depth)?;
        srq.post_zero_length(cfg.srq_depth, 0)?;
        let mut device = Device {
            pd,
            cq,
            srq,
            send_depth: cfg.send_depth,
            max_inline: cfg.max_inline,
        };
        let qkey = bringup::random_qkey(&mut rand::thread_rng());
        let ud = bringup::bring_up_ud(&mut device, cfg.port, qkey).map_err(|e| match e {
            bringup::BringUpError::Device { call, errno, .. } => {
                TransferError::Verbs { call, errno }
            }
            _ => TransferError::Verbs {
                call: "ibv_modify_qp",
                errno: libc::EINVAL,
            },
        })?;
        Ok(Nic {
            device,
            ud,
            qkey,
            lid,
            gid,
            mtu,
        })
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        self.device.pd.context().name()
    }
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
    }

    #[test]
    fn open_refuses_bad_options_before_touching_a_device() {
        let bad = VerbsConfig {
            port: 0,
            ..VerbsConfig::default()
        };
        assert!(matches!(
            Nic::open(&bad),
            Err(TransferError::Config(crate::error::ConfigError::Verbs(_)))
        ));
    }

    #[test]
    fn open_without_the_device_is_an_error_naming_the_call() {
        let cfg = VerbsConfig {
            device: Some("rolex-no-such-device".into()),
            ..VerbsConfig::default()
        };
        match Nic::open(&cfg) {
            Err(TransferError::Verbs { call, .. }) => {
                assert!(call.starts_with("ibv_"), "{call}")
            }
            other => panic!("expected a verbs error, got {other:?}"),
        }
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
