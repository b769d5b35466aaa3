//! SVG figures drawn with plotters from records, the same functions for the report and the
//! notebooks: the roofline (every family of a device, or one family's rungs), a family's ladder
//! at its headline shape, speed-ups over the fastest peer and throughput against size.
//!
//! Each fits a laptop screen (960 px wide, at most 700 tall) with text of 11 px or more. A family
//! has one colour on every chart and a dtype one marker shape; every point and bar carries its
//! record (variant, shape, figure, share of the ceiling, run) as a hover title, a `<title>` inside
//! its `<g class="point">`; a legend is a `<g class="legend">` of `<g class="legend-entry">`.

use super::draw::{
    columns, corner, decades, dtype_label, family_color, figure, fit, header, label, lighten, style, text_color, text_height, text_width, Area,
    Bounds, Legend, Marker, Overlay, Placer, Swatch, FAMILY_PALETTE, HEADER, HEIGHT, INK, MAX_HEIGHT, MUTED, PEER, SMALL, TEXT, WIDTH,
};
use super::findings::{current_variants, declared, matches};
use super::model::{headline, is_peer, rate, shape, variant_name};
use crate::record::{Record, Verdict};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};
use std::collections::BTreeMap;

pub use plotters::chart::SeriesLabelPosition;

const SIZE: (u32, u32) = (960, 560);

/// The palette every chart draws from (the notebooks' figures add lighter shades after it).
pub(super) const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

fn passing_timed(r: &Record) -> bool {
    r.verdict == Verdict::Pass && r.time_ms.is_some() && r.throughput.is_some()
}

fn median(r: &Record) -> f64 {
    r.time_ms.as_ref().map_or(f64::INFINITY, |t| t.median)
}

/// `clean L2, eager`, as the findings name a timing mode.
fn mode(r: &Record) -> String {
    r.timing.as_ref().map(|t| t.label()).unwrap_or_else(|| "-".into())
}

fn dtype(r: &Record) -> String {
    r.params.get("dtype").and_then(|d| d.as_str()).unwrap_or("").to_string()
}

/// The boxed series legend every chart carries.
fn legend<'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
    position: SeriesLabelPosition,
    font_size: u32,
) -> Option<()> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", font_size))
        .draw()
        .ok()
}

/// The run's measured ceilings by name ("copy_gb_s", "fma_tflop_s", "tensor_f16_tflop_s", ...).
pub fn ceilings(run: &[&Record]) -> BTreeMap<String, f64> {
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    for r in run.iter().filter(|r| r.experiment == "ceilings" && passing_timed(r)) {
        let Some(name) = r.extra.get("ceiling_name").and_then(|v| v.as_str()) else { continue };
        let tp = r.throughput.unwrap();
        let v = if name.ends_with("gb_s") { tp.gb_s } else { tp.tflop_s };
        let e = out.entry(name.to_string()).or_insert(0.0);
        *e = e.max(v);
    }
    out
}

/// One kernel variant on the roofline: its best passing figure, the roof above it (the copy
/// slope or its compute ceiling, whichever is lower at its intensity) and what bounds it.
#[derive(Clone, Debug, PartialEq)]
pub struct RooflinePoint {
    /// `experiment/variant dtype`.
    pub label: String,
    /// The experiment (kernel family), the variant and the dtype ("" when the record has none).
    pub family: String,
    pub variant: String,
    pub dtype: String,
    /// flop per byte moved.
    pub intensity: f64,
    pub tflop_s: f64,
    pub gb_s: f64,
    pub roof_tflop_s: f64,
    /// "memory" left of the ridge point, "compute" right of it.
    pub bound: &'static str,
    /// The ceiling that makes the roof: `copy_gb_s`, `fma_tflop_s`, `tensor_f16_tflop_s`, ...
    pub ceiling: String,
    /// The record behind the point: its parameters, its run, and its share of the ceiling its
    /// experiment judged it by (`fraction_of_ceiling` of `judged_by`).
    pub shape: String,
    pub run_id: String,
    pub judged_by: Option<String>,
    pub fraction_of_ceiling: Option<f64>,
}

impl RooflinePoint {
    /// Achieved share of the roof above the point.
    pub fn fraction_of_roof(&self) -> f64 {
        self.tflop_s / self.roof_tflop_s
    }

