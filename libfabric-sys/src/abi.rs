//! The part of libfabric's ABI (1.x, from 1.17 on) the project uses,
//! declared by hand: constants, enum values, structs and operation tables.
//!
//! Invariant: every declared field sits at the offset libfabric 1.17 gives
//! it, and no later 1.x or 2.x release moves it (libfabric only appends to
//! its structs and tables; the soname stays `libfabric.so.1`). Three kinds
//! of struct follow from that, and `tests/abi.rs` checks each against the
//! installed headers:
//! - **whole**: the project creates it and libfabric reads or writes all of
//!   it; every field is declared and the size equals C's ([`fi_context2`],
//!   [`fi_cq_data_entry`], [`fi_rma_iov`], [`fi_msg_rma`], [`fid`]);
//! - **prefix**: libfabric allocates it and the project only reaches fields
//!   through a pointer; declared up to the last field (or table slot) used,
//!   with a private zero-sized tail so it cannot be built by value
//!   ([`fi_info`], the `*_attr` it points to, the `fid_*` objects and the
//!   `fi_ops_*` tables). Slots not called are [`Unused`];
//! - **padded**: the project creates it, but a later API version appends
//!   fields a provider may read or write (the API version is chosen at run
//!   time); declared as in 1.17 and passed inside a [`Padded`] whose zeroed
//!   reserve covers the appended fields ([`fi_cq_attr`], [`fi_av_attr`],
//!   [`fi_cq_err_entry`]).
//!
//! Names are libfabric's, so the C documentation applies unchanged.

#![allow(non_camel_case_types)]

use core::ffi::{c_char, c_int, c_void};
use core::ptr;

pub use libc::iovec;

/// `fi_addr_t`: an address-vector entry.
pub type fi_addr_t = u64;

