//! The only module of the libfabric domain that calls C: owned handles over
//! libfabric objects and the operation contexts handed to the provider.
//!
//! Invariants:
//! - every raw handle is owned by one type whose `Drop` closes it, and the
//!   owners are declared so that Rust's drop order closes children before
//!   parents (endpoint → completion queue / address vector → memory
//!   regions → domain → fabric → info);
//! - a posted operation owns everything the provider may touch until its
//!   completion is read (an [`OpCtx`]: the `fi_context2` the provider uses,
//!   pinned region guards, operand words, message bytes, per-operation
//!   memory registrations). The box is leaked into the provider on a
//!   successful post and taken back exactly once, from its completion or
//!   after the endpoint is closed;
//! - every failing call becomes a [`FiError`] naming the call, with
//!   `fi_strerror`'s text;
//! - libfabric is loaded at run time (`libfabric_sys::lib`): an [`Info`]
//!   holds the loaded library, and every other object is reached from one
//!   (`fi_getinfo` → `fi_fabric` → the objects' operation tables), so no
//!   call here can run without the library.

use std::ffi::{CStr, CString};
use std::mem::ManuallyDrop;
use std::ptr::{self, addr_of_mut, NonNull};
use std::sync::Arc;

use libfabric_sys as sys;

use crate::domain::RecvBuffer;
use crate::region::{Region, RegionGuard};
use crate::topology::PciAddr;

/// A failed libfabric call: its name and the (positive) error number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FiError {
    pub(crate) call: &'static str,
    pub(crate) errno: i32,
}

impl FiError {
    /// `fi_strerror`'s text for the error number.
    pub(crate) fn text(&self) -> String {
        strerror(self.errno)
    }

    pub(crate) fn is_eagain(&self) -> bool {
        self.errno == eagain()
    }
}

/// `fi_strerror(errno)` as an owned string. An error number only exists
/// once a call into the loaded library failed, so the library is there.
pub(crate) fn strerror(errno: i32) -> String {
    match sys::lib() {
        Ok(lib) => lib.strerror(errno),
        Err(_) => format!("error {errno}"),
    }
}

fn eagain() -> i32 {
    sys::FI_EAGAIN
}

fn eavail() -> i32 {
    sys::FI_EAVAIL
}

/// Turns a libfabric return code (negative error number on failure) into a
/// result.
fn check(call: &'static str, rc: isize) -> Result<usize, FiError> {
    if rc < 0 {
        Err(FiError {
            call,
            errno: i32::try_from(-rc).unwrap_or(i32::MAX),
        })
    } else {
        Ok(rc as usize)
    }
}

/// What the domain asks of `fi_getinfo`.
pub(crate) struct Hints<'a> {
    pub(crate) provider: &'a str,
    pub(crate) node: Option<&'a str>,
    pub(crate) service: Option<&'a str>,
    /// Ask for `FI_DELIVERY_COMPLETE` support (a provider that cannot give
    /// it then matches nothing).
    pub(crate) delivery_complete: bool,
    /// Ask for tagged messages too (`FI_TAGGED`: the paged-by-message
    /// path's own channel, apart from the engine's messages).
    pub(crate) tagged: bool,
}

/// What the chosen provider grants (read from the returned `fi_info`).
#[derive(Clone, Debug)]
pub(crate) struct Granted {
    pub(crate) provider: String,
    /// The API version `fi_getinfo` was asked for.
    pub(crate) api_version: u32,
    pub(crate) mr_mode: u64,
    pub(crate) mr_key_size: usize,
    pub(crate) msg_order: u64,
    /// What bounds ordering and immediates (see `efa::Claims`).
    pub(crate) order: super::efa::OrderAttrs,
    pub(crate) manual_progress: bool,
    /// Whether writes may ask for `FI_DELIVERY_COMPLETE`: their completion
    /// then means the data is visible in the target's memory.
    pub(crate) delivery_complete: bool,
    /// The endpoint speaks the shared-memory protocol (`FI_PROTO_SHM`):
    /// in-process peers work on each other's regions directly.
    pub(crate) shared_memory: bool,
    /// Most pieces one write may chain: local buffers and remote ranges
    /// (the smaller of `tx_attr->iov_limit` and `rma_iov_limit`, at least
    /// 1, at most [`MAX_CHAIN`]).
    pub(crate) chain_limit: usize,
    /// Tagged messages (`FI_TAGGED`) were granted.
    pub(crate) tagged: bool,
}

/// Most pieces one posted write chains (see [`Post::Write`]).
pub(crate) const MAX_CHAIN: usize = 4;

/// An `fi_info` list from `fi_getinfo` of `lib`; a NIC opens from the
/// first entry of its own copy ([`Info::entry`]).
pub(crate) struct Info {
    list: NonNull<sys::fi_info>,
    lib: &'static sys::Lib,
    api_version: u32,
}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: the list came from this library's `fi_getinfo` (or
        // `fi_allocinfo`) and is freed only here.
        unsafe { self.lib.fi_freeinfo(self.list.as_ptr()) }
    }
}

impl Info {
    /// `fi_getinfo` for an RDM endpoint with messages, RMA, atomics and
    /// remote CQ data on `hints.provider`, at the highest API version the
    /// library serves (its `fi_version()`, 1.17 at least; EFA uses the
    /// device's RDMA only from 1.18). Every field read is one 1.17 has at
    /// the same place, so the same code serves every version.
    pub(crate) fn get(lib: &'static sys::Lib, h: &Hints<'_>) -> Result<Info, FiError> {
        let api_version = lib.version();
        let cstr = |s: &str, call| {
            CString::new(s).map_err(|_| FiError {
                call,
                errno: libc::EINVAL,
            })
        };
        let prov = cstr(h.provider, "fi_getinfo (provider name)")?;
        let node = h.node.map(|n| cstr(n, "fi_getinfo (node)")).transpose()?;
        let service = h
            .service
            .map(|s| cstr(s, "fi_getinfo (service)"))
            .transpose()?;
        let hints = NonNull::new(lib.fi_allocinfo()).ok_or(FiError {
            call: "fi_allocinfo",
            errno: libc::ENOMEM,
        })?;
        let hints = Info {
            list: hints,
            lib,
            api_version,
        };
        let hp = hints.list.as_ptr();
        // The MR mode bits lie below bit 31, so they fit the C `int`.
        let mr_mode = (sys::FI_MR_LOCAL
            | sys::FI_MR_VIRT_ADDR
            | sys::FI_MR_ALLOCATED
            | sys::FI_MR_PROV_KEY
            | sys::FI_MR_ENDPOINT) as libc::c_int;
        // SAFETY: `hp` and its attribute pointers were allocated by
        // `fi_allocinfo`; `prov_name` must be malloc'ed because
        // `fi_freeinfo` frees it, hence `strdup`.
        unsafe {
            (*hp).caps = sys::FI_MSG
                | sys::FI_RMA
                | sys::FI_ATOMIC
                | sys::FI_READ
                | sys::FI_WRITE
                | sys::FI_SEND
                | sys::FI_RECV
                | sys::FI_REMOTE_READ
                | sys::FI_REMOTE_WRITE;
            if h.tagged {
                (*hp).caps |= sys::FI_TAGGED;
            }
            (*hp).mode = sys::FI_CONTEXT | sys::FI_CONTEXT2;
            (*(*hp).ep_attr).type_ = sys::FI_EP_RDM;
            (*(*hp).domain_attr).mr_mode = mr_mode;
            (*(*hp).domain_attr).threading = sys::FI_THREAD_SAFE;
            if h.delivery_complete {
                (*(*hp).tx_attr).op_flags = sys::FI_DELIVERY_COMPLETE;
            }
            (*(*hp).fabric_attr).prov_name = libc::strdup(prov.as_ptr());
        }
        let mut out: *mut sys::fi_info = ptr::null_mut();
        // SAFETY: all pointers are valid for the call; `out` receives a list
        // we own (freed by `Info::drop`).
        let rc = unsafe {
            lib.fi_getinfo(
                api_version,
                node.as_ref().map_or(ptr::null(), |n| n.as_ptr()),
                service.as_ref().map_or(ptr::null(), |s| s.as_ptr()),
                0,
                hp,
                &mut out,
            )
        };
        check("fi_getinfo", rc as isize)?;
        let list = NonNull::new(out).ok_or(FiError {
            call: "fi_getinfo (no matching provider)",
            errno: libc::ENODATA,
        })?;
        Ok(Info {
            list,
            lib,
            api_version,
        })
    }

