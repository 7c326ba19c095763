//! The CirQ: the pool's circular queue of models waiting to be retrained.
//!
//! Many compute nodes produce with one-sided verbs; the memory node consumes
//! from its own memory. The protocol, with tickets that only grow:
//!
//! - **Producer** (the compute node whose SLT claim returned
//!   [`SltHeader::RETRAIN_SLOT`](crate::entry::SltHeader::RETRAIN_SLOT)):
//!   `FAA(tail, 1)` → ticket `t`, READing `head` in the same batch. While
//!   [`CirqHeader::check_ticket`] says [`CirqError::Full`], re-READ `head`
//!   (a stale head is never larger than the true one, so this is
//!   conservative) — a bounded number of times: a queue that stays full is
//!   back-pressure, and the producer gives its ticket up with an error.
//!   [`CirqError::Abandoned`]: the consumer gave up on `t` already; write
//!   nothing. Otherwise WRITE [`CirqHeader::encode_slot`]`(t, model_id)` to
//!   [`CirqHeader::slot_offset`]`(t)`.
//! - **Consumer** (the memory node): [`CirqHeader::pop`] on `head`, `tail`
//!   and the slot at `head`; on [`Pop::Ready`] clear the slot to 0 *then*
//!   advance `head` (release order). On [`Pop::Pending`] wait; once ticket
//!   `head` has been handed out for longer than a timeout (the consumer
//!   saw `tail > head` that long ago), its producer is taken for dead or
//!   gone: clear the slot by `CAS` from the value read and advance `head`
//!   past it (*skip* it).
//!
//! A slot value is `tag << 32 | (model_id + 1)`, where `tag` is the low
//! 32 bits of the ticket that wrote it. So 0 means "empty, or reserved by a
//! ticket whose WRITE has not landed yet" (the consumer waits rather than
//! misreading it as model 0), and a value whose tag is not `head`'s is the
//! late WRITE of a ticket the consumer skipped a lap (or more) ago, which
//! is never delivered as `head`'s entry.
//!
//! The invariants: the consumer delivers an entry only for the ticket that
//! wrote it, in ticket order, at most once. A producer writes slot
//! `t mod capacity` only once `head > t − capacity`, i.e. after the
//! consumer cleared or skipped the slot for ticket `t − capacity`, so an
//! entry is overwritten only by the late WRITE of a skipped producer (one
//! that read `head` before the skip and wrote after it). An entry lost so
//! (or skipped) costs no correctness: the queue only says which model to
//! retrain first, and the memory node also watches every model's SLT
//! count. Each model is queued at most once per record (only one SLT claim
//! gets the retraining slot) and popped or skipped before long, so a CirQ
//! at least as large as the directory (the superblock check requires it)
//! makes a producer wait only while the consumer waits out abandoned
//! tickets or does not run.

use core::fmt;

use zerocopy::little_endian::U64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// A CirQ operation that cannot proceed, or a CirQ that is malformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CirqError {
    /// The queue has no slots.
    ZeroCapacity,
    /// Ticket `ticket`'s slot still holds an entry of the previous lap
    /// (as far as `head` shows): re-read `head` and try again.
    Full {
        /// The producer's ticket.
        ticket: u64,
        /// The head it saw.
        head: u64,
        /// The capacity.
        capacity: u64,
    },
    /// The consumer skipped ticket `ticket` (its WRITE did not land in
    /// time): its producer must not write the slot any more.
    Abandoned {
        /// The producer's ticket.
        ticket: u64,
        /// The head it saw.
        head: u64,
    },
    /// `head` is past `tail`: the queue's words are corrupted.
    HeadPastTail {
        /// The head.
        head: u64,
        /// The tail it passed.
        tail: u64,
    },
    /// The model id is above [`CirqHeader::MAX_MODEL_ID`] (a slot holds
    /// `id + 1` in 32 bits).
    ModelIdTooLarge(u64),
    /// The queue's bytes are fewer than its capacity needs, or its size
    /// overflows `u64`.
    TooShort {
        /// Bytes needed.
        needed: u64,
        /// Bytes available.
        found: u64,
    },
}