    /// The share a reader is shown: of the ceiling the experiment judged it by, else of the roof.
    fn share(&self) -> f64 {
        self.fraction_of_ceiling.unwrap_or_else(|| self.fraction_of_roof())
    }

    /// The hover title: what it is, where it was measured, how far from its ceiling.
    fn title(&self) -> String {
        let share = match (self.fraction_of_ceiling, &self.judged_by) {
            (Some(f), Some(c)) => format!("{:.1}% of {c}", 100.0 * f),
            _ => format!("{:.1}% of the roof at its intensity ({})", 100.0 * self.fraction_of_roof(), self.ceiling),
        };
        format!(
            "{}/{} {}\n{}\n{} TFLOP/s, {} GB/s at {} flop/byte\n{share}\nrun {}",
            self.family,
            self.variant,
            dtype_label(&self.dtype),
            self.shape,
            figure(self.tflop_s),
            figure(self.gb_s),
            figure(self.intensity),
            self.run_id
        )
    }
}

/// The best figure of every lab variant (not the ceilings, not the peers) that does work and is
/// judged against a ceiling (GPU kernels, not the CPU collectives), placed under the run's copy
/// slope and its dtype's compute ceiling, in label order. Empty without a copy ceiling.
pub fn roofline_points(run: &[&Record]) -> Vec<RooflinePoint> {
    let roofs = ceilings(run);
    let Some(&bw) = roofs.get("copy_gb_s") else { return Vec::new() };
    let mut best: BTreeMap<String, &Record> = BTreeMap::new();
    for r in run.iter().copied().filter(|r| r.provider == "lab" && r.experiment != "ceilings" && r.ceiling.is_some() && passing_timed(r)) {
        if r.work.flops == 0 || r.work.bytes == 0 {
            continue;
        }
        let label = format!("{}/{} {}", r.experiment, variant_name(r), dtype(r)).trim().to_string();
        let tflops = r.throughput.unwrap().tflop_s;
        if best.get(&label).is_none_or(|old| old.throughput.unwrap().tflop_s < tflops) {
            best.insert(label, r);
        }
    }
    best.into_iter()
        .map(|(label, r)| {
            let dtype = dtype(r);
            let intensity = r.work.flops as f64 / r.work.bytes as f64;
            // Half types may run on tensor cores: their roof is that dtype's tensor ceiling; f32
            // and the rest have the FMA rate.
            let (ceiling, peak) = [format!("tensor_{dtype}_tflop_s"), "fma_tflop_s".to_string()]
                .into_iter()
                .find_map(|name| roofs.get(&name).map(|v| (name, *v)))
                .unwrap_or_default();
            let slope = bw / 1000.0 * intensity;
            let memory = peak == 0.0 || slope < peak;
            let tp = r.throughput.unwrap();
            RooflinePoint {
                label,
                family: r.experiment.clone(),
                variant: variant_name(r),
                dtype,
                intensity,
                tflop_s: tp.tflop_s,
                gb_s: tp.gb_s,
                roof_tflop_s: if memory { slope } else { peak },
                bound: if memory { "memory" } else { "compute" },
                ceiling: if memory { "copy_gb_s".to_string() } else { ceiling },
                shape: shape(&r.params),
                run_id: r.run_id.clone(),
                judged_by: r.ceiling.clone(),
                fraction_of_ceiling: r.fraction_of_ceiling,
            }
        })
        .collect()
}

/// Roofline on log-log axes: the measured ceilings, each labelled on its line, and the best
/// point of every lab variant at its arithmetic intensity, one colour per family and one marker
/// per dtype; the best point of each family is labelled. None when the run has no copy ceiling
/// or no point.
pub fn roofline(run: &[&Record], device: &str) -> Option<String> {
    let points = roofline_points(run);
    let mut families: Vec<&str> = points.iter().map(|p| p.family.as_str()).collect();
    families.sort();
    families.dedup();
    let subtitle = format!(
        "{} variants of {} families, each at its best passing figure; one colour per family, one marker per dtype; hover a point for its record",
        points.len(),
        families.len()
    );
    draw_roofline(&format!("Roofline: {device}"), &subtitle, &ceilings(run), &points, false)
}

