//! What the research log leads with. For every experiment and device: at each headline shape the
//! experiment declares ([`crate::experiment::Experiment::headlines`]), the best passing figure of
//! every lab variant over the whole history, beside the best peer of the run that gave it; the
//! untimed correctness gates as counts; and one status line. Then one line per run and each note
//! once, by its status paragraph.

use super::model::{headline, is_peer, param_text, rate, shape, slug, variant_name, NoteView};
use crate::record::{Record, Verdict};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// A variant's best passing figure at one headline shape, over every run.
#[derive(Serialize, Clone, Debug)]
pub struct Best {
    pub variant: String,
    /// No longer in its family's variant table: tried, measured and removed.
    pub removed: bool,
    pub figure: String,
    /// The rate at the 80th and 20th percentile times of the same record.
    pub band: String,
    pub pct_ceiling: String,
    pub run_id: String,
    /// The run's own HTML page.
    pub run_page: String,
    pub date: String,
    /// The fastest passing peer of that run at that shape, "-" when it had none.
    pub peer: String,
    pub peer_figure: String,
    /// Peer time over lab time: above 1, the lab is faster.
    pub ratio: String,
}

/// One headline shape on one device, in one timing mode: its variants, fastest first.
#[derive(Serialize, Clone, Debug)]
pub struct Headline {
    /// The declared headline it answers.
    #[serde(skip)]
    pub spec: String,
    pub shape: String,
    pub mode: String,
    pub unit: String,
    pub rows: Vec<Best>,
}

/// The untimed correctness gates of an experiment on a device, as counts.
#[derive(Serialize, Clone, Debug)]
pub struct Gates {
    pub passed: usize,
    pub total: usize,
    pub runs: usize,
    /// The gate closest to (or furthest past) its tolerance.
    pub worst: String,
}

#[derive(Serialize, Clone, Debug)]
pub struct DeviceView {
    pub device: String,
    /// The current answer in one sentence.
    pub status: String,
    pub headlines: Vec<Headline>,
    pub gates: Option<Gates>,
    /// By world size across runs (the newest passing record of each figure), where the records
    /// name two world sizes or more.
    pub scaling: Option<super::model::Scaling>,
    /// The committed figures, drawn from the current run.
    pub figures: Vec<super::model::Figure>,
    /// Where the status figure comes from: the ladder is drawn at its shape and timing mode, the
    /// run's figures from its run.
    #[serde(skip)]
    pub lead: Option<Lead>,
}

/// The headline shape, timing mode and run of a device's status line.
#[derive(Clone, Debug)]
pub struct Lead {
    pub run_id: String,
    pub shape: String,
    pub mode: String,
}

#[derive(Serialize, Clone, Debug)]
pub struct ExperimentView {
    pub name: String,
    pub slug: String,
    pub devices: Vec<DeviceView>,
    /// Notes that name a run holding this experiment's records (file names).
    pub notes: Vec<NoteLink>,
}

#[derive(Serialize, Clone, Debug)]
pub struct NoteLink {
    pub file: String,
    pub title: String,
    /// Its status paragraph: the answer as it stands.
    pub status: String,
    pub page: String,
}

/// A run in one line.
#[derive(Serialize, Clone, Debug)]
pub struct RunLine {
    pub run_id: String,
    /// Its own HTML page, with every table and figure.
    pub page: String,
    pub date: String,
    pub device: String,
    pub commit: String,
    pub dirty: bool,
    pub command: String,
    /// The command with its `--shape` cases after the first counted, not listed (the log's
    /// table; the run's page has it whole).
    pub command_short: String,
    pub experiments: String,
    pub records: usize,
    pub pass: usize,
    pub fail: usize,
    pub implausible: usize,
    pub notes: Vec<NoteLink>,
}

/// Does a record's parameter set hold every `key=value` of a headline?
pub fn matches(params: &Value, spec: &str) -> bool {
    let Some(map) = params.as_object() else { return false };
    spec.split_whitespace()
        .all(|kv| kv.split_once('=').is_some_and(|(k, v)| map.get(k).is_some_and(|x| param_text(x) == v)))
}

