//! How many zero-length receives the immediates' shared receive queue
//! holds, and when to post more: device-free bookkeeping for the domain.
//!
//! A write with immediate consumes one posted receive; a queue that runs
//! dry makes the senders' NICs meet receiver-not-ready NAKs and back off
//! for the RNR timer (milliseconds) per try. The domain counts what it
//! posted and what completions consumed, and refills the queue to full in
//! one chained post whenever it falls below the low watermark — after
//! every completion-queue read, and again if a post failed (a failed post
//! is retried, never silently lost, which a repost per completion did).
//! Invariant: `posted` never exceeds `depth`.

/// The stock of one shared receive queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqStock {
    depth: u32,
    posted: u32,
    low: u32,
}

impl SrqStock {
    /// A queue of `depth` receives, none posted yet, refilled when fewer
    /// than three quarters remain.
    pub fn new(depth: u32) -> SrqStock {
        SrqStock {
            depth,
            posted: 0,
            low: depth - depth / 4,
        }
    }

    /// Receives posted and not yet consumed.
    pub fn posted(&self) -> u32 {
        self.posted
    }

    /// The low watermark.
    pub fn low_watermark(&self) -> u32 {
        self.low
    }

    /// `n` receives completed (successfully or not: either way they left
    /// the queue).
    pub fn consumed(&mut self, n: u32) {
        self.posted = self.posted.saturating_sub(n);
    }

    /// How many to post now: enough to fill the queue once it is below
    /// the watermark, else none.
    pub fn due(&self) -> u32 {
        if self.posted < self.low {
            self.depth - self.posted
        } else {
            0
        }
    }

    /// `n` receives were posted.
    pub fn refilled(&mut self, n: u32) {
        self.posted = self.posted.saturating_add(n).min(self.depth);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refills_to_full_below_the_watermark_only() {
        let mut s = SrqStock::new(1024);
        assert_eq!(s.due(), 1024);
        s.refilled(1024);
        assert_eq!((s.posted(), s.due()), (1024, 0));
        // A burst that leaves three quarters: nothing yet.
        s.consumed(256);
        assert_eq!(s.due(), 0);
        // One more, and the queue is refilled whole in one post.
        s.consumed(1);
        assert_eq!(s.due(), 257);
        s.refilled(s.due());
        assert_eq!(s.posted(), 1024);
    }

    #[test]
    fn a_failed_post_is_due_again_and_counts_never_overflow() {
        let mut s = SrqStock::new(8);
        s.refilled(8);
        s.consumed(5);
        let due = s.due();
        assert_eq!(due, 5);
        // The post failed: nothing refilled, still due at the next read.
        assert_eq!(s.due(), due);
        // More completions than posted (flushes after an error) and more
        // posts than room stay within bounds.
        s.consumed(100);
        assert_eq!(s.posted(), 0);
        s.refilled(100);
        assert_eq!(s.posted(), 8);
        assert_eq!(SrqStock::new(1).low_watermark(), 1);
    }
}
