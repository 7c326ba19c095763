//! The verbs domain's calls into libibverbs: every `unsafe` of the backend
//! but the chain's `Send` is here, each with its `// SAFETY:` reason.
//!
//! Handles are owned by types whose `Drop` releases them, and each holds an
//! `Arc` of what it was created from (a queue pair its protection domain,
//! completion queue and shared receive queue; a protection domain its
//! device context), so a parent is released only after every child: the
//! order libibverbs requires (`ibv_destroy_qp` before `ibv_destroy_cq`
//! before `ibv_dealloc_pd` before `ibv_close_device`).
//!
//! Buffers the NIC writes into on its own ([`DmaBuf`]: receive staging,
//! atomic results, handshake slots) own their memory and their
//! registration; the registration is released before the memory, and the
//! domain drops every buffer only after the queue pairs and receive queues
//! that could still write into it.
//!
//! The mapping from a bring-up [`Transition`] to `ibv_qp_attr` and its
//! mask, and from [`AccessFlags`] to access bits, is plain data and tested
//! here, like [`DmaBuf`]'s bounds; the rest needs a device and is exercised
//! by the conformance suite on machines that have one.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ffi::CStr;
use std::os::raw::{c_int, c_uint};
use std::ptr::{self, NonNull};
use std::sync::Arc;

use ibverbs_sys as sys;
use sys::{ibv_access_flags as acc, ibv_qp_attr_mask as mask};

use super::bringup::{AccessFlags, BringUpError, QpDevice, QpRole, Transition};
use super::demux::{PostChain, PostError};
use super::error::VerbsError;
use super::wr::{Chain, Sge};
use crate::region::Region;

fn last_errno(call: &'static str) -> VerbsError {
    VerbsError {
        call,
        errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
    }
}

/// A call returning 0 or an errno (positive, or negative in some providers).
fn check(call: &'static str, rc: c_int) -> Result<(), VerbsError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(VerbsError {
            call,
            errno: rc.abs(),
        })
    }
}

/// The `ibv_access_flags` bits of `a`.
pub fn access_bits(a: AccessFlags) -> c_uint {
    let mut bits = 0;
    for (on, flag) in [
        (a.local_write, acc::IBV_ACCESS_LOCAL_WRITE),
        (a.remote_write, acc::IBV_ACCESS_REMOTE_WRITE),
        (a.remote_read, acc::IBV_ACCESS_REMOTE_READ),
        (a.remote_atomic, acc::IBV_ACCESS_REMOTE_ATOMIC),
        (a.relaxed_ordering, acc::IBV_ACCESS_RELAXED_ORDERING),
    ] {
        if on {
            bits |= flag.0;
        }
    }
    bits
}

/// The `ibv_modify_qp` attributes and mask of one transition, for a UD
/// (`ud == true`) or RC queue pair.
pub fn qp_attr(t: &Transition, ud: bool) -> (sys::ibv_qp_attr, c_uint) {
    let mut a = sys::ibv_qp_attr::default();
    let m = match *t {
        Transition::Init {
            port,
            pkey_index,
            access,
            qkey,
        } => {
            a.qp_state = sys::ibv_qp_state::IBV_QPS_INIT;
            a.port_num = port;
            a.pkey_index = pkey_index;
            let base = mask::IBV_QP_STATE | mask::IBV_QP_PKEY_INDEX | mask::IBV_QP_PORT;
            if ud {
                a.qkey = qkey.unwrap_or(0);
                base | mask::IBV_QP_QKEY
            } else {
                a.qp_access_flags = access_bits(access);
                base | mask::IBV_QP_ACCESS_FLAGS
            }
        }
        Transition::RecoverSqe => {
            a.qp_state = sys::ibv_qp_state::IBV_QPS_RTS;
            a.cur_qp_state = sys::ibv_qp_state::IBV_QPS_SQE;
            mask::IBV_QP_STATE | mask::IBV_QP_CUR_STATE
        }
        Transition::Rtr {
            path,
            dest_qpn,
            rq_psn,
            path_mtu,
            max_dest_rd_atomic,
            min_rnr_timer,
        } => {
            a.qp_state = sys::ibv_qp_state::IBV_QPS_RTR;
            if ud {
                mask::IBV_QP_STATE
            } else {
                a.path_mtu = sys::ibv_mtu::from(path_mtu);
                a.dest_qp_num = dest_qpn;
                a.rq_psn = rq_psn;
                a.max_dest_rd_atomic = max_dest_rd_atomic;
                a.min_rnr_timer = min_rnr_timer;
                if let Some(p) = path {
                    a.ah_attr.dlid = p.dlid;
                    a.ah_attr.port_num = p.port;
                    // Always global: RoCE needs the GRH, InfiniBand accepts it.
                    a.ah_attr.is_global = 1;
                    a.ah_attr.grh.dgid = sys::ibv_gid { raw: p.dgid };
                    a.ah_attr.grh.sgid_index = p.sgid_index;
                    a.ah_attr.grh.hop_limit = 64;
                }
                mask::IBV_QP_STATE
                    | mask::IBV_QP_AV
                    | mask::IBV_QP_PATH_MTU
                    | mask::IBV_QP_DEST_QPN
                    | mask::IBV_QP_RQ_PSN
                    | mask::IBV_QP_MAX_DEST_RD_ATOMIC
                    | mask::IBV_QP_MIN_RNR_TIMER
            }
        }
        Transition::Rts {
            sq_psn,
            timeout,
            retry_cnt,
            rnr_retry,
            max_rd_atomic,
        } => {
            a.qp_state = sys::ibv_qp_state::IBV_QPS_RTS;
            a.sq_psn = sq_psn;
            if ud {
                mask::IBV_QP_STATE | mask::IBV_QP_SQ_PSN
            } else {
                a.timeout = timeout;
                a.retry_cnt = retry_cnt;
                a.rnr_retry = rnr_retry;
                a.max_rd_atomic = max_rd_atomic;
                mask::IBV_QP_STATE
                    | mask::IBV_QP_SQ_PSN
                    | mask::IBV_QP_TIMEOUT
                    | mask::IBV_QP_RETRY_CNT
                    | mask::IBV_QP_RNR_RETRY
                    | mask::IBV_QP_MAX_QP_RD_ATOMIC
            }
        }
    };
    (a, m.0)
}