fn timed_pass(r: &Record) -> bool {
    r.verdict == Verdict::Pass && r.time_ms.is_some() && headline(r).is_some()
}

fn mode(r: &Record) -> String {
    r.timing.as_ref().map(|t| t.label()).unwrap_or_else(|| "-".into())
}

fn median(r: &Record) -> f64 {
    r.time_ms.as_ref().map_or(f64::INFINITY, |t| t.median)
}

fn day(time: &str) -> String {
    time.chars().take(10).collect()
}

/// The headline specs an experiment declares.
pub(crate) fn declared(experiment: &str) -> Vec<String> {
    crate::experiment::find(experiment).map(|e| e.headlines()).unwrap_or(&[]).iter().map(|s| s.to_string()).collect()
}

/// The variants an experiment's family table names today; None where it keeps no table.
pub(crate) fn current_variants(experiment: &str) -> Option<Vec<&'static str>> {
    let family = crate::family::FAMILIES.iter().find(|f| f.name == experiment)?;
    let names: Vec<&'static str> = (family.variants)().iter().map(|v| v.name).collect();
    (!names.is_empty()).then_some(names)
}

/// The exact parameters of the largest shape timed: the headline of an experiment that declares
/// none, or whose declared shapes were never timed on this device (a CPU run's small sizes).
fn largest(lab: &[&Record]) -> Vec<String> {
    lab.iter().max_by_key(|r| (r.work.flops, r.work.bytes, shape(&r.params))).map(|r| vec![shape(&r.params)]).unwrap_or_default()
}

/// The headline tables of one experiment on one device.
fn headlines(experiment: &str, recs: &[&Record]) -> Vec<Headline> {
    let timed: Vec<&Record> = recs.iter().copied().filter(|r| timed_pass(r)).collect();
    let lab: Vec<&Record> = timed.iter().copied().filter(|r| !is_peer(r)).collect();
    // The fastest passing peer per (run, parameters, timing mode).
    let mut peers: BTreeMap<(&str, String, String), &Record> = BTreeMap::new();
    for p in timed.iter().copied().filter(|r| is_peer(r)) {
        let key = (p.run_id.as_str(), shape(&p.params), mode(p));
        if peers.get(&key).is_none_or(|old| median(p) < median(old)) {
            peers.insert(key, p);
        }
    }
    let table = current_variants(experiment);
    let mut specs = declared(experiment);
    // A largest shape is exact: records with more parameters (a training run's steps) are others.
    let exact = !lab.iter().any(|r| specs.iter().any(|s| matches(&r.params, s)));
    if exact {
        specs = largest(&lab);
    }
    let mut out = Vec::new();
    for spec in &specs {
        // One group per full parameter set and timing mode that the spec matches.
        let mut groups: BTreeMap<(String, String), BTreeMap<String, &Record>> = BTreeMap::new();
        for r in lab.iter().copied().filter(|r| (!exact && matches(&r.params, spec)) || shape(&r.params) == *spec) {
            let variants = groups.entry((shape(&r.params), mode(r))).or_default();
            let name = variant_name(r);
            if variants.get(&name).is_none_or(|old| median(r) < median(old)) {
                variants.insert(name, r);
            }
        }
        for ((shape, mode), variants) in groups {
            let mut best: Vec<&Record> = variants.into_values().collect();
            best.sort_by(|a, b| median(a).total_cmp(&median(b)).then(a.variant.cmp(&b.variant)));
            let unit = headline(best[0]).map_or("", |(_, u)| u);
            let rows = best
                .iter()
                .map(|r| {
                    let t = r.time_ms.as_ref().expect("timed");
                    let peer = peers.get(&(r.run_id.as_str(), shape.clone(), mode.clone()));
                    let variant = variant_name(r);
                    Best {
                        removed: table.as_ref().is_some_and(|t| !t.contains(&variant.as_str())),
                        variant,
                        figure: format!("{:.1}", rate(r, t.median, unit)),
                        band: format!("{:.1}-{:.1}", rate(r, t.p80, unit), rate(r, t.p20, unit)),
                        pct_ceiling: r.fraction_of_ceiling.map_or("-".into(), |f| format!("{:.1}", 100.0 * f)),
                        run_id: r.run_id.clone(),
                        run_page: run_page(&r.run_id),
                        date: day(&r.time),
                        peer: peer.map_or("-".into(), |p| format!("{} ({})", p.variant, p.provider)),
                        peer_figure: peer.map_or("-".into(), |p| format!("{:.1}", rate(r, median(p), unit))),
                        ratio: peer.map_or("-".into(), |p| format!("{:.2}x", median(p) / t.median)),
                    }
                })
                .collect();
            out.push(Headline { spec: spec.clone(), shape, mode, unit: unit.into(), rows });
        }
    }
    out
}