/// `FI_VERSION(major, minor)`: an API version as libfabric encodes it.
pub const fn fi_version_of(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

/// `FI_MAJOR(version)`.
pub const fn fi_major(version: u32) -> u32 {
    version >> 16
}

/// `FI_MINOR(version)`.
pub const fn fi_minor(version: u32) -> u32 {
    version & 0xffff
}

// Capabilities, operation flags and completion flags (`uint64_t` bits).

/// Capability: two-sided messages.
pub const FI_MSG: u64 = 1 << 1;
/// Capability: one-sided reads and writes.
pub const FI_RMA: u64 = 1 << 2;
/// Capability: tagged two-sided messages (matched by tag, apart from
/// untagged ones).
pub const FI_TAGGED: u64 = 1 << 3;
/// Capability: remote atomics.
pub const FI_ATOMIC: u64 = 1 << 4;
/// Capability / access: initiate reads (and fetching atomics).
pub const FI_READ: u64 = 1 << 8;
/// Capability / access: initiate writes (and atomics).
pub const FI_WRITE: u64 = 1 << 9;
/// Capability / access / completion flag: receive.
pub const FI_RECV: u64 = 1 << 10;
/// Capability / access: send.
pub const FI_SEND: u64 = 1 << 11;
/// Bind flag: the transmit side (the same bit as [`FI_SEND`]).
pub const FI_TRANSMIT: u64 = FI_SEND;
/// Access: peers may read the region.
pub const FI_REMOTE_READ: u64 = 1 << 12;
/// Access: peers may write the region (atomics included).
pub const FI_REMOTE_WRITE: u64 = 1 << 13;
/// Operation / completion flag: remote CQ data (the immediate) is carried.
pub const FI_REMOTE_CQ_DATA: u64 = 1 << 17;
/// Operation flag: generate a completion.
pub const FI_COMPLETION: u64 = 1 << 24;
/// Operation flag: complete once the data is visible at the target.
pub const FI_DELIVERY_COMPLETE: u64 = 1 << 28;

// Mode bits.

/// Mode: the provider uses an `fi_context` per operation.
pub const FI_CONTEXT: u64 = 1 << 59;
/// Mode: the provider uses an [`fi_context2`] per operation.
pub const FI_CONTEXT2: u64 = 1 << 52;

// Ordering bits of `msg_order`.

/// Read after write is ordered (RMA and atomics, across both).
pub const FI_ORDER_RAW: u64 = 1 << 1;
/// Write after read is ordered.
pub const FI_ORDER_WAR: u64 = 1 << 3;
/// Write after write is ordered (RMA and atomics, across both).
pub const FI_ORDER_WAW: u64 = 1 << 4;
/// RMA write after RMA write is ordered (1.15 and newer: what a provider
/// that orders RMA apart from atomics grants instead of `FI_ORDER_WAW`).
pub const FI_ORDER_RMA_WAW: u64 = 1 << 35;

// Memory-registration mode bits. C declares them `int` and stores them in
// the `int` field `fi_domain_attr::mr_mode`; they are kept with the other
// bit sets as `u64` here (all lie below bit 31).

/// MR mode: local buffers must be registered too.
pub const FI_MR_LOCAL: u64 = 1 << 2;
/// MR mode: keys are raw byte strings longer than 64 bits.
pub const FI_MR_RAW: u64 = 1 << 3;
/// MR mode: remote addresses are virtual addresses (else offsets).
pub const FI_MR_VIRT_ADDR: u64 = 1 << 4;
/// MR mode: only allocated (backed) memory can be registered.
pub const FI_MR_ALLOCATED: u64 = 1 << 5;
/// MR mode: the provider chooses the keys.
pub const FI_MR_PROV_KEY: u64 = 1 << 6;
/// MR mode: registrations are bound to an endpoint and enabled.
pub const FI_MR_ENDPOINT: u64 = 1 << 9;

/// "No address": receive from any peer.
pub const FI_ADDR_UNSPEC: fi_addr_t = u64::MAX;

// Error numbers (positive; calls return them negated). On Linux the
// classic ones are the system's errno values.

/// Try again (`EAGAIN`).
pub const FI_EAGAIN: c_int = libc::EAGAIN;
/// Function not implemented (`ENOSYS`).
pub const FI_ENOSYS: c_int = libc::ENOSYS;
/// Protocol (option) not available (`ENOPROTOOPT`).
pub const FI_ENOPROTOOPT: c_int = libc::ENOPROTOOPT;
/// An error entry is available on the completion queue.
pub const FI_EAVAIL: c_int = 259;
/// Required key not available (an application MR key is in use).
pub const FI_ENOKEY: c_int = 266;

// Enumerations: C enums with non-negative values, 4 bytes on the
// platforms libfabric supports.

/// `enum fi_ep_type`.
pub type fi_ep_type = u32;
/// Reliable datagram endpoint.
pub const FI_EP_RDM: fi_ep_type = 3;

/// The endpoint protocol of `fi_ep_attr::protocol` (an anonymous enum).
pub const FI_PROTO_SHM: u32 = 16;

/// `enum fi_threading`.
pub type fi_threading = u32;
/// Any object may be used from any thread.
pub const FI_THREAD_SAFE: fi_threading = 1;

/// `enum fi_progress`.
pub type fi_progress = u32;
/// The provider progresses by itself (its own threads or the hardware).
pub const FI_PROGRESS_AUTO: fi_progress = 1;
/// The provider progresses only while the application calls into it.
pub const FI_PROGRESS_MANUAL: fi_progress = 2;

/// `enum fi_resource_mgmt`.
pub type fi_resource_mgmt = u32;

/// `enum fi_av_type`.
pub type fi_av_type = u32;
/// Address vector indexed by insertion order.
pub const FI_AV_TABLE: fi_av_type = 2;

/// `enum fi_cq_format`.
pub type fi_cq_format = u32;
/// Entries are [`fi_cq_data_entry`].
pub const FI_CQ_FORMAT_DATA: fi_cq_format = 3;

/// `enum fi_wait_obj`.
pub type fi_wait_obj = u32;
/// No wait object.
pub const FI_WAIT_NONE: fi_wait_obj = 0;
/// A wait object of the provider's choice, usable through
/// `fi_cq_sread` only (nothing to poll(2) on).
pub const FI_WAIT_UNSPEC: fi_wait_obj = 1;
/// A file descriptor (`fi_control(FI_GETWAIT)` returns it).
pub const FI_WAIT_FD: fi_wait_obj = 3;

/// `enum fi_cq_wait_cond`.
pub type fi_cq_wait_cond = u32;

/// `enum fi_datatype`.
pub type fi_datatype = u32;
/// Unsigned 64-bit integer.
pub const FI_UINT64: fi_datatype = 7;

/// `enum fi_op`.
pub type fi_op = u32;
/// Fetch-and-add.
pub const FI_SUM: fi_op = 2;
/// Compare-and-swap.
pub const FI_CSWAP: fi_op = 12;

// `fi_control` commands.

/// Get the wait object (an `int` file descriptor for `FI_WAIT_FD`).
pub const FI_GETWAIT: c_int = 5;
/// Enable an endpoint or memory region.
pub const FI_ENABLE: c_int = 6;

// `fi_setopt` levels and names.

/// Option level of endpoint options.
pub const FI_OPT_ENDPOINT: c_int = 0;
/// Endpoint option (`bool`, API 1.18 and newer): whether the provider may
/// move data through shared memory to peers on the same host. Not in
/// 1.17's headers, so `tests/abi.rs` cannot check it; older libraries
/// answer `-FI_ENOPROTOOPT`.
pub const FI_OPT_SHARED_MEMORY_PERMITTED: c_int = 11;

/// An operation-table slot the project never calls: only its size and
/// place matter (one function pointer).
pub type Unused = Option<unsafe extern "C" fn()>;

/// `struct fid`: the head of every libfabric object. Whole.
#[repr(C)]
pub struct fid {
    /// The object's class (`FI_CLASS_*`).
    pub fclass: usize,
    /// The application's context given when the object was opened.
    pub context: *mut c_void,
    /// The operations every object has.
    pub ops: *mut fi_ops,
}

/// `struct fi_ops`: operations of every object. Prefix.
#[repr(C)]
pub struct fi_ops {
    /// Size of the provider's table.
    pub size: usize,
    /// `fi_close`.
    pub close: Option<unsafe extern "C" fn(fid: *mut fid) -> c_int>,
    /// `fi_ep_bind`, `fi_mr_bind`.
    pub bind: Option<unsafe extern "C" fn(fid: *mut fid, bfid: *mut fid, flags: u64) -> c_int>,
    /// `fi_control`.
    pub control:
        Option<unsafe extern "C" fn(fid: *mut fid, command: c_int, arg: *mut c_void) -> c_int>,
    _tail: [u8; 0],
}

/// `struct fi_tx_attr`: transmit attributes. Prefix.
#[repr(C)]
pub struct fi_tx_attr {
    /// Transmit capabilities.
    pub caps: u64,
    /// Mode bits.
    pub mode: u64,
    /// Default operation flags.
    pub op_flags: u64,
    /// Ordering the provider keeps between operations (`FI_ORDER_*`).
    pub msg_order: u64,
    /// Completion ordering (`FI_ORDER_*`).
    pub comp_order: u64,
    /// Largest message `fi_inject` takes.
    pub inject_size: usize,
    /// Transmit queue depth.
    pub size: usize,
    /// Most local buffers (iovecs) one operation may carry.
    pub iov_limit: usize,
    /// Most remote ranges one RMA operation may carry.
    pub rma_iov_limit: usize,
    _tail: [u8; 0],
}

/// `struct fi_rx_attr`: receive attributes. Prefix (declared up to
/// `msg_order`).
#[repr(C)]
pub struct fi_rx_attr {
    /// Receive capabilities.
    pub caps: u64,
    /// Mode bits.
    pub mode: u64,
    /// Default operation flags.
    pub op_flags: u64,
    /// Ordering the provider keeps between arriving operations
    /// (`FI_ORDER_*`).
    pub msg_order: u64,
    _tail: [u8; 0],
}

/// `struct fi_ep_attr`: endpoint attributes. Prefix (declared up to
/// `max_order_waw_size`).
#[repr(C)]
pub struct fi_ep_attr {
    /// Endpoint type (`type` in C).
    pub type_: fi_ep_type,
    /// Wire protocol (`FI_PROTO_*`).
    pub protocol: u32,
    /// Version of the wire protocol.
    pub protocol_version: u32,
    /// Largest message one operation moves.
    pub max_msg_size: usize,
    /// Bytes of prefix `FI_MSG_PREFIX` needs (0 without it).
    pub msg_prefix_size: usize,
    /// Data ordering: a read after a write, both at most this many bytes,
    /// sees the write where they overlap (0: never; `usize::MAX`: any
    /// size).
    pub max_order_raw_size: usize,
    /// Data ordering of a write after a read (as `max_order_raw_size`).
    pub max_order_war_size: usize,
    /// Data ordering of a write after a write (as `max_order_raw_size`).
    pub max_order_waw_size: usize,
    _tail: [u8; 0],
}

/// `struct fi_domain_attr`: domain attributes. Prefix.
#[repr(C)]
pub struct fi_domain_attr {
    /// The domain these attributes describe, if open.
    pub domain: *mut fid_domain,
    /// Domain name.
    pub name: *mut c_char,
    /// Threading model.
    pub threading: fi_threading,
    /// Progress of control operations.
    pub control_progress: fi_progress,
    /// Progress of data transfers.
    pub data_progress: fi_progress,
    /// Resource management.
    pub resource_mgmt: fi_resource_mgmt,
    /// Address-vector type.
    pub av_type: fi_av_type,
    /// Memory-registration mode bits (`FI_MR_*`).
    pub mr_mode: c_int,
    /// Size of a memory-region key, in bytes.
    pub mr_key_size: usize,
    /// Bytes of remote CQ data (the immediate) a write may carry.
    pub cq_data_size: usize,
    _tail: [u8; 0],
}

/// `struct fi_fabric_attr`: fabric attributes. Prefix (every 1.17 field
/// declared).
#[repr(C)]
pub struct fi_fabric_attr {
    /// The fabric these attributes describe, if open.
    pub fabric: *mut fid_fabric,
    /// Fabric name.
    pub name: *mut c_char,
    /// Provider name (`malloc`ed: `fi_freeinfo` frees it).
    pub prov_name: *mut c_char,
    /// Provider version.
    pub prov_version: u32,
    /// API version the fabric is opened with.
    pub api_version: u32,
    _tail: [u8; 0],
}

/// `struct fi_info`: one provider's offer, or hints. Prefix (declared up
/// to `fabric_attr`).
#[repr(C)]
pub struct fi_info {
    /// Next entry of the list.
    pub next: *mut fi_info,
    /// Capabilities.
    pub caps: u64,
    /// Mode bits.
    pub mode: u64,
    /// Address format.
    pub addr_format: u32,
    /// Length of `src_addr`.
    pub src_addrlen: usize,
    /// Length of `dest_addr`.
    pub dest_addrlen: usize,
    /// Source address.
    pub src_addr: *mut c_void,
    /// Destination address.
    pub dest_addr: *mut c_void,
    /// Connection handle (`fid_t`).
    pub handle: *mut fid,
    /// Transmit attributes.
    pub tx_attr: *mut fi_tx_attr,
    /// Receive attributes.
    pub rx_attr: *mut fi_rx_attr,
    /// Endpoint attributes.
    pub ep_attr: *mut fi_ep_attr,
    /// Domain attributes.
    pub domain_attr: *mut fi_domain_attr,
    /// Fabric attributes.
    pub fabric_attr: *mut fi_fabric_attr,
    /// The NIC's attributes, where the provider gives them (EFA does;
    /// `tcp` does not).
    pub nic: *mut fid_nic,
    _tail: [u8; 0],
}

/// `enum fi_bus_type`: a PCI bus.
pub const FI_BUS_PCI: u32 = 1;

/// `struct fi_pci_attr`: a PCI function's address.
#[repr(C)]
pub struct fi_pci_attr {
    /// PCI domain (segment).
    pub domain_id: u16,
    /// Bus.
    pub bus_id: u8,
    /// Device.
    pub device_id: u8,
    /// Function.
    pub function_id: u8,
}

/// `struct fi_bus_attr`: where a NIC sits. Prefix (the `attr` union's
/// only member in 1.17 is `pci`).
#[repr(C)]
pub struct fi_bus_attr {
    /// `enum fi_bus_type` ([`FI_BUS_PCI`]).
    pub bus_type: u32,
    /// `attr.pci`, valid for a PCI bus.
    pub attr: fi_pci_attr,
    _tail: [u8; 0],
}

/// `struct fid_nic`: a NIC's attributes. Prefix.
#[repr(C)]
pub struct fid_nic {
    /// The NIC's fid.
    pub fid: fid,
    /// `struct fi_device_attr *` (never read; opaque).
    pub device_attr: *mut c_void,
    /// Its bus, where known.
    pub bus_attr: *mut fi_bus_attr,
    _tail: [u8; 0],
}

/// `struct fi_ops_fabric`. Prefix.
#[repr(C)]
pub struct fi_ops_fabric {
    /// Size of the provider's table.
    pub size: usize,
    /// `fi_domain`.
    pub domain: Option<
        unsafe extern "C" fn(
            fabric: *mut fid_fabric,
            info: *mut fi_info,
            dom: *mut *mut fid_domain,
            context: *mut c_void,
        ) -> c_int,
    >,
    /// `fi_passive_ep`.
    pub passive_ep: Unused,
    /// `fi_eq_open`.
    pub eq_open: Unused,
    /// `fi_wait_open`.
    pub wait_open: Unused,
    /// `fi_trywait`.
    pub trywait: Option<
        unsafe extern "C" fn(fabric: *mut fid_fabric, fids: *mut *mut fid, count: c_int) -> c_int,
    >,
    _tail: [u8; 0],
}

/// `struct fid_fabric`. Prefix (every 1.17 field declared).
#[repr(C)]
pub struct fid_fabric {
    /// Object head.
    pub fid: fid,
    /// Fabric operations.
    pub ops: *mut fi_ops_fabric,
    /// The API version the fabric was opened with.
    pub api_version: u32,
    _tail: [u8; 0],
}

/// `struct fi_ops_domain`. Prefix.
#[repr(C)]
pub struct fi_ops_domain {
    /// Size of the provider's table.
    pub size: usize,
    /// `fi_av_open`.
    pub av_open: Option<
        unsafe extern "C" fn(
            domain: *mut fid_domain,
            attr: *mut fi_av_attr,
            av: *mut *mut fid_av,
            context: *mut c_void,
        ) -> c_int,
    >,
    /// `fi_cq_open`.
    pub cq_open: Option<
        unsafe extern "C" fn(
            domain: *mut fid_domain,
            attr: *mut fi_cq_attr,
            cq: *mut *mut fid_cq,
            context: *mut c_void,
        ) -> c_int,
    >,
    /// `fi_endpoint`.
    pub endpoint: Option<
        unsafe extern "C" fn(
            domain: *mut fid_domain,
            info: *mut fi_info,
            ep: *mut *mut fid_ep,
            context: *mut c_void,
        ) -> c_int,
    >,
    _tail: [u8; 0],
}

/// `struct fi_ops_mr`. Prefix.
#[repr(C)]
pub struct fi_ops_mr {
    /// Size of the provider's table.
    pub size: usize,
    /// `fi_mr_reg`.
    pub reg: Option<
        unsafe extern "C" fn(
            fid: *mut fid,
            buf: *const c_void,
            len: usize,
            access: u64,
            offset: u64,
            requested_key: u64,
            flags: u64,
            mr: *mut *mut fid_mr,
            context: *mut c_void,
        ) -> c_int,
    >,
    _tail: [u8; 0],
}

/// `struct fid_domain`. Prefix (every 1.17 field declared).
#[repr(C)]
pub struct fid_domain {
    /// Object head.
    pub fid: fid,
    /// Domain operations.
    pub ops: *mut fi_ops_domain,
    /// Memory-registration operations.
    pub mr: *mut fi_ops_mr,
    _tail: [u8; 0],
}

/// `struct fid_mr`. Prefix (every 1.17 field declared).
#[repr(C)]
pub struct fid_mr {
    /// Object head.
    pub fid: fid,
    /// Local descriptor (`fi_mr_desc`).
    pub mem_desc: *mut c_void,
    /// Remote key (`fi_mr_key`).
    pub key: u64,
    _tail: [u8; 0],
}

/// `struct fi_av_attr`. Padded (pass inside [`Padded`]).
#[repr(C)]
pub struct fi_av_attr {
    /// Address-vector type (`type` in C).
    pub type_: fi_av_type,
    /// Receive-context bits of an address.
    pub rx_ctx_bits: c_int,
    /// Expected number of addresses.
    pub count: usize,
    /// Endpoints per node.
    pub ep_per_node: usize,
    /// Name of a shared address vector.
    pub name: *const c_char,
    /// Base address of a shared map.
    pub map_addr: *mut c_void,
    /// Flags.
    pub flags: u64,
}

/// `struct fi_ops_av`. Prefix.
#[repr(C)]
pub struct fi_ops_av {
    /// Size of the provider's table.
    pub size: usize,
    /// `fi_av_insert`.
    pub insert: Option<
        unsafe extern "C" fn(
            av: *mut fid_av,
            addr: *const c_void,
            count: usize,
            fi_addr: *mut fi_addr_t,
            flags: u64,
            context: *mut c_void,
        ) -> c_int,
    >,
    /// `fi_av_insertsvc`.
    pub insertsvc: Unused,
    /// `fi_av_insertsym`.
    pub insertsym: Unused,
    /// `fi_av_remove`.
    pub remove: Option<
        unsafe extern "C" fn(
            av: *mut fid_av,
            fi_addr: *mut fi_addr_t,
            count: usize,
            flags: u64,
        ) -> c_int,
    >,
    _tail: [u8; 0],
}

/// `struct fid_av`. Prefix (every 1.17 field declared).
#[repr(C)]
pub struct fid_av {
    /// Object head.
    pub fid: fid,
    /// Address-vector operations.
    pub ops: *mut fi_ops_av,
    _tail: [u8; 0],
}

/// `struct fi_cq_attr`. Padded (pass inside [`Padded`]).
#[repr(C)]
pub struct fi_cq_attr {
    /// Number of entries.
    pub size: usize,
    /// Flags.
    pub flags: u64,
    /// Entry format.
    pub format: fi_cq_format,
    /// Wait object.
    pub wait_obj: fi_wait_obj,
    /// Interrupt vector hint.
    pub signaling_vector: c_int,
    /// Wait condition.
    pub wait_cond: fi_cq_wait_cond,
    /// Wait set (`struct fid_wait *`; unused: null).
    pub wait_set: *mut c_void,
}

/// `struct fi_cq_data_entry`: a completion in [`FI_CQ_FORMAT_DATA`].
/// Whole.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct fi_cq_data_entry {
    /// The operation's context.
    pub op_context: *mut c_void,
    /// Completion flags.
    pub flags: u64,
    /// Received length.
    pub len: usize,
    /// Receive buffer.
    pub buf: *mut c_void,
    /// Remote CQ data.
    pub data: u64,
}

