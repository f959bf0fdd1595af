//! The partial streams of entry points. Synthetic MCUs, coded with the file's own Huffman
//! tables so that their DC predictors end at an entry's and their length leaves the original
//! bits at their own alignment, then the original bytes as they are: one synthetic row above
//! the rows (`Scan::build`), or one synthetic MCU before each row's span of original bits,
//! written on from wherever the span before it ended (`Scan::build_columns`).

use super::{Grid, Huff, RowEntry, Scan};

/// Zero bytes after a stream of columns' EOI marker, never read: libjpeg-turbo's Huffman
/// decoder takes its fast path only while at least 512 bytes per block of an MCU (up to 10
/// blocks) are left in the source, and never in a file with restart markers (`decode_mcu`
/// in `jdhuff.c`), so without them a stream's last few kilobytes decode on the slow path.
const TAIL_PAD: usize = 512 * 10;

/// Bits written most significant first, `FF` stuffed with `00`.
pub(super) struct Writer<'a> {
    pub(super) out: &'a mut Vec<u8>,
    pub(super) acc: u64,
    pub(super) n: u32,
    /// Bits written in all.
    pub(super) total: u64,
}

impl<'a> Writer<'a> {
    pub(super) fn new(out: &'a mut Vec<u8>) -> Writer<'a> {
        Writer {
            out,
            acc: 0,
            n: 0,
            total: 0,
        }
    }

    /// Ends the synthetic bits where the original's resume at entry `e` of `b`: writes the
    /// byte they share (the writer holds `e.bit` bits) and returns the first original byte
    /// to copy as it is; the writer is then empty, at a byte boundary.
    fn resume(&mut self, b: &[u8], e: RowEntry) -> usize {
        let (s, bit, acc) = (e.byte as usize, u32::from(e.bit), self.acc);
        (self.acc, self.n, self.total) = (0, 0, 0);
        if bit == 0 {
            return s;
        }
        let mask = 0xFFu8 >> bit;
        #[allow(clippy::cast_possible_truncation)]
        let merged = ((acc << (8 - bit)) as u8 & !mask) | (b[s] & mask);
        self.out.push(merged);
        if merged == 0xFF {
            self.out.push(0);
        }
        s + if b[s] == 0xFF { 2 } else { 1 }
    }

    /// Takes up, after the original bytes copied up to byte `e.byte` of `b`, the bits of
    /// that byte before entry `e`.
    fn hold(&mut self, b: &[u8], e: RowEntry) {
        (self.acc, self.n, self.total) = (0, 0, 0);
        if e.bit > 0 {
            self.put(
                u32::from(b[e.byte as usize] >> (8 - e.bit)),
                u32::from(e.bit),
            );
        }
    }

    /// Pads the last byte with ones.
    fn finish(&mut self) {
        if self.n > 0 {
            let n = 8 - self.n;
            self.put((1 << n) - 1, n);
        }
    }

    pub(super) fn put(&mut self, code: u32, len: u32) {
        self.acc = (self.acc << len) | u64::from(code);
        self.n += len;
        self.total += u64::from(len);
        while self.n >= 8 {
            self.n -= 8;
            #[allow(clippy::cast_possible_truncation)]
            let byte = (self.acc >> self.n) as u8;
            self.out.push(byte);
            if byte == 0xFF {
                self.out.push(0);
            }
        }
        self.acc &= (1 << self.n) - 1;
    }
}

/// The size category of a DC difference (its bit length).
fn category(v: i32) -> u32 {
    32 - v.unsigned_abs().leading_zeros()
}

/// A DC difference for the next block when `rem` is left to reach: `rem` itself where the
/// table codes its category, else a step towards it that the table codes.
fn dc_step(rem: i32, t: &Huff) -> Option<i32> {
    let has = |c: u32| t.len[c as usize] != 0;
    let c = category(rem);
    if has(c) {
        return Some(rem);
    }
    let sign = if rem < 0 { -1 } else { 1 };
    if let Some(below) = (1..c).rev().find(|&k| has(k)) {
        return Some(sign * ((1 << below) - 1));
    }
    let above = (c + 1..=11).find(|&k| has(k))?;
    Some(sign * (1 << (above - 1)))
}

/// `n` DC differences summing to `target`, each of a category table `t` codes: steps to the
/// target, then zeros (or, without category 0, pairs `v, -v` and one triple `2v, -v, -v`).
fn plan_dc(target: i32, n: usize, t: &Huff) -> Option<Vec<i32>> {
    let has = |c: u32| t.len[c as usize] != 0;
    let mut v = Vec::with_capacity(n);
    let mut rem = target;
    while rem != 0 {
        if v.len() == n {
            return None;
        }
        let d = dc_step(rem, t)?;
        v.push(d);
        rem -= d;
    }
    let mut left = n - v.len();
    if has(0) {
        v.resize(n, 0);
        return Some(v);
    }
    if left % 2 == 1 {
        let k = (1..11).find(|&k| has(k) && has(k + 1))?;
        if left < 3 {
            return None;
        }
        v.extend([1 << k, -(1 << (k - 1)), -(1 << (k - 1))]);
        left -= 3;
    }
    let k = (1..=11).find(|&k| has(k))?;
    for _ in 0..left / 2 {
        v.extend([1 << (k - 1), -(1 << (k - 1))]);
    }
    Some(v)
}

/// Writes one DC difference `d` with table `t` (which codes its category).
fn put_dc(w: &mut Writer<'_>, t: &Huff, d: i32) {
    let s = category(d);
    w.put(u32::from(t.code[s as usize]), u32::from(t.len[s as usize]));
    if s > 0 {
        let bits = if d < 0 { d + (1 << s) - 1 } else { d };
        w.put(bits.cast_unsigned(), s);
    }
}

/// An AC symbol of `t` (run 0..=7, a nonzero size) whose code and value bits are an odd
/// number of bits: `k` of them shift a length by any residue mod 8.
fn odd_ac(t: &Huff) -> Option<(u8, u32)> {
    (0u8..=0x7F)
        .filter(|rs| rs & 15 != 0)
        .map(|rs| (rs, u32::from(t.len[usize::from(rs)]) + u32::from(rs & 15)))
        .find(|&(rs, l)| t.len[usize::from(rs)] != 0 && l % 2 == 1)
}

impl Scan {
    /// Writes `per_row` synthetic MCUs: DC predictors moving by `delta`, every block's AC an
    /// EOB (and some AC codes in the first block where needed), ending `bit` mod 8 bits into
    /// a byte (`bit` bits are then left in the writer). `None` when the tables cannot code
    /// them.
    pub(super) fn synthetic(
        &self,
        w: &mut Writer<'_>,
        per_row: usize,
        delta: [i32; 3],
        bit: u8,
    ) -> Option<()> {
        // Plan every block's DC difference first; then the length is known.
        let mut plans = Vec::with_capacity(3);
        for (c, &t) in delta.iter().enumerate().take(self.dc.len()) {
            let n = per_row * self.blocks.iter().filter(|&&b| b == c).count();
            plans.push(plan_dc(t, n, &self.dc[c])?.into_iter());
        }
        let mut diffs = Vec::with_capacity(per_row * self.blocks.len());
        let mut length = 0u64;
        for _ in 0..per_row {
            for &c in &self.blocks {
                let d = plans[c].next()?;
                let s = category(d);
                let eob = self.ac[c].len[0];
                if eob == 0 {
                    return None;
                }
                length += u64::from(self.dc[c].len[s as usize]) + u64::from(s) + u64::from(eob);
                diffs.push(d);
            }
        }
        #[allow(clippy::cast_possible_truncation)]
        let need = (u64::from(bit) + 8 - (w.total + length) % 8) as u32 % 8;
        let c0 = self.blocks[0];
        let (extra, sym) = if need == 0 {
            (0, (0, 0))
        } else {
            let (rs, l) = odd_ac(&self.ac[c0])?;
            ((1..8).find(|k| k * l % 8 == need)?, (rs, l))
        };
        for (i, &d) in diffs.iter().enumerate() {
            let c = self.blocks[i % self.blocks.len()];
            put_dc(w, &self.dc[c], d);
            if i == 0 {
                let (rs, _) = sym;
                let (code, len) = (
                    self.ac[c].code[usize::from(rs)],
                    self.ac[c].len[usize::from(rs)],
                );
                let s = u32::from(rs & 15);
                for _ in 0..extra {
                    w.put(u32::from(code), u32::from(len));
                    w.put((1 << s) - 1, s);
                }
            }
            let eob = &self.ac[c];
            w.put(u32::from(eob.code[0]), u32::from(eob.len[0]));
        }
        debug_assert_eq!(w.total % 8, u64::from(bit));
        Some(())
    }

