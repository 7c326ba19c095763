//! Paged writes by message: where the provider's RMA runs in the target's
//! CPU anyway (`tcp;ofi_rxm`; `sockets` forced on: [`efa::PagedByMessage`]), the
//! pages of paged writes to one peer leave packed into tagged messages
//! instead of chained one-sided writes of at most `iov_limit` pages (4 on
//! `tcp;ofi_rxm`) each, every one with its own `sendmsg` and receive.
//!
//! - **Sender** (`FabricEndpoint::post`): consecutive pages to one peer
//!   of one post call (same peer, immediate and source region; each at
//!   most [`PAGE_LIMIT`] bytes and small enough that a message carries
//!   more of them than a one-sided chain, [`worth`]; starting at a
//!   transfer of at least two) are gathered (at most
//!   [`DATA_LIMIT`] bytes) and packed in order into [`PagedMsg`]s that
//!   the provider sends eagerly ([`pack`], [`eager_limit`]). A message
//!   holds *segments*, the runs of one transfer's pages, each with a
//!   sequence number of its own; a transfer larger than a message spans
//!   two or more. The message (header: immediate, the sender's address,
//!   the segments, per page the key and address as the provider would
//!   take them and the length; then the bytes, copied out of the source
//!   region at posting) is the context's own buffer, sent with `fi_tsend`
//!   and [`PAGED_TAG`]. Tagged messages never match the untagged receives
//!   the engine posts for its users' messages
//!   ([`Domain::post_recv`](crate::domain::Domain::post_recv)), and the
//!   engine's messages never match ours. The last message of a post call
//!   to each peer asks for the acknowledgements ([`PagedMsg::ack_now`]).
//! - **Target** (the domain's progress path, whoever reads the queue):
//!   [`RECV_SLOTS`] tagged receives of [`slot_bytes`] each are posted
//!   when the NIC opens and reposted as each completes. A message is
//!   decoded (peer input: malformed ones are counted as errors and
//!   dropped; the sender then times out); every page of a segment is
//!   checked against this domain's registrations as the provider would
//!   check a one-sided write (key known, region alive and granting
//!   remote writes, range inside), and only if all pass are they copied
//!   into place, then the immediate counted once per page (as each page
//!   of a one-sided paged write delivers one), then an [`Ack`] queued for
//!   the segment. A peer's queued acknowledgements are sent, one
//!   [`PagedAcks`] message, at the end of the progress round in which a
//!   message of that peer asked for them.
//! - **Completion**: a segment completes only on its acknowledgement
//!   (design §4: a completion means the data is visible at the target),
//!   with the error of a refused page if one was. Who releases what: the
//!   message's buffer belongs to its context (the first segment's
//!   `Inflight`), returned by the provider when the send completes and
//!   kept for the next message ([`recycle`]); an acknowledgement that
//!   comes first finishes the segment and leaves the context in
//!   `abandoned` until then. Each segment's bookkeeping (`retry_meta`
//!   while the message waits to be posted, then `Inflight`) is taken
//!   exactly once by whichever comes first: its acknowledgement, a failed
//!   or refused send (the first segment's error fails the others,
//!   [`Inner::fail_extras`]), the operation timeout (`Inner::expire`),
//!   `Endpoint::flush` or the NIC's shutdown.
//! - Acknowledgements are sent without a completion anyone waits for
//!   (their contexts are `abandoned` until the provider returns them); a
//!   lost one times the write out at the sender. A region deregistered at
//!   the target refuses later messages for it (its key is gone; a message
//!   being placed holds the region's guard, which deregistration waits
//!   for).
//! - Over a provider that never makes a one-sided write faster than its
//!   messages, the path costs the target's CPU nothing a one-sided write
//!   did not (the provider copied those bytes there as well) and saves a
//!   receive and an acknowledgement per `iov_limit` pages.

use std::ops::Range;
use std::sync::Arc;

