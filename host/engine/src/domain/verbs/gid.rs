//! Choosing the GID a RoCE port is reached by, from the kernel's GID
//! table in sysfs, device-free so tests run it on a made-up table.
//!
//! On RoCE the GID index decides the protocol and address: each IP address
//! of the port's net device appears as a RoCE v1 and a RoCE v2 GID, at
//! indices that vary with the order addresses were added (index 0 is the
//! link-local RoCE v1 GID, which routed fabrics cannot use). The choice:
//! a RoCE v2 GID carrying an IPv4 address (`::ffff:a.b.c.d`), else one
//! carrying a global IPv6 address, else a link-local RoCE v2 GID; on
//! InfiniBand (no RoCE types listed) nothing is chosen and index 0 stays.
//!
//! Layout read, per port: `ports/<port>/gids/<i>` (the GID as eight
//! colon-separated 16-bit hex groups) and `ports/<port>/gid_attrs/types/<i>`
//! (`RoCE v2`, `IB/RoCE v1`); unpopulated entries are all zero or
//! unreadable and are skipped.

use std::path::Path;

/// Entries of a port's GID table looked at (devices have 16 to 256).
pub const MAX_GIDS: u16 = 256;

/// The protocol of a GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidType {
    /// `IB/RoCE v1`.
    RoceV1,
    /// `RoCE v2` (UDP/IP, routable).
    RoceV2,
    /// Anything else, or no type file (InfiniBand).
    Other,
}

/// One populated GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Its index.
    pub index: u8,
    /// Its protocol.
    pub kind: GidType,
    /// The GID.
    pub gid: [u8; 16],
}

/// Parses a GID as sysfs prints it; `None` if it is not one.
pub fn parse_gid(s: &str) -> Option<[u8; 16]> {
    let mut out = [0u8; 16];
    let mut groups = s.trim().split(':');
    for pair in out.chunks_exact_mut(2) {
        let g = u16::from_str_radix(groups.next()?, 16).ok()?;
        pair.copy_from_slice(&g.to_be_bytes());
    }
    groups.next().is_none().then_some(out)
}

/// The populated entries of `port` under a device's sysfs directory
/// (`/sys/class/infiniband/<device>`).
pub fn read_port_gids(device_dir: &Path, port: u8) -> Vec<GidEntry> {
    let port_dir = device_dir.join("ports").join(port.to_string());
    let mut v = Vec::new();
    for i in 0..MAX_GIDS {
        let Ok(index) = u8::try_from(i) else { break };
        let Ok(text) = std::fs::read_to_string(port_dir.join("gids").join(i.to_string())) else {
            // The table ends (or the port has no such directory).
            break;
        };
        let Some(gid) = parse_gid(&text) else {
            continue;
        };
        if gid == [0; 16] {
            continue;
        }
        let kind = match std::fs::read_to_string(
            port_dir.join("gid_attrs").join("types").join(i.to_string()),
        ) {
            Ok(t) if t.trim() == "RoCE v2" => GidType::RoceV2,
            Ok(t) if t.trim() == "IB/RoCE v1" => GidType::RoceV1,
            _ => GidType::Other,
        };
        v.push(GidEntry { index, kind, gid });
    }
    v
}

fn ipv4_mapped(g: &[u8; 16]) -> bool {
    g[..10] == [0; 10] && g[10..12] == [0xff, 0xff]
}

fn link_local(g: &[u8; 16]) -> bool {
    g[0] == 0xfe && g[1] & 0xc0 == 0x80
}

/// The GID index to use, by the preference of the module docs; `None`
/// when the table has no RoCE v2 entry.
pub fn choose(entries: &[GidEntry]) -> Option<u8> {
    let v2 = || entries.iter().filter(|e| e.kind == GidType::RoceV2);
    v2().find(|e| ipv4_mapped(&e.gid))
        .or_else(|| v2().find(|e| !link_local(&e.gid)))
        .or_else(|| v2().next())
        .map(|e| e.index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(dir: &Path, entries: &[(u8, &str, Option<&str>)]) {
        let port = dir.join("ports/1");
        std::fs::create_dir_all(port.join("gids")).unwrap();
        std::fs::create_dir_all(port.join("gid_attrs/types")).unwrap();
        for (i, gid, ty) in entries {
            std::fs::write(port.join("gids").join(i.to_string()), format!("{gid}\n")).unwrap();
            if let Some(t) = ty {
                std::fs::write(
                    port.join("gid_attrs/types").join(i.to_string()),
                    format!("{t}\n"),
                )
                .unwrap();
            }
        }
    }

    const LL: &str = "fe80:0000:0000:0000:0a00:27ff:fe00:0001";
    const V4: &str = "0000:0000:0000:0000:0000:ffff:0a00:0001";
    const V6: &str = "2001:0db8:0000:0000:0000:0000:0000:0001";
    const ZERO: &str = "0000:0000:0000:0000:0000:0000:0000:0000";

    #[test]
    fn parses_what_sysfs_prints() {
        let g = parse_gid(V4).unwrap();
        assert_eq!(&g[10..], &[0xff, 0xff, 10, 0, 0, 1]);
        assert!(parse_gid("fe80::1").is_none());
        assert!(parse_gid("zz").is_none());
        assert!(parse_gid(&format!("{V4}:0001")).is_none());
    }

    #[test]
    fn roce_v2_with_ipv4_is_preferred_then_global_ipv6() {
        let dir = std::env::temp_dir().join(format!("rolex-gid-{}", std::process::id()));
        // What a ConnectX with one IPv4 and one IPv6 address lists.
        table(
            &dir,
            &[
                (0, LL, Some("IB/RoCE v1")),
                (1, LL, Some("RoCE v2")),
                (2, V6, Some("IB/RoCE v1")),
                (3, V6, Some("RoCE v2")),
                (4, V4, Some("IB/RoCE v1")),
                (5, V4, Some("RoCE v2")),
                (6, ZERO, None),
            ],
        );
        let e = read_port_gids(&dir, 1);
        assert_eq!(e.len(), 6, "the zero entry is skipped");
        assert_eq!(choose(&e), Some(5));
        assert_eq!(choose(&e[..5]), Some(3));
        assert_eq!(choose(&e[..3]), Some(1));
        assert_eq!(choose(&e[..1]), None);
        std::fs::remove_dir_all(&dir).unwrap();
        // InfiniBand: GIDs without RoCE types; no such port at all.
        let ib = dir.with_extension("ib");
        table(&ib, &[(0, LL, None)]);
        assert_eq!(choose(&read_port_gids(&ib, 1)), None);
        assert!(read_port_gids(&ib, 2).is_empty());
        std::fs::remove_dir_all(&ib).unwrap();
    }
}
