//! Paged writes moved as one message, and their acknowledgements (the
//! transfer engine's "paged by message" path over providers that emulate
//! RMA in the target's CPU anyway; see the engine's libfabric domain).
//!
//! A [`PagedMsg`] carries pages of paged writes to one peer: where each
//! goes (the remote key and the address as the provider would take it, a
//! virtual address or an offset) and the page bytes, in order, grouped in
//! *segments* (consecutive pages of one transfer, each with the sender's
//! sequence number for it). The target checks every page of a segment
//! against its own registrations as a one-sided write would be checked,
//! places all of the segment's pages or none, and answers with one
//! [`PagedAcks`] entry per segment. Both are peer input: the decoders
//! never panic, refuse anything malformed with a [`WireError`], and
//! borrow the page bytes (no allocation).
//!
//! ```text
//! PagedMsg (tag 5), after the 2-byte header:
//!  +-------+-------+------+---------+-------------+------------+--------------+------+
//!  | flags | pages | segs | imm u32 | from NetAddr| segs × seg | pages × page | data |
//!  +-------+-------+------+---------+-------------+------------+--------------+------+
//!  flags: bit 0 = the pages carry `imm` (else imm is 0); bit 1 = send
//!  the acknowledgements now (see `PagedMsg::ack_now`); other bits 0.
//!  pages: 1..=MAX_PAGES.  segs: 1..=pages.
//!  seg: seq u64 | count u8 (1..); the counts add up to `pages`.
//!  page: key u64 | addr u64 | len u32 (1..=MAX_PAGE_LEN).
//!  data: exactly the sum of the pages' lengths (at most MAX_DATA), in order.
//!
//! PagedAcks (tag 6), after the 2-byte header:
//!  +-------------+-----------+--------------------------------------------+
//!  | from NetAddr| count u16 | count × (seq u64 | status u8 | page u8)    |
//!  +-------------+-----------+--------------------------------------------+
//!  count: 1..=MAX_ACKS.  seq: a segment's.  status: AckStatus.  page:
//!  the refused page's index in its segment (0 when status is Ok).
//! ```

use super::{read_header, Body, NetAddr, WireError, Writer, HEADER_LEN, WIRE_VERSION};

/// The header tag of a [`PagedMsg`].
pub const PAGED_MSG_TAG: u8 = 5;
/// The header tag of a [`PagedAcks`].
pub const PAGED_ACKS_TAG: u8 = 6;
/// Most pages one message carries.
pub const MAX_PAGES: usize = 64;
/// Longest page a message carries.
pub const MAX_PAGE_LEN: u32 = 64 * 1024;
/// Most page bytes one message carries.
pub const MAX_DATA: usize = 256 * 1024;
/// Most acknowledgements one [`PagedAcks`] carries.
pub const MAX_ACKS: usize = 1024;
/// Bytes of one page entry.
pub const PAGE_ENTRY_LEN: usize = 20;
/// Bytes of one acknowledgement entry.
pub const ACK_ENTRY_LEN: usize = 10;
/// Bytes of one segment entry.
pub const SEGMENT_ENTRY_LEN: usize = 9;

const FLAG_IMM: u8 = 1;
const FLAG_ACK_NOW: u8 = 2;
const FLAGS: u8 = FLAG_IMM | FLAG_ACK_NOW;

/// Offset of the flags byte in an encoded [`PagedMsg`].
const FLAGS_AT: usize = HEADER_LEN;

/// Sets [`PagedMsg::ack_now`] in an encoded message (the sender decides
/// it after building the messages of one post). Does nothing to bytes
/// that are not a [`PagedMsg`].
pub fn set_ack_now(encoded: &mut [u8]) {
    if encoded.get(1) == Some(&PAGED_MSG_TAG) {
        if let Some(f) = encoded.get_mut(FLAGS_AT) {
            *f |= FLAG_ACK_NOW;
        }
    }
}