impl fmt::Display for CirqError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::ZeroCapacity => f.write_str("CirQ has no slots"),
            Self::Full {
                ticket,
                head,
                capacity,
            } => write!(
                f,
                "CirQ full for ticket {ticket}: head {head}, capacity {capacity}"
            ),
            Self::Abandoned { ticket, head } => write!(
                f,
                "CirQ ticket {ticket} was skipped as abandoned (head {head}): not written"
            ),
            Self::HeadPastTail { head, tail } => {
                write!(f, "CirQ head {head} is past tail {tail}")
            }
            Self::ModelIdTooLarge(id) => write!(f, "model id {id} cannot be queued"),
            Self::TooShort { needed, found } => {
                write!(f, "CirQ needs {needed} bytes, has {found}")
            }
        }
    }
}

impl core::error::Error for CirqError {}

/// What the consumer finds at the head of the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pop {
    /// No ticket was handed out past `head`.
    Empty,
    /// Ticket `head` was handed out but its WRITE has not landed (the slot
    /// is empty, or holds the late WRITE of a ticket skipped earlier): try
    /// later, or skip the ticket once it is abandoned.
    Pending,
    /// `model_id` is queued: clear the slot, then set `head` to `next_head`.
    Ready {
        /// The model to retrain.
        model_id: u64,
        /// The new head.
        next_head: u64,
    },
}

/// The CirQ's first 24 bytes; `capacity` 8-byte slots follow.
///
/// ```text
/// offset       size  field
///      0          8  head      next ticket to consume (written by the memory node only)
///      8          8  tail      next ticket to hand out (FAA target)
///     16          8  capacity  slots
///     24  8*capacity  slots     0 = empty/reserved, else tag << 32 | (model_id + 1)
/// ```
///
/// A slot, written by the holder of ticket `t` (`tag` = `t mod 2^32`):
///
/// ```text
///  63                32 31                 0
/// +--------------------+--------------------+
/// |        tag         |    model_id + 1    |
/// +--------------------+--------------------+
/// ```
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct CirqHeader {
    head: U64,
    tail: U64,
    capacity: U64,
}

const _: () = assert!(core::mem::size_of::<CirqHeader>() == 24);

impl CirqHeader {
    /// Bytes of the header (slot 0 starts here).
    pub const SIZE: u64 = core::mem::size_of::<Self>() as u64;
    /// Offset of `head` within the CirQ.
    pub const HEAD_OFFSET: u64 = core::mem::offset_of!(Self, head) as u64;
    /// Offset of `tail` within the CirQ: the producers' `FAA` target.
    pub const TAIL_OFFSET: u64 = core::mem::offset_of!(Self, tail) as u64;
    /// Offset of `capacity` within the CirQ.
    pub const CAPACITY_OFFSET: u64 = core::mem::offset_of!(Self, capacity) as u64;
    /// The slot value of "empty, or reserved but not yet written".
    pub const EMPTY_SLOT: u64 = 0;
    /// Bits of a slot that hold `model_id + 1`; the ticket's tag is above.
    pub const MODEL_BITS: u32 = 32;
    /// The largest model id a slot can queue.
    pub const MAX_MODEL_ID: u64 = (1 << Self::MODEL_BITS) - 2;
    const MODEL_MASK: u64 = (1 << Self::MODEL_BITS) - 1;

    /// An empty queue of `capacity` slots.
    pub const fn new(capacity: u64) -> Result<Self, CirqError> {
        if capacity == 0 {
            return Err(CirqError::ZeroCapacity);
        }
        Ok(Self {
            head: U64::new(0),
            tail: U64::new(0),
            capacity: U64::new(capacity),
        })
    }

    /// Bytes of a CirQ of `capacity` slots.
    pub const fn len_for(capacity: u64) -> Result<u64, CirqError> {
        match capacity.checked_mul(8) {
            Some(n) => match n.checked_add(Self::SIZE) {
                Some(n) => Ok(n),
                None => Err(CirqError::TooShort {
                    needed: u64::MAX,
                    found: 0,
                }),
            },
            None => Err(CirqError::TooShort {
                needed: u64::MAX,
                found: 0,
            }),
        }
    }