    /// The library the list came from.
    pub(crate) fn lib(&self) -> &'static sys::Lib {
        self.lib
    }

    /// The domain name of every entry of the list, in its order (a
    /// provider lists one domain per device: an EFA device, a verbs
    /// device, a network interface; some several times).
    pub(crate) fn domain_names(&self) -> Vec<String> {
        let mut v = Vec::new();
        let mut p: *const sys::fi_info = self.list.as_ptr();
        while !p.is_null() {
            // SAFETY: every entry of a list from `fi_getinfo` has a
            // non-null `domain_attr`, whose name is null or NUL-terminated;
            // `next` is null or the next valid entry.
            unsafe {
                let name = (*(*p).domain_attr).name;
                v.push(if name.is_null() {
                    String::new()
                } else {
                    CStr::from_ptr(name).to_string_lossy().into_owned()
                });
                p = (*p).next;
            }
        }
        v
    }

    /// The PCI address of every entry's NIC, where the provider gives it
    /// (`fi_info->nic->bus_attr`, a PCI bus), in the list's order.
    pub(crate) fn pci_addresses(&self) -> Vec<Option<PciAddr>> {
        let mut v = Vec::new();
        let mut p: *const sys::fi_info = self.list.as_ptr();
        while !p.is_null() {
            // SAFETY: as in `domain_names`; `nic` and its `bus_attr` are
            // null or valid attributes the provider filled in.
            unsafe {
                let nic = (*p).nic;
                let bus = if nic.is_null() {
                    ptr::null()
                } else {
                    (*nic).bus_attr.cast_const()
                };
                v.push(match bus.as_ref() {
                    Some(b) if b.bus_type == sys::FI_BUS_PCI => Some(PciAddr {
                        domain: u32::from(b.attr.domain_id),
                        bus: b.attr.bus_id,
                        device: b.attr.device_id,
                        function: b.attr.function_id,
                    }),
                    _ => None,
                });
                p = (*p).next;
            }
        }
        v
    }

    /// A list of one: a copy of entry `index` (`fi_dupinfo`), which the
    /// fabric, domain and endpoint of one NIC are opened from.
    pub(crate) fn entry(&self, index: usize) -> Result<Info, FiError> {
        let mut p: *const sys::fi_info = self.list.as_ptr();
        for _ in 0..index {
            // SAFETY: as in `domain_names`.
            p = unsafe { (*p).next };
            if p.is_null() {
                return Err(FiError {
                    call: "fi_dupinfo (no such entry)",
                    errno: libc::ENODATA,
                });
            }
        }
        // SAFETY: `p` is a valid entry of our list; the copy (without the
        // rest of the list) is ours, freed by `Info::drop`.
        let dup = unsafe { self.lib.fi_dupinfo(p) };
        let list = NonNull::new(dup).ok_or(FiError {
            call: "fi_dupinfo",
            errno: libc::ENOMEM,
        })?;
        Ok(Info {
            list,
            lib: self.lib,
            api_version: self.api_version,
        })
    }

    pub(crate) fn granted(&self) -> Granted {
        let p = self.list.as_ptr();
        // SAFETY: a non-null `fi_info` from `fi_getinfo` has non-null
        // attribute structs (transmit, receive, endpoint, domain, fabric)
        // and a NUL-terminated provider name.
        unsafe {
            let d = &*(*p).domain_attr;
            let f = &*(*p).fabric_attr;
            let (tx, rx, ep) = (&*(*p).tx_attr, &*(*p).rx_attr, &*(*p).ep_attr);
            let provider = if f.prov_name.is_null() {
                String::new()
            } else {
                CStr::from_ptr(f.prov_name).to_string_lossy().into_owned()
            };
            Granted {
                provider,
                api_version: self.api_version,
                mr_mode: u64::from(d.mr_mode as u32),
                mr_key_size: d.mr_key_size,
                msg_order: tx.msg_order,
                order: super::efa::OrderAttrs {
                    tx_msg_order: tx.msg_order,
                    rx_msg_order: rx.msg_order,
                    max_msg_size: ep.max_msg_size,
                    max_order_raw_size: ep.max_order_raw_size,
                    max_order_war_size: ep.max_order_war_size,
                    max_order_waw_size: ep.max_order_waw_size,
                    cq_data_size: d.cq_data_size,
                    inject_size: tx.inject_size,
                },
                manual_progress: d.data_progress == sys::FI_PROGRESS_MANUAL,
                delivery_complete: (*(*p).tx_attr).op_flags & sys::FI_DELIVERY_COMPLETE != 0,
                shared_memory: (*(*p).ep_attr).protocol == sys::FI_PROTO_SHM,
                chain_limit: {
                    let t = &*(*p).tx_attr;
                    t.iov_limit.min(t.rma_iov_limit).clamp(1, MAX_CHAIN)
                },
                tagged: (*p).caps & sys::FI_TAGGED != 0,
            }
        }
    }

    /// Clears the default transmit flags before the endpoint is opened:
    /// operations keep the provider's default completion, and writes ask
    /// for delivery completion one by one (see [`Post::Write`]).
    pub(crate) fn clear_tx_op_flags(&mut self) {
        // SAFETY: a valid `fi_info` we own, with a non-null `tx_attr`.
        unsafe { (*(*self.list.as_ptr()).tx_attr).op_flags = 0 }
    }
}

/// `fid_fabric`.
pub(crate) struct Fabric(NonNull<sys::fid_fabric>);
/// `fid_domain`.
pub(crate) struct DomainH(NonNull<sys::fid_domain>);
/// `fid_cq` (data-format entries).
pub(crate) struct Cq(NonNull<sys::fid_cq>);
/// `fid_av` (table).
pub(crate) struct Av(NonNull<sys::fid_av>);
/// `fid_ep` (RDM).
pub(crate) struct Ep(NonNull<sys::fid_ep>);
/// `fid_mr`.
pub(crate) struct Mr(NonNull<sys::fid_mr>);