use rolex_core::wire::{
    encode_paged_acks, paged_msg_len, peek_tag, Ack, AckStatus, NetAddr, PageTarget, PagedAcks,
    PagedMsg, MAX_ACKS, MAX_PAGES, PAGED_ACKS_TAG, PAGED_MSG_TAG, PAGE_ENTRY_LEN,
};

use super::ffi::{CtxKind, OpCtx, Post};
use super::{lock, Inflight, Inner, Live, MrScheme, Pending, Sink};
use crate::counters::Counters;
use crate::domain::WorkOp;
use crate::error::{ProtectionCheck, TransferError};
use crate::region::Region;
use rolex_core::wire::Access;

/// The tag of every message of this path (both kinds; the header's own
/// tag byte tells a [`PagedMsg`] from a [`PagedAcks`]).
pub(super) const PAGED_TAG: u64 = 0x524f_4c45_5850_4731;

/// Longest page sent by message; larger pages go one-sided (one write
/// moves them at the stream's rate already).
pub(super) const PAGE_LIMIT: u64 = 4096;

/// Most page bytes gathered from consecutive pages to one peer before
/// they are packed into messages ([`pack`]).
pub(super) const DATA_LIMIT: u64 = 256 * 1024;

/// Most pages gathered so.
pub(super) const GATHER_PAGES: usize = 256;

/// Largest message sent: `tcp;ofi_rxm` sends messages up to its buffer
/// size (`FI_OFI_RXM_BUFFER_SIZE`, 16 KiB by default: "Protocol limits:
/// Eager: 16384, SAR: 16384" in its log) in one go; a larger one takes
/// its rendezvous protocol (the target reads the data from the sender: a
/// round trip more, measured at half the rate). Where the variable is set
/// in this process, that is the limit.
pub(super) const EAGER_LIMIT: usize = 16 * 1024;

/// [`EAGER_LIMIT`], or `FI_OFI_RXM_BUFFER_SIZE` where set (at least
/// 1 KiB, at most the largest receive slot).
pub(super) fn eager_limit() -> usize {
    let n = rxm_buffer_size() as usize;
    if n < 1024 {
        EAGER_LIMIT
    } else {
        n.min(MAX_SLOT)
    }
}

/// `FI_OFI_RXM_BUFFER_SIZE` as this process set it, else rxm's default
/// ([`EAGER_LIMIT`]); read once.
pub(super) fn rxm_buffer_size() -> u32 {
    static SIZE: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *SIZE.get_or_init(|| {
        std::env::var("FI_OFI_RXM_BUFFER_SIZE")
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .unwrap_or(EAGER_LIMIT as u32)
    })
}

/// The largest receive a serving NIC posts (and so the largest message a
/// sender builds, whatever the buffer size).
const MAX_SLOT: usize = 1 << 20;

/// Packs `pages` (`(wr_id, page)`, consecutive pages to one peer) into
/// messages, in order, each as many pages as keep it within
/// [`eager_limit`] (at least one, at most [`MAX_PAGES`]): the ranges of
/// `pages` each message takes. A transfer's pages may straddle two
/// messages (one segment in each); 16 pages of 1 KiB and their header do
/// not fit 16 KiB, so a stream of such transfers takes 16/15 messages per
/// transfer rather than 2.
pub(super) fn pack(from: &NetAddr, pages: &[(u64, WorkOp)]) -> Vec<Range<usize>> {
    let limit = eager_limit();
    let len = |op: &WorkOp| match op {
        WorkOp::Write { len, .. } => *len as usize,
        _ => 0,
    };
    let mut out = Vec::new();
    let (mut start, mut segs, mut data) = (0, 0, 0);
    for (i, (id, op)) in pages.iter().enumerate() {
        let new_seg = i == start || pages[i - 1].0 != *id;
        let (s2, d2, n2) = (segs + usize::from(new_seg), data + len(op), i + 1 - start);
        if i > start && (n2 > MAX_PAGES || paged_msg_len(from, s2, n2, d2) > limit) {
            out.push(start..i);
            (start, segs, data) = (i, 1, len(op));
        } else {
            (segs, data) = (s2, d2);
        }
    }
    if start < pages.len() {
        out.push(start..pages.len());
    }
    out
}