    /// The next ticket to consume.
    pub fn head(&self) -> u64 {
        self.head.get()
    }

    /// The next ticket to hand out.
    pub fn tail(&self) -> u64 {
        self.tail.get()
    }

    /// Slots.
    pub fn capacity(&self) -> u64 {
        self.capacity.get()
    }

    /// Checks the header against the `cirq_len` bytes the superblock gives
    /// the queue.
    pub fn check(&self, cirq_len: u64) -> Result<(), CirqError> {
        if self.capacity() == 0 {
            return Err(CirqError::ZeroCapacity);
        }
        let needed = Self::len_for(self.capacity())?;
        if needed > cirq_len {
            return Err(CirqError::TooShort {
                needed,
                found: cirq_len,
            });
        }
        if self.head() > self.tail() {
            return Err(CirqError::HeadPastTail {
                head: self.head(),
                tail: self.tail(),
            });
        }
        Ok(())
    }

    /// The slot value with which the holder of `ticket` queues `model_id`.
    pub const fn encode_slot(ticket: u64, model_id: u64) -> Result<u64, CirqError> {
        if model_id > Self::MAX_MODEL_ID {
            return Err(CirqError::ModelIdTooLarge(model_id));
        }
        Ok(Self::tag(ticket) << Self::MODEL_BITS | (model_id + 1))
    }

    /// The ticket tag and the model of a slot value, or `None` for an
    /// empty/reserved slot.
    pub const fn decode_slot(value: u64) -> Option<(u64, u64)> {
        match (value & Self::MODEL_MASK).checked_sub(1) {
            Some(model_id) => Some((value >> Self::MODEL_BITS, model_id)),
            None => None,
        }
    }

    /// The tag a slot written by the holder of `ticket` carries.
    pub const fn tag(ticket: u64) -> u64 {
        ticket & Self::MODEL_MASK
    }

    /// The slot index of `ticket`.
    pub const fn slot_index(ticket: u64, capacity: u64) -> Result<u64, CirqError> {
        match ticket.checked_rem(capacity) {
            Some(i) => Ok(i),
            None => Err(CirqError::ZeroCapacity),
        }
    }

    /// Offset of `ticket`'s slot from the start of the CirQ (add the CirQ's
    /// pool offset for the WRITE target).
    pub const fn slot_offset(ticket: u64, capacity: u64) -> Result<u64, CirqError> {
        match Self::slot_index(ticket, capacity) {
            // index < capacity, and a capacity whose `len_for` overflows is
            // refused by `check`; saturate rather than wrap regardless.
            Ok(i) => Ok(Self::SIZE.saturating_add(i.saturating_mul(8))),
            Err(e) => Err(e),
        }
    }

    /// Tickets handed out and not consumed (may exceed the capacity while
    /// producers wait).
    pub const fn queued(head: u64, tail: u64) -> u64 {
        tail.saturating_sub(head)
    }

    /// Whether nothing is queued.
    pub const fn is_empty(head: u64, tail: u64) -> bool {
        tail <= head
    }

    /// Whether the next ticket would have to wait for a slot.
    pub const fn is_full(head: u64, tail: u64, capacity: u64) -> bool {
        Self::queued(head, tail) >= capacity
    }

    /// Producer side: whether the holder of `ticket`, having seen `head`,
    /// may write its slot now; `Ok` carries the slot index.
    /// [`CirqError::Full`]: not yet (re-read `head`);
    /// [`CirqError::Abandoned`]: never (the consumer skipped the ticket).
    pub const fn check_ticket(ticket: u64, head: u64, capacity: u64) -> Result<u64, CirqError> {
        if capacity == 0 {
            return Err(CirqError::ZeroCapacity);
        }
        // The consumer passes a ticket whose slot was never written only by
        // skipping it.
        if head > ticket {
            return Err(CirqError::Abandoned { ticket, head });
        }
        if ticket - head >= capacity {
            return Err(CirqError::Full {
                ticket,
                head,
                capacity,
            });
        }
        Self::slot_index(ticket, capacity)
    }