macro_rules! closes {
    ($($t:ident, $field:ident;)*) => {$(
        impl Drop for $t {
            fn drop(&mut self) {
                // SAFETY: the handle is open and owned by `self`; nothing
                // uses it after this (children were closed first, see the
                // module docs). A failure cannot be acted on in drop.
                let _ = unsafe { sys::fi_close(addr_of_mut!((*self.0.as_ptr()).$field)) };
            }
        }
        // SAFETY: the domain is opened with FI_THREAD_SAFE, so libfabric
        // serialises calls on the object from any thread; the handle itself
        // is a pointer with no thread affinity.
        unsafe impl Send for $t {}
        // SAFETY: as for `Send`.
        unsafe impl Sync for $t {}
    )*};
}

closes! {
    Fabric, fid;
    DomainH, fid;
    Cq, fid;
    Av, fid;
    Ep, fid;
    Mr, fid;
}

// SAFETY: the `fi_info` is read-only after `fi_getinfo`; libfabric reads it
// from any thread when opening objects.
unsafe impl Send for Info {}
// SAFETY: as for `Send`.
unsafe impl Sync for Info {}

fn open<T>(call: &'static str, f: impl FnOnce(*mut *mut T) -> i32) -> Result<NonNull<T>, FiError> {
    let mut p: *mut T = ptr::null_mut();
    check(call, f(&mut p) as isize)?;
    NonNull::new(p).ok_or(FiError {
        call,
        errno: libc::EINVAL,
    })
}

impl Fabric {
    pub(crate) fn open(info: &Info) -> Result<Fabric, FiError> {
        // SAFETY: `fabric_attr` of a valid info of the same library; the
        // out-pointer is valid.
        open("fi_fabric", |p| unsafe {
            info.lib
                .fi_fabric((*info.list.as_ptr()).fabric_attr, p, ptr::null_mut())
        })
        .map(Fabric)
    }

    /// The API version the fabric was opened with (what `fi_getinfo` was
    /// asked for, as the library recorded it).
    pub(crate) fn api_version(&self) -> u32 {
        // SAFETY: an open fabric; `api_version` is a plain field of it.
        unsafe { (*self.0.as_ptr()).api_version }
    }
}

impl DomainH {
    pub(crate) fn open(fabric: &Fabric, info: &Info) -> Result<DomainH, FiError> {
        // SAFETY: valid fabric and info; the out-pointer is valid.
        open("fi_domain", |p| unsafe {
            sys::fi_domain(fabric.0.as_ptr(), info.list.as_ptr(), p, ptr::null_mut())
        })
        .map(DomainH)
    }

    /// `fi_mr_reg` of `[addr, addr + len)` with `access` and, for
    /// application-chosen keys, `key`.
    ///
    /// The memory must stay valid until the returned [`Mr`] is dropped;
    /// callers guarantee it by holding the region (see `PinnedRegion`) or
    /// the buffer next to the `Mr`.
    pub(crate) fn reg(&self, addr: u64, len: u64, access: u64, key: u64) -> Result<Mr, FiError> {
        // SAFETY: registration only records the range; the provider touches
        // it later, while the owner keeps it alive (see above).
        open("fi_mr_reg", |p| unsafe {
            sys::fi_mr_reg(
                self.0.as_ptr(),
                addr as *const libc::c_void,
                len as usize,
                access,
                0,
                key,
                0,
                p,
                ptr::null_mut(),
            )
        })
        .map(Mr)
    }
}

/// The wait object a queue is opened with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitObj {
    /// None (`FI_WAIT_NONE`): the queue is read on a schedule.
    None,
    /// A file descriptor (`FI_WAIT_FD`, see [`Cq::wait_fd`]).
    Fd,
    /// The provider's choice, reached only through `fi_cq_sread`
    /// (`FI_WAIT_UNSPEC`, see [`Sread`]).
    Unspec,
}

impl Cq {
    /// Opens a data-format queue of `size` entries with `wait` as its
    /// wait object.
    pub(crate) fn open(dom: &DomainH, size: usize, wait: WaitObj) -> Result<Cq, FiError> {
        let mut attr = sys::Padded::new(sys::fi_cq_attr {
            size,
            format: sys::FI_CQ_FORMAT_DATA,
            wait_obj: match wait {
                WaitObj::None => sys::FI_WAIT_NONE,
                WaitObj::Fd => sys::FI_WAIT_FD,
                WaitObj::Unspec => sys::FI_WAIT_UNSPEC,
            },
            ..Default::default()
        });
        // SAFETY: valid domain and attribute struct (padded for fields a
        // newer API version appends); valid out-pointer.
        open("fi_cq_open", |p| unsafe {
            sys::fi_cq_open(dom.0.as_ptr(), attr.as_mut_ptr(), p, ptr::null_mut())
        })
        .map(Cq)
    }
}

impl Cq {
    /// The file descriptor of a queue opened with `FI_WAIT_FD`
    /// (`fi_control(FI_GETWAIT)`): readable (or marked) when the provider
    /// has something to progress, once [`TryWait::may_block`] said so.
    pub(crate) fn wait_fd(&self) -> Result<libc::c_int, FiError> {
        let mut fd: libc::c_int = -1;
        // SAFETY: an open queue; for an FD wait object `FI_GETWAIT` writes
        // one `int` to `arg`.
        let rc = unsafe {
            sys::fi_control(
                addr_of_mut!((*self.0.as_ptr()).fid),
                sys::FI_GETWAIT,
                &mut fd as *mut libc::c_int as *mut libc::c_void,
            )
        };
        check("fi_control (FI_GETWAIT)", rc as isize)?;
        if fd < 0 {
            return Err(einval("fi_control (FI_GETWAIT)"));
        }
        Ok(fd)
    }
}

/// A queue opened with a wait object, for `fi_cq_sread` from the waiter
/// thread, which borrows it without owning it (as [`TryWait`]).
#[derive(Clone, Copy)]
pub(crate) struct Sread {
    cq: NonNull<sys::fid_cq>,
}

// SAFETY: a plain pointer to a queue of an `FI_THREAD_SAFE` domain, which
// libfabric lets any thread use; its lifetime is the user's contract.
unsafe impl Send for Sread {}
// SAFETY: as for `Send` (`fi_cq_sread`, `fi_cq_signal` are thread-safe
// on such a domain).
unsafe impl Sync for Sread {}

impl Sread {
    pub(crate) fn new(cq: &Cq) -> Sread {
        Sread { cq: cq.0 }
    }

