//! Link arguments of the freestanding image, by target: the linker script
//! from `linker/` (which also pulls in defmt's `defmt.x`; for aarch64 the
//! board's: BlueField, or QEMU `virt` with feature `qemu-virt`), and for
//! the x86_64 Linux process no start files, no libc and a static
//! executable.

use std::path::PathBuf;

fn main() {
    let target = std::env::var("TARGET").unwrap_or_default();
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let linker = manifest.join("../../linker");
    let script = match target.as_str() {
        "x86_64-unknown-linux-gnu" => {
            for arg in ["-nostartfiles", "-nostdlib", "-static", "-no-pie"] {
                println!("cargo:rustc-link-arg-bins={arg}");
            }
            Some(linker.join("x86_64-linux.ld"))
        }
        "aarch64-unknown-none" if std::env::var_os("CARGO_FEATURE_QEMU_VIRT").is_some() => {
            Some(linker.join("qemu-virt-aarch64.ld"))
        }
        "aarch64-unknown-none" => Some(linker.join("bluefield-aarch64.ld")),
        _ => None,
    };
    if let Some(script) = script {
        println!("cargo:rerun-if-changed={}", script.display());
        println!("cargo:rustc-link-arg-bins=-T{}", script.display());
    }
    println!("cargo:rerun-if-changed=build.rs");
}