/// `struct fi_cq_err_entry`: an error completion. Padded (pass inside
/// [`Padded`]; API 1.20 appended `src_addr`).
#[repr(C)]
pub struct fi_cq_err_entry {
    /// The operation's context.
    pub op_context: *mut c_void,
    /// Completion flags.
    pub flags: u64,
    /// Length transferred.
    pub len: usize,
    /// Receive buffer.
    pub buf: *mut c_void,
    /// Remote CQ data.
    pub data: u64,
    /// Tag.
    pub tag: u64,
    /// Overflow length of a truncated receive.
    pub olen: usize,
    /// Error number (positive).
    pub err: c_int,
    /// Provider-specific error number.
    pub prov_errno: c_int,
    /// Provider-specific error data.
    pub err_data: *mut c_void,
    /// Size of `err_data`.
    pub err_data_size: usize,
}

/// `struct fi_ops_cq`. Prefix.
#[repr(C)]
pub struct fi_ops_cq {
    /// Size of the provider's table.
    pub size: usize,
    /// `fi_cq_read`.
    pub read:
        Option<unsafe extern "C" fn(cq: *mut fid_cq, buf: *mut c_void, count: usize) -> isize>,
    /// `fi_cq_readfrom`.
    pub readfrom: Unused,
    /// `fi_cq_readerr`.
    pub readerr: Option<
        unsafe extern "C" fn(cq: *mut fid_cq, buf: *mut fi_cq_err_entry, flags: u64) -> isize,
    >,
    /// `fi_cq_sread`.
    pub sread: Option<
        unsafe extern "C" fn(
            cq: *mut fid_cq,
            buf: *mut c_void,
            count: usize,
            cond: *const c_void,
            timeout: c_int,
        ) -> isize,
    >,
    /// `fi_cq_sreadfrom`.
    pub sreadfrom: Unused,
    /// `fi_cq_signal`.
    pub signal: Option<unsafe extern "C" fn(cq: *mut fid_cq) -> c_int>,
    _tail: [u8; 0],
}

