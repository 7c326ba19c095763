/* See shim.h: each wrapper forwards to the libfabric inline of the same
 * name, so the behaviour is exactly libfabric's (rfi_writemsg1 only fills
 * in fi_writemsg's message structs). */
#include "shim.h"

const uint64_t rfi_addr_unspec = FI_ADDR_UNSPEC;
const int rfi_eagain = FI_EAGAIN;
const int rfi_eavail = FI_EAVAIL;

struct fi_info *rfi_allocinfo(void) { return fi_allocinfo(); }
int rfi_close(struct fid *fid) { return fi_close(fid); }
int rfi_domain(struct fid_fabric *fabric, struct fi_info *info,
               struct fid_domain **domain, void *context) {
  return fi_domain(fabric, info, domain, context);
}
int rfi_endpoint(struct fid_domain *domain, struct fi_info *info,
                 struct fid_ep **ep, void *context) {
  return fi_endpoint(domain, info, ep, context);
}
int rfi_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr,
                struct fid_cq **cq, void *context) {
  return fi_cq_open(domain, attr, cq, context);
}
int rfi_av_open(struct fid_domain *domain, struct fi_av_attr *attr,
                struct fid_av **av, void *context) {
  return fi_av_open(domain, attr, av, context);
}
int rfi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags) {
  return fi_ep_bind(ep, bfid, flags);
}
int rfi_enable(struct fid_ep *ep) { return fi_enable(ep); }
int rfi_getname(struct fid *fid, void *addr, size_t *addrlen) {
  return fi_getname(fid, addr, addrlen);
}
int rfi_av_insert(struct fid_av *av, const void *addr, size_t count,
                  fi_addr_t *fi_addr, uint64_t flags, void *context) {
  return fi_av_insert(av, addr, count, fi_addr, flags, context);
}
int rfi_av_remove(struct fid_av *av, fi_addr_t *fi_addr, size_t count,
                  uint64_t flags) {
  return fi_av_remove(av, fi_addr, count, flags);
}
int rfi_mr_reg(struct fid_domain *domain, const void *buf, size_t len,
               uint64_t access, uint64_t offset, uint64_t requested_key,
               uint64_t flags, struct fid_mr **mr, void *context) {
  return fi_mr_reg(domain, buf, len, access, offset, requested_key, flags, mr,
                   context);
}
int rfi_mr_bind(struct fid_mr *mr, struct fid *bfid, uint64_t flags) {
  return fi_mr_bind(mr, bfid, flags);
}
int rfi_mr_enable(struct fid_mr *mr) { return fi_mr_enable(mr); }
uint64_t rfi_mr_key(struct fid_mr *mr) { return fi_mr_key(mr); }
void *rfi_mr_desc(struct fid_mr *mr) { return fi_mr_desc(mr); }
ssize_t rfi_write(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                  fi_addr_t dest_addr, uint64_t addr, uint64_t key,
                  void *context) {
  return fi_write(ep, buf, len, desc, dest_addr, addr, key, context);
}
ssize_t rfi_writedata(struct fid_ep *ep, const void *buf, size_t len,
                      void *desc, uint64_t data, fi_addr_t dest_addr,
                      uint64_t addr, uint64_t key, void *context) {
  return fi_writedata(ep, buf, len, desc, data, dest_addr, addr, key, context);
}
/* fi_writemsg of one contiguous buffer (none when len is 0) to one remote
 * range, with per-operation flags: the message structs are built here so
 * the Rust side needs no iovec layout. */
ssize_t rfi_writemsg1(struct fid_ep *ep, const void *buf, size_t len,
                      void *desc, uint64_t data, fi_addr_t dest_addr,
                      uint64_t addr, uint64_t key, void *context,
                      uint64_t flags) {
  struct iovec iov = {(void *)buf, len};
  struct fi_rma_iov rma = {addr, len, key};
  struct fi_msg_rma msg = {
      .msg_iov = len ? &iov : NULL,
      .desc = len ? &desc : NULL,
      .iov_count = len ? 1 : 0,
      .addr = dest_addr,
      .rma_iov = &rma,
      .rma_iov_count = 1,
      .context = context,
      .data = data,
  };
  return fi_writemsg(ep, &msg, flags);
}
ssize_t rfi_read(struct fid_ep *ep, void *buf, size_t len, void *desc,
                 fi_addr_t src_addr, uint64_t addr, uint64_t key,
                 void *context) {
  return fi_read(ep, buf, len, desc, src_addr, addr, key, context);
}
ssize_t rfi_compare_atomic(struct fid_ep *ep, const void *buf, size_t count,
                           void *desc, const void *compare, void *compare_desc,
                           void *result, void *result_desc,
                           fi_addr_t dest_addr, uint64_t addr, uint64_t key,
                           enum fi_datatype datatype, enum fi_op op,
                           void *context) {
  return fi_compare_atomic(ep, buf, count, desc, compare, compare_desc, result,
                           result_desc, dest_addr, addr, key, datatype, op,
                           context);
}
ssize_t rfi_fetch_atomic(struct fid_ep *ep, const void *buf, size_t count,
                         void *desc, void *result, void *result_desc,
                         fi_addr_t dest_addr, uint64_t addr, uint64_t key,
                         enum fi_datatype datatype, enum fi_op op,
                         void *context) {
  return fi_fetch_atomic(ep, buf, count, desc, result, result_desc, dest_addr,
                         addr, key, datatype, op, context);
}
int rfi_compare_atomicvalid(struct fid_ep *ep, enum fi_datatype datatype,
                            enum fi_op op, size_t *count) {
  return fi_compare_atomicvalid(ep, datatype, op, count);
}
int rfi_fetch_atomicvalid(struct fid_ep *ep, enum fi_datatype datatype,
                          enum fi_op op, size_t *count) {
  return fi_fetch_atomicvalid(ep, datatype, op, count);
}
ssize_t rfi_send(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                 fi_addr_t dest_addr, void *context) {
  return fi_send(ep, buf, len, desc, dest_addr, context);
}
ssize_t rfi_recv(struct fid_ep *ep, void *buf, size_t len, void *desc,
                 fi_addr_t src_addr, void *context) {
  return fi_recv(ep, buf, len, desc, src_addr, context);
}
int rfi_control(struct fid *fid, int command, void *arg) {
  return fi_control(fid, command, arg);
}
int rfi_trywait(struct fid_fabric *fabric, struct fid **fids, int count) {
  return fi_trywait(fabric, fids, count);
}
ssize_t rfi_cq_read(struct fid_cq *cq, void *buf, size_t count) {
  return fi_cq_read(cq, buf, count);
}
ssize_t rfi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf,
                       uint64_t flags) {
  return fi_cq_readerr(cq, buf, flags);
}
