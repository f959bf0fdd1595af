//! The partial stream of an entry point: the synthetic MCU row (coded with the file's own
//! Huffman tables so that its DC predictors end at the entry's and its length leaves the
//! original bits at their own alignment), then the original bytes as they are.

use super::{Huff, RowEntry, Scan};

/// Bits written most significant first, `FF` stuffed with `00`.
pub(super) struct Writer<'a> {
    pub(super) out: &'a mut Vec<u8>,
    pub(super) acc: u64,
    pub(super) n: u32,
    /// Bits written in all.
    pub(super) total: u64,
}

impl Writer<'_> {
    fn put(&mut self, code: u32, len: u32) {
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
    /// Writes the synthetic MCU row: DC predictors ending at `target`, every block's AC an
    /// EOB (and some AC codes in the first block where needed), `bit` mod 8 bits long
    /// (`bit` bits are left in the writer). `None` when the tables cannot code it.
    pub(super) fn synthetic_row(
        &self,
        w: &mut Writer<'_>,
        target: [i16; 3],
        bit: u8,
    ) -> Option<()> {
        let per_row = self.frame.mcus_per_row() as usize;
        // Plan every block's DC difference first; then the length is known.
        let mut plans = Vec::with_capacity(3);
        for (c, &t) in target.iter().enumerate().take(self.dc.len()) {
            let n = per_row * self.blocks.iter().filter(|&&b| b == c).count();
            plans.push(plan_dc(i32::from(t), n, &self.dc[c])?.into_iter());
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
        let need = (u64::from(bit) + 8 - length % 8) as u32 % 8;
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
        f.write_header(b, out, f.width, f.height - y0)?;
        let mut w = Writer {
            out,
            acc: 0,
            n: 0,
            total: 0,
        };
        self.synthetic_row(&mut w, e.dc, e.bit)?;
        let (s, bit) = (e.byte as usize, u32::from(e.bit));
        let mut from = s;
        if bit > 0 {
            // The boundary byte: the synthetic row's last bits, then the original's.
            let mask = 0xFFu8 >> bit;
            #[allow(clippy::cast_possible_truncation)]
            let merged = ((w.acc << (8 - bit)) as u8 & !mask) | (b[s] & mask);
            w.out.push(merged);
            if merged == 0xFF {
                w.out.push(0);
            }
            from = s + if b[s] == 0xFF { 2 } else { 1 };
        }
        out.extend_from_slice(b.get(from..)?);
        Some(y0)
    }
}
