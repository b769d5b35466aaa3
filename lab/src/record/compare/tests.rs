use super::*;
use crate::profile::Throughput;
use serde_json::json;
use std::path::Path;

/// `n` repetitions around `center`, each within ±3% (one run's jitter).
fn noisy(center: f64, n: usize, seed: u64) -> Vec<f64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| center * (1.0 + rng.random_range(-0.03..0.03))).collect()
}

/// Where committed runs are kept: the records, and the runs made to measure `lab compare` itself.
const FOLDERS: [&str; 2] = ["../reports/records", "../reports/same-commit-runs"];

fn committed(run: &str) -> Vec<Record> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = FOLDERS.iter().map(|f| root.join(format!("{f}/{run}.jsonl.gz"))).find(|p| p.is_file()).unwrap_or_else(|| panic!("no run {run}"));
    let (records, damage) = crate::record::read_records(&path).unwrap();
    assert!(damage.is_empty() && !records.is_empty(), "{}", path.display());
    records
}

#[test]
fn same_distribution_is_no_detectable_change() {
    let (r, lo, hi) = bootstrap_ratio(&noisy(1.0, 50, 1), &noisy(1.0, 50, 2), 2000);
    assert!(lo <= r && r <= hi && lo < 1.0 + 0.02 && hi > 1.0 - 0.02, "{lo} {r} {hi}");
    assert_eq!(classify(lo, hi, 0.02), Change::NoDetectableChange);
}

#[test]
fn a_twenty_percent_shift_is_detected_both_ways() {
    let (a, b) = (noisy(1.0, 50, 3), noisy(1.2, 50, 4));
    let (r, lo, hi) = bootstrap_ratio(&a, &b, 2000);
    assert!((r - 1.2).abs() < 0.03 && lo > 1.1, "{lo} {r} {hi}");
    assert_eq!(classify(lo, hi, 0.02), Change::Slower);
    let (_, lo, hi) = bootstrap_ratio(&b, &a, 2000);
    assert_eq!(classify(lo, hi, 0.02), Change::Faster);
}

#[test]
fn a_shift_inside_the_threshold_is_not_reported() {
    let (_, lo, hi) = bootstrap_ratio(&noisy(1.0, 50, 5), &noisy(1.01, 50, 6), 2000);
    assert_eq!(classify(lo, hi, 0.05), Change::NoDetectableChange);
}

#[test]
fn the_relative_interval_holds_the_ratio_of_ratios() {
    let (a, b, ra, rb) = (noisy(2.0, 50, 7), noisy(2.2, 50, 8), noisy(1.0, 50, 9), noisy(1.1, 50, 10));
    let i = bootstrap_relative(&a, &b, &ra, &rb, 2000);
    assert!(i.lo <= i.ratio && i.ratio <= i.hi && (i.ratio - 1.0).abs() < 0.02, "{i:?}");
    assert!(i.hi - i.lo > 0.0 && i.hi - i.lo < 0.04, "{i:?}");
}

#[test]
fn the_robust_spread_is_a_standard_deviation_that_outliers_do_not_move() {
    // 1.4826 x MAD: for -1, 0, 1 the MAD is 1.
    assert!((robust_spread(&[-1.0, 0.0, 1.0]) - 1.482_6).abs() < 1e-4);
    assert!((robust_spread(&[-1.0, 0.0, 1.0, 0.5, -0.5, 40.0, -40.0]) - robust_spread(&[-1.0, 0.0, 1.0, 0.5, -0.5, 1.0, -1.0])).abs() < 1e-12);
}

/// What each synthetic figure is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Ceiling,
    Lab,
    Peer,
    /// A lab figure with no peer and no ceiling (an all-reduce).
    Alone,
}

