//! SVG figures drawn with plotters from one run's records: a roofline for the run's device,
//! speed-up bars against the peers, and throughput against size.

use super::model::{headline, is_peer, variant_name};
use crate::record::{Record, Verdict};
use plotters::prelude::*;
use std::collections::BTreeMap;

pub use plotters::chart::SeriesLabelPosition;

const SIZE: (u32, u32) = (960, 560);
/// Width added for a legend beside a roofline with many points.
const LEGEND_COLUMN: u32 = 340;

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
    /// flop per byte moved.
    pub intensity: f64,
    pub tflop_s: f64,
    pub roof_tflop_s: f64,
    /// "memory" left of the ridge point, "compute" right of it.
    pub bound: &'static str,
    /// The ceiling that makes the roof: `copy_gb_s`, `fma_tflop_s`, `tensor_f16_tflop_s`, ...
    pub ceiling: String,
}

impl RooflinePoint {
    /// Achieved share of the roof above the point.
    pub fn fraction_of_roof(&self) -> f64 {
        self.tflop_s / self.roof_tflop_s
    }
}

/// The best figure of every lab variant (not the ceilings, not the peers) that does work, placed
/// under the run's copy slope and its dtype's compute ceiling, in label order. Empty without a
/// copy ceiling.
pub fn roofline_points(run: &[&Record]) -> Vec<RooflinePoint> {
    let roofs = ceilings(run);
    let Some(&bw) = roofs.get("copy_gb_s") else { return Vec::new() };
    let mut best: BTreeMap<String, (f64, f64, &str)> = BTreeMap::new();
    for r in run.iter().filter(|r| r.provider == "lab" && r.experiment != "ceilings" && passing_timed(r)) {
        if r.work.flops == 0 || r.work.bytes == 0 {
            continue;
        }
        let intensity = r.work.flops as f64 / r.work.bytes as f64;
        let tflops = r.throughput.unwrap().tflop_s;
        let dtype = r.params.get("dtype").and_then(|d| d.as_str()).unwrap_or("");
        let label = format!("{}/{} {}", r.experiment, variant_name(r), dtype).trim().to_string();
        if best.get(&label).is_none_or(|(_, old, _)| *old < tflops) {
            best.insert(label, (intensity, tflops, dtype));
        }
    }
    best.into_iter()
        .map(|(label, (intensity, tflop_s, dtype))| {
            // Half types may run on tensor cores: their roof is that dtype's tensor ceiling; f32
            // and the rest have the FMA rate.
            let (ceiling, peak) = [format!("tensor_{dtype}_tflop_s"), "fma_tflop_s".to_string()]
                .into_iter()
                .find_map(|name| roofs.get(&name).map(|v| (name, *v)))
                .unwrap_or_default();
            let slope = bw / 1000.0 * intensity;
            let memory = peak == 0.0 || slope < peak;
            RooflinePoint {
                label,
                intensity,
                tflop_s,
                roof_tflop_s: if memory { slope } else { peak },
                bound: if memory { "memory" } else { "compute" },
                ceiling: if memory { "copy_gb_s".to_string() } else { ceiling },
            }
        })
        .collect()
}

