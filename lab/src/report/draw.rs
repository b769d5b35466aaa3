//! What the charts share below plotters' own API: the family palette and dtype markers, text of
//! a readable size, boxes that labels and legends are placed around, and the overlay that gives
//! each point its hover title.
//!
//! plotters' SVG backend writes no `<title>` and no groups. A point is therefore drawn by plotters
//! into an SVG fragment of its own (same canvas size, pixel coordinates) and the fragment's
//! elements are wrapped in `<g class="point"><title>...</title>...</g>` and added after the
//! chart's own elements: the only text the charts add to plotters' output.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::fmt::Write as _;

pub(super) type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// Every figure fits a laptop screen: at most this wide, and at most `MAX_HEIGHT` tall.
pub(super) const WIDTH: u32 = 960;
pub(super) const HEIGHT: u32 = 640;
pub(super) const MAX_HEIGHT: u32 = 700;
/// Font sizes as plotters takes them; its SVG backend writes `size / 1.24` px, so these are
/// 16, 12 and 11.3 px on the page.
pub(super) const TITLE: f64 = 20.0;
pub(super) const TEXT: f64 = 15.0;
pub(super) const SMALL: f64 = 14.0;
/// Height of the title and subtitle band above a chart.
pub(super) const HEADER: u32 = 54;

pub(super) const INK: RGBColor = RGBColor(34, 34, 34);
pub(super) const MUTED: RGBColor = RGBColor(90, 90, 90);
/// The peers' bars and lines.
pub(super) const PEER: RGBColor = RGBColor(110, 110, 110);

/// Fifteen colours that stay apart on white (Tableau's ten, indigo, black, teal, wine and gold), one
/// per kernel family in the order `family::FAMILIES` lists them, so a family has the same colour
/// on every chart.
pub(super) const FAMILY_PALETTE: [RGBColor; 15] = [
    RGBColor(31, 119, 180),  // blue
    RGBColor(255, 127, 14),  // orange
    RGBColor(188, 189, 34),  // olive
    RGBColor(23, 190, 207),  // cyan
    RGBColor(227, 119, 194), // pink
    RGBColor(140, 86, 75),   // brown
    RGBColor(127, 127, 127), // grey
    RGBColor(214, 39, 40),   // red
    RGBColor(44, 160, 44),   // green
    RGBColor(148, 103, 189), // purple
    RGBColor(57, 59, 121),   // indigo
    RGBColor(0, 0, 0),       // black
    RGBColor(0, 128, 128),   // teal
    RGBColor(150, 20, 80),   // wine
    RGBColor(204, 153, 0),   // gold
];

/// A family's colour: its place among the families with kernels and a sweep of their own (the
/// ceilings and the f64 references aside), and for the others (CPU collectives) their place in
/// the whole list.
pub(super) fn family_color(experiment: &str) -> RGBColor {
    let families = crate::family::FAMILIES;
    let named = |f: &&crate::family::Family| f.experiment.is_some_and(|e| e.name() == experiment);
    let drawn = |f: &&crate::family::Family| !f.kernels.is_empty() && f.experiment.is_some() && f.name != "ceilings";
    match families.iter().filter(drawn).position(|f| named(&f)) {
        Some(i) => FAMILY_PALETTE[i % FAMILY_PALETTE.len()],
        // The others cycle through the first twelve, the palette they were first drawn in, so
        // that a longer palette leaves their colours as they were.
        None => FAMILY_PALETTE[families.iter().position(|f| named(&f)).unwrap_or(0) % 12],
    }
}

/// A colour for text: light palette colours (olive, cyan) darkened until they read on white.
pub(super) fn text_color(c: RGBColor) -> RGBColor {
    let RGBColor(r, g, b) = c;
    let luma = 0.299 * r as f64 + 0.587 * g as f64 + 0.114 * b as f64;
    let k = if luma > 120.0 { 120.0 / luma } else { 1.0 };
    RGBColor((r as f64 * k) as u8, (g as f64 * k) as u8, (b as f64 * k) as u8)
}