/// One family's rungs on the roofline, each labelled, the axes around them. None when the
/// family has no point.
pub fn family_roofline(run: &[&Record], device: &str, experiment: &str) -> Option<String> {
    let points: Vec<RooflinePoint> = roofline_points(run).into_iter().filter(|p| p.family == experiment).collect();
    let subtitle = format!("each rung (variant, dtype) at its best passing figure over {} runs; hover a point for its record", {
        let mut runs: Vec<&str> = run.iter().filter(|r| r.experiment == experiment).map(|r| r.run_id.as_str()).collect();
        runs.sort();
        runs.dedup();
        runs.len()
    });
    draw_roofline(&format!("{experiment} on the roofline: {device}"), &subtitle, &ceilings(run), &points, true)
}

/// `tensor_bf16_tflop_s` as its line is labelled: kind `tensor`, dtype `bf16`.
fn ceiling_kind(name: &str) -> (String, String) {
    let stem = name.trim_end_matches("_tflop_s").trim_end_matches("_gb_s");
    let (kind, dtype) = ["f16", "bf16", "f32"]
        .iter()
        .find_map(|d| stem.strip_suffix(&format!("_{d}")).map(|k| (k, *d)))
        .unwrap_or((stem, ""));
    let kind = match kind {
        "mma_sync" => "mma.sync",
        "fma" => "FMA",
        k => k,
    };
    (kind.to_string(), dtype.to_string())
}

fn floor_decade(v: f64) -> f64 {
    10f64.powf(v.log10().floor())
}

fn ceil_decade(v: f64) -> f64 {
    10f64.powf(v.log10().ceil())
}