/// Whether pages of `len` bytes are better sent by message than as
/// one-sided chains of `chain_limit` pages (the provider's `iov_limit`):
/// only if one message of at most [`eager_limit`] bytes carries more of
/// them than a chain does, since each costs about one `sendmsg` and one
/// receive. On `tcp;ofi_rxm` (16 KiB, chains of 4): pages of up to
/// about 3.9 KiB; 4 KiB pages stay one-sided (16 × 4 KiB measured
/// 5.5–8.9 Gbit/s by message against 8.7–17.4 one-sided, where
/// 16 × 2 KiB measured 9.3–10.1 against 7.3–7.7).
pub(super) fn worth(from: &NetAddr, len: u64, chain_limit: usize) -> bool {
    let head = paged_msg_len(from, 1, 0, 0);
    let per = eager_limit().saturating_sub(head) / (PAGE_ENTRY_LEN + len as usize);
    per > chain_limit
}

/// Message buffers a NIC keeps for reuse ([`recycle`]).
pub(super) const KEEP_BUFS: usize = 64;

/// Keeps the buffer of a message whose send completed for a later one.
pub(super) fn recycle(live: &mut Live, mut buf: Vec<u8>) {
    if live.msg_bufs.len() < KEEP_BUFS && buf.capacity() > 0 {
        buf.clear();
        live.msg_bufs.push(buf);
    }
}

/// Tagged receives a serving NIC keeps posted.
pub(super) const RECV_SLOTS: usize = 64;

/// Bytes of one receive: the largest message a sender builds, one page
/// of [`PAGE_LIMIT`] bytes (alone it may pass the eager limit) or
/// [`eager_limit`].
pub(super) fn slot_bytes() -> usize {
    let one = match NetAddr::new(&[1; NetAddr::MAX_LEN]) {
        Ok(a) => paged_msg_len(&a, 1, 1, PAGE_LIMIT as usize),
        // Never: `MAX_LEN` bytes make an address. A generous bound.
        Err(_) => 256 + PAGE_ENTRY_LEN + PAGE_LIMIT as usize,
    };
    one.max(eager_limit())
}

/// What a sender keeps of one segment of a paged message until its
/// acknowledgement: each page's `(rkey, address, length)` as the user
/// named them, for the error of a refused one; on the message's first
/// segment (the one whose sequence number the send carries), the others'
/// sequence numbers, failed with the send if it fails.
pub(super) struct Sent {
    pub(super) pages: Box<[(u64, u64, u64)]>,
    pub(super) extras: Vec<u64>,
}

impl Inner {
    /// Posts the tagged receives of a serving NIC (when it opens).
    pub(super) fn paged_post_receives(&self, live: &mut Live) {
        let bytes = slot_bytes();
        for _ in 0..RECV_SLOTS {
            let mut ctx = OpCtx::new(CtxKind::PagedRecv);
            ctx.bytes = vec![0; bytes];
            self.paged_repost(live, ctx);
        }
    }

    /// Posts `ctx` (a tagged receive whose buffer is its `bytes`) again.
    pub(super) fn paged_repost(&self, live: &mut Live, ctx: Box<OpCtx>) {
        let p = Pending {
            ctx,
            post: Post::TRecv {
                tag: PAGED_TAG,
                ignore: 0,
            },
            seq: None,
        };
        if !live.recv_retry.is_empty() {
            live.recv_retry.push_back(p);
        } else if let Err(p) = self.try_post(live, p) {
            live.recv_retry.push_back(p);
        }
    }

