//! `fpga`: the row-wise softmax as a streaming dataflow design (hw/softmax/softmax.sv), simulated
//! cycle by cycle with Verilator. The design reads bf16 rows LANES elements a cycle, keeps a
//! running (max, sum) per lane in fixed point, reduces the lanes in a pipelined tree, then reads
//! the row again for the fp32 outputs; hw/softmax/README.md states its formats and bounds.
//!
//! Each record is checked three ways: bit for bit against [`model`], within [`tolerance`] of the
//! f64 softmax, and its simulated cycles within 5% of [`analytic_cycles`]. Its time is modelled,
//! cycles at a stated clock (`timing.launch` = "simulated"), never a wall time.

pub mod model;
pub mod sim;

use super::compare::{compare, compare_bits, first_failure};
use super::softmax;
use super::variant::VariantInfo;
use super::widen;
use crate::experiment::{param_str, param_timed, param_usize, rng_for, Backend, Experiment, Measurement, Session};
use crate::profile::{TimeSummary, TimingMode, Work};
use crate::record::{ErrorStats, Tolerance};
use crate::{LabError, Result};
use half::bf16;
use serde_json::{json, Value};

pub struct Fpga;

pub const VARIANT: &str = "stream_two_pass";
/// Inputs and outputs; the fixed-point formats inside are in hw/softmax/README.md.
pub const FORMAT: &str = "bf16-in-fp32-out";
/// The clock the figures are stated at unless a case names another.
pub const DEFAULT_CLOCK_MHZ: f64 = 300.0;
/// Bytes each element moves at the design's ports: read twice as bf16, written once as fp32.
pub const BYTES_PER_ELEMENT: u64 = 2 + 2 + 4;
/// The cycle check's allowance, relative.
pub const CYCLE_TOLERANCE: f64 = 0.05;

pub fn variants() -> Vec<VariantInfo> {
    vec![VariantInfo {
        name: VARIANT,
        dtypes: vec!["bf16"],
        requires: "cpu",
        what: "LANES elements a cycle, online (max, sum) per lane, a pipelined lane tree, a second pass for outputs; simulated by Verilator",
    }]
}

/// Cycles in_ready is low between a row's passes: the last beat's accumulate, one per level of
/// the lane tree, two reciprocal stages and the latch of the row's (m, 1/d).
pub fn reduce_cycles(lanes: usize) -> u64 {
    4 + lanes.trailing_zeros() as u64
}

/// Cycles from a pass-2 beat to its outputs: the exponential, then the product and fp32.
pub const OUT_LATENCY: u64 = 2;

/// The design's cycle count for `rows` rows of `n` with `lanes` lanes, counting the edge that
/// takes the first beat and the one that shows the last output: per row ceil(n/L) beats in
/// each of two passes plus the reduction between them, then the output pipeline once.
pub fn analytic_cycles(n: usize, rows: usize, lanes: usize) -> u64 {
    rows as u64 * (2 * n.div_ceil(lanes) as u64 + reduce_cycles(lanes)) + OUT_LATENCY
}

/// How far the design's output may be from the f64 softmax of its bf16 inputs, for rows of `n`
/// (derivation: hw/softmax/README.md, "Error bounds"). Relative parts, summed:
pub fn tolerance(n: usize) -> Tolerance {
    let ln2 = std::f64::consts::LN_2;
    // t = x log2(e) rounded to 2^-17: y_i's own exponent and the sum's weighted mean of theirs.
    let t_rounding = 2.0 * ln2 * 2f64.powi(-17);
    // log2(e) held as 24204406 / 2^24 (|error| 1.9e-8) scales each t - m; beyond |x - max| = 104
    // a term is below atol's reach (e^-104 ~ 7e-46), for this element or the sum.
    let log2e_const = 2.0 * ln2 * 1.93e-8 * 104.0;
    // 2^f by chords of 256 intervals: above the curve by at most h^2/8 (ln 2)^2, in y_i and in d.
    let interpolation = 2.0 * 2f64.powi(-16) / 8.0 * ln2 * ln2;
    // The ROMs' rounding and the interpolation's truncation, in Q1.30: a few 2^-30 each.
    let roms = 8.0 * 2f64.powi(-30);
    // The reciprocal: a seed within 2^-11, squared by one Newton step, plus two truncations.
    let reciprocal = 2f64.powi(-22) + 2.0 * 2f64.powi(-32);
    // The fp32 mantissa truncated.
    let output = 2f64.powi(-23);
    // Each of the sum's n additions and n rescalings truncates 2^-40; d >= 1.
    let sum = 2.0 * n as f64 * 2f64.powi(-40);
    // Absolute: one 2^-40 truncation of 2^(t - m), and fp32 values below 2^-126 flushed.
    let atol = 2f64.powi(-40) + 2f64.powi(-126);
    Tolerance { atol, rtol: t_rounding + log2e_const + interpolation + roms + reciprocal + output + sum }
}