/// Roofline on log-log axes: the copy slope, each compute roof, and the best point of every
/// lab variant at its arithmetic intensity. None when the run has no ceiling or no point.
pub fn roofline(run: &[&Record], device: &str) -> Option<String> {
    let roofs = ceilings(run);
    let bw = *roofs.get("copy_gb_s")?;
    let best: BTreeMap<String, (f64, f64)> = roofline_points(run).into_iter().map(|p| (p.label, (p.intensity, p.tflop_s))).collect();
    if best.is_empty() {
        return None;
    }
    let compute: Vec<(&String, f64)> = roofs.iter().filter(|(k, _)| k.ends_with("tflop_s")).map(|(k, v)| (k, *v)).collect();
    let top = compute.iter().map(|(_, v)| *v).fold(bw / 1000.0 * 1e4, f64::min).max(best.values().map(|p| p.1).fold(0.0, f64::max));
    let (x_lo, x_hi) = (1e-2, 1e4);
    let y_lo = best.values().map(|p| p.1).fold(f64::INFINITY, f64::min).min(bw / 1000.0 * x_lo) / 3.0;
    let y_hi = compute.iter().map(|(_, v)| *v).fold(top, f64::max) * 3.0;
    // Many points (a whole device's records): the legend gets a column right of the plot and
    // the figure grows to hold it.
    let entries = (best.len() + compute.len().max(1)) as u32;
    let many = entries > 28;
    let size = if many { (SIZE.0 + LEGEND_COLUMN, SIZE.1.max(60 + 17 * entries)) } else { SIZE };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).ok()?;
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("Roofline: {device}"), ("sans-serif", 22))
            .margin(16)
            .margin_right(if many { LEGEND_COLUMN + 16 } else { 16 })
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d((x_lo..x_hi).log_scale(), (y_lo..y_hi).log_scale())
            .ok()?;
        chart
            .configure_mesh()
            .x_desc("arithmetic intensity (flop / byte)")
            .y_desc("TFLOP/s")
            .draw()
            .ok()?;
        let xs: Vec<f64> = (0..=120).map(|i| x_lo * (x_hi / x_lo).powf(i as f64 / 120.0)).collect();
        for (i, (name, peak)) in compute.iter().enumerate() {
            let line: Vec<(f64, f64)> = xs.iter().map(|&x| (x, (bw / 1000.0 * x).min(*peak))).collect();
            let c = color(i + 7);
            chart
                .draw_series(LineSeries::new(line, c.stroke_width(2)))
                .ok()?
                .label(format!("{name} = {peak:.1}; copy = {bw:.0} GB/s"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
        }
        if compute.is_empty() {
            let line: Vec<(f64, f64)> = xs.iter().map(|&x| (x, bw / 1000.0 * x)).collect();
            chart
                .draw_series(LineSeries::new(line, BLACK.stroke_width(2)))
                .ok()?
                .label(format!("copy = {bw:.0} GB/s"))
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLACK.stroke_width(2)));
        }
        for (i, (label, (x, y))) in best.iter().enumerate() {
            let c = color(i);
            chart
                .draw_series(std::iter::once(Circle::new((*x, *y), 5, c.filled())))
                .ok()?
                .label(label.clone())
                .legend(move |(x, y)| Circle::new((x + 8, y), 4, c.filled()));
        }
        if many {
            // plotters sizes a legend only inside the plot: this one is drawn by hand, one row each.
            let x = (size.0 - LEGEND_COLUMN) as i32;
            let row = |i: usize| 48 + 17 * i as i32;
            let text = |s: String, i: usize| Text::new(s, (x + 22, row(i) - 7), ("sans-serif", 12));
            let roof_labels: Vec<String> = if compute.is_empty() {
                vec![format!("copy = {bw:.0} GB/s")]
            } else {
                compute.iter().map(|(name, peak)| format!("{name} = {peak:.1}; copy = {bw:.0} GB/s")).collect()
            };
            for (i, label) in roof_labels.into_iter().enumerate() {
                let c = if compute.is_empty() { BLACK } else { color(i + 7) };
                root.draw(&PathElement::new(vec![(x, row(i)), (x + 16, row(i))], c.stroke_width(2))).ok()?;
                root.draw(&text(label, i)).ok()?;
            }
            let skip = compute.len().max(1);
            for (i, label) in best.keys().enumerate() {
                root.draw(&Circle::new((x + 8, row(skip + i)), 4, color(i).filled())).ok()?;
                root.draw(&text(label.clone(), skip + i)).ok()?;
            }
        } else {
            legend(&mut chart, SeriesLabelPosition::LowerRight, 12)?;
        }
        root.present().ok()?;
    }
    Some(svg)
}