/// `struct fid_cq`. Prefix (every 1.17 field declared).
#[repr(C)]
pub struct fid_cq {
    /// Object head.
    pub fid: fid,
    /// Completion-queue operations.
    pub ops: *mut fi_ops_cq,
    _tail: [u8; 0],
}

/// `struct fi_context2`: the provider's scratch space in each operation's
/// context (mode [`FI_CONTEXT2`]). Whole.
#[repr(C)]
pub struct fi_context2 {
    /// Owned by the provider while the operation is in flight.
    pub internal: [*mut c_void; 8],
}

/// `struct fi_rma_iov`: one remote range. Whole.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fi_rma_iov {
    /// Remote address (virtual or offset, per `FI_MR_VIRT_ADDR`).
    pub addr: u64,
    /// Length in bytes.
    pub len: usize,
    /// Remote key.
    pub key: u64,
}

/// `struct fi_msg_rma`: the message of `fi_writemsg`. Whole.
#[repr(C)]
pub struct fi_msg_rma {
    /// Local buffers.
    pub msg_iov: *const iovec,
    /// Their descriptors.
    pub desc: *mut *mut c_void,
    /// Number of local buffers.
    pub iov_count: usize,
    /// Peer.
    pub addr: fi_addr_t,
    /// Remote ranges.
    pub rma_iov: *const fi_rma_iov,
    /// Number of remote ranges.
    pub rma_iov_count: usize,
    /// The operation's context.
    pub context: *mut c_void,
    /// Remote CQ data.
    pub data: u64,
}