/// The roofline itself; `family` zooms the axes on the points and labels every variant.
fn draw_roofline(title: &str, subtitle: &str, roofs: &BTreeMap<String, f64>, points: &[RooflinePoint], family: bool) -> Option<String> {
    let bw = roofs.get("copy_gb_s")? / 1000.0;
    if points.is_empty() || !(bw > 0.0) {
        return None;
    }
    let peaks: Vec<(&str, f64)> = roofs.iter().filter(|(k, v)| k.ends_with("tflop_s") && **v > 0.0).map(|(k, v)| (k.as_str(), *v)).collect();
    let top_peak = peaks.iter().map(|p| p.1).fold(0.0, f64::max);
    let roof_at = |x: f64| if top_peak > 0.0 { (bw * x).min(top_peak) } else { bw * x };
    let (i_lo, i_hi) = points.iter().fold((f64::INFINITY, 0f64), |(lo, hi), p| (lo.min(p.intensity), hi.max(p.intensity)));
    let (t_lo, t_hi) = points.iter().fold((f64::INFINITY, 0f64), |(lo, hi), p| (lo.min(p.tflop_s), hi.max(p.tflop_s)));
    let x_lo = floor_decade(i_lo / 2.0);
    let mut x_hi = ceil_decade(i_hi * 2.0);
    if !family {
        // The whole device: every ceiling's ridge point in view.
        x_hi = x_hi.max(ceil_decade(peaks.iter().map(|p| p.1 / bw).fold(0.0, f64::max) * 3.0));
    }
    let y_lo = floor_decade(if family { t_lo / 3.0 } else { (t_lo / 2.0).min(bw * x_lo) });
    let y_hi = roof_at(x_hi).max(t_hi) * 2.5;

    let size = (WIDTH, HEIGHT);
    let mut svg = String::new();
    let plot: Bounds;
    let at: Vec<(i32, i32)>;
    let mut taken: Vec<Bounds> = Vec::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).ok()?;
        header(&root, title, subtitle)?;
        let (_, body) = root.split_vertically(HEADER);
        let mut chart = ChartBuilder::on(&body)
            .margin(10)
            .margin_right(20)
            .x_label_area_size(46)
            .y_label_area_size(70)
            .build_cartesian_2d((x_lo..x_hi).log_scale().with_key_points(decades(x_lo, x_hi)), (y_lo..y_hi).log_scale().with_key_points(decades(y_lo, y_hi)))
            .ok()?;
        chart
            .configure_mesh()
            .x_desc("arithmetic intensity (flop / byte)")
            .y_desc("TFLOP/s")
            .label_style(("sans-serif", TEXT))
            .axis_desc_style(("sans-serif", TEXT))
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| tick(*v))
            .bold_line_style(BLACK.mix(0.12))
            .light_line_style(TRANSPARENT)
            .draw()
            .ok()?;
        plot = Bounds::of_area(chart.plotting_area());

        // The copy slope up to the highest ceiling, then each compute ceiling from its ridge.
        let line = MUTED.stroke_width(2);
        let (xa, xb) = (x_lo.max(y_lo / bw), x_hi.min(if top_peak > 0.0 { top_peak.min(y_hi) } else { y_hi } / bw));
        if xa < xb {
            chart.draw_series(LineSeries::new(vec![(xa, bw * xa), (xb, bw * xb)], line)).ok()?;
        }
        let mut kinds: BTreeMap<String, Vec<(String, f64)>> = BTreeMap::new();
        for (name, peak) in &peaks {
            if *peak <= y_lo || *peak >= y_hi || peak / bw >= x_hi {
                continue;
            }
            chart.draw_series(LineSeries::new(vec![((peak / bw).max(x_lo), *peak), (x_hi, *peak)], line)).ok()?;
            let (kind, dtype) = ceiling_kind(name);
            kinds.entry(kind).or_default().push((dtype, *peak));
        }
        let px = |x: f64, y: f64| chart.backend_coord(&(x, y));
        // Each kind labelled once above its line, left of its ridge point (where the roofline
        // is empty); at the right end, above the line or below it when the next kind up is too
        // close, where that does not fit.
        let mut rows: Vec<(String, f64, f64)> = kinds
            .iter()
            .map(|(kind, lines)| {
                let values: Vec<String> = lines.iter().map(|(d, v)| if d.is_empty() { figure(*v) } else { format!("{d} {}", figure(*v)) }).collect();
                let hi = lines.iter().map(|l| l.1).fold(0.0, f64::max);
                let lo = lines.iter().map(|l| l.1).fold(f64::INFINITY, f64::min);
                (format!("{kind}: {} TFLOP/s", values.join(", ")), hi, lo)
            })
            .collect();
        rows.sort_by(|a, b| b.1.total_cmp(&a.1));
        let h = text_height(TEXT);
        let mut placed: Vec<Bounds> = Vec::new();
        for (i, (text, hi, lo)) in rows.iter().enumerate() {
            let w = text_width(text, TEXT);
            let (top, bottom) = (px(x_hi, *hi).1, px(x_hi, *lo).1);
            let ridge = px((hi / bw).max(x_lo), *hi).0;
            // Above the line, or below it clear of the slope that meets it at the ridge.
            let above = Bounds { x0: ridge - 6 - w, y0: top - 3 - h, x1: ridge - 6, y1: top - 3 };
            let below = Bounds { x0: ridge - 30 - w, y0: bottom + 3, x1: ridge - 30, y1: bottom + 3 + h };
            let free = |b: &Bounds| b.inside(&plot) && !placed.iter().any(|p| p.overlaps(b));
            let b = if free(&above) {
                above
            } else if free(&below) {
                below
            } else {
                let above_free = i == 0 || px(x_hi, rows[i - 1].2).1 < top - h - 8;
                let y0 = if above_free { top - 3 - h } else { bottom + 4 };
                Bounds { x0: plot.x1 - 6 - w, y0, x1: plot.x1 - 6, y1: y0 + h }
            };
            root.draw(&Text::new(text.clone(), (b.x1, b.y1), style(TEXT, INK, HPos::Right, VPos::Bottom))).ok()?;
            placed.push(b);
        }
        taken.extend(placed);
        // The copy label above the slope, where it first fits.
        let text = format!("copy: {} GB/s", figure(bw * 1000.0));
        let (a, b) = (px(xa, bw * xa), px(xb, bw * xb));
        let w = text_width(&text, TEXT);
        for k in 5..19 {
            let t = k as f64 / 20.0;
            let (x, y) = ((a.0 as f64 + t * (b.0 - a.0) as f64) as i32 - 8, (a.1 as f64 + t * (b.1 - a.1) as f64) as i32 - 8);
            let bx = Bounds { x0: x - w, y0: y - h, x1: x, y1: y };
            if bx.inside(&plot) {
                root.draw(&Text::new(text.clone(), (x, y), style(TEXT, INK, HPos::Right, VPos::Bottom))).ok()?;
                taken.push(bx);
                break;
            }
        }
        at = points.iter().map(|p| px(p.intensity, p.tflop_s)).collect();
        root.present().ok()?;
    }

    let mut overlay = Overlay::new(size);
    // Points, the best of each family drawn last (on top).
    let mut order: Vec<usize> = (0..points.len()).collect();
    order.sort_by(|&a, &b| points[a].share().total_cmp(&points[b].share()).then(a.cmp(&b)));
    for &i in &order {
        let p = &points[i];
        let c = family_color(&p.family);
        overlay.group("point", Some(&p.title()), |a| Marker::of(&p.dtype).draw(a, at[i], 6, c))?;
    }
    let marks: Vec<Bounds> = at.iter().map(|&xy| Bounds::around(xy, 7)).collect();

    // The legend: families and dtypes, never variants.
    let mut families: Vec<&str> = points.iter().map(|p| p.family.as_str()).collect();
    families.sort_by_key(|f| (FAMILY_PALETTE.iter().position(|c| *c == family_color(f)), *f));
    families.dedup();
    let mut dtypes: Vec<&str> = points.iter().map(|p| p.dtype.as_str()).collect();
    dtypes.sort_by_key(|d| (Marker::of(d), *d));
    dtypes.dedup();
    let mut rows: Vec<(Swatch, String)> = Vec::new();
    if !family {
        rows.extend(families.iter().map(|f| (Swatch::Fill(family_color(f)), f.to_string())));
    }
    let shown: Vec<Marker> = dtypes.iter().map(|d| Marker::of(d)).collect();
    for (d, m) in dtypes.iter().zip(&shown) {
        // One row per marker: dtypes outside f32/f16/bf16 share the diamond.
        if !rows.iter().any(|(s, _)| matches!(s, Swatch::Marker(x, _) if x == m)) {
            rows.push((Swatch::Marker(*m, MUTED), dtype_label(if *m == Marker::Diamond { "" } else { *d }).to_string()));
        }
    }
    let per_column = if rows.len() > 8 && !family { families.len() } else { rows.len() };
    let legend = Legend { rows, per_column };
    let (w, h) = legend.size();
    let obstacles: Vec<Bounds> = marks.iter().chain(&taken).copied().collect();
    let box_ = corner(plot, w, h, &obstacles);
    legend.draw(&mut overlay, box_)?;
    taken.push(box_);

    // Labels: the best point of each family, or every rung of the one family.
    let mut best: BTreeMap<String, usize> = BTreeMap::new();
    for (i, p) in points.iter().enumerate() {
        let key = if family { p.variant.clone() } else { p.family.clone() };
        if best.get(&key).is_none_or(|&j| points[j].share() < p.share()) {
            best.insert(key, i);
        }
    }
    let mut labelled: Vec<(String, usize)> = best.into_iter().collect();
    // Highest first: they have the least room above them.
    labelled.sort_by_key(|(_, i)| at[*i].1);
    let mut placer = Placer { plot, taken };
    let size_text = if family { SMALL } else { TEXT };
    let h = text_height(size_text) + 2;
    let texts: Vec<(usize, String)> = labelled.into_iter().map(|(key, i)| (i, if family { key } else { format!("{key}: {}", points[i].variant) })).collect();
    let soft_of = |i: usize| -> Vec<Bounds> { marks.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, b)| *b).collect() };
    let mut boxes: Vec<(usize, Bounds)> = Vec::new();
    let mut crowded: Vec<(usize, (i32, i32), i32)> = Vec::new();
    for (k, (i, text)) in texts.iter().enumerate() {
        let w = text_width(text, size_text) + 6;
        match placer.near(at[*i], 6, w, h, &soft_of(*i)) {
            Some(b) => boxes.push((k, b)),
            None => crowded.push((k, at[*i], w)),
        }
    }
    if family {
        // A family's rungs crowd into clusters: columns beside them.
        boxes.extend(columns(&mut placer, &crowded, h, &marks));
    } else {
        // A few labels, one per family: the nearest free spot.
        for &(k, xy, w) in &crowded {
            if let Some((b, _)) = placer.place(xy, 6, w, h, &soft_of(texts[k].0)) {
                boxes.push((k, b));
            }
        }
    }
    boxes.sort_by_key(|b| b.0);
    for (k, b) in boxes {
        let (i, text) = &texts[k];
        let c = text_color(family_color(&points[*i].family));
        let touching = b.overlaps(&Bounds::around(at[*i], 12));
        overlay.group("label", None, |a| label(a, text, b, c, size_text, (!touching).then_some(at[*i])))?;
    }
    overlay.onto(svg)
}

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
        let suffix: Vec<String> = keys.iter().map(|k| r.params.get(k).map(super::model::param_text).unwrap_or_default()).collect();
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

