//! The report: research_log.md and a static HTML site rendered from the records, the notes and
//! the tera templates. A pure function of its inputs: rendering twice gives the same bytes.

pub mod charts;
pub mod model;
pub mod show;

use crate::record::{read_records, Record};
use crate::{LabError, Result};
use model::{Figure, NoteView, RunView, Table};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug)]
pub struct ReportOptions {
    pub records: PathBuf,
    pub notes: PathBuf,
    pub templates: PathBuf,
    /// Folder for index.html, <experiment>.html and figures/.
    pub out: PathBuf,
    /// Where research_log.md goes.
    pub log: PathBuf,
}

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions {
            records: "reports/records".into(),
            notes: "reports/notes".into(),
            templates: "templates".into(),
            out: "reports".into(),
            log: "research_log.md".into(),
        }
    }
}

/// Every output file and its content, plus what the reader must be warned about.
pub struct Rendered {
    pub files: BTreeMap<PathBuf, String>,
    pub warnings: Vec<String>,
}

#[derive(Serialize)]
struct ExperimentLink {
    name: String,
    slug: String,
}


#[derive(Serialize)]
struct SiteContext<'a> {
    experiments: &'a [ExperimentLink],
    warnings: &'a [String],
    findings: &'a [model::Finding],
    history: &'a [model::History],
    cross: &'a model::CrossDevice,
    runs: &'a [RunView],
    has_gpu_run: bool,
    /// Set on an experiment page.
    experiment: Option<&'a str>,
}

/// A note: `+++` TOML front matter naming its runs, then Markdown.
#[derive(serde::Deserialize)]
struct FrontMatter {
    runs: Vec<String>,
}

fn read_notes(dir: &Path, warnings: &mut Vec<String>) -> Vec<(Vec<String>, NoteView)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "md")).collect();
    files.sort();
    let mut notes = Vec::new();
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let Ok(text) = std::fs::read_to_string(&path) else {
            warnings.push(format!("note {name}: unreadable"));
            continue;
        };
        let parsed = text
            .strip_prefix("+++\n")
            .and_then(|rest| rest.split_once("\n+++\n"))
            .ok_or_else(|| "no `+++` front matter naming its runs".to_string())
            .and_then(|(front, body)| {
                toml::from_str::<FrontMatter>(front).map(|f| (f.runs, body.trim().to_string())).map_err(|e| e.message().to_string())
            });
        match parsed {
            Ok((runs, body)) => notes.push((runs, NoteView { file: name, html: markdown_to_html(&body), markdown: body })),
            Err(why) => warnings.push(format!("note {name}: {why}")),
        }
    }
    notes
}

/// Markdown to HTML with any raw HTML in the note shown as text.
fn markdown_to_html(md: &str) -> String {
    use pulldown_cmark::{Event, Options, Parser};
    let events = Parser::new_ext(md, Options::ENABLE_TABLES).map(|e| match e {
        Event::Html(t) | Event::InlineHtml(t) => Event::Text(t),
        other => other,
    });
    let mut html = String::new();
    pulldown_cmark::html::push_html(&mut html, events);
    html
}

fn templates(dir: &Path) -> Result<tera::Tera> {
    let mut tera = tera::Tera::new();
    // Markdown table cells: a `|` or a newline from a record must not break the table.
    tera.register_filter("md", |s: &str, _: tera::Kwargs, _: &tera::State| s.replace('|', "\\|").replace('\n', " "));
    let entries = std::fs::read_dir(dir).map_err(|e| LabError::io(dir, format!("cannot read the templates folder: {e}")))?;
    let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.is_file()).collect();
    files.sort();
    let mut sources = Vec::new();
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        sources.push((name, std::fs::read_to_string(&path).map_err(|e| LabError::io(&path, e))?));
    }
    // All at once: templates include and extend each other.
    tera.add_raw_templates(sources).map_err(|e| LabError::io(dir, format!("template error: {e}")))?;
    Ok(tera)
}