    /// A tagged message arrived: a peer's paged write (placed, then
    /// acknowledged) or acknowledgements of ours; whether those completed
    /// an operation of an endpoint other than the one whose completions
    /// go to `own` (see `Inner::event`).
    pub(super) fn paged_arrival(
        &self,
        live: &mut Live,
        bytes: &[u8],
        own: Option<&Arc<Sink>>,
    ) -> bool {
        let mut foreign = false;
        match peek_tag(bytes) {
            Ok(PAGED_MSG_TAG) => match PagedMsg::decode(bytes) {
                Ok(m) => {
                    let pages: Vec<(PageTarget, &[u8])> = m.pages().collect();
                    for (seq, range) in m.segments() {
                        let Some(seg) = pages.get(range) else {
                            continue;
                        };
                        let (status, page) = self.place(seg);
                        if status == AckStatus::Ok {
                            if let Some(imm) = m.imm {
                                for _ in 0..seg.len() {
                                    self.arrive_imm(imm);
                                }
                            }
                        } else {
                            Counters::bump(&self.counters.errors, 1);
                        }
                        live.acks_out.push((m.from, Ack { seq, status, page }));
                    }
                    if m.ack_now && !live.acks_due.contains(&m.from) {
                        live.acks_due.push(m.from);
                    }
                }
                Err(_) => Counters::bump(&self.counters.errors, 1),
            },
            Ok(PAGED_ACKS_TAG) => match PagedAcks::decode(bytes) {
                Ok(a) => {
                    for ack in a.acks() {
                        foreign |= self.paged_ack(live, &a.from, ack, own);
                    }
                }
                Err(_) => Counters::bump(&self.counters.errors, 1),
            },
            _ => Counters::bump(&self.counters.errors, 1),
        }
        foreign
    }

    /// Checks every page of a segment against this domain's
    /// registrations, then copies them all into place, or none: the status
    /// and the index of the first refused page.
    fn place(&self, pages: &[(PageTarget, &[u8])]) -> (AckStatus, u8) {
        // The registrations' lock is held throughout: a deregistration
        // (`Domain::deregister`) waits, and the regions' guards keep
        // their memory while the pages are copied.
        let mrs = lock(&self.mrs);
        let mut regions: Vec<(Arc<Region>, u64)> = Vec::with_capacity(pages.len());
        for (i, (t, _)) in pages.iter().enumerate() {
            let refuse = |s| (s, i as u8);
            let Some(region) = mrs.get(&t.key).and_then(|e| e.weak.upgrade()) else {
                return refuse(AckStatus::UnknownKey);
            };
            if !region.access().contains(Access::REMOTE_WRITE) {
                return refuse(AckStatus::NotWritable);
            }
            let offset = match self.scheme {
                MrScheme::OffsetApp => Some(t.addr),
                MrScheme::VirtApp | MrScheme::VirtProv => t.addr.checked_sub(region.addr()),
            };
            let inside = offset
                .and_then(|o| o.checked_add(u64::from(t.len)))
                .is_some_and(|end| end <= region.len());
            match offset {
                Some(o) if inside => regions.push((region, o)),
                _ => return refuse(AckStatus::OutOfBounds),
            }
        }
        let mut guards = Vec::with_capacity(regions.len());
        for (i, (r, _)) in regions.iter().enumerate() {
            match r.enter() {
                Some(g) => guards.push(g),
                // Deregistered meanwhile (its keys are on the way out).
                None => return (AckStatus::UnknownKey, i as u8),
            }
        }
        for ((g, (_, offset)), (_, data)) in guards.iter().zip(&regions).zip(pages) {
            // Checked above; `write` checks again and copies nothing if
            // the range is outside.
            g.write(*offset, data);
        }
        drop(mrs);
        (AckStatus::Ok, 0)
    }

