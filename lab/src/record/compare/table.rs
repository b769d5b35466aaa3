//! The comparison as `lab compare` and `lab rerun` print it: a row per figure with its absolute
//! change (median and fastest repetition), what it was read against and its relative change, and
//! both changes with the drift between the runs divided out; then what the pair of runs says
//! about itself (drift, noise, band) and how many figures each view flags.

use super::{Basis, Between, Change, Comparisons, DriftFrom, Interval, View, MIN_FIGURES, MIN_SAMPLES, NOISE_K};
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

fn view_name(view: View) -> &'static str {
    match view {
        View::Noise => "default",
        View::Relative => "relative",
        View::Absolute => "absolute",
    }
}

/// The table and its summary. `view` picks the change the verdict is read on.
pub fn render(cmp: &Comparisons, view: View) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<11} {:<22} {:<12} {:<54} {:>10} {:>10} {:>7} {:>15} {:>7}  {:<20} {:>7} {:>8} {:>15}  {:>7} {:>15} {:>7}  verdict ({})",
        "experiment",
        "variant",
        "provider",
        "params",
        "A ms",
        "B ms",
        "change",
        "95% interval",
        "fastest",
        "against",
        "its chg",
        "relative",
        "95% interval",
        "net chg",
        "95% interval",
        "net fst",
        view_name(view),
    );
    for c in &cmp.rows {
        let (against, drift) = match (&c.reference, c.basis) {
            (Some(r), Basis::Peer) => (format!("peer {}", r.name), pct(r.drift.ratio)),
            (Some(r), _) => (r.name.clone(), pct(r.drift.ratio)),
            (None, Basis::Reference) => ("(a yardstick)".into(), "-".into()),
            (None, _) => ("-".into(), "-".into()),
        };
        let relative = c.relative.as_ref();
        let verdict = match (view, c.is_yardstick(), c.verdict(view)) {
            (_, _, Change::NotEnoughSamples) | (View::Absolute, _, _) => c.verdict(view).label().to_string(),
            (_, true, _) => "yardstick: its change is drift".into(),
            (View::Relative, _, ch) if c.basis == Basis::Absolute => format!("{} (absolute)", ch.label()),
            (View::Noise, _, ch) if c.net.is_none() => format!("{} ({})", ch.label(), if c.relative.is_some() { "relative" } else { "absolute" }),
            (_, _, ch) => ch.label().into(),
        };
        let _ = writeln!(
            out,
            "{:<11} {:<22} {:<12} {:<54} {:>10.4} {:>10.4} {:>7} {:>15} {:>7}  {:<20} {:>7} {:>8} {:>15}  {:>7} {:>15} {:>7}  {}",
            c.experiment,
            c.variant,
            c.provider,
            c.params.to_string(),
            c.a_ms,
            c.b_ms,
            pct(c.ratio),
            span(&Interval { ratio: c.ratio, lo: c.lo, hi: c.hi }),
            pct(c.fastest),
            against,
            drift,
            relative.map_or("-".into(), |i| pct(i.ratio)),
            relative.map_or("-".into(), span),
            c.net.map_or("-".into(), |n| pct(n.median.ratio)),
            c.net.map_or("-".into(), |n| span(&n.median)),
            c.net.map_or("-".into(), |n| pct(n.fastest)),
            verdict,
        );
    }
    out.push('\n');
    out.push_str(&summary(cmp, view));
    out
}