fn render_one(tera: &tera::Tera, name: &str, ctx: &impl Serialize) -> Result<String> {
    let ctx = tera::Context::from_serialize(ctx).map_err(|e| LabError::Invalid(format!("report context: {e}")))?;
    tera.render(name, &ctx).map_err(|e| {
        let mut msg = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg.push_str(&format!(": {s}"));
            src = s.source();
        }
        LabError::Invalid(format!("rendering template {name}: {msg}"))
    })
}

/// Renders everything in memory.
pub fn render(opts: &ReportOptions) -> Result<Rendered> {
    let mut warnings = Vec::new();
    let (mut records, damage) = if opts.records.exists() {
        read_records(&opts.records)?
    } else {
        warnings.push(format!("no records folder at {}", opts.records.display()));
        (Vec::new(), Vec::new())
    };
    for d in &damage {
        // Named relative to the records folder: the output must not depend on where it lives.
        let file = d.file.strip_prefix(&opts.records).unwrap_or(&d.file).display();
        warnings.push(format!("skipped a damaged record line: {file}:{}: {}", d.line, d.why));
    }
    // Stable order: by run, then by position in the run.
    let position = |r: &Record| r.record_id.rsplit('#').next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(u64::MAX);
    records.sort_by(|a, b| a.run_id.cmp(&b.run_id).then(position(a).cmp(&position(b))));

    let notes = read_notes(&opts.notes, &mut warnings);
    let mut by_run: BTreeMap<&str, Vec<&Record>> = BTreeMap::new();
    for r in &records {
        by_run.entry(r.run_id.as_str()).or_default().push(r);
    }
    for (runs, note) in &notes {
        for id in runs.iter().filter(|id| !by_run.contains_key(id.as_str())) {
            warnings.push(format!("note {} names run {id}, which has no records", note.file));
        }
    }

    let peers = model::best_peer_times(&records);
    let md_prefix = relative_prefix(&opts.log, &opts.out);
    let mut files = BTreeMap::new();
    let mut runs: Vec<RunView> = Vec::new();
    for (run_id, recs) in by_run.iter().rev() {
        let first = recs[0];
        let mut tables: Vec<Table> = Vec::new();
        for r in recs {
            let slug = model::slug(&r.experiment);
            match tables.iter_mut().find(|t| t.experiment == r.experiment) {
                Some(t) => t.rows.push(model::row(r, &peers)),
                None => tables.push(Table { experiment: r.experiment.clone(), slug, rows: vec![model::row(r, &peers)] }),
            }
        }
        let mut figures = Vec::new();
        let mut add = |experiment: Option<&str>, what: &str, title: String, svg: Option<String>| {
            if let Some(svg) = svg {
                let name = experiment.map_or(what.to_string(), |e| format!("{e}-{what}"));
                let path = format!("figures/{}", charts::figure_name(run_id, &name));
                files.insert(opts.out.join(&path), svg.clone());
                let experiment = experiment.map(str::to_string);
                figures.push(Figure { title, md_path: format!("{md_prefix}{path}"), path, svg, experiment });
            }
        };
        add(None, "roofline", format!("Roofline, {}", first.device.name), charts::roofline(recs, &first.device.name));
        for t in &tables {
            let e = Some(t.experiment.as_str());
            add(e, "speedup", format!("{}: speed-up over peers", t.experiment), charts::speedups(recs, &t.experiment));
            add(e, "scaling", format!("{}: throughput against size", t.experiment), charts::scaling(recs, &t.experiment, sweep_axis(&t.experiment)));
        }
        let run = RunView {
            run_id: run_id.to_string(),
            date: first.time.clone(),
            device: first.device.name.clone(),
            backend: first.backend.clone(),
            commit: first.git.commit.chars().take(12).collect(),
            dirty: first.git.dirty,
            command: first.command.clone(),
            notes: notes.iter().filter(|(ids, _)| ids.iter().any(|i| i == run_id)).map(|(_, n)| n.clone()).collect(),
            tables,
            figures,
        };
        runs.push(run);
    }

    let findings = model::findings(&records);
    let mut experiments: Vec<ExperimentLink> = Vec::new();
    for r in &records {
        if !experiments.iter().any(|e| e.name == r.experiment) {
            experiments.push(ExperimentLink { name: r.experiment.clone(), slug: model::slug(&r.experiment) });
        }
    }
    experiments.sort_by(|a, b| a.name.cmp(&b.name));
    let has_gpu_run = records.iter().any(|r| r.backend == "cuda");
    let tera = templates(&opts.templates)?;
    let history = model::history(&records);
    let site = |experiment: Option<&str>, runs: &[RunView], findings: &[model::Finding]| -> Result<String> {
        let history: Vec<model::History> = history.iter().filter(|h| experiment.is_none_or(|e| h.experiment == e)).cloned().collect();
        let cross = model::cross_device(findings);
        let ctx = SiteContext { experiments: &experiments, warnings: &warnings, findings, history: &history, cross: &cross, runs, has_gpu_run, experiment };
        render_one(&tera, if experiment.is_some() { "experiment.html" } else { "index.html" }, &ctx)
    };
    files.insert(opts.out.join("index.html"), site(None, &runs, &findings)?);
    for e in &experiments {
        let only: Vec<RunView> = runs
            .iter()
            .filter(|r| r.tables.iter().any(|t| t.experiment == e.name))
            .map(|r| RunView {
                tables: r.tables.iter().filter(|t| t.experiment == e.name).cloned().collect(),
                figures: r.figures.iter().filter(|f| f.experiment.as_ref().is_none_or(|x| *x == e.name)).cloned().collect(),
                ..r.clone()
            })
            .collect();
        let fs: Vec<model::Finding> = findings.iter().filter(|f| f.experiment == e.name).cloned().collect();
        files.insert(opts.out.join(format!("{}.html", e.slug)), site(Some(&e.name), &only, &fs)?);
    }
    let cross = model::cross_device(&findings);
    let ctx = SiteContext { experiments: &experiments, warnings: &warnings, findings: &findings, history: &history, cross: &cross, runs: &runs, has_gpu_run, experiment: None };
    files.insert(opts.log.clone(), render_one(&tera, "research_log.md", &ctx)?);
    Ok(Rendered { files, warnings })
}