    /// One acknowledgement from `from` of our segment `ack.seq`; whether
    /// it completed an operation of another endpoint than `own`'s.
    fn paged_ack(
        &self,
        live: &mut Live,
        from: &NetAddr,
        ack: Ack,
        own: Option<&Arc<Sink>>,
    ) -> bool {
        let Some(f) = live.inflight.get(&ack.seq) else {
            // Timed out or flushed already.
            return false;
        };
        let Some(sent) = f.paged.as_ref().filter(|_| f.peer == *from) else {
            Counters::bump(&self.counters.errors, 1);
            return false;
        };
        let result = match ack.status {
            AckStatus::Ok => Ok(0),
            refused => {
                let (rkey, addr, len) = sent
                    .pages
                    .get(usize::from(ack.page))
                    .copied()
                    .unwrap_or_default();
                Err(TransferError::Protection {
                    peer: f.peer,
                    rkey,
                    check: match refused {
                        AckStatus::OutOfBounds => ProtectionCheck::OutOfBounds { addr, len },
                        AckStatus::NotWritable => {
                            ProtectionCheck::MissingRight(Access::REMOTE_WRITE)
                        }
                        _ => ProtectionCheck::UnknownKey,
                    },
                })
            }
        };
        if let Some(mut f) = live.inflight.remove(&ack.seq) {
            // The data is placed; a send not completed yet keeps its
            // context with the provider until it does (`abandoned`).
            if let Some(l) = f.leaked.take() {
                live.abandoned.insert(ack.seq, l);
            }
            let foreign = !own.is_some_and(|o| Arc::ptr_eq(o, &f.sink));
            self.finish_paged(live, ack.seq, f, result);
            return foreign;
        }
        false
    }

    /// The message whose first segment is `sent` failed (`e`): its other
    /// segments fail too, posted (their bookkeeping in `inflight`) or not
    /// (in `retry_meta`). Each finishes once: whatever already finished
    /// them took their entry.
    pub(super) fn fail_extras(&self, live: &mut Live, sent: &Sent, e: &TransferError) {
        for &seq in &sent.extras {
            if let Some(f) = live.inflight.remove(&seq) {
                self.finish_paged(live, seq, f, Err(e.clone()));
            } else if let Some(m) = live.retry_meta.remove(&seq) {
                Counters::bump(&self.counters.errors, u64::from(m.pieces));
                live.covers
                    .finish(seq, &m.sink, m.wr_id, m.pieces, Err(e.clone()));
            }
        }
    }

    /// The message whose first segment is `first` (with `meta`) was
    /// posted: its other segments' bookkeeping moves from `retry_meta` to
    /// `inflight`, waiting for their acknowledgements (no context: the
    /// first segment's holds the message).
    pub(super) fn posted_extras(&self, live: &mut Live, extras: &[u64]) {
        for &seq in extras {
            if let Some(m) = live.retry_meta.remove(&seq) {
                live.inflight.insert(seq, m.posted(None));
                live.order.push_back(seq);
            }
        }
    }

    /// Completes the paged message `seq` (its send done, its
    /// acknowledgement in) with `result`.
    pub(super) fn finish_paged(
        &self,
        live: &mut Live,
        seq: u64,
        f: Inflight,
        result: Result<u64, TransferError>,
    ) {
        if result.is_err() {
            Counters::bump(&self.counters.errors, u64::from(f.pieces));
        }
        live.covers.finish(seq, &f.sink, f.wr_id, f.pieces, result);
    }

