//! The comparison as `lab compare` and `lab rerun` print it: a row per figure with its absolute
//! change, what it was read against and its relative change; then what the references did and
//! how many figures each view flags.

use super::{Basis, Change, Comparison, Interval, View, MIN_SAMPLES};
use std::fmt::Write;

fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{:+.1}%", 100.0 * (x - 1.0))
    } else {
        "-".into()
    }
}

fn span(i: &Interval) -> String {
    if i.lo.is_finite() && i.hi.is_finite() {
        format!("{}..{}", pct(i.lo), pct(i.hi))
    } else {
        "-".into()
    }
}

/// The table and its summary. `view` picks the change the verdict is read on.
pub fn render(rows: &[Comparison], view: View, threshold: f64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<11} {:<22} {:<12} {:<54} {:>10} {:>10} {:>7} {:>15}  {:<20} {:>7} {:>8} {:>15}  verdict ({})",
        "experiment",
        "variant",
        "provider",
        "params",
        "A ms",
        "B ms",
        "change",
        "95% interval",
        "against",
        "its chg",
        "relative",
        "95% interval",
        match view {
            View::Relative => "relative",
            View::Absolute => "absolute",
        },
    );
    for c in rows {
        let (against, drift) = match (&c.reference, c.basis) {
            (Some(r), Basis::Peer) => (format!("peer {}", r.name), pct(r.drift.ratio)),
            (Some(r), _) => (r.name.clone(), pct(r.drift.ratio)),
            (None, Basis::Reference) => ("(a yardstick)".into(), "-".into()),
            (None, _) => ("-".into(), "-".into()),
        };
        let relative = c.relative.as_ref();
        let verdict = match (view, c.basis, c.change) {
            (_, _, Change::NotEnoughSamples) | (View::Absolute, _, _) => c.verdict(view).label().to_string(),
            (View::Relative, Basis::Reference, _) => "reference: its change is drift".into(),
            (View::Relative, Basis::Absolute, ch) => format!("{} (absolute)", ch.label()),
            (View::Relative, _, ch) => ch.label().into(),
        };
        let _ = writeln!(
            out,
            "{:<11} {:<22} {:<12} {:<54} {:>10.4} {:>10.4} {:>7} {:>15}  {:<20} {:>7} {:>8} {:>15}  {}",
            c.experiment,
            c.variant,
            c.provider,
            c.params.to_string(),
            c.a_ms,
            c.b_ms,
            pct(c.ratio),
            span(&Interval { ratio: c.ratio, lo: c.lo, hi: c.hi }),
            against,
            drift,
            relative.map_or("-".into(), |i| pct(i.ratio)),
            relative.map_or("-".into(), span),
            verdict,
        );
    }
    out.push('\n');
    out.push_str(&summary(rows, view, threshold));
    out
}

fn summary(rows: &[Comparison], view: View, threshold: f64) -> String {
    let mut out = String::new();
    let count = |basis| rows.iter().filter(|c| c.basis == basis).count();
    let (peer, ceiling, yardsticks, absolute) = (count(Basis::Peer), count(Basis::Ceiling), count(Basis::Reference), count(Basis::Absolute));
    // How far the yardsticks themselves moved: the machine's drift between the runs.
    let mut drift: Vec<f64> = rows.iter().filter(|c| c.basis == Basis::Reference && c.ratio.is_finite()).map(|c| c.ratio).collect();
    drift.sort_by(f64::total_cmp);
    let moved = match (drift.first(), drift.last()) {
        (Some(lo), Some(hi)) if lo == hi => format!(": {}", pct(*lo)),
        (Some(lo), Some(hi)) => format!(": {} to {}", pct(*lo), pct(*hi)),
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "{} figures: {peer} read against a peer of their run, {ceiling} against their run's ceiling, {absolute} absolute; \
         {yardsticks} yardstick(s) (peers, ceilings), whose own change is the machine's drift{moved}",
        rows.len(),
    );
    let tally = |v: View| {
        let n = |ch| rows.iter().filter(|c| c.verdict(v) == ch).count();
        format!("{} slower, {} faster", n(Change::Slower), n(Change::Faster))
    };
    let band = format!("{:.1}%", 100.0 * threshold);
    match view {
        View::Relative => {
            let _ = writeln!(
                out,
                "relative view (figure over reference, beyond ±{band}): {}; the absolute view (--absolute) flags {}",
                tally(View::Relative),
                tally(View::Absolute)
            );
        }
        View::Absolute => {
            let _ = writeln!(
                out,
                "absolute view (beyond ±{band}; it moves with the machine): {}; the relative view (the default) flags {}",
                tally(View::Absolute),
                tally(View::Relative)
            );
        }
    }
    if absolute > 0 {
        let _ = writeln!(
            out,
            "{} with no peer and no ceiling in both runs: their comparison is absolute, and the machine may have drifted between the runs",
            if absolute == rows.len() { "every figure".to_string() } else { format!("{absolute} figure(s)") },
        );
    }
    let few = rows.iter().filter(|c| c.change == Change::NotEnoughSamples).count();
    if few > 0 {
        let _ = writeln!(out, "{few} figure(s) have fewer than {MIN_SAMPLES} raw samples in a run: not enough samples to judge");
    }
    out
}