    /// Builds into `out` the partial stream starting at MCU row `row` (entry `e`): the header
    /// with the frame height of rows `row - 1..`, the synthetic row, the original bytes.
    /// Returns the first row of the partial image in original pixels.
    pub(super) fn build(
        &self,
        b: &[u8],
        row: usize,
        e: RowEntry,
        out: &mut Vec<u8>,
    ) -> Option<u32> {
        let f = &self.frame;
        let y0 = u32::try_from(row - 1).ok()? * f.mcu_h;
        out.clear();
        out.extend_from_slice(&[0xFF, 0xD8]);
        f.write_header(b, out, (f.width, f.height - y0))?;
        let mut w = Writer::new(out);
        let (mcus, delta) = (f.mcus_per_row() as usize, e.dc.map(i32::from));
        self.synthetic(&mut w, mcus, delta, e.bit)?;
        let from = w.resume(b, e);
        out.extend_from_slice(b.get(from..)?);
        Some(y0)
    }

    /// Builds into `out` the partial stream of column groups `groups` (of `grid`) of MCU rows
    /// `rows`, from their entries (`found[i * grid.per_row + j]`: row `rows.0 + i`, group
    /// `j`; then the first of row `rows.1`). Each row is a synthetic MCU, written on from
    /// where the row above ended and bringing the DC predictors from that row's last MCU
    /// to the span's first, then the original bits of the span. The partial image's MCU
    /// column 1 is the original's `groups.0 * grid.group`.
    pub(super) fn build_columns(
        &self,
        b: &[u8],
        rows: (usize, usize),
        groups: (u32, u32),
        grid: Grid,
        found: &[RowEntry],
        out: &mut Vec<u8>,
    ) -> Option<()> {
        let f = &self.frame;
        let (m0, m1) = (
            groups.0 * grid.group,
            (groups.1 * grid.group).min(f.mcus_per_row()),
        );
        let width = if m1 == f.mcus_per_row() {
            f.mcu_w + f.width - m0 * f.mcu_w
        } else {
            (1 + m1 - m0) * f.mcu_w
        };
        let y0 = u32::try_from(rows.0).ok()? * f.mcu_h;
        let height = if rows.1 == f.mcu_rows() as usize {
            f.height - y0
        } else {
            u32::try_from(rows.1 - rows.0).ok()? * f.mcu_h
        };
        out.clear();
        out.extend_from_slice(&[0xFF, 0xD8]);
        f.write_header(b, out, (width, height))?;
        let per_row = grid.per_row as usize;
        let mut w = Writer::new(out);
        let mut dc = [0i32; 3];
        for i in 0..rows.1 - rows.0 {
            let start = found[i * per_row + groups.0 as usize];
            let end = found[i * per_row + groups.1 as usize];
            let delta = [0, 1, 2].map(|c| i32::from(start.dc[c]) - dc[c]);
            self.synthetic(&mut w, 1, delta, start.bit)?;
            let from = w.resume(b, start);
            w.out.extend_from_slice(b.get(from..end.byte as usize)?);
            w.hold(b, end);
            dc = end.dc.map(i32::from);
        }
        w.finish();
        out.extend_from_slice(&[0xFF, 0xD9]);
        out.resize(out.len() + TAIL_PAD, 0);
        Some(())
    }
}