/// What the pair of runs says about itself, in words: where its drift was read, its noise and the
/// band it gives, or that there are too few figures for either.
pub fn describe(b: &Between) -> String {
    let floor = format!("{:.1}%", 100.0 * b.threshold);
    match (b.drift, b.noise) {
        (Some(d), Some(noise)) => {
            let over = match d.from {
                DriftFrom::Yardsticks => format!("the median change of the {} yardsticks (peers and ceilings)", d.figures),
                DriftFrom::AllFigures => format!(
                    "the median change of all {} shared figures, lab's kernels included (fewer than {MIN_FIGURES} peers and ceilings \
                     in both runs: a change most of lab's kernels share reads as drift)",
                    d.figures
                ),
            };
            let spread = match (noise.from, d.from) {
                (DriftFrom::Yardsticks, _) => format!("the {} yardsticks' spread of the change in median, smaller than all {} figures'", noise.figures, b.figures),
                (DriftFrom::AllFigures, DriftFrom::Yardsticks) => format!("all {} shared figures' spread of the change in median, smaller than the yardsticks'", noise.figures),
                (DriftFrom::AllFigures, DriftFrom::AllFigures) => format!("all {} shared figures' spread of the change in median", noise.figures),
            };
            format!(
                "between the runs: drift {} in median, {} in fastest repetition ({over}); noise ±{:.1}% ({spread}: 1.4826 x its median \
                 absolute deviation); band ±{:.1}% = max(threshold {floor}, {NOISE_K} x noise): a lab kernel is called faster or slower when its \
                 median's interval and its fastest repetition, drift divided out, both lie beyond it",
                pct(d.median),
                pct(d.fastest),
                100.0 * noise.spread,
                100.0 * b.band,
            )
        }
        _ => format!(
            "between the runs: only {} shared figure(s) with {MIN_SAMPLES}+ samples on each side, fewer than the {MIN_FIGURES} \
             that estimate the drift and the noise between two runs; each figure is judged as the relative view judges it \
             (against its run's peer or ceiling, else absolutely, interval beyond the threshold {floor}), which two runs of one \
             binary exceed by their own noise: a flag here is a reason to rerun, not a verdict",
            b.figures
        ),
    }
}

fn summary(cmp: &Comparisons, view: View) -> String {
    let rows = &cmp.rows;
    let mut out = String::new();
    let count = |basis| rows.iter().filter(|c| c.basis == basis).count();
    let (peer, ceiling, yardsticks, absolute) = (count(Basis::Peer), count(Basis::Ceiling), count(Basis::Reference), count(Basis::Absolute));
    // How far the yardsticks themselves moved: the machine's drift between the runs.
    let mut drift: Vec<f64> = rows.iter().filter(|c| c.is_yardstick() && c.ratio.is_finite()).map(|c| c.ratio).collect();
    drift.sort_by(f64::total_cmp);
    let moved = match (drift.first(), drift.last()) {
        (Some(lo), Some(hi)) if lo == hi => format!(": {}", pct(*lo)),
        (Some(lo), Some(hi)) => format!(": {} to {}", pct(*lo), pct(*hi)),
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "{} figures: {peer} with a peer in their run, {ceiling} with their run's ceiling, {absolute} with neither; \
         {yardsticks} yardstick(s) (peers, ceilings), whose own change is the machine's drift{moved}",
        rows.len(),
    );
    if yardsticks == 0 {
        let _ = writeln!(out, "no peer and no ceiling was run in both: nothing measures the machine apart from lab's own kernels");
    }
    let _ = writeln!(out, "{}", describe(&cmp.between));
    let tally = |v: View| {
        let n = |ch| rows.iter().filter(|c| c.verdict(v) == ch).count();
        format!("{} slower, {} faster", n(Change::Slower), n(Change::Faster))
    };
    let band = |pct: f64| format!("±{:.1}%", 100.0 * pct);
    let views = [
        (
            View::Noise,
            match cmp.between.noise {
                Some(_) => format!("net of drift (beyond {}, the default)", band(cmp.between.band)),
                None => "the default, here the relative view's".to_string(),
            },
        ),
        (View::Relative, format!("relative to the peer or ceiling of its run (interval beyond {})", band(cmp.between.threshold))),
        (View::Absolute, format!("absolute (--absolute; interval beyond {}, yardsticks judged too)", band(cmp.between.threshold))),
    ];
    let _ = writeln!(
        out,
        "flags: {}",
        views
            .iter()
            .map(|(v, what)| format!("{what}{}: {}", if *v == view { " [verdict column]" } else { "" }, tally(*v)))
            .collect::<Vec<_>>()
            .join("; ")
    );
    if absolute > 0 {
        let _ = writeln!(
            out,
            "{} with no peer and no ceiling in both runs: relative to their run they are read absolutely, and the machine may have drifted",
            if absolute == rows.len() { "every figure".to_string() } else { format!("{absolute} figure(s)") },
        );
    }
    let few = rows.iter().filter(|c| c.change == Change::NotEnoughSamples).count();
    if few > 0 {
        let _ = writeln!(out, "{few} figure(s) have fewer than {MIN_SAMPLES} raw samples in a run: not enough samples to judge");
    }
    out
}
