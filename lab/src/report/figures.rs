//! SVG figures for the notebooks, drawn with plotters from numbers a notebook has already
//! computed: lines on chosen axes (linear or log, more series than the run charts' palette),
//! and labelled horizontal bars with reference lines.

use plotters::prelude::*;
use std::collections::BTreeMap;

pub use plotters::chart::SeriesLabelPosition;

const SIZE: (u32, u32) = (960, 560);

use super::charts::{tick, PALETTE};

/// Twenty colours: the charts' ten, then ten lighter shades, so series 0 and 10 still differ.
fn color(i: usize) -> RGBColor {
    const LIGHT: [RGBColor; 10] = [
        RGBColor(174, 199, 232),
        RGBColor(255, 187, 120),
        RGBColor(152, 223, 138),
        RGBColor(255, 152, 150),
        RGBColor(197, 176, 213),
        RGBColor(196, 156, 148),
        RGBColor(247, 182, 210),
        RGBColor(199, 199, 199),
        RGBColor(219, 219, 141),
        RGBColor(158, 218, 229),
    ];
    match i % 20 {
        j if j < 10 => PALETTE[j],
        j => LIGHT[j - 10],
    }
}

/// Ticks for a log axis over `lo..hi`: 1, 2 and 5 times each power of ten inside it, or every
/// multiple 1..9 of them where that leaves fewer than four.
fn log_keys(lo: f64, hi: f64) -> Vec<f64> {
    if !(lo > 0.0 && hi > lo && hi.is_finite()) {
        return Vec::new();
    }
    let decades = (lo.log10().floor() as i32)..=(hi.log10().ceil() as i32);
    let pick = |ms: &[f64]| -> Vec<f64> {
        decades.clone().flat_map(|k| ms.iter().map(move |m| m * 10f64.powi(k))).filter(|v| *v >= lo && *v <= hi).collect()
    };
    let keys = pick(&[1.0, 2.0, 5.0]);
    if keys.len() >= 4 { keys } else { pick(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]) }
}

/// Which axes are logarithmic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Axes {
    Linear,
    LogLog,
    /// Log x, linear y.
    LogX,
}

/// A series drawn as a line through its points, or as a dashed line without markers (a model, a
/// floor, a reference) when its name is in `dashed`.
pub struct Lines<'a> {
    pub title: &'a str,
    pub x_desc: &'a str,
    pub y_desc: &'a str,
    pub series: &'a BTreeMap<String, Vec<(f64, f64)>>,
    /// Names of the series drawn dashed, without markers.
    pub dashed: &'a [&'a str],
    pub axes: Axes,
    pub legend_at: SeriesLabelPosition,
}

fn range(lo: f64, hi: f64, log: bool) -> (f64, f64) {
    if log {
        (lo / 1.5, hi * 1.5)
    } else {
        let pad = ((hi - lo) * 0.06).max(hi.abs() * 0.02).max(1e-9);
        ((lo - pad).min(if lo >= 0.0 { 0.0 } else { lo - pad }), hi + pad)
    }
}

/// Named series of (x, y) points in name order; None when there is no point.
pub fn lines(spec: &Lines) -> Option<String> {
    if spec.series.values().all(|pts| pts.is_empty()) {
        return None;
    }
    let all = spec.series.values().flatten();
    let (x_lo, x_hi) = all.clone().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| (lo.min(p.0), hi.max(p.0)));
    let (y_lo, y_hi) = all.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| (lo.min(p.1), hi.max(p.1)));
    let (log_x, log_y) = match spec.axes {
        Axes::Linear => (false, false),
        Axes::LogLog => (true, true),
        Axes::LogX => (true, false),
    };
    let (x0, x1) = range(x_lo, x_hi, log_x);
    let (y0, y1) = range(y_lo, y_hi, log_y);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).ok()?;
        let mut builder = ChartBuilder::on(&root);
        builder.caption(spec.title, ("sans-serif", 20)).margin(16).x_label_area_size(44).y_label_area_size(64);
        // One body per axis kind: plotters types the coordinates by their scale.
        macro_rules! draw {
            ($xr:expr, $yr:expr) => {{
                let mut chart = builder.build_cartesian_2d($xr, $yr).ok()?;
                chart
                    .configure_mesh()
                    .x_desc(spec.x_desc)
                    .y_desc(spec.y_desc)
                    .max_light_lines(4)
                    .x_label_formatter(&|v| tick(*v))
                    .y_label_formatter(&|v| tick(*v))
                    .draw()
                    .ok()?;
                for (i, (name, pts)) in spec.series.iter().enumerate() {
                    let c = color(i);
                    if spec.dashed.contains(&name.as_str()) {
                        chart
                            .draw_series(DashedLineSeries::new(pts.clone(), 8, 5, c.stroke_width(2)))
                            .ok()?
                            .label(name.clone())
                            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
                    } else {
                        chart
                            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)).point_size(3))
                            .ok()?
                            .label(name.clone())
                            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
                    }
                }
                chart
                    .configure_series_labels()
                    .position(spec.legend_at.clone())
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .label_font(("sans-serif", 11))
                    .draw()
                    .ok()?;
            }};
        }
        // Log axes are labelled at 1, 2 and 5 times powers of ten (plotters' own log ticks start
        // at the first power of ten inside the range and skip everything below it).
        let (xk, yk) = (if log_x { log_keys(x0, x1) } else { Vec::new() }, if log_y { log_keys(y0, y1) } else { Vec::new() });
        match (log_x, log_y) {
            (true, true) => draw!((x0..x1).log_scale().with_key_points(xk), (y0..y1).log_scale().with_key_points(yk)),
            (true, false) => draw!((x0..x1).log_scale().with_key_points(xk), y0..y1),
            (false, true) => draw!(x0..x1, (y0..y1).log_scale().with_key_points(yk)),
            (false, false) => draw!(x0..x1, y0..y1),
        }
        root.present().ok()?;
    }
    Some(svg)
}