/// `struct fi_ops_ep`. Prefix.
#[repr(C)]
pub struct fi_ops_ep {
    /// Size of the provider's table.
    pub size: usize,
    /// `fi_cancel`.
    pub cancel: Unused,
    /// `fi_getopt`.
    pub getopt: Unused,
    /// `fi_setopt`.
    pub setopt: Option<
        unsafe extern "C" fn(
            fid: *mut fid,
            level: c_int,
            optname: c_int,
            optval: *const c_void,
            optlen: usize,
        ) -> c_int,
    >,
    _tail: [u8; 0],
}

/// `struct fi_ops_cm`. Prefix.
#[repr(C)]
pub struct fi_ops_cm {
    /// Size of the provider's table.
    pub size: usize,
    /// `fi_setname`.
    pub setname: Unused,
    /// `fi_getname`.
    pub getname: Option<
        unsafe extern "C" fn(fid: *mut fid, addr: *mut c_void, addrlen: *mut usize) -> c_int,
    >,
    _tail: [u8; 0],
}

/// `struct fi_ops_msg`. Prefix.
#[repr(C)]
pub struct fi_ops_msg {
    /// Size of the provider's table.
    pub size: usize,
    /// `fi_recv`.
    pub recv: Option<
        unsafe extern "C" fn(
            ep: *mut fid_ep,
            buf: *mut c_void,
            len: usize,
            desc: *mut c_void,
            src_addr: fi_addr_t,
            context: *mut c_void,
        ) -> isize,
    >,
    /// `fi_recvv`.
    pub recvv: Unused,
    /// `fi_recvmsg`.
    pub recvmsg: Unused,
    /// `fi_send`.
    pub send: Option<
        unsafe extern "C" fn(
            ep: *mut fid_ep,
            buf: *const c_void,
            len: usize,
            desc: *mut c_void,
            dest_addr: fi_addr_t,
            context: *mut c_void,
        ) -> isize,
    >,
    _tail: [u8; 0],
}