    /// `fi_cq_sread`: blocks until the queue has entries, `timeout_ms`
    /// passed or [`Sread::signal`] woke it, and moves what it read into
    /// `out` (a read drives progress, as [`Cq::read`]). `Ok(0)` when woken
    /// or timed out, and for an error entry (left for the next
    /// [`Cq::read`], which reads error entries).
    ///
    /// # Safety
    /// The queue must still be open.
    pub(crate) unsafe fn sread(
        &self,
        out: &mut Vec<CqEvent>,
        timeout_ms: libc::c_int,
    ) -> Result<usize, FiError> {
        let mut entries = [sys::fi_cq_data_entry::default(); 16];
        // SAFETY: an open queue with a wait object (the caller's
        // contract); `entries` is writable for 16 data-format entries.
        let n = unsafe {
            sys::fi_cq_sread(
                self.cq.as_ptr(),
                entries.as_mut_ptr() as *mut libc::c_void,
                entries.len(),
                ptr::null(),
                timeout_ms,
            )
        };
        if n == -(eagain() as isize) || n == -(eavail() as isize) {
            return Ok(0);
        }
        let n = check("fi_cq_sread", n)?;
        // SAFETY: the provider wrote `n` entries of ours.
        unsafe { events_of(&entries[..n], out) };
        Ok(n)
    }

    /// `fi_cq_signal`: wakes a thread blocked in [`Sread::sread`].
    ///
    /// # Safety
    /// The queue must still be open.
    pub(crate) unsafe fn signal(&self) {
        // SAFETY: an open queue (the caller's contract). A failure only
        // leaves the sleeper to its timeout.
        let _ = unsafe { sys::fi_cq_signal(self.cq.as_ptr()) };
    }
}

/// What `fi_trywait` needs to ask whether a queue's wait object may be
/// blocked on: its fabric and the queue, as raw pointers for the waiter
/// thread (see `waiter`), which borrows them without owning them.
#[derive(Clone, Copy)]
pub(crate) struct TryWait {
    fabric: NonNull<sys::fid_fabric>,
    cq: NonNull<sys::fid_cq>,
}

// SAFETY: plain pointers to objects of an `FI_THREAD_SAFE` domain, which
// libfabric lets any thread use; their lifetime is the user's contract
// (`TryWait::may_block`).
unsafe impl Send for TryWait {}
// SAFETY: as for `Send`: the calls made through it (`fi_trywait`,
// `fi_cq_signal`) are thread-safe on such a domain.
unsafe impl Sync for TryWait {}

impl TryWait {
    pub(crate) fn new(fabric: &Fabric, cq: &Cq) -> TryWait {
        TryWait {
            fabric: fabric.0,
            cq: cq.0,
        }
    }

    /// `fi_trywait` on the queue: `Ok(true)` when blocking on its wait
    /// object is safe, `Ok(false)` when events are queued (`-FI_EAGAIN`:
    /// read the queue first).
    ///
    /// # Safety
    /// The fabric and the queue this was made from must still be open.
    pub(crate) unsafe fn may_block(&self) -> Result<bool, FiError> {
        let mut fids = [
            // SAFETY: the queue is open (the caller's contract).
            unsafe { addr_of_mut!((*self.cq.as_ptr()).fid) },
        ];
        // SAFETY: an open fabric and an array of one open fid.
        let rc = unsafe { sys::fi_trywait(self.fabric.as_ptr(), fids.as_mut_ptr(), 1) };
        if rc == -eagain() {
            return Ok(false);
        }
        check("fi_trywait", rc as isize).map(|_| true)
    }

    /// `fi_cq_signal`: makes the queue's wait object readable, waking a
    /// thread blocked on it.
    ///
    /// # Safety
    /// The queue this was made from must still be open.
    pub(crate) unsafe fn signal(&self) {
        // SAFETY: an open queue (the caller's contract). A failure only
        // leaves the sleeper to its timeout.
        let _ = unsafe { sys::fi_cq_signal(self.cq.as_ptr()) };
    }
}

impl Av {
    pub(crate) fn open(dom: &DomainH) -> Result<Av, FiError> {
        let mut attr = sys::Padded::new(sys::fi_av_attr {
            type_: sys::FI_AV_TABLE,
            ..Default::default()
        });
        // SAFETY: valid domain and attribute struct (padded as for the
        // queue's); valid out-pointer.
        open("fi_av_open", |p| unsafe {
            sys::fi_av_open(dom.0.as_ptr(), attr.as_mut_ptr(), p, ptr::null_mut())
        })
        .map(Av)
    }

    /// `fi_av_insert` of one raw address (at most [`MAX_ADDR`] bytes).
    pub(crate) fn insert(&self, addr: &[u8]) -> Result<u64, FiError> {
        // Providers read their own address length from the pointer, and
        // some addresses (shm's names) vary in length: pass a zero-padded
        // buffer longer than any provider's address.
        let mut buf = [0u8; MAX_ADDR + 1];
        if addr.len() > MAX_ADDR {
            return Err(einval("fi_av_insert (address too long)"));
        }
        buf[..addr.len()].copy_from_slice(addr);
        let mut out: u64 = 0;
        // SAFETY: `buf` is readable for more bytes than any provider's
        // address; `out` receives one `fi_addr_t`.
        let n = unsafe {
            sys::fi_av_insert(
                self.0.as_ptr(),
                buf.as_ptr() as *const libc::c_void,
                1,
                &mut out,
                0,
                ptr::null_mut(),
            )
        };
        if check("fi_av_insert", n as isize)? != 1 {
            return Err(einval("fi_av_insert"));
        }
        Ok(out)
    }
}

/// The longest endpoint address handled (a `NetAddr` holds 64 bytes).
pub(crate) const MAX_ADDR: usize = 256;

impl Ep {
    /// Opens an endpoint, binds `cq` (transmit and receive) and `av`, and
    /// enables it. With `nic_only` it first asks the provider to reach
    /// peers on the same host through the NIC too, not shared memory
    /// ([`Ep::forbid_shared_memory`]); the `bool` says whether the
    /// provider agreed.
    pub(crate) fn open(
        dom: &DomainH,
        info: &Info,
        cq: &Cq,
        av: &Av,
        nic_only: bool,
    ) -> Result<(Ep, bool), FiError> {
        // SAFETY: valid domain and info; valid out-pointer.
        let ep = Ep(open("fi_endpoint", |p| unsafe {
            sys::fi_endpoint(dom.0.as_ptr(), info.list.as_ptr(), p, ptr::null_mut())
        })?);
        let forbidden = nic_only && ep.forbid_shared_memory()?;
        // SAFETY: `ep`, `cq` and `av` are open objects of the same domain.
        unsafe {
            check(
                "fi_ep_bind (cq)",
                sys::fi_ep_bind(
                    ep.0.as_ptr(),
                    addr_of_mut!((*cq.0.as_ptr()).fid),
                    sys::FI_TRANSMIT | sys::FI_RECV,
                ) as isize,
            )?;
            check(
                "fi_ep_bind (av)",
                sys::fi_ep_bind(ep.0.as_ptr(), addr_of_mut!((*av.0.as_ptr()).fid), 0) as isize,
            )?;
            check("fi_enable", sys::fi_enable(ep.0.as_ptr()) as isize)?;
        }
        Ok((ep, forbidden))
    }

