//! Entry points into JPEGs without restart markers: where MCU rows, and groups of MCUs in
//! each row, start in the entropy-coded data and what the DC predictors are there, learnt once
//! per file, so that a crop's decode skips the Huffman decoding of the rows above it and of
//! the columns beside it (a folder's files, epoch after epoch), as a restart-indexed file's
//! does.
//!
//! # Design
//! - A baseline JPEG's scan is one bit stream: a decoder cannot start mid-image without the
//!   bit position of an MCU and the DC predictors there (each block's DC is coded as a
//!   difference from the previous block's). `Scan::walk` finds both by decoding the Huffman
//!   symbols only (no coefficients stored, no IDCT), up to the row below the crop's last, and
//!   keeps an entry every [`Grid`] group (about [`ENTRY_COLUMNS`] per row).
//! - The entries are kept per owner and file content (the job owner's uid, a 64-bit hash of
//!   the bytes seeded at random per process, and their length) in one process-wide table, so
//!   the same file gives the same entries whichever thread, job or dataset of that user reads
//!   it, and a changed file is a different key. Users never share entries: one user's files
//!   cannot be crafted to collide with another's, nor can a user time whether another has
//!   read a file. The walk resumes from the deepest row known: over all epochs a file is
//!   walked at most once.
//! - A job that reads each file once (one epoch: `CpuDecoder::set_entry_reads_once`) does
//!   not walk at a file's first sight: it decodes plainly and leaves a mark, and the walk
//!   waits for a second sight (a later job's, within the owner's grace). A walk and a decode
//!   from its entries cost 1.6 times libjpeg's plain decode of a training crop, a decode
//!   from kept entries 0.6 times it: the walk pays off from the second read, so a job of
//!   more epochs walks at once, and a one-epoch job (a cold epoch from object storage, an
//!   evaluation pass) pays no walk (docs/decisions.md, "The walk at a file's second sight").
//! - The decode reads a partial stream (`synthetic.rs`) built from synthetic MCUs coded with
//!   the file's own Huffman tables so that (1) the DC predictors at their end equal an
//!   entry's and (2) their length in bits leaves the original bits at their own alignment, so
//!   the original bytes are copied as they are (one boundary byte merged). A crop that leaves
//!   columns out gets the stream of its column groups: each row one restart interval (which
//!   resets the predictors), a synthetic MCU, then the row's span of original bits. A crop
//!   as wide as the image gets one synthetic row, then the original bytes from its first
//!   row on. Synthetic pixels are never used; libjpeg upsamples a cropped row as if its
//!   edges were the image's, and reads one chroma row across MCU rows, so the rows hold one
//!   MCU row below the crop, and one above where the crop starts in its first two rows.
//! - Anything unexpected (a code the tables lack, a marker inside the walked rows, a DC
//!   predictor out of range, synthetic MCUs the tables cannot code) means no entry or no
//!   partial stream: the file decodes as before, and libjpeg reports any corruption as it
//!   always did, data left after the last MCU included.
//!
//! # Limitations
//! - Only sequential Huffman files with one scan holding every component (1 to 3 of them)
//!   and no restart interval; restart-indexed files take `restart`'s path.
//! - The table holds at most [`MAX_ENTRIES`] entries (12 bytes each), and each owner's files
//!   at most its budget in bytes (`table.rs`: the owner's oldest files go when over, all of
//!   them when its last job ends): files get column entries while the whole file's fit,
//!   else one entry per row, and past that decode by walking from the top each time, about
//!   the cost before entry points. Nothing is persisted.
//! - The key is a non-cryptographic hash: two different files of one user, of the same
//!   length, whose hashes collide under the process's secret seed would share entries and
//!   decode wrongly (for files not crafted against the seed, about 2^-64 per pair).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use stoker_kernels::image::RgbImage;

use super::markers::{Markers, DHT, SOF0, SOF1, SOS};
use super::restart::{region_cover, Frame};
use super::{CpuDecoder, DecodeError, RegionPlan};

/// The most entries the process keeps (12 bytes each: 384 MiB; about ImageNet's 1.28
/// million files at 25 MCU rows each with one entry per row, or 75,000 of them with
/// [`ENTRY_COLUMNS`] per row).
pub(crate) const MAX_ENTRIES: usize = 32 << 20;

