//! The transfer engine in one sitting: two engines on the in-process
//! loopback fabric, two NICs each, a sender and a receiver.
//!
//! 1. **Registration.** The receiver allocates and registers a region and
//!    hands its [`MrDesc`] to the sender: the descriptor (address, length,
//!    rights, one key per NIC) is all a peer needs to write there. Between
//!    processes it travels over the bootstrap connection
//!    (`rolex te-bench --serve` shows that); here it is simply cloned.
//! 2. **Paged writes with an immediate.** The sender writes 8 pages into
//!    the receiver's region in a scattered order, spread over both NICs;
//!    every page delivers the immediate `PAGES_IMM` after its data.
//! 3. **ImmCounter.** The receiver armed `expect_imm_count(PAGES_IMM, 8)`:
//!    it fires once all 8 pages have landed, whatever order they arrived
//!    in, and only then does the receiver look at them.
//! 4. **Scatter to a peer group.** The sender registers the receiver as a
//!    peer group and scatters 4 slices of one buffer to 4 places in it in
//!    one call; the receiver counts one arrival per destination.
//! 5. **Barrier.** A zero-byte write carrying an immediate to every peer of
//!    the group: "everything I sent before this has landed".
//!
//! The receiver then checks every byte and the example exits non-zero if
//! one is wrong. Run it with
//! `cargo run --example transfer_engine -p rolex-host`.

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use rolex_host::{Access, CompletionFlag, MrHandle, OnDone, Pages, ScatterDst, TransferEngine};

/// Bytes per page, and pages per paged write.
const PAGE: u64 = 4096;
const PAGES: u32 = 8;
/// Bytes per scatter slice, and slices.
const SLICE: u64 = 1024;
const SLICES: u32 = 4;
/// One immediate per kind of transfer, so each expectation counts its own.
const PAGES_IMM: u32 = 1;
const SCATTER_IMM: u32 = 2;
const BARRIER_IMM: u32 = 3;
/// Everything here completes in microseconds; this only bounds a hang.
const HANG: Duration = Duration::from_secs(10);

fn main() -> Result<(), Box<dyn Error>> {
    let sender = TransferEngine::loopback(2)?;
    let receiver = TransferEngine::loopback(2)?;

    // 1. Registration. The receiver's region holds the pages, then the
    // scatter slices; peers may write it.
    let region_len = u64::from(PAGES) * PAGE + u64::from(SLICES) * SLICE;
    let (dst, dst_desc) =
        receiver.alloc_mr(region_len, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    let (src, _) = sender.alloc_mr(u64::from(PAGES) * PAGE, Access::LOCAL_WRITE)?;
    let data: Vec<u8> = (0..src.len()).map(|i| (i * 7 % 251) as u8).collect();
    src.write(0, &data)?;
    println!(
        "registered {} bytes at the receiver: {} NIC keys in its descriptor",
        dst_desc.len,
        dst_desc.nics.len()
    );

    // 2 and 3. Source page i goes to destination page `order[i]`.
    let order = vec![5, 2, 7, 0, 3, 6, 1, 4];
    let landed = CompletionFlag::new();
    receiver.expect_imm_count(PAGES_IMM, PAGES, OnDone::flag(&landed))?;
    let sent = CompletionFlag::new();
    sender.submit_paged_writes(
        PAGE,
        Some(PAGES_IMM),
        (
            &src,
            &Pages {
                indices: (0..PAGES).collect(),
                stride: PAGE,
                offset: 0,
            },
        ),
        (
            &dst_desc,
            &Pages {
                indices: order.clone(),
                stride: PAGE,
                offset: 0,
            },
        ),
        OnDone::flag(&sent),
    )?;
    wait(&sent, "the paged writes")?;
    wait(&landed, "the receiver's expectation of 8 pages")?;
    println!("{PAGES} pages written with immediate {PAGES_IMM}; the receiver's expectation fired");
    for (i, &to) in order.iter().enumerate() {
        let page = |at: u64| (at * PAGE) as usize..((at + 1) * PAGE) as usize;
        check(&dst, page(u64::from(to)), &data[page(i as u64)], "a page")?;
    }
    let nics: Vec<u64> = sender
        .counters()
        .domains
        .iter()
        .map(|d| d.counters.write_imms)
        .collect();
    println!("  pages per sender NIC: {nics:?}; every byte checked");

    // 4. Scatter: slice i of the source to slice i of the receiver's
    // scatter area, all to peers of one pre-resolved group.
    let group = sender.add_peer_group(vec![receiver.main_address()])?;
    let base = u64::from(PAGES) * PAGE;
    let slices: Vec<ScatterDst> = (0..u64::from(SLICES))
        .map(|i| ScatterDst {
            len: SLICE,
            src: i * SLICE,
            dst: dst_desc.clone(),
            dst_offset: base + i * SLICE,
        })
        .collect();
    let scattered = CompletionFlag::new();
    receiver.expect_imm_count(SCATTER_IMM, SLICES, OnDone::flag(&scattered))?;
    let sent = CompletionFlag::new();
    sender.submit_scatter(
        Some(group),
        OnDone::flag(&sent),
        Some(SCATTER_IMM),
        &src,
        &slices,
    )?;
    wait(&sent, "the scatter")?;
    wait(&scattered, "the receiver's expectation of 4 slices")?;
    let area = base as usize..(base + u64::from(SLICES) * SLICE) as usize;
    check(&dst, area.clone(), &data[..area.len()], "the scatter area")?;
    println!(
        "scattered {SLICES} slices of {SLICE} bytes to peer group {}; every byte checked",
        group.get()
    );

    // 5. Barrier: one immediate per peer of the group, no data.
    let barrier = CompletionFlag::new();
    receiver.expect_imm_count(BARRIER_IMM, 1, OnDone::flag(&barrier))?;
    let sent = CompletionFlag::new();
    sender.submit_barrier(Some(group), OnDone::flag(&sent), BARRIER_IMM, &[dst_desc])?;
    wait(&sent, "the barrier")?;
    wait(&barrier, "the receiver's barrier expectation")?;
    println!("barrier {BARRIER_IMM} reached the receiver");

    let c = sender.counters().total;
    println!(
        "sender: {} writes with immediate, {} bytes written, {} round trips",
        c.write_imms, c.bytes_written, c.rtts
    );
    Ok(())
}

/// Waits for `flag`, bounded; an operation that failed or hung is an error
/// naming `what`.
fn wait(flag: &Arc<CompletionFlag>, what: &str) -> Result<(), Box<dyn Error>> {
    match flag.wait(HANG) {
        Some(Ok(_)) => Ok(()),
        Some(Err(e)) => Err(format!("{what} failed: {e}").into()),
        None => Err(format!("{what} did not complete within {HANG:?}").into()),
    }
}

/// Checks that `range` of the receiver's region holds `want`.
fn check(
    region: &MrHandle,
    range: std::ops::Range<usize>,
    want: &[u8],
    what: &str,
) -> Result<(), Box<dyn Error>> {
    let got = region.to_vec(range.start as u64, range.len())?;
    if got != want {
        return Err(format!(
            "{what} at bytes {range:?} of the receiver's region differs from what was sent"
        )
        .into());
    }
    Ok(())
}
