/* Out-of-line wrappers over libfabric's `static inline` calls, so Rust can
 * link to them. Every function forwards its arguments unchanged; names are
 * the libfabric names with an `rfi_` prefix. Constants that bindgen cannot
 * evaluate from macros are exported as `rfi_`-prefixed variables. One
 * exception builds a call's arguments: `rfi_writemsg1` (fi_writemsg of one
 * buffer to one remote range, with per-operation flags). */
#ifndef ROLEX_FI_SHIM_H
#define ROLEX_FI_SHIM_H

#include <stdint.h>
#include <stddef.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_eq.h>

extern const uint64_t rfi_addr_unspec;
extern const int rfi_eagain;
extern const int rfi_eavail;

struct fi_info *rfi_allocinfo(void);
int rfi_close(struct fid *fid);
int rfi_domain(struct fid_fabric *fabric, struct fi_info *info,
               struct fid_domain **domain, void *context);
int rfi_endpoint(struct fid_domain *domain, struct fi_info *info,
                 struct fid_ep **ep, void *context);
int rfi_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr,
                struct fid_cq **cq, void *context);
int rfi_av_open(struct fid_domain *domain, struct fi_av_attr *attr,
                struct fid_av **av, void *context);
int rfi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags);
int rfi_enable(struct fid_ep *ep);
int rfi_getname(struct fid *fid, void *addr, size_t *addrlen);
int rfi_av_insert(struct fid_av *av, const void *addr, size_t count,
                  fi_addr_t *fi_addr, uint64_t flags, void *context);
int rfi_av_remove(struct fid_av *av, fi_addr_t *fi_addr, size_t count,
                  uint64_t flags);
int rfi_mr_reg(struct fid_domain *domain, const void *buf, size_t len,
               uint64_t access, uint64_t offset, uint64_t requested_key,
               uint64_t flags, struct fid_mr **mr, void *context);
int rfi_mr_bind(struct fid_mr *mr, struct fid *bfid, uint64_t flags);
int rfi_mr_enable(struct fid_mr *mr);
uint64_t rfi_mr_key(struct fid_mr *mr);
void *rfi_mr_desc(struct fid_mr *mr);
ssize_t rfi_write(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                  fi_addr_t dest_addr, uint64_t addr, uint64_t key,
                  void *context);
ssize_t rfi_writedata(struct fid_ep *ep, const void *buf, size_t len,
                      void *desc, uint64_t data, fi_addr_t dest_addr,
                      uint64_t addr, uint64_t key, void *context);
ssize_t rfi_writemsg1(struct fid_ep *ep, const void *buf, size_t len,
                      void *desc, uint64_t data, fi_addr_t dest_addr,
                      uint64_t addr, uint64_t key, void *context,
                      uint64_t flags);
ssize_t rfi_read(struct fid_ep *ep, void *buf, size_t len, void *desc,
                 fi_addr_t src_addr, uint64_t addr, uint64_t key,
                 void *context);
ssize_t rfi_compare_atomic(struct fid_ep *ep, const void *buf, size_t count,
                           void *desc, const void *compare, void *compare_desc,
                           void *result, void *result_desc,
                           fi_addr_t dest_addr, uint64_t addr, uint64_t key,
                           enum fi_datatype datatype, enum fi_op op,
                           void *context);
ssize_t rfi_fetch_atomic(struct fid_ep *ep, const void *buf, size_t count,
                         void *desc, void *result, void *result_desc,
                         fi_addr_t dest_addr, uint64_t addr, uint64_t key,
                         enum fi_datatype datatype, enum fi_op op,
                         void *context);
int rfi_compare_atomicvalid(struct fid_ep *ep, enum fi_datatype datatype,
                            enum fi_op op, size_t *count);
int rfi_fetch_atomicvalid(struct fid_ep *ep, enum fi_datatype datatype,
                          enum fi_op op, size_t *count);
ssize_t rfi_send(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                 fi_addr_t dest_addr, void *context);
ssize_t rfi_recv(struct fid_ep *ep, void *buf, size_t len, void *desc,
                 fi_addr_t src_addr, void *context);
int rfi_control(struct fid *fid, int command, void *arg);
int rfi_trywait(struct fid_fabric *fabric, struct fid **fids, int count);
ssize_t rfi_cq_read(struct fid_cq *cq, void *buf, size_t count);
ssize_t rfi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf,
                       uint64_t flags);

#endif