/// Entries per MCU row a file gets while the table has room: a crop then skips the
/// Huffman decoding beside it too, as a restart-indexed file's does.
const ENTRY_COLUMNS: u32 = 16;

/// Entries kept in all (checked against [`MAX_ENTRIES`]).
static KEPT: AtomicUsize = AtomicUsize::new(0);

/// Where an MCU row's entropy-coded data starts: byte `byte` of the file, bit `bit` of it
/// (0 = most significant), with these DC predictors (per scan component).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RowEntry {
    byte: u32,
    bit: u8,
    dc: [i16; 3],
}

/// Where a file's entries lie: one every `group` MCUs of a row, `per_row` of them per row
/// (entry `r * per_row + j` starts MCU `j * group` of row `r`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Grid {
    group: u32,
    per_row: u32,
}

impl Grid {
    /// About [`ENTRY_COLUMNS`] entries per row.
    fn columns(f: &Frame) -> Grid {
        let mcus = f.mcus_per_row();
        let group = mcus.div_ceil(ENTRY_COLUMNS);
        Grid {
            group,
            per_row: mcus.div_ceil(group),
        }
    }

    /// One entry per row: what a file gets once column entries no longer fit the table.
    fn rows(f: &Frame) -> Grid {
        Grid {
            group: f.mcus_per_row(),
            per_row: 1,
        }
    }
}

/// A file's entries: rows `0..` in `grid`, up to the first entry of the deepest row walked;
/// empty when the file has none (its walk failed), or when it was only seen once
/// ([`Kept::seen`]).
#[derive(Debug)]
struct Kept {
    grid: Grid,
    list: Vec<RowEntry>,
}

impl Kept {
    /// The mark of a file seen once and not walked (an empty grid).
    fn seen() -> Kept {
        Kept {
            grid: Grid {
                group: 0,
                per_row: 0,
            },
            list: Vec::new(),
        }
    }

    fn is_seen(&self) -> bool {
        self.grid.per_row == 0
    }
}

/// (owner uid, seeded hash of the bytes, their length).
type Key = (u32, u64, usize);

/// The hash of a file's bytes under this process's random seed.
fn content_hash(b: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    static SECRETS: OnceLock<rapidhash::v3::RapidSecrets> = OnceLock::new();
    let secrets = SECRETS.get_or_init(|| {
        // std seeds every RandomState from the OS's random source.
        let seed = std::collections::hash_map::RandomState::new().hash_one(0u64);
        rapidhash::v3::RapidSecrets::seed(seed)
    });
    rapidhash::v3::rapidhash_v3_seeded(b, secrets)
}

/// A Huffman table, for reading codes and for writing them.
#[derive(Debug, Clone)]
struct Huff {
    /// Per 9-bit prefix: the code's length << 8 | its symbol; 0 when the code is longer.
    fast: Vec<u16>,
    /// Per code length 1..=16: the largest code of that length (-1: none), and what to add
    /// to a code of that length to index `vals`.
    maxcode: [i32; 17],
    offset: [i32; 17],
    vals: Vec<u8>,
    /// Per symbol: its code and the code's length (0: the table has no code for it).
    code: [u16; 256],
    len: [u8; 256],
}

const FAST_BITS: u32 = 9;

impl Huff {
    /// The table of a DHT entry (`counts` of codes per length, then the symbols), or `None`
    /// where libjpeg would refuse it (too many codes for a length, a DC symbol over 15).
    fn new(counts: &[u8], vals: &[u8], dc: bool) -> Option<Huff> {
        let mut h = Huff {
            fast: vec![0; 1 << FAST_BITS],
            maxcode: [-1; 17],
            offset: [0; 17],
            vals: vals.to_vec(),
            code: [0; 256],
            len: [0; 256],
        };
        if dc && vals.iter().any(|&v| v > 15) {
            return None;
        }
        let (mut code, mut k) = (0u32, 0usize);
        for l in 1..=16u32 {
            let n = usize::from(counts[l as usize - 1]);
            h.offset[l as usize] = i32::try_from(k).ok()? - i32::try_from(code).ok()?;
            for &sym in vals.get(k..k + n)? {
                let s = usize::from(sym);
                h.code[s] = u16::try_from(code).ok()?;
                h.len[s] = u8::try_from(l).ok()?;
                if l <= FAST_BITS {
                    let shift = FAST_BITS - l;
                    let base = (code << shift) as usize;
                    let entry = u16::try_from(l << 8).ok()? | u16::from(sym);
                    h.fast.get_mut(base..base + (1 << shift))?.fill(entry);
                }
                code += 1;
            }
            k += n;
            if n > 0 {
                h.maxcode[l as usize] = i32::try_from(code).ok()? - 1;
            }
            // As libjpeg: the codes of a length must fit it, and none may be all ones.
            if code >= 1 << l {
                return None;
            }
            code <<= 1;
        }
        (k == vals.len()).then_some(h)
    }