/// A run of synthetic figures: four tensor ceilings, then `shapes` GEMM shapes each with a lab
/// kernel and its cuBLAS peer, then an all-reduce with neither. Figure `i`'s times are
/// `noisy(center x scale(i, kind))`: `scale` puts the run's drift, a figure's own noise between
/// runs, or a slowdown into them.
fn synthetic(shapes: usize, scale: impl Fn(usize, Kind) -> f64, n: usize, seed: u64) -> Vec<Record> {
    let template = committed("2026-11-23T09-18-58Z-h100-da9f0a2").swap_remove(0);
    let mut figures: Vec<(&str, &str, &str, serde_json::Value, Kind, f64)> = Vec::new();
    for (i, what) in [256, 2048, 4096, 8192].into_iter().enumerate() {
        figures.push(("ceilings", "gemm", "cublas", json!({"what": "tensor", "n": what}), Kind::Ceiling, 0.2 + i as f64));
    }
    for s in 0..shapes {
        let m = 64 << (s % 8);
        let params = json!({"m": m, "n": 4096 + s, "k": 4096});
        figures.push(("gemm", "mma_warp64_tma", "lab", params.clone(), Kind::Lab, 0.05 * (s + 1) as f64));
        figures.push(("gemm", "cublas_gemm_ex", "cublas", params, Kind::Peer, 0.04 * (s + 1) as f64));
    }
    figures.push(("allreduce", "ring", "lab", json!({"len": 1024}), Kind::Alone, 0.5));
    figures
        .into_iter()
        .enumerate()
        .map(|(i, (experiment, variant, provider, params, kind, center))| {
            let mut r = template.clone();
            (r.experiment, r.variant, r.provider, r.params) = (experiment.into(), variant.into(), provider.into(), params);
            r.extra.clear();
            r.ceiling = None;
            if kind == Kind::Ceiling {
                r.extra.insert("ceiling_name".into(), json!("tensor_f16_tflop_s"));
                r.throughput = Some(Throughput { gb_s: 0.0, tflop_s: 700.0 });
            } else if experiment == "gemm" {
                r.ceiling = Some("tensor_f16_tflop_s".into());
            }
            r.timing.as_mut().unwrap().raw_ms = noisy(center * scale(i, kind), n, seed * 1000 + i as u64);
            r
        })
        .collect()
}

/// A figure's own move between runs: uniform in ±`size`, independent of every other figure's.
fn own_noise(size: f64, seed: u64) -> impl Fn(usize, Kind) -> f64 {
    move |i, _| {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 7919 + i as u64);
        1.0 + rng.random_range(-size..size)
    }
}

fn flagged(cmp: &Comparisons, view: View) -> Vec<String> {
    cmp.rows.iter().filter(|c| c.verdict(view).flagged()).map(|c| format!("{} {} {} {:?}", c.variant, c.provider, c.params, c.verdict(view))).collect()
}

#[test]
fn a_uniform_slowdown_of_every_provider_is_no_detectable_change() {
    let cmp = compare_runs(&synthetic(12, |_, _| 1.0, 50, 1), &synthetic(12, |_, _| 1.1, 50, 2), 0.02, false).unwrap();
    assert_eq!(cmp.rows.len(), 4 + 24 + 1);
    let d = cmp.between.drift.unwrap();
    assert_eq!((d.from, d.figures), (DriftFrom::Yardsticks, 16));
    assert!((d.median - 1.1).abs() < 0.01 && (d.fastest - 1.1).abs() < 0.01, "{d:?}");
    assert!(cmp.rows.iter().all(|c| c.change == Change::NoDetectableChange), "{:?}", flagged(&cmp, View::Noise));
    // The drift is there to see: every figure, yardsticks included, is slower absolutely.
    assert!(cmp.rows.iter().all(|c| c.absolute == Change::Slower));
    let lab = cmp.rows.iter().find(|c| c.provider == "lab" && c.experiment == "gemm").unwrap();
    assert_eq!(lab.basis, Basis::Peer);
    assert!((lab.net.unwrap().median.ratio - 1.0).abs() < 0.03 && (lab.net.unwrap().fastest - 1.0).abs() < 0.03, "{lab:?}");
    let text = render(&cmp, View::Noise);
    assert!(text.contains("drift +10.0% in median") && text.contains("the median change of the 16 yardsticks (peers and ceilings)"), "{text}");
    assert!(text.contains("net of drift (beyond ±2.0%, the default) [verdict column]: 0 slower, 0 faster"), "{text}");
    assert!(text.contains("absolute (--absolute; interval beyond ±2.0%, yardsticks judged too): 29 slower, 0 faster"), "{text}");
    assert!(text.contains("1 figure(s) with no peer and no ceiling in both runs"), "{text}");
}