    /// `fi_setopt(FI_OPT_SHARED_MEMORY_PERMITTED, false)` on an endpoint
    /// not yet enabled (API 1.18 and newer): same-host peers are then
    /// reached through the NIC, as remote ones are (EFA otherwise hands
    /// them to its `shm` peer provider). `Ok(false)` where the provider
    /// has no such option (`-FI_ENOPROTOOPT`, or no `setopt` at all).
    fn forbid_shared_memory(&self) -> Result<bool, FiError> {
        let permitted = false;
        // SAFETY: an open endpoint not yet enabled; the option's value is
        // a C `bool`, which Rust's `bool` matches in size and values.
        let rc = unsafe {
            sys::fi_setopt(
                addr_of_mut!((*self.0.as_ptr()).fid),
                sys::FI_OPT_ENDPOINT,
                sys::FI_OPT_SHARED_MEMORY_PERMITTED,
                &permitted as *const bool as *const libc::c_void,
                std::mem::size_of::<bool>(),
            )
        };
        match rc {
            0 => Ok(true),
            rc if rc == -sys::FI_ENOPROTOOPT || rc == -sys::FI_ENOSYS => Ok(false),
            rc => check("fi_setopt (FI_OPT_SHARED_MEMORY_PERMITTED)", rc as isize).map(|_| true),
        }
    }

    /// The endpoint's raw address (`fi_getname`).
    pub(crate) fn name(&self) -> Result<Vec<u8>, FiError> {
        let mut buf = vec![0u8; MAX_ADDR];
        let mut len = buf.len();
        // SAFETY: `buf` is writable for `len` bytes; `len` is updated with
        // the address length.
        let rc = unsafe {
            sys::fi_getname(
                addr_of_mut!((*self.0.as_ptr()).fid),
                buf.as_mut_ptr() as *mut libc::c_void,
                &mut len,
            )
        };
        check("fi_getname", rc as isize)?;
        buf.truncate(len);
        Ok(buf)
    }
}

impl Mr {
    pub(crate) fn key(&self) -> u64 {
        // SAFETY: an open memory region.
        unsafe { sys::fi_mr_key(self.0.as_ptr()) }
    }

    pub(crate) fn desc(&self) -> *mut libc::c_void {
        // SAFETY: an open memory region.
        unsafe { sys::fi_mr_desc(self.0.as_ptr()) }
    }

    /// `fi_mr_bind` to the endpoint and `fi_mr_enable` (FI_MR_ENDPOINT).
    pub(crate) fn bind_enable(&self, ep: &Ep) -> Result<(), FiError> {
        // SAFETY: open region and endpoint of the same domain.
        unsafe {
            check(
                "fi_mr_bind",
                sys::fi_mr_bind(self.0.as_ptr(), addr_of_mut!((*ep.0.as_ptr()).fid), 0) as isize,
            )?;
            check("fi_mr_enable", sys::fi_mr_enable(self.0.as_ptr()) as isize)?;
        }
        Ok(())
    }
}

/// A region kept alive and pinned (its guard held) while the provider may
/// touch it: deregistration waits for the guard, so the memory outlives
/// the operation.
pub(crate) struct PinnedRegion {
    guard: ManuallyDrop<RegionGuard<'static>>,
    region: Arc<Region>,
}

impl PinnedRegion {
    /// Pins `region`; `None` once it is deregistered.
    pub(crate) fn new(region: Arc<Region>) -> Option<PinnedRegion> {
        let guard = region.enter()?;
        // SAFETY: the guard borrows the `Region` inside `region`'s `Arc`,
        // which this struct keeps alive at a stable heap address for at
        // least as long as the guard (the guard is dropped first, in
        // `Drop`), so extending the borrow to 'static is sound.
        let guard = unsafe { std::mem::transmute::<RegionGuard<'_>, RegionGuard<'static>>(guard) };
        Some(PinnedRegion {
            guard: ManuallyDrop::new(guard),
            region,
        })
    }

    /// Address of byte `offset` if `[offset, offset + len)` is inside.
    pub(crate) fn ptr(&self, offset: u64, len: u64) -> Option<u64> {
        let end = offset.checked_add(len)?;
        (end <= self.region.len()).then(|| self.region.addr() + offset)
    }
}

impl Drop for PinnedRegion {
    fn drop(&mut self) {
        // SAFETY: dropped exactly once, before `region` (field drop runs
        // after this body).
        unsafe { ManuallyDrop::drop(&mut self.guard) }
    }
}

/// What a posted operation is.
pub(crate) enum CtxKind {
    /// A local operation: the endpoint's sequence number of it.
    Op(u64),
    /// A posted receive.
    Recv(Option<RecvBuffer>),
    /// A posted tagged receive of the paged-by-message path, into the
    /// context's `bytes` (module `paged`).
    PagedRecv,
}

/// Everything one posted operation owns (see the module docs).
#[repr(C)]
pub(crate) struct OpCtx {
    /// First field: the provider's scratch space (FI_CONTEXT/FI_CONTEXT2).
    fi: sys::fi_context2,
    pub(crate) kind: CtxKind,
    /// Operand, compare and result words of an atomic.
    pub(crate) words: [u64; 3],
    /// The pieces of a chained write (see [`Post::WriteChain`]).
    pub(crate) chain: [(u64, u64, u64); MAX_CHAIN],
    pub(crate) pinned: Option<PinnedRegion>,
    pub(crate) bytes: Vec<u8>,
    /// A slot of a pre-registered bounce pool standing in for `words`,
    /// `bytes` or the receive buffer (FI_MR_LOCAL; module `bounce`): the
    /// provider is given the slot and its pool's descriptor.
    pub(crate) bounce: Option<super::bounce::Lease<Mr>>,
    /// Registrations made for this operation only (FI_MR_LOCAL, buffers
    /// larger than a bounce slot).
    pub(crate) mrs: Vec<Mr>,
}

// SAFETY: `fi` is scratch space only the provider reads and writes, while
// it owns the context (between a post and its completion, during which no
// Rust code touches the context); everything else in it is `Send`.
unsafe impl Send for OpCtx {}

impl OpCtx {
    pub(crate) fn new(kind: CtxKind) -> Box<OpCtx> {
        Box::new(OpCtx {
            fi: Default::default(),
            kind,
            words: [0; 3],
            chain: [(0, 0, 0); MAX_CHAIN],
            pinned: None,
            bytes: Vec::new(),
            bounce: None,
            mrs: Vec::new(),
        })
    }

    /// An atomic's result word: in the bounce slot when it has one.
    pub(crate) fn result_word(&self) -> u64 {
        match &self.bounce {
            Some(l) => l.word(2),
            None => self.words[2],
        }
    }

    /// The atomic words' address and descriptor: the bounce slot's when
    /// it has one, else the context's own with `desc`.
    fn words_at(&mut self, desc: usize) -> (*mut u64, *mut libc::c_void) {
        match &self.bounce {
            Some(l) => (l.addr() as *mut u64, l.desc() as *mut libc::c_void),
            None => (self.words.as_mut_ptr(), desc as *mut libc::c_void),
        }
    }

    /// A message's buffer and descriptor: the bounce slot's when it has
    /// one (`len` bytes of it), else `own` with `desc`.
    fn buffer_at(&self, own: *mut u8, desc: usize) -> (*mut libc::c_void, *mut libc::c_void) {
        match &self.bounce {
            Some(l) => (l.addr() as *mut libc::c_void, l.desc() as *mut libc::c_void),
            None => (own as *mut libc::c_void, desc as *mut libc::c_void),
        }
    }
}

