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
use plotters::coord::{combinators::WithKeyPoints, Shift};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};
use std::collections::BTreeMap;

mod bars;
mod roofline;

pub use bars::{ladder, speedups};
pub use plotters::chart::SeriesLabelPosition;
pub use roofline::{design_points, family_roofline, roofline, roofline_points, DesignPoint, RooflinePoint, DESIGN_PROVIDER};

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

/// Lab series drawn at most on a scaling chart (the fastest), and peers.
const MAX_LAB_SERIES: usize = 6;
const MAX_PEER_SERIES: usize = 2;
/// The scaling chart's lab colours: PALETTE's first five and its cyan (grey is the peers').
const SERIES: [RGBColor; 6] = [PALETTE[0], PALETTE[1], PALETTE[2], PALETTE[3], PALETTE[4], PALETTE[9]];

/// Both axes of a log-log chart: ranges with their key points.
type LogLog = Cartesian2d<WithKeyPoints<LogCoord<f64>>, WithKeyPoints<LogCoord<f64>>>;

/// A log-log chart filling `body` with the figures' grid (faint major lines only), the axes named
/// by `desc` and their key points written by `fmt`.
fn log_log_chart<'a, 'b>(
    body: &'a DrawingArea<SVGBackend<'b>, Shift>,
    x: (f64, f64, Vec<f64>),
    y: (f64, f64, Vec<f64>),
    desc: (&str, &str),
    fmt: fn(f64) -> String,
) -> Option<ChartContext<'a, SVGBackend<'b>, LogLog>> {
    let mut chart = ChartBuilder::on(body)
        .margin(10)
        .margin_right(20)
        .x_label_area_size(46)
        .y_label_area_size(70)
        .build_cartesian_2d((x.0..x.1).log_scale().with_key_points(x.2), (y.0..y.1).log_scale().with_key_points(y.2))
        .ok()?;
    chart
        .configure_mesh()
        .x_desc(desc.0)
        .y_desc(desc.1)
        .label_style(("sans-serif", TEXT))
        .axis_desc_style(("sans-serif", TEXT))
        .x_label_formatter(&|v| fmt(*v))
        .y_label_formatter(&|v| fmt(*v))
        .bold_line_style(BLACK.mix(0.12))
        .light_line_style(TRANSPARENT)
        .draw()
        .ok()?;
    Some(chart)
}

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
    let mut lab: Vec<_> = series.iter().filter(|(k, _)| !k.0).collect();
    let mut peers: Vec<_> = series.iter().filter(|(k, _)| k.0).collect();
    let n_lab = lab.len();
    lab.sort_by(|a, b| peak(b.1).total_cmp(&peak(a.1)).then(a.0.cmp(b.0)));
    peers.sort_by(|a, b| peak(b.1).total_cmp(&peak(a.1)).then(a.0.cmp(b.0)));
    lab.truncate(MAX_LAB_SERIES);
    peers.truncate(MAX_PEER_SERIES);
    let drawn: Vec<_> = lab
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
        let mut chart = log_log_chart(&body, (x0, x1, log_ticks(x0, x1)), (y0, y1, log_ticks(y0, y1)), (&axis_name, unit), big_tick)?;
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
}