#[test]
fn a_slowdown_of_the_lab_kernels_alone_is_slower() {
    // Every lab kernel, half the figures: the noise comes from the yardsticks, which it cannot widen.
    let cmp = compare_runs(&synthetic(12, |_, _| 1.0, 50, 3), &synthetic(12, |_, k| if matches!(k, Kind::Lab | Kind::Alone) { 1.1 } else { 1.0 }, 50, 4), 0.02, false).unwrap();
    assert_eq!(cmp.between.noise.unwrap().from, DriftFrom::Yardsticks);
    for c in &cmp.rows {
        let expect = if c.provider == "lab" && c.experiment != "ceilings" { Change::Slower } else { Change::NoDetectableChange };
        assert_eq!(c.change, expect, "{c:?}");
    }
    // Its peer did not move: relative to it the kernel is slower too.
    let gemm = cmp.rows.iter().find(|c| c.basis == Basis::Peer).unwrap();
    assert!((gemm.relative.unwrap().ratio - 1.1).abs() < 0.02 && gemm.relative_change == Change::Slower, "{gemm:?}");
}

#[test]
fn figures_timed_with_l2_warm_in_one_run_and_cleared_in_the_other_are_not_compared_unforced() {
    let a = synthetic(2, |_, _| 1.0, 50, 1);
    let mut b = synthetic(2, |_, _| 1.0, 50, 2);
    b[5].timing.as_mut().unwrap().l2 = "warm".into();
    let e = compare_runs(&a, &b, 0.02, false).unwrap_err().to_string();
    assert!(e.contains("1 figure(s) were timed differently") && e.contains("gemm cublas_gemm_ex") && e.contains("vs L2 warm"), "{e}");
    assert_eq!(compare_runs(&a, &b, 0.02, true).unwrap().rows.len(), 4 + 4 + 1);
}

#[test]
fn too_few_samples_is_not_enough_samples() {
    let cmp = compare_runs(&synthetic(12, |_, _| 1.0, MIN_SAMPLES - 1, 5), &synthetic(12, |_, _| 1.5, 50, 6), 0.02, false).unwrap();
    assert_eq!(cmp.rows.len(), 29);
    for view in [View::Noise, View::Relative, View::Absolute] {
        assert!(cmp.rows.iter().all(|c| c.verdict(view) == Change::NotEnoughSamples), "{view:?}");
    }
    assert!(cmp.rows.iter().all(|c| c.relative.is_none() && c.net.is_none() && c.ratio > 1.4 && c.lo.is_nan()));
    assert_eq!((cmp.between.figures, cmp.between.drift, cmp.between.noise), (0, None, None));
    let text = render(&cmp, View::Noise);
    assert!(text.contains("29 figure(s) have fewer than 5 raw samples") && text.contains("only 0 shared figure(s)"), "{text}");
}

#[test]
fn uncorrelated_noise_between_runs_flags_nothing_and_a_ten_percent_slowdown_exactly_that_kernel() {
    // Every figure moves by its own ±1.5% between the runs, as on an H100 minutes apart.
    let a = synthetic(20, own_noise(0.015, 1), 50, 7);
    let b = synthetic(20, own_noise(0.015, 2), 50, 8);
    let cmp = compare_runs(&a, &b, 0.02, false).unwrap();
    let noise = cmp.between.noise.unwrap().spread;
    assert!(noise > 0.005 && noise < 0.02, "{:?}", cmp.between);
    assert!(flagged(&cmp, View::Noise).is_empty(), "{:?}", flagged(&cmp, View::Noise));
    // Each figure's interval from its repetitions is narrower than its move between the runs:
    // read alone, many exclude no change.
    let outside = cmp.rows.iter().filter(|c| classify(c.lo, c.hi, 0.0).flagged()).count();
    assert!(outside >= 10, "{outside}");

    let target = 4 + 2 * 7; // the lab kernel of the eighth shape
    let slowed = synthetic(20, |i, k| own_noise(0.015, 2)(i, k) * if i == target { 1.1 } else { 1.0 }, 50, 8);
    let cmp = compare_runs(&a, &slowed, 0.02, false).unwrap();
    let flags: Vec<&Comparison> = cmp.rows.iter().filter(|c| c.change.flagged()).collect();
    assert_eq!(flags.len(), 1, "{:?}", flagged(&cmp, View::Noise));
    assert_eq!((flags[0].variant.as_str(), flags[0].params["n"].as_u64(), flags[0].change), ("mma_warp64_tma", Some(4096 + 7), Change::Slower));
}