    /// Reads one code; `None` for a bit string no code starts.
    #[inline(always)]
    fn read(&self, bits: &mut Bits<'_>) -> Option<u8> {
        bits.fill();
        // A 9-bit value.
        #[allow(clippy::cast_possible_truncation)]
        let f = self.fast[bits.peek(FAST_BITS) as usize];
        if f != 0 {
            bits.consume(u32::from(f >> 8));
            #[allow(clippy::cast_possible_truncation)]
            return Some(f as u8);
        }
        for l in FAST_BITS + 1..=16 {
            let c = i32::try_from(bits.peek(l)).ok()?;
            if c <= self.maxcode[l as usize] {
                bits.consume(l);
                return self
                    .vals
                    .get(usize::try_from(self.offset[l as usize] + c).ok()?)
                    .copied();
            }
        }
        None
    }
}

/// A reader of entropy-coded bits (stuffed `FF 00` pairs read as `FF`), most significant
/// bit first. Past the data (a marker or the end) it reads zero bits, as libjpeg does, and
/// counts them.
struct Bits<'a> {
    b: &'a [u8],
    /// The next byte to load.
    pos: usize,
    /// Loaded bits, the next one the most significant.
    buf: u64,
    n: u32,
    /// Zero bytes loaded past the data.
    pad: u32,
}

