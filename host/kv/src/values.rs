//! A compute node's share of the value region: where its out-of-line
//! values go ([`ValueSpace`]).
//!
//! Space comes from the pool one-sidedly: a session that finds no block of
//! the class it needs claims a chunk with one `FAA` on the region's
//! `alloc` word and carves it into blocks of that class; no memory-node
//! CPU is involved. A class's first chunk holds 16 blocks, each next one
//! twice as many, up to 1 MiB (or one block, when larger): a class used
//! once costs little, a busy one claims rarely. A block is
//! *freed* by the client whose write replaced or deleted the value it held
//! (once that write landed: no slot names it any more), and is handed out
//! again by this client after [`ValueSpace::GRACE`] — or sooner, once
//! [`ValueSpace::WAITING_MAX`] bytes of blocks freed after it wait too, so
//! the space held back does not grow with the write rate — with its
//! generation bumped. The grace is not what makes reuse safe — a reader
//! holding an old pointer checks the block's key and generation (see
//! `rolex_core::layout::value`) — it only spares such readers a retry.
//!
//! Who releases what: a block taken for a write that did not publish it
//! (an update of an absent key, a failed lock, any error before the leaf
//! write was posted) is given back at once; one whose leaf write may have
//! landed (an indeterminate error) is kept out of use for good, since a
//! slot may name it — as is the old block such a write may have replaced.
//!
//! Giving space back: what a client holds free goes to the value region's
//! free stack (`rolex_core::layout::free`), where any client takes it
//! before it claims new space — all of it when the client closes
//! (`KvClient::close`, or dropping the last handle on it), and the blocks
//! past [`ValueSpace::HOLD_MAX`] whenever a write frees one, so the space a
//! client sits on does not grow with what it deleted. A session that needs
//! a block of a class it has none of pops one bundle from the stack
//! (three round trips: the head, the bundle, the `CAS`) before it claims a
//! chunk, at most [`ValueSpace::POPS`] per block it needs. A give-back
//! whose `CAS` may have landed without this client learning it (an
//! indeterminate error) loses those blocks for good rather than risk
//! handing them out twice; one that certainly did not land keeps them.
//! What stays out of the pool while the memory node runs: a client killed
//! without closing keeps its share (at most one chunk per size class in
//! use, [`ValueSpace::HOLD_MAX`] of freed blocks and those within the
//! grace), as do blocks an indeterminate write may have published. A
//! memory node resumed on its pool file takes all of it back: no compute
//! node holds anything across a restart, so the resume rebuilds the free
//! stack from every byte of the block area no leaf slot names, cut into
//! large blocks (`rolex_dpu`'s recovery, step 6).
//!
//! Splitting: a session that needs a block of a class it has none of,
//! and popped the stack without finding one, carves the smallest larger
//! free block it holds (at least [`MIN_BLOCK`] larger) as it carves a
//! chunk ([`ValueSpace::split`]) before it claims new space; that is how
//! the large blocks a resume gives back serve values of any size.
//!
//! Generations of carved blocks: each block carved from a free block
//! whose last generation is `g` starts at `g` and is handed out with
//! `g + 1`. The block at the big block's own offset so never repeats the
//! generation the big block's last value carried (a reader holding that
//! pointer sees another generation, or another length). A block at an
//! offset inside the big block can be named by an old pointer only if a
//! block started there before the big block was made — and a big block
//! is made only of space no block used before (a chunk's tail) or by a
//! resume's sweep, across which no pointer survives (every compute node
//! bootstraps again and reads leaves afresh). The sweep still gives its
//! blocks generations drawn from the resume's clock and the block's
//! offset, so a pointer that did outlive it would match a block's
//! generation with probability about 2^-32 — and its key and length too.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rolex_core::layout::{block_class, cut_class, FreeBlock, ValueRegion, MIN_BLOCK};

/// A block handed to a writer: where it is, its class, and the generation
/// to write it with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Block {
    /// Pool offset.
    pub(crate) offset: u64,
    /// Bytes of the block (its size class).
    pub(crate) class: u64,
    /// The generation it is to carry (never 0).
    pub(crate) gen: u32,
}

/// What [`ValueSpace::take`] needs when it has no block of a class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NeedChunk {
    /// Bytes to claim from the region (`FAA` on its `alloc` word).
    pub(crate) len: u64,
}

