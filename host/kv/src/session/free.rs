//! Value space given back to the pool and taken from it: the session's
//! side of the value region's free stack (`rolex_core::layout::free`; the
//! `values` module says when a client gives back and when it takes).
//!
//! Push (give back): the blocks are written as bundles linked to each
//! other, the last to the head the session read, then, once every write
//! completed, one `CAS` moves the head to the first (on an ordered fabric
//! too: a write that failed before it ran must not be followed by a `CAS`
//! that ran). A `CAS` that finds another head rewrites the last bundle's
//! link and tries again. Pop (take): read the head, read the
//! bundle it names, `CAS` the head to the bundle's `next` with the tag
//! bumped; a `CAS` that finds another head starts over from the head it
//! returned.
//!
//! Who owns a block at each step: a block taken out of the value space for
//! a push belongs to the push until its `CAS` returns; a `CAS` that
//! returned the expected head put it on the stack (the pool owns it), one
//! that returned another head did not (the push still owns it and tries
//! again), one that failed without an answer may have done either — the
//! blocks are then lost rather than ever handed out twice. Nothing is put
//! back into the value space unless no `CAS` of its bundles was posted or
//! every one returned another head. A popped bundle belongs to the popper
//! once its `CAS` returned the expected head.

use rolex_core::layout::free::{block_at, position_of};
use rolex_core::layout::{FreeBlock, FreeBundle, FreeHead, ValueRegion};

use super::KvSession;
use crate::error::KvError;
use crate::io::Op;

/// Bundles one push batch writes at most.
const BUNDLES_PER_PUSH: usize = 64;

/// Blocks as bundles, each `(own, listed)`, of at most
/// [`FreeBundle::HELD_MAX`] bytes unless one block is larger (see
/// `rolex_core::layout::free::bundles`): what one client gives back is
/// taken by several.
fn bundles(blocks: Vec<FreeBlock>) -> Vec<(FreeBlock, Vec<FreeBlock>)> {
    rolex_core::layout::free::bundles(blocks, FreeBundle::HELD_MAX)
}

impl KvSession {
    /// Gives `blocks` back to the pool's free stack; returns the bytes
    /// given back. On an error, the blocks whose bundles certainly did not
    /// reach the stack are back in this client's value space, the others
    /// are lost (see the module docs).
    pub(crate) fn give_back_values(&mut self, blocks: Vec<FreeBlock>) -> Result<u64, KvError> {
        let region = *self.shared.values.region();
        let mut groups: Vec<Vec<(FreeBlock, Vec<FreeBlock>)>> = Vec::new();
        let mut all = bundles(blocks);
        while !all.is_empty() {
            let rest = all.split_off(all.len().min(BUNDLES_PER_PUSH));
            groups.push(std::mem::replace(&mut all, rest));
        }
        let mut given = 0;
        let mut head = None;
        let mut groups = groups.into_iter();
        while let Some(group) = groups.next() {
            let bytes: u64 = group
                .iter()
                .map(|(own, listed)| own.class + listed.iter().map(|b| b.class).sum::<u64>())
                .sum();
            match self.push_bundles(&region, &group, &mut head) {
                Ok(()) => given += bytes,
                Err(e) => {
                    let unsent = groups.flatten();
                    let keep = if e.may_have_applied() {
                        unsent.collect::<Vec<_>>()
                    } else {
                        group.into_iter().chain(unsent).collect()
                    };
                    self.shared.values.add_free(
                        keep.into_iter()
                            .flat_map(|(own, l)| std::iter::once(own).chain(l)),
                    );
                    return Err(e);
                }
            }
        }
        Ok(given)
    }

    /// Pushes one group of bundles (at most [`BUNDLES_PER_PUSH`]); `head`
    /// is the last head seen (read first if `None`). An error after which
    /// a `CAS` of this group may have landed is indeterminate
    /// ([`KvError::may_have_applied`]); any other means none did.
    fn push_bundles(
        &mut self,
        region: &ValueRegion,
        group: &[(FreeBlock, Vec<FreeBlock>)],
        head: &mut Option<FreeHead>,
    ) -> Result<(), KvError> {
        let mut cur = match *head {
            Some(h) => h,
            None => self.read_free_head(region)?,
        };
        let positions = group
            .iter()
            .map(|(own, _)| position_of(region, own.offset))
            .collect::<Option<Vec<u64>>>()
            .ok_or(KvError::BadConfig {
                field: "value block",
                reason: "a block to give back is not a block of the value region",
            })?;
        let lens: Vec<u64> = group
            .iter()
            .map(|(_, listed)| FreeBundle::len(listed.len()))
            .collect();
        let total: u64 = lens.iter().sum();
        self.io.reserve(&self.shared.engine, 0, total)?;
        for attempt in 0..self.shared.cfg.max_attempts {
            // Stage every bundle (again: only the last one's link changes).
            let mut ops = Vec::with_capacity(group.len() + 1);
            let mut local = 0;
            for (i, (own, listed)) in group.iter().enumerate() {
                let next = positions.get(i + 1).copied().unwrap_or(cur.position);
                let len = lens[i];
                if attempt == 0 || i + 1 == group.len() {
                    self.scratch.resize(len as usize, 0);
                    FreeBundle::write(&mut self.scratch, *own, next, listed).ok_or(
                        KvError::BadConfig {
                            field: "value block",
                            reason: "a free bundle does not fit its block",
                        },
                    )?;
                    self.io.stage(local, &self.scratch)?;
                    ops.push(Op::Write {
                        remote: own.offset,
                        local,
                        len,
                    });
                }
                local += len;
            }
            let cas = Op::Cas {
                remote: region.free_offset(),
                expected: cur.word(),
                new: cur.then(positions[0]).word(),
            };
            // The bundles must be known written before the CAS can run,
            // on any fabric: a write that failed before it ran, under a
            // CAS that ran, would put unwritten bytes (an old bundle's,
            // say) on the stack.
            self.io
                .run(&self.shared.pool, &ops, "giving value space back")?;
            let found = self
                .io
                .run(&self.shared.pool, &[cas], "giving value space back")
                .map_err(KvError::indeterminate)?
                .first()
                .copied();
            let found = found.map(FreeHead::from_word);
            if found == Some(cur) {
                *head = Some(cur.then(positions[0]));
                return Ok(());
            }
            cur = found.unwrap_or(cur);
        }
        Err(KvError::TooManyRetries {
            op: "give value space back",
            attempts: self.shared.cfg.max_attempts,
        })
    }

