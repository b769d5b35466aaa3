//! Bar charts: a family's ladder at its headline shape, and speed-ups over the fastest peer.

use super::roofline::ceiling_kind;
use super::*;

/// A family's ladder: each rung's best passing figure over all runs at one headline shape and
/// timing mode (the findings' `shape` and `mode`), in the order of the family's variant table
/// (the order records came in for a family without one), as horizontal bars; the peers of the
/// run that gave the fastest rung beside them in grey, and the rungs' measured ceiling as a
/// dashed line. None when no rung of the table was timed there.
pub fn ladder(records: &[&Record], experiment: &str, at_shape: &str, at_mode: &str) -> Option<String> {
    let here: Vec<&Record> = records
        .iter()
        .copied()
        .filter(|r| r.experiment == experiment && passing_timed(r) && headline(r).is_some() && shape(&r.params) == at_shape && mode(r) == at_mode)
        .collect();
    let mut best: BTreeMap<String, &Record> = BTreeMap::new();
    let mut seen: Vec<String> = Vec::new();
    for r in here.iter().copied().filter(|r| !is_peer(r)) {
        let name = variant_name(r);
        if !seen.contains(&name) {
            seen.push(name.clone());
        }
        if best.get(&name).is_none_or(|old| median(r) < median(old)) {
            best.insert(name, r);
        }
    }
    let order: Vec<String> = match current_variants(experiment) {
        Some(table) => table.iter().map(|s| s.to_string()).filter(|n| best.contains_key(n)).collect(),
        None => seen,
    };
    let lead = order.iter().map(|n| best[n]).min_by(|a, b| median(a).total_cmp(&median(b)))?;
    let unit = headline(lead)?.1;
    let peers_of = |run: Option<&str>| {
        let mut out: BTreeMap<String, &Record> = BTreeMap::new();
        for p in here.iter().copied().filter(|p| is_peer(p) && run.is_none_or(|id| p.run_id == id)) {
            let name = format!("{} ({})", p.variant, p.provider);
            if out.get(&name).is_none_or(|old| median(p) < median(old)) {
                out.insert(name, p);
            }
        }
        out
    };
    let mut peers = peers_of(Some(&lead.run_id));
    if peers.is_empty() {
        peers = peers_of(None);
    }
    let mut peers: Vec<(String, &Record)> = peers.into_iter().collect();
    peers.sort_by(|a, b| median(a.1).total_cmp(&median(b.1)).then(a.0.cmp(&b.0)));
    // The ceiling each rung was judged by, as measured in its run (the highest where they differ).
    let mut roofs: BTreeMap<String, f64> = BTreeMap::new();
    for r in order.iter().map(|n| best[n]) {
        if let (Some(f), Some(c)) = (r.fraction_of_ceiling, &r.ceiling) {
            if f > 0.0 {
                let v = rate(r, median(r), unit) / f;
                let e = roofs.entry(c.clone()).or_insert(0.0);
                *e = e.max(v);
            }
        }
    }
    struct Bar<'r> {
        name: String,
        rec: &'r Record,
        peer: bool,
        row: f64,
    }
    let mut bars: Vec<Bar> = order.iter().enumerate().map(|(i, n)| Bar { name: n.clone(), rec: best[n], peer: false, row: i as f64 }).collect();
    let gap = if peers.is_empty() { 0.0 } else { 0.5 };
    bars.extend(peers.iter().enumerate().map(|(j, (n, p))| Bar { name: n.clone(), rec: p, peer: true, row: order.len() as f64 + gap + j as f64 }));
    let last = bars.last()?.row;
    let x_hi = bars.iter().map(|b| rate(b.rec, median(b.rec), unit)).chain(roofs.values().copied()).fold(0.0, f64::max) * 1.16;
    let device = &lead.device.name;
    let title = format!("{experiment}: the ladder, {device}");
    let subtitle = format!("{at_shape} ({at_mode}), best of each rung over all runs");
    let names: Vec<&str> = bars.iter().map(|b| b.name.as_str()).collect();
    bar_chart(&title, &subtitle, unit, 0.0..x_hi, last, &names, |root, plot, row_px| {
        let color = family_color(experiment);
        for b in &bars {
            let c = if b.peer { PEER } else { INK };
            let y = row_px(b.row);
            root.draw(&Text::new(fit(&b.name, SMALL, LABELS - 20), (plot.x0 - 8, y), style(SMALL, c, HPos::Right, VPos::Center))).ok()?;
        }
        let references = roofs
            .iter()
            .map(|(name, v)| {
                let (kind, dtype) = ceiling_kind(name);
                (*v, format!("{kind} {dtype} ceiling: {} {unit}", figure(*v)).replace("  ", " "), MUTED)
            })
            .collect();
        let specs = bars
            .iter()
            .map(|b| {
                let t = b.rec.time_ms.as_ref().expect("timed");
                let v = rate(b.rec, t.median, unit);
                let share = match (b.rec.fraction_of_ceiling, &b.rec.ceiling) {
                    (Some(f), Some(c)) => format!("\n{:.1}% of {c}", 100.0 * f),
                    _ => String::new(),
                };
                let who = if b.peer { "peer" } else { "rung" };
                let title = format!(
                    "{} ({who})\n{} {unit} (p20-p80: {}-{}){share}\nrun {}\n{} ({})",
                    b.name,
                    figure(v),
                    figure(rate(b.rec, t.p80, unit)),
                    figure(rate(b.rec, t.p20, unit)),
                    b.rec.run_id,
                    at_shape,
                    at_mode
                );
                (b.row, v, figure(v), if b.peer { PEER } else { color }, title)
            })
            .collect();
        let mut rows = vec![(Swatch::Fill(color), format!("{experiment} rung"))];
        if !peers.is_empty() {
            rows.push((Swatch::Fill(PEER), "peer".to_string()));
        }
        if !roofs.is_empty() {
            rows.push((Swatch::Line(MUTED, false), "measured ceiling".to_string()));
        }
        Some((specs, rows, references))
    })
}