/// An in-flight operation's context, owned by the provider until its
/// completion is read (or the endpoint is closed).
pub(crate) struct Leaked(NonNull<OpCtx>);

// SAFETY: the context is only touched by whoever holds the `Leaked`
// (the domain, under its lock) or the provider; its contents are `Send`.
unsafe impl Send for Leaked {}

impl Leaked {
    /// Takes the context back.
    ///
    /// # Safety
    /// The provider must be done with it: its completion was read, or the
    /// endpoint it was posted on is closed.
    pub(crate) unsafe fn reclaim(self) -> Box<OpCtx> {
        // SAFETY: the pointer came from `Box::into_raw` in `Ep::post` and
        // is reclaimed once (the caller's contract).
        unsafe { Box::from_raw(self.0.as_ptr()) }
    }

    pub(crate) fn addr(&self) -> usize {
        self.0.as_ptr() as usize
    }
}

/// Where an RMA or atomic goes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Target {
    pub(crate) fi_addr: u64,
    /// Address as the provider wants it (virtual or offset).
    pub(crate) addr: u64,
    pub(crate) key: u64,
}

/// One operation to post; local buffers are those owned by the context.
pub(crate) enum Post {
    /// `fi_write`/`fi_writedata` from the pinned region at `offset` (or
    /// nothing for `len == 0`); with `deliver`, `fi_writemsg` with
    /// `FI_DELIVERY_COMPLETE`, so the completion means the data is visible
    /// at the target.
    Write {
        offset: u64,
        len: u64,
        desc: usize,
        to: Target,
        imm: Option<u32>,
        deliver: bool,
    },
    /// Several pieces of the pinned region (the context's `chain`:
    /// `(offset, len, remote address)`, the first `n`) to as many remote
    /// ranges of one peer and key, as one `fi_writemsg` with one local
    /// buffer and one remote range per piece: one message, one
    /// acknowledgement and one completion for all of them. No immediate
    /// (each piece of a paged write delivers its own).
    WriteChain {
        n: usize,
        desc: usize,
        to: Target,
        deliver: bool,
    },
    /// Several reads into the pinned region (the context's `chain`:
    /// `(offset, len, remote address)`, the first `n`) from as many remote
    /// ranges of one peer and key, as one `fi_readmsg` with one local
    /// buffer and one remote range per piece: one request and one
    /// response on software providers (`tcp`: a read costs a message each
    /// way, a few µs of the kernel's loopback path apiece here), one
    /// completion for all of them.
    ReadChain { n: usize, desc: usize, from: Target },
    /// `fi_read` into the pinned region at `offset`.
    Read {
        offset: u64,
        len: u64,
        desc: usize,
        from: Target,
    },
    /// `fi_compare_atomic` (FI_CSWAP, FI_UINT64): `words = [new, expected,
    /// result]`.
    Cas { desc: usize, to: Target },
    /// `fi_fetch_atomic` (FI_SUM, FI_UINT64): `words = [add, _, result]`.
    Faa { desc: usize, to: Target },
    /// `fi_send` of the context's bytes.
    Send { desc: usize, fi_addr: u64 },
    /// `fi_recv` into the context's receive buffer.
    Recv { desc: usize },
    /// `fi_tsend` of the context's bytes with `tag` (the paged-by-message
    /// path, module `paged`).
    TSend { desc: usize, fi_addr: u64, tag: u64 },
    /// `fi_trecv` into the context's bytes (all of them), matching `tag`
    /// except the bits of `ignore`.
    TRecv { tag: u64, ignore: u64 },
}

impl Post {
    /// The address-vector entry of the peer the operation goes to
    /// (`FI_ADDR_UNSPEC` for a receive, which takes from any).
    pub(crate) fn fi_addr(&self) -> u64 {
        match *self {
            Post::Write { to, .. }
            | Post::WriteChain { to, .. }
            | Post::Cas { to, .. }
            | Post::Faa { to, .. } => to.fi_addr,
            Post::Read { from, .. } | Post::ReadChain { from, .. } => from.fi_addr,
            Post::Send { fi_addr, .. } | Post::TSend { fi_addr, .. } => fi_addr,
            Post::Recv { .. } | Post::TRecv { .. } => sys::FI_ADDR_UNSPEC,
        }
    }
}

/// The local buffers and remote ranges of a chained post: the first `n`
/// pieces of `ctx.chain` (at most [`MAX_CHAIN`]), each a range of the
/// context's pinned region and a remote range under `key`. `None` when a
/// piece lies outside the pinned region (or none is pinned).
fn chain_iovs(
    ctx: &OpCtx,
    n: usize,
    key: u64,
) -> Option<(
    [libc::iovec; MAX_CHAIN],
    [sys::fi_rma_iov; MAX_CHAIN],
    usize,
)> {
    let n = n.min(MAX_CHAIN);
    let mut iov = [libc::iovec {
        iov_base: ptr::null_mut(),
        iov_len: 0,
    }; MAX_CHAIN];
    let mut rma = [sys::fi_rma_iov::default(); MAX_CHAIN];
    let pinned = ctx.pinned.as_ref()?;
    for (i, &(offset, len, addr)) in ctx.chain[..n].iter().enumerate() {
        iov[i] = libc::iovec {
            iov_base: pinned.ptr(offset, len)? as *mut libc::c_void,
            iov_len: len as usize,
        };
        rma[i] = sys::fi_rma_iov {
            addr,
            len: len as usize,
            key,
        };
    }
    Some((iov, rma, n))
}