impl<'a> Bits<'a> {
    /// Reads from bit `bit` of byte `byte` of `b`.
    fn at(b: &'a [u8], byte: usize, bit: u8) -> Bits<'a> {
        let mut bits = Bits {
            b,
            pos: byte,
            buf: 0,
            n: 0,
            pad: 0,
        };
        bits.fill();
        bits.consume(u32::from(bit));
        bits
    }

    /// Loads bytes until more than 56 bits are loaded.
    #[inline(always)]
    fn fill(&mut self) {
        while self.n <= 56 {
            let mut c = 0;
            match self.b.get(self.pos..self.pos + 2) {
                Some(&[0xFF, 0x00]) => {
                    c = 0xFF;
                    self.pos += 2;
                }
                Some(&[0xFF, _]) => self.pad += 1,
                Some(&[x, _]) => {
                    c = x;
                    self.pos += 1;
                }
                _ => self.pad += 1,
            }
            self.buf |= u64::from(c) << (56 - self.n);
            self.n += 8;
        }
    }

    #[inline(always)]
    fn peek(&self, l: u32) -> u64 {
        self.buf >> (64 - l)
    }

    #[inline(always)]
    fn consume(&mut self, l: u32) {
        self.buf <<= l;
        self.n -= l;
    }

    /// Reads `l` (1..=16) bits; the caller has just filled.
    #[inline(always)]
    fn take(&mut self, l: u32) -> u32 {
        #[allow(clippy::cast_possible_truncation)]
        let v = self.peek(l) as u32;
        self.consume(l);
        v
    }

    /// The byte holding the next unread bit and the bit's index in it: the marker that ends
    /// the data where every bit before it is read; `None` past the data.
    fn position(&self) -> Option<(usize, u8)> {
        let real = self.n.checked_sub(self.pad * 8)?;
        if real == 0 {
            return Some((self.pos, 0));
        }
        let mut p = self.pos;
        for _ in 0..real.div_ceil(8) {
            p -= 1;
            if self.b[p] == 0 && p > 0 && self.b[p - 1] == 0xFF {
                p -= 1;
            }
        }
        #[allow(clippy::cast_possible_truncation)]
        Some((p, ((8 - real % 8) % 8) as u8))
    }
}

/// The entry where `bits` stands, with DC predictors `dc`.
fn here(bits: &Bits<'_>, dc: [i32; 3]) -> Option<RowEntry> {
    let (byte, bit) = bits.position()?;
    let [y, cb, cr] = dc;
    Some(RowEntry {
        byte: u32::try_from(byte).ok()?,
        bit,
        dc: [
            i16::try_from(y).ok()?,
            i16::try_from(cb).ok()?,
            i16::try_from(cr).ok()?,
        ],
    })
}

/// JPEG's sign extension of a `s`-bit difference.
#[inline(always)]
fn extend(v: u32, s: u32) -> i32 {
    let v = v.cast_signed();
    if s > 0 && v < 1 << (s - 1) {
        v - (1 << s) + 1
    } else {
        v
    }
}

/// The scan of a file as the walk and the synthetic row need it.
#[derive(Debug)]
pub(super) struct Scan {
    frame: Frame,
    /// Per block of an MCU, in order: its scan component.
    blocks: Vec<usize>,
    /// Per scan component: its DC and AC tables.
    dc: Vec<Huff>,
    ac: Vec<Huff>,
}

impl Scan {
    /// The scan of `b`, or `None` for anything the entries do not serve (see the module).
    pub(super) fn parse(b: &[u8]) -> Option<Scan> {
        let frame = Frame::parse(b).filter(|f| f.interval == 0)?;
        let mut tables: [Option<Huff>; 8] = Default::default();
        let mut sampling = Vec::new();
        for seg in Markers::after_soi(b) {
            let body = seg.whole()?;
            match seg.code {
                SOF0 | SOF1 => {
                    let n = usize::from(*body.get(5)?);
                    for c in body.get(6..6 + 3 * n)?.chunks_exact(3) {
                        sampling.push((c[0], c[1] >> 4, c[1] & 15));
                    }
                }
                DHT => read_dht(body, &mut tables)?,
                SOS => return Self::from_sos(frame, body, &sampling, &tables),
                _ => {}
            }
        }
        None
    }

    fn from_sos(
        frame: Frame,
        sos: &[u8],
        sampling: &[(u8, u8, u8)],
        tables: &[Option<Huff>; 8],
    ) -> Option<Scan> {
        let n = usize::from(*sos.first()?);
        if !(1..=3).contains(&n) || n != sampling.len() {
            return None;
        }
        let (mut blocks, mut dc, mut ac) = (Vec::new(), Vec::new(), Vec::new());
        for (i, sel) in sos.get(1..1 + 2 * n)?.chunks_exact(2).enumerate() {
            let &(_, h, v) = sampling.iter().find(|s| s.0 == sel[0])?;
            let count = if n == 1 {
                1
            } else {
                usize::from(h) * usize::from(v)
            };
            blocks.extend(std::iter::repeat_n(i, count));
            dc.push(tables[usize::from(sel[1] >> 4) & 3].clone()?);
            ac.push(tables[4 + (usize::from(sel[1] & 15) & 3)].clone()?);
        }
        Some(Scan {
            frame,
            blocks,
            dc,
            ac,
        })
    }

    /// Walks the Huffman symbols of MCU rows from entry `from.0` (the first of its row in
    /// `grid`) to the start of row `to`, pushing every entry of `grid` after `from.0` onto
    /// `found`; `None` on anything unexpected.
    fn walk(
        &self,
        b: &[u8],
        grid: Grid,
        from: (usize, RowEntry),
        to: usize,
        found: &mut Vec<RowEntry>,
    ) -> Option<()> {
        let (index, start) = from;
        let mut bits = Bits::at(b, start.byte as usize, start.bit);
        let mut dc = start.dc.map(i32::from);
        let per_row = self.frame.mcus_per_row();
        for _ in index / grid.per_row as usize..to {
            for m in 0..per_row {
                if m > 0 && m % grid.group == 0 {
                    found.push(here(&bits, dc)?);
                }
                for &c in &self.blocks {
                    self.skip_block(&mut bits, c, &mut dc[c])?;
                }
            }
            found.push(here(&bits, dc)?);
        }
        Some(())
    }