/// Where one page goes, as the provider would take it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageTarget {
    /// The target region's remote key.
    pub key: u64,
    /// The address (virtual, or an offset into the region where the
    /// provider addresses by offset).
    pub addr: u64,
    /// Bytes (1 to [`MAX_PAGE_LEN`]).
    pub len: u32,
}

/// A decoded [`PagedMsg`]'s fixed part; the pages and their bytes are
/// borrowed from the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedMsg<'a> {
    /// The immediate every page delivers, if any.
    pub imm: Option<u32>,
    /// The sender's address (where the acknowledgement goes).
    pub from: NetAddr,
    /// The target sends its acknowledgements of this sender's messages
    /// (this one's and those it holds back) once it has placed this one;
    /// without it they wait for a later message that asks. A sender asks
    /// on the last message of each batch it posts to a peer.
    pub ack_now: bool,
    segs: &'a [u8],
    entries: &'a [u8],
    data: &'a [u8],
}

impl<'a> PagedMsg<'a> {
    /// Pages in the message.
    pub fn count(&self) -> usize {
        self.entries.len() / PAGE_ENTRY_LEN
    }

    /// The segments in order: each one's sequence number and its pages'
    /// indices in [`PagedMsg::pages`].
    pub fn segments(&self) -> impl Iterator<Item = (u64, core::ops::Range<usize>)> + 'a {
        let mut at = 0;
        self.segs.chunks_exact(SEGMENT_ENTRY_LEN).map(move |e| {
            let n = usize::from(e[8]);
            let r = at..at + n;
            at += n;
            (u64_at(&e[..8]), r)
        })
    }

    /// The pages in order, each with its bytes.
    pub fn pages(&self) -> impl Iterator<Item = (PageTarget, &'a [u8])> + 'a {
        let mut data = self.data;
        self.entries.chunks_exact(PAGE_ENTRY_LEN).map(move |e| {
            let t = page_of(e);
            // Decoding checked that the lengths add up to the data.
            let (head, rest) = data.split_at((t.len as usize).min(data.len()));
            data = rest;
            (t, head)
        })
    }

    /// Decodes one message, exactly (trailing bytes are an error). Never
    /// panics.
    pub fn decode(bytes: &'a [u8]) -> Result<PagedMsg<'a>, WireError> {
        let mut r = read_header(bytes, PAGED_MSG_TAG, "PagedMsg")?;
        let flags = r.u8("PagedMsg flags")?;
        if flags & !FLAGS != 0 {
            return Err(WireError::UnknownBits {
                what: "PagedMsg flags",
                bits: flags & !FLAGS,
            });
        }
        let count = usize::from(r.u8("PagedMsg page count")?);
        if count == 0 {
            return Err(WireError::Invalid {
                what: "PagedMsg page count",
                why: "a message carries at least one page",
            });
        }
        if count > MAX_PAGES {
            return Err(WireError::TooLong {
                what: "PagedMsg pages",
                len: count,
                max: MAX_PAGES,
            });
        }
        let nsegs = usize::from(r.u8("PagedMsg segment count")?);
        if nsegs == 0 || nsegs > count {
            return Err(WireError::Invalid {
                what: "PagedMsg segment count",
                why: "1 to the page count",
            });
        }
        let imm_raw = u32_at(r.take(4, "PagedMsg imm")?);
        let imm = if flags & FLAG_IMM != 0 {
            Some(imm_raw)
        } else if imm_raw != 0 {
            return Err(WireError::Invalid {
                what: "PagedMsg imm",
                why: "nonzero without the immediate flag",
            });
        } else {
            None
        };
        let from = NetAddr::decode_body(&mut r)?;
        let segs = r.take(nsegs * SEGMENT_ENTRY_LEN, "PagedMsg segments")?;
        let mut in_segs = 0usize;
        for e in segs.chunks_exact(SEGMENT_ENTRY_LEN) {
            if e[8] == 0 {
                return Err(WireError::Invalid {
                    what: "PagedMsg segment",
                    why: "a segment has at least one page",
                });
            }
            in_segs += usize::from(e[8]);
        }
        if in_segs != count {
            return Err(WireError::Invalid {
                what: "PagedMsg segments",
                why: "the segments' pages do not add up to the message's",
            });
        }
        let entries = r.take(count * PAGE_ENTRY_LEN, "PagedMsg pages")?;
        let mut total = 0usize;
        for e in entries.chunks_exact(PAGE_ENTRY_LEN) {
            let t = page_of(e);
            if t.len == 0 || t.len > MAX_PAGE_LEN {
                return Err(WireError::Invalid {
                    what: "PagedMsg page length",
                    why: "pages are 1 to MAX_PAGE_LEN bytes",
                });
            }
            total += t.len as usize;
        }
        if total > MAX_DATA {
            return Err(WireError::TooLong {
                what: "PagedMsg data",
                len: total,
                max: MAX_DATA,
            });
        }
        let data = r.take(total, "PagedMsg data")?;
        if !r.rest().is_empty() {
            return Err(WireError::TrailingBytes {
                what: "PagedMsg",
                extra: r.rest().len(),
            });
        }
        Ok(PagedMsg {
            imm,
            from,
            ack_now: flags & FLAG_ACK_NOW != 0,
            segs,
            entries,
            data,
        })
    }
}

/// Bytes of a [`PagedMsg`] of `segments` segments and `pages` pages
/// carrying `data` page bytes, from `from`.
pub fn paged_msg_len(from: &NetAddr, segments: usize, pages: usize, data: usize) -> usize {
    HEADER_LEN
        + 3
        + 4
        + from.body_len()
        + segments * SEGMENT_ENTRY_LEN
        + pages * PAGE_ENTRY_LEN
        + data
}

/// Writes a [`PagedMsg`] into `out` (cleared first): the header, the
/// `segments` (`(seq, pages)`, in order, covering `pages`) and page
/// entries, then each page's bytes, which `fill(i, dst)` writes into
/// `dst` (exactly page `i`'s length; returns `false` to give up, e.g. a
/// source range that is no longer readable). Fails, writing nothing
/// usable, if the pages break the limits decoding enforces or `fill`
/// gives up.
#[cfg(feature = "alloc")]
pub fn encode_paged_msg(
    out: &mut alloc_vec::Vec<u8>,
    imm: Option<u32>,
    from: &NetAddr,
    segments: &[(u64, u8)],
    pages: &[PageTarget],
    mut fill: impl FnMut(usize, &mut [u8]) -> bool,
) -> Result<(), WireError> {
    let in_segs: usize = segments.iter().map(|s| usize::from(s.1)).sum();
    if segments.is_empty()
        || segments.len() > pages.len()
        || segments.iter().any(|s| s.1 == 0)
        || in_segs != pages.len()
    {
        return Err(WireError::Invalid {
            what: "PagedMsg segments",
            why: "the segments' pages do not add up to the message's",
        });
    }
    if pages.is_empty() {
        return Err(WireError::Invalid {
            what: "PagedMsg page count",
            why: "a message carries at least one page",
        });
    }
    if pages.len() > MAX_PAGES {
        return Err(WireError::TooLong {
            what: "PagedMsg pages",
            len: pages.len(),
            max: MAX_PAGES,
        });
    }
    let mut total = 0usize;
    for p in pages {
        if p.len == 0 || p.len > MAX_PAGE_LEN {
            return Err(WireError::Invalid {
                what: "PagedMsg page length",
                why: "pages are 1 to MAX_PAGE_LEN bytes",
            });
        }
        total += p.len as usize;
    }
    if total > MAX_DATA {
        return Err(WireError::TooLong {
            what: "PagedMsg data",
            len: total,
            max: MAX_DATA,
        });
    }
    let len = paged_msg_len(from, segments.len(), pages.len(), total);
    out.clear();
    out.resize(len, 0);
    let head_len = len - total;
    {
        let mut w = Writer::new(&mut out[..head_len]);
        w.put(&[WIRE_VERSION, PAGED_MSG_TAG])?;
        w.put(&[
            if imm.is_some() { FLAG_IMM } else { 0 },
            pages.len() as u8,
            segments.len() as u8,
        ])?;
        w.put(&imm.unwrap_or(0).to_le_bytes())?;
        from.encode_body(&mut w)?;
        for (seq, n) in segments {
            w.put(&seq.to_le_bytes())?;
            w.put(&[*n])?;
        }
        for p in pages {
            w.put(&p.key.to_le_bytes())?;
            w.put(&p.addr.to_le_bytes())?;
            w.put(&p.len.to_le_bytes())?;
        }
    }
    let mut at = head_len;
    for (i, p) in pages.iter().enumerate() {
        let end = at + p.len as usize;
        if !fill(i, &mut out[at..end]) {
            out.clear();
            return Err(WireError::Invalid {
                what: "PagedMsg data",
                why: "a page's source could not be read",
            });
        }
        at = end;
    }
    Ok(())
}

/// What the target did with one [`PagedMsg`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum AckStatus {
    /// Every page placed (and every immediate counted).
    Ok = 0,
    /// A page named a key the target has not registered (or has
    /// deregistered).
    UnknownKey = 1,
    /// A page's range is not wholly inside its region.
    OutOfBounds = 2,
    /// A page's region does not grant remote writes.
    NotWritable = 3,
}

