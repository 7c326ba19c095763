//! libfabric's `static inline` calls, written in Rust: each goes through
//! the operation table of the object it is given, exactly as the C inline
//! of the same name does (`fi_domain` is `fabric->ops->domain(...)`,
//! `fi_enable` is `fi_control(&ep->fid, FI_ENABLE, NULL)`, ...), so the
//! behaviour is the provider's.
//!
//! One difference, on the safe side: where the C inline would call through
//! a null table or slot, these return `-FI_ENOSYS` instead.
//!
//! Every function is `unsafe` with libfabric's own contract: the objects
//! are open (not yet closed) objects of one loaded library, buffers are
//! valid for the lengths given and stay so for as long as libfabric says
//! (for posted operations, until their completion is read).

// These restate libfabric's calls argument for argument (FFI), so the
// lint's advice (group them in a struct) does not apply.
#![allow(clippy::too_many_arguments)]

use core::ffi::{c_int, c_void};
use core::ptr;

use crate::abi::*;

/// `-FI_ENOSYS` as the two return types use it.
const NOSYS: c_int = -FI_ENOSYS;
const NOSYS_SZ: isize = -(FI_ENOSYS as isize);

/// Calls slot `$op` of the table `$table` points to, or evaluates to
/// `$none` when the table pointer or the slot is null.
macro_rules! via {
    ($table:expr, $op:ident ( $($arg:expr),* $(,)? ), $none:expr) => {{
        let table = $table;
        match if table.is_null() { None } else { (*table).$op } {
            Some(f) => f($($arg),*),
            None => $none,
        }
    }};
}

/// `fi_close`: closes any object.
///
/// # Safety
/// `fid` is the head of an open object, not used after this.
pub unsafe fn fi_close(fid: *mut fid) -> c_int {
    // SAFETY: the caller's contract; `ops` of an open object is valid.
    unsafe { via!((*fid).ops, close(fid), NOSYS) }
}

/// `fi_control`.
///
/// # Safety
/// `fid` is open; `arg` is what `command` expects.
pub unsafe fn fi_control(fid: *mut fid, command: c_int, arg: *mut c_void) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { via!((*fid).ops, control(fid, command, arg), NOSYS) }
}

/// `fi_domain`: `fabric->ops->domain`.
///
/// # Safety
/// Open fabric, an `fi_info` from the same library, writable `domain`.
pub unsafe fn fi_domain(
    fabric: *mut fid_fabric,
    info: *mut fi_info,
    domain: *mut *mut fid_domain,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { via!((*fabric).ops, domain(fabric, info, domain, context), NOSYS) }
}

/// `fi_trywait`: `fabric->ops->trywait`.
///
/// # Safety
/// Open fabric; `fids` points to `count` open objects of it.
pub unsafe fn fi_trywait(fabric: *mut fid_fabric, fids: *mut *mut fid, count: c_int) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { via!((*fabric).ops, trywait(fabric, fids, count), NOSYS) }
}

/// `fi_endpoint`: `domain->ops->endpoint`.
///
/// # Safety
/// Open domain, an `fi_info` from the same library, writable `ep`.
pub unsafe fn fi_endpoint(
    domain: *mut fid_domain,
    info: *mut fi_info,
    ep: *mut *mut fid_ep,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { via!((*domain).ops, endpoint(domain, info, ep, context), NOSYS) }
}

/// `fi_cq_open`: `domain->ops->cq_open`.
///
/// # Safety
/// Open domain; `attr` valid (see [`Padded`]); writable `cq`.
pub unsafe fn fi_cq_open(
    domain: *mut fid_domain,
    attr: *mut fi_cq_attr,
    cq: *mut *mut fid_cq,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { via!((*domain).ops, cq_open(domain, attr, cq, context), NOSYS) }
}

/// `fi_av_open`: `domain->ops->av_open`.
///
/// # Safety
/// Open domain; `attr` valid (see [`Padded`]); writable `av`.
pub unsafe fn fi_av_open(
    domain: *mut fid_domain,
    attr: *mut fi_av_attr,
    av: *mut *mut fid_av,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { via!((*domain).ops, av_open(domain, attr, av, context), NOSYS) }
}