    /// Consumer side: what the head of the queue holds, given `head`, the
    /// current `tail` and the value of slot `slot_index(head)`. A value
    /// tagged with another ticket is a skipped producer's late WRITE:
    /// pending, like an empty slot.
    pub const fn pop(head: u64, tail: u64, slot_value: u64) -> Result<Pop, CirqError> {
        if head > tail {
            return Err(CirqError::HeadPastTail { head, tail });
        }
        if head == tail {
            return Ok(Pop::Empty);
        }
        match Self::decode_slot(slot_value) {
            Some((tag, model_id)) if tag == Self::tag(head) => Ok(Pop::Ready {
                model_id,
                next_head: head + 1,
            }),
            _ => Ok(Pop::Pending),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;
    use std::vec::Vec;

    #[test]
    fn offsets_match_the_diagram() {
        assert_eq!(CirqHeader::HEAD_OFFSET, 0);
        assert_eq!(CirqHeader::TAIL_OFFSET, 8);
        assert_eq!(CirqHeader::CAPACITY_OFFSET, 16);
        assert_eq!(CirqHeader::slot_offset(5, 4), Ok(24 + 8));
        assert_eq!(CirqHeader::len_for(4), Ok(56));
        assert!(CirqHeader::len_for(u64::MAX).is_err());
    }

    #[test]
    fn slot_values_carry_the_ticket_and_distinguish_reserved_from_model_zero() {
        assert_eq!(CirqHeader::encode_slot(0, 0), Ok(1));
        assert_eq!(CirqHeader::encode_slot(3, 0), Ok(3 << 32 | 1));
        assert_eq!(CirqHeader::decode_slot(3 << 32 | 1), Some((3, 0)));
        assert_eq!(CirqHeader::decode_slot(CirqHeader::EMPTY_SLOT), None);
        // The tag is the ticket's low half: a ticket past 2^32 still tags.
        let t = (7u64 << 32) + 5;
        assert_eq!(
            CirqHeader::decode_slot(CirqHeader::encode_slot(t, 9).unwrap()),
            Some((5, 9))
        );
        assert_eq!(
            CirqHeader::encode_slot(0, CirqHeader::MAX_MODEL_ID),
            Ok(u32::MAX as u64)
        );
        assert_eq!(
            CirqHeader::encode_slot(0, CirqHeader::MAX_MODEL_ID + 1),
            Err(CirqError::ModelIdTooLarge(CirqHeader::MAX_MODEL_ID + 1))
        );
        let v = |t, m| CirqHeader::encode_slot(t, m).unwrap();
        assert_eq!(CirqHeader::pop(3, 4, 0), Ok(Pop::Pending));
        assert_eq!(
            CirqHeader::pop(3, 4, v(3, 0)),
            Ok(Pop::Ready {
                model_id: 0,
                next_head: 4
            })
        );
        // Written by ticket 3 − capacity, skipped a lap ago: not ticket 3's.
        assert_eq!(CirqHeader::pop(3, 4, v(1, 0)), Ok(Pop::Pending));
        assert_eq!(CirqHeader::pop(4, 4, 9), Ok(Pop::Empty));
        assert!(CirqHeader::pop(5, 4, 0).is_err());
    }

    #[test]
    fn producers_wait_for_a_free_slot_and_never_write_a_skipped_ticket() {
        assert_eq!(CirqHeader::check_ticket(3, 0, 4), Ok(3));
        assert_eq!(
            CirqHeader::check_ticket(4, 0, 4),
            Err(CirqError::Full {
                ticket: 4,
                head: 0,
                capacity: 4
            })
        );
        assert_eq!(CirqHeader::check_ticket(4, 1, 4), Ok(0));
        assert_eq!(
            CirqHeader::check_ticket(0, 1, 4),
            Err(CirqError::Abandoned { ticket: 0, head: 1 })
        );
        assert_eq!(
            CirqHeader::check_ticket(0, 0, 0),
            Err(CirqError::ZeroCapacity)
        );
        assert!(CirqHeader::is_full(0, 4, 4));
        assert!(!CirqHeader::is_full(1, 4, 4));
        assert!(CirqHeader::is_empty(4, 4));
    }

    #[test]
    fn header_check() {
        let h = CirqHeader::new(4).unwrap();
        assert_eq!(h.check(56), Ok(()));
        assert_eq!(
            h.check(55),
            Err(CirqError::TooShort {
                needed: 56,
                found: 55
            })
        );
        assert!(CirqHeader::new(0).is_err());
    }

    /// Events of a simulated run. A producer's READ of `head` and its
    /// slot WRITE are separate events, so anything may happen between
    /// them (a producer that stalls after its check, or dies).
    #[derive(Clone, Copy, Debug)]
    enum Step {
        /// A producer takes a ticket (`FAA tail`, reading `head`).
        Take(u64),
        /// A waiting producer re-reads `head` and checks its ticket.
        Check(usize),
        /// A producer that passed its check: its WRITE lands now.
        Land(usize),
        /// The consumer pops.
        Pop,
        /// The consumer's timeout ran out: it skips a pending head.
        Skip,
    }

    /// A producer of the simulation.
    #[derive(Clone, Copy, Debug)]
    struct Producer {
        ticket: u64,
        model: u64,
        /// The head it read last.
        seen: u64,
        /// Its check passed: its WRITE is in flight.
        passed: bool,
    }

    /// The simulated queue, the consumer's rules, and what it observed.
    struct Sim {
        capacity: u64,
        slots: Vec<u64>,
        head: u64,
        tail: u64,
        producers: Vec<Producer>,
        /// Entries delivered, by ticket.
        popped: BTreeMap<u64, u64>,
        /// Landed on time (ticket ≥ head when it landed): ticket → model.
        on_time: BTreeMap<u64, u64>,
        /// Live entries overwritten by a late WRITE.
        lost: Vec<u64>,
        late_writes: u64,
    }

    impl Sim {
        fn new(capacity: u64) -> Self {
            Self {
                capacity,
                slots: std::vec![0; capacity as usize],
                head: 0,
                tail: 0,
                producers: Vec::new(),
                popped: BTreeMap::new(),
                on_time: BTreeMap::new(),
                lost: Vec::new(),
                late_writes: 0,
            }
        }

        fn index(&self, ticket: u64) -> usize {
            CirqHeader::slot_index(ticket, self.capacity).unwrap() as usize
        }

        fn take(&mut self, model: u64) {
            self.producers.push(Producer {
                ticket: self.tail,
                model,
                seen: self.head,
                passed: false,
            });
            self.tail += 1;
        }

        /// Producer `i` checks its ticket against `seen` (as of now if
        /// `reread`); an abandoned one leaves.
        fn check(&mut self, i: usize, reread: bool) -> Result<(), TestCaseError> {
            let p = &mut self.producers[i];
            if reread {
                p.seen = self.head;
            }
            match CirqHeader::check_ticket(p.ticket, p.seen, self.capacity) {
                Ok(_) => p.passed = true,
                Err(CirqError::Full { .. }) => {}
                Err(CirqError::Abandoned { .. }) => {
                    self.producers.remove(i);
                }
                Err(e) => prop_assert!(false, "{}", e),
            }
            Ok(())
        }

        fn land(&mut self, i: usize) -> Result<(), TestCaseError> {
            let p = self.producers.remove(i);
            let at = self.index(p.ticket);
            let old = self.slots[at];
            if let Some((tag, _)) = CirqHeader::decode_slot(old) {
                // A live entry: written on time by a ticket not yet passed.
                let live =
                    self.on_time.keys().copied().find(|&t| {
                        t >= self.head && CirqHeader::tag(t) == tag && self.index(t) == at
                    });
                if let Some(t) = live {
                    prop_assert!(
                        p.ticket < self.head,
                        "an on-time WRITE overwrote ticket {}",
                        t
                    );
                    self.lost.push(t);
                }
            }
            self.slots[at] = CirqHeader::encode_slot(p.ticket, p.model).unwrap();
            if p.ticket >= self.head {
                self.on_time.insert(p.ticket, p.model);
            } else {
                self.late_writes += 1;
            }
            Ok(())
        }

        /// One consumer step; `skip`: the pending head has timed out.
        fn pop(&mut self, skip: bool) -> Result<(), TestCaseError> {
            let at = self.index(self.head);
            match CirqHeader::pop(self.head, self.tail, self.slots[at]).unwrap() {
                Pop::Ready {
                    model_id,
                    next_head,
                } => {
                    prop_assert_eq!(self.on_time.get(&self.head), Some(&model_id));
                    prop_assert!(self.popped.insert(self.head, model_id).is_none());
                    self.slots[at] = 0;
                    self.head = next_head;
                }
                Pop::Pending if skip => {
                    self.slots[at] = 0;
                    self.head += 1;
                }
                Pop::Pending => prop_assert!(self.head < self.tail),
                Pop::Empty => prop_assert_eq!(self.head, self.tail),
            }
            Ok(())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Driving the pure helpers through any interleaving of producers
        /// (which may stall between their check and their WRITE, or never
        /// write) and the consumer (which may skip a pending head at any
        /// time): an entry is only ever delivered for the ticket that wrote
        /// it, in ticket order, at most once; an on-time entry is lost only
        /// to a skipped producer's late WRITE; and once every producer left
        /// writes promptly, every on-time entry not lost so is delivered
        /// without a single skip.
        #[test]
        fn queue_delivers_entries_in_order_and_skips_abandoned_tickets(
            capacity in 1u64..5,
            steps in proptest::collection::vec(
                prop_oneof![
                    (0u64..1000).prop_map(Step::Take),
                    (0usize..8).prop_map(Step::Check),
                    (0usize..8).prop_map(Step::Land),
                    Just(Step::Pop),
                    Just(Step::Skip),
                ],
                0..200,
            ),
        ) {
            let mut sim = Sim::new(capacity);
            for step in steps {
                match step {
                    Step::Take(model) => sim.take(model),
                    Step::Check(i) => {
                        let waiting: Vec<usize> = (0..sim.producers.len())
                            .filter(|&j| !sim.producers[j].passed)
                            .collect();
                        if !waiting.is_empty() {
                            sim.check(waiting[i % waiting.len()], true)?;
                        }
                    }
                    Step::Land(i) => {
                        let passed: Vec<usize> = (0..sim.producers.len())
                            .filter(|&j| sim.producers[j].passed)
                            .collect();
                        if !passed.is_empty() {
                            sim.land(passed[i % passed.len()])?;
                        }
                    }
                    Step::Pop => sim.pop(false)?,
                    Step::Skip => sim.pop(true)?,
                }
            }
            // Every WRITE in flight lands (late ones included), then every
            // producer left checks and writes at once before each pop.
            while let Some(i) = sim.producers.iter().position(|p| p.passed) {
                sim.land(i)?;
            }
            let lost_before_drain = sim.lost.len();
            while sim.head < sim.tail {
                let mut i = 0;
                while i < sim.producers.len() {
                    let n = sim.producers.len();
                    sim.check(i, true)?;
                    if sim.producers.len() < n {
                        continue;
                    }
                    if sim.producers[i].passed {
                        sim.land(i)?;
                    } else {
                        i += 1;
                    }
                }
                let pending = sim.producers.iter().all(|p| p.ticket != sim.head)
                    && !matches!(
                        CirqHeader::pop(sim.head, sim.tail, sim.slots[sim.index(sim.head)]),
                        Ok(Pop::Ready { .. })
                    );
                // Only a ticket nobody will write is skipped now.
                sim.pop(pending)?;
            }
            prop_assert_eq!(sim.lost.len(), lost_before_drain, "no entry lost while draining");
            prop_assert!(sim.lost.is_empty() || sim.late_writes > 0);
            for (t, m) in &sim.on_time {
                if !sim.lost.contains(t) {
                    prop_assert_eq!(sim.popped.get(t), Some(m), "on-time ticket {} not delivered", t);
                }
            }
            prop_assert!(sim.popped.keys().all(|t| sim.on_time.contains_key(t)));
        }
    }
}
