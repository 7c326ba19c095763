//! Checks the hand-declared ABI (`src/abi.rs`) against the installed
//! libfabric headers: writes a C program that prints `sizeof`, `offsetof`
//! of every declared field and the value of every declared constant,
//! compiles it with `cc`, runs it, and compares with Rust's `size_of`,
//! `offset_of!` and the constants. Where the headers (or `cc`) are absent
//! it says so and passes: the declarations are then unchecked, not wrong.
//!
//! The size rule depends on who allocates the struct (see `src/abi.rs`):
//! whole structs match exactly, prefixes are no larger than C's, padded
//! ones leave C's no larger than the struct plus its reserve.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

use libfabric_sys::*;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Rule {
    Whole,
    Prefix,
    Padded,
}

struct Decl {
    name: &'static str,
    rule: Rule,
    size: usize,
    /// (C field name, Rust offset)
    fields: Vec<(&'static str, usize)>,
}

macro_rules! c_name {
    ($rust:ident) => {
        stringify!($rust)
    };
    ($rust:ident $c:literal) => {
        $c
    };
}

macro_rules! decl {
    ($ty:ident, $rule:ident, [$($f:ident $(= $c:literal)?),* $(,)?]) => {
        Decl {
            name: stringify!($ty),
            rule: Rule::$rule,
            size: size_of::<$ty>(),
            fields: vec![$((c_name!($f $($c)?), offset_of!($ty, $f))),*],
        }
    };
}

fn decls() -> Vec<Decl> {
    vec![
        decl!(fid, Whole, [fclass, context, ops]),
        decl!(fi_ops, Prefix, [size, close, bind, control]),
        decl!(
            fi_tx_attr,
            Prefix,
            [
                caps,
                mode,
                op_flags,
                msg_order,
                comp_order,
                inject_size,
                size,
                iov_limit,
                rma_iov_limit
            ]
        ),
        decl!(fi_rx_attr, Prefix, [caps, mode, op_flags, msg_order]),
        decl!(
            fi_ep_attr,
            Prefix,
            [
                type_ = "type",
                protocol,
                protocol_version,
                max_msg_size,
                msg_prefix_size,
                max_order_raw_size,
                max_order_war_size,
                max_order_waw_size
            ]
        ),
        decl!(
            fi_domain_attr,
            Prefix,
            [
                domain,
                name,
                threading,
                control_progress,
                data_progress,
                resource_mgmt,
                av_type,
                mr_mode,
                mr_key_size,
                cq_data_size
            ]
        ),
        decl!(
            fi_fabric_attr,
            Prefix,
            [fabric, name, prov_name, prov_version, api_version]
        ),
        decl!(
            fi_info,
            Prefix,
            [
                next,
                caps,
                mode,
                addr_format,
                src_addrlen,
                dest_addrlen,
                src_addr,
                dest_addr,
                handle,
                tx_attr,
                rx_attr,
                ep_attr,
                domain_attr,
                fabric_attr,
                nic
            ]
        ),
        decl!(
            fi_pci_attr,
            Whole,
            [domain_id, bus_id, device_id, function_id]
        ),
        decl!(fi_bus_attr, Prefix, [bus_type, attr]),
        decl!(fid_nic, Prefix, [fid, device_attr, bus_attr]),
        decl!(
            fi_ops_fabric,
            Prefix,
            [size, domain, passive_ep, eq_open, wait_open, trywait]
        ),
        decl!(fid_fabric, Prefix, [fid, ops, api_version]),
        decl!(fi_ops_domain, Prefix, [size, av_open, cq_open, endpoint]),
        decl!(fi_ops_mr, Prefix, [size, reg]),
        decl!(fid_domain, Prefix, [fid, ops, mr]),
        decl!(fid_mr, Prefix, [fid, mem_desc, key]),
        decl!(
            fi_av_attr,
            Padded,
            [
                type_ = "type",
                rx_ctx_bits,
                count,
                ep_per_node,
                name,
                map_addr,
                flags
            ]
        ),
        decl!(
            fi_ops_av,
            Prefix,
            [size, insert, insertsvc, insertsym, remove]
        ),
        decl!(fid_av, Prefix, [fid, ops]),
        decl!(
            fi_cq_attr,
            Padded,
            [
                size,
                flags,
                format,
                wait_obj,
                signaling_vector,
                wait_cond,
                wait_set
            ]
        ),
        decl!(fi_cq_data_entry, Whole, [op_context, flags, len, buf, data]),
        decl!(
            fi_cq_err_entry,
            Padded,
            [
                op_context,
                flags,
                len,
                buf,
                data,
                tag,
                olen,
                err,
                prov_errno,
                err_data,
                err_data_size
            ]
        ),
        decl!(
            fi_ops_cq,
            Prefix,
            [size, read, readfrom, readerr, sread, sreadfrom, signal]
        ),
        decl!(fid_cq, Prefix, [fid, ops]),
        decl!(fi_context2, Whole, [internal]),
        decl!(fi_rma_iov, Whole, [addr, len, key]),
        decl!(
            fi_msg_rma,
            Whole,
            [
                msg_iov,
                desc,
                iov_count,
                addr,
                rma_iov,
                rma_iov_count,
                context,
                data
            ]
        ),
        decl!(iovec, Whole, [iov_base, iov_len]),
        decl!(fi_ops_ep, Prefix, [size, cancel, getopt, setopt]),
        decl!(fi_ops_cm, Prefix, [size, setname, getname]),
        decl!(fi_ops_msg, Prefix, [size, recv, recvv, recvmsg, send]),
        decl!(fi_ops_tagged, Prefix, [size, recv, recvv, recvmsg, send]),
        decl!(
            fi_ops_rma,
            Prefix,
            [size, read, readv, readmsg, write, writev, writemsg, inject, writedata]
        ),
        decl!(
            fi_ops_atomic,
            Prefix,
            [
                size,
                write,
                writev,
                writemsg,
                inject,
                readwrite,
                readwritev,
                readwritemsg,
                compwrite,
                compwritev,
                compwritemsg,
                writevalid,
                readwritevalid,
                compwritevalid
            ]
        ),
        decl!(fid_ep, Prefix, [fid, ops, cm, msg, rma, tagged, atomic]),
    ]
}

/// Every declared constant the 1.17 headers define (the shared-memory
/// option came with 1.18 and is not among them).
fn constants() -> Vec<(&'static str, u64)> {
    macro_rules! c {
        ($($n:ident),* $(,)?) => { vec![$((stringify!($n), $n as u64)),*] };
    }
    c![
        FI_MSG,
        FI_TAGGED,
        FI_RMA,
        FI_ATOMIC,
        FI_READ,
        FI_WRITE,
        FI_RECV,
        FI_SEND,
        FI_TRANSMIT,
        FI_REMOTE_READ,
        FI_REMOTE_WRITE,
        FI_REMOTE_CQ_DATA,
        FI_COMPLETION,
        FI_DELIVERY_COMPLETE,
        FI_CONTEXT,
        FI_CONTEXT2,
        FI_ORDER_RAW,
        FI_ORDER_WAR,
        FI_ORDER_WAW,
        FI_ORDER_RMA_WAW,
        FI_MR_LOCAL,
        FI_MR_RAW,
        FI_MR_VIRT_ADDR,
        FI_MR_ALLOCATED,
        FI_MR_PROV_KEY,
        FI_MR_ENDPOINT,
        FI_ADDR_UNSPEC,
        FI_EAGAIN,
        FI_ENOSYS,
        FI_ENOPROTOOPT,
        FI_EAVAIL,
        FI_ENOKEY,
        FI_EP_RDM,
        FI_PROTO_SHM,
        FI_THREAD_SAFE,
        FI_PROGRESS_AUTO,
        FI_PROGRESS_MANUAL,
        FI_AV_TABLE,
        FI_CQ_FORMAT_DATA,
        FI_WAIT_NONE,
        FI_WAIT_UNSPEC,
        FI_WAIT_FD,
        FI_UINT64,
        FI_SUM,
        FI_CSWAP,
        FI_GETWAIT,
        FI_ENABLE,
        FI_OPT_ENDPOINT,
        FI_BUS_PCI,
    ]
}

const HEADERS: &[&str] = &[
    "stdio.h",
    "stddef.h",
    "sys/uio.h",
    "rdma/fabric.h",
    "rdma/fi_domain.h",
    "rdma/fi_endpoint.h",
    "rdma/fi_cm.h",
    "rdma/fi_rma.h",
    "rdma/fi_tagged.h",
    "rdma/fi_atomic.h",
    "rdma/fi_eq.h",
    "rdma/fi_errno.h",
];

fn c_program(decls: &[Decl], consts: &[(&str, u64)]) -> String {
    let mut s = String::new();
    for h in HEADERS {
        writeln!(s, "#include <{h}>").unwrap();
    }
    s.push_str("int main(void) {\n");
    s.push_str("  printf(\"version %d.%d\\n\", FI_MAJOR_VERSION, FI_MINOR_VERSION);\n");
    for d in decls {
        let ty = format!("struct {}", d.name);
        writeln!(s, "  printf(\"size {} %zu\\n\", sizeof({ty}));", d.name).unwrap();
        for (f, _) in &d.fields {
            writeln!(
                s,
                "  printf(\"field {}.{f} %zu\\n\", offsetof({ty}, {f}));",
                d.name
            )
            .unwrap();
        }
    }
    for (n, _) in consts {
        writeln!(
            s,
            "  printf(\"const {n} %llu\\n\", (unsigned long long)({n}));"
        )
        .unwrap();
    }
    s.push_str("  return 0;\n}\n");
    s
}

fn headers_installed() -> bool {
    ["/usr/include", "/usr/local/include"]
        .iter()
        .any(|d| Path::new(d).join("rdma/fabric.h").exists())
}

fn cc_available() -> bool {
    Command::new("cc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Compiles and runs the program; its output as `key -> value`.
fn run_c(program: &str) -> (String, HashMap<String, u64>) {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("abi.c");
    let exe = dir.join("abi");
    std::fs::write(&src, program).unwrap();
    let out = Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("running cc");
    assert!(
        out.status.success(),
        "cc failed on {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().expect("running the probe");
    assert!(out.status.success(), "the probe failed");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut version = String::new();
    let mut map = HashMap::new();
    for line in text.lines() {
        let (key, value) = line.rsplit_once(' ').unwrap();
        if key == "version" {
            version = value.to_string();
        } else {
            map.insert(key.to_string(), value.parse().unwrap());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    (version, map)
}

#[test]
fn declarations_match_the_installed_headers() {
    if !headers_installed() {
        println!("skipped: libfabric headers not installed");
        return;
    }
    if !cc_available() {
        println!("skipped: no C compiler (cc) to read the libfabric headers with");
        return;
    }
    let decls = decls();
    let consts = constants();
    let (version, c) = run_c(&c_program(&decls, &consts));
    let get = |k: String| {
        *c.get(&k)
            .unwrap_or_else(|| panic!("{k} missing from the probe"))
    };
    let mut wrong = Vec::new();
    let mut fields = 0;
    for d in &decls {
        let c_size = get(format!("size {}", d.name)) as usize;
        let ok = match d.rule {
            Rule::Whole => d.size == c_size,
            Rule::Prefix => d.size <= c_size,
            Rule::Padded => d.size <= c_size && c_size <= d.size + PAD_RESERVE,
        };
        if !ok {
            wrong.push(format!(
                "{} ({:?}): Rust size {}, C size {c_size}",
                d.name, d.rule, d.size
            ));
        }
        for &(f, rust) in &d.fields {
            fields += 1;
            let c_off = get(format!("field {}.{f}", d.name)) as usize;
            if c_off != rust {
                wrong.push(format!(
                    "{}.{f}: Rust offset {rust}, C offset {c_off}",
                    d.name
                ));
            }
        }
    }
    for &(n, v) in &consts {
        let cv = get(format!("const {n}"));
        if cv != v {
            wrong.push(format!("{n}: Rust {v:#x}, C {cv:#x}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "declarations differ from libfabric {version}'s headers:\n  {}",
        wrong.join("\n  ")
    );
    println!(
        "checked {} structs, {fields} fields and {} constants against libfabric {version}'s headers",
        decls.len(),
        consts.len()
    );
}
