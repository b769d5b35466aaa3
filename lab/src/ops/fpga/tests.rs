//! The model against the f64 softmax, the committed ROMs against the model's tables, the
//! simulated design against the model and the cycle formula, and each check failing on a fault
//! planted for it. Tests that simulate need Verilator and fail, naming it, without it.

use super::model::{self, Tables};
use super::sim::{SimOutput, Simulator, SOURCES};
use super::*;
use rand::SeedableRng;

fn rows(rows: usize, n: usize, fill: &str, seed: u64) -> (Vec<u16>, Vec<f64>) {
    let x: Vec<bf16> = softmax::input(rows, n, fill, &mut rand::rngs::StdRng::seed_from_u64(seed)).unwrap();
    (x.iter().map(|v| v.to_bits()).collect(), softmax::reference(&widen(&x), n))
}

fn as_f64(y: &[u32]) -> Vec<f64> {
    y.iter().map(|&b| f32::from_bits(b) as f64).collect()
}

/// The entries of a committed `.mem` ROM (hex, one a line, `//` comments).
fn rom(name: &str) -> Vec<u64> {
    let text = SOURCES.iter().find(|s| s.0 == name).unwrap().1;
    text.lines().filter(|l| !l.starts_with("//") && !l.trim().is_empty()).map(|l| u64::from_str_radix(l.trim(), 16).unwrap()).collect()
}

fn with_source(name: &str, edit: impl Fn(&str) -> String) -> Vec<(&'static str, String)> {
    SOURCES.iter().map(|&(f, text)| (f, if f == name { edit(text) } else { text.to_string() })).collect()
}