/// An open device (`ibv_context`).
#[derive(Debug)]
pub struct Context {
    ctx: *mut sys::ibv_context,
    name: String,
}

// SAFETY: libibverbs objects may be used from any thread (the verbs API is
// thread-safe); the pointer is owned by this value alone.
unsafe impl Send for Context {}
// SAFETY: as above; shared use only calls thread-safe verbs.
unsafe impl Sync for Context {}

/// The names of the devices libibverbs can open, in its order
/// (`ibv_get_device_list`).
pub fn device_names() -> Result<Vec<String>, VerbsError> {
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the list is freed below.
    let list = unsafe { sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(last_errno("ibv_get_device_list"));
    }
    let names = (0..usize::try_from(n).unwrap_or(0))
        .map(|i| {
            // SAFETY: the list holds `n` valid device pointers, each with
            // a NUL-terminated name, copied out before the list is freed.
            unsafe { CStr::from_ptr(sys::ibv_get_device_name(*list.add(i))) }
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { sys::ibv_free_device_list(list) };
    Ok(names)
}

impl Context {
    /// Opens the named device, or the first one when `name` is `None`.
    pub fn open(name: Option<&str>) -> Result<Arc<Context>, VerbsError> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the list is freed below.
        let list = unsafe { sys::ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(last_errno("ibv_get_device_list"));
        }
        let mut found = None;
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // SAFETY: the list holds `n` valid device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: `dev` is valid; the name is a NUL-terminated string
            // owned by the device, copied out before the list is freed.
            let dev_name = unsafe { CStr::from_ptr(sys::ibv_get_device_name(dev)) }
                .to_string_lossy()
                .into_owned();
            if name.map_or(true, |w| w == dev_name) {
                found = Some((dev, dev_name));
                break;
            }
        }
        let res = match found {
            None => Err(VerbsError {
                call: "ibv_get_device_list",
                errno: libc::ENODEV,
            }),
            Some((dev, dev_name)) => {
                // SAFETY: `dev` comes from the live list; an opened context
                // stays valid after the list is freed.
                let ctx = unsafe { sys::ibv_open_device(dev) };
                if ctx.is_null() {
                    Err(last_errno("ibv_open_device"))
                } else {
                    Ok(Arc::new(Context {
                        ctx,
                        name: dev_name,
                    }))
                }
            }
        };
        // SAFETY: `list` came from ibv_get_device_list and is freed once.
        unsafe { sys::ibv_free_device_list(list) };
        res
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The port's LID, active MTU code and state code.
    pub fn port(&self, port: u8) -> Result<(u16, u8, u32), VerbsError> {
        let mut attr = sys::ibv_port_attr::default();
        // SAFETY: the exported ibv_query_port takes the older port
        // attribute layout, a prefix of `ibv_port_attr` (the cast rdma-core's
        // own inline wrapper makes); `attr` outlives the call.
        let rc = unsafe {
            sys::ibv_query_port(
                self.ctx,
                port,
                (&mut attr as *mut sys::ibv_port_attr).cast(),
            )
        };
        check("ibv_query_port", rc)?;
        Ok((attr.lid, attr.active_mtu as u8, attr.state))
    }

    /// The device's capabilities the domain uses (`ibv_query_device`).
    pub fn caps(&self) -> Result<super::caps::DeviceCaps, VerbsError> {
        let mut attr = sys::ibv_device_attr::default();
        // SAFETY: `attr` is a valid out-pointer for the call.
        let rc = unsafe { sys::ibv_query_device(self.ctx, &mut attr) };
        check("ibv_query_device", rc)?;
        let nonneg = |v: c_int| u32::try_from(v).unwrap_or(0);
        Ok(super::caps::DeviceCaps {
            vendor_id: attr.vendor_id,
            vendor_part_id: attr.vendor_part_id,
            atomic_cap: attr.atomic_cap,
            max_qp_rd_atom: nonneg(attr.max_qp_rd_atom),
            max_qp_init_rd_atom: nonneg(attr.max_qp_init_rd_atom),
            max_qp: nonneg(attr.max_qp),
            max_srq_wr: nonneg(attr.max_srq_wr),
        })
    }

    /// The GID at `index` of `port`.
    pub fn gid(&self, port: u8, index: u8) -> Result<[u8; 16], VerbsError> {
        let mut gid = sys::ibv_gid { raw: [0; 16] };
        // SAFETY: `gid` is a valid out-pointer for the call.
        let rc = unsafe { sys::ibv_query_gid(self.ctx, port, c_int::from(index), &mut gid) };
        check("ibv_query_gid", rc)?;
        // SAFETY: every bit pattern is a valid `raw` array.
        Ok(unsafe { gid.raw })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every child holds an Arc of this context, so none is
        // alive; the context is closed once.
        unsafe { sys::ibv_close_device(self.ctx) };
    }
}

/// A protection domain.
#[derive(Debug)]
pub struct Pd {
    pd: *mut sys::ibv_pd,
    ctx: Arc<Context>,
}

// SAFETY: see `Context`.
unsafe impl Send for Pd {}
// SAFETY: see `Context`.
unsafe impl Sync for Pd {}

impl Pd {
    /// Allocates one on `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Pd>, VerbsError> {
        // SAFETY: `ctx.ctx` is an open context.
        let pd = unsafe { sys::ibv_alloc_pd(ctx.ctx) };
        if pd.is_null() {
            return Err(last_errno("ibv_alloc_pd"));
        }
        Ok(Arc::new(Pd {
            pd,
            ctx: ctx.clone(),
        }))
    }

    /// Its device.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: queue pairs, receive queues and registrations hold an Arc
        // of this domain, so none is alive; released once.
        unsafe { sys::ibv_dealloc_pd(self.pd) };
    }
}