/// The widest row labels of a bar chart (longer names are cut).
const LABELS: i32 = 350;

/// A horizontal bar: row, value, its printed value, colour, hover title.
type BarSpec = (f64, f64, String, RGBColor, String);
/// A vertical reference line over the bars (a ceiling, 1.0x): x, label, colour.
type Reference = (f64, String, RGBColor);
/// What a bar chart's body returns: the bars, the legend rows and the reference lines.
type BarBody = (Vec<BarSpec>, Vec<(Swatch, String)>, Vec<Reference>);

/// Horizontal bars, row 0 at the top, each with its value at its end; `body` draws the row
/// labels (given the root, the plot box and the row mapping) and returns the bars, the legend
/// and the reference lines, drawn over the bars and labelled above the plot.
fn bar_chart(
    title: &str,
    subtitle: &str,
    x_desc: &str,
    x_range: std::ops::Range<f64>,
    last: f64,
    names: &[&str],
    body: impl FnOnce(&Area, Bounds, &dyn Fn(f64) -> i32) -> Option<BarBody>,
) -> Option<String> {
    let row_px_wanted = 24.0;
    let height = ((HEADER as f64 + 10.0 + 46.0 + 40.0 + row_px_wanted * (last + 1.2)).round() as u32).clamp(240, MAX_HEIGHT);
    let size = (WIDTH, height);
    let label_w = (names.iter().map(|n| text_width(n, SMALL)).max().unwrap_or(0) + 20).clamp(110, LABELS);
    let mut svg = String::new();
    let plot: Bounds;
    let spec: BarBody;
    let mut bar_px: Vec<(Bounds, i32)> = Vec::new();
    let ref_px: Vec<i32>;
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).ok()?;
        header(&root, title, subtitle)?;
        let (_, body_area) = root.split_vertically(HEADER);
        let mut chart = ChartBuilder::on(&body_area)
            .margin(10)
            .margin_top(10 + text_height(SMALL) + 2)
            .margin_right(24)
            .x_label_area_size(46)
            .y_label_area_size(label_w)
            .build_cartesian_2d(x_range.clone(), -(last + 0.6)..0.6)
            .ok()?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .disable_y_axis()
            .x_desc(x_desc)
            .label_style(("sans-serif", TEXT))
            .axis_desc_style(("sans-serif", TEXT))
            .x_label_formatter(&|v| tick(*v))
            .bold_line_style(BLACK.mix(0.12))
            .light_line_style(TRANSPARENT)
            .draw()
            .ok()?;
        plot = Bounds::of_area(chart.plotting_area());
        let x_px = |x: f64| chart.backend_coord(&(x, 0.0)).0;
        let row_px = |r: f64| chart.backend_coord(&(0.0, -r)).1;
        let half = ((row_px(1.0) - row_px(0.0)) as f64 * 0.36).round().clamp(3.0, 11.0) as i32;
        spec = body(&root, plot, &row_px)?;
        for (row, v, ..) in &spec.0 {
            let (x0, x1, y) = (x_px(x_range.start.max(0.0)), x_px(*v), row_px(*row));
            bar_px.push((Bounds { x0, y0: y - half, x1: x1.max(x0 + 1), y1: y + half }, y));
        }
        ref_px = spec.2.iter().map(|r| x_px(r.0)).collect();
        root.present().ok()?;
    }
    let (bars, legend_rows, references) = spec;
    let mut taken: Vec<Bounds> = Vec::new();
    let mut overlay = Overlay::new(size);
    for ((_, _, text, c, title), (b, y)) in bars.iter().zip(&bar_px) {
        let w = text_width(text, SMALL);
        let inside = b.x1 + 4 + w > plot.x1;
        let (tx, h, tc) = if inside { (b.x1 - 4, HPos::Right, WHITE) } else { (b.x1 + 4, HPos::Left, INK) };
        overlay.group("point", Some(title), |a| {
            a.draw(&Rectangle::new([(b.x0, b.y0), (b.x1, b.y1)], c.filled())).ok()?;
            a.draw(&Text::new(text.clone(), (tx, *y), style(SMALL, tc, h, VPos::Center))).ok()
        })?;
        taken.push(Bounds { x0: b.x0, y0: b.y0, x1: if inside { b.x1 } else { b.x1 + 4 + w }, y1: b.y1 });
    }
    // Reference lines over the bars, each named above the plot: right of its line, or left of
    // it where that is taken or too narrow.
    let th = text_height(SMALL);
    let mut names: Vec<Bounds> = Vec::new();
    for ((_, text, c), &x) in references.iter().zip(&ref_px) {
        let w = text_width(text, SMALL);
        let y1 = plot.y0 - 2;
        let right = Bounds { x0: x + 4, y0: y1 - th, x1: x + 4 + w, y1 };
        let left = Bounds { x0: x - 4 - w, y0: y1 - th, x1: x - 4, y1 };
        let fits = |b: &Bounds| b.x1 <= plot.x1 + 20 && b.x0 >= 0 && !names.iter().any(|n| n.overlaps(b));
        let b = if fits(&right) { right } else { left };
        names.push(b);
        overlay.group("reference", None, |a| {
            a.draw(&PathElement::new(vec![(x, plot.y0 - th - 2), (x, plot.y1)], c.stroke_width(2))).ok()?;
            a.draw(&Text::new(text.clone(), (b.x0, b.y1), style(SMALL, INK, HPos::Left, VPos::Bottom))).ok()
        })?;
        taken.push(Bounds { x0: x - 2, y0: plot.y0, x1: x + 2, y1: plot.y1 });
    }
    let legend = Legend { per_column: legend_rows.len(), rows: legend_rows };
    let (w, h) = legend.size();
    legend.draw(&mut overlay, corner(plot, w, h, &taken))?;
    overlay.onto(svg)
}