    /// Reads one block of component `c`: its DC difference (added to `dc`) and its AC codes.
    #[inline(always)]
    fn skip_block(&self, bits: &mut Bits<'_>, c: usize, dc: &mut i32) -> Option<()> {
        let s = u32::from(self.dc[c].read(bits)?);
        if s > 0 {
            *dc = dc.checked_add(extend(bits.take(s), s))?;
        }
        let ac = &self.ac[c];
        let mut k = 1;
        while k < 64 {
            let rs = ac.read(bits)?;
            let (r, s) = (u32::from(rs >> 4), u32::from(rs & 15));
            if s != 0 {
                k += r + 1;
                bits.consume(s);
            } else if r == 15 {
                k += 16;
            } else {
                break;
            }
        }
        Some(())
    }
}

/// Reads the tables of one DHT segment into `tables` (DC 0-3, then AC 0-3).
fn read_dht(mut body: &[u8], tables: &mut [Option<Huff>; 8]) -> Option<()> {
    while let Some(&tc_th) = body.first() {
        let counts = body.get(1..17)?;
        let total: usize = counts.iter().map(|&c| usize::from(c)).sum();
        let vals = body.get(17..17 + total)?;
        let (class, id) = (tc_th >> 4, usize::from(tc_th & 15));
        if class > 1 || id > 3 {
            return None;
        }
        tables[usize::from(class) * 4 + id] = Some(Huff::new(counts, vals, class == 0)?);
        body = &body[17 + total..];
    }
    Some(())
}

/// The entries of rows `rows.0..rows.1` of `b` for owner `scope` (each row's, then the first
/// of row `rows.1`) into `out`, from the process's table, walking on from the deepest row it
/// knows where needed (and keeping what the walk finds); their grid, or `None` when the file
/// has none.
#[cfg(test)]
fn entries(
    b: &[u8],
    scan: &Scan,
    rows: (usize, usize),
    scope: u32,
    out: &mut Vec<RowEntry>,
) -> Option<Grid> {
    entries_of((scope, content_hash(b), b.len()), b, scan, rows, out)
}

/// [`entries`] of the file `b` whose key is `key`.
fn entries_of(
    key: Key,
    b: &[u8],
    scan: &Scan,
    rows: (usize, usize),
    out: &mut Vec<RowEntry>,
) -> Option<Grid> {
    let first = RowEntry {
        byte: u32::try_from(scan.frame.scan_at).ok()?,
        bit: 0,
        dc: [0; 3],
    };
    out.clear();
    // `out` holds entries `at..` of the file's list, ending with the deepest one known.
    let (grid, at) = {
        let t = table::table(key);
        match t.get(&key).filter(|k| !k.is_seen()) {
            Some(k) if k.list.is_empty() => return None,
            Some(k) => {
                let per_row = k.grid.per_row as usize;
                let (base, last) = (rows.0 * per_row, rows.1 * per_row);
                if k.list.len() > last {
                    out.extend_from_slice(&k.list[base..=last]);
                    return Some(k.grid);
                }
                let at = base.min(k.list.len() - 1);
                out.extend_from_slice(&k.list[at..]);
                (k.grid, at)
            }
            None => {
                let columns = Grid::columns(&scan.frame);
                let all = scan.frame.mcu_rows() as usize * columns.per_row as usize + 1;
                let room =
                    KEPT.load(Ordering::Relaxed) + all <= MAX_ENTRIES && table::fits_budget(all);
                out.push(first);
                (
                    if room {
                        columns
                    } else {
                        Grid::rows(&scan.frame)
                    },
                    0,
                )
            }
        }
    };
    let known = at + out.len();
    let from = (known - 1, out[out.len() - 1]);
    #[cfg(test)]
    tests::WALKS.with(|w| w.set(w.get() + 1));
    let walked = scan.walk(b, grid, from, rows.1, out).is_some();
    table::keep(key, grid, (first, known), walked, &out[known - at..]);
    if !walked {
        return None;
    }
    out.drain(..rows.0 * grid.per_row as usize - at);
    Some(grid)
}

/// Whether only padding bits, then the EOI marker (after any fill bytes), follow entry `e`
/// of `b`: anything else after the scan is libjpeg's to judge, from the original bytes.
fn ends_data(b: &[u8], e: RowEntry) -> bool {
    let mut at = e.byte as usize;
    if e.bit > 0 {
        at += if b[at] == 0xFF { 2 } else { 1 };
    }
    while b.get(at..at + 2) == Some(&[0xFF, 0xFF][..]) {
        at += 1;
    }
    b.get(at..at + 2) == Some(&[0xFF, 0xD9][..])
}

impl CpuDecoder {
    /// Runs `plan` (whose cropping region is `region`) from the entries of the region's rows
    /// when `bytes` has them (see the module): from the column groups it touches where it
    /// leaves some out, else from the MCU row above it where it starts low enough to skip
    /// rows; `Ok(false)` when neither.
    pub(super) fn run_from_entry(
        &mut self,
        bytes: &[u8],
        plan: &RegionPlan,
        region: (u32, u32, u32, u32),
        out: &mut RgbImage,
    ) -> Result<bool, DecodeError> {
        let Some(scan) = Scan::parse(bytes) else {
            return Ok(false);
        };
        let (f, factor) = (&scan.frame, plan.factor);
        let grid = Grid::columns(f);
        let cover = region_cover(f, factor, region, grid.group);
        let (rows, groups) = ((cover.rows.0 as usize, cover.rows.1 as usize), cover.cols);
        let narrow = groups.0 > 0 || groups.1 < grid.per_row;
        if !narrow && rows.0 < 1 {
            return Ok(false);
        }
        // A region reaching the image's last row makes libjpeg read on after the scan, and
        // what it reports there depends on how far its bit buffer had read ahead: such a
        // region takes a partial stream only where the scan ends in EOI, else decodes as
        // before, and so walks to the end.
        let (x, y, w, h) = region;
        let bottom = y + h >= factor.scale(f.height);
        // A job that reads each file once decodes a file's first sight plainly, leaving a
        // mark: the walk and a decode from its entries cost more than libjpeg's plain
        // decode, and pay off only from a second read (a later job's, within the grace).
        let key = (self.entry_scope, content_hash(bytes), bytes.len());
        if self.entry_reads_once && table::first_sight(key) {
            return Ok(false);
        }
        let mut found = Vec::new();
        let last = if narrow || bottom { rows.1 } else { rows.0 };
        let Some(kept) = entries_of(key, bytes, &scan, (rows.0, last), &mut found) else {
            return Ok(false);
        };
        if bottom && !found.last().is_some_and(|&e| ends_data(bytes, e)) {
            return Ok(false);
        }
        let mut partial = std::mem::take(&mut self.partial.bytes);
        let columns = if narrow && kept == grid {
            scan.build_columns(bytes, rows, groups, grid, &found, &mut partial)
                .map(|()| {
                    #[cfg(test)]
                    tests::COLUMN_DECODES.with(|c| c.set(c.get() + 1));
                    let x0 = (groups.0 * grid.group)
                        .checked_sub(1)
                        .map_or(0, |m| m * f.mcu_w);
                    let left = factor.scale(f.mcu_w) * u32::from(groups.0 == 0);
                    let y0 = u32::try_from(rows.0).unwrap_or(0) * f.mcu_h;
                    (x + left - factor.scale(x0), y - factor.scale(y0), w, h)
                })
        } else {
            None
        };
        let built = columns.or_else(|| {
            let row = (rows.0 >= 1).then_some(rows.0)?;
            scan.build(bytes, row, found[0], &mut partial)
                .map(|y0| (x, y - factor.scale(y0), w, h))
        });
        let result = match built {
            Some(shifted) => self.run_partial(&partial, plan, shifted, out),
            None => Ok(false),
        };
        self.partial.bytes = partial;
        result
    }
}

mod synthetic;
mod table;

pub use table::{
    entry_table_bytes, set_entry_budget, set_entry_grace, EntryHold, DEFAULT_ENTRY_BYTES_PER_SCOPE,
    DEFAULT_ENTRY_GRACE,
};

#[cfg(test)]
#[path = "entry_tests.rs"]
mod tests;