/// A colour mixed towards white (`amount` of white).
pub(super) fn lighten(c: RGBColor, amount: f64) -> RGBColor {
    let m = |v: u8| (v as f64 + (255.0 - v as f64) * amount).round() as u8;
    RGBColor(m(c.0), m(c.1), m(c.2))
}

/// One marker shape per dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Marker {
    Circle,
    Triangle,
    Square,
    Diamond,
    /// A hardware design's modelled figure (not a dtype): see `charts::roofline`.
    Star,
}

impl Marker {
    pub(super) fn of(dtype: &str) -> Marker {
        match dtype {
            "f32" => Marker::Circle,
            "f16" => Marker::Triangle,
            "bf16" => Marker::Square,
            _ => Marker::Diamond,
        }
    }

    /// Filled, with a white rim so that overlapping points stay apart.
    pub(super) fn draw(self, area: &Area, (x, y): (i32, i32), r: i32, fill: RGBColor) -> Option<()> {
        let rim = WHITE.stroke_width(1);
        let outline = |pts: Vec<(i32, i32)>| -> Option<()> {
            area.draw(&Polygon::new(pts.clone(), fill.filled())).ok()?;
            let mut closed = pts.clone();
            closed.push(pts[0]);
            area.draw(&PathElement::new(closed, rim)).ok()
        };
        match self {
            Marker::Circle => {
                area.draw(&Circle::new((x, y), r, fill.filled())).ok()?;
                area.draw(&Circle::new((x, y), r, rim)).ok()
            }
            Marker::Square => outline(vec![(x - r + 1, y - r + 1), (x + r - 1, y - r + 1), (x + r - 1, y + r - 1), (x - r + 1, y + r - 1)]),
            Marker::Triangle => outline(vec![(x, y - r - 1), (x + r + 1, y + r - 1), (x - r - 1, y + r - 1)]),
            Marker::Diamond => outline(vec![(x, y - r - 1), (x + r + 1, y), (x, y + r + 1), (x - r - 1, y)]),
            Marker::Star => {
                let at = |i: i32| {
                    let (radius, angle) = (if i % 2 == 0 { r as f64 + 2.0 } else { r as f64 * 0.45 }, std::f64::consts::PI * (i as f64 / 5.0 - 0.5));
                    (x + (radius * angle.cos()).round() as i32, y + (radius * angle.sin()).round() as i32)
                };
                outline((0..10).map(at).collect())
            }
        }
    }
}

/// How the legend names a dtype (records without one: quantized weights, whole models).
pub(super) fn dtype_label(dtype: &str) -> &str {
    if dtype.is_empty() { "other" } else { dtype }
}

pub(super) fn style(size: f64, color: RGBColor, h: HPos, v: VPos) -> TextStyle<'static> {
    TextStyle { font: ("sans-serif", size).into(), color: color.to_backend_color(), pos: Pos::new(h, v) }
}

/// The width a line of text takes, estimated generously (DejaVu Sans, plotters' size).
pub(super) fn text_width(s: &str, size: f64) -> i32 {
    (s.chars().count() as f64 * size / 1.24 * 0.6).ceil() as i32
}

pub(super) fn text_height(size: f64) -> i32 {
    (size / 1.24 * 1.2).ceil() as i32
}

/// `s`, cut with an ellipsis to fit `px`.
pub(super) fn fit(s: &str, size: f64, px: i32) -> String {
    if text_width(s, size) <= px {
        return s.to_string();
    }
    let keep = ((px as f64 / (size / 1.24 * 0.6)) as usize).saturating_sub(1);
    format!("{}…", s.chars().take(keep).collect::<String>())
}

