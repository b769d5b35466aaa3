//! The roofline: every family of a device over its runs, or one family's rungs, against the
//! measured copy slope and compute ceilings.

use super::*;

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
    let highest = roofs.iter().filter(|(k, _)| k.ends_with("tflop_s")).max_by(|a, b| a.1.total_cmp(b.1)).map(|(k, v)| (k.clone(), *v));
    best.into_iter()
        .map(|(label, r)| {
            let dtype = dtype(r);
            let intensity = r.work.flops as f64 / r.work.bytes as f64;
            // The compute roof: the record's own when it is judged against one; else, for half
            // types, that dtype's tensor ceiling, for f32 the FMA rate; a record that names no
            // dtype (a whole model, a mix of kernels) gets the run's highest compute roof, so no
            // point is drawn above a roof it may legitimately use.
            let own = r.ceiling.as_ref().filter(|c| c.ends_with("tflop_s")).and_then(|c| roofs.get(c).map(|v| (c.clone(), *v)));
            let by_dtype = [format!("tensor_{dtype}_tflop_s"), "fma_tflop_s".to_string()].into_iter().find_map(|name| roofs.get(&name).map(|v| (name, *v)));
            let (ceiling, peak) = own.or(if dtype.is_empty() { highest.clone() } else { by_dtype }).unwrap_or_default();
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

/// Records of hardware designs simulated cycle by cycle: their time is modelled from cycles at
/// a stated clock, and their roof is their own ports, not the device's copy slope.
pub const DESIGN_PROVIDER: &str = "verilator";

/// The `fpga` design's best modelled figure at each lane count, with its port roof (lanes x
/// bytes an element moves per pass x clock, `extra.port_roof_gb_s` of its records).
#[derive(Clone, Debug, PartialEq)]
pub struct DesignPoint {
    pub lanes: u64,
    pub clock_mhz: f64,
    pub intensity: f64,
    pub tflop_s: f64,
    pub gb_s: f64,
    pub roof_gb_s: f64,
    pub shape: String,
    pub run_id: String,
}

impl DesignPoint {
    fn title(&self) -> String {
        format!(
            "fpga/{} lanes (Verilator, modelled at {} MHz)\n{}\n{} TFLOP/s, {} GB/s at {} flop/byte\n{:.1}% of its port roof ({} GB/s)\nrun {}",
            self.lanes,
            figure(self.clock_mhz),
            self.shape,
            figure(self.tflop_s),
            figure(self.gb_s),
            figure(self.intensity),
            100.0 * self.gb_s / self.roof_gb_s,
            figure(self.roof_gb_s),
            self.run_id
        )
    }
}

/// The passing timed records of [`DESIGN_PROVIDER`], the best of each lane count.
pub fn design_points(run: &[&Record]) -> Vec<DesignPoint> {
    let mut best: BTreeMap<u64, &Record> = BTreeMap::new();
    for r in run.iter().copied().filter(|r| r.provider == DESIGN_PROVIDER && passing_timed(r) && r.work.flops > 0 && r.work.bytes > 0) {
        let Some(lanes) = r.params.get("lanes").and_then(|v| v.as_u64()) else { continue };
        if best.get(&lanes).is_none_or(|old| old.throughput.unwrap().tflop_s < r.throughput.unwrap().tflop_s) {
            best.insert(lanes, r);
        }
    }
    best.into_iter()
        .filter_map(|(lanes, r)| {
            let tp = r.throughput.unwrap();
            Some(DesignPoint {
                lanes,
                clock_mhz: r.extra.get("clock_mhz")?.as_f64()?,
                intensity: r.work.flops as f64 / r.work.bytes as f64,
                tflop_s: tp.tflop_s,
                gb_s: tp.gb_s,
                roof_gb_s: r.extra.get("port_roof_gb_s")?.as_f64()?,
                shape: shape(&r.params),
                run_id: r.run_id.clone(),
            })
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
    // The fpga design stands beside the GPU's softmax, on its own roofs (`run` may hold its
    // records, made on another device).
    let designs = if families.contains(&"softmax") { design_points(run) } else { Vec::new() };
    let subtitle = format!(
        "{} variants of {} families, each at its best passing figure; one colour per family, one marker per dtype; hover a point for its record",
        points.len(),
        families.len()
    );
    draw_roofline(&format!("Roofline: {device}"), &subtitle, &ceilings(run), &points, &designs, false)
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
    draw_roofline(&format!("{experiment} on the roofline: {device}"), &subtitle, &ceilings(run), &points, &[], true)
}

/// `tensor_bf16_tflop_s` as its line is labelled: kind `tensor`, dtype `bf16`.
pub(super) fn ceiling_kind(name: &str) -> (String, String) {
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
fn draw_roofline(title: &str, subtitle: &str, roofs: &BTreeMap<String, f64>, points: &[RooflinePoint], designs: &[DesignPoint], family: bool) -> Option<String> {
    let bw = roofs.get("copy_gb_s")? / 1000.0;
    if points.is_empty() || bw.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
        return None;
    }
    let peaks: Vec<(&str, f64)> = roofs.iter().filter(|(k, v)| k.ends_with("tflop_s") && **v > 0.0).map(|(k, v)| (k.as_str(), *v)).collect();
    let top_peak = peaks.iter().map(|p| p.1).fold(0.0, f64::max);
    let roof_at = |x: f64| if top_peak > 0.0 { (bw * x).min(top_peak) } else { bw * x };
    let xy = points.iter().map(|p| (p.intensity, p.tflop_s)).chain(designs.iter().map(|d| (d.intensity, d.tflop_s)));
    let (i_lo, i_hi) = xy.clone().fold((f64::INFINITY, 0f64), |(lo, hi), p| (lo.min(p.0), hi.max(p.0)));
    let (t_lo, t_hi) = xy.fold((f64::INFINITY, 0f64), |(lo, hi), p| (lo.min(p.1), hi.max(p.1)));
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
    let design_at: Vec<(i32, i32)>;
    let mut taken: Vec<Bounds> = Vec::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).ok()?;
        header(&root, title, subtitle)?;
        let (_, body) = root.split_vertically(HEADER);
        let (x, y) = ((x_lo, x_hi, decades(x_lo, x_hi)), (y_lo, y_hi, decades(y_lo, y_hi)));
        let mut chart = log_log_chart(&body, x, y, ("arithmetic intensity (flop / byte)", "TFLOP/s"), tick)?;
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
        // Each design's port roof, dashed in its colour.
        let design_color = family_color("fpga");
        for d in designs {
            let bw = d.roof_gb_s / 1000.0;
            let (xa, xb) = (x_lo.max(y_lo / bw), x_hi.min(y_hi / bw));
            if xa < xb {
                chart.draw_series(DashedLineSeries::new(vec![(xa, bw * xa), (xb, bw * xb)], 6, 4, design_color.stroke_width(1))).ok()?;
            }
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
        // Each design's port roof labelled in its colour, right of its point, where it fits.
        for d in designs {
            let bw = d.roof_gb_s / 1000.0;
            let xa = x_lo.max(y_lo / bw);
            if xa >= x_hi.min(y_hi / bw) {
                continue;
            }
            let text = format!("fpga {} lanes: {} GB/s at {} MHz", d.lanes, figure(d.roof_gb_s), figure(d.clock_mhz));
            let w = text_width(&text, SMALL);
            let (x, y) = px(xa.max(d.intensity * 1.6), bw * xa.max(d.intensity * 1.6));
            let bx = Bounds { x0: x + 4, y0: y - text_height(SMALL) - 2, x1: x + 4 + w, y1: y - 2 };
            if bx.inside(&plot) && !taken.iter().any(|t| t.overlaps(&bx)) {
                root.draw(&Text::new(text, (bx.x0, bx.y1), style(SMALL, text_color(design_color), HPos::Left, VPos::Bottom))).ok()?;
                taken.push(bx);
            }
        }
        at = points.iter().map(|p| px(p.intensity, p.tflop_s)).collect();
        design_at = designs.iter().map(|d| px(d.intensity, d.tflop_s)).collect();
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
    for (d, &xy) in designs.iter().zip(&design_at) {
        overlay.group("point", Some(&d.title()), |a| Marker::Star.draw(a, xy, 6, family_color("fpga")))?;
    }
    let marks: Vec<Bounds> = at.iter().chain(&design_at).map(|&xy| Bounds::around(xy, 7)).collect();

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
            rows.push((Swatch::Marker(*m, MUTED), dtype_label(if *m == Marker::Diamond { "" } else { d }).to_string()));
        }
    }
    if !designs.is_empty() {
        rows.push((Swatch::Marker(Marker::Star, family_color("fpga")), "fpga design (modelled)".to_string()));
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

#[cfg(test)]
mod tests {
    use crate::record::{read_records, Record, Verdict};

    /// The H100 fixture runs and the committed fpga run.
    fn h100_and_fpga() -> (Vec<Record>, Vec<Record>) {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let (h100, _) = read_records(&root.join("tests/fixtures/charts")).unwrap();
        let (all, _) = read_records(&root.join("../reports/records")).unwrap();
        (h100, all.into_iter().filter(|r| r.provider == super::DESIGN_PROVIDER).collect())
    }

    #[test]
    fn the_fpga_design_stands_beside_a_softmax_under_its_own_port_roofs() {
        let (h100, fpga) = h100_and_fpga();
        let points = |svg: &str| svg.matches("class=\"point\"").count();
        let gpu: Vec<&Record> = h100.iter().collect();
        let with: Vec<&Record> = h100.iter().chain(&fpga).collect();
        let designs = super::design_points(&with);
        let lanes: Vec<(u64, f64)> = designs.iter().map(|d| (d.lanes, d.roof_gb_s)).collect();
        assert_eq!(lanes, vec![(1, 1.2), (4, 4.8), (16, 19.2)]);
        assert!(designs.iter().all(|d| d.gb_s <= d.roof_gb_s && d.gb_s > 0.5 * d.roof_gb_s), "{designs:?}");
        let (plain, beside) = (super::roofline(&gpu, "H100").unwrap(), super::roofline(&with, "H100").unwrap());
        assert_eq!(points(&beside), points(&plain) + 3);
        assert!(beside.contains("fpga 16 lanes: 19.2 GB/s at 300 MHz") && beside.contains("fpga design (modelled)"));
        // No softmax on the chart: no design beside it. A failed record: no point.
        let no_softmax: Vec<&Record> = with.iter().copied().filter(|r| r.experiment != "softmax").collect();
        assert!(!super::roofline(&no_softmax, "H100").unwrap().contains("fpga design"));
        let failed: Vec<Record> = fpga.iter().cloned().map(|mut r| (r.verdict = Verdict::Fail, r).1).collect();
        assert!(super::design_points(&failed.iter().collect::<Vec<_>>()).is_empty());
    }

    /// Every committed run's points lie under the compute roof they are drawn against (within
    /// the roofs' own run-to-run spread): a record naming no dtype (the llama engine, a mix of
    /// tensor-core GEMMs) was once drawn against the FMA roof at twice its height.
    #[test]
    fn no_committed_point_is_drawn_above_its_compute_roof() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let (all, _) = read_records(&root.join("../reports/records")).unwrap();
        let mut runs: std::collections::BTreeMap<&str, Vec<&Record>> = Default::default();
        for r in &all {
            runs.entry(r.run_id.as_str()).or_default().push(r);
        }
        let mut checked = 0;
        for (id, run) in &runs {
            for p in super::roofline_points(run).iter().filter(|p| p.bound == "compute") {
                assert!(p.tflop_s <= p.roof_tflop_s * 1.05, "{id}: {} at {:.1} TFLOP/s under a {} roof of {:.1}", p.label, p.tflop_s, p.ceiling, p.roof_tflop_s);
                checked += 1;
            }
        }
        assert!(checked > 50, "{checked} compute-bound points");
    }

    #[test]
    fn ceilings_are_named_by_kind_and_dtype() {
        assert_eq!(super::ceiling_kind("tensor_bf16_tflop_s"), ("tensor".to_string(), "bf16".to_string()));
        assert_eq!(super::ceiling_kind("mma_sync_f16_tflop_s"), ("mma.sync".to_string(), "f16".to_string()));
        assert_eq!(super::ceiling_kind("fma_tflop_s"), ("FMA".to_string(), String::new()));
        assert_eq!(super::ceiling_kind("copy_gb_s"), ("copy".to_string(), String::new()));
    }
}
