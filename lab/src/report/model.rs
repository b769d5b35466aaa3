//! The views templates are filled from: plain `#[derive(Serialize)]` structs, numbers already
//! formatted, everything sorted, so a render is a pure function of its inputs.

use crate::record::{Record, Verdict};
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Serialize, Clone, Debug)]
pub struct Row {
    pub record_id: String,
    pub experiment: String,
    pub variant: String,
    pub provider: String,
    pub shape: String,
    pub median_ms: String,
    pub gb_s: String,
    pub tflop_s: String,
    pub pct_ceiling: String,
    pub speedup: String,
    pub max_err: String,
    pub verdict: String,
    /// A figure that must not be read as a result (failed or implausible).
    pub flagged: bool,
    pub mode: String,
}

#[derive(Serialize, Clone, Debug)]
pub struct Table {
    pub experiment: String,
    pub slug: String,
    pub rows: Vec<Row>,
    /// For experiments that sweep the world size: the same figures by number of ranks.
    pub scaling: Option<Scaling>,
}

/// A run's timed, passing figures of one experiment by world size (`params.ranks`): a row per
/// variant and shape (the params but `ranks`), a cell per world size with the median time and the
/// throughput against one rank's (the row's own, else the same shape's first variant at one rank:
/// a data-parallel step's compute alone).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Scaling {
    pub ranks: Vec<u64>,
    pub rows: Vec<ScalingRow>,
}

#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct ScalingRow {
    pub variant: String,
    pub shape: String,
    pub cells: Vec<String>,
}

/// See [`Scaling`]; `None` when no record names its ranks.
pub fn scaling(recs: &[&Record], experiment: &str) -> Option<Scaling> {
    let mut by_row: BTreeMap<(String, String), BTreeMap<u64, (f64, f64)>> = BTreeMap::new();
    for r in recs.iter().filter(|r| r.experiment == experiment && r.verdict == Verdict::Pass) {
        let (Some(n), Some(t), Some(tp)) = (r.params.get("ranks").and_then(serde_json::Value::as_u64), &r.time_ms, &r.throughput) else { continue };
        let mut p = r.params.clone();
        p.as_object_mut().map(|o| o.remove("ranks"));
        // Throughput as work per time, or 1 / time where the record counts no flops.
        let rate = if tp.tflop_s > 0.0 { tp.tflop_s } else { 1.0 / t.median };
        by_row.entry((shape(&p), r.variant.clone())).or_default().insert(n, (t.median, rate));
    }
    let ranks: Vec<u64> = by_row.values().flat_map(|c| c.keys().copied()).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    if ranks.is_empty() {
        return None;
    }
    let one_rank = |shape: &str| by_row.iter().find(|((s, _), c)| s == shape && c.contains_key(&1)).map(|(_, c)| c[&1].1);
    let rows = by_row
        .iter()
        .map(|((shape, variant), cells)| {
            let base = cells.get(&1).map(|c| c.1).or_else(|| one_rank(shape));
            let cells = ranks
                .iter()
                .map(|n| match (cells.get(n), base) {
                    (Some((ms, rate)), Some(b)) => format!("{} ms ({:.2}x)", num(Some(*ms), 3), rate / b),
                    (Some((ms, _)), None) => format!("{} ms", num(Some(*ms), 3)),
                    (None, _) => String::new(),
                })
                .collect();
            ScalingRow { variant: variant.clone(), shape: shape.clone(), cells }
        })
        .collect();
    Some(Scaling { ranks, rows })
}

#[derive(Serialize, Clone, Debug)]
pub struct Figure {
    pub title: String,
    /// The same file as research_log.md links it.
    pub md_path: String,
    /// The SVG itself, inlined in the HTML.
    pub svg: String,
    /// What it shows: `roofline`, `ladder`, `speedup` or `scaling`.
    pub kind: &'static str,
    /// The experiment it belongs to; None for the run-wide roofline.
    pub experiment: Option<String>,
}