/// Title and subtitle in the band above the chart.
pub(super) fn header(root: &Area, title: &str, subtitle: &str) -> Option<()> {
    let w = root.dim_in_pixel().0 as i32 - 32;
    root.draw(&Text::new(fit(title, TITLE, w), (16, 8), style(TITLE, INK, HPos::Left, VPos::Top))).ok()?;
    if !subtitle.is_empty() {
        root.draw(&Text::new(fit(subtitle, SMALL, w), (16, 32), style(SMALL, MUTED, HPos::Left, VPos::Top))).ok()?;
    }
    Some(())
}

/// A box in pixels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Bounds {
    pub x0: i32,
    pub y0: i32,
    pub x1: i32,
    pub y1: i32,
}

impl Bounds {
    pub(super) fn around((x, y): (i32, i32), r: i32) -> Bounds {
        Bounds { x0: x - r, y0: y - r, x1: x + r, y1: y + r }
    }
    pub(super) fn overlaps(&self, o: &Bounds) -> bool {
        self.x0 < o.x1 && o.x0 < self.x1 && self.y0 < o.y1 && o.y0 < self.y1
    }
    pub(super) fn inside(&self, o: &Bounds) -> bool {
        self.x0 >= o.x0 && self.y0 >= o.y0 && self.x1 <= o.x1 && self.y1 <= o.y1
    }
    pub(super) fn of_area<DB: DrawingBackend, CT: plotters::coord::CoordTranslate>(area: &DrawingArea<DB, CT>) -> Bounds {
        let (x, y) = area.get_pixel_range();
        Bounds { x0: x.start, y0: y.start, x1: x.end, y1: y.end }
    }
}

/// Where a `w` x `h` box (a legend) inside `plot` covers the fewest `obstacles`: a corner
/// (inset 8 px; the top left first, where a roofline is empty), else any free spot on a 16 px
/// grid from the top right.
pub(super) fn corner(plot: Bounds, w: i32, h: i32, obstacles: &[Bounds]) -> Bounds {
    let (l, r) = (plot.x0 + 8, plot.x1 - 8 - w);
    let (t, b) = (plot.y0 + 8, plot.y1 - 8 - h);
    let mut spots = vec![(l, t), (r, t), (r, b), (l, b)];
    let mut y = t;
    while y <= b {
        let mut x = r;
        while x >= l {
            spots.push((x, y));
            x -= 16;
        }
        y += 16;
    }
    spots
        .into_iter()
        .map(|(x, y)| Bounds { x0: x, y0: y, x1: x + w, y1: y + h })
        .min_by_key(|c| obstacles.iter().filter(|o| o.overlaps(c)).count())
        .expect("four corners")
}

/// Places text labels next to their points without covering each other, the legend or the
/// ceilings' labels: beside or above the point, else in columns left and right of it, as near
/// its height as is free (drawn with a leader line). Labels placed from the top down keep their
/// leader lines from crossing.
pub(super) struct Placer {
    pub plot: Bounds,
    pub taken: Vec<Bounds>,
}

impl Placer {
    /// The box for a `w` x `h` label of the point at `at` (radius `r`), and whether it sits away
    /// from the point; None when no spot is free. `soft` (the other points) is avoided where
    /// it can be.
    pub(super) fn place(&mut self, at: (i32, i32), r: i32, w: i32, h: i32, soft: &[Bounds]) -> Option<(Bounds, bool)> {
        let (x, y) = at;
        let g = r + 4;
        let mut spots: Vec<(i32, i32, bool)> =
            vec![(x + g, y - h / 2, false), (x - g - w, y - h / 2, false), (x - w / 2, y - g - h, false), (x - w / 2, y + g, false)];
        for dx in [34, 70, 120, 180] {
            for k in 0..80 {
                let dy = if k % 2 == 0 { (k / 2) * 4 } else { -(k / 2 + 1) * 4 };
                spots.push((x + dx, y - h / 2 + dy, true));
                spots.push((x - dx - w, y - h / 2 + dy, true));
            }
        }
        // Free of other labels and of points first; then of labels alone.
        for avoid_points in [true, false] {
            for &(x0, y0, far) in &spots {
                let b = Bounds { x0, y0, x1: x0 + w, y1: y0 + h };
                let clear = b.inside(&self.plot)
                    && !self.taken.iter().any(|t| t.overlaps(&b))
                    && !(avoid_points && soft.iter().any(|t| t.overlaps(&b)));
                if clear {
                    self.taken.push(b);
                    return Some((b, far));
                }
            }
        }
        None
    }

