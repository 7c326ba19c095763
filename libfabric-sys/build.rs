//! Finds the system libfabric with pkg-config (at least 1.17, Debian 12's),
//! compiles the C shim over its `static inline` calls, and generates the
//! Rust bindings with bindgen, restricted by allowlists to what the
//! project uses.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=shim/shim.h");
    println!("cargo:rerun-if-changed=shim/shim.c");
    let lib = pkg_config::Config::new()
        .atleast_version("1.17")
        .probe("libfabric")
        .unwrap_or_else(|e| {
            panic!(
                "libfabric (>= 1.17) not found through pkg-config: {e}\n\
                 install it (Debian: apt-get install libfabric-dev pkg-config)"
            )
        });

    let mut cc = cc::Build::new();
    cc.file("shim/shim.c").warnings(true);
    for p in &lib.include_paths {
        cc.include(p);
    }
    cc.compile("rolex_fi_shim");

    let mut gen = bindgen::Builder::default()
        .header("shim/shim.h")
        .allowlist_function("fi_getinfo|fi_freeinfo|fi_dupinfo|fi_fabric|fi_strerror|fi_version")
        .allowlist_function("rfi_.*")
        .allowlist_var("rfi_.*")
        .allowlist_var("FI_.*")
        .allowlist_type("fi_.*|fid_.*|fid")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .derive_default(true)
        .layout_tests(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for p in &lib.include_paths {
        gen = gen.clang_arg(format!("-I{}", p.display()));
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    gen.generate()
        .expect("bindgen could not read the libfabric headers")
        .write_to_file(out.join("bindings.rs"))
        .expect("could not write bindings.rs");
}