/// `fi_mr_reg`: `domain->mr->reg(&domain->fid, ...)`.
///
/// # Safety
/// Open domain; `[buf, buf + len)` stays valid until the region is
/// closed; writable `mr`.
pub unsafe fn fi_mr_reg(
    domain: *mut fid_domain,
    buf: *const c_void,
    len: usize,
    access: u64,
    offset: u64,
    requested_key: u64,
    flags: u64,
    mr: *mut *mut fid_mr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract; `fid` is the domain's head.
    unsafe {
        let fid = ptr::addr_of_mut!((*domain).fid);
        via!(
            (*domain).mr,
            reg(
                fid,
                buf,
                len,
                access,
                offset,
                requested_key,
                flags,
                mr,
                context
            ),
            NOSYS
        )
    }
}

/// `fi_mr_bind`: `mr->fid.ops->bind`.
///
/// # Safety
/// Open region and an open object (`bfid`) of the same domain.
pub unsafe fn fi_mr_bind(mr: *mut fid_mr, bfid: *mut fid, flags: u64) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        let fid = ptr::addr_of_mut!((*mr).fid);
        via!((*fid).ops, bind(fid, bfid, flags), NOSYS)
    }
}

/// `fi_mr_enable`: `fi_control(&mr->fid, FI_ENABLE, NULL)`.
///
/// # Safety
/// Open region.
pub unsafe fn fi_mr_enable(mr: *mut fid_mr) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { fi_control(ptr::addr_of_mut!((*mr).fid), FI_ENABLE, ptr::null_mut()) }
}

/// `fi_mr_key`: the region's remote key.
///
/// # Safety
/// Open region.
pub unsafe fn fi_mr_key(mr: *mut fid_mr) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { (*mr).key }
}

/// `fi_mr_desc`: the region's local descriptor.
///
/// # Safety
/// Open region.
pub unsafe fn fi_mr_desc(mr: *mut fid_mr) -> *mut c_void {
    // SAFETY: the caller's contract.
    unsafe { (*mr).mem_desc }
}

/// `fi_ep_bind`: `ep->fid.ops->bind`.
///
/// # Safety
/// Open endpoint and an open object (`bfid`) of the same domain.
pub unsafe fn fi_ep_bind(ep: *mut fid_ep, bfid: *mut fid, flags: u64) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        let fid = ptr::addr_of_mut!((*ep).fid);
        via!((*fid).ops, bind(fid, bfid, flags), NOSYS)
    }
}

/// `fi_enable`: `fi_control(&ep->fid, FI_ENABLE, NULL)`.
///
/// # Safety
/// Open endpoint.
pub unsafe fn fi_enable(ep: *mut fid_ep) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { fi_control(ptr::addr_of_mut!((*ep).fid), FI_ENABLE, ptr::null_mut()) }
}

/// `fi_setopt`: `ep->ops->setopt`, with `fid` the endpoint's head.
///
/// # Safety
/// `fid` is the head of an open endpoint (`&ep->fid`); `optval` points to
/// `optlen` bytes of the option's type.
pub unsafe fn fi_setopt(
    fid: *mut fid,
    level: c_int,
    optname: c_int,
    optval: *const c_void,
    optlen: usize,
) -> c_int {
    // `container_of(fid, struct fid_ep, fid)`: the head is at offset 0.
    let ep = fid.cast::<fid_ep>();
    // SAFETY: the caller's contract.
    unsafe {
        via!(
            (*ep).ops,
            setopt(fid, level, optname, optval, optlen),
            NOSYS
        )
    }
}

/// `fi_getname`: `ep->cm->getname`, with `fid` the endpoint's head.
///
/// # Safety
/// `fid` is the head of an open endpoint; `addr` is writable for
/// `*addrlen` bytes.
pub unsafe fn fi_getname(fid: *mut fid, addr: *mut c_void, addrlen: *mut usize) -> c_int {
    // `container_of(fid, struct fid_ep, fid)`: the head is at offset 0.
    let ep = fid.cast::<fid_ep>();
    // SAFETY: the caller's contract.
    unsafe { via!((*ep).cm, getname(fid, addr, addrlen), NOSYS) }
}

/// `fi_av_insert`: `av->ops->insert`.
///
/// # Safety
/// Open address vector; `addr` readable for `count` provider addresses;
/// `fi_addr` writable for `count` entries.
pub unsafe fn fi_av_insert(
    av: *mut fid_av,
    addr: *const c_void,
    count: usize,
    fi_addr: *mut fi_addr_t,
    flags: u64,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        via!(
            (*av).ops,
            insert(av, addr, count, fi_addr, flags, context),
            NOSYS
        )
    }
}

/// `fi_av_remove`: `av->ops->remove`.
///
/// # Safety
/// Open address vector; `fi_addr` readable for `count` entries.
pub unsafe fn fi_av_remove(
    av: *mut fid_av,
    fi_addr: *mut fi_addr_t,
    count: usize,
    flags: u64,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { via!((*av).ops, remove(av, fi_addr, count, flags), NOSYS) }
}