/// Values of a parameter set, in key order: `4096 f32 normal 16384`.
fn short_shape(params: &serde_json::Value) -> String {
    params
        .as_object()
        .map(|m| m.values().map(|v| v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string())).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Speed-up of every lab variant over the fastest passing peer, per parameter set, as
/// horizontal bars (long shape labels read on the y axis).
pub fn speedups(run: &[&Record], experiment: &str) -> Option<String> {
    let recs: Vec<&&Record> = run.iter().filter(|r| r.experiment == experiment && passing_timed(r)).collect();
    let mut shapes: Vec<String> = Vec::new();
    let mut bars: Vec<(usize, String, f64)> = Vec::new();
    for r in recs.iter().filter(|r| !is_peer(r)) {
        let peer = recs
            .iter()
            .filter(|p| is_peer(p) && p.params == r.params)
            .map(|p| p.time_ms.as_ref().unwrap().median)
            .fold(f64::INFINITY, f64::min);
        if !peer.is_finite() {
            continue;
        }
        let s = short_shape(&r.params);
        let idx = shapes.iter().position(|x| *x == s).unwrap_or_else(|| {
            shapes.push(s);
            shapes.len() - 1
        });
        bars.push((idx, variant_name(r), peer / r.time_ms.as_ref().unwrap().median));
    }
    if bars.is_empty() {
        return None;
    }
    let mut variants: Vec<String> = bars.iter().map(|b| b.1.clone()).collect();
    variants.sort();
    variants.dedup();
    let band = 1.0 / (variants.len() as f64 + 1.0);
    let x_hi = bars.iter().map(|b| b.2).fold(1.0, f64::max) * 1.1;
    let n = shapes.len() as f64;
    let height = (160 + 26 * shapes.len() * variants.len().min(4)) as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (SIZE.0, height.max(SIZE.1))).into_drawing_area();
        root.fill(&WHITE).ok()?;
        let labels = shapes.clone();
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("{experiment}: speed-up over the fastest peer (right of 1 is faster)"), ("sans-serif", 20))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(230)
            .build_cartesian_2d(0f64..x_hi, -0.5f64..(n - 0.5))
            .ok()?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(shapes.len().max(2) * 2 + 1)
            .y_label_formatter(&|y| {
                // Shape 0 at the top.
                let i = (n - 1.0 - y).round();
                if (n - 1.0 - y - i).abs() < 1e-6 && i >= 0.0 { labels.get(i as usize).cloned().unwrap_or_default() } else { String::new() }
            })
            .y_label_style(("sans-serif", 11))
            .x_desc("peer time / lab time")
            .draw()
            .ok()?;
        chart.draw_series(LineSeries::new(vec![(1.0, -0.5), (1.0, n - 0.5)], BLACK.stroke_width(1))).ok()?;
        for (vi, v) in variants.iter().enumerate() {
            let c = color(vi);
            let rects: Vec<Rectangle<(f64, f64)>> = bars
                .iter()
                .filter(|b| b.1 == *v)
                .map(|(i, _, s)| {
                    let y0 = (n - 1.0 - *i as f64) + 0.5 - band * (vi as f64 + 1.5);
                    Rectangle::new([(0.0, y0), (*s, y0 + band)], c.filled())
                })
                .collect();
            chart
                .draw_series(rects)
                .ok()?
                .label(v.clone())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
        }
        legend(&mut chart, SeriesLabelPosition::LowerRight, 12)?;
        root.present().ok()?;
    }
    Some(svg)
}

/// Throughput against the experiment's sweep parameter (`axis`, e.g. `cols`; bytes moved when a
/// record lacks it), one line per (variant, provider, dtype).
pub fn scaling(run: &[&Record], experiment: &str, axis: &str) -> Option<String> {
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut unit = "GB/s";
    let mut axis_name = axis;
    for r in run.iter().filter(|r| r.experiment == experiment && passing_timed(r) && r.work.bytes > 0) {
        let Some((v, u)) = headline(r) else { continue };
        unit = u;
        let x = match r.params.get(axis).and_then(|x| x.as_f64()) {
            Some(x) => x,
            None => {
                axis_name = "bytes moved per call";
                r.work.bytes as f64
            }
        };
        let dtype = r.params.get("dtype").and_then(|d| d.as_str()).unwrap_or("");
        let key = format!("{} ({}) {}", variant_name(r), r.provider, dtype).trim().to_string();
        series.entry(key).or_default().push((x, v));
    }
    series.retain(|_, pts| {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        pts.dedup_by(|a, b| a.0 == b.0);
        pts.len() >= 2
    });
    lines(&format!("{experiment}: {unit} against {axis_name}"), axis_name, unit, &series, SeriesLabelPosition::LowerRight)
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
    }
}