/// `struct fi_ops_tagged`. Prefix (up to `send`).
#[repr(C)]
pub struct fi_ops_tagged {
    /// Size of the provider's table.
    pub size: usize,
    /// `fi_trecv`.
    pub recv: Option<
        unsafe extern "C" fn(
            ep: *mut fid_ep,
            buf: *mut c_void,
            len: usize,
            desc: *mut c_void,
            src_addr: fi_addr_t,
            tag: u64,
            ignore: u64,
            context: *mut c_void,
        ) -> isize,
    >,
    /// `fi_trecvv`.
    pub recvv: Unused,
    /// `fi_trecvmsg`.
    pub recvmsg: Unused,
    /// `fi_tsend`.
    pub send: Option<
        unsafe extern "C" fn(
            ep: *mut fid_ep,
            buf: *const c_void,
            len: usize,
            desc: *mut c_void,
            dest_addr: fi_addr_t,
            tag: u64,
            context: *mut c_void,
        ) -> isize,
    >,
    _tail: [u8; 0],
}

/// `struct fi_ops_rma`. Prefix.
#[repr(C)]
pub struct fi_ops_rma {
    /// Size of the provider's table.
    pub size: usize,
    /// `fi_read`.
    pub read: Option<
        unsafe extern "C" fn(
            ep: *mut fid_ep,
            buf: *mut c_void,
            len: usize,
            desc: *mut c_void,
            src_addr: fi_addr_t,
            addr: u64,
            key: u64,
            context: *mut c_void,
        ) -> isize,
    >,
    /// `fi_readv`.
    pub readv: Unused,
    /// `fi_readmsg`.
    pub readmsg:
        Option<unsafe extern "C" fn(ep: *mut fid_ep, msg: *const fi_msg_rma, flags: u64) -> isize>,
    /// `fi_write`.
    pub write: Option<
        unsafe extern "C" fn(
            ep: *mut fid_ep,
            buf: *const c_void,
            len: usize,
            desc: *mut c_void,
            dest_addr: fi_addr_t,
            addr: u64,
            key: u64,
            context: *mut c_void,
        ) -> isize,
    >,
    /// `fi_writev`.
    pub writev: Unused,
    /// `fi_writemsg`.
    pub writemsg:
        Option<unsafe extern "C" fn(ep: *mut fid_ep, msg: *const fi_msg_rma, flags: u64) -> isize>,
    /// `fi_inject_write`.
    pub inject: Unused,
    /// `fi_writedata`.
    pub writedata: Option<
        unsafe extern "C" fn(
            ep: *mut fid_ep,
            buf: *const c_void,
            len: usize,
            desc: *mut c_void,
            data: u64,
            dest_addr: fi_addr_t,
            addr: u64,
            key: u64,
            context: *mut c_void,
        ) -> isize,
    >,
    _tail: [u8; 0],
}