impl Ep {
    /// Posts `op` with `ctx`. On success the context is the provider's
    /// until its completion; on failure (`-FI_EAGAIN` included) it is
    /// handed back untouched.
    pub(crate) fn post(&self, ctx: Box<OpCtx>, op: &Post) -> Result<Leaked, (Box<OpCtx>, FiError)> {
        let raw = Box::into_raw(ctx);
        let ep = self.0.as_ptr();
        let c = raw as *mut libc::c_void;
        // SAFETY: every buffer passed is owned by the context (pinned
        // region range checked by `PinnedRegion::ptr`, the atomic words,
        // the message bytes, the receive buffer, or the bounce slot that
        // stands in for the last three and is at least as large, see
        // `Inner::bounce_in`), which stays allocated
        // until reclaimed after the completion; descriptors are those of
        // registrations alive at least as long (the domain's or the
        // context's own). `raw` is a valid, unique pointer.
        let (rc, call) = unsafe {
            let ctx = &mut *raw;
            match *op {
                Post::Write {
                    offset,
                    len,
                    desc,
                    to,
                    imm,
                    deliver,
                } => {
                    let desc = desc as *mut libc::c_void;
                    let buf = if len == 0 {
                        ptr::null()
                    } else {
                        match ctx.pinned.as_ref().and_then(|p| p.ptr(offset, len)) {
                            Some(a) => a as *const libc::c_void,
                            None => return Err((Box::from_raw(raw), einval("fi_write"))),
                        }
                    };
                    match imm {
                        _ if deliver => {
                            let mut flags = sys::FI_DELIVERY_COMPLETE | sys::FI_COMPLETION;
                            if imm.is_some() {
                                flags |= sys::FI_REMOTE_CQ_DATA;
                            }
                            // One contiguous buffer (none when `len` is 0)
                            // to one remote range; the message structs are
                            // read during the call only.
                            let mut desc = desc;
                            let iov = libc::iovec {
                                iov_base: buf as *mut libc::c_void,
                                iov_len: len as usize,
                            };
                            let rma = sys::fi_rma_iov {
                                addr: to.addr,
                                len: len as usize,
                                key: to.key,
                            };
                            let some = len != 0;
                            let msg = sys::fi_msg_rma {
                                msg_iov: if some { &iov } else { ptr::null() },
                                desc: if some { &mut desc } else { ptr::null_mut() },
                                iov_count: usize::from(some),
                                addr: to.fi_addr,
                                rma_iov: &rma,
                                rma_iov_count: 1,
                                context: c,
                                data: imm.map_or(0, u64::from),
                            };
                            (sys::fi_writemsg(ep, &msg, flags), "fi_writemsg")
                        }
                        Some(d) => (
                            sys::fi_writedata(
                                ep,
                                buf,
                                len as usize,
                                desc,
                                u64::from(d),
                                to.fi_addr,
                                to.addr,
                                to.key,
                                c,
                            ),
                            "fi_writedata",
                        ),
                        None => (
                            sys::fi_write(
                                ep,
                                buf,
                                len as usize,
                                desc,
                                to.fi_addr,
                                to.addr,
                                to.key,
                                c,
                            ),
                            "fi_write",
                        ),
                    }
                }
                Post::WriteChain {
                    n,
                    desc,
                    to,
                    deliver,
                } => {
                    let Some((iov, rma, n)) = chain_iovs(ctx, n, to.key) else {
                        return Err((Box::from_raw(raw), einval("fi_writemsg")));
                    };
                    let mut descs = [desc as *mut libc::c_void; MAX_CHAIN];
                    let mut flags = sys::FI_COMPLETION;
                    if deliver {
                        flags |= sys::FI_DELIVERY_COMPLETE;
                    }
                    // The message structs are read during the call only.
                    let msg = sys::fi_msg_rma {
                        msg_iov: iov.as_ptr(),
                        desc: descs.as_mut_ptr(),
                        iov_count: n,
                        addr: to.fi_addr,
                        rma_iov: rma.as_ptr(),
                        rma_iov_count: n,
                        context: c,
                        data: 0,
                    };
                    (sys::fi_writemsg(ep, &msg, flags), "fi_writemsg")
                }
                Post::ReadChain { n, desc, from } => {
                    let Some((iov, rma, n)) = chain_iovs(ctx, n, from.key) else {
                        return Err((Box::from_raw(raw), einval("fi_readmsg")));
                    };
                    let mut descs = [desc as *mut libc::c_void; MAX_CHAIN];
                    // The message structs are read during the call only.
                    let msg = sys::fi_msg_rma {
                        msg_iov: iov.as_ptr(),
                        desc: descs.as_mut_ptr(),
                        iov_count: n,
                        addr: from.fi_addr,
                        rma_iov: rma.as_ptr(),
                        rma_iov_count: n,
                        context: c,
                        data: 0,
                    };
                    (sys::fi_readmsg(ep, &msg, sys::FI_COMPLETION), "fi_readmsg")
                }
                Post::Read {
                    offset,
                    len,
                    desc,
                    from,
                } => match ctx.pinned.as_ref().and_then(|p| p.ptr(offset, len)) {
                    Some(a) => (
                        sys::fi_read(
                            ep,
                            a as *mut libc::c_void,
                            len as usize,
                            desc as *mut libc::c_void,
                            from.fi_addr,
                            from.addr,
                            from.key,
                            c,
                        ),
                        "fi_read",
                    ),
                    None => return Err((Box::from_raw(raw), einval("fi_read"))),
                },
                Post::Cas { desc, to } => {
                    let (w, desc) = ctx.words_at(desc);
                    (
                        sys::fi_compare_atomic(
                            ep,
                            w as *const libc::c_void,
                            1,
                            desc,
                            w.add(1) as *const libc::c_void,
                            desc,
                            w.add(2) as *mut libc::c_void,
                            desc,
                            to.fi_addr,
                            to.addr,
                            to.key,
                            sys::FI_UINT64,
                            sys::FI_CSWAP,
                            c,
                        ),
                        "fi_compare_atomic",
                    )
                }
                Post::Faa { desc, to } => {
                    let (w, desc) = ctx.words_at(desc);
                    (
                        sys::fi_fetch_atomic(
                            ep,
                            w as *const libc::c_void,
                            1,
                            desc,
                            w.add(2) as *mut libc::c_void,
                            desc,
                            to.fi_addr,
                            to.addr,
                            to.key,
                            sys::FI_UINT64,
                            sys::FI_SUM,
                            c,
                        ),
                        "fi_fetch_atomic",
                    )
                }
                Post::Send { desc, fi_addr } => {
                    let (buf, desc) = ctx.buffer_at(ctx.bytes.as_ptr() as *mut u8, desc);
                    (
                        sys::fi_send(ep, buf, ctx.bytes.len(), desc, fi_addr, c),
                        "fi_send",
                    )
                }
                Post::TSend { desc, fi_addr, tag } => (
                    sys::fi_tsend(
                        ep,
                        ctx.bytes.as_ptr() as *const libc::c_void,
                        ctx.bytes.len(),
                        desc as *mut libc::c_void,
                        fi_addr,
                        tag,
                        c,
                    ),
                    "fi_tsend",
                ),
                Post::TRecv { tag, ignore } => (
                    sys::fi_trecv(
                        ep,
                        ctx.bytes.as_mut_ptr() as *mut libc::c_void,
                        ctx.bytes.len(),
                        ptr::null_mut(),
                        sys::FI_ADDR_UNSPEC,
                        tag,
                        ignore,
                        c,
                    ),
                    "fi_trecv",
                ),
                Post::Recv { desc } => {
                    let own = match &mut ctx.kind {
                        CtxKind::Recv(Some(b)) => Some((b.data.as_mut_ptr(), b.data.len())),
                        _ => None,
                    };
                    match own {
                        Some((own, len)) => {
                            let (buf, desc) = ctx.buffer_at(own, desc);
                            (
                                sys::fi_recv(ep, buf, len, desc, sys::FI_ADDR_UNSPEC, c),
                                "fi_recv",
                            )
                        }
                        None => (-(libc::EINVAL as isize), "fi_recv"),
                    }
                }
            }
        };
        match check(call, rc) {
            // SAFETY: `raw` is non-null (from `Box::into_raw`).
            Ok(_) => Ok(Leaked(unsafe { NonNull::new_unchecked(raw) })),
            // SAFETY: the post failed, so the provider did not keep `raw`.
            Err(e) => Err((unsafe { Box::from_raw(raw) }, e)),
        }
    }
}

fn einval(call: &'static str) -> FiError {
    FiError {
        call,
        errno: libc::EINVAL,
    }
}

/// One completion read from a queue.
pub(crate) enum CqEvent {
    /// A local operation or posted receive finished (its context back),
    /// with the received length for receives, or failed with an error
    /// number.
    Done {
        ctx: Box<OpCtx>,
        len: usize,
        result: Result<(), i32>,
    },
    /// Remote CQ data from a peer's write (the immediate).
    RemoteData(u64),
}

