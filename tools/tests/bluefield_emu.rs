//! The aarch64 firmware images and the emulated BlueField path
//! (`tools/firmware bluefield virt`, `rolex bluefield-emu`): both images are
//! static AArch64 executables with no libc; on QEMU's `virt` machine the
//! emulated Cortex-A72's CAS/FAA and the host's agree on the memory they
//! share (checked first: the agent's test below relies on it); and the
//! emulated agent retrains every model queued by host compute nodes, every
//! key is read back, and `rolex inspect --log --elf` decodes its log.
//!
//! Needs Debian's rustc-web + rust-web-src (or rustup's
//! aarch64-unknown-none) and qemu-system-arm, which `./tools/test`
//! installs; where they are missing each test prints `skipped: …` and
//! passes. Set `ROLEX_AARCH64_IMAGES` to "BLUEFIELD_ELF:VIRT_ELF" to skip
//! the build.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::{rolex, tmp};

/// The BlueField and QEMU `virt` images, built once per test process;
/// `None` (with the reason printed) where the toolchain is missing.
fn images() -> Option<&'static (PathBuf, PathBuf)> {
    static IMAGES: OnceLock<Option<(PathBuf, PathBuf)>> = OnceLock::new();
    IMAGES
        .get_or_init(|| {
            if let Some(v) = std::env::var_os("ROLEX_AARCH64_IMAGES") {
                let v = v.to_string_lossy().into_owned();
                let (b, q) = v.split_once(':').expect("BLUEFIELD_ELF:VIRT_ELF");
                return Some((b.into(), q.into()));
            }
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("firmware");
            let out = Command::new("bash")
                .arg(&script)
                .args(["bluefield", "virt"])
                .output()
                .expect("run tools/firmware");
            let stderr = String::from_utf8_lossy(&out.stderr);
            if !out.status.success() && stderr.contains("cannot build the aarch64 images") {
                println!("skipped: no aarch64 toolchain ({})", stderr.trim());
                return None;
            }
            assert!(out.status.success(), "tools/firmware failed:\n{stderr}");
            let stdout = String::from_utf8_lossy(&out.stdout);
            let paths: Vec<PathBuf> = stdout.lines().map(|l| PathBuf::from(l.trim())).collect();
            assert_eq!(paths.len(), 2, "two image paths: {stdout}");
            Some((paths[0].clone(), paths[1].clone()))
        })
        .as_ref()
}

/// Whether QEMU's aarch64 system emulator is installed (says so if not).
fn have_qemu() -> bool {
    let ok = Command::new("qemu-system-aarch64")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        println!("skipped: qemu-system-aarch64 is not installed (Debian: qemu-system-arm)");
    }
    ok
}

/// The JSON object on the last stdout line of a successful `rolex` run.
fn last_json(out: &std::process::Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "rolex failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().expect("a JSON line");
    serde_json::from_str(last).expect("the last line is JSON")
}

fn tool(name: &str, args: &[&str], img: &Path) -> String {
    let out = Command::new(name)
        .args(args)
        .arg(img)
        .output()
        .unwrap_or_else(|e| panic!("{name} (binutils): {e}"));
    assert!(out.status.success(), "{name} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn both_aarch64_images_are_static_executables_without_libc() {
    let Some((bluefield, virt)) = images() else {
        return;
    };
    for img in [bluefield, virt] {
        let h = tool("readelf", &["-hl"], img);
        assert!(h.contains("AArch64"), "not AArch64:\n{h}");
        assert!(
            h.contains("EXEC (Executable file)"),
            "not fixed-address:\n{h}"
        );
        assert!(!h.contains("INTERP"), "asks for a dynamic loader:\n{h}");
        let d = tool("readelf", &["-d"], img);
        assert!(d.contains("There is no dynamic section"), "{d}");
        let undefined = tool("nm", &["--undefined-only"], img);
        assert!(
            undefined.trim().is_empty(),
            "undefined symbols:\n{undefined}"
        );
        let nm = tool("nm", &[], img);
        for line in nm.lines() {
            for libc in ["GLIBC", "__libc_", "_IO_", "malloc", "printf", "pthread"] {
                assert!(!line.contains(libc), "libc symbol: {line}");
            }
        }
        assert!(nm.contains(" T _start"), "no _start entry point");
        // The log's strings are in the image for `rolex inspect --elf`.
        let s = tool("readelf", &["-S"], img);
        assert!(s.contains(".defmt"), "no .defmt section:\n{s}");
    }
}

#[test]
fn guest_and_host_cas_and_faa_agree_on_the_shared_memory() {
    let (Some((_, virt)), true) = (images(), have_qemu()) else {
        return;
    };
    let img = virt.to_str().unwrap();
    let out = rolex(&[
        "bluefield-emu",
        "--image",
        img,
        "--probe-atomics",
        "--probe-rounds",
        "20000",
    ]);
    let j = last_json(&out);
    println!("{j}");
    assert_eq!(j["verified"], true, "{j}");
    assert_eq!(j["agent_rounds"], 20000, "{j}");
    let host = j["host_rounds"].as_u64().unwrap();
    // No update of either side was lost.
    assert_eq!(j["faa_count"].as_u64(), Some(20000 + host), "{j}");
    assert_eq!(j["cas_count"].as_u64(), Some(20000 + host), "{j}");
    assert_eq!(j["cas_refused"], 20000, "{j}");
}

#[test]
fn the_emulated_agent_retrains_what_host_compute_nodes_queue_and_no_key_is_lost() {
    let (Some((_, virt)), true) = (images(), have_qemu()) else {
        return;
    };
    let img = virt.to_str().unwrap();
    let pool = PathBuf::from(format!(
        "/dev/shm/rolex-test-{}-bluefield-emu",
        std::process::id()
    ));
    let pool = if Path::new("/dev/shm").is_dir() {
        pool
    } else {
        tmp("bluefield-emu")
    };
    let out = rolex(&[
        "bluefield-emu",
        "--image",
        img,
        "--pool-file",
        pool.to_str().unwrap(),
    ]);
    let j = last_json(&out);
    println!("{j}");
    assert_eq!(j["verified"], true, "{j}");
    assert_eq!(j["arch"], "aarch64");
    assert_eq!(j["cpu"], "cortex-a72");
    assert!(j["models_retrained"].as_u64().unwrap() > 0, "{j}");
    assert!(j["keys_verified"].as_u64().unwrap() > 256, "{j}");
    assert!(j["agent_log_lines"].as_u64().unwrap() > 0, "{j}");
    // `rolex inspect` decodes the aarch64 image's log as the x86_64 one's.
    let log = rolex(&["inspect", pool.to_str().unwrap(), "--log", "--elf", img]);
    let _ = std::fs::remove_file(&pool);
    let text = String::from_utf8_lossy(&log.stdout);
    assert!(
        log.status.success(),
        "{}",
        String::from_utf8_lossy(&log.stderr)
    );
    assert!(text.contains("agent: stopped"), "{text}");
    assert!(text.contains("INFO  attached:"), "{text}");
    assert!(text.contains("retrained: record"), "{text}");
    assert!(text.contains("INFO  stopped:"), "{text}");
}

#[test]
fn an_image_for_another_architecture_is_refused_without_running() {
    let out = rolex(&[
        "bluefield-emu",
        "--image",
        env!("CARGO_BIN_EXE_rolex"),
        "--qemu",
        "/nonexistent/qemu",
    ]);
    common::assert_fails(&out, "not an aarch64 image");
}