fn gates(recs: &[&Record]) -> Option<Gates> {
    let untimed: Vec<&Record> = recs.iter().copied().filter(|r| !is_peer(r) && r.time_ms.is_none() && r.error.is_some()).collect();
    let worst = untimed.iter().max_by(|a, b| {
        let f = |r: &Record| r.error.as_ref().map_or(0.0, |e| e.worst_fraction_of_tolerance);
        f(a).total_cmp(&f(b)).then(b.record_id.cmp(&a.record_id))
    })?;
    let e = worst.error.as_ref().expect("filtered on error");
    let mut runs: Vec<&str> = untimed.iter().map(|r| r.run_id.as_str()).collect();
    runs.sort();
    runs.dedup();
    Some(Gates {
        passed: untimed.iter().filter(|r| r.verdict == Verdict::Pass).count(),
        total: untimed.len(),
        runs: runs.len(),
        worst: format!(
            "{:.2} of its tolerance (max abs error {:.2e}), {} at {} in run {}",
            e.worst_fraction_of_tolerance,
            e.max_abs,
            variant_name(worst),
            shape(&worst.params),
            worst.run_id
        ),
    })
}

/// Every experiment with records, by name; devices by name.
pub fn experiments(records: &[Record], notes: &[(Vec<String>, NoteView)]) -> Vec<ExperimentView> {
    let mut by: BTreeMap<&str, BTreeMap<&str, Vec<&Record>>> = BTreeMap::new();
    for r in records {
        by.entry(r.experiment.as_str()).or_default().entry(r.device.name.as_str()).or_default().push(r);
    }
    by.into_iter()
        .map(|(experiment, devices)| {
            let runs: Vec<&str> = devices.values().flatten().map(|r| r.run_id.as_str()).collect();
            let notes = notes
                .iter()
                .filter(|(ids, _)| ids.iter().any(|id| runs.contains(&id.as_str())))
                .map(|(_, n)| note_link(n))
                .collect();
            let devices = devices
                .into_iter()
                .map(|(device, recs)| {
                    let headlines = headlines(experiment, &recs);
                    // The current answer: the first headline, in a timing mode with a peer
                    // where there is one, by the best variant still in the table.
                    let lead = headlines
                        .iter()
                        .filter(|h| Some(&h.spec) == headlines.first().map(|f| &f.spec))
                        .filter_map(|h| h.rows.iter().find(|b| !b.removed).map(|b| (h, b)))
                        .max_by_key(|(h, b)| (b.peer != "-", std::cmp::Reverse((h.mode.clone(), h.shape.clone()))));
                    let status = match lead {
                        Some((h, b)) => {
                            let ceiling = if b.pct_ceiling == "-" { String::new() } else { format!(" ({}% of the ceiling)", b.pct_ceiling) };
                            let peer = if b.peer == "-" { ", no peer timed".to_string() } else { format!(", {} against {}", b.ratio, b.peer) };
                            format!("at {} ({}), {} reaches {} {}{ceiling}{peer}, run {} ({})", h.shape, h.mode, b.variant, b.figure, h.unit, b.run_id, b.date)
                        }
                        None if headlines.is_empty() => "no timed, passing lab figure".into(),
                        None => "only variants since removed from the table were timed".into(),
                    };
                    let lead = lead.map(|(h, b)| Lead { run_id: b.run_id.clone(), shape: h.shape.clone(), mode: h.mode.clone() });
                    // The headlines' variants at every shape their declarations match (at every
                    // shape where the experiment declares none: a training run's steps differ).
                    let open = declared(experiment).is_empty();
                    let mut by_time: Vec<&Record> = recs
                        .iter()
                        .copied()
                        .filter(|r| headlines.iter().any(|h| (open || matches(&r.params, &h.spec)) && h.rows.iter().any(|b| b.variant == super::model::variant_name(r))))
                        .collect();
                    by_time.sort_by(|a, b| a.time.cmp(&b.time));
                    let scaling = super::model::scaling(&by_time, experiment).filter(|s| s.ranks.len() > 1);
                    DeviceView { device: device.to_string(), status, headlines, gates: gates(&recs), scaling, figures: Vec::new(), lead }
                })
                .collect();
            ExperimentView { name: experiment.to_string(), slug: slug(experiment), devices, notes }
        })
        .collect()
}