/// Lab series drawn at most on a scaling chart (the fastest), and peers.
const MAX_LAB_SERIES: usize = 6;
const MAX_PEER_SERIES: usize = 2;
/// The scaling chart's lab colours: the family palette without grey and black (the peers').
const SERIES: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
];

/// Throughput against the experiment's sweep parameter (`axis`, e.g. `cols`; bytes moved when a
/// record lacks it): the fastest lab variants (by their best point) and the fastest peers on the
/// same log-log axes, peers dashed, each line with its p20-p80 band shaded and a marker per dtype.
pub fn scaling(run: &[&Record], experiment: &str, axis: &str) -> Option<String> {
    struct Pt<'r> {
        x: f64,
        y: f64,
        lo: f64,
        hi: f64,
        rec: &'r Record,
    }
    let mut series: BTreeMap<(bool, String, String), Vec<Pt>> = BTreeMap::new();
    let mut unit = "GB/s";
    let mut axis_name = axis.to_string();
    for r in run.iter().copied().filter(|r| r.experiment == experiment && passing_timed(r) && r.work.bytes > 0) {
        let Some((y, u)) = headline(r) else { continue };
        unit = u;
        let x = match r.params.get(axis).and_then(|x| x.as_f64()) {
            Some(x) => x,
            None => {
                axis_name = "bytes moved per call".into();
                r.work.bytes as f64
            }
        };
        let t = r.time_ms.as_ref().expect("timed");
        let name = if is_peer(r) { format!("{} ({})", r.variant, r.provider) } else { variant_name(r) };
        let (lo, hi) = (rate(r, t.p80, u), rate(r, t.p20, u));
        series.entry((is_peer(r), name, dtype(r))).or_default().push(Pt { x, y, lo, hi, rec: r });
    }
    for pts in series.values_mut() {
        // One point per size: the best there.
        pts.sort_by(|a, b| a.x.total_cmp(&b.x).then(b.y.total_cmp(&a.y)));
        pts.dedup_by(|a, b| a.x == b.x);
    }
    series.retain(|_, pts| pts.len() >= 2 && pts.iter().all(|p| p.x > 0.0 && p.lo > 0.0));
    let peak = |pts: &Vec<Pt>| pts.iter().map(|p| p.y).fold(0.0, f64::max);
    let mut lab: Vec<(&(bool, String, String), &Vec<Pt>)> = series.iter().filter(|(k, _)| !k.0).collect();
    let mut peers: Vec<(&(bool, String, String), &Vec<Pt>)> = series.iter().filter(|(k, _)| k.0).collect();
    let n_lab = lab.len();
    lab.sort_by(|a, b| peak(b.1).total_cmp(&peak(a.1)).then(a.0.cmp(b.0)));
    peers.sort_by(|a, b| peak(b.1).total_cmp(&peak(a.1)).then(a.0.cmp(b.0)));
    lab.truncate(MAX_LAB_SERIES);
    peers.truncate(MAX_PEER_SERIES);
    let drawn: Vec<(&(bool, String, String), &Vec<Pt>, RGBColor)> = lab
        .iter()
        .enumerate()
        .map(|(i, (k, v))| (*k, *v, SERIES[i % SERIES.len()]))
        .chain(peers.iter().enumerate().map(|(i, (k, v))| (*k, *v, if i == 0 { INK } else { PEER })))
        .collect();
    if drawn.is_empty() {
        return None;
    }
    let all = drawn.iter().flat_map(|d| d.1.iter());
    let (x_lo, x_hi) = all.clone().fold((f64::INFINITY, 0f64), |(lo, hi), p| (lo.min(p.x), hi.max(p.x)));
    let (y_lo, y_hi) = all.fold((f64::INFINITY, 0f64), |(lo, hi), p| (lo.min(p.lo.min(p.y)), hi.max(p.hi.max(p.y))));
    let (x0, x1, y0, y1) = (x_lo / 1.4, x_hi * 1.4, y_lo / 1.6, y_hi * 1.6);
    let dtypes: Vec<&str> = {
        let mut d: Vec<&str> = drawn.iter().map(|d| d.0 .2.as_str()).collect();
        d.sort();
        d.dedup();
        d
    };
    let run_id = &drawn[0].1[0].rec.run_id;
    let title = format!("{experiment}: {unit} against {axis_name}");
    let kept = if n_lab > lab.len() { format!("the {} fastest of {n_lab} lab series", lab.len()) } else { format!("{} lab series", lab.len()) };
    let peer = match peers.len() {
        0 => "no peer timed",
        1 => "the peer dashed",
        _ => "the fastest peers dashed",
    };
    let subtitle = format!("{kept}, {peer}; shaded: p20-p80 of the samples · run {run_id}");
    let size = (WIDTH, HEIGHT);
    let mut svg = String::new();
    let plot: Bounds;
    let mut at: Vec<Vec<(i32, i32, i32, i32)>> = Vec::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).ok()?;
        header(&root, &title, &subtitle)?;
        let (_, body) = root.split_vertically(HEADER);
        let mut chart = ChartBuilder::on(&body)
            .margin(10)
            .margin_right(20)
            .x_label_area_size(46)
            .y_label_area_size(70)
            .build_cartesian_2d((x0..x1).log_scale().with_key_points(log_ticks(x0, x1)), (y0..y1).log_scale().with_key_points(log_ticks(y0, y1)))
            .ok()?;
        chart
            .configure_mesh()
            .x_desc(axis_name.as_str())
            .y_desc(unit)
            .label_style(("sans-serif", TEXT))
            .axis_desc_style(("sans-serif", TEXT))
            .x_label_formatter(&|v| big_tick(*v))
            .y_label_formatter(&|v| big_tick(*v))
            .bold_line_style(BLACK.mix(0.12))
            .light_line_style(TRANSPARENT)
            .draw()
            .ok()?;
        plot = Bounds::of_area(chart.plotting_area());
        for (key, pts, c) in &drawn {
            let line: Vec<(f64, f64)> = pts.iter().map(|p| (p.x, p.y)).collect();
            if key.0 {
                chart.draw_series(DashedLineSeries::new(line, 8, 5, c.stroke_width(2))).ok()?;
            } else {
                chart.draw_series(LineSeries::new(line, c.stroke_width(2))).ok()?;
            }
            at.push(
                pts.iter()
                    .map(|p| {
                        let (x, y) = chart.backend_coord(&(p.x, p.y));
                        (x, y, chart.backend_coord(&(p.x, p.lo)).1, chart.backend_coord(&(p.x, p.hi)).1)
                    })
                    .collect(),
            );
        }
        root.present().ok()?;
    }
    let mut overlay = Overlay::new(size);
    for ((_, _, c), px) in drawn.iter().zip(&at) {
        let band: Vec<(i32, i32)> = px.iter().map(|p| (p.0, p.2)).chain(px.iter().rev().map(|p| (p.0, p.3))).collect();
        overlay.group("band", None, |a| a.draw(&Polygon::new(band.clone(), c.mix(0.16).filled())).ok())?;
    }
    let mut marks: Vec<Bounds> = Vec::new();
    for ((key, pts, c), px) in drawn.iter().zip(&at) {
        for (p, xy) in pts.iter().zip(px) {
            let title = format!(
                "{} {}\n{axis_name} = {}: {} {unit} (p20-p80: {}-{})\n{}\nrun {}",
                key.1,
                dtype_label(&key.2),
                big_tick(p.x),
                figure(p.y),
                figure(p.lo),
                figure(p.hi),
                shape(&p.rec.params),
                p.rec.run_id
            );
            overlay.group("point", Some(&title), |a| Marker::of(&key.2).draw(a, (xy.0, xy.1), 5, *c))?;
            marks.push(Bounds::around((xy.0, xy.1), 6));
        }
        // The segments between points are obstacles for the legend too.
        for w in px.windows(2) {
            marks.push(Bounds::around(((w[0].0 + w[1].0) / 2, (w[0].1 + w[1].1) / 2), 4));
        }
    }
    let rows: Vec<(Swatch, String)> = drawn
        .iter()
        .map(|(key, _, c)| {
            let name = if dtypes.len() > 1 { format!("{} {}", key.1, dtype_label(&key.2)) } else { key.1.clone() };
            (Swatch::Line(*c, key.0), fit(&name, TEXT, 300))
        })
        .collect();
    let legend = Legend { per_column: rows.len(), rows };
    let (w, h) = legend.size();
    legend.draw(&mut overlay, corner(plot, w, h, &marks))?;
    overlay.onto(svg)
}