    /// Beside or above the point, touching nothing else; None when that is not free.
    pub(super) fn near(&mut self, at: (i32, i32), r: i32, w: i32, h: i32, soft: &[Bounds]) -> Option<Bounds> {
        let (x, y) = at;
        let g = r + 4;
        for (x0, y0) in [(x + g, y - h / 2), (x - g - w, y - h / 2), (x - w / 2, y - g - h), (x - w / 2, y + g)] {
            let b = Bounds { x0, y0, x1: x0 + w, y1: y0 + h };
            if b.inside(&self.plot) && !self.taken.iter().chain(soft).any(|t| t.overlaps(&b)) {
                self.taken.push(b);
                return Some(b);
            }
        }
        None
    }
}

/// Labels for the points `near` placement left over (a dense cluster): in two columns beside the
/// cluster, the left half of its points labelled on the left, the right half on the right, each
/// column in the points' vertical order so that leader lines do not cross; what does not fit
/// there goes to the placer's rings. Items are (key, point, label width); returns each key's box.
pub(super) fn columns(placer: &mut Placer, items: &[(usize, (i32, i32), i32)], h: i32, soft: &[Bounds]) -> Vec<(usize, Bounds)> {
    if items.is_empty() {
        return Vec::new();
    }
    let mut xs: Vec<i32> = items.iter().map(|i| i.1 .0).collect();
    xs.sort();
    let mid = xs[(xs.len() - 1) / 2];
    let mut out = Vec::new();
    for left in [true, false] {
        let mut side: Vec<&(usize, (i32, i32), i32)> = items.iter().filter(|i| (i.1 .0 <= mid) == left).collect();
        side.sort_by_key(|i| (i.1 .1, i.1 .0));
        let edge = if left { side.iter().map(|i| i.1 .0).min() } else { side.iter().map(|i| i.1 .0).max() };
        let Some(edge) = edge else { continue };
        let mut cursor = placer.plot.y0;
        for &&(key, (_, y), w) in &side {
            let x0 = if left { edge - 26 - w } else { edge + 26 };
            let mut y0 = (y - h / 2).max(cursor);
            let mut spot = None;
            while y0 + h <= placer.plot.y1 {
                let b = Bounds { x0, y0, x1: x0 + w, y1: y0 + h };
                if !b.inside(&placer.plot) {
                    break;
                }
                if placer.taken.iter().any(|t| t.overlaps(&b)) {
                    y0 += 2;
                    continue;
                }
                spot = Some(b);
                break;
            }
            match spot {
                Some(b) => {
                    placer.taken.push(b);
                    cursor = b.y1 + 1;
                    out.push((key, b));
                }
                None => {
                    let at = items.iter().find(|i| i.0 == key).expect("listed").1;
                    if let Some((b, _)) = placer.place(at, 6, w, h, soft) {
                        out.push((key, b));
                    }
                }
            }
        }
    }
    out
}

/// A label with a white backing, and a leader line to its point when it sits away from it.
pub(super) fn label(area: &Area, text: &str, b: Bounds, color: RGBColor, size: f64, leader: Option<(i32, i32)>) -> Option<()> {
    if let Some((x, y)) = leader {
        let cx = x.clamp(b.x0, b.x1);
        let cy = y.clamp(b.y0, b.y1);
        area.draw(&PathElement::new(vec![(x, y), (cx, cy)], color.mix(0.8).stroke_width(1))).ok()?;
    }
    area.draw(&Rectangle::new([(b.x0, b.y0), (b.x1, b.y1)], WHITE.mix(0.85).filled())).ok()?;
    area.draw(&Text::new(text.to_string(), (b.x0 + 3, (b.y0 + b.y1) / 2), style(size, color, HPos::Left, VPos::Center))).ok()?;
    Some(())
}

