//! The `--fabric` argument of `bench`, `memnode` and `te-bench`, and the
//! engine configurations of a node in its own process.
//!
//! `loopback` is the in-process NIC; `libfabric:PROVIDER` a libfabric
//! provider (`tcp`, `shm`, `sockets`, `efa`, `verbs`); `verbs[:DEVICE]` the
//! ibverbs RC domain on a device (the first one listed without a name),
//! which needs a `rolex` built with `--features verbs`. Each subcommand
//! says which of them it takes.

use std::time::Duration;

use clap::Args;
use rolex_host::domain::fabric::LibfabricConfig;
use rolex_host::{EngineConfig, Fabric};

/// A `--fabric` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FabricArg {
    /// The in-process loopback NIC.
    Loopback,
    /// A libfabric provider.
    Libfabric(String),
    /// The ibverbs RC domain on a device (`None`: the first one listed).
    Verbs(Option<String>),
}

/// Parses `loopback`, `libfabric:PROVIDER` or `verbs[:DEVICE]`.
pub fn parse_fabric(s: &str) -> Result<FabricArg, String> {
    match s.split_once(':') {
        None if s == "loopback" => Ok(FabricArg::Loopback),
        None if s == "verbs" => Ok(FabricArg::Verbs(None)),
        Some(("libfabric", p)) if !p.is_empty() => Ok(FabricArg::Libfabric(p.to_string())),
        Some(("verbs", d)) if !d.is_empty() => Ok(FabricArg::Verbs(Some(d.to_string()))),
        _ => Err(format!(
            "unknown fabric {s:?}: use loopback, libfabric:PROVIDER or verbs[:DEVICE]"
        )),
    }
}

impl FabricArg {
    /// The value as the command line spells it.
    pub fn name(&self) -> String {
        match self {
            FabricArg::Loopback => "loopback".into(),
            FabricArg::Libfabric(p) => format!("libfabric:{p}"),
            FabricArg::Verbs(None) => "verbs".into(),
            FabricArg::Verbs(Some(d)) => format!("verbs:{d}"),
        }
    }

    /// This process's rxm buffer size over a `*;ofi_rxm` provider, for the
    /// bootstrap to compare with the peer's
    /// ([`LibfabricConfig::rxm_buffer`]); `None` on any other fabric.
    pub fn rxm_buffer(&self) -> Option<u32> {
        match self {
            FabricArg::Libfabric(p) => LibfabricConfig::new(p, None).rxm_buffer(),
            _ => None,
        }
    }
}

/// Where a verbs device is reached (`--fabric verbs[:DEVICE]`).
#[derive(Debug, Clone, Args)]
pub struct VerbsArgs {
    /// verbs: the device's port (1-based).
    #[arg(long, default_value_t = 1)]
    pub verbs_port: u8,
    /// verbs: GID index (0 on InfiniBand; RoCE v2 is usually 1 or 3).
    #[arg(long, default_value_t = 0)]
    pub gid_index: u8,
}

/// The message for `--fabric verbs` in a build without the backend.
pub const NO_VERBS: &str = "this rolex was built without the verbs backend; build it with \
                            `cargo build --release -p rolex-tools --features verbs`";

/// The verbs fabric on `device`. `relaxed_ordering`: register memory with
/// relaxed ordering (bulk transfers); the key-value store turns it off on
/// every node so its writes keep the 2-round-trip ordered path
/// (`VerbsConfig::relaxed_ordering`).
#[cfg(feature = "verbs")]
pub fn verbs_fabric(
    device: Option<String>,
    v: &VerbsArgs,
    relaxed_ordering: bool,
) -> Result<Fabric, String> {
    Ok(Fabric::Verbs(rolex_host::domain::verbs::VerbsConfig {
        device,
        port: v.verbs_port,
        gid_index: v.gid_index,
        relaxed_ordering,
        ..Default::default()
    }))
}

