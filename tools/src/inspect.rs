//! `rolex inspect`: reads a file-backed memory-node pool (agent area, then
//! pool; see `rolex_core::layout::AgentArea`) and prints the agent's state
//! and counters, the pool's superblock and models, and with `--log` the
//! agent's log ring decoded.
//!
//! Log records are defmt frames in defmt's raw encoding (the firmware
//! image's logger writes them whole, one per ring record): a `u16` index of
//! an interned format string, the timestamp's arguments, then the
//! message's. The strings are the names of the symbols in the image's
//! `.defmt` section (JSON objects whose `data` is the format string and
//! whose address is the index), so the decoder reads the image's ELF
//! symbol table itself. It supports the parameter kinds the image logs
//! (`{=u8}` … `{=u64}`, `{=i8}` … `{=i64}`, `{=usize}`, `{=bool}`,
//! `{=str}`, `{=istr}`, `{=f32}`, `{=f64}`, `{=char}`, with optional
//! display hints); a frame with anything else is printed as raw bytes.
//! Nothing read from the files can make it panic: bad input is an error
//! naming what was wrong.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use clap::Args;
use rolex_core::entry::{LockOwner, LtEntry};
use rolex_core::layout::{
    AgentArea, AgentAreaError, ModelRecord, ModelState, RedoClaim, Superblock, ValueRegionHeader,
};

/// Arguments of `rolex inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The pool file (agent area, then pool), e.g. one `rolex memnode
    /// --pool-file` or the firmware test laid out.
    pool_file: PathBuf,
    /// Decode and print the agent's log ring.
    #[arg(long)]
    log: bool,
    /// The firmware image whose defmt strings decode the log (the path
    /// `tools/firmware` prints); without it records are printed raw.
    #[arg(long, value_name = "ELF")]
    elf: Option<PathBuf>,
    /// Also list every model's directory entry and record state.
    #[arg(long)]
    models: bool,
}

/// What `rolex inspect` could not read.
#[derive(Debug)]
pub enum InspectError {
    /// A file could not be read.
    Io {
        /// Which file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The agent area is malformed.
    Area(AgentAreaError),
    /// The pool's superblock or a record is malformed.
    Layout(rolex_core::layout::LayoutError),
    /// The ELF is not one the decoder understands.
    Elf(&'static str),
    /// A defmt symbol's JSON does not parse.
    Symbol(String),
    /// A log frame does not decode.
    Frame(String),
}

impl fmt::Display for InspectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io { path, error } => write!(f, "{}: {error}", path.display()),
            Self::Area(e) => write!(f, "agent area: {e}"),
            Self::Layout(e) => write!(f, "pool: {e}"),
            Self::Elf(what) => write!(f, "firmware ELF: {what}"),
            Self::Symbol(what) => write!(f, "defmt symbol: {what}"),
            Self::Frame(what) => write!(f, "log frame: {what}"),
        }
    }
}

impl std::error::Error for InspectError {}