/// One horizontal bar per row, first row on top, each bar labelled on the y axis and coloured
/// by its group; `marks` are vertical reference lines (a peer at 100%, a roof), named in the
/// legend. None without a row.
pub fn bars(title: &str, x_desc: &str, rows: &[(String, String, f64)], marks: &[(String, f64)]) -> Option<String> {
    if rows.is_empty() {
        return None;
    }
    let mut groups: Vec<&str> = Vec::new();
    for (_, g, _) in rows {
        if !groups.contains(&g.as_str()) {
            groups.push(g);
        }
    }
    let n = rows.len() as f64;
    let x_hi = rows.iter().map(|r| r.2).chain(marks.iter().map(|m| m.1)).fold(0.0, f64::max) * 1.08;
    let height = (120 + 26 * rows.len() as u32).max(SIZE.1);
    let labels: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (SIZE.0, height)).into_drawing_area();
        root.fill(&WHITE).ok()?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(230)
            .build_cartesian_2d(0f64..x_hi, -0.5f64..(n - 0.5))
            .ok()?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(rows.len() * 2 + 1)
            .y_label_formatter(&|y| {
                // Row 0 at the top.
                let i = (n - 1.0 - y).round();
                if (n - 1.0 - y - i).abs() < 1e-6 && i >= 0.0 { labels.get(i as usize).cloned().unwrap_or_default() } else { String::new() }
            })
            .y_label_style(("sans-serif", 11))
            .x_label_formatter(&|v| tick(*v))
            .x_desc(x_desc)
            .draw()
            .ok()?;
        for (gi, g) in groups.iter().enumerate() {
            let c = color(gi);
            let rects: Vec<Rectangle<(f64, f64)>> = rows
                .iter()
                .enumerate()
                .filter(|(_, r)| r.1 == *g)
                .map(|(i, r)| {
                    let y = n - 1.0 - i as f64;
                    Rectangle::new([(0.0, y - 0.35), (r.2, y + 0.35)], c.filled())
                })
                .collect();
            chart
                .draw_series(rects)
                .ok()?
                .label(g.to_string())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
        }
        for (mi, (name, x)) in marks.iter().enumerate() {
            let c = color(groups.len() + mi + 3);
            chart
                .draw_series(DashedLineSeries::new(vec![(*x, -0.5), (*x, n - 0.5)], 8, 5, c.stroke_width(2)))
                .ok()?
                .label(name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 11))
            .draw()
            .ok()?;
        root.present().ok()?;
    }
    Some(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_draw_and_are_deterministic() {
        let mut s = BTreeMap::new();
        s.insert("a".to_string(), vec![(1.0, 2.0), (2.0, 3.0)]);
        s.insert("floor".to_string(), vec![(1.0, 1.0), (2.0, 1.5)]);
        for axes in [Axes::Linear, Axes::LogLog, Axes::LogX] {
            let spec = Lines { title: "t", x_desc: "x", y_desc: "y", series: &s, dashed: &["floor"], axes, legend_at: SeriesLabelPosition::UpperLeft };
            let one = lines(&spec).unwrap();
            assert!(one.starts_with("<svg"), "{one}");
            assert_eq!(one, lines(&spec).unwrap());
        }
        let rows = vec![("r1".to_string(), "g1".to_string(), 50.0), ("r2".to_string(), "g2".to_string(), 90.0)];
        let b = bars("t", "x", &rows, &[("peer".to_string(), 100.0)]).unwrap();
        assert!(b.contains("r1") && b.contains("peer"), "{b}");
        assert!(bars("t", "x", &[], &[]).is_none());
    }

    #[test]
    fn log_ticks_are_one_two_five_and_never_for_a_range_through_zero() {
        assert_eq!(log_keys(3.3, 75.0), vec![5.0, 10.0, 20.0, 50.0]);
        assert_eq!(log_keys(1.5, 4.5), vec![2.0, 3.0, 4.0]);
        assert!(log_keys(0.0, 10.0).is_empty());
        assert!(log_keys(-1.0, 10.0).is_empty());
    }
}