fn build_from(sources: &[(&'static str, String)], lanes: usize) -> Simulator {
    let borrowed: Vec<(&str, &str)> = sources.iter().map(|(f, t)| (*f, t.as_str())).collect();
    Simulator::build_from(&borrowed, lanes).unwrap()
}

#[test]
fn the_committed_roms_hold_the_models_tables() {
    assert_eq!(rom("exp2_lut.mem"), model::exp2_table());
    assert_eq!(rom("recip_lut.mem"), model::recip_table());
}

#[test]
fn the_model_is_within_its_derived_tolerance_of_the_f64_softmax() {
    let t = Tables::default();
    for (r, n, fill) in [(3, 1, "normal"), (40, 17, "normal"), (8, 1000, "normal"), (2, 65537, "normal"), (25, 33, "hostile"), (10, 4097, "hostile")] {
        let (x, expected) = rows(r, n, fill, n as u64);
        for lanes in [1, 2, 16] {
            let e = compare(&as_f64(&model::softmax_rows(&t, &x, n, lanes)), &expected, tolerance(n), "cpu-f64");
            assert!(e.passed(), "{r} x {n} {fill}, {lanes} lanes: {e:?}");
            // The bound is not loose by orders of magnitude: the worst element uses a fair part.
            if fill == "normal" && n >= 1000 {
                assert!(e.worst_fraction_of_tolerance > 0.05, "{n}: {e:?}");
            }
        }
    }
}

#[test]
fn the_model_defines_the_edge_cases_as_the_gpu_family_does() {
    let t = Tables::default();
    let b = |v: f32| bf16::from_f32(v).to_bits();
    let y = |x: &[u16]| model::softmax_rows(&t, x, x.len(), 2);
    assert_eq!(y(&[b(f32::NEG_INFINITY); 3]), vec![0; 3], "a fully masked row is zeros");
    assert_eq!(y(&[b(f32::NEG_INFINITY), b(3.0)]), vec![0, 0x3F7F_FFFC], "masked -> 0, the rest ~1 (1/d errs low by < 2^-22)");
    assert!(y(&[b(1.0), b(f32::NAN), b(0.0)]).iter().all(|&v| v == model::NAN_BITS), "NaN poisons the row");
    assert!(y(&[b(f32::INFINITY), b(0.0)]).iter().all(|&v| v == model::NAN_BITS), "+inf poisons the row");
    assert_eq!(model::convert(b(1e30)), model::Input::Value(model::T_MAX), "beyond ~5.8e6 saturates");
    assert_eq!(model::convert(b(-1e30)), model::Input::Value(-model::T_MAX));
    assert_eq!(model::convert(b(1.0)), model::Input::Value(94548), "round(log2(e) 2^16)");
}

#[test]
fn a_looser_table_fails_the_f64_check() {
    // Planted: the exponential's ROM held to 12 fraction bits instead of 30.
    let mut t = Tables::default();
    t.exp2 = t.exp2.iter().map(|v| v >> 18 << 18).collect();
    let (x, expected) = rows(8, 1000, "normal", 5);
    let e = compare(&as_f64(&model::softmax_rows(&t, &x, 1000, 4)), &expected, tolerance(1000), "cpu-f64");
    assert!(!e.passed() && e.max_rel > 1e-4, "{e:?}");
}

#[test]
fn the_cycle_formula_counts_passes_reduction_and_drain() {
    // 4 rows of 5 on 4 lanes: 2 beats a pass, 4 + 2 reduction cycles, 2 to drain.
    assert_eq!(analytic_cycles(5, 4, 4), 4 * (2 * 2 + 6) + 2);
    assert_eq!(analytic_cycles(1, 1, 1), 2 + 4 + 2);
    assert_eq!(analytic_cycles(4097, 1, 16), 2 * 257 + 8 + 2);
}

#[test]
fn a_missing_verilator_is_named_with_its_package() {
    let err = sim::version_of("/nonexistent/verilator").unwrap_err().to_string();
    assert!(err.contains("install the `verilator` package"), "{err}");
}

#[test]
fn the_design_matches_the_model_bit_for_bit_and_the_cycle_formula_exactly() {
    let t = Tables::default();
    for lanes in [1, 4] {
        let sim = Simulator::build(lanes).unwrap();
        for (r, n, fill) in [(3, 1, "normal"), (5, 17, "normal"), (2, 1000, "normal"), (10, 33, "hostile"), (1, 4097, "normal")] {
            let (x, expected) = rows(r, n, fill, 3);
            let out = sim.run(&x, n).unwrap();
            let outcome = Outcome::judge(&out, &model::softmax_rows(&t, &x, n, lanes), &expected, n, r, lanes);
            assert!(outcome.passed(), "{r} x {n} {fill}, {lanes} lanes: {}", outcome.summary());
            assert_eq!(out.cycles, analytic_cycles(n, r, lanes), "{r} x {n}, {lanes} lanes");
        }
    }
}

#[test]
fn one_flipped_output_bit_fails_the_bit_exact_check_only() {
    let (x, expected) = rows(4, 100, "normal", 9);
    let y = model::softmax_rows(&Tables::default(), &x, 100, 4);
    let mut flipped = y.clone();
    flipped[137] ^= 1;
    let out = SimOutput { y: flipped, cycles: analytic_cycles(100, 4, 4) };
    let o = Outcome::judge(&out, &y, &expected, 100, 4, 4);
    assert!(!o.bit_exact.passed() && o.bit_exact.worst_index == Some(137), "{}", o.summary());
    // The f64 check alone would have let it through: one ulp is within its tolerance.
    assert!(o.f64.passed() && o.cycles.passed());
    assert!(!o.passed() && !o.verdict().passed());
}

#[test]
fn a_wrong_rom_entry_in_the_design_fails_the_bit_exact_check() {
    // Planted in the design: one entry of the exponential's ROM 2^-22 high (2^(1/256) in Q1.30).
    let sources = with_source("exp2_lut.mem", |t| t.replacen("402c6be9", "402c6ce9", 1));
    let sim = build_from(&sources, 4);
    let (x, expected) = rows(4, 1000, "normal", 4);
    let out = sim.run(&x, 1000).unwrap();
    let o = Outcome::judge(&out, &model::softmax_rows(&Tables::default(), &x, 1000, 4), &expected, 1000, 4, 4);
    assert!(!o.bit_exact.passed() && o.cycles.passed(), "{}", o.summary());
}

#[test]
fn an_extra_reduction_cycle_fails_the_cycle_check() {
    // Planted in the design: the reduction holds in_ready low one cycle longer.
    let sources = with_source("softmax.sv", |t| t.replacen("RED_LAST = 3 + LOG2L", "RED_LAST = 4 + LOG2L", 1));
    assert_ne!(sources[0].1, SOURCES[0].1, "the fault was planted");
    let sim = build_from(&sources, 4);
    let (x, expected) = rows(16, 17, "normal", 6);
    let out = sim.run(&x, 17).unwrap();
    let o = Outcome::judge(&out, &model::softmax_rows(&Tables::default(), &x, 17, 4), &expected, 17, 16, 4);
    // Outputs still right; 16 rows x 1 cycle over 16 x 16 + 2.
    assert!(o.bit_exact.passed() && o.f64.passed(), "{}", o.summary());
    assert!(!o.cycles.passed() && !o.passed(), "{}", o.summary());
}

#[test]
fn bad_lanes_and_shapes_are_named() {
    let err = Simulator::build(3).err().unwrap().to_string();
    assert!(err.contains("lanes must be a power of two, not 3"), "{err}");
    let sim = Simulator { dir: "/nonexistent".into(), lanes: 4 };
    let err = sim.run(&[1, 2, 3], 2).err().unwrap().to_string();
    assert!(err.contains("3 values do not make rows of 2"), "{err}");
}
