//! The fixed-point arithmetic of `hw/softmax/softmax.sv`, written to be read: the design's output
//! must equal [`softmax_rows`] bit for bit. Formats and error bounds: hw/softmax/README.md.
//!
//! t = x log2(e) in signed Q23.16 (40 bits); sums d in unsigned Q.40 (64 bits); 2^a in Q0.40;
//! 1/d as a Q0.32 mantissa and a power of two; outputs fp32 with the mantissa truncated.

/// Fraction bits of t = x log2(e).
const T_FRAC: u32 = 16;
/// Largest |t|: inputs beyond ~5.8e6 in magnitude saturate here.
pub const T_MAX: i64 = (1 << 39) - 1;
/// 1.0 in the sum's and the exponential's Q.40.
const ONE: u64 = 1 << 40;
/// round(log2(e) * 2^24).
const LOG2E_Q24: u64 = 24_204_406;
/// The longest row: d <= n (1 + 2e-6) must fit in 64 bits of Q.40.
pub const MAX_N: usize = 1 << 23;
pub const NAN_BITS: u32 = 0x7FC0_0000;

/// 2^(i/256) in Q1.30, i = 0..=256: the ROM hw/softmax/exp2_lut.mem holds.
pub fn exp2_table() -> Vec<u64> {
    (0..=256).map(|i| (2f64.powf(i as f64 / 256.0) * 2f64.powi(30)).round() as u64).collect()
}

/// 1 / (1 + (i + 0.5)/1024) in Q0.32, i = 0..1024: the ROM hw/softmax/recip_lut.mem holds (the
/// middle of each interval, so the seed errs by at most 2^-11 relative).
pub fn recip_table() -> Vec<u64> {
    (0..1024).map(|i| (2f64.powi(32) / (1.0 + (i as f64 + 0.5) / 1024.0)).round() as u64).collect()
}

/// One bf16 input as the design sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Input {
    /// t = round(x log2(e) 2^16), saturated at +-T_MAX; zeros and subnormals give 0.
    Value(i64),
    /// -inf: contributes nothing, outputs 0.
    Masked,
    /// NaN or +inf: the whole row outputs NaN.
    Poison,
}

pub fn convert(bits: u16) -> Input {
    let (sign, exp, frac) = (bits >> 15, (bits >> 7) & 0xFF, (bits & 0x7F) as u64);
    if exp == 0xFF {
        return if frac == 0 && sign == 1 { Input::Masked } else { Input::Poison };
    }
    if exp == 0 {
        return Input::Value(0);
    }
    // x = (128 + frac) 2^(exp - 134), so t 2^16 = (128 + frac) LOG2E_Q24 2^(exp - 142).
    let p = (128 + frac) * LOG2E_Q24;
    let shift = exp as i32 - 142;
    let mag = if shift >= 8 {
        T_MAX as u64
    } else if shift >= 0 {
        (p << shift).min(T_MAX as u64)
    } else if shift <= -40 {
        0
    } else {
        let r = (-shift) as u32;
        (p + (1 << (r - 1))) >> r // round half up
    };
    Input::Value(if sign == 1 { -(mag as i64) } else { mag as i64 })
}

/// The two ROMs, built once per call site.
pub struct Tables {
    pub exp2: Vec<u64>,
    pub recip: Vec<u64>,
}

impl Default for Tables {
    fn default() -> Self {
        Tables { exp2: exp2_table(), recip: recip_table() }
    }
}

impl Tables {
    /// 2^a for a <= 0 given in Q.16, as Q0.40: the table at the top 8 fraction bits, linear
    /// interpolation on the low 8 (truncated), then shifted right by the integer part.
    pub fn exp2(&self, a: i64) -> u64 {
        debug_assert!(a <= 0);
        let (int, frac) = (a >> T_FRAC, (a & 0xFFFF) as usize);
        let (idx, w) = (frac >> 8, (frac & 0xFF) as u64);
        let (lo, hi) = (self.exp2[idx], self.exp2[idx + 1]);
        let v = lo + (((hi - lo) * w) >> 8);
        let k = (-int) as u64;
        if k > 41 { 0 } else { (v << 10) >> k }
    }