/// A note: its file, title, status paragraph (the current answer), and the whole text.
#[derive(Serialize, Clone, Debug)]
pub struct NoteView {
    pub file: String,
    pub title: String,
    pub status: String,
    /// Its own HTML page, beside index.html.
    pub page: String,
    pub html: String,
}

/// A run with all its tables and figures: its own page.
#[derive(Serialize, Clone, Debug)]
pub struct RunView {
    #[serde(flatten)]
    pub line: super::findings::RunLine,
    pub backend: String,
    pub tables: Vec<Table>,
    pub figures: Vec<Figure>,
}

/// A file or folder name safe to write, whatever a record says.
pub fn slug(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c.to_ascii_lowercase() } else { '_' })
        .collect();
    if out.is_empty() { "_".into() } else { out }
}

/// A parameter's value as a shape prints it: strings bare, numbers as JSON writes them.
pub fn param_text(v: &serde_json::Value) -> String {
    v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string())
}

/// `cols=4096 dtype=f32 rows=16384`: every parameter, sorted by name.
pub fn shape(params: &serde_json::Value) -> String {
    match params.as_object() {
        Some(map) => map
            .iter()
            .map(|(k, v)| format!("{k}={}", param_text(v)))
            .collect::<Vec<_>>()
            .join(" "),
        None => params.to_string(),
    }
}

fn num(x: Option<f64>, digits: usize) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{v:.digits$}"),
        Some(v) => format!("{v}"),
        None => "-".into(),
    }
}

pub fn verdict_name(v: Verdict) -> &'static str {
    match v {
        Verdict::Pass => "pass",
        Verdict::Fail => "fail",
        Verdict::Implausible => "implausible",
    }
}

/// Is this a peer's figure (anything that is not our own kernel or our own simulated design)?
pub fn is_peer(r: &Record) -> bool {
    r.provider != "lab" && r.provider != super::charts::DESIGN_PROVIDER
}

/// The best passing peer time for each (run, experiment, params) group.
pub fn best_peer_times(records: &[Record]) -> BTreeMap<(String, String, String), (f64, String)> {
    let mut best: BTreeMap<(String, String, String), (f64, String)> = BTreeMap::new();
    for r in records.iter().filter(|r| is_peer(r) && r.verdict == Verdict::Pass) {
        if let Some(t) = &r.time_ms {
            let key = (r.run_id.clone(), r.experiment.clone(), r.params.to_string());
            let name = format!("{} ({})", r.variant, r.provider);
            if best.get(&key).is_none_or(|(old, _)| t.median < *old) {
                best.insert(key, (t.median, name));
            }
        }
    }
    best
}

/// The variant as its table names it today (old quant records carried scheme and batch in the
/// name; their params already hold both).
pub fn variant_name(r: &Record) -> String {
    crate::ops::quant::current_name(&r.experiment, &r.variant, &r.params).0
}

pub fn row(r: &Record, peers: &BTreeMap<(String, String, String), (f64, String)>) -> Row {
    let median = r.time_ms.as_ref().map(|t| t.median);
    let peer = peers.get(&(r.run_id.clone(), r.experiment.clone(), r.params.to_string()));
    // A figure that failed its check or beat the ceiling is kept but never given a speed-up.
    let speedup = match (median, peer, is_peer(r)) {
        (Some(m), Some((p, _)), false) if m > 0.0 && r.verdict == Verdict::Pass => Some(p / m),
        _ => None,
    };
    let mode = match (&r.timing, &r.time_ms) {
        (Some(t), Some(s)) => {
            let clocks = t.clocks.as_ref().map(|c| format!(", SM {}-{} MHz", c.sm_mhz[0], c.sm_mhz[1])).unwrap_or_default();
            format!("L2 {}, {}, {} samples{clocks}", t.l2, t.launch, s.samples)
        }
        _ => "untimed (correctness only)".into(),
    };
    Row {
        record_id: r.record_id.clone(),
        experiment: r.experiment.clone(),
        variant: variant_name(r),
        provider: r.provider.clone(),
        shape: shape(&r.params),
        median_ms: num(median, 4),
        gb_s: num(r.throughput.map(|t| t.gb_s), 1),
        tflop_s: num(r.throughput.map(|t| t.tflop_s), 3),
        pct_ceiling: num(r.fraction_of_ceiling.map(|f| 100.0 * f), 1),
        speedup: speedup.map(|s| format!("{s:.2}x")).unwrap_or_else(|| "-".into()),
        max_err: r.error.as_ref().map(error_label).unwrap_or_else(|| "-".into()),
        verdict: verdict_name(r.verdict).into(),
        flagged: r.verdict != Verdict::Pass,
        mode,
    }
}

