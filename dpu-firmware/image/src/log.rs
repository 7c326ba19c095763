//! The image's defmt logger: each defmt frame (interned format-string
//! index, timestamp, arguments; defmt's raw encoding) becomes one record of
//! the agent area's log ring (`rolex_core::layout::AgentArea`), which
//! `rolex inspect --log` decodes on the host with the image's ELF.
//!
//! Frames are assembled in a fixed buffer between `acquire` and `release`
//! and appended whole, so the ring never holds half a frame; a frame larger
//! than the buffer, or one logged while another is being assembled (a
//! panic inside logging), is dropped and counted rather than corrupting the
//! ring. The ring's single writer is this module.

use core::cell::RefCell;

use critical_section::Mutex;
use rolex_core::layout::{log_record_size, log_ring_index, AgentArea, AgentState};

use crate::platform::Area;

/// Largest frame kept (a log line with a 160-byte text argument fits).
const FRAME_BYTES: usize = 512;

struct Frame {
    buf: heapless::Vec<u8, FRAME_BYTES>,
    /// Frames being assembled: more than one means nesting, dropped.
    depth: u32,
    overflow: bool,
}

struct Ring {
    area: Area,
    capacity: u64,
    head: u64,
    tail: u64,
}

static FRAME: Mutex<RefCell<Frame>> = Mutex::new(RefCell::new(Frame {
    buf: heapless::Vec::new(),
    depth: 0,
    overflow: false,
}));
static RING: Mutex<RefCell<Option<Ring>>> = Mutex::new(RefCell::new(None));

defmt::timestamp!("{=u64:us}", crate::platform::now_ns() / 1_000);

/// Starts logging into `area`'s ring (whose header was checked); frames
/// logged before this are dropped.
pub fn init(area: Area, header: &AgentArea) {
    critical_section::with(|cs| {
        *RING.borrow_ref_mut(cs) = Some(Ring {
            area,
            capacity: header.log_capacity(),
            head: header.log_head(),
            tail: header.log_tail(),
        });
    });
}

/// Runs `f` on the area, if logging was started.
pub fn with_area<T>(f: impl FnOnce(&Area) -> T) -> Option<T> {
    critical_section::with(|cs| RING.borrow_ref(cs).as_ref().map(|r| f(&r.area)))
}

/// Publishes `state` in the area's header.
pub fn set_state(state: AgentState) {
    with_area(|a| {
        let _ = a.store(
            AgentArea::VERSION_STATE_OFFSET,
            AgentArea::version_state_word(state),
        );
    });
}

/// Publishes the failed state (for the panic handler).
pub fn mark_failed() {
    set_state(AgentState::Failed);
}

impl Ring {
    fn byte(&self, pos: u64) -> u8 {
        let mut b = [0u8];
        let at = AgentArea::SIZE + log_ring_index(pos, self.capacity) as u64;
        let _ = self.area.read(at, &mut b);
        b[0]
    }

    fn append(&mut self, rec: &[u8]) {
        let size = log_record_size(rec.len());
        if rec.is_empty() || size > self.capacity || rec.len() > usize::from(u16::MAX) {
            return;
        }
        // Free room oldest record first, so `tail` always starts a record.
        while self.head + size - self.tail > self.capacity {
            let len = u16::from_le_bytes([self.byte(self.tail), self.byte(self.tail + 1)]);
            self.tail += log_record_size(len.into());
        }
        let _ = self.area.store(AgentArea::LOG_TAIL_OFFSET, self.tail);
        let len = (rec.len() as u16).to_le_bytes();
        self.put(self.head, &len);
        self.put(self.head + 2, rec);
        self.head += size;
        // Published after the bytes: a reader never sees a record that is
        // not written yet.
        let _ = self.area.store(AgentArea::LOG_HEAD_OFFSET, self.head);
    }

    fn put(&self, pos: u64, bytes: &[u8]) {
        let start = log_ring_index(pos, self.capacity);
        let first = bytes.len().min(self.capacity as usize - start);
        let _ = self
            .area
            .write(AgentArea::SIZE + start as u64, &bytes[..first]);
        let _ = self.area.write(AgentArea::SIZE, &bytes[first..]);
    }
}

#[defmt::global_logger]
struct RingLogger;

// SAFETY: `acquire`/`release` bracket each frame and `write` only appends
// to the frame under way; the image is single-threaded and frames nested
// by a panic inside logging are detected (depth) and dropped, so frames
// are never interleaved.
unsafe impl defmt::Logger for RingLogger {
    fn acquire() {
        critical_section::with(|cs| {
            let mut f = FRAME.borrow_ref_mut(cs);
            f.depth += 1;
            if f.depth == 1 {
                f.buf.clear();
                f.overflow = false;
            }
        });
    }

    unsafe fn flush() {}

    unsafe fn release() {
        critical_section::with(|cs| {
            let mut f = FRAME.borrow_ref_mut(cs);
            f.depth = f.depth.saturating_sub(1);
            if f.depth == 0 && !f.overflow {
                if let Some(ring) = RING.borrow_ref_mut(cs).as_mut() {
                    ring.append(&f.buf);
                }
            }
        });
    }

    unsafe fn write(bytes: &[u8]) {
        critical_section::with(|cs| {
            let mut f = FRAME.borrow_ref_mut(cs);
            if f.depth == 1 && f.buf.extend_from_slice(bytes).is_err() {
                f.overflow = true;
            }
        });
    }
}