#[derive(Default)]
struct Inner {
    /// Blocks ready to hand out, by class: (offset, last generation).
    ready: HashMap<u64, Vec<(u64, u32)>>,
    /// Freed blocks waiting out the grace period, oldest first.
    waiting: VecDeque<(Instant, u64, u64, u32)>,
    /// Bytes of the blocks in `waiting`.
    waiting_bytes: u64,
    /// Bytes claimed from the region by this client.
    claimed: u64,
    /// Bytes in blocks freed and not handed out again.
    free_bytes: u64,
    /// Chunks claimed so far, by class.
    chunks: HashMap<u64, u32>,
}

impl Inner {
    /// Moves the freed blocks whose grace is over — and the oldest past
    /// [`ValueSpace::WAITING_MAX`] — to the ready lists.
    fn promote(&mut self, now: Instant) {
        while let Some(&(at, c, offset, gen)) = self.waiting.front() {
            if now.duration_since(at) < ValueSpace::GRACE
                && self.waiting_bytes <= ValueSpace::WAITING_MAX
            {
                break;
            }
            self.waiting.pop_front();
            self.waiting_bytes -= c;
            self.ready.entry(c).or_default().push((offset, gen));
        }
    }
}

/// The value space of one client, shared by its sessions (see the module
/// docs).
pub(crate) struct ValueSpace {
    region: ValueRegion,
    inner: Mutex<Inner>,
}

impl ValueSpace {
    /// Bytes a chunk claim takes at most (unless one block is larger).
    pub(crate) const CHUNK: u64 = 1 << 20;
    /// Blocks of a class's first chunk.
    const FIRST_BLOCKS: u64 = 16;
    /// How long a freed block waits before it is handed out again.
    pub(crate) const GRACE: Duration = Duration::from_millis(20);
    /// Bytes of freed blocks that may wait out the grace at once; past
    /// them the oldest is handed out early.
    pub(crate) const WAITING_MAX: u64 = 8 << 20;
    /// Bytes of free blocks a client holds before a write that frees one
    /// gives the excess back to the pool (down to half of it).
    pub(crate) const HOLD_MAX: u64 = 32 << 20;
    /// Bundles a session pops from the pool's free stack, per block it
    /// needs, before it claims a chunk.
    pub(crate) const POPS: u32 = 4;