/// `fi_cq_read`: `cq->ops->read`.
///
/// # Safety
/// Open queue; `buf` writable for `count` entries of the queue's format.
pub unsafe fn fi_cq_read(cq: *mut fid_cq, buf: *mut c_void, count: usize) -> isize {
    // SAFETY: the caller's contract.
    unsafe { via!((*cq).ops, read(cq, buf, count), NOSYS_SZ) }
}

/// `fi_cq_sread`: `cq->ops->sread`; blocks on the queue's wait object
/// (at most `timeout` ms, -1: no bound) until an entry can be read, and
/// reads up to `count`. `-FI_EAGAIN` when the time ran out or
/// [`fi_cq_signal`] woke it.
///
/// # Safety
/// Open queue with a wait object; `buf` writable for `count` entries of
/// the queue's format; `cond` null or as the queue's `wait_cond` wants.
pub unsafe fn fi_cq_sread(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    cond: *const c_void,
    timeout: c_int,
) -> isize {
    // SAFETY: the caller's contract.
    unsafe { via!((*cq).ops, sread(cq, buf, count, cond, timeout), NOSYS_SZ) }
}

/// `fi_cq_signal`: `cq->ops->signal`; wakes a thread blocked on the
/// queue's wait object.
///
/// # Safety
/// Open queue.
pub unsafe fn fi_cq_signal(cq: *mut fid_cq) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { via!((*cq).ops, signal(cq), NOSYS) }
}

/// `fi_cq_readerr`: `cq->ops->readerr`.
///
/// # Safety
/// Open queue; `buf` writable as an error entry of the fabric's API
/// version (see [`Padded`]).
pub unsafe fn fi_cq_readerr(cq: *mut fid_cq, buf: *mut fi_cq_err_entry, flags: u64) -> isize {
    // SAFETY: the caller's contract.
    unsafe { via!((*cq).ops, readerr(cq, buf, flags), NOSYS_SZ) }
}

/// `fi_send`: `ep->msg->send`.
///
/// # Safety
/// Open endpoint; `buf` valid for `len` bytes and `context` alive until
/// the completion is read.
pub unsafe fn fi_send(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    dest_addr: fi_addr_t,
    context: *mut c_void,
) -> isize {
    // SAFETY: the caller's contract.
    unsafe {
        via!(
            (*ep).msg,
            send(ep, buf, len, desc, dest_addr, context),
            NOSYS_SZ
        )
    }
}

/// `fi_recv`: `ep->msg->recv`.
///
/// # Safety
/// As [`fi_send`], `buf` writable.
pub unsafe fn fi_recv(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    desc: *mut c_void,
    src_addr: fi_addr_t,
    context: *mut c_void,
) -> isize {
    // SAFETY: the caller's contract.
    unsafe {
        via!(
            (*ep).msg,
            recv(ep, buf, len, desc, src_addr, context),
            NOSYS_SZ
        )
    }
}

/// `fi_tsend`: `ep->tagged->send`.
///
/// # Safety
/// As [`fi_send`].
pub unsafe fn fi_tsend(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    dest_addr: fi_addr_t,
    tag: u64,
    context: *mut c_void,
) -> isize {
    // SAFETY: the caller's contract.
    unsafe {
        via!(
            (*ep).tagged,
            send(ep, buf, len, desc, dest_addr, tag, context),
            NOSYS_SZ
        )
    }
}

/// `fi_trecv`: `ep->tagged->recv`, matching tags equal to `tag` in the
/// bits not set in `ignore`.
///
/// # Safety
/// As [`fi_recv`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn fi_trecv(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    desc: *mut c_void,
    src_addr: fi_addr_t,
    tag: u64,
    ignore: u64,
    context: *mut c_void,
) -> isize {
    // SAFETY: the caller's contract.
    unsafe {
        via!(
            (*ep).tagged,
            recv(ep, buf, len, desc, src_addr, tag, ignore, context),
            NOSYS_SZ
        )
    }
}

/// `fi_read`: `ep->rma->read`.
///
/// # Safety
/// As [`fi_recv`].
pub unsafe fn fi_read(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    desc: *mut c_void,
    src_addr: fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    // SAFETY: the caller's contract.
    unsafe {
        via!(
            (*ep).rma,
            read(ep, buf, len, desc, src_addr, addr, key, context),
            NOSYS_SZ
        )
    }
}

