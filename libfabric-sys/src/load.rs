//! Loading libfabric at run time: `dlopen` of `libfabric.so.1` (or the file
//! `ROLEX_LIBFABRIC` names) and `dlsym` of the few real symbols the project
//! calls; everything else is reached through the operation tables of the
//! objects those calls return (module `ops`).
//!
//! Invariants: [`lib`] loads once per process and answers the same result
//! (library or [`LoadError`]) ever after; a [`Lib`] holds only entry points
//! of a library that stays loaded for the rest of the process (it is never
//! `dlclose`d: libfabric keeps global provider state, and the objects
//! opened through it outlive any one `Lib` value), and of a version the
//! project's ABI declarations cover (1.17 or newer).
//!
//! libfabric versions its symbols (`fi_getinfo@@FABRIC_1.3` beside older
//! compatibility versions); `dlsym` returns the default version, the one a
//! program linked against the library's own headers would call, whose
//! structs extend 1.17's (see module `abi`).

use core::ffi::{c_char, c_int, c_void};
use std::ffi::{CStr, CString, OsStr};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::sync::OnceLock;

use crate::abi::{fi_fabric_attr, fi_info, fi_major, fi_minor, fi_version_of, fid_fabric};

/// The file loaded when `ROLEX_LIBFABRIC` is not set (resolved by the
/// dynamic loader's search path).
pub const DEFAULT_LIBRARY: &str = "libfabric.so.1";

/// The environment variable naming another libfabric file to load.
pub const LIBRARY_ENV: &str = "ROLEX_LIBFABRIC";

/// The oldest library version whose ABI the declarations cover.
pub const MIN_VERSION: u32 = fi_version_of(1, 17);

/// Why libfabric could not be used; its `Display` says how to fix it.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoadError {
    /// `dlopen` failed: the file is absent or not a loadable library.
    Open {
        /// The file asked for.
        path: String,
        /// `dlerror`'s text.
        dlerror: String,
    },
    /// The library lacks a symbol the project calls.
    Symbol {
        /// The file loaded.
        path: String,
        /// The missing symbol.
        symbol: &'static str,
        /// `dlerror`'s text.
        dlerror: String,
    },
    /// The library is older than [`MIN_VERSION`].
    TooOld {
        /// The file loaded.
        path: String,
        /// Its `fi_version()`.
        version: u32,
    },
}

const HOW_TO_FIX: &str =
    "install it (Debian: apt-get install libfabric1) or set ROLEX_LIBFABRIC to its path";

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Open { path, dlerror } => {
                write!(f, "libfabric could not be loaded ({path}: {dlerror}); {HOW_TO_FIX}")
            }
            LoadError::Symbol {
                path,
                symbol,
                dlerror,
            } => write!(
                f,
                "libfabric could not be loaded ({path} has no {symbol}: {dlerror}); {HOW_TO_FIX}"
            ),
            LoadError::TooOld { path, version } => write!(
                f,
                "libfabric could not be loaded ({path} is version {}.{}, 1.17 or newer is needed); {HOW_TO_FIX}",
                fi_major(*version),
                fi_minor(*version)
            ),
        }
    }
}

impl std::error::Error for LoadError {}

type GetInfoFn = unsafe extern "C" fn(
    version: u32,
    node: *const c_char,
    service: *const c_char,
    flags: u64,
    hints: *const fi_info,
    info: *mut *mut fi_info,
) -> c_int;
type FreeInfoFn = unsafe extern "C" fn(info: *mut fi_info);
type DupInfoFn = unsafe extern "C" fn(info: *const fi_info) -> *mut fi_info;
type FabricFn = unsafe extern "C" fn(
    attr: *mut fi_fabric_attr,
    fabric: *mut *mut fid_fabric,
    context: *mut c_void,
) -> c_int;
type StrErrorFn = unsafe extern "C" fn(errnum: c_int) -> *const c_char;
type VersionFn = unsafe extern "C" fn() -> u32;

/// A loaded libfabric: its entry points and version.
#[derive(Debug)]
pub struct Lib {
    path: String,
    version: u32,
    getinfo: GetInfoFn,
    freeinfo: FreeInfoFn,
    dupinfo: DupInfoFn,
    fabric: FabricFn,
    strerror: StrErrorFn,
}

static LIB: OnceLock<Result<Lib, LoadError>> = OnceLock::new();