    /// The value region's free-stack head, read.
    fn read_free_head(&mut self, region: &ValueRegion) -> Result<FreeHead, KvError> {
        self.io.run(
            &self.shared.pool,
            &[Op::Read {
                remote: region.free_offset(),
                local: 0,
                len: 8,
            }],
            "reading the free value space",
        )?;
        Ok(FreeHead::from_word(self.io.local_u64(0)?))
    }

    /// Pops one bundle off the pool's free stack into this client's value
    /// space; `false` if the stack is empty (or its top bundle does not
    /// read as one twice in a row: it is left there).
    pub(crate) fn pop_values(&mut self) -> Result<bool, KvError> {
        let region = *self.shared.values.region();
        let mut head = self.read_free_head(&region)?;
        let mut unreadable = 0;
        for _ in 0..self.shared.cfg.max_attempts {
            if head.is_empty() {
                return Ok(false);
            }
            let Some(at) = block_at(&region, head.position) else {
                return Ok(false);
            };
            let end = region.area_offset(region.capacity());
            let len = FreeBundle::MAX_BYTES.min(end - at);
            self.io.reserve(&self.shared.engine, 8 + len, 0)?;
            self.io.run(
                &self.shared.pool,
                &[Op::Read {
                    remote: at,
                    local: 8,
                    len,
                }],
                "reading a free value bundle",
            )?;
            self.scratch.resize(len as usize, 0);
            self.io.local(8, &mut self.scratch)?;
            let (next, blocks) = match FreeBundle::parse(&self.scratch, at, &region) {
                Ok(b) => (
                    b.next(),
                    std::iter::once(b.own(at))
                        .chain(b.entries())
                        .collect::<Vec<_>>(),
                ),
                Err(_) => {
                    // Torn (popped and reused meanwhile) or not a bundle:
                    // look at the head again.
                    let again = self.read_free_head(&region)?;
                    unreadable += u32::from(again == head);
                    if unreadable >= 2 {
                        return Ok(false);
                    }
                    head = again;
                    continue;
                }
            };
            let found = self.io.run(
                &self.shared.pool,
                &[Op::Cas {
                    remote: region.free_offset(),
                    expected: head.word(),
                    new: head.then(next).word(),
                }],
                "taking free value space",
            )?[0];
            if found == head.word() {
                self.shared.values.add_free(blocks);
                return Ok(true);
            }
            head = FreeHead::from_word(found);
        }
        Ok(false)
    }

    /// After a write freed a block and the client holds more than its
    /// bound: gives back the excess. A failure is not the write's: the write stands, and the
    /// blocks stay with this client or are lost as the module docs say.
    pub(crate) fn shed_values(&mut self) {
        let excess = self.shared.values.take_excess();
        if !excess.is_empty() {
            let _ = self.give_back_values(excess);
        }
    }

    /// What the last handle on the client does (a `KvClient`'s or a
    /// session's drop, the reaper's once it released the locks maybe
    /// held): gives the value space held free back and frees the redo
    /// block, ignoring errors (the memory node's lease reaper frees what
    /// a failure left).
    pub(crate) fn close_for_good(&mut self) {
        let _ = self.give_back_all_values();
        if let Some(redo) = self.shared.redo.clone() {
            let _ = redo.release(&mut self.io, &self.shared.pool);
        }
    }

    /// Gives everything this client holds free back to the pool (see
    /// `KvClient::close`); returns the bytes given back.
    pub(crate) fn give_back_all_values(&mut self) -> Result<u64, KvError> {
        let all = self.shared.values.take_all();
        if all.is_empty() {
            return Ok(0);
        }
        self.give_back_values(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(offset: u64, class: u64) -> FreeBlock {
        FreeBlock {
            offset,
            class,
            gen: 3,
        }
    }

    #[test]
    fn every_block_is_in_exactly_one_bundle() {
        for n in [0usize, 1, 2, 5, 300, 2000] {
            let blocks: Vec<FreeBlock> = (0..n as u64)
                .map(|i| b(i * 4096, if i % 7 == 0 { 1024 } else { 64 }))
                .collect();
            let bs = bundles(blocks.clone());
            let mut seen: Vec<FreeBlock> = bs
                .iter()
                .flat_map(|(own, l)| std::iter::once(*own).chain(l.iter().copied()))
                .collect();
            seen.sort_unstable_by_key(|x| x.offset);
            assert_eq!(seen, blocks, "{n} blocks");
            for (own, l) in &bs {
                assert!(l.len() as u64 <= FreeBundle::fit(own.class));
            }
        }
    }
}