/// A log-axis tick of a scaling chart: `tick`, with exponents from 100000 up (`1e6`, `2e8`).
fn big_tick(v: f64) -> String {
    if v.abs() >= 1e5 {
        let e = v.abs().log10().floor() as i32;
        let m = v / 10f64.powi(e);
        return if (m - m.round()).abs() < 1e-6 { format!("{}e{e}", m.round()) } else { format!("{m:.1}e{e}") };
    }
    tick(v)
}

/// Ticks for a log axis: the powers of ten inside it, or 1, 2 and 5 times them where that leaves
/// fewer than three.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let d = decades(lo, hi);
    if d.len() >= 3 {
        return d;
    }
    let k0 = lo.log10().floor() as i32;
    let k1 = hi.log10().ceil() as i32;
    (k0..=k1).flat_map(|k| [1.0, 2.0, 5.0].map(|m| m * 10f64.powi(k))).filter(|v| *v >= lo && *v <= hi).collect()
}

/// Named series of (x, y) points as lines on log-log axes, in name order, the legend where
/// given. None when there is no point.
pub fn lines(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &BTreeMap<String, Vec<(f64, f64)>>,
    legend_at: SeriesLabelPosition,
) -> Option<String> {
    if series.values().all(|pts| pts.is_empty()) {
        return None;
    }
    let all = series.values().flatten();
    let (x_lo, x_hi) = all.clone().fold((f64::INFINITY, 0f64), |(lo, hi), p| (lo.min(p.0), hi.max(p.0)));
    let (y_lo, y_hi) = all.fold((f64::INFINITY, 0f64), |(lo, hi), p| (lo.min(p.1), hi.max(p.1)));
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).ok()?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d((x_lo / 1.5..x_hi * 1.5).log_scale(), (y_lo / 1.5..y_hi * 1.5).log_scale())
            .ok()?;
        chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).x_label_formatter(&|v| tick(*v)).y_label_formatter(&|v| tick(*v)).draw().ok()?;
        for (i, (name, pts)) in series.iter().enumerate() {
            let c = color(i);
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)).point_size(3))
                .ok()?
                .label(name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
        }
        legend(&mut chart, legend_at, 11)?;
        root.present().ok()?;
    }
    Some(svg)
}