/// The process's libfabric, loaded on first use from `ROLEX_LIBFABRIC` or
/// else [`DEFAULT_LIBRARY`]; every later call answers the same.
pub fn lib() -> Result<&'static Lib, LoadError> {
    LIB.get_or_init(|| match std::env::var_os(LIBRARY_ENV) {
        Some(p) if !p.is_empty() => Lib::open(&p),
        _ => Lib::open(DEFAULT_LIBRARY),
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// `dlerror`'s text, without a leading `path: ` (the error names the path).
fn dlerror(path: &str) -> String {
    // SAFETY: `dlerror` returns null or a NUL-terminated string valid until
    // the next dl* call on this thread; it is copied at once.
    let text = unsafe {
        let p = libc::dlerror();
        if p.is_null() {
            return "unknown dynamic-loader error".into();
        }
        CStr::from_ptr(p).to_string_lossy().into_owned()
    };
    match text.strip_prefix(path).and_then(|t| t.strip_prefix(": ")) {
        Some(rest) => rest.to_string(),
        None => text,
    }
}

impl Lib {
    /// Loads the libfabric at `path` (a file name the dynamic loader
    /// searches for, or a path) and resolves its entry points. Each call
    /// loads anew (the loader counts references); the library is never
    /// unloaded. Most callers want [`lib`].
    pub fn open(path: impl AsRef<OsStr>) -> Result<Lib, LoadError> {
        let os = path.as_ref();
        let shown = os.to_string_lossy().into_owned();
        let c = CString::new(os.as_bytes()).map_err(|_| LoadError::Open {
            path: shown.clone(),
            dlerror: "the path contains a NUL byte".into(),
        })?;
        // RTLD_GLOBAL: as if linked, so provider plug-ins libfabric loads
        // itself resolve its symbols.
        // SAFETY: `c` is NUL-terminated; loading runs the library's
        // initialisers, which libfabric keeps free of side effects beyond
        // its own state.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if handle.is_null() {
            return Err(LoadError::Open {
                dlerror: dlerror(&shown),
                path: shown,
            });
        }
        let sym = |name: &'static str| -> Result<*mut c_void, LoadError> {
            let cname = CString::new(name).expect("symbol names have no NUL");
            // SAFETY: a handle from `dlopen` that is never closed, and a
            // NUL-terminated name.
            let p = unsafe { libc::dlsym(handle, cname.as_ptr()) };
            if p.is_null() {
                Err(LoadError::Symbol {
                    path: shown.clone(),
                    symbol: name,
                    dlerror: dlerror(&shown),
                })
            } else {
                Ok(p)
            }
        };
        // SAFETY (each transmute): the symbol is libfabric's function of
        // that name, whose C prototype (fabric.h, fi_errno.h) the target
        // type restates; function and data pointers have the same size on
        // every platform with `dlsym`.
        let version_fn =
            unsafe { std::mem::transmute::<*mut c_void, VersionFn>(sym("fi_version")?) };
        let lib = Lib {
            path: shown.clone(),
            // SAFETY: `fi_version` takes no arguments and returns a number.
            version: unsafe { version_fn() },
            // SAFETY: as above.
            getinfo: unsafe { std::mem::transmute::<*mut c_void, GetInfoFn>(sym("fi_getinfo")?) },
            // SAFETY: as above.
            freeinfo: unsafe {
                std::mem::transmute::<*mut c_void, FreeInfoFn>(sym("fi_freeinfo")?)
            },
            // SAFETY: as above.
            dupinfo: unsafe { std::mem::transmute::<*mut c_void, DupInfoFn>(sym("fi_dupinfo")?) },
            // SAFETY: as above.
            fabric: unsafe { std::mem::transmute::<*mut c_void, FabricFn>(sym("fi_fabric")?) },
            // SAFETY: as above.
            strerror: unsafe {
                std::mem::transmute::<*mut c_void, StrErrorFn>(sym("fi_strerror")?)
            },
        };
        if lib.version < MIN_VERSION {
            return Err(LoadError::TooOld {
                path: shown,
                version: lib.version,
            });
        }
        Ok(lib)
    }

    /// The file this was loaded from, as given.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The library's `fi_version()`: the highest API version it serves
    /// ([`fi_major`] / [`fi_minor`] split it).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// `fi_strerror(errnum)`, copied.
    pub fn strerror(&self, errnum: c_int) -> String {
        // SAFETY: `fi_strerror` accepts any number and returns a
        // NUL-terminated string (its own table's, or `strerror`'s) that is
        // copied before this thread calls anything else.
        unsafe {
            let p = (self.strerror)(errnum);
            if p.is_null() {
                return format!("error {errnum}");
            }
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }

    /// `fi_getinfo`.
    ///
    /// # Safety
    /// As libfabric's: `node` and `service` null or NUL-terminated, `hints`
    /// null or a valid `fi_info` (from [`Lib::fi_allocinfo`]), `info`
    /// writable; the list returned must be freed with [`Lib::fi_freeinfo`].
    pub unsafe fn fi_getinfo(
        &self,
        version: u32,
        node: *const c_char,
        service: *const c_char,
        flags: u64,
        hints: *const fi_info,
        info: *mut *mut fi_info,
    ) -> c_int {
        // SAFETY: the caller's contract.
        unsafe { (self.getinfo)(version, node, service, flags, hints, info) }
    }

    /// `fi_freeinfo`.
    ///
    /// # Safety
    /// `info` is null or a list from this library not freed before.
    pub unsafe fn fi_freeinfo(&self, info: *mut fi_info) {
        // SAFETY: the caller's contract.
        unsafe { (self.freeinfo)(info) }
    }

    /// `fi_dupinfo`.
    ///
    /// # Safety
    /// `info` is null or a valid `fi_info`.
    pub unsafe fn fi_dupinfo(&self, info: *const fi_info) -> *mut fi_info {
        // SAFETY: the caller's contract.
        unsafe { (self.dupinfo)(info) }
    }

    /// `fi_allocinfo()` (`fi_dupinfo(NULL)`): a zeroed `fi_info` with its
    /// attribute structs allocated, sized by the library; null when out of
    /// memory. Free it with [`Lib::fi_freeinfo`].
    pub fn fi_allocinfo(&self) -> *mut fi_info {
        // SAFETY: null is a valid argument (it asks for a fresh info).
        unsafe { (self.dupinfo)(core::ptr::null()) }
    }

    /// `fi_fabric`.
    ///
    /// # Safety
    /// `attr` is the `fabric_attr` of an `fi_info` from this library's
    /// `fi_getinfo`; `fabric` is writable.
    pub unsafe fn fi_fabric(
        &self,
        attr: *mut fi_fabric_attr,
        fabric: *mut *mut fid_fabric,
        context: *mut c_void,
    ) -> c_int {
        // SAFETY: the caller's contract.
        unsafe { (self.fabric)(attr, fabric, context) }
    }
}