/// Largest absolute error, with its size in ULPs of the output type where the record has it.
fn error_label(e: &crate::record::ErrorStats) -> String {
    match e.max_ulp {
        Some(u) => format!("{:.2e} ({u} ulp)", e.max_abs),
        None => format!("{:.2e}", e.max_abs),
    }
}

/// The rate a record is judged by: GB/s unless its ceiling is a compute roof.
pub fn headline(r: &Record) -> Option<(f64, &'static str)> {
    let t = r.throughput?;
    // A ceiling record names the roof it measures; others name the roof they are placed under.
    let roof = r.ceiling.as_deref().or_else(|| r.extra.get("ceiling_name").and_then(|v| v.as_str()));
    let compute = roof.is_some_and(|c| c.ends_with("tflop_s")) || (r.work.bytes == 0 && r.work.flops > 0);
    Some(if compute { (t.tflop_s, "TFLOP/s") } else { (t.gb_s, "GB/s") })
}

/// One run's best passing lab figure for a shape, with its noise band (the rate at the p80 and
/// p20 times).
#[derive(Serialize, Clone, Debug)]
pub struct HistoryPoint {
    pub run_id: String,
    pub date: String,
    pub commit: String,
    pub variant: String,
    pub figure: String,
    pub band: String,
}

/// An experiment's best figure on one device and shape, run after run (commit after commit).
#[derive(Serialize, Clone, Debug)]
pub struct History {
    pub experiment: String,
    pub slug: String,
    pub device: String,
    pub shape: String,
    pub unit: String,
    pub points: Vec<HistoryPoint>,
}

/// For each experiment, device and shape timed in at least two runs, the best passing lab
/// variant of each run in run order. Runs in other timing modes (warm L2, graphs) are kept apart:
/// their figures answer a different question.
pub fn history(records: &[Record]) -> Vec<History> {
    let mut best: BTreeMap<(String, String, String, String), BTreeMap<String, &Record>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.provider == "lab" && r.verdict == Verdict::Pass && headline(r).is_some()) {
        let (Some(t), Some(mode)) = (&r.time_ms, &r.timing) else { continue };
        let key = (r.experiment.clone(), r.device.name.clone(), shape(&r.params), mode.label());
        let runs = best.entry(key).or_default();
        if runs.get(&r.run_id).is_none_or(|old| t.median < old.time_ms.as_ref().map_or(f64::INFINITY, |o| o.median)) {
            runs.insert(r.run_id.clone(), r);
        }
    }
    best.into_iter()
        .filter(|(_, runs)| runs.len() >= 2)
        .map(|((experiment, device, shape, mode), runs)| {
            let unit = runs.values().next().and_then(|r| headline(r)).map_or("", |(_, u)| u);
            let points = runs
                .values()
                .map(|r| {
                    let t = r.time_ms.as_ref().expect("timed");
                    HistoryPoint {
                        run_id: r.run_id.clone(),
                        date: r.time.clone(),
                        commit: r.git.commit.chars().take(7).collect(),
                        variant: variant_name(r),
                        figure: format!("{:.1}", rate(r, t.median, unit)),
                        band: format!("{:.1}-{:.1}", rate(r, t.p80, unit), rate(r, t.p20, unit)),
                    }
                })
                .collect();
            History { slug: slug(&experiment), experiment, device, shape: format!("{shape} ({mode})"), unit: unit.into(), points }
        })
        .collect()
}