/// `fi_ops_atomic::readwrite` (`fi_fetch_atomic`).
pub type ReadWriteFn = unsafe extern "C" fn(
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
) -> isize;

/// `fi_ops_atomic::compwrite` (`fi_compare_atomic`).
pub type CompWriteFn = unsafe extern "C" fn(
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
) -> isize;

/// `fi_ops_atomic::*valid`: whether an atomic is supported, and its
/// largest element count.
pub type ValidFn = unsafe extern "C" fn(
    ep: *mut fid_ep,
    datatype: fi_datatype,
    op: fi_op,
    count: *mut usize,
) -> c_int;

/// `struct fi_ops_atomic`. Prefix.
#[repr(C)]
pub struct fi_ops_atomic {
    /// Size of the provider's table.
    pub size: usize,
    /// `fi_atomic`.
    pub write: Unused,
    /// `fi_atomicv`.
    pub writev: Unused,
    /// `fi_atomicmsg`.
    pub writemsg: Unused,
    /// `fi_inject_atomic`.
    pub inject: Unused,
    /// `fi_fetch_atomic`.
    pub readwrite: Option<ReadWriteFn>,
    /// `fi_fetch_atomicv`.
    pub readwritev: Unused,
    /// `fi_fetch_atomicmsg`.
    pub readwritemsg: Unused,
    /// `fi_compare_atomic`.
    pub compwrite: Option<CompWriteFn>,
    /// `fi_compare_atomicv`.
    pub compwritev: Unused,
    /// `fi_compare_atomicmsg`.
    pub compwritemsg: Unused,
    /// `fi_atomicvalid`.
    pub writevalid: Unused,
    /// `fi_fetch_atomicvalid`.
    pub readwritevalid: Option<ValidFn>,
    /// `fi_compare_atomicvalid`.
    pub compwritevalid: Option<ValidFn>,
    _tail: [u8; 0],
}