impl AckStatus {
    fn from_u8(b: u8) -> Option<AckStatus> {
        Some(match b {
            0 => AckStatus::Ok,
            1 => AckStatus::UnknownKey,
            2 => AckStatus::OutOfBounds,
            3 => AckStatus::NotWritable,
            _ => return None,
        })
    }
}

/// One acknowledgement: the message's sequence number, what became of
/// it, and the index of the page that was refused (0 when none was).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ack {
    /// The segment acknowledged (its sequence number, see
    /// [`PagedMsg::segments`]).
    pub seq: u64,
    /// What the target did.
    pub status: AckStatus,
    /// The refused page (0 for [`AckStatus::Ok`]).
    pub page: u8,
}

/// A decoded batch of acknowledgements, borrowed from the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedAcks<'a> {
    /// The acknowledging target's address.
    pub from: NetAddr,
    entries: &'a [u8],
}

impl<'a> PagedAcks<'a> {
    /// The acknowledgements in order.
    pub fn acks(&self) -> impl Iterator<Item = Ack> + 'a {
        self.entries.chunks_exact(ACK_ENTRY_LEN).map(|e| Ack {
            seq: u64_at(&e[..8]),
            // Decoding checked every status.
            status: AckStatus::from_u8(e[8]).unwrap_or(AckStatus::UnknownKey),
            page: e[9],
        })
    }

    /// Decodes one batch, exactly. Never panics.
    pub fn decode(bytes: &'a [u8]) -> Result<PagedAcks<'a>, WireError> {
        let mut r = read_header(bytes, PAGED_ACKS_TAG, "PagedAcks")?;
        let from = NetAddr::decode_body(&mut r)?;
        let count = usize::from(u16_at(r.take(2, "PagedAcks count")?));
        if count == 0 {
            return Err(WireError::Invalid {
                what: "PagedAcks count",
                why: "a batch carries at least one acknowledgement",
            });
        }
        if count > MAX_ACKS {
            return Err(WireError::TooLong {
                what: "PagedAcks",
                len: count,
                max: MAX_ACKS,
            });
        }
        let entries = r.take(count * ACK_ENTRY_LEN, "PagedAcks entries")?;
        for e in entries.chunks_exact(ACK_ENTRY_LEN) {
            match AckStatus::from_u8(e[8]) {
                None => {
                    return Err(WireError::Invalid {
                        what: "PagedAcks status",
                        why: "unknown status",
                    })
                }
                Some(AckStatus::Ok) if e[9] != 0 => {
                    return Err(WireError::Invalid {
                        what: "PagedAcks page",
                        why: "nonzero for an accepted message",
                    })
                }
                Some(_) => {}
            }
        }
        if !r.rest().is_empty() {
            return Err(WireError::TrailingBytes {
                what: "PagedAcks",
                extra: r.rest().len(),
            });
        }
        Ok(PagedAcks { from, entries })
    }
}