/// A record's rate at `ms` in `unit` (TFLOP/s, else GB/s): the figure at the median, and the band
/// at the 80th and 20th percentile times.
pub fn rate(r: &Record, ms: f64, unit: &str) -> f64 {
    let t = r.work.throughput(ms);
    if unit == "TFLOP/s" { t.tflop_s } else { t.gb_s }
}

/// The findings side by side across devices: for each experiment and shape, the best lab
/// variant's percentage of each device's own ceiling.
#[derive(Serialize, Clone, Debug)]
pub struct CrossDevice {
    pub devices: Vec<String>,
    pub rows: Vec<CrossRow>,
}

#[derive(Serialize, Clone, Debug)]
pub struct CrossRow {
    pub experiment: String,
    pub slug: String,
    pub shape: String,
    /// One per device, in `devices` order: "93.1% (float4_grid_stride)", a ceiling's own figure,
    /// or "-".
    pub cells: Vec<String>,
}

pub fn cross_device(views: &[super::findings::ExperimentView]) -> CrossDevice {
    let mut devices: Vec<String> = views.iter().flat_map(|e| e.devices.iter().map(|d| d.device.clone())).collect();
    devices.sort();
    devices.dedup();
    let mut rows: BTreeMap<(String, String), (String, Vec<String>)> = BTreeMap::new();
    for e in views {
        for d in &e.devices {
            let i = devices.iter().position(|x| *x == d.device).expect("device listed");
            for h in &d.headlines {
                let b = &h.rows[0];
                let (_, cells) = rows.entry((e.name.clone(), h.shape.clone())).or_insert_with(|| (e.slug.clone(), vec!["-".into(); devices.len()]));
                // A ceiling is not a fraction of itself: its own figure stands in the cell.
                let figure = if b.pct_ceiling == "-" { format!("{} {}", b.figure, h.unit) } else { format!("{}%", b.pct_ceiling) };
                cells[i] = format!("{figure} ({})", b.variant);
            }
        }
    }
    let rows = rows.into_iter().map(|((experiment, shape), (slug, cells))| CrossRow { slug, experiment, shape, cells }).collect();
    CrossDevice { devices, rows }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(variant: &str, ranks: u64, tokens: u64, ms: f64, tflop_s: f64) -> Record {
        let line = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/report/records/2026-11-22T14-00-38Z-h100-14a3904.jsonl")).unwrap();
        let mut r: Record = serde_json::from_str(line.lines().next().unwrap()).unwrap();
        (r.experiment, r.variant, r.verdict) = ("tp".into(), variant.into(), Verdict::Pass);
        r.params = serde_json::json!({"tokens": tokens, "ranks": ranks});
        r.time_ms.as_mut().unwrap().median = ms;
        r.throughput.as_mut().unwrap().tflop_s = tflop_s;
        r
    }

    #[test]
    fn a_scaling_table_has_a_column_per_world_size_and_throughput_against_one_rank() {
        let recs = [record("col", 1, 8, 4.0, 10.0), record("col", 2, 8, 2.5, 16.0), record("col", 4, 8, 1.0, 40.0), record("dp", 4, 8, 1.0, 30.0), record("col", 2, 1, 1.0, 1.0)];
        let refs: Vec<&Record> = recs.iter().collect();
        let t = scaling(&refs, "tp").unwrap();
        assert_eq!(t.ranks, [1, 2, 4]);
        let row = |v: &str, s: &str| t.rows.iter().find(|r| r.variant == v && r.shape == s).unwrap().cells.clone();
        assert_eq!(row("col", "tokens=8")[1..], ["2.500 ms (1.60x)".to_string(), "1.000 ms (4.00x)".to_string()]);
        // No one-rank figure of its own: against the shape's one-rank figure; none at all: time only.
        assert_eq!(row("dp", "tokens=8")[2], "1.000 ms (3.00x)");
        assert_eq!(row("col", "tokens=1"), ["", "1.000 ms", ""]);
        assert_eq!(scaling(&refs, "other"), None);
    }
}
