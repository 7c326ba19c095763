//! [`Nic`]: one opened RDMA device, as a verbs domain starts from it — the
//! device context, protection domain, completion queue, both shared receive
//! queues and the UD queue pair handshakes travel on.
//!
//! With `domain`, this is one of the two modules that call into libibverbs
//! (through `ffi`); the bring-up sequence it drives is `bringup`'s,
//! device-free. Invariant: a `Nic` is only handed out fully opened — its UD
//! queue pair at RTS under the qkey it records, the immediates' receive
//! queue stocked — and an error on the way drops what was opened so far
//! (each handle's `Drop` releases it, children before parents).

use std::sync::Arc;

use super::bringup::{self, BroughtUp, RcTiming};
use super::caps::DeviceCaps;
use super::ffi::{Context, Cq, Device, Pd, Qp, Srq};
use super::{cq_entries, demux, VerbsConfig};
use crate::error::TransferError;

/// One opened NIC: device context, protection domain, completion queue,
/// shared receive queue stocked with zero-length receives, the (empty)
/// shared receive queue for messages, and the UD queue pair (at RTS, under
/// a random qkey) on which handshakes travel.
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
    /// The port's GID at `gid_index`.
    pub gid: [u8; 16],
    /// The GID index in use: the configured one, or the one chosen
    /// ([`VerbsConfig::auto_gid`]).
    pub gid_index: u8,
    /// The port's active MTU code.
    pub mtu: u8,
    /// What the device can do (`ibv_query_device`).
    pub caps: DeviceCaps,
    /// The configured RC timing with its read/atomic limits clamped to
    /// the device: what the handshake offers.
    pub timing: RcTiming,
}

impl Nic {
    /// Opens the configured device and brings its UD queue pair up.
    pub fn open(cfg: &VerbsConfig) -> Result<Nic, TransferError> {
        cfg.validate()
            .map_err(|why| TransferError::Config(crate::error::ConfigError::Verbs(why)))?;
        let ctx: Arc<Context> = Context::open(cfg.device.as_deref())?;
        let caps = ctx.caps()?;
        let timing = caps.clamp(cfg.timing);
        let srq_depth = caps.clamp_srq(cfg.srq_depth);
        let (lid, mtu, _state) = ctx.port(cfg.port)?;
        let gid_index = match (cfg.auto_gid, cfg.gid_index) {
            (true, 0) => {
                let dir = std::path::Path::new(super::SYSFS_DEVICES).join(ctx.name());
                super::gid::choose(&super::gid::read_port_gids(&dir, cfg.port)).unwrap_or(0)
            }
            (_, given) => given,
        };
        let gid = ctx.gid(cfg.port, gid_index)?;
        let pd = Pd::new(&ctx)?;
        let cq = Cq::new(&ctx, cq_entries(cfg))?;
        let srq = Srq::new(&pd, srq_depth)?;
        srq.post_zero_length(srq_depth, demux::WrTag::Imm.id(0))?;
        let msg_srq = Srq::new(&pd, srq_depth)?;
        let mut device = Device {
            pd,
            cq,
            srq,
            msg_srq,
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
            gid_index,
            mtu: mtu.clamp(1, 5),
            caps,
            timing,
        })
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        self.device.pd.context().name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