impl Experiment for Fpga {
    fn name(&self) -> &'static str {
        "fpga"
    }
    fn description(&self) -> &'static str {
        "row-wise softmax as a streaming SystemVerilog design (1, 4, 16 lanes), simulated cycle by cycle with Verilator; time modelled at 300 MHz"
    }
    fn headlines(&self) -> &'static [&'static str] {
        &["n=16384 lanes=16"]
    }
    fn sweep_axis(&self) -> &'static str {
        "n"
    }
    fn cases(&self, _backend: &Backend, quick: bool) -> Vec<Value> {
        let case = |n: usize, rows: usize, lanes: usize, fill: &str, timed: bool| {
            json!({"n": n, "rows": rows, "lanes": lanes, "fill": fill, "format": FORMAT, "clock_mhz": DEFAULT_CLOCK_MHZ, "timed": timed})
        };
        let lanes: &[usize] = if quick { &[1, 4] } else { &[1, 4, 16] };
        // Odd widths (a masked last beat) and hostile values: gates, checked but not timed.
        let gates: &[(usize, usize, &str)] = if quick {
            &[(1, 3, "normal"), (17, 5, "normal"), (33, 10, "hostile")]
        } else {
            &[(1, 3, "normal"), (17, 8, "normal"), (1000, 4, "normal"), (4097, 2, "normal"), (33, 10, "hostile"), (1000, 10, "hostile")]
        };
        let timed: &[(usize, usize)] = if quick { &[(64, 8), (1000, 4)] } else { &[(64, 64), (1024, 32), (4096, 16), (4097, 16), (16384, 4)] };
        let mut out = Vec::new();
        for &l in lanes {
            out.extend(gates.iter().map(|&(n, rows, fill)| case(n, rows, l, fill, false)));
            out.extend(timed.iter().map(|&(n, rows)| case(n, rows, l, "normal", true)));
        }
        out
    }
    fn run_case(&self, s: &mut Session, case: &Value) -> Result<()> {
        if !s.wants(VARIANT, "verilator") {
            return Ok(());
        }
        let (n, rows, lanes) = (param_usize(case, "n")?, param_usize(case, "rows")?, param_usize(case, "lanes")?);
        let clock_mhz = case.get("clock_mhz").and_then(Value::as_f64).unwrap_or(DEFAULT_CLOCK_MHZ);
        if !(1..=model::MAX_N).contains(&n) || rows == 0 {
            return Err(LabError::shape("fpga", format!("{rows} rows of {n}: rows must be 1 to {} wide, and at least one", model::MAX_N)));
        }
        if !(clock_mhz > 0.0 && clock_mhz.is_finite()) {
            return Err(LabError::Invalid(format!("fpga: clock_mhz must be a positive number, not {clock_mhz}")));
        }
        let x: Vec<bf16> = softmax::input(rows, n, param_str(case, "fill")?, &mut rng_for(s.opts.seed, case))?;
        let bits: Vec<u16> = x.iter().map(|v| v.to_bits()).collect();
        let sim = sim::Simulator::build(lanes)?;
        let out = sim.run(&bits, n)?;
        let model = model::softmax_rows(&model::Tables::default(), &bits, n, lanes);
        let expected = softmax::reference(&widen(&x), n);
        let outcome = Outcome::judge(&out, &model, &expected, n, rows, lanes);

        let elements = (rows * n) as u64;
        // ~5 flops an element (max, subtract, exponential, add, multiply), as the GPU family says.
        let work = Work { bytes: BYTES_PER_ELEMENT * elements, flops: 5 * elements };
        let mut m = Measurement::new(VARIANT, "verilator", case, work);
        let seconds = out.cycles as f64 / (clock_mhz * 1e6);
        if param_timed(case) {
            let ms = seconds * 1e3;
            let mode = TimingMode { l2: "none".into(), launch: "simulated".into(), warmup: 0, raw_ms: vec![ms], warmup_ms: vec![], clocks: None };
            m.time = Some((TimeSummary::of(&[ms]), mode));
        }
        m.tolerance = Some(outcome.tolerance);
        m.error = Some(outcome.verdict());
        m.extra.insert("cycles".into(), out.cycles.into());
        m.extra.insert("clock_mhz".into(), clock_mhz.into());
        m.extra.insert("time_is".into(), "modelled: simulated cycles / clock_mhz, not wall time".into());
        m.extra.insert("elements_per_s".into(), (elements as f64 / seconds).into());
        m.extra.insert("port_roof_gb_s".into(), port_roof_gb_s(lanes, clock_mhz).into());
        m.extra.insert("checks".into(), outcome.summary());
        s.emit(m)?;
        Ok(())
    }
}