/// A completion queue.
#[derive(Debug)]
pub struct Cq {
    cq: *mut sys::ibv_cq,
    _ctx: Arc<Context>,
}

// SAFETY: see `Context`.
unsafe impl Send for Cq {}
// SAFETY: see `Context`.
unsafe impl Sync for Cq {}

impl Cq {
    /// Creates one of `depth` entries.
    pub fn new(ctx: &Arc<Context>, depth: u32) -> Result<Arc<Cq>, VerbsError> {
        let depth = c_int::try_from(depth).unwrap_or(c_int::MAX);
        // SAFETY: open context; no channel, no user context.
        let cq = unsafe { sys::ibv_create_cq(ctx.ctx, depth, ptr::null_mut(), ptr::null_mut(), 0) };
        if cq.is_null() {
            return Err(last_errno("ibv_create_cq"));
        }
        Ok(Arc::new(Cq {
            cq,
            _ctx: ctx.clone(),
        }))
    }

    /// Moves up to `out.len()` completions into `out`; returns how many.
    pub fn poll(&self, out: &mut [sys::ibv_wc]) -> Result<usize, VerbsError> {
        let n = c_int::try_from(out.len()).unwrap_or(c_int::MAX);
        // SAFETY: `cq` is live, so its context and ops table are; poll_cq is
        // the provider's ibv_poll_cq (a static inline in verbs.h).
        let rc = unsafe {
            let ops = &(*(*self.cq).context).ops;
            match ops.poll_cq {
                Some(f) => f(self.cq, n, out.as_mut_ptr()),
                None => -libc::ENOSYS,
            }
        };
        usize::try_from(rc).map_err(|_| VerbsError {
            call: "ibv_poll_cq",
            errno: rc.abs(),
        })
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: queue pairs hold an Arc of their CQ, so none is alive.
        unsafe { sys::ibv_destroy_cq(self.cq) };
    }
}

/// A shared receive queue of zero-length receives (immediates need a
/// posted receive but carry no payload).
#[derive(Debug)]
pub struct Srq {
    srq: *mut sys::ibv_srq,
    _pd: Arc<Pd>,
}

// SAFETY: see `Context`.
unsafe impl Send for Srq {}
// SAFETY: see `Context`.
unsafe impl Sync for Srq {}