/// `struct fid_ep`. Prefix (declared up to `atomic`).
#[repr(C)]
pub struct fid_ep {
    /// Object head.
    pub fid: fid,
    /// Endpoint operations.
    pub ops: *mut fi_ops_ep,
    /// Connection-management operations.
    pub cm: *mut fi_ops_cm,
    /// Message operations.
    pub msg: *mut fi_ops_msg,
    /// RMA operations.
    pub rma: *mut fi_ops_rma,
    /// Tagged-message operations.
    pub tagged: *mut fi_ops_tagged,
    /// Atomic operations.
    pub atomic: *mut fi_ops_atomic,
    _tail: [u8; 0],
}

/// How many bytes [`Padded`] reserves behind a struct: room for fields
/// later API versions append (one so far, 8 bytes).
pub const PAD_RESERVE: usize = 64;

/// A struct the application creates, followed by zeroed room for fields
/// later API versions append (see the module docs). A provider serving a
/// newer API version than 1.17 may read or write those fields; it then
/// finds zeros (unset) or writes into the reserve.
#[repr(C)]
pub struct Padded<T> {
    /// The struct as declared.
    pub value: T,
    reserve: [u8; PAD_RESERVE],
}

impl<T> Padded<T> {
    /// `value` followed by a zeroed reserve.
    pub fn new(value: T) -> Self {
        Padded {
            value,
            reserve: [0; PAD_RESERVE],
        }
    }

    /// A pointer to the struct whose provenance covers the reserve too,
    /// for libfabric to read or write past the declared fields.
    pub fn as_mut_ptr(&mut self) -> *mut T {
        (self as *mut Self).cast()
    }
}

impl Default for fi_av_attr {
    fn default() -> Self {
        fi_av_attr {
            type_: 0,
            rx_ctx_bits: 0,
            count: 0,
            ep_per_node: 0,
            name: ptr::null(),
            map_addr: ptr::null_mut(),
            flags: 0,
        }
    }
}

impl Default for fi_cq_attr {
    fn default() -> Self {
        fi_cq_attr {
            size: 0,
            flags: 0,
            format: 0,
            wait_obj: 0,
            signaling_vector: 0,
            wait_cond: 0,
            wait_set: ptr::null_mut(),
        }
    }
}

impl Default for fi_cq_data_entry {
    fn default() -> Self {
        fi_cq_data_entry {
            op_context: ptr::null_mut(),
            flags: 0,
            len: 0,
            buf: ptr::null_mut(),
            data: 0,
        }
    }
}

impl Default for fi_cq_err_entry {
    fn default() -> Self {
        fi_cq_err_entry {
            op_context: ptr::null_mut(),
            flags: 0,
            len: 0,
            buf: ptr::null_mut(),
            data: 0,
            tag: 0,
            olen: 0,
            err: 0,
            prov_errno: 0,
            err_data: ptr::null_mut(),
            err_data_size: 0,
        }
    }
}

impl Default for fi_context2 {
    fn default() -> Self {
        fi_context2 {
            internal: [ptr::null_mut(); 8],
        }
    }
}