/// One legend row: a swatch then its name.
#[derive(Clone, Debug)]
pub(super) enum Swatch {
    Fill(RGBColor),
    Marker(Marker, RGBColor),
    Line(RGBColor, bool),
}

pub(super) struct Legend {
    pub rows: Vec<(Swatch, String)>,
    /// Rows per column before the next column starts.
    pub per_column: usize,
}

const ROW: i32 = 19;

impl Legend {
    fn columns(&self) -> Vec<&[(Swatch, String)]> {
        self.rows.chunks(self.per_column.max(1)).collect()
    }
    fn column_width(rows: &[(Swatch, String)]) -> i32 {
        28 + rows.iter().map(|(_, t)| text_width(t, TEXT)).max().unwrap_or(0)
    }
    pub(super) fn size(&self) -> (i32, i32) {
        let cols = self.columns();
        let w: i32 = cols.iter().map(|c| Self::column_width(c)).sum::<i32>() + 12;
        let h = cols.iter().map(|c| c.len()).max().unwrap_or(0) as i32 * ROW + 10;
        (w, h)
    }
    /// Drawn at `at` into the overlay: a `<g class="legend">` of `<g class="legend-entry">`.
    pub(super) fn draw(&self, overlay: &mut Overlay, at: Bounds) -> Option<()> {
        if self.rows.is_empty() {
            return Some(());
        }
        overlay.open("legend");
        overlay.group("legend-box", None, |a| {
            a.draw(&Rectangle::new([(at.x0, at.y0), (at.x1, at.y1)], WHITE.mix(0.9).filled())).ok()?;
            a.draw(&Rectangle::new([(at.x0, at.y0), (at.x1, at.y1)], MUTED.mix(0.6).stroke_width(1))).ok()
        })?;
        let mut x = at.x0 + 8;
        for col in self.columns() {
            for (i, (swatch, name)) in col.iter().enumerate() {
                let y = at.y0 + 5 + ROW * i as i32 + ROW / 2;
                overlay.group("legend-entry", None, |a| {
                    match swatch {
                        Swatch::Fill(c) => a.draw(&Rectangle::new([(x, y - 6), (x + 14, y + 6)], c.filled())).ok()?,
                        Swatch::Marker(m, c) => m.draw(a, (x + 7, y), 5, *c)?,
                        Swatch::Line(c, dashed) if *dashed => {
                            a.draw(&PathElement::new(vec![(x, y), (x + 6, y)], c.stroke_width(2))).ok()?;
                            a.draw(&PathElement::new(vec![(x + 10, y), (x + 16, y)], c.stroke_width(2))).ok()?
                        }
                        Swatch::Line(c, _) => a.draw(&PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2))).ok()?,
                    }
                    a.draw(&Text::new(name.clone(), (x + 22, y), style(TEXT, INK, HPos::Left, VPos::Center))).ok()
                })?;
            }
            x += Self::column_width(col);
        }
        overlay.close();
        Some(())
    }
}

/// Elements drawn after a chart, each set in a group of its own (see the module's note).
pub(super) struct Overlay {
    size: (u32, u32),
    body: String,
}

impl Overlay {
    pub(super) fn new(size: (u32, u32)) -> Overlay {
        Overlay { size, body: String::new() }
    }

    pub(super) fn open(&mut self, class: &str) {
        let _ = writeln!(self.body, "<g class=\"{class}\">");
    }

    pub(super) fn close(&mut self) {
        self.body.push_str("</g>\n");
    }