/// The parameter an experiment sweeps (from the registry); bytes moved for unknown ones.
fn sweep_axis(experiment: &str) -> &'static str {
    crate::experiment::find(experiment).map(|e| e.sweep_axis()).unwrap_or("bytes")
}

/// `reports/` when the log sits beside the reports folder: how the log links to figures.
fn relative_prefix(log: &Path, out: &Path) -> String {
    let base = log.parent().unwrap_or(Path::new(""));
    let rel = out.strip_prefix(base).unwrap_or(out);
    let s = rel.to_string_lossy().to_string();
    if s.is_empty() { String::new() } else { format!("{s}/") }
}

impl Rendered {
    /// Writes every file, and removes figures a fresh render no longer makes.
    pub fn write(&self, opts: &ReportOptions) -> Result<()> {
        for (path, content) in &self.files {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| LabError::io(dir, e))?;
            }
            std::fs::write(path, content).map_err(|e| LabError::io(path, e))?;
        }
        for stale in self.stale_figures(opts) {
            std::fs::remove_file(&stale).map_err(|e| LabError::io(&stale, e))?;
        }
        Ok(())
    }

    /// What differs between this render and the committed files on disk (empty: up to date):
    /// the log and the figures. The HTML pages are not committed (each embeds every figure
    /// and table again, megabytes per run); `report` renders them where it is run.
    pub fn check(&self, opts: &ReportOptions) -> Vec<String> {
        let mut diffs: Vec<String> = self
            .files
            .iter()
            .filter(|(path, _)| path.extension().is_none_or(|x| x != "html"))
            .filter(|(path, content)| std::fs::read_to_string(path).ok().as_deref() != Some(content.as_str()))
            .map(|(path, _)| format!("{} is missing or out of date", path.display()))
            .collect();
        diffs.extend(self.stale_figures(opts).into_iter().map(|p| format!("{} is no longer rendered", p.display())));
        diffs
    }

    fn stale_figures(&self, opts: &ReportOptions) -> Vec<PathBuf> {
        let dir = opts.out.join("figures");
        let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
        let mut stale: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "svg") && !self.files.contains_key(p))
            .collect();
        stale.sort();
        stale
    }
}