    /// Sends the acknowledgements queued for the peers whose messages
    /// asked for them ([`PagedMsg::ack_now`]) in this round: one message
    /// per peer (more past [`MAX_ACKS`]); the other peers' wait for their
    /// asking message (every batch a sender posts ends with one; a sender
    /// whose asking message never comes times its writes out). A peer
    /// whose address cannot be resolved gets none (its writes time out).
    pub(super) fn paged_send_acks(&self, live: &mut Live) {
        if live.acks_due.is_empty() {
            return;
        }
        let due = std::mem::take(&mut live.acks_due);
        let (mut out, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut live.acks_out)
            .into_iter()
            .partition(|(p, _)| due.contains(p));
        live.acks_out = keep;
        // Stable: each peer's acknowledgements stay in arrival order.
        out.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        let mut rest = &out[..];
        while let Some((peer, _)) = rest.first() {
            let n = rest
                .iter()
                .take_while(|(p, _)| p == peer)
                .count()
                .min(MAX_ACKS);
            let (batch, tail) = rest.split_at(n);
            rest = tail;
            let acks: Vec<Ack> = batch.iter().map(|(_, a)| *a).collect();
            let Ok(fi_addr) = self.fi_addr(live, peer) else {
                Counters::bump(&self.counters.errors, 1);
                continue;
            };
            let seq = live.next_seq;
            live.next_seq += 1;
            let mut ctx = OpCtx::new(CtxKind::Op(seq));
            if encode_paged_acks(&mut ctx.bytes, &self.addr, &acks).is_err() {
                continue;
            }
            // No `retry_meta`: once posted the context is `abandoned`
            // until the provider returns it; nobody waits for it.
            let p = Pending {
                ctx,
                post: Post::TSend {
                    desc: 0,
                    fi_addr,
                    tag: PAGED_TAG,
                },
                seq: Some(seq),
            };
            self.submit(live, fi_addr, p);
        }
        let mut due = due;
        due.clear();
        live.acks_due = due;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Remote;

    fn from() -> NetAddr {
        NetAddr::new(&[2, 0, 0x1f, 0x90, 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]).expect("addr")
    }

    /// `n` pages of `len` bytes of transfer `id`.
    fn pages(id: u64, n: usize, len: u64) -> Vec<(u64, WorkOp)> {
        (0..n)
            .map(|i| {
                let op = WorkOp::Write {
                    local: None,
                    remote: Remote {
                        peer: from(),
                        rkey: 1,
                        addr: i as u64 * len,
                    },
                    len,
                    imm: None,
                };
                (id, op)
            })
            .collect()
    }

    /// Every message of `packed` fits the eager limit (or is one page),
    /// and together they take every page once, in order.
    fn check(all: &[(u64, WorkOp)], packed: &[Range<usize>]) {
        let mut next = 0;
        for r in packed {
            assert_eq!(r.start, next, "in order, none skipped");
            assert!(!r.is_empty());
            next = r.end;
            let part = &all[r.clone()];
            let segs = 1 + part.windows(2).filter(|w| w[0].0 != w[1].0).count();
            let data: usize = part
                .iter()
                .map(|(_, op)| match op {
                    WorkOp::Write { len, .. } => *len as usize,
                    _ => 0,
                })
                .sum();
            let bytes = paged_msg_len(&from(), segs, part.len(), data);
            assert!(bytes <= eager_limit() || part.len() == 1, "{r:?}: {bytes}");
        }
        assert_eq!(next, all.len());
    }

    #[test]
    fn pages_pack_into_as_few_eager_messages_as_fit() {
        // 16 pages of 1 KiB and a header pass 16 KiB: 15 and 1.
        let one = pages(1, 16, 1024);
        let packed = pack(&from(), &one);
        check(&one, &packed);
        if eager_limit() == EAGER_LIMIT {
            assert_eq!(packed, [0..15, 15..16]);
        }
        // Four such transfers: 16/15 messages each, not 2.
        let four: Vec<_> = (0..4).flat_map(|t| pages(t, 16, 1024)).collect();
        let packed = pack(&from(), &four);
        check(&four, &packed);
        if eager_limit() == EAGER_LIMIT {
            assert_eq!(packed.len(), 5);
        }
        // 4 KiB pages: three per message.
        let big = pages(9, 7, 4096);
        let packed = pack(&from(), &big);
        check(&big, &packed);
        if eager_limit() == EAGER_LIMIT {
            assert_eq!(packed, [0..3, 3..6, 6..7]);
        }
        assert!(pack(&from(), &[]).is_empty());
    }

    #[test]
    fn only_pages_a_message_carries_more_of_than_a_chain_go_by_message() {
        if eager_limit() != EAGER_LIMIT {
            return;
        }
        // Chains of 4 (`tcp;ofi_rxm`).
        assert!(worth(&from(), 1024, 4));
        assert!(worth(&from(), 2048, 4));
        assert!(worth(&from(), 3000, 4));
        assert!(
            !worth(&from(), 4096, 4),
            "3 per message against 4 per chain"
        );
        // Without chaining every page that fits twice is worth it.
        assert!(worth(&from(), 4096, 1));
    }
}