/// Writes a [`PagedAcks`] of `acks` from `from` into `out` (cleared
/// first). Fails on an empty or too long batch, or an `Ok` entry with a
/// nonzero page.
#[cfg(feature = "alloc")]
pub fn encode_paged_acks(
    out: &mut alloc_vec::Vec<u8>,
    from: &NetAddr,
    acks: &[Ack],
) -> Result<(), WireError> {
    if acks.is_empty() {
        return Err(WireError::Invalid {
            what: "PagedAcks count",
            why: "a batch carries at least one acknowledgement",
        });
    }
    if acks.len() > MAX_ACKS {
        return Err(WireError::TooLong {
            what: "PagedAcks",
            len: acks.len(),
            max: MAX_ACKS,
        });
    }
    if acks
        .iter()
        .any(|a| a.status == AckStatus::Ok && a.page != 0)
    {
        return Err(WireError::Invalid {
            what: "PagedAcks page",
            why: "nonzero for an accepted message",
        });
    }
    let len = HEADER_LEN + from.body_len() + 2 + acks.len() * ACK_ENTRY_LEN;
    out.clear();
    out.resize(len, 0);
    let mut w = Writer::new(out);
    w.put(&[WIRE_VERSION, PAGED_ACKS_TAG])?;
    from.encode_body(&mut w)?;
    w.put(&(acks.len() as u16).to_le_bytes())?;
    for a in acks {
        w.put(&a.seq.to_le_bytes())?;
        w.put(&[a.status as u8, a.page])?;
    }
    Ok(())
}