/// The bandwidth the design's ports can move at `clock_mhz`: each lane takes an element a
/// cycle in each pass, and an element's bytes are spread over its two passes.
pub fn port_roof_gb_s(lanes: usize, clock_mhz: f64) -> f64 {
    lanes as f64 * (BYTES_PER_ELEMENT as f64 / 2.0) * clock_mhz * 1e6 / 1e9
}

/// The three checks of one simulation.
pub struct Outcome {
    pub bit_exact: ErrorStats,
    pub cycles: ErrorStats,
    pub f64: ErrorStats,
    pub tolerance: Tolerance,
    simulated: u64,
    analytic: u64,
}

impl Outcome {
    pub fn judge(out: &sim::SimOutput, model: &[u32], expected: &[f64], n: usize, rows: usize, lanes: usize) -> Outcome {
        let tolerance = tolerance(n);
        let analytic = analytic_cycles(n, rows, lanes);
        let got: Vec<f64> = out.y.iter().map(|&b| f32::from_bits(b) as f64).collect();
        Outcome {
            bit_exact: compare_bits(&out.y, model, "rust-model (bit-exact)"),
            cycles: compare(&[out.cycles as f64], &[analytic as f64], Tolerance { atol: 0.0, rtol: CYCLE_TOLERANCE }, "analytic cycles (5%)"),
            f64: compare(&got, expected, tolerance, "cpu-f64"),
            tolerance,
            simulated: out.cycles,
            analytic,
        }
    }

    pub fn passed(&self) -> bool {
        self.bit_exact.passed() && self.cycles.passed() && self.f64.passed()
    }

    /// The record's error: the first check that failed, else the f64 comparison.
    pub fn verdict(&self) -> ErrorStats {
        first_failure(self.bit_exact.clone(), first_failure(self.cycles.clone(), self.f64.clone()))
    }

    pub fn summary(&self) -> Value {
        json!({
            "bit_exact": {"passed": self.bit_exact.passed(), "mismatches": self.bit_exact.mismatches, "first_index": self.bit_exact.worst_index},
            "cycles": {"passed": self.cycles.passed(), "simulated": self.simulated, "analytic": self.analytic, "allowed": CYCLE_TOLERANCE},
            "f64": {"passed": self.f64.passed(), "max_rel": self.f64.max_rel, "max_abs": self.f64.max_abs, "worst_fraction_of_tolerance": self.f64.worst_fraction_of_tolerance},
        })
    }
}

#[cfg(test)]
mod tests;