    /// 1/d for d in Q.40, d >= 1: (r, k) with 1/d ~ r 2^-32 2^-k. d normalized to dn in [1, 2)
    /// (Q1.32, truncated), a seed from its top 10 fraction bits, one Newton step r0 (2 - dn r0).
    pub fn recip(&self, d: u64) -> (u64, u32) {
        let p = if d < ONE { 40 } else { 63 - d.leading_zeros() };
        let dn = (d >> (p - 32)) as u128;
        let r0 = self.recip[((dn >> 22) & 0x3FF) as usize] as u128;
        let two_minus = (1u128 << 65) - dn * r0;
        (((r0 * two_minus) >> 64) as u64, p - 40)
    }
}

/// (d e) >> 40: a sum rescaled by a factor e <= 1 in Q0.40.
fn scale(d: u64, e: u64) -> u64 {
    ((d as u128 * e as u128) >> 40) as u64
}

/// A running (max, sum) over some of a row's elements.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Acc {
    /// Seen a finite element: `m` and `d` mean something.
    pub valid: bool,
    /// Seen NaN or +inf.
    pub poison: bool,
    pub m: i64,
    pub d: u64,
}

impl Acc {
    /// One element into a lane's running (m, d).
    pub fn update(&mut self, t: &Tables, x: Input) {
        match x {
            Input::Masked => {}
            Input::Poison => self.poison = true,
            Input::Value(v) if !self.valid => (self.valid, self.m, self.d) = (true, v, ONE),
            Input::Value(v) if v > self.m => (self.m, self.d) = (v, scale(self.d, t.exp2(self.m - v)) + ONE),
            Input::Value(v) => self.d += t.exp2(v - self.m),
        }
    }

    /// Two running (m, d) into one, each sum rescaled to the larger max.
    pub fn combine(t: &Tables, a: Acc, b: Acc) -> Acc {
        let poison = a.poison || b.poison;
        let mut r = match (a.valid, b.valid) {
            (false, _) => b,
            (_, false) => a,
            _ => {
                let m = a.m.max(b.m);
                Acc { valid: true, poison, m, d: scale(a.d, t.exp2(a.m - m)) + scale(b.d, t.exp2(b.m - m)) }
            }
        };
        r.poison = poison;
        r
    }
}

/// P 2^-72 2^-k as fp32 bits, the mantissa truncated; below the normal range, 0.
fn to_f32(p: u128, k: u32) -> u32 {
    if p == 0 {
        return 0;
    }
    let q = 127 - p.leading_zeros() as i32;
    let exp = q + 55 - k as i32;
    if exp <= 0 {
        return 0;
    }
    let mant = if q >= 23 { p >> (q - 23) } else { p << (23 - q) };
    (exp as u32) << 23 | (mant as u32 & 0x7F_FFFF)
}

/// One row through the design: `lanes` running (m, d), lane j taking elements j, j + lanes,
/// ...; a tree combining lanes (2i, 2i+1) level by level; then each output 2^(t - m) / d.
pub fn softmax_row(t: &Tables, x: &[u16], lanes: usize, y: &mut [u32]) {
    assert!(lanes.is_power_of_two(), "lanes must be a power of two");
    let inputs: Vec<Input> = x.iter().map(|&b| convert(b)).collect();
    let mut level = vec![Acc::default(); lanes];
    for (i, &v) in inputs.iter().enumerate() {
        level[i % lanes].update(t, v);
    }
    while level.len() > 1 {
        level = level.chunks(2).map(|p| Acc::combine(t, p[0], p[1])).collect();
    }
    let row = level[0];
    let (r, k) = t.recip(row.d);
    for (y, v) in y.iter_mut().zip(inputs) {
        *y = match v {
            _ if row.poison => NAN_BITS,
            Input::Value(v) if row.valid => to_f32(t.exp2(v - row.m) as u128 * r as u128, k),
            _ => 0,
        };
    }
}

/// Every row of `x` (rows of `n` bf16 bit patterns) as the design computes it: fp32 bits.
pub fn softmax_rows(t: &Tables, x: &[u16], n: usize, lanes: usize) -> Vec<u32> {
    let mut y = vec![0; x.len()];
    for (x, y) in x.chunks(n).zip(y.chunks_mut(n)) {
        softmax_row(t, x, lanes, y);
    }
    y
}