impl Srq {
    /// Creates one of `depth` receives.
    pub fn new(pd: &Arc<Pd>, depth: u32) -> Result<Arc<Srq>, VerbsError> {
        let mut init = sys::ibv_srq_init_attr::default();
        init.attr.max_wr = depth;
        init.attr.max_sge = 1;
        // SAFETY: live protection domain; `init` outlives the call.
        let srq = unsafe { sys::ibv_create_srq(pd.pd, &mut init) };
        if srq.is_null() {
            return Err(last_errno("ibv_create_srq"));
        }
        Ok(Arc::new(Srq {
            srq,
            _pd: pd.clone(),
        }))
    }

    /// Posts `n` zero-length receives with id `wr_id`.
    pub fn post_zero_length(&self, n: u32, wr_id: u64) -> Result<(), VerbsError> {
        for _ in 0..n {
            let mut wr = sys::ibv_recv_wr {
                wr_id,
                next: ptr::null_mut(),
                sg_list: ptr::null_mut(),
                num_sge: 0,
            };
            let mut bad = ptr::null_mut();
            // SAFETY: live SRQ; `wr` has no buffers and outlives the call;
            // post_srq_recv is the provider's ibv_post_srq_recv.
            let rc = unsafe {
                let ops = &(*(*self.srq).context).ops;
                match ops.post_srq_recv {
                    Some(f) => f(self.srq, &mut wr, &mut bad),
                    None => libc::ENOSYS,
                }
            };
            check("ibv_post_srq_recv", rc)?;
        }
        Ok(())
    }
}

impl Srq {
    /// Posts one receive of `sge` with id `wr_id`.
    pub fn post_recv(&self, wr_id: u64, sge: Sge) -> Result<(), VerbsError> {
        post_one_recv("ibv_post_srq_recv", wr_id, sge, |wr, bad| {
            // SAFETY: live SRQ; `wr` and its sge outlive the call (the NIC
            // copies the request at post time); the buffer behind `sge` is
            // registered and owned by the caller until its completion or
            // the SRQ's end.
            unsafe {
                let ops = &(*(*self.srq).context).ops;
                match ops.post_srq_recv {
                    Some(f) => f(self.srq, wr, bad),
                    None => libc::ENOSYS,
                }
            }
        })
    }
}

/// Builds a one-sge receive request for `sge` and hands it to `post`
/// (which calls the provider); `call` names the verb in the error.
fn post_one_recv(
    call: &'static str,
    wr_id: u64,
    sge: Sge,
    post: impl FnOnce(*mut sys::ibv_recv_wr, *mut *mut sys::ibv_recv_wr) -> libc::c_int,
) -> Result<(), VerbsError> {
    let mut sg = sys::ibv_sge {
        addr: sge.addr,
        length: sge.len,
        lkey: sge.lkey,
    };
    let mut wr = sys::ibv_recv_wr {
        wr_id,
        next: ptr::null_mut(),
        sg_list: &mut sg,
        num_sge: 1,
    };
    let mut bad = ptr::null_mut();
    check(call, post(&mut wr, &mut bad))
}

impl Drop for Srq {
    fn drop(&mut self) {
        // SAFETY: queue pairs using it hold an Arc of it, so none is alive.
        unsafe { sys::ibv_destroy_srq(self.srq) };
    }
}

/// A memory registration.
#[derive(Debug)]
pub struct Mr {
    mr: *mut sys::ibv_mr,
    _pd: Arc<Pd>,
}

// SAFETY: see `Context`.
unsafe impl Send for Mr {}
// SAFETY: see `Context`.
unsafe impl Sync for Mr {}

