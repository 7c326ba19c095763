//! Loading libfabric at run time: the installed library loads and is new
//! enough, its `fi_strerror` answers, and every way loading can fail gives
//! the error that says how to fix it. Where libfabric is not installed the
//! tests that need it say so and pass.

use libfabric_sys::{fi_major, fi_minor, fi_version_of, lib, Lib, LoadError, FI_EAGAIN};

/// The process's library, or `None` (with a line saying why) where it is
/// not installed.
fn installed() -> Option<&'static Lib> {
    match lib() {
        Ok(l) => Some(l),
        Err(LoadError::Open { dlerror, .. }) if dlerror.contains("No such file") => {
            println!("skipped: libfabric not installed ({dlerror})");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn loads_and_reports_at_least_1_17() {
    let Some(l) = installed() else { return };
    let v = l.version();
    assert!(v >= fi_version_of(1, 17), "libfabric version {v:#x}");
    println!(
        "loaded {} version {}.{}",
        l.path(),
        fi_major(v),
        fi_minor(v)
    );
}

#[test]
fn strerror_of_eagain_is_the_system_text() {
    let Some(l) = installed() else { return };
    let s = l.strerror(FI_EAGAIN);
    assert!(s.contains("temporarily unavailable"), "{s:?}");
}

#[test]
fn allocinfo_gives_attribute_structs() {
    let Some(l) = installed() else { return };
    let info = l.fi_allocinfo();
    assert!(!info.is_null());
    // SAFETY: a fresh `fi_info` from `fi_dupinfo(NULL)`, read, then freed
    // once.
    unsafe {
        assert!(!(*info).tx_attr.is_null());
        assert!(!(*info).ep_attr.is_null());
        assert!(!(*info).domain_attr.is_null());
        assert!(!(*info).fabric_attr.is_null());
        assert!((*info).next.is_null());
        l.fi_freeinfo(info);
    }
}

#[test]
fn a_missing_file_says_how_to_install_it() {
    let path = "/nonexistent/libfabric.so.1";
    let e = Lib::open(path).unwrap_err();
    assert!(matches!(e, LoadError::Open { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.starts_with(&format!("libfabric could not be loaded ({path}: ")),
        "{text}"
    );
    // The loader's text, without the path a second time.
    assert_eq!(text.matches(path).count(), 1, "{text}");
    assert!(
        text.ends_with(
            "); install it (Debian: apt-get install libfabric1) or set ROLEX_LIBFABRIC to its path"
        ),
        "{text}"
    );
}

#[test]
fn a_file_that_is_no_library_is_refused() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let e = Lib::open(path).unwrap_err();
    assert!(matches!(e, LoadError::Open { .. }), "{e:?}");
}

#[test]
fn a_library_without_libfabric_symbols_is_refused() {
    // The C library is loaded in every process; it has no `fi_version`.
    let e = Lib::open("libc.so.6").unwrap_err();
    match &e {
        LoadError::Symbol { symbol, .. } => assert_eq!(*symbol, "fi_version"),
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("has no fi_version"), "{e}");
}