/// A run's own HTML page, beside index.html.
pub fn run_page(run_id: &str) -> String {
    format!("run-{}.html", slug(run_id))
}

pub fn note_link(n: &NoteView) -> NoteLink {
    NoteLink { file: n.file.clone(), title: n.title.clone(), status: n.status.clone(), page: n.page.clone() }
}

/// `command` with the `--shape` arguments after the first replaced by their count.
fn short_command(command: &str) -> String {
    let words: Vec<&str> = command.split(' ').collect();
    let shapes: Vec<usize> = words.iter().enumerate().filter(|(_, w)| **w == "--shape").map(|(i, _)| i).collect();
    if shapes.len() < 2 {
        return command.to_string();
    }
    let dropped: Vec<usize> = shapes[1..].iter().flat_map(|&i| [i, i + 1]).collect();
    let mut kept: Vec<String> = words.iter().enumerate().filter(|(i, _)| !dropped.contains(i)).map(|(_, w)| w.to_string()).collect();
    kept.insert(shapes[0] + 2, format!("(and {} more --shape)", shapes.len() - 1));
    kept.join(" ")
}

/// One line per run, newest first.
pub fn runs(by_run: &BTreeMap<&str, Vec<&Record>>, notes: &[(Vec<String>, NoteView)]) -> Vec<RunLine> {
    by_run
        .iter()
        .rev()
        .map(|(run_id, recs)| {
            let first = recs[0];
            let count = |v: Verdict| recs.iter().filter(|r| r.verdict == v).count();
            let mut experiments: Vec<&str> = recs.iter().map(|r| r.experiment.as_str()).collect();
            experiments.sort();
            experiments.dedup();
            RunLine {
                run_id: run_id.to_string(),
                page: run_page(run_id),
                date: first.time.clone(),
                device: first.device.name.clone(),
                commit: first.git.commit.chars().take(7).collect(),
                dirty: first.git.dirty,
                command: first.command.clone(),
                command_short: short_command(&first.command),
                experiments: experiments.join(", "),
                records: recs.len(),
                pass: count(Verdict::Pass),
                fail: count(Verdict::Fail),
                implausible: count(Verdict::Implausible),
                notes: notes.iter().filter(|(ids, _)| ids.iter().any(|i| i == run_id)).map(|(_, n)| note_link(n)).collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_short_command_counts_the_shapes_after_the_first() {
        assert_eq!(super::short_command("lab run moe --shape a=1 --shape a=2 --shape a=3 --out r"), "lab run moe --shape a=1 (and 2 more --shape) --out r");
        assert_eq!(super::short_command("lab run moe --shape a=1 --out r"), "lab run moe --shape a=1 --out r");
    }
}