impl Mr {
    /// Registers `len` bytes at `addr` with `access`.
    ///
    /// # Safety
    /// The bytes must stay allocated until the registration is dropped.
    pub unsafe fn register(
        pd: &Arc<Pd>,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Mr, VerbsError> {
        let access = access_bits(access) as c_int;
        // SAFETY: the caller keeps the bytes alive; the domain is live.
        let mr = unsafe { sys::ibv_reg_mr(pd.pd, addr.cast(), len, access) };
        if mr.is_null() {
            return Err(last_errno("ibv_reg_mr"));
        }
        Ok(Mr {
            mr,
            _pd: pd.clone(),
        })
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: `mr` is live until drop.
        unsafe { (*self.mr).lkey }
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: `mr` is live until drop.
        unsafe { (*self.mr).rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered once, deregistered once.
        unsafe { sys::ibv_dereg_mr(self.mr) };
    }
}

/// The registration of an engine region; holds the region so its memory
/// outlives the registration.
#[derive(Debug)]
pub struct RegionMr {
    // Released first (field order): the NIC lets go before the memory can.
    mr: Mr,
    _region: Arc<Region>,
}

impl RegionMr {
    /// Registers all of `region` with `access`.
    pub fn new(
        pd: &Arc<Pd>,
        region: &Arc<Region>,
        access: AccessFlags,
    ) -> Result<RegionMr, VerbsError> {
        let len = usize::try_from(region.len()).map_err(|_| VerbsError {
            call: "ibv_reg_mr",
            errno: libc::EINVAL,
        })?;
        // SAFETY: engine-allocated memory is freed only with the last
        // reference to the region, and this value holds one; caller-owned
        // memory stays valid until `dereg_mr` returns or the engine is
        // dropped (`Region::external`'s contract), and the domain drops
        // every registration in `deregister` and at shutdown, before both.
        let mr = unsafe { Mr::register(pd, region.addr() as *mut u8, len, access)? };
        Ok(RegionMr {
            mr,
            _region: region.clone(),
        })
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }
}

/// A queue pair (UD or RC).
#[derive(Debug)]
pub struct Qp {
    qp: *mut sys::ibv_qp,
    ud: bool,
    _cq: Arc<Cq>,
    _srq: Option<Arc<Srq>>,
    _pd: Arc<Pd>,
}

// SAFETY: see `Context`; posting from several threads is allowed by verbs.
unsafe impl Send for Qp {}
// SAFETY: see `Context`.
unsafe impl Sync for Qp {}

impl Qp {
    /// Posts a built chain behind one doorbell. On an error, says how many
    /// requests at its front the NIC took anyway (those ahead of `bad_wr`:
    /// they will execute, so their buffers stay theirs).
    pub fn post_chain(&self, chain: &mut Chain) -> Result<(), PostError> {
        let head = chain.head();
        if head.is_null() {
            return Ok(());
        }
        let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
        // SAFETY: live queue pair; the chain's requests and sges live in its
        // boxes for the call (the NIC copies them or inline data at post
        // time); post_send is the provider's ibv_post_send.
        let rc = unsafe {
            let ops = &(*(*self.qp).context).ops;
            match ops.post_send {
                Some(f) => f(self.qp, head, &mut bad),
                None => libc::ENOSYS,
            }
        };
        check("ibv_post_send", rc).map_err(|error| PostError {
            // A `bad_wr` outside the chain (or none) counts as nothing taken.
            posted: chain.index_of(bad).unwrap_or(0),
            error,
        })
    }
}

impl PostChain for Qp {
    fn post_chain(&mut self, chain: &mut Chain) -> Result<(), PostError> {
        Qp::post_chain(self, chain)
    }
}

impl Qp {
    /// Posts one signalled UD send of `sge` to `remote_qpn` under `qkey`
    /// through `ah`.
    pub fn post_ud_send(
        &self,
        ah: &Ah,
        remote_qpn: u32,
        qkey: u32,
        sge: Sge,
        wr_id: u64,
    ) -> Result<(), VerbsError> {
        let mut sg = sys::ibv_sge {
            addr: sge.addr,
            length: sge.len,
            lkey: sge.lkey,
        };
        let mut wr = sys::ibv_send_wr {
            wr_id,
            sg_list: &mut sg,
            num_sge: 1,
            opcode: sys::ibv_wr_opcode::IBV_WR_SEND,
            send_flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        wr.wr.ud = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
            ah: ah.ah,
            remote_qpn,
            remote_qkey: qkey,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: live UD queue pair and address handle (the caller keeps
        // `ah` until the send completes); `wr`/`sg` outlive the call; the
        // buffer is registered and kept until the completion.
        let rc = unsafe {
            let ops = &(*(*self.qp).context).ops;
            match ops.post_send {
                Some(f) => f(self.qp, &mut wr, &mut bad),
                None => libc::ENOSYS,
            }
        };
        check("ibv_post_send", rc)
    }

    /// Posts one receive of `sge` on this queue pair's own receive queue
    /// (the UD queue pair; RC ones use shared receive queues).
    pub fn post_recv(&self, wr_id: u64, sge: Sge) -> Result<(), VerbsError> {
        post_one_recv("ibv_post_recv", wr_id, sge, |wr, bad| {
            // SAFETY: live queue pair; `wr` and its sge outlive the call;
            // the buffer is registered and owned by the caller until the
            // completion or the queue pair's end.
            unsafe {
                let ops = &(*(*self.qp).context).ops;
                match ops.post_recv {
                    Some(f) => f(self.qp, wr, bad),
                    None => libc::ENOSYS,
                }
            }
        })
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once, before the CQ, SRQ and
        // domain it holds Arcs of.
        unsafe { sys::ibv_destroy_qp(self.qp) };
    }
}

/// The real device behind [`QpDevice`]: creates queue pairs on one
/// protection domain and completion queue; RC write queue pairs on the
/// shared receive queue of zero-length receives (immediates), RC message
/// queue pairs on the shared receive queue of message buffers.
#[derive(Debug)]
pub struct Device {
    /// Protection domain.
    pub pd: Arc<Pd>,
    /// Completion queue of every queue pair.
    pub cq: Arc<Cq>,
    /// Zero-length receives, consumed by writes with immediate.
    pub srq: Arc<Srq>,
    /// Message receives, consumed by sends.
    pub msg_srq: Arc<Srq>,
    /// Send-queue depth.
    pub send_depth: u32,
    /// Inline bytes asked for.
    pub max_inline: u32,
}

impl QpDevice for Device {
    type Qp = Qp;

    fn create_qp(&mut self, role: QpRole) -> Result<(Qp, u32), BringUpError> {
        let ud = role == QpRole::Ud;
        let srq = match role {
            QpRole::Ud => None,
            QpRole::Msg => Some(self.msg_srq.clone()),
            QpRole::Rdma => Some(self.srq.clone()),
        };
        let mut init = sys::ibv_qp_init_attr {
            send_cq: self.cq.cq,
            recv_cq: self.cq.cq,
            srq: srq.as_ref().map_or(ptr::null_mut(), |s| s.srq),
            qp_type: if ud {
                sys::ibv_qp_type::IBV_QPT_UD
            } else {
                sys::ibv_qp_type::IBV_QPT_RC
            },
            ..Default::default()
        };
        init.cap.max_send_wr = self.send_depth;
        init.cap.max_recv_wr = if ud { self.send_depth } else { 0 };
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = self.max_inline;
        // SAFETY: live domain, CQ and SRQ (held by the new Qp); `init`
        // outlives the call.
        let qp = unsafe { sys::ibv_create_qp(self.pd.pd, &mut init) };
        if qp.is_null() {
            let e = last_errno("ibv_create_qp");
            return Err(BringUpError::Device {
                role,
                call: e.call,
                errno: e.errno,
            });
        }
        // SAFETY: `qp` was just created and is live.
        let qpn = unsafe { (*qp).qp_num };
        Ok((
            Qp {
                qp,
                ud,
                _cq: self.cq.clone(),
                _srq: srq,
                _pd: self.pd.clone(),
            },
            qpn,
        ))
    }

    fn modify(&mut self, qp: &mut Qp, role: QpRole, t: &Transition) -> Result<(), BringUpError> {
        let (mut attr, bits) = qp_attr(t, qp.ud);
        // SAFETY: live queue pair; `attr` outlives the call.
        let rc = unsafe { sys::ibv_modify_qp(qp.qp, &mut attr, bits as c_int) };
        check("ibv_modify_qp", rc).map_err(|e| BringUpError::Device {
            role,
            call: e.call,
            errno: e.errno,
        })
    }
}

/// An address handle: where UD sends to one peer go.
#[derive(Debug)]
pub struct Ah {
    ah: *mut sys::ibv_ah,
    _pd: Arc<Pd>,
}

// SAFETY: see `Context`.
unsafe impl Send for Ah {}
// SAFETY: see `Context`.
unsafe impl Sync for Ah {}

impl Ah {
    /// A handle to the port at `dgid`/`dlid`, always with a global route
    /// (RoCE needs it; InfiniBand accepts it), from local `port` and GID
    /// index `sgid_index`.
    pub fn new(
        pd: &Arc<Pd>,
        dgid: [u8; 16],
        dlid: u16,
        port: u8,
        sgid_index: u8,
    ) -> Result<Ah, VerbsError> {
        let mut attr = sys::ibv_ah_attr {
            dlid,
            port_num: port,
            is_global: 1,
            ..Default::default()
        };
        attr.grh.dgid = sys::ibv_gid { raw: dgid };
        attr.grh.sgid_index = sgid_index;
        attr.grh.hop_limit = 64;
        // SAFETY: live protection domain; `attr` outlives the call.
        let ah = unsafe { sys::ibv_create_ah(pd.pd, &mut attr) };
        if ah.is_null() {
            return Err(last_errno("ibv_create_ah"));
        }
        Ok(Ah {
            ah,
            _pd: pd.clone(),
        })
    }
}

impl Drop for Ah {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once; the UD queue pair whose
        // sends used it is gone or has completed them.
        unsafe { sys::ibv_destroy_ah(self.ah) };
    }
}

/// A zeroed buffer the NIC reads and writes on its own, with its
/// registration (local write only: staging for receives, atomic results,
/// send bounce buffers, handshake slots).
///
/// Invariant: the registration is released before the memory. Accesses
/// from the CPU go through [`DmaBuf::read`], [`DmaBuf::write`] and
/// [`DmaBuf::load_u64`], bounds-checked, and the caller makes them only
/// while the NIC is not using that range (before posting, after the
/// completion).
#[derive(Debug)]
pub struct DmaBuf {
    mr: Option<Mr>,
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer is plain heap memory owned by this value; the raw
// pointer is not shared with other Rust code (the NIC is synchronised by
// completions).
unsafe impl Send for DmaBuf {}
// SAFETY: shared use reads the registration's keys and copies through
// bounds-checked raw pointers, under the caller's completion protocol.
unsafe impl Sync for DmaBuf {}

impl DmaBuf {
    fn alloc(len: usize) -> Result<(NonNull<u8>, Layout), VerbsError> {
        let nomem = VerbsError {
            call: "ibv_reg_mr",
            errno: libc::ENOMEM,
        };
        let layout = Layout::from_size_align(len.max(1), 64).map_err(|_| nomem)?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        Ok((NonNull::new(raw).ok_or(nomem)?, layout))
    }

    /// `len` zeroed bytes registered on `pd`.
    pub fn new(pd: &Arc<Pd>, len: usize) -> Result<DmaBuf, VerbsError> {
        let (ptr, layout) = DmaBuf::alloc(len)?;
        let access = AccessFlags {
            local_write: true,
            ..AccessFlags::default()
        };
        // SAFETY: the memory stays allocated until `drop`, which releases
        // the registration first.
        match unsafe { Mr::register(pd, ptr.as_ptr(), layout.size(), access) } {
            Ok(mr) => Ok(DmaBuf {
                mr: Some(mr),
                ptr,
                layout,
            }),
            Err(e) => {
                // SAFETY: allocated just above with `layout`, not registered.
                unsafe { dealloc(ptr.as_ptr(), layout) };
                Err(e)
            }
        }
    }

    /// A buffer with no registration (tests of the bounds only).
    #[cfg(test)]
    fn unregistered(len: usize) -> DmaBuf {
        let (ptr, layout) = DmaBuf::alloc(len).unwrap();
        DmaBuf {
            mr: None,
            ptr,
            layout,
        }
    }

    /// Its address (what requests name).
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// Whether it is empty (never: at least one byte is allocated).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Local key of its registration.
    pub fn lkey(&self) -> u32 {
        self.mr.as_ref().map_or(0, Mr::lkey)
    }

    /// The scatter-gather entry of `len` bytes at `offset`, if inside.
    pub fn sge(&self, offset: usize, len: usize) -> Option<Sge> {
        let end = offset.checked_add(len)?;
        (end <= self.len()).then(|| Sge {
            addr: self.addr() + offset as u64,
            len: u32::try_from(len).unwrap_or(u32::MAX),
            lkey: self.lkey(),
        })
    }

    /// Copies bytes at `offset` out; `false` if out of bounds.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> bool {
        match offset.checked_add(dst.len()) {
            Some(end) if end <= self.len() => {
                // SAFETY: in bounds (checked); the NIC is done with the
                // range (the caller's completion protocol); `dst` is a
                // distinct Rust buffer.
                unsafe {
                    ptr::copy_nonoverlapping(
                        self.ptr.as_ptr().add(offset),
                        dst.as_mut_ptr(),
                        dst.len(),
                    )
                };
                true
            }
            _ => false,
        }
    }

    /// Copies `src` in at `offset`; `false` if out of bounds.
    pub fn write(&self, offset: usize, src: &[u8]) -> bool {
        match offset.checked_add(src.len()) {
            Some(end) if end <= self.len() => {
                // SAFETY: in bounds; the NIC is not using the range (it is
                // posted only after this copy).
                unsafe {
                    ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len())
                };
                true
            }
            _ => false,
        }
    }

    /// The native-endian 8-byte word at `offset` (8-aligned), as the NIC
    /// left it (an atomic's old value).
    pub fn load_u64(&self, offset: usize) -> Option<u64> {
        if offset % 8 != 0 || offset.checked_add(8)? > self.len() {
            return None;
        }
        // SAFETY: aligned (the buffer is 64-aligned, `offset` 8-aligned)
        // and in bounds; volatile because the NIC wrote it behind the
        // compiler's back.
        Some(unsafe { ptr::read_volatile(self.ptr.as_ptr().add(offset).cast::<u64>()) })
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        // The registration goes first: after it the NIC cannot touch the
        // memory.
        drop(self.mr.take());
        // SAFETY: allocated in `alloc` with `layout`; freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// `n` completion entries to poll into.
pub fn wc_buffer(n: usize) -> Vec<sys::ibv_wc> {
    // SAFETY: `ibv_wc` is a plain C struct of integers; all-zero is a
    // valid value of it.
    (0..n).map(|_| unsafe { std::mem::zeroed() }).collect()
}

#[cfg(test)]
mod tests {
    use super::super::bringup::PathTo;
    use super::*;

    #[test]
    fn registrations_ask_for_relaxed_ordering_qps_do_not() {
        let r = access_bits(AccessFlags::REGISTRATION);
        assert_ne!(r & acc::IBV_ACCESS_RELAXED_ORDERING.0, 0);
        for f in [
            acc::IBV_ACCESS_LOCAL_WRITE,
            acc::IBV_ACCESS_REMOTE_WRITE,
            acc::IBV_ACCESS_REMOTE_READ,
            acc::IBV_ACCESS_REMOTE_ATOMIC,
        ] {
            assert_ne!(r & f.0, 0);
        }
        assert_eq!(
            access_bits(AccessFlags::RC_QP) & acc::IBV_ACCESS_RELAXED_ORDERING.0,
            0
        );
        assert_eq!(access_bits(AccessFlags::default()), 0);
    }

    #[test]
    fn rc_attributes_and_masks() {
        let (a, m) = qp_attr(
            &Transition::Init {
                port: 1,
                pkey_index: 0,
                access: AccessFlags::RC_QP,
                qkey: None,
            },
            false,
        );
        assert_eq!(a.qp_state, sys::ibv_qp_state::IBV_QPS_INIT);
        assert_eq!(m & mask::IBV_QP_ACCESS_FLAGS.0, mask::IBV_QP_ACCESS_FLAGS.0);
        assert_eq!(m & mask::IBV_QP_QKEY.0, 0);
        let (a, m) = qp_attr(
            &Transition::Rtr {
                path: Some(PathTo {
                    dlid: 4,
                    dgid: [9; 16],
                    sgid_index: 3,
                    port: 1,
                }),
                dest_qpn: 0x901,
                rq_psn: 0x1111,
                path_mtu: 5,
                max_dest_rd_atomic: 16,
                min_rnr_timer: 12,
            },
            false,
        );
        assert_eq!((a.dest_qp_num, a.rq_psn, a.path_mtu), (0x901, 0x1111, 5));
        assert_eq!(
            (
                a.ah_attr.dlid,
                a.ah_attr.is_global,
                a.ah_attr.grh.sgid_index
            ),
            (4, 1, 3)
        );
        // SAFETY: reading the raw member just written.
        assert_eq!(unsafe { a.ah_attr.grh.dgid.raw }, [9; 16]);
        for f in [mask::IBV_QP_AV, mask::IBV_QP_DEST_QPN, mask::IBV_QP_RQ_PSN] {
            assert_ne!(m & f.0, 0);
        }
        let (a, m) = qp_attr(
            &Transition::Rts {
                sq_psn: 0x77,
                timeout: 18,
                retry_cnt: 3,
                rnr_retry: 5,
                max_rd_atomic: 16,
            },
            false,
        );
        assert_eq!(
            (a.sq_psn, a.timeout, a.retry_cnt, a.rnr_retry),
            (0x77, 18, 3, 5)
        );
        assert_ne!(m & mask::IBV_QP_RETRY_CNT.0, 0);
    }

    #[test]
    fn ud_attributes_carry_the_qkey_and_no_path() {
        let (a, m) = qp_attr(
            &Transition::Init {
                port: 2,
                pkey_index: 0,
                access: AccessFlags::default(),
                qkey: Some(0x1234),
            },
            true,
        );
        assert_eq!((a.qkey, a.port_num), (0x1234, 2));
        assert_ne!(m & mask::IBV_QP_QKEY.0, 0);
        assert_eq!(m & mask::IBV_QP_ACCESS_FLAGS.0, 0);
        let (_, m) = qp_attr(
            &Transition::Rtr {
                path: None,
                dest_qpn: 0,
                rq_psn: 0,
                path_mtu: 0,
                max_dest_rd_atomic: 0,
                min_rnr_timer: 0,
            },
            true,
        );
        assert_eq!(m, mask::IBV_QP_STATE.0);
    }

    #[test]
    fn dma_buffers_check_their_bounds() {
        let b = DmaBuf::unregistered(100);
        assert!(b.len() >= 100 && b.addr() % 64 == 0);
        assert!(b.write(90, &[7; 10]));
        assert!(!b.write(91, &[7; 10]));
        assert!(!b.write(usize::MAX, &[7]));
        let mut out = [0u8; 10];
        assert!(b.read(90, &mut out));
        assert_eq!(out, [7; 10]);
        assert!(!b.read(95, &mut out));
        assert!(b.write(8, &0x0102_0304_0506_0708u64.to_ne_bytes()));
        assert_eq!(b.load_u64(8), Some(0x0102_0304_0506_0708));
        assert_eq!(b.load_u64(4), None, "misaligned");
        assert_eq!(b.load_u64(96), None, "past the end");
        let s = b.sge(10, 20).unwrap();
        assert_eq!((s.addr, s.len, s.lkey), (b.addr() + 10, 20, 0));
        assert!(b.sge(90, 11).is_none());
        let z = wc_buffer(4);
        assert_eq!(z.len(), 4);
        assert_eq!(z[0].wr_id(), 0);
    }
}