fn page_of(e: &[u8]) -> PageTarget {
    PageTarget {
        key: u64_at(&e[..8]),
        addr: u64_at(&e[8..16]),
        len: u32_at(&e[16..20]),
    }
}

fn u64_at(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

fn u32_at(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

fn u16_at(b: &[u8]) -> u16 {
    u16::from_le_bytes([b[0], b[1]])
}

#[cfg(feature = "alloc")]
mod alloc_vec {
    pub use alloc::vec::Vec;
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;
    use proptest::prelude::*;

    fn addr() -> NetAddr {
        NetAddr::new(&[2, 0, 0x1f, 0x90, 127, 0, 0, 1]).expect("addr")
    }

    fn encode(seq: u64, imm: Option<u32>, pages: &[PageTarget]) -> Vec<u8> {
        let mut out = Vec::new();
        let segs = [(seq, pages.len() as u8)];
        encode_paged_msg(&mut out, imm, &addr(), &segs, pages, |i, dst| {
            dst.fill(i as u8 + 1);
            true
        })
        .expect("encode");
        out
    }

    #[test]
    fn a_message_round_trips() {
        let pages = [
            PageTarget {
                key: 7,
                addr: 0x1000,
                len: 3,
            },
            PageTarget {
                key: 8,
                addr: 0x2000,
                len: 2,
            },
        ];
        let bytes = encode(42, Some(0x51), &pages);
        let m = PagedMsg::decode(&bytes).expect("decode");
        assert_eq!((m.imm, m.from, m.count()), (Some(0x51), addr(), 2));
        assert_eq!(m.segments().collect::<Vec<_>>(), [(42, 0..2)]);
        assert!(!m.ack_now);
        let mut asked = bytes.clone();
        set_ack_now(&mut asked);
        let a = PagedMsg::decode(&asked).expect("decode");
        assert!(a.ack_now && a.imm == Some(0x51) && a.pages().eq(m.pages()));
        let got: Vec<_> = m.pages().collect();
        assert_eq!(got[0], (pages[0], &[1u8, 1, 1][..]));
        assert_eq!(got[1], (pages[1], &[2u8, 2][..]));
        for cut in 0..bytes.len() {
            assert!(PagedMsg::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(
            PagedMsg::decode(&long),
            Err(WireError::TrailingBytes { .. })
        ));
    }

    #[test]
    fn malformed_messages_are_refused() {
        let page = PageTarget {
            key: 1,
            addr: 0,
            len: 4,
        };
        let good = encode(1, None, &[page]);
        let mut bad = good.clone();
        bad[2] = 0x84; // unknown flag
        assert!(matches!(
            PagedMsg::decode(&bad),
            Err(WireError::UnknownBits { .. })
        ));
        let mut bad = good.clone();
        bad[3] = 0; // no pages
        assert!(PagedMsg::decode(&bad).is_err());
        let mut bad = good.clone();
        bad[5] = 1; // an immediate without its flag
        assert!(PagedMsg::decode(&bad).is_err());
        let mut bad = good;
        bad[1] = PAGED_ACKS_TAG;
        assert!(matches!(
            PagedMsg::decode(&bad),
            Err(WireError::BadTag { .. })
        ));
        let zero = PageTarget { len: 0, ..page };
        let one = [(1, 1)];
        assert!(
            encode_paged_msg(&mut Vec::new(), None, &addr(), &one, &[zero], |_, _| true).is_err()
        );
        let gave_up = encode_paged_msg(&mut Vec::new(), None, &addr(), &one, &[page], |_, _| false);
        assert!(gave_up.is_err());
        let short = encode_paged_msg(
            &mut Vec::new(),
            None,
            &addr(),
            &[(1, 2)],
            &[page],
            |_, _| true,
        );
        assert!(short.is_err(), "segments must add up to the pages");
    }

    #[test]
    fn acks_round_trip() {
        let acks = [
            Ack {
                seq: 9,
                status: AckStatus::Ok,
                page: 0,
            },
            Ack {
                seq: 10,
                status: AckStatus::OutOfBounds,
                page: 3,
            },
        ];
        let mut out = Vec::new();
        encode_paged_acks(&mut out, &addr(), &acks).expect("encode");
        let a = PagedAcks::decode(&out).expect("decode");
        assert_eq!(a.from, addr());
        assert_eq!(a.acks().collect::<Vec<_>>(), acks);
        for cut in 0..out.len() {
            assert!(PagedAcks::decode(&out[..cut]).is_err());
        }
        let n = out.len();
        out[n - 2] = 9; // unknown status
        assert!(PagedAcks::decode(&out).is_err());
    }

    proptest! {
        #[test]
        fn any_message_round_trips(
            seq: u64,
            imm: Option<u32>,
            pages in proptest::collection::vec((any::<u64>(), any::<u64>(), 1u32..=300), 1..=MAX_PAGES),
            cut in 0usize..MAX_PAGES,
        ) {
            let pages: Vec<PageTarget> =
                pages.into_iter().map(|(key, addr, len)| PageTarget { key, addr, len }).collect();
            // One segment, or two split at `cut`.
            let n = pages.len();
            let segs: Vec<(u64, u8)> = if cut == 0 || cut >= n {
                vec![(seq, n as u8)]
            } else {
                vec![(seq, cut as u8), (seq.wrapping_add(1), (n - cut) as u8)]
            };
            let mut bytes = Vec::new();
            encode_paged_msg(&mut bytes, imm, &addr(), &segs, &pages, |i, dst| {
                dst.fill(i as u8 + 1);
                true
            })
            .expect("encode");
            let m = PagedMsg::decode(&bytes).expect("decode");
            prop_assert_eq!((m.imm, m.count()), (imm, pages.len()));
            let got: Vec<(u64, u8)> = m.segments().map(|(s, r)| (s, r.len() as u8)).collect();
            prop_assert_eq!(got, segs);
            for (i, (t, data)) in m.pages().enumerate() {
                prop_assert_eq!(t, pages[i]);
                prop_assert!(data.len() == t.len as usize && data.iter().all(|&b| b == i as u8 + 1));
            }
        }

        #[test]
        fn any_bytes_decode_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = PagedMsg::decode(&bytes);
            let _ = PagedAcks::decode(&bytes);
        }
    }
}