#[test]
fn a_pair_sharing_few_figures_is_judged_against_its_runs_references_and_says_so() {
    // Three figures: no estimate of drift or noise between the runs; the lab kernel is read
    // against its peer, the all-reduce (neither) absolutely.
    let keep = |run: Vec<Record>| run.into_iter().filter(|r| r.experiment != "ceilings").collect::<Vec<_>>();
    let b = synthetic(1, |_, k| match k { Kind::Lab => 1.21, Kind::Alone => 1.0, _ => 1.1 }, 50, 10);
    let cmp = compare_runs(&keep(synthetic(1, |_, _| 1.0, 50, 9)), &keep(b), 0.02, false).unwrap();
    assert_eq!((cmp.rows.len(), cmp.between.drift, cmp.between.band), (3, None, 0.02));
    let lab = cmp.rows.iter().find(|c| c.variant == "mma_warp64_tma").unwrap();
    assert_eq!((lab.change, lab.net, lab.absolute), (Change::Slower, None, Change::Slower));
    assert!((lab.relative.unwrap().ratio - 1.1).abs() < 0.03, "{lab:?}");
    let text = render(&cmp, View::Noise);
    assert!(text.contains("only 3 shared figure(s)") && text.contains("judged as the relative view judges it") && text.contains("slower (relative)"), "{text}");
    assert!(text.contains("no detectable change (absolute)"), "{text}");
}

#[test]
fn without_peers_or_ceilings_the_drift_is_every_figures_and_it_says_so() {
    let lab_only = |run: Vec<Record>| run.into_iter().filter(|r| r.provider == "lab" && r.experiment != "ceilings").collect::<Vec<_>>();
    let cmp = compare_runs(&lab_only(synthetic(12, |_, _| 1.0, 50, 11)), &lab_only(synthetic(12, |_, _| 1.05, 50, 12)), 0.02, false).unwrap();
    let d = cmp.between.drift.unwrap();
    assert_eq!((d.from, d.figures, cmp.between.noise.unwrap().from), (DriftFrom::AllFigures, 13, DriftFrom::AllFigures));
    assert!(cmp.rows.iter().all(|c| c.change == Change::NoDetectableChange && c.absolute == Change::Slower));
    let text = render(&cmp, View::Noise);
    assert!(text.contains("no peer and no ceiling was run in both") && text.contains("the median change of all 13 shared figures, lab's kernels included"), "{text}");
}

#[test]
fn a_threshold_outside_zero_to_one_is_refused() {
    let a = synthetic(1, |_, _| 1.0, 10, 7);
    for bad in [-0.1, 1.0, 2.0, f64::NAN] {
        let e = compare_runs(&a, &a, bad, false).unwrap_err().to_string();
        assert!(e.contains("threshold is a relative change from 0 up to 1"), "{e}");
    }
}

fn is_planted(r: &Record) -> bool {
    r.experiment == "gemm" && r.variant == "mma_warp64_tma" && r.params["m"] == 8192 && r.params["n"] == 8192 && r.params["k"] == 8192 && r.params["dtype"] == "f16"
}

/// B's raw samples of mma_warp64_tma at 8192^3 f16 times 1.10.
fn plant(b: &[Record]) -> Option<Vec<Record>> {
    let mut b = b.to_vec();
    let target = b.iter_mut().find(|r| is_planted(r) && r.timing.as_ref().is_some_and(|t| !t.raw_ms.is_empty()))?;
    target.timing.as_mut().unwrap().raw_ms.iter_mut().for_each(|t| *t *= 1.10);
    Some(b)
}

/// Lab's kernels flagged in a view (yardsticks are judged only in the absolute one).
fn lab_flags(cmp: &Comparisons, view: View) -> usize {
    cmp.rows.iter().filter(|c| !c.is_yardstick() && c.verdict(view).flagged()).count()
}