/// Runs `rolex inspect`.
pub fn run(args: InspectArgs) -> Result<(), Box<dyn std::error::Error>> {
    let bytes = std::fs::read(&args.pool_file).map_err(|error| InspectError::Io {
        path: args.pool_file.clone(),
        error,
    })?;
    let area = AgentArea::read(&bytes).map_err(InspectError::Area)?;
    println!(
        "agent: {} (command {}), {} polls, {} retrains, {} keys retrained, freeze max {} ns, total {} ns, {} failures, {} CirQ entries skipped, cpu {:.3} s",
        area.state(),
        if area.command() == AgentArea::STOP { "stop" } else { "serve" },
        area.polls(),
        area.retrains(),
        area.keys_retrained(),
        area.freeze_ns_max(),
        area.freeze_ns_total(),
        area.failures(),
        area.skipped(),
        area.cpu_ns() as f64 / 1e9,
    );
    let pool_at = area
        .pool_offset()
        .filter(|&at| at <= bytes.len() as u64)
        .ok_or(InspectError::Area(AgentAreaError::TooShort {
            needed: area.len(),
            found: bytes.len() as u64,
        }))?;
    let pool = &bytes[pool_at as usize..];
    match Superblock::read(pool) {
        Ok(sb) => {
            println!(
                "pool: {} bytes, layout version {}, {} models, L = {}, {} keys per leaf at load, next record at {}",
                sb.pool_size(),
                rolex_core::layout::LAYOUT_VERSION,
                sb.model_count(),
                sb.leaf_slots(),
                sb.keys_per_leaf(),
                area.next_free()
            );
            let header = pool
                .get(sb.value_region_offset() as usize..)
                .and_then(|b| ValueRegionHeader::read(b).ok());
            match header {
                Some(h) => {
                    println!(
                        "values: {} of {} bytes of the value region handed out ({} to the bulk load)",
                        h.alloc().min(h.capacity()),
                        h.capacity(),
                        h.loaded()
                    );
                    println!("values: {}", free_stack(pool, &sb, h.free()));
                }
                None => println!("values: the value region header lies past the file"),
            }
            println!("redo: {}", redo_summary(pool, &sb));
            if args.models {
                print_models(pool, &sb)?;
            }
        }
        Err(e) => println!("pool: refused: {e}"),
    }
    if args.log {
        let table = match &args.elf {
            Some(path) => {
                let elf = std::fs::read(path).map_err(|error| InspectError::Io {
                    path: path.clone(),
                    error,
                })?;
                Some(Table::from_elf(&elf)?)
            }
            None => None,
        };
        let ring = &bytes[AgentArea::SIZE as usize..];
        for line in decode_log(&area, ring, table.as_ref())? {
            println!("{line}");
        }
    }
    Ok(())
}

fn print_models(pool: &[u8], sb: &Superblock) -> Result<(), InspectError> {
    for m in 0..sb.model_count() {
        let (word, rec) = model_record(pool, sb, m)?;
        match rec {
            Ok(r) => {
                let state: ModelState = r.state();
                let refused = match r.refused() {
                    0 => String::new(),
                    n => format!(", retraining refused (model region full: needs {n} bytes)"),
                };
                println!(
                    "model {m}: record {word}, generation {}, {} leaves, keys [{:#x}, {:#x}]{}{}{refused}",
                    state.generation(),
                    r.leaf_count(),
                    r.first_key(),
                    r.key_hi(),
                    if state.is_frozen() { ", frozen" } else { "" },
                    lock_summary(&count_locks(lt_entries(pool, &r)))
                );
            }
            Err(e) => println!("model {m}: record {word}: {e}"),
        }
    }
    Ok(())
}

/// Model `m`'s directory word and the record it names — or why that
/// record does not read (printed, not fatal: the other models still are).
fn model_record(
    pool: &[u8],
    sb: &Superblock,
    m: u64,
) -> Result<(u64, Result<ModelRecord, InspectError>), InspectError> {
    let at = sb.directory_entry_offset(m).map_err(InspectError::Layout)?;
    let word = read_u64(pool, at).ok_or(InspectError::Layout(
        rolex_core::layout::LayoutError::TooShort {
            part: rolex_core::layout::Part::Directory,
            needed: at + 8,
            found: pool.len() as u64,
        },
    ))?;
    // Checked as a compute node checks it: a record read from a wrong
    // offset has fields (its leaf count, its tables' offsets) that would
    // have `--models` walk 2^48 LT entries.
    let rec = pool
        .get(word as usize..)
        .ok_or(InspectError::Elf("directory word outside the pool"))
        .and_then(|b| ModelRecord::read(b).map_err(InspectError::Layout))
        .and_then(|r| r.check(word, sb).map(|()| r).map_err(InspectError::Layout));
    Ok((word, rec))
}

/// The LT entries of record `r` that lie inside `pool`.
fn lt_entries<'a>(pool: &'a [u8], r: &'a ModelRecord) -> impl Iterator<Item = LtEntry> + 'a {
    (0..r.leaf_count()).filter_map(move |j| {
        let at = r.lt_entry_offset(j).ok()?;
        read_u64(pool, at).map(LtEntry::from_raw)
    })
}

/// Locked entries among `entries`, per holder.
fn count_locks(entries: impl Iterator<Item = LtEntry>) -> BTreeMap<LockOwner, u64> {
    let mut by: BTreeMap<LockOwner, u64> = BTreeMap::new();
    for e in entries.filter(|e| e.is_locked()) {
        *by.entry(e.owner()).or_default() += 1;
    }
    by
}