/// Bars at most: beyond it the fastest are kept.
const MAX_BARS: usize = 26;

/// Speed-up of every lab variant over the fastest passing peer of the same run on the same
/// inputs, at the experiment's first headline shape the run timed with a peer (its largest shape
/// with a peer otherwise), as bars sorted from fastest down, with the 1.0x line.
pub fn speedups(run: &[&Record], experiment: &str) -> Option<String> {
    let recs: Vec<&Record> = run.iter().copied().filter(|r| r.experiment == experiment && passing_timed(r)).collect();
    let mut pairs: Vec<(&Record, &Record)> = Vec::new();
    for r in recs.iter().copied().filter(|r| !is_peer(r)) {
        let peer = recs.iter().copied().filter(|p| is_peer(p) && p.params == r.params && mode(p) == mode(r)).min_by(|a, b| median(a).total_cmp(&median(b)));
        if let Some(p) = peer {
            pairs.push((r, p));
        }
    }
    let largest = pairs.iter().max_by_key(|(r, _)| (r.work.flops, r.work.bytes, shape(&r.params)))?.0.params.clone();
    let (at, chosen): (String, Vec<(&Record, &Record)>) = declared(experiment)
        .iter()
        .map(|s| (s.clone(), pairs.iter().copied().filter(|(r, _)| matches(&r.params, s)).collect::<Vec<_>>()))
        .find(|(_, v)| !v.is_empty())
        .unwrap_or_else(|| (shape(&largest), pairs.iter().copied().filter(|(r, _)| r.params == largest).collect()));
    // Parameters that tell the chosen sets apart (dtype, ranks, ...) name the bars with the variant.
    let mut sets: Vec<&serde_json::Value> = chosen.iter().map(|(r, _)| &r.params).collect();
    sets.sort_by_key(|p| p.to_string());
    sets.dedup();
    let keys: Vec<String> = sets
        .first()
        .and_then(|p| p.as_object())
        .map(|m| m.keys().filter(|k| sets.iter().any(|s| s.get(k.as_str()) != m.get(k.as_str()))).cloned().collect())
        .unwrap_or_default();
    let mut best: BTreeMap<String, (f64, &Record, &Record)> = BTreeMap::new();
    for (r, p) in chosen {
        let suffix: Vec<String> = keys.iter().map(|k| r.params.get(k).map(crate::report::model::param_text).unwrap_or_default()).collect();
        let name = if suffix.is_empty() { variant_name(r) } else { format!("{} · {}", variant_name(r), suffix.join(" ")) };
        let s = median(p) / median(r);
        if best.get(&name).is_none_or(|old| old.0 < s) {
            best.insert(name, (s, r, p));
        }
    }
    let mut bars: Vec<(String, (f64, &Record, &Record))> = best.into_iter().collect();
    bars.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0).then(a.0.cmp(&b.0)));
    let total = bars.len();
    bars.truncate(MAX_BARS);
    let last = bars.len() as f64 - 1.0;
    let x_hi = bars.iter().map(|b| b.1 .0).fold(1.0, f64::max) * 1.18;
    let run_id = &bars.first()?.1 .1.run_id;
    let shown = if total > bars.len() { format!(" · the {} fastest of {total}", bars.len()) } else { String::new() };
    let title = format!("{experiment}: speed-up over the fastest peer");
    let subtitle = format!("at {at} · run {run_id}{shown} · right of 1.0x the lab is faster");
    let color = family_color(experiment);
    let names: Vec<&str> = bars.iter().map(|b| b.0.as_str()).collect();
    bar_chart(&title, &subtitle, "peer time / lab time", 0.0..x_hi, last, &names, |root, plot, row_px| {
        for (i, (name, _)) in bars.iter().enumerate() {
            root.draw(&Text::new(fit(name, SMALL, LABELS - 20), (plot.x0 - 8, row_px(i as f64)), style(SMALL, INK, HPos::Right, VPos::Center))).ok()?;
        }
        let specs = bars
            .iter()
            .enumerate()
            .map(|(i, (name, (s, r, p)))| {
                let c = if *s >= 1.0 { color } else { lighten(color, 0.5) };
                let title = format!(
                    "{name}\n{s:.2}x over {} ({}): {} ms against {} ms\n{}\nrun {}",
                    p.variant,
                    p.provider,
                    figure(median(p)),
                    figure(median(r)),
                    shape(&r.params),
                    r.run_id
                );
                (i as f64, *s, format!("{s:.2}x"), c, title)
            })
            .collect();
        Some((specs, Vec::new(), vec![(1.0, "1.0x: as fast as the peer".to_string(), INK)]))
    })
}