/// `fi_write`: `ep->rma->write`.
///
/// # Safety
/// As [`fi_send`].
pub unsafe fn fi_write(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    dest_addr: fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    // SAFETY: the caller's contract.
    unsafe {
        via!(
            (*ep).rma,
            write(ep, buf, len, desc, dest_addr, addr, key, context),
            NOSYS_SZ
        )
    }
}

/// `fi_writedata`: `ep->rma->writedata`.
///
/// # Safety
/// As [`fi_send`].
pub unsafe fn fi_writedata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    data: u64,
    dest_addr: fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    // SAFETY: the caller's contract.
    unsafe {
        via!(
            (*ep).rma,
            writedata(ep, buf, len, desc, data, dest_addr, addr, key, context),
            NOSYS_SZ
        )
    }
}

/// `fi_readmsg`: `ep->rma->readmsg`.
///
/// # Safety
/// As [`fi_send`] for every buffer `msg` names (written, not read); `msg`
/// itself need only be valid during the call.
pub unsafe fn fi_readmsg(ep: *mut fid_ep, msg: *const fi_msg_rma, flags: u64) -> isize {
    // SAFETY: the caller's contract.
    unsafe { via!((*ep).rma, readmsg(ep, msg, flags), NOSYS_SZ) }
}

/// `fi_writemsg`: `ep->rma->writemsg`.
///
/// # Safety
/// As [`fi_send`] for every buffer `msg` names; `msg` itself need only be
/// valid during the call.
pub unsafe fn fi_writemsg(ep: *mut fid_ep, msg: *const fi_msg_rma, flags: u64) -> isize {
    // SAFETY: the caller's contract.
    unsafe { via!((*ep).rma, writemsg(ep, msg, flags), NOSYS_SZ) }
}

/// `fi_compare_atomic`: `ep->atomic->compwrite`.
///
/// # Safety
/// As [`fi_send`] for `buf`, `compare` and `result` (`count` elements of
/// `datatype` each).
pub unsafe fn fi_compare_atomic(
    ep: *mut fid_ep,
    buf: *const c_void,
    count: usize,
    desc: *mut c_void,
    compare: *const c_void,
    compare_desc: *mut c_void,
    result: *mut c_void,
    result_desc: *mut c_void,
    dest_addr: fi_addr_t,
    addr: u64,
    key: u64,
    datatype: fi_datatype,
    op: fi_op,
    context: *mut c_void,
) -> isize {
    // SAFETY: the caller's contract.
    unsafe {
        via!(
            (*ep).atomic,
            compwrite(
                ep,
                buf,
                count,
                desc,
                compare,
                compare_desc,
                result,
                result_desc,
                dest_addr,
                addr,
                key,
                datatype,
                op,
                context,
            ),
            NOSYS_SZ
        )
    }
}

/// `fi_fetch_atomic`: `ep->atomic->readwrite`.
///
/// # Safety
/// As [`fi_compare_atomic`].
pub unsafe fn fi_fetch_atomic(
    ep: *mut fid_ep,
    buf: *const c_void,
    count: usize,
    desc: *mut c_void,
    result: *mut c_void,
    result_desc: *mut c_void,
    dest_addr: fi_addr_t,
    addr: u64,
    key: u64,
    datatype: fi_datatype,
    op: fi_op,
    context: *mut c_void,
) -> isize {
    // SAFETY: the caller's contract.
    unsafe {
        via!(
            (*ep).atomic,
            readwrite(
                ep,
                buf,
                count,
                desc,
                result,
                result_desc,
                dest_addr,
                addr,
                key,
                datatype,
                op,
                context,
            ),
            NOSYS_SZ
        )
    }
}

/// `fi_compare_atomicvalid`: `ep->atomic->compwritevalid`.
///
/// # Safety
/// Open endpoint; `count` writable.
pub unsafe fn fi_compare_atomicvalid(
    ep: *mut fid_ep,
    datatype: fi_datatype,
    op: fi_op,
    count: *mut usize,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { via!((*ep).atomic, compwritevalid(ep, datatype, op, count), NOSYS) }
}

/// `fi_fetch_atomicvalid`: `ep->atomic->readwritevalid`.
///
/// # Safety
/// Open endpoint; `count` writable.
pub unsafe fn fi_fetch_atomicvalid(
    ep: *mut fid_ep,
    datatype: fi_datatype,
    op: fi_op,
    count: *mut usize,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { via!((*ep).atomic, readwritevalid(ep, datatype, op, count), NOSYS) }
}