/// The chains locked in `pool` (a memory node's pool, from its superblock
/// on), per holder, over the LT of every model's current record — what
/// `--models` lists model by model. A record that does not read counts
/// nothing; retired records, whose entries stay locked, are not current.
pub fn locked_chains(pool: &[u8]) -> Result<BTreeMap<LockOwner, u64>, InspectError> {
    let sb = Superblock::read(pool).map_err(InspectError::Layout)?;
    let mut all: BTreeMap<LockOwner, u64> = BTreeMap::new();
    for m in 0..sb.model_count() {
        if let (_, Ok(r)) = model_record(pool, &sb, m)? {
            for (owner, n) in count_locks(lt_entries(pool, &r)) {
                *all.entry(owner).or_default() += n;
            }
        }
    }
    Ok(all)
}

/// `", N chains locked (by …)"` naming who holds them — compute nodes by
/// lease id, the retraining agent, unrecorded holders — or nothing when no
/// chain is locked: an operator's first look at a stuck writer.
fn lock_summary(by: &BTreeMap<LockOwner, u64>) -> String {
    if by.is_empty() {
        return String::new();
    }
    let total: u64 = by.values().sum();
    let who: Vec<String> = by
        .iter()
        .map(|(o, n)| match *o {
            LockOwner::AGENT => format!("agent: {n}"),
            LockOwner::ANONYMOUS => format!("unrecorded: {n}"),
            LockOwner(id) => format!("compute node {id}: {n}"),
        })
        .collect();
    format!(", {total} chains locked ({})", who.join(", "))
}

/// The redo log: its geometry and the blocks claimed, per holder (the
/// compute clients connected, or dead ones whose blocks the memory node
/// has not freed yet); "none" for a pool without one.
fn redo_summary(pool: &[u8], sb: &Superblock) -> String {
    let redo = match sb.redo_region() {
        Ok(Some(r)) => r,
        Ok(None) => return "none (leaf writes are not copied)".into(),
        Err(e) => return format!("unreadable geometry: {e}"),
    };
    let mut by: BTreeMap<LockOwner, u64> = BTreeMap::new();
    let mut past_file = 0;
    for b in 0..redo.blocks() {
        let word = redo.claim_offset(b).ok().and_then(|at| read_u64(pool, at));
        let Some(c) = word.map(RedoClaim::from_raw) else {
            // Blocks lie in order: the rest are past the end too (a
            // damaged geometry may name billions).
            past_file = redo.blocks() - b;
            break;
        };
        if let Some(o) = c.owner() {
            *by.entry(o).or_default() += 1;
        }
    }
    let who: Vec<String> = by
        .iter()
        .map(|(o, n)| match *o {
            LockOwner::ANONYMOUS => format!("in-process clients: {n}"),
            LockOwner(id) => format!("compute node {id}: {n}"),
        })
        .collect();
    let claimed: u64 = by.values().sum();
    let mut line = format!(
        "{} blocks of {} slots of {} bytes ({} bytes at {}), {claimed} claimed",
        redo.blocks(),
        redo.slots(),
        redo.slot_len(),
        redo.len(),
        redo.offset()
    );
    if !who.is_empty() {
        line += &format!(" ({})", who.join(", "));
    }
    if past_file > 0 {
        line += &format!(", {past_file} past the end of the file");
    }
    line
}

fn read_u64(b: &[u8], at: u64) -> Option<u64> {
    let at = usize::try_from(at).ok()?;
    let s = b.get(at..at.checked_add(8)?)?;
    Some(u64::from_le_bytes(s.try_into().ok()?))
}

/// The log ring's records, one line each (decoded if a table is given).
pub fn decode_log(
    area: &AgentArea,
    ring: &[u8],
    table: Option<&Table>,
) -> Result<Vec<String>, InspectError> {
    let mut it = area.records(ring).map_err(InspectError::Area)?;
    let mut out = Vec::new();
    loop {
        match it.next_record() {
            Ok(Some(r)) => out.push({
                let rec = [r.first, r.second].concat();
                match table {
                    Some(t) => t
                        .decode(&rec)
                        .unwrap_or_else(|e| format!("(undecodable: {e}) {:02x?}", &rec[..])),
                    None => format!("{:02x?}", &rec[..]),
                }
            }),
            Ok(None) => return Ok(out),
            Err(e) => {
                out.push(format!("(ring: {e})"));
                return Ok(out);
            }
        }
    }
}