    /// The space of a client of the pool whose value region is `region`.
    pub(crate) fn new(region: ValueRegion) -> Self {
        Self {
            region,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The pool's value region.
    pub(crate) fn region(&self) -> &ValueRegion {
        &self.region
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A block for a value of `len` bytes (`len > INLINE_MAX`), or what to
    /// claim first ([`Self::add_chunk`], then ask again). `None` for a
    /// length no block holds.
    pub(crate) fn take(&self, len: usize) -> Option<Result<Block, NeedChunk>> {
        let class = block_class(len)?;
        let mut g = self.lock();
        g.promote(Instant::now());
        match g.ready.get_mut(&class).and_then(Vec::pop) {
            Some((offset, gen)) => {
                g.free_bytes = g.free_bytes.saturating_sub(class);
                Some(Ok(Block {
                    offset,
                    class,
                    gen: next_gen(gen),
                }))
            }
            None => Some(Err(NeedChunk {
                len: Self::chunk_len(&g, class),
            })),
        }
    }

    /// Adds the `len` bytes claimed at pool offset `offset` for blocks of
    /// the class that holds `value_len` bytes: carved into blocks of that
    /// class, the tail into classes that waste no byte
    /// (`rolex_core::layout::cut_class`).
    pub(crate) fn add_chunk(&self, offset: u64, len: u64, value_len: usize) {
        let class = block_class(value_len).unwrap_or(MIN_BLOCK);
        let mut g = self.lock();
        g.claimed += len;
        *g.chunks.entry(class).or_default() += 1;
        let (mut at, end) = (offset, offset + len);
        let blocks = len / class;
        let ready = g.ready.entry(class).or_default();
        for _ in 0..blocks {
            ready.push((at, 0));
            at += class;
        }
        while let Some(c) = cut_class(end - at, Self::CHUNK) {
            g.ready.entry(c).or_default().push((at, 0));
            at += c;
        }
        g.free_bytes += len - (end - at);
    }

    /// Carves the smallest free block this client holds ready of a class
    /// at least [`MIN_BLOCK`] larger than the one that holds `len` bytes —
    /// if `large`, only one at least as large as the chunk it would claim
    /// and half of [`Self::CHUNK`] (what a resume gives back: carved before
    /// the stack is looked at, where a freed value's block is kept for
    /// its own class) — as it carves a chunk: as many blocks of
    /// that class as a chunk claimed now would hold (the rest of the big
    /// block back in the ready lists, cut into classes that waste no
    /// byte: `rolex_core::layout::cut_class`); returns whether it held
    /// one. Every block cut from it starts at the big block's generation
    /// (and is handed out with the next one; see the module docs).
    pub(crate) fn split(&self, len: usize, large: bool) -> bool {
        let Some(class) = block_class(len) else {
            return false;
        };
        let mut g = self.lock();
        g.promote(Instant::now());
        let min_class = if large {
            Self::chunk_len(&g, class).max(Self::CHUNK / 2)
        } else {
            0
        };
        let Some(big) = g
            .ready
            .iter()
            .filter(|(&c, blocks)| c >= (class + MIN_BLOCK).max(min_class) && !blocks.is_empty())
            .map(|(&c, _)| c)
            .min()
        else {
            return false;
        };
        let Some((offset, gen)) = g.ready.get_mut(&big).and_then(Vec::pop) else {
            return false;
        };
        // `big >= class + MIN_BLOCK`: at least one block of the class, and
        // a rest of 0 or at least MIN_BLOCK (both multiples of 16).
        let chunk = Self::chunk_len(&g, class);
        let mut n = (big / class).min(chunk / class).max(1);
        let rest = big - n * class;
        if rest != 0 && rest < MIN_BLOCK {
            n -= 1;
        }
        // Only a chunk's worth grows the class's next chunk: a few blocks
        // carved from a slightly larger free one (a client overwriting
        // values of many lengths does so all the time) would otherwise
        // double it each time, up to a MiB claimed for a few values.
        if n * class >= chunk {
            *g.chunks.entry(class).or_default() += 1;
        }
        let ready = g.ready.entry(class).or_default();
        for i in 0..n {
            ready.push((offset + i * class, gen));
        }
        let (mut at, end) = (offset + n * class, offset + big);
        while let Some(c) = cut_class(end - at, Self::CHUNK) {
            g.ready.entry(c).or_default().push((at, gen));
            at += c;
        }
        true
    }

    /// Bytes of the next chunk for blocks of `class`: a class's first
    /// chunk holds [`Self::FIRST_BLOCKS`], each next one twice as many, up
    /// to [`Self::CHUNK`] (or one block, when larger).
    fn chunk_len(g: &Inner, class: u64) -> u64 {
        let n = g.chunks.get(&class).copied().unwrap_or(0).min(16);
        let grown = (class * Self::FIRST_BLOCKS).saturating_mul(1 << n);
        grown.min(Self::CHUNK).max(class)
    }

    /// Gives back `block`, never published (no slot names it): ready at
    /// once.
    pub(crate) fn give_back(&self, block: Block) {
        let mut g = self.lock();
        g.free_bytes += block.class;
        g.ready
            .entry(block.class)
            .or_default()
            .push((block.offset, block.gen));
    }

    /// Frees the block at `offset` of class `class`, written with
    /// generation `gen`, that a landed write unlinked: handed out again
    /// after the grace period. Returns whether this client now holds more
    /// than [`Self::HOLD_MAX`] free (time to [`Self::take_excess`]).
    pub(crate) fn free(&self, offset: u64, class: u64, gen: u32) -> bool {
        let mut g = self.lock();
        g.free_bytes += class;
        g.waiting_bytes += class;
        g.waiting.push_back((Instant::now(), class, offset, gen));
        g.free_bytes > Self::HOLD_MAX
    }

    /// Everything this client holds free (ready or within the grace),
    /// taken out of its lists: to give back to the pool.
    pub(crate) fn take_all(&self) -> Vec<FreeBlock> {
        let mut g = self.lock();
        let mut out: Vec<FreeBlock> = g
            .waiting
            .drain(..)
            .map(|(_, class, offset, gen)| FreeBlock { offset, class, gen })
            .collect();
        for (class, blocks) in g.ready.drain() {
            out.extend(
                blocks
                    .into_iter()
                    .map(|(offset, gen)| FreeBlock { offset, class, gen }),
            );
        }
        let bytes: u64 = out.iter().map(|b| b.class).sum();
        g.waiting_bytes = 0;
        g.free_bytes = g.free_bytes.saturating_sub(bytes);
        g.claimed = g.claimed.saturating_sub(bytes);
        out
    }

    /// Ready blocks past what [`Self::HOLD_MAX`] allows, taken out of the
    /// lists (largest classes first) until half of it is left; empty while
    /// within it. Blocks within the grace stay (at most
    /// [`Self::WAITING_MAX`] of them).
    pub(crate) fn take_excess(&self) -> Vec<FreeBlock> {
        let mut g = self.lock();
        if g.free_bytes <= Self::HOLD_MAX {
            return Vec::new();
        }
        g.promote(Instant::now());
        let mut classes: Vec<u64> = g.ready.keys().copied().collect();
        classes.sort_unstable_by(|a, b| b.cmp(a));
        let mut out = Vec::new();
        for class in classes {
            while g.free_bytes > Self::HOLD_MAX / 2 {
                let Some((offset, gen)) = g.ready.get_mut(&class).and_then(Vec::pop) else {
                    break;
                };
                g.free_bytes -= class;
                g.claimed = g.claimed.saturating_sub(class);
                out.push(FreeBlock { offset, class, gen });
            }
        }
        out
    }

    /// Adds `blocks` (popped from the pool's free stack, or taken for a
    /// give-back that certainly did not land) to the ready lists.
    pub(crate) fn add_free(&self, blocks: impl IntoIterator<Item = FreeBlock>) {
        let mut g = self.lock();
        for b in blocks {
            g.claimed += b.class;
            g.free_bytes += b.class;
            g.ready.entry(b.class).or_default().push((b.offset, b.gen));
        }
    }

    /// Bytes claimed from the region and bytes free among them.
    pub(crate) fn usage(&self) -> (u64, u64) {
        let g = self.lock();
        (g.claimed, g.free_bytes)
    }
}

/// The generation after `gen` (never 0: 0 marks an inline value).
fn next_gen(gen: u32) -> u32 {
    gen.wrapping_add(1).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rolex_core::layout::ValueRegionHeader;

    fn space() -> ValueSpace {
        ValueSpace::new(ValueRegion::new(0, ValueRegionHeader::SIZE + (64 << 20)).unwrap())
    }

    #[test]
    fn chunks_are_carved_and_blocks_come_back_with_new_generations() {
        let s = space();
        let need = s.take(1000).unwrap().unwrap_err();
        let class = block_class(1000).unwrap();
        assert_eq!(need.len, 16 * class, "a first chunk of 16 blocks");
        s.add_chunk(4096, need.len, 1000);
        let a = s.take(1000).unwrap().unwrap();
        let b = s.take(1000).unwrap().unwrap();
        assert_ne!(a.offset, b.offset);
        assert_eq!((a.class, a.gen), (block_class(1000).unwrap(), 1));
        assert!(a.offset >= 4096 && a.offset + a.class <= 4096 + need.len);
        // Given back unpublished: ready at once, same generation next.
        s.give_back(a);
        let a2 = s.take(1000).unwrap().unwrap();
        assert_eq!((a2.offset, a2.gen), (a.offset, 2));
        // Freed after a landed write: only after the grace.
        s.free(b.offset, b.class, b.gen);
        let c = s.take(1000).unwrap().unwrap();
        assert_ne!(c.offset, b.offset);
        std::thread::sleep(ValueSpace::GRACE + Duration::from_millis(5));
        let mut got = None;
        while let Some(Ok(x)) = s.take(1000) {
            if x.offset == b.offset {
                got = Some(x);
                break;
            }
        }
        assert_eq!(got.map(|x| x.gen), Some(b.gen + 1));
        assert_eq!(s.take(MAX_LEN_PLUS), None);
    }

    #[test]
    fn chunks_grow_per_class_up_to_a_mib() {
        let s = space();
        let class = block_class(100).unwrap();
        let mut at = 0;
        let mut lens = Vec::new();
        for _ in 0..12 {
            while let Some(Ok(_)) = s.take(100) {}
            let need = s.take(100).unwrap().unwrap_err();
            lens.push(need.len);
            s.add_chunk(at, need.len, 100);
            at += need.len;
        }
        assert_eq!(lens[0], 16 * class);
        assert_eq!(lens[1], 32 * class);
        assert_eq!(*lens.last().unwrap(), ValueSpace::CHUNK);
        // A block larger than a chunk is claimed alone.
        let big = rolex_core::layout::MAX_VALUE_LEN;
        let need = s.take(big).unwrap().unwrap_err();
        assert_eq!(need.len, block_class(big).unwrap());
    }

    #[test]
    fn a_large_free_block_is_carved_for_a_smaller_class_and_wastes_nothing() {
        let s = space();
        let big = FreeBlock {
            offset: 1 << 20,
            class: 1 << 20,
            gen: 7,
        };
        let class = block_class(100).unwrap();
        // A block less than MIN_BLOCK larger is never split, one smaller
        // than half a chunk only when asked.
        let near = FreeBlock {
            offset: 4 << 20,
            class: class + 32,
            gen: 1,
        };
        let mid = FreeBlock {
            offset: 5 << 20,
            class: 4096,
            gen: 1,
        };
        s.add_free([near, mid]);
        assert!(!s.split(100, true), "none that large");
        s.add_free([big]);
        assert!(s.take(100).unwrap().is_err(), "no block of the class yet");
        let mut got = Vec::new();
        // Carved blocks start at the big block's generation.
        let take_all_of_class = |got: &mut Vec<u64>| {
            while let Some(Ok(b)) = s.take(100) {
                assert_eq!(b.class, class, "{b:?}");
                assert!(b.gen == big.gen + 1 || b.gen == mid.gen + 1, "{b:?}");
                got.push(b.offset);
            }
        };
        // Large ones first (the mid one stays), then any.
        while s.split(100, true) {
            take_all_of_class(&mut got);
        }
        let inside = |o: u64, b: &FreeBlock| o >= b.offset && o + class <= b.offset + b.class;
        assert!(got.iter().all(|&o| inside(o, &big)));
        while s.split(100, false) {
            take_all_of_class(&mut got);
        }
        let n = got.len() as u64;
        assert!(
            n >= (big.class + mid.class) / class - 16,
            "{n} blocks: the big and mid blocks carved whole"
        );
        got.sort_unstable();
        got.dedup();
        assert_eq!(got.len() as u64, n, "no block twice");
        assert!(got.iter().all(|&o| inside(o, &big) || inside(o, &mid)));
        // The rest is in other classes, none lost; the near block stays.
        let rest = s.take_all();
        let bytes: u64 = rest.iter().map(|b| b.class).sum();
        assert_eq!(bytes + n * class, big.class + near.class + mid.class);
        assert!(rest.contains(&near));
        assert!(rest
            .iter()
            .all(|b| b.class < class + MIN_BLOCK || b == &near));
    }

    #[test]
    fn a_split_carves_a_chunks_worth_and_keeps_the_rest_large() {
        let s = space();
        s.add_free([FreeBlock {
            offset: 1 << 20,
            class: 1 << 20,
            gen: 2,
        }]);
        assert!(s.split(100, true));
        let class = block_class(100).unwrap();
        let mut n = 0;
        while let Some(Ok(_)) = s.take(100) {
            n += 1;
        }
        assert_eq!(n, 16, "a first chunk's worth");
        let rest = s.take_all();
        assert_eq!(
            rest.iter().map(|b| b.class).sum::<u64>(),
            (1 << 20) - 16 * class
        );
        assert!(rest.iter().any(|b| b.class >= 512 << 10), "{rest:?}");
    }

    #[test]
    fn carving_a_few_blocks_from_small_free_ones_does_not_grow_the_next_chunk() {
        // A client that overwrites values of many lengths holds freed
        // blocks of every class and carves a few blocks of the class it
        // misses out of a slightly larger one, again and again. Only a
        // chunk's worth carved counts as a chunk: otherwise each carve
        // doubled the class's next claim, up to a MiB claimed (and, by a
        // killed client, lost until a resume) for a few small values.
        let s = space();
        let small = block_class(100).unwrap();
        let larger = block_class(100 + 2 * MIN_BLOCK as usize).unwrap();
        s.add_free((0..64).map(|i| FreeBlock {
            offset: (1 << 20) + i * larger,
            class: larger,
            gen: 1,
        }));
        let mut carved = 0;
        loop {
            match s.take(100).unwrap() {
                Ok(_) => carved += 1,
                Err(_) if s.split(100, false) => {}
                Err(need) => {
                    assert!(carved >= 64, "every larger block carved: {carved}");
                    assert_eq!(need.len, 16 * small, "still the first chunk's size");
                    break;
                }
            }
        }
        // A carve of a chunk's worth counts as one.
        s.add_free([FreeBlock {
            offset: 8 << 20,
            class: 1 << 20,
            gen: 1,
        }]);
        assert!(s.split(100, true));
        while let Some(Ok(_)) = s.take(100) {}
        let need = s.take(100).unwrap().unwrap_err();
        assert_eq!(need.len, 32 * small, "the second chunk's size");
    }

    const MAX_LEN_PLUS: usize = rolex_core::layout::MAX_VALUE_LEN + 1;
}