    /// What `draw` draws with plotters on a blank canvas of the figure's size, in a group of
    /// `class` whose hover text is `title`.
    pub(super) fn group(&mut self, class: &str, title: Option<&str>, draw: impl for<'b> FnOnce(&Area<'b>) -> Option<()>) -> Option<()> {
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, self.size).into_drawing_area();
            draw(&root)?;
            root.present().ok()?;
        }
        // plotters writes `<svg ...>` on a line of its own, the elements, then `</svg>`.
        let inner = svg.split_once('\n')?.1.trim_end().strip_suffix("</svg>")?;
        self.open(class);
        if let Some(t) = title {
            let _ = writeln!(self.body, "<title>{}</title>", escape(t));
        }
        self.body.push_str(inner);
        self.close();
        Some(())
    }

    /// The figure with the overlay on top.
    pub(super) fn onto(self, figure: String) -> Option<String> {
        let head = figure.trim_end().strip_suffix("</svg>")?;
        Some(format!("{head}{}</svg>\n", self.body))
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The powers of ten inside `lo..=hi`.
pub(super) fn decades(lo: f64, hi: f64) -> Vec<f64> {
    if !(lo > 0.0 && hi > lo && hi.is_finite()) {
        return Vec::new();
    }
    (lo.log10().ceil() as i32..=hi.log10().floor() as i32).map(|k| 10f64.powi(k)).collect()
}

/// A figure as a reader says it: 3 significant digits, no exponent above 0.01.
pub(super) fn figure(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.01 {
        format!("{v:.2}")
    } else {
        format!("{v:.1e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_family_has_a_colour_of_its_own() {
        let mut seen: Vec<RGBColor> = Vec::new();
        // Families without a sweep of their own (the f64 references) draw nothing.
        for f in crate::family::FAMILIES.iter().filter(|f| !f.kernels.is_empty() && f.name != "ceilings") {
            let Some(exp) = f.experiment else { continue };
            let c = family_color(exp.name());
            assert!(!seen.contains(&c), "{} shares a colour", f.name);
            seen.push(c);
        }
        assert!(seen.len() <= FAMILY_PALETTE.len());
    }

    #[test]
    fn an_overlay_group_keeps_plotters_elements_and_adds_a_title() {
        let mut o = Overlay::new((100, 100));
        o.group("point", Some("a <b> & c"), |a| Marker::Square.draw(a, (50, 50), 5, RED)).unwrap();
        let svg = o.onto("<svg width=\"100\" height=\"100\">\n<rect/>\n</svg>\n".to_string()).unwrap();
        assert!(svg.starts_with("<svg width=\"100\" height=\"100\">\n<rect/>\n<g class=\"point\">\n<title>a &lt;b&gt; &amp; c</title>\n<polygon"), "{svg}");
        assert!(svg.ends_with("</g>\n</svg>\n"), "{svg}");
        assert_eq!(svg.matches("<svg").count(), 1);
    }

    #[test]
    fn labels_do_not_cover_each_other() {
        let plot = Bounds { x0: 0, y0: 0, x1: 400, y1: 300 };
        let mut p = Placer { plot, taken: Vec::new() };
        let a = p.place((200, 150), 5, 80, 14, &[]).unwrap().0;
        let b = p.place((200, 150), 5, 80, 14, &[]).unwrap().0;
        assert!(!a.overlaps(&b) && a.inside(&plot) && b.inside(&plot));
        assert_eq!(corner(plot, 50, 50, &[Bounds::around((20, 20), 5)]).x0, 400 - 8 - 50);
    }

    #[test]
    fn figures_read_as_written() {
        assert_eq!(figure(936.64), "937");
        assert_eq!(figure(65.78), "65.8");
        assert_eq!(figure(1.234), "1.23");
        assert_eq!(decades(0.05, 2000.0), vec![0.1, 1.0, 10.0, 100.0, 1000.0]);
    }
}
