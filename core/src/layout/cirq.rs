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
//!   conservative). Then WRITE [`CirqHeader::encode_slot`]`(model_id)` to
//!   [`CirqHeader::slot_offset`]`(t)`.
//! - **Consumer** (the memory node): [`CirqHeader::pop`] on `head`, `tail`
//!   and the slot at `head`; on [`Pop::Ready`] clear the slot to 0 *then*
//!   advance `head` (release order).
//!
//! The invariant: a slot holds 0 unless exactly one ticket of the current
//! lap was written into it. A slot value is `model_id + 1`, so 0 means
//! "empty, or reserved by a ticket whose WRITE has not landed yet" and the
//! consumer waits rather than misreading it as model 0. A producer writes
//! slot `t mod capacity` only once `head > t − capacity`, i.e. after the
//! consumer cleared it for ticket `t − capacity`, so no entry is ever
//! overwritten. Each model is queued at most once per record (only one SLT
//! claim gets the retraining slot) and popped before it is retrained, so at
//! most one entry per directory slot is outstanding: a CirQ at least as large
//! as the directory (the superblock check requires it) never makes a producer
//! wait.

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
    /// `head` is past a ticket that was not consumed, or past `tail`: the
    /// queue's words are corrupted.
    HeadPastTail {
        /// The head.
        head: u64,
        /// The ticket or tail it passed.
        tail: u64,
    },
    /// `u64::MAX` cannot be stored as `id + 1`.
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
            Self::HeadPastTail { head, tail } => {
                write!(f, "CirQ head {head} is past tail/ticket {tail}")
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
    /// Ticket `head` was handed out but its WRITE has not landed: try later.
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
///     24  8*capacity  slots     0 = empty/reserved, else model_id + 1
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

    /// The slot value that queues `model_id`.
    pub const fn encode_slot(model_id: u64) -> Result<u64, CirqError> {
        match model_id.checked_add(1) {
            Some(v) => Ok(v),
            None => Err(CirqError::ModelIdTooLarge(model_id)),
        }
    }

    /// The model a slot value queues, or `None` for an empty/reserved slot.
    pub const fn decode_slot(value: u64) -> Option<u64> {
        value.checked_sub(1)
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
    pub const fn check_ticket(ticket: u64, head: u64, capacity: u64) -> Result<u64, CirqError> {
        if capacity == 0 {
            return Err(CirqError::ZeroCapacity);
        }
        // The consumer cannot pass a ticket whose slot was never written.
        if head > ticket {
            return Err(CirqError::HeadPastTail { head, tail: ticket });
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
    /// current `tail` and the value of slot `slot_index(head)`.
    pub const fn pop(head: u64, tail: u64, slot_value: u64) -> Result<Pop, CirqError> {
        if head > tail {
            return Err(CirqError::HeadPastTail { head, tail });
        }
        if head == tail {
            return Ok(Pop::Empty);
        }
        match Self::decode_slot(slot_value) {
            None => Ok(Pop::Pending),
            Some(model_id) => Ok(Pop::Ready {
                model_id,
                next_head: head + 1,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;
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
    fn slot_values_distinguish_reserved_from_model_zero() {
        assert_eq!(CirqHeader::encode_slot(0), Ok(1));
        assert_eq!(CirqHeader::decode_slot(1), Some(0));
        assert_eq!(CirqHeader::decode_slot(CirqHeader::EMPTY_SLOT), None);
        assert_eq!(
            CirqHeader::encode_slot(u64::MAX),
            Err(CirqError::ModelIdTooLarge(u64::MAX))
        );
        assert_eq!(CirqHeader::pop(3, 4, 0), Ok(Pop::Pending));
        assert_eq!(
            CirqHeader::pop(3, 4, 1),
            Ok(Pop::Ready {
                model_id: 0,
                next_head: 4
            })
        );
        assert_eq!(CirqHeader::pop(4, 4, 9), Ok(Pop::Empty));
        assert!(CirqHeader::pop(5, 4, 0).is_err());
    }

    #[test]
    fn producers_wait_for_a_free_slot() {
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
        assert!(CirqHeader::check_ticket(0, 1, 4).is_err());
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

    /// Events of a simulated run: a producer takes a ticket, a producer with
    /// a ticket tries to write, or the consumer tries to pop.
    #[derive(Clone, Copy, Debug)]
    enum Step {
        Take(u64),
        Write(usize),
        Pop,
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Driving the pure helpers through any interleaving of producers
        /// and the consumer delivers every model exactly once, in ticket
        /// order, and never overwrites a queued entry.
        #[test]
        fn queue_delivers_each_entry_once_in_order(
            capacity in 1u64..5,
            steps in proptest::collection::vec(
                prop_oneof![
                    (0u64..1000).prop_map(Step::Take),
                    (0usize..8).prop_map(Step::Write),
                    Just(Step::Pop),
                ],
                0..200,
            ),
        ) {
            let mut slots = std::vec![0u64; capacity as usize];
            let (mut head, mut tail) = (0u64, 0u64);
            let mut waiting: Vec<(u64, u64)> = Vec::new(); // (ticket, model)
            let mut expected: VecDeque<(u64, u64)> = VecDeque::new();
            let mut popped: Vec<(u64, u64)> = Vec::new();
            for step in steps {
                match step {
                    Step::Take(model) => {
                        waiting.push((tail, model));
                        expected.push_back((tail, model));
                        tail += 1;
                    }
                    Step::Write(i) if !waiting.is_empty() => {
                        let (ticket, model) = waiting[i % waiting.len()];
                        match CirqHeader::check_ticket(ticket, head, capacity) {
                            Ok(index) => {
                                prop_assert_eq!(slots[index as usize], 0, "overwrote an entry");
                                slots[index as usize] = CirqHeader::encode_slot(model).unwrap();
                                waiting.retain(|&(t, _)| t != ticket);
                            }
                            Err(CirqError::Full { .. }) => {}
                            Err(e) => prop_assert!(false, "{}", e),
                        }
                    }
                    Step::Write(_) => {}
                    Step::Pop => {
                        let index = CirqHeader::slot_index(head, capacity).unwrap() as usize;
                        match CirqHeader::pop(head, tail, slots[index]).unwrap() {
                            Pop::Ready { model_id, next_head } => {
                                slots[index] = 0;
                                popped.push((head, model_id));
                                head = next_head;
                            }
                            Pop::Pending => prop_assert!(head < tail),
                            Pop::Empty => prop_assert_eq!(head, tail),
                        }
                    }
                }
            }
            // Drain: the producer holding ticket `head` can always write, so
            // every round makes progress.
            while head < tail {
                for (ticket, model) in core::mem::take(&mut waiting) {
                    match CirqHeader::check_ticket(ticket, head, capacity) {
                        Ok(index) => {
                            prop_assert_eq!(slots[index as usize], 0, "overwrote an entry");
                            slots[index as usize] = CirqHeader::encode_slot(model).unwrap();
                        }
                        Err(_) => waiting.push((ticket, model)),
                    }
                }
                let index = CirqHeader::slot_index(head, capacity).unwrap() as usize;
                let Pop::Ready { model_id, next_head } =
                    CirqHeader::pop(head, tail, slots[index]).unwrap()
                else {
                    prop_assert!(false, "ticket {} not written after the drain", head);
                    unreachable!();
                };
                slots[index] = 0;
                popped.push((head, model_id));
                head = next_head;
            }
            prop_assert_eq!(popped, Vec::from(expected));
            prop_assert!(slots.iter().all(|&s| s == 0));
        }
    }
}