impl Cq {
    /// Reads up to `max` completions (error entries included) into `out`;
    /// returns how many. Reading drives the provider's progress.
    pub(crate) fn read(&self, out: &mut Vec<CqEvent>, max: usize) -> Result<usize, FiError> {
        let mut entries = [sys::fi_cq_data_entry::default(); 16];
        let mut total = 0;
        while total < max {
            // SAFETY: `entries` is writable for 16 data-format entries,
            // the format the queue was opened with.
            let n = unsafe {
                sys::fi_cq_read(
                    self.0.as_ptr(),
                    entries.as_mut_ptr() as *mut libc::c_void,
                    entries.len(),
                )
            };
            if n == -(eagain() as isize) {
                break;
            }
            if n == -(eavail() as isize) {
                let mut buf = sys::Padded::new(sys::fi_cq_err_entry::default());
                // SAFETY: `buf` is a writable error entry with room for the
                // fields newer API versions append.
                let r = unsafe { sys::fi_cq_readerr(self.0.as_ptr(), buf.as_mut_ptr(), 0) };
                check("fi_cq_readerr", r)?;
                let err = &buf.value;
                let errno = if err.err == 0 { libc::EIO } else { err.err };
                if entry_kind(err.flags, err.op_context.is_null()) == EntryKind::Ours {
                    // SAFETY: a non-null context in an error entry of a
                    // local operation is one of ours (from `Ep::post`), and
                    // its completion has now been read.
                    let ctx = unsafe { Box::from_raw(err.op_context as *mut OpCtx) };
                    out.push(CqEvent::Done {
                        ctx,
                        len: 0,
                        result: Err(errno),
                    });
                }
                total += 1;
                continue;
            }
            let n = check("fi_cq_read", n)?;
            // SAFETY: entries the provider just wrote, read once.
            unsafe { events_of(&entries[..n], out) };
            // Read until the provider says `-FI_EAGAIN`, even after a
            // short read: `ofi_rxm` moves one completion of its message
            // provider per read (FI_OFI_RXM_COMP_PER_PROGRESS = 1), and its
            // `fi_trywait` does not see those still waiting below it.
            total += n;
        }
        Ok(total)
    }
}

/// What a completion entry is, from its flags and whether its context is
/// null.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EntryKind {
    /// A peer's write carrying remote CQ data (the immediate).
    PeerData,
    /// One of our operations or posted receives (its context is ours).
    Ours,
    /// Neither: nothing to hand on.
    Other,
}

/// Classifies a completion entry. A peer's write with data is known by
/// `FI_REMOTE_CQ_DATA` on an entry that is not a receive and has no
/// context or says `FI_REMOTE_WRITE` (fi_cq(3): such target entries carry
/// a null context, as the domain never asks for `FI_RX_CQ_DATA`).
/// `FI_REMOTE_CQ_DATA` alone does not tell it: `sockets` echoes a write's
/// own flags on its initiator's completion (`FI_RMA | FI_WRITE |
/// FI_REMOTE_CQ_DATA`, with the context; prov/sockets `sock_cq.c`
/// `sock_cq_sanitize_flags` keeps the bit), and taking that for a peer's
/// immediate left the write without completion and counted the
/// immediate at its sender.
fn entry_kind(flags: u64, context_null: bool) -> EntryKind {
    let data = flags & sys::FI_REMOTE_CQ_DATA != 0;
    let recv = flags & sys::FI_RECV != 0;
    let remote_write = flags & sys::FI_REMOTE_WRITE != 0;
    if data && !recv && (context_null || remote_write) {
        EntryKind::PeerData
    } else if !context_null {
        EntryKind::Ours
    } else {
        EntryKind::Other
    }
}

/// The events of completion entries just read from a queue.
///
/// # Safety
/// The entries must have been read from one of the domain's queues (their
/// non-null contexts are ours) and be converted once.
unsafe fn events_of(entries: &[sys::fi_cq_data_entry], out: &mut Vec<CqEvent>) {
    for e in entries {
        match entry_kind(e.flags, e.op_context.is_null()) {
            EntryKind::PeerData => out.push(CqEvent::RemoteData(e.data)),
            EntryKind::Ours => {
                // SAFETY: a non-null context of a local operation or
                // posted receive is ours (from `Ep::post`), and its
                // completion has now been read, once (the caller's
                // contract).
                let ctx = unsafe { Box::from_raw(e.op_context as *mut OpCtx) };
                out.push(CqEvent::Done {
                    ctx,
                    len: e.len,
                    result: Ok(()),
                });
            }
            EntryKind::Other => {}
        }
    }
}

/// Asks the kernel for 1 µs timer slack on the calling thread, so the
/// poller's short sleeps (tens of µs) are not stretched to the default
/// 50 µs. Failure only costs latency.
pub(crate) fn short_timer_slack() {
    // SAFETY: `PR_SET_TIMERSLACK` takes one integer argument and affects
    // only the calling thread.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The entries each provider writes, as observed on libfabric 1.17
    /// (flags of a 64-byte write with CQ data 1, both ends).
    #[test]
    fn entries_are_told_apart_by_flags_and_context() {
        let local_write = sys::FI_RMA | sys::FI_WRITE;
        let target = sys::FI_RMA | sys::FI_REMOTE_WRITE | sys::FI_REMOTE_CQ_DATA;
        // tcp;ofi_rxm and shm: the initiator's entry has no data flag.
        assert_eq!(entry_kind(local_write, false), EntryKind::Ours);
        assert_eq!(entry_kind(target, true), EntryKind::PeerData);
        assert_eq!(
            entry_kind(sys::FI_REMOTE_WRITE | sys::FI_REMOTE_CQ_DATA, true),
            EntryKind::PeerData
        );
        // sockets: the initiator's entry echoes FI_REMOTE_CQ_DATA.
        assert_eq!(
            entry_kind(local_write | sys::FI_REMOTE_CQ_DATA, false),
            EntryKind::Ours
        );
        assert_eq!(entry_kind(sys::FI_REMOTE_CQ_DATA, false), EntryKind::Ours);
        // A data flag with no context is a peer's, whatever else is set.
        assert_eq!(
            entry_kind(sys::FI_REMOTE_CQ_DATA, true),
            EntryKind::PeerData
        );
        // A target entry that names FI_REMOTE_WRITE is never taken for
        // one of ours, even with a context.
        assert_eq!(entry_kind(target, false), EntryKind::PeerData);
        // Receives are ours, with data or without; a receive entry
        // without a context is nothing to us.
        let recv = sys::FI_MSG | sys::FI_RECV;
        assert_eq!(
            entry_kind(recv | sys::FI_REMOTE_CQ_DATA, false),
            EntryKind::Ours
        );
        assert_eq!(entry_kind(recv, false), EntryKind::Ours);
        assert_eq!(
            entry_kind(recv | sys::FI_REMOTE_CQ_DATA, true),
            EntryKind::Other
        );
        // No context and no data: nothing to hand on.
        assert_eq!(
            entry_kind(sys::FI_RMA | sys::FI_REMOTE_WRITE, true),
            EntryKind::Other
        );
    }
}