/// Without the `verbs` feature there is no verbs domain to run on.
#[cfg(not(feature = "verbs"))]
pub fn verbs_fabric(
    _device: Option<String>,
    _v: &VerbsArgs,
    _relaxed_ordering: bool,
) -> Result<Fabric, String> {
    Err(NO_VERBS.into())
}

/// The node (IP address) a serving process's libfabric endpoints open on:
/// `node` if given; none for providers that take no address (`shm`,
/// `efa`, `verbs`); else the `--listen` address's host, else 127.0.0.1
/// (`tcp` would pick the first interface, not loopback).
pub fn serving_node(provider: &str, node: Option<&str>, listen: Option<&str>) -> Option<String> {
    match provider {
        "shm" | "efa" | "verbs" => node.map(str::to_string),
        _ => Some(
            node.map(str::to_string)
                .or_else(|| {
                    listen
                        .and_then(|l| l.rsplit_once(':'))
                        .map(|(ip, _)| ip.trim_matches(['[', ']']).to_string())
                })
                .unwrap_or_else(|| "127.0.0.1".into()),
        ),
    }
}

/// The engine of a node in its own process on libfabric `provider`:
/// endpoints on `node` (an IP address; unused by `shm`, `efa`, `verbs`
/// unless given), workers unpinned (the machine is shared with the other
/// nodes: pinning is round-robin within a process, so two processes would
/// share a CPU).
pub fn libfabric_engine(provider: &str, node: Option<&str>, busy_poll_us: u64) -> EngineConfig {
    EngineConfig {
        fabric: Fabric::Libfabric(LibfabricConfig {
            busy_poll: Duration::from_micros(busy_poll_us),
            ..LibfabricConfig::new(provider, node)
        }),
        pin_workers: false,
        ..EngineConfig::default()
    }
}

/// The engine of a key-value node (memory or compute) in its own process
/// on a verbs device: relaxed ordering off (see [`verbs_fabric`]), workers
/// unpinned.
pub fn verbs_kv_engine(device: Option<String>, v: &VerbsArgs) -> Result<EngineConfig, String> {
    Ok(EngineConfig {
        fabric: verbs_fabric(device, v, false)?,
        pin_workers: false,
        ..EngineConfig::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_parses_and_names_itself_back() {
        for s in [
            "loopback",
            "libfabric:tcp",
            "libfabric:tcp;ofi_rxm",
            "verbs",
            "verbs:mlx5_0",
        ] {
            assert_eq!(parse_fabric(s).unwrap().name(), s);
        }
        for bad in ["", "tcp", "libfabric:", "verbs:", "loopback:x", "rdma"] {
            let e = parse_fabric(bad).unwrap_err();
            assert!(e.contains("unknown fabric"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_serving_node_opens_where_it_listens() {
        assert_eq!(
            serving_node("tcp", None, Some("10.0.0.2:7000")),
            Some("10.0.0.2".into())
        );
        assert_eq!(
            serving_node("tcp", None, Some("[::1]:7000")),
            Some("::1".into())
        );
        assert_eq!(
            serving_node("tcp", Some("10.1.1.1"), Some("10.0.0.2:7")),
            Some("10.1.1.1".into())
        );
        assert_eq!(serving_node("tcp", None, None), Some("127.0.0.1".into()));
        assert_eq!(serving_node("shm", None, Some("10.0.0.2:7000")), None);
        assert_eq!(serving_node("efa", Some("x"), None), Some("x".into()));
    }

    #[test]
    fn verbs_without_the_backend_says_how_to_get_it() {
        let v = VerbsArgs {
            verbs_port: 1,
            gid_index: 0,
        };
        let r = verbs_kv_engine(None, &v);
        if cfg!(feature = "verbs") {
            assert!(!r.expect("a verbs engine config").pin_workers);
        } else {
            assert_eq!(r.unwrap_err(), NO_VERBS);
        }
    }
}