/// A log-axis tick as a reader writes it: 0.3, not 0.30000000000000004; 2e-5, not 0.0000.
pub(super) fn tick(v: f64) -> String {
    if v != 0.0 && v.abs() < 1e-3 {
        return format!("{v:.0e}");
    }
    let s = format!("{v:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::tick;

    #[test]
    fn ticks_print_as_written() {
        assert_eq!(tick(0.1 + 0.2), "0.3");
        assert_eq!(tick(0.6000000000000001), "0.6");
        assert_eq!(tick(4096.0), "4096");
        assert_eq!(tick(2e-5), "2e-5");
        assert_eq!(tick(0.0015), "0.0015");
        assert_eq!(super::big_tick(1e6), "1e6");
        assert_eq!(super::big_tick(2.5e8), "2.5e8");
        assert_eq!(super::big_tick(4096.0), "4096");
    }

    #[test]
    fn ceilings_are_named_by_kind_and_dtype() {
        assert_eq!(super::ceiling_kind("tensor_bf16_tflop_s"), ("tensor".to_string(), "bf16".to_string()));
        assert_eq!(super::ceiling_kind("mma_sync_f16_tflop_s"), ("mma.sync".to_string(), "f16".to_string()));
        assert_eq!(super::ceiling_kind("fma_tflop_s"), ("FMA".to_string(), String::new()));
        assert_eq!(super::ceiling_kind("copy_gb_s"), ("copy".to_string(), String::new()));
    }
}