/// One interned defmt string.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    /// `defmt_info`, `defmt_error`, `defmt_timestamp`, `defmt_str`, …
    tag: String,
    /// The format string.
    data: String,
}

/// The interned strings of a firmware image, by index.
#[derive(Clone, Debug, Default)]
pub struct Table {
    entries: BTreeMap<u16, Entry>,
    timestamp: Option<String>,
}

fn le<const N: usize>(b: &[u8], at: usize) -> Result<[u8; N], InspectError> {
    b.get(at..at + N)
        .and_then(|s| s.try_into().ok())
        .ok_or(InspectError::Elf("truncated"))
}

impl Table {
    /// Reads the `.defmt` symbols of a little-endian ELF64 file.
    pub fn from_elf(elf: &[u8]) -> Result<Self, InspectError> {
        if elf.get(..4) != Some(b"\x7fELF") {
            return Err(InspectError::Elf("not an ELF file"));
        }
        if elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
            return Err(InspectError::Elf("not a little-endian 64-bit ELF"));
        }
        let shoff = u64::from_le_bytes(le(elf, 0x28)?) as usize;
        let shentsize = u16::from_le_bytes(le(elf, 0x3a)?) as usize;
        let shnum = u16::from_le_bytes(le(elf, 0x3c)?) as usize;
        let shstrndx = u16::from_le_bytes(le(elf, 0x3e)?) as usize;
        if shentsize < 64 {
            return Err(InspectError::Elf("section headers too small"));
        }
        struct Sh {
            name: u32,
            kind: u32,
            offset: usize,
            size: usize,
            link: u32,
        }
        let mut shs = Vec::with_capacity(shnum);
        for i in 0..shnum {
            let at = shoff
                .checked_add(i * shentsize)
                .ok_or(InspectError::Elf("section header offset overflows"))?;
            shs.push(Sh {
                name: u32::from_le_bytes(le(elf, at)?),
                kind: u32::from_le_bytes(le(elf, at + 4)?),
                offset: u64::from_le_bytes(le(elf, at + 24)?) as usize,
                size: u64::from_le_bytes(le(elf, at + 32)?) as usize,
                link: u32::from_le_bytes(le(elf, at + 40)?),
            });
        }
        let section = |i: usize| -> Result<&[u8], InspectError> {
            let sh = shs
                .get(i)
                .ok_or(InspectError::Elf("section index out of range"))?;
            elf.get(sh.offset..sh.offset.saturating_add(sh.size))
                .ok_or(InspectError::Elf("section outside the file"))
        };
        let cstr = |table: &[u8], at: usize| -> Result<String, InspectError> {
            let s = table
                .get(at..)
                .ok_or(InspectError::Elf("string offset outside its table"))?;
            let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
            Ok(String::from_utf8_lossy(&s[..end]).into_owned())
        };
        let shstr = section(shstrndx)?;
        let mut defmt = None;
        let mut symtab = None;
        for (i, sh) in shs.iter().enumerate() {
            if cstr(shstr, sh.name as usize)? == ".defmt" {
                defmt = Some(i);
            }
            if sh.kind == 2 {
                symtab = Some(i);
            }
        }
        let defmt = defmt.ok_or(InspectError::Elf("no .defmt section"))?;
        let symtab = symtab.ok_or(InspectError::Elf("no symbol table"))?;
        let syms = section(symtab)?;
        let strtab = section(shs[symtab].link as usize)?;
        let mut t = Table::default();
        for sym in syms.chunks_exact(24) {
            let shndx = u16::from_le_bytes([sym[6], sym[7]]) as usize;
            if shndx != defmt {
                continue;
            }
            let name = cstr(
                strtab,
                u32::from_le_bytes([sym[0], sym[1], sym[2], sym[3]]) as usize,
            )?;
            if !name.starts_with('{') {
                continue;
            }
            let value = u64::from_le_bytes(sym[8..16].try_into().unwrap_or([0; 8]));
            let index = u16::try_from(value)
                .map_err(|_| InspectError::Symbol(format!("index {value} of {name}")))?;
            let json: serde_json::Value = serde_json::from_str(&name)
                .map_err(|e| InspectError::Symbol(format!("{e}: {name}")))?;
            let field = |k: &str| {
                json.get(k)
                    .and_then(|v| v.as_str())
                    .map(str::to_owned)
                    .ok_or_else(|| InspectError::Symbol(format!("no {k} in {name}")))
            };
            let entry = Entry {
                tag: field("tag")?,
                data: field("data")?,
            };
            if entry.tag == "defmt_timestamp" {
                t.timestamp = Some(entry.data.clone());
            }
            t.entries.insert(index, entry);
        }
        Ok(t)
    }

    /// Decodes one raw defmt frame into `[timestamp] LEVEL message`.
    pub fn decode(&self, frame: &[u8]) -> Result<String, InspectError> {
        let mut r = Reader { b: frame, at: 0 };
        let index = u16::from_le_bytes(r.take::<2>()?);
        let entry = self
            .entries
            .get(&index)
            .ok_or_else(|| InspectError::Frame(format!("no string with index {index}")))?;
        let level = match entry.tag.as_str() {
            "defmt_trace" => "TRACE",
            "defmt_debug" => "DEBUG",
            "defmt_info" => "INFO ",
            "defmt_warn" => "WARN ",
            "defmt_error" => "ERROR",
            _ => "     ",
        };
        let mut out = String::new();
        if let Some(ts) = &self.timestamp {
            out.push_str(&self.format(ts, &mut r)?);
            out.push(' ');
        }
        out.push_str(level);
        out.push(' ');
        out.push_str(&self.format(&entry.data, &mut r)?);
        if r.at != frame.len() {
            return Err(InspectError::Frame(format!(
                "{} bytes left after the arguments",
                frame.len() - r.at
            )));
        }
        Ok(out)
    }

    /// Formats `fmt`, reading one argument per `{=…}` parameter.
    fn format(&self, fmt: &str, r: &mut Reader<'_>) -> Result<String, InspectError> {
        let mut out = String::new();
        let mut rest = fmt;
        while let Some(i) = rest.find(['{', '}']) {
            out.push_str(&rest[..i]);
            let tail = &rest[i..];
            if tail.starts_with("{{") || tail.starts_with("}}") {
                out.push_str(&tail[..1]);
                rest = &tail[2..];
                continue;
            }
            if tail.starts_with('}') {
                return Err(InspectError::Frame(format!("stray '}}' in {fmt:?}")));
            }
            let end = tail
                .find('}')
                .ok_or_else(|| InspectError::Frame(format!("unclosed parameter in {fmt:?}")))?;
            let param = &tail[1..end];
            out.push_str(&self.argument(param, r)?);
            rest = &tail[end + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }

    fn argument(&self, param: &str, r: &mut Reader<'_>) -> Result<String, InspectError> {
        let spec = param
            .strip_prefix('=')
            .ok_or_else(|| InspectError::Frame(format!("parameter {{{param}}} has no type")))?;
        let (ty, hint) = spec.split_once(':').unwrap_or((spec, ""));
        let int = |v: u128, hint: &str| match hint {
            "x" => format!("{v:x}"),
            "#x" => format!("{v:#x}"),
            "us" => format!("{}.{:06}", v / 1_000_000, v % 1_000_000),
            "ms" => format!("{}.{:03}", v / 1_000, v % 1_000),
            _ => v.to_string(),
        };
        Ok(match ty {
            "u8" => int(u128::from(r.take::<1>()?[0]), hint),
            "u16" => int(u16::from_le_bytes(r.take()?).into(), hint),
            "u32" | "usize" => int(u32::from_le_bytes(r.take()?).into(), hint),
            "u64" => int(u64::from_le_bytes(r.take()?).into(), hint),
            "u128" => int(u128::from_le_bytes(r.take()?), hint),
            "i8" => i8::from_le_bytes(r.take()?).to_string(),
            "i16" => i16::from_le_bytes(r.take()?).to_string(),
            "i32" | "isize" => i32::from_le_bytes(r.take()?).to_string(),
            "i64" => i64::from_le_bytes(r.take()?).to_string(),
            "bool" => (r.take::<1>()?[0] != 0).to_string(),
            "f32" => f32::from_le_bytes(r.take()?).to_string(),
            "f64" => f64::from_le_bytes(r.take()?).to_string(),
            "char" => char::from_u32(u32::from_le_bytes(r.take()?))
                .map_or_else(|| "\u{fffd}".to_owned(), String::from),
            "str" => {
                let len = u32::from_le_bytes(r.take()?) as usize;
                String::from_utf8_lossy(r.bytes(len)?).into_owned()
            }
            "istr" => {
                let i = u16::from_le_bytes(r.take()?);
                self.entries
                    .get(&i)
                    .map(|e| e.data.clone())
                    .ok_or_else(|| InspectError::Frame(format!("no string with index {i}")))?
            }
            other => {
                return Err(InspectError::Frame(format!(
                    "parameter type {other:?} is not supported by this decoder"
                )))
            }
        })
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], InspectError> {
        let s = self
            .at
            .checked_add(n)
            .and_then(|end| self.b.get(self.at..end))
            .ok_or_else(|| {
                InspectError::Frame(format!(
                    "{n} bytes wanted at {}, frame has {}",
                    self.at,
                    self.b.len()
                ))
            })?;
        self.at += n;
        Ok(s)
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], InspectError> {
        let s = self.bytes(N)?;
        s.try_into()
            .map_err(|_| InspectError::Frame("short read".to_owned()))
    }
}

/// What the value region's free stack (head word `free`) holds, walked in
/// `pool`: bytes, blocks and bundles given back (by closing clients, or
/// all the space no slot names after a `--resume`), or where the walk
/// stopped.
fn free_stack(pool: &[u8], sb: &Superblock, free: u64) -> String {
    use rolex_core::layout::free::block_at;
    use rolex_core::layout::{FreeBundle, FreeHead, ValueRegion};
    let Ok(region) = ValueRegion::new(sb.value_region_offset(), sb.value_region_len()) else {
        return "the value region is malformed".into();
    };
    let (mut bytes, mut blocks, mut bundles) = (0u64, 0u64, 0u64);
    let mut position = FreeHead::from_word(free).position;
    // A bundle per 64-byte block at most: a longer walk is a cycle.
    let most = region.capacity() / 64 + 1;
    while position != 0 {
        if bundles >= most {
            return format!("the free stack loops after {bundles} bundles");
        }
        let parsed = block_at(&region, position).and_then(|at| {
            let b = pool.get(at as usize..)?;
            let b = b.get(..b.len().min(FreeBundle::MAX_BYTES as usize))?;
            FreeBundle::parse(b, at, &region).ok().map(|f| (at, f))
        });
        let Some((at, bundle)) = parsed else {
            return format!(
                "{bytes} bytes given back in {blocks} blocks, {bundles} bundles, then position {position} is no bundle"
            );
        };
        bytes += bundle.own(at).class + bundle.entries().map(|e| e.class).sum::<u64>();
        blocks += 1 + bundle.entries().count() as u64;
        bundles += 1;
        position = bundle.next();
    }
    format!("{bytes} bytes given back, in {blocks} blocks, {bundles} bundles on the free stack")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_summary_names_each_holder_and_is_silent_when_none() {
        let e = LtEntry::new(1, 0, 7).unwrap();
        assert_eq!(lock_summary(&count_locks([e, e].into_iter())), "");
        let held = [
            e.locked_by(LockOwner(3)),
            e,
            e.locked_by(LockOwner(3)),
            e.locked_by(LockOwner::AGENT),
            e.with_lock(),
        ];
        assert_eq!(
            lock_summary(&count_locks(held.into_iter())),
            ", 4 chains locked (unrecorded: 1, compute node 3: 2, agent: 1)"
        );
    }

    #[test]
    fn redo_summary_counts_claimed_blocks_per_holder() {
        let params = |redo_blocks| rolex_core::layout::PoolParams {
            leaf_region_id: 0,
            leaf_slots: 4,
            keys_per_leaf: 2,
            epsilon: 1,
            leaf_capacity: 8,
            directory_capacity: 4,
            cirq_capacity: 4,
            model_region_len: 1 << 12,
            value_capacity: 1 << 12,
            redo_blocks,
            redo_slots: 2,
        };
        let none = Superblock::plan(&params(0)).unwrap();
        let pool = vec![0u8; none.pool_size() as usize];
        assert_eq!(
            redo_summary(&pool, &none),
            "none (leaf writes are not copied)"
        );
        let sb = Superblock::plan(&params(3)).unwrap();
        let redo = sb.redo_region().unwrap().unwrap();
        let mut pool = vec![0u8; sb.pool_size() as usize];
        let claims = [
            RedoClaim::new(LockOwner(7), 1),
            RedoClaim::FREE,
            RedoClaim::new(LockOwner::ANONYMOUS, 2),
        ];
        for (b, c) in claims.iter().enumerate() {
            let at = redo.claim_offset(b as u32).unwrap() as usize;
            pool[at..at + 8].copy_from_slice(&c.raw().to_le_bytes());
        }
        let line = redo_summary(&pool, &sb);
        assert!(
            line.starts_with("3 blocks of 2 slots of ")
                && line.ends_with("2 claimed (in-process clients: 1, compute node 7: 1)"),
            "{line}"
        );
        // A file cut short: the blocks past its end are said to be.
        let cut = &pool[..redo.claim_offset(1).unwrap() as usize + 8];
        assert!(
            redo_summary(cut, &sb)
                .ends_with("1 claimed (compute node 7: 1), 1 past the end of the file"),
            "{}",
            redo_summary(cut, &sb)
        );
    }

    fn table() -> Table {
        let mut t = Table::default();
        let mut add = |i: u16, tag: &str, data: &str| {
            t.entries.insert(
                i,
                Entry {
                    tag: tag.into(),
                    data: data.into(),
                },
            );
        };
        add(1, "defmt_info", "model {=u64} took {=u32} ns, ok {=bool}");
        add(2, "defmt_error", "failed: {=str} ({=istr}) {{x}}");
        add(3, "defmt_str", "interned");
        add(4, "defmt_timestamp", "{=u64:us}");
        add(5, "defmt_warn", "{}");
        t.timestamp = Some("{=u64:us}".into());
        t
    }

    #[test]
    fn frames_decode_with_timestamp_and_arguments() {
        let t = table();
        let mut f = vec![1, 0];
        f.extend_from_slice(&1_500_000u64.to_le_bytes());
        f.extend_from_slice(&7u64.to_le_bytes());
        f.extend_from_slice(&250u32.to_le_bytes());
        f.push(1);
        assert_eq!(
            t.decode(&f).unwrap(),
            "1.500000 INFO  model 7 took 250 ns, ok true"
        );
        let mut g = vec![2, 0];
        g.extend_from_slice(&0u64.to_le_bytes());
        g.extend_from_slice(&3u32.to_le_bytes());
        g.extend_from_slice(b"bad");
        g.extend_from_slice(&3u16.to_le_bytes());
        assert_eq!(
            t.decode(&g).unwrap(),
            "0.000000 ERROR failed: bad (interned) {x}"
        );
    }

    #[test]
    fn bad_frames_are_errors_not_panics() {
        let t = table();
        assert!(t.decode(&[]).is_err());
        assert!(t.decode(&[9, 0]).is_err());
        assert!(t.decode(&[1, 0, 1, 2]).is_err());
        let mut long = vec![2, 0];
        long.extend_from_slice(&0u64.to_le_bytes());
        long.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(t.decode(&long).is_err());
        let mut unsupported = vec![5, 0];
        unsupported.extend_from_slice(&0u64.to_le_bytes());
        assert!(t.decode(&unsupported).is_err());
        let mut extra = vec![1, 0];
        extra.extend_from_slice(&[0u8; 8 + 8 + 4 + 1 + 1]);
        assert!(t.decode(&extra).is_err());
        assert!(Table::from_elf(b"not an elf").is_err());
        assert!(Table::from_elf(b"\x7fELF\x02\x01").is_err());
    }
}