/// Runs of one commit on the same H100 minutes apart (`lab run gemm --variant ...`: two lab
/// kernels and cuBLAS at 20 shapes, and the tensor ceilings). Read against the drift and noise of
/// the pair, no lab kernel is flagged on these pairs where the absolute and relative views flag
/// several; a 10% slowdown planted in one kernel's raw samples is flagged in all three views
/// (reports/notes/h100-compare-relative.md counts every pair).
#[test]
fn runs_of_one_commit_flag_nothing_net_of_drift_and_a_planted_slowdown_is_found() {
    // (A, B, lab flags: net of drift, relative, absolute; planted found relative)
    let pairs = [
        ("2026-11-23T09-18-58Z-h100-da9f0a2", "2026-11-23T09-19-46Z-h100-da9f0a2", [0, 4, 3], true),
        ("2026-11-23T09-23-31Z-h100-d489c2f", "2026-11-23T09-24-19Z-h100-d489c2f", [0, 5, 2], true),
        ("2026-11-25T13-48-19Z-h100-41586a5", "2026-11-25T13-49-24Z-h100-41586a5", [0, 9, 7], false),
        ("2026-11-25T13-56-54Z-h100-4011160", "2026-11-25T13-58-59Z-h100-4011160", [0, 8, 4], false),
        ("2026-11-26T07-10-11Z-h100-d3e4f4c", "2026-11-26T07-10-58Z-h100-d3e4f4c", [0, 10, 9], true),
    ];
    for (a, b, flags, found) in pairs {
        let (a_run, b_run) = (committed(a), committed(b));
        let cmp = compare_runs(&a_run, &b_run, 0.02, false).unwrap();
        assert_eq!(cmp.rows.len(), 68, "{a} {b}");
        for c in &cmp.rows {
            let lab = c.provider == "lab" && c.experiment != "ceilings";
            assert_eq!(c.basis, if lab { Basis::Peer } else { Basis::Reference }, "{c:?}");
        }
        let d = cmp.between.drift.unwrap();
        assert_eq!((d.from, d.figures, cmp.between.figures), (DriftFrom::Yardsticks, 28, 68));
        assert_eq!([View::Noise, View::Relative, View::Absolute].map(|v| lab_flags(&cmp, v)), flags, "{a} vs {b}");

        let slowed = compare_runs(&a_run, &plant(&b_run).unwrap(), 0.02, false).unwrap();
        let find = |cmp: &Comparisons| cmp.rows.iter().find(|c| c.variant == "mma_warp64_tma" && c.params["m"] == 8192 && c.params["dtype"] == "f16").cloned().unwrap();
        let (before, after) = (find(&cmp), find(&slowed));
        // The relative change and both ends of every interval scale by exactly 1.10 (seeded resampling).
        let (rb, ra) = (before.relative.unwrap(), after.relative.unwrap());
        for (x, y) in [(rb.ratio, ra.ratio), (rb.lo, ra.lo), (rb.hi, ra.hi), (before.lo, after.lo), (before.fastest, after.fastest)] {
            assert!((y / x - 1.10).abs() < 1e-9, "{a} vs {b}: {x} -> {y}");
        }
        assert_eq!((after.change, after.absolute), (Change::Slower, Change::Slower), "{a} vs {b}: {after:?}");
        assert_eq!(after.relative_change == Change::Slower, found, "{a} vs {b}: {after:?}");
        assert_eq!(lab_flags(&slowed, View::Noise), 1, "{a} vs {b}");
    }
}

fn pct(x: f64) -> String {
    format!("{:+.1}%", 100.0 * (x - 1.0))
}

/// Every pair of committed runs of one commit (records and same-commit-runs) that `lab compare` accepts and that share a timed
/// lab kernel, with its flags per view and whether a planted 10% slowdown of mma_warp64_tma at
/// 8192^3 f16 is found: the table of reports/notes/h100-compare-relative.md.
/// `cargo test --release --lib survey -- --ignored --nocapture`
#[test]
#[ignore]
fn survey_of_same_commit_pairs() {
    let mut runs: BTreeMap<String, Vec<Record>> = BTreeMap::new();
    for folder in FOLDERS {
        let (all, _) = crate::record::read_records(&Path::new(env!("CARGO_MANIFEST_DIR")).join(folder)).unwrap();
        for r in all {
            runs.entry(r.run_id.clone()).or_default().push(r);
        }
    }
    let mut by_commit: BTreeMap<(String, bool), Vec<&String>> = BTreeMap::new();
    for (id, rs) in &runs {
        by_commit.entry((rs[0].git.commit.clone(), rs[0].git.dirty)).or_default().push(id);
    }
    println!("| pair | figures | lab kernels | absolute: all | absolute: lab | relative: lab | default: lab | band | planted (default / relative / absolute) |");
    let mut total = [0usize; 6];
    for ids in by_commit.values() {
        for (i, a) in ids.iter().enumerate() {
            for b in &ids[i + 1..] {
                let Ok(cmp) = compare_runs(&runs[*a], &runs[*b], 0.02, false) else { continue };
                let lab = cmp.rows.iter().filter(|c| !c.is_yardstick()).count();
                if lab == 0 {
                    continue;
                }
                let row = [cmp.rows.len(), lab, cmp.flagged(View::Absolute), lab_flags(&cmp, View::Absolute), lab_flags(&cmp, View::Relative), lab_flags(&cmp, View::Noise)];
                let planted = plant(&runs[*b]).and_then(|b| {
                    let slowed = compare_runs(&runs[*a], &b, 0.02, false).ok()?;
                    let c = slowed.rows.iter().find(|c| c.variant == "mma_warp64_tma" && c.params["m"] == 8192 && c.params["n"] == 8192 && c.params["dtype"] == "f16")?;
                    let s = |ch: Change| if ch == Change::Slower { "S" } else { "-" };
                    Some(format!("{} / {} / {}", s(c.change), s(c.relative_change), s(c.absolute)))
                });
                let band = match cmp.between.noise {
                    Some(_) => format!("±{:.1}%", 100.0 * cmp.between.band),
                    None => format!("({} figures: the relative view)", cmp.between.figures),
                };
                println!(
                    "| {} vs {} ({}) | {} | {} | {} | {} | {} | {} | {band} | {} |",
                    &a[5..19],
                    &b[5..19],
                    &a[a.len() - 7..],
                    row[0],
                    row[1],
                    row[2],
                    row[3],
                    row[4],
                    row[5],
                    planted.unwrap_or_default()
                );
                for (t, x) in total.iter_mut().zip(row) {
                    *t += x;
                }
                for c in cmp.rows.iter().filter(|c| !c.is_yardstick() && c.change.flagged()) {
                    match c.net {
                        Some(n) => println!("|   flagged: {} {} {}: net {} (fastest {})", c.variant, c.params, c.change.label(), pct(n.median.ratio), pct(n.fastest)),
                        None => println!("|   flagged: {} {} {}: relative {} (absolute {})", c.variant, c.params, c.change.label(), c.relative.map_or("-".into(), |r| pct(r.ratio)), pct(c.ratio)),
                    }
                }
            }
        }
    }
    println!("| all | {} | {} | {} | {} | {} | {} | | |", total[0], total[1], total[2], total[3], total[4], total[5]);
}

/// A real run written before quant's variants lost their parameters, against the same run
/// as it would be written today: every timed figure is matched under the new name.
#[test]
fn old_quant_names_match_todays_across_the_rename() {
    let old = committed("2026-11-23T02-11-08Z-h100-4ad7b7b");
    assert!(old.iter().any(|r| r.variant == "w4a16_mma_tiled_sweep4_sym_b16"));
    let new: Vec<Record> = old
        .iter()
        .cloned()
        .map(|mut r| {
            (r.variant, r.params) = crate::ops::quant::current_name(&r.experiment, &r.variant, &r.params);
            r
        })
        .collect();
    assert!(new.iter().all(|r| !r.variant.ends_with("_b16")));
    let cmp = compare_runs(&old, &new, 0.02, false).unwrap();
    let timed: std::collections::BTreeSet<_> = old
        .iter()
        .filter(|r| r.verdict == Verdict::Pass && r.timing.as_ref().is_some_and(|t| !t.raw_ms.is_empty()))
        .map(|r| (&r.experiment, &r.variant, &r.provider, r.params.to_string()))
        .collect();
    assert_eq!(cmp.rows.len(), timed.len());
    assert!(cmp.rows.iter().all(|c| c.ratio == 1.0 && c.fastest == 1.0 && c.change == Change::NoDetectableChange));
    let sweep4 = cmp.rows.iter().find(|c| c.variant == "w4a16_mma_tiled_sweep4" && c.params["batch"] == 16).unwrap();
    assert_eq!(sweep4.params["scheme"], "sym");
}
