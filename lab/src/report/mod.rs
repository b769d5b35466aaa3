//! The report: research_log.md and a static HTML site rendered from the records, the notes and
//! the tera templates. A pure function of its inputs: rendering twice gives the same bytes.

pub mod charts;
mod draw;
pub mod figures;
pub mod findings;
pub mod model;
pub mod safety;
pub mod show;
pub mod verified;

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
    /// The hash of each family's committed kernels, which the records' are checked against: by
    /// default those this binary embeds.
    pub kernels: BTreeMap<String, String>,
}

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions {
            records: "reports/records".into(),
            notes: "reports/notes".into(),
            templates: "templates".into(),
            out: "reports".into(),
            log: "research_log.md".into(),
            kernels: crate::kernels::hashes(crate::family::with_kernels().map(|f| f.name)),
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

#[derive(Serialize, Default, Clone, Copy)]
struct SiteContext<'a> {
    experiments: &'a [ExperimentLink],
    warnings: &'a [String],
    views: &'a [findings::ExperimentView],
    cross: Option<&'a model::CrossDevice>,
    history: &'a [model::History],
    runs: &'a [findings::RunLine],
    /// Per-run detail: the run pages and an experiment's page.
    details: &'a [RunView],
    notes: &'a [findings::NoteLink],
    has_gpu_run: bool,
    /// Set on an experiment's page.
    experiment: Option<&'a str>,
    /// Set on a note's page.
    note: Option<&'a NoteView>,
    /// Each device's roofline over all its runs.
    rooflines: &'a [Figure],
    /// How the log links to the notes folder (`reports/notes/`).
    notes_prefix: &'a str,
    /// Memory safety per family (`lab sanitize`).
    safety: &'a [safety::Family],
    /// Whether each family's committed kernels have passed on a GPU.
    verified: &'a [verified::Family],
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
        let parsed = parse_note(&text);
        match parsed {
            Ok((runs, body)) => {
                let (title, status) = title_and_status(&body);
                if status.is_empty() {
                    warnings.push(format!("note {name}: no `## Status` paragraph (the answer as it stands) under its title"));
                }
                let stem = path.file_stem().unwrap().to_string_lossy().to_string();
                let view = NoteView {
                    title: title.unwrap_or_else(|| stem.clone()),
                    status,
                    page: format!("note-{}.html", model::slug(&stem)),
                    html: markdown_to_html(&body),
                    file: name,
                };
                notes.push((runs, view))
            }
            Err(why) => warnings.push(format!("note {name}: {why}")),
        }
    }
    notes
}

/// A note's front matter (`+++` TOML naming its runs `+++`) and its Markdown body, or why not.
pub fn parse_note(text: &str) -> std::result::Result<(Vec<String>, String), String> {
    // A note saved with Windows line ends reads as the same note. Every `\r` ending a line goes,
    // not one: `\r\r\n` made `\r\n` would read differently a second time.
    let text = text.split('\n').map(|l| l.trim_end_matches('\r')).collect::<Vec<_>>().join("\n");
    // `rest` keeps the end of the opening line, so that empty front matter is found closed too.
    let rest = text.strip_prefix("+++").filter(|r| r.starts_with('\n')).ok_or("no `+++` line opening front matter that names its runs")?;
    let (front, body) = rest
        .split_once("\n+++\n")
        .or_else(|| rest.strip_suffix("\n+++").map(|front| (front, "")))
        .ok_or("no `+++` line closing its front matter")?;
    let f: FrontMatter = toml::from_str(front).map_err(|e| {
        // Counted in the note: `front` starts with the end of line 1.
        let line = 1 + e.span().map_or(0, |s| front.as_bytes()[..s.start.min(front.len())].iter().filter(|&&b| b == b'\n').count());
        format!("front matter line {line}: {}", e.message().trim_end())
    })?;
    Ok((f.runs, body.trim().to_string()))
}

/// A note's `# ` title and the first paragraph under its `## Status` heading, joined into one
/// line.
fn title_and_status(body: &str) -> (Option<String>, String) {
    let title = body.lines().find_map(|l| l.strip_prefix("# ")).map(|t| t.trim().to_string());
    let mut lines = body.lines().skip_while(|l| l.trim() != "## Status").skip(1).skip_while(|l| l.trim().is_empty());
    let mut status: Vec<&str> = Vec::new();
    for l in lines.by_ref() {
        if l.trim().is_empty() || l.starts_with('#') {
            break;
        }
        status.push(l.trim());
    }
    (title, status.join(" "))
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
    // Record values in Markdown: as text (`md`) or as a code span (`code`); neither lets a value
    // open a tag, a link or emphasis, or break a table.
    tera.register_filter("md", |s: &str, _: tera::Kwargs, _: &tera::State| md_text(s));
    tera.register_filter("code", |s: &str, _: tera::Kwargs, _: &tera::State| md_code(s));
    // A note's own Markdown (its status): kept as written, but no raw HTML.
    tera.register_filter("prose", |s: &str, _: tera::Kwargs, _: &tera::State| {
        s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('\n', " ")
    });
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

/// Text safe in a Markdown table cell: HTML's specials as entities, Markdown's punctuation
/// backslash-escaped, one line.
pub fn md_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\n' | '\r' => out.push(' '),
            '\\' | '`' | '*' | '_' | '[' | ']' | '|' | '~' | '#' | '!' => {
                out.push('\\');
                out.push(c)
            }
            c => out.push(c),
        }
    }
    out
}

/// A code span holding `s` literally (CommonMark: a fence longer than any run of backticks in
/// it), on one line, with `|` escaped as GFM tables need even inside code.
pub fn md_code(s: &str) -> String {
    let s = s.replace(['\n', '\r'], " ");
    let longest = s.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    let pad = if s.starts_with('`') || s.ends_with('`') { " " } else { "" };
    format!("{fence}{pad}{}{pad}{fence}", s.replace('|', "\\|"))
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

    let mut files = BTreeMap::new();
    let md_prefix = relative_prefix(&opts.log, &opts.out);
    // The committed figures: each device's roofline over all its runs, then for each experiment
    // and device its ladder, its roofline and the figures of the run its status figure comes from.
    // Sanitizer records have their own section, not an experiment's findings and figures.
    let measured: Vec<Record> = records.iter().filter(|r| r.experiment != safety::EXPERIMENT).cloned().collect();
    let safety = safety::families(&records);
    let verified = verified::families(&records, &opts.kernels);
    let mut views = findings::experiments(&measured, &notes);
    let mut add = |name: String, title: String, kind: &'static str, svg: Option<String>, figures: &mut Vec<Figure>| {
        if let Some(svg) = svg {
            let path = format!("figures/{name}.svg");
            files.insert(opts.out.join(&path), svg.clone());
            figures.push(Figure { title, md_path: format!("{md_prefix}{path}"), svg, kind, experiment: None });
        }
    };
    let mut rooflines = Vec::new();
    let mut by_device: BTreeMap<&str, Vec<&Record>> = BTreeMap::new();
    for r in &measured {
        by_device.entry(r.device.name.as_str()).or_default().push(r);
    }
    // Simulated hardware designs (made on the host) stand beside every device's softmax.
    let designs: Vec<&Record> = measured.iter().filter(|r| r.provider == charts::DESIGN_PROVIDER).collect();
    for (device, recs) in &by_device {
        let name = format!("roofline-{}", model::slug(device));
        let recs: Vec<&Record> = recs.iter().copied().filter(|r| r.provider != charts::DESIGN_PROVIDER).chain(designs.iter().copied()).collect();
        add(name, format!("Roofline, {device}, every run"), "roofline", charts::roofline(&recs, device), &mut rooflines);
    }
    // Per experiment and device, the figure a page opens with (the ladder at the status line's
    // shape), the family on the device's roofline, then the speed-ups and scaling of the run the
    // status figure comes from.
    for view in &mut views {
        for d in &mut view.devices {
            let Some(lead) = d.lead.clone() else { continue };
            let stem = format!("{}-{}", view.slug, model::slug(&d.device));
            let e = &view.name;
            let device = by_device.get(d.device.as_str()).map(Vec::as_slice).unwrap_or_default();
            let ladder = charts::ladder(device, e, &lead.shape, &lead.mode);
            add(format!("{stem}-ladder"), format!("{e}: each rung at {} ({})", lead.shape, lead.mode), "ladder", ladder, &mut d.figures);
            let roofline = charts::family_roofline(device, &d.device, e);
            add(format!("{stem}-roofline"), format!("{e} on the roofline, {}, every run", d.device), "roofline", roofline, &mut d.figures);
            let Some(run) = by_run.get(lead.run_id.as_str()) else { continue };
            let run_id = &lead.run_id;
            add(format!("{stem}-speedup"), format!("{e}: speed-up over peers, run {run_id}"), "speedup", charts::speedups(run, e), &mut d.figures);
            let axis = sweep_axis(e);
            add(format!("{stem}-scaling"), format!("{e}: throughput against {axis}, run {run_id}"), "scaling", charts::scaling(run, e, axis), &mut d.figures);
        }
    }

    // Per-run detail, for the HTML pages only: every table and figure of the run.
    let peers = model::best_peer_times(&records);
    let runs = findings::runs(&by_run, &notes);
    let mut details: Vec<RunView> = Vec::new();
    for line in &runs {
        let recs = &by_run[line.run_id.as_str()];
        let mut tables: Vec<Table> = Vec::new();
        for r in recs {
            match tables.iter_mut().find(|t| t.experiment == r.experiment) {
                Some(t) => t.rows.push(model::row(r, &peers)),
                None => tables.push(Table { experiment: r.experiment.clone(), slug: model::slug(&r.experiment), rows: vec![model::row(r, &peers)], scaling: None }),
            }
        }
        for t in tables.iter_mut().filter(|t| sweep_axis(&t.experiment) == "ranks") {
            t.scaling = model::scaling(recs, &t.experiment);
        }
        let mut figures = Vec::new();
        let mut inline = |experiment: Option<&str>, title: String, kind: &'static str, svg: Option<String>| {
            if let Some(svg) = svg {
                let experiment = experiment.map(str::to_string);
                figures.push(Figure { title, md_path: String::new(), svg, kind, experiment });
            }
        };
        inline(None, format!("Roofline, {}", line.device), "roofline", charts::roofline(recs, &line.device));
        for t in &tables {
            let e = Some(t.experiment.as_str());
            inline(e, format!("{}: speed-up over peers", t.experiment), "speedup", charts::speedups(recs, &t.experiment));
            let scaling = charts::scaling(recs, &t.experiment, sweep_axis(&t.experiment));
            inline(e, format!("{}: throughput against size", t.experiment), "scaling", scaling);
        }
        details.push(RunView { line: line.clone(), backend: recs[0].backend.clone(), tables, figures });
    }

    let experiments: Vec<ExperimentLink> = views.iter().map(|v| ExperimentLink { name: v.name.clone(), slug: v.slug.clone() }).collect();
    let cross = model::cross_device(&views);
    let history = model::history(&measured);
    let note_links: Vec<findings::NoteLink> = notes.iter().map(|(_, n)| findings::note_link(n)).collect();
    // Notes kept elsewhere than under the log's folder are linked by file name alone: the log
    // must not depend on where it was rendered.
    let notes_prefix = if opts.notes.starts_with(opts.log.parent().unwrap_or(Path::new(""))) { relative_prefix(&opts.log, &opts.notes) } else { String::new() };
    // Every page carries the navigation and the warnings; the index and the log the rest.
    let nav = SiteContext { experiments: &experiments, warnings: &warnings, has_gpu_run: records.iter().any(|r| r.backend == "cuda"), ..Default::default() };
    let base = SiteContext { views: &views, cross: Some(&cross), runs: &runs, notes: &note_links, rooflines: &rooflines, notes_prefix: &notes_prefix, safety: &safety, verified: &verified, ..nav };
    let tera = templates(&opts.templates)?;
    files.insert(opts.log.clone(), render_one(&tera, "research_log.md", &base)?);
    files.insert(opts.out.join("index.html"), render_one(&tera, "index.html", &base)?);
    for (i, e) in experiments.iter().enumerate() {
        let only: Vec<RunView> = details
            .iter()
            .filter(|r| r.tables.iter().any(|t| t.experiment == e.name))
            .map(|r| RunView {
                tables: r.tables.iter().filter(|t| t.experiment == e.name).cloned().collect(),
                figures: r.figures.iter().filter(|f| f.experiment.as_ref().is_some_and(|x| *x == e.name)).cloned().collect(),
                ..r.clone()
            })
            .collect();
        let history: Vec<model::History> = history.iter().filter(|h| h.experiment == e.name).cloned().collect();
        let family = crate::family::FAMILIES.iter().find(|f| f.experiment.is_some_and(|x| x.name() == e.name)).map_or(e.name.as_str(), |f| f.name);
        let safety: Vec<safety::Family> = safety.iter().filter(|s| s.name == family).cloned().collect();
        let ctx = SiteContext { views: &views[i..=i], history: &history, details: &only, experiment: Some(&e.name), safety: &safety, ..nav };
        files.insert(opts.out.join(format!("{}.html", e.slug)), render_one(&tera, "experiment.html", &ctx)?);
    }
    for run in &details {
        let ctx = SiteContext { details: std::slice::from_ref(run), ..nav };
        files.insert(opts.out.join(&run.line.page), render_one(&tera, "run_page.html", &ctx)?);
    }
    for (_, n) in &notes {
        let ctx = SiteContext { note: Some(n), ..nav };
        files.insert(opts.out.join(&n.page), render_one(&tera, "note.html", &ctx)?);
    }
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

#[cfg(test)]
mod tests {
    use super::{md_code, md_text, parse_note, title_and_status};

    #[test]
    fn record_text_cannot_open_a_tag_a_link_or_a_cell() {
        assert_eq!(md_text("<b>*x*</b> [a](b) | c\nd"), "&lt;b&gt;\\*x\\*&lt;/b&gt; \\[a\\](b) \\| c d");
        assert_eq!(md_code("a|b"), "`a\\|b`");
        // A backtick inside needs a longer fence; one at an edge needs a space.
        assert_eq!(md_code("a`b"), "``a`b``");
        assert_eq!(md_code("`x``"), "``` `x`` ```");
    }

    #[test]
    fn a_note_gives_its_title_and_first_status_paragraph() {
        let body = "# Title\n\n## Status\n\nFirst line\nsecond line.\n\nA later paragraph.\n\n## Question\n";
        assert_eq!(title_and_status(body), (Some("Title".to_string()), "First line second line.".to_string()));
        assert_eq!(title_and_status("# T\n\n## Question\n\nq"), (Some("T".to_string()), String::new()));
    }

    #[test]
    fn a_note_reads_with_windows_line_ends_and_without_a_body() {
        let runs = Ok((vec!["r1".to_string()], "# T".to_string()));
        assert_eq!(parse_note("+++\r\nruns = [\"r1\"]\r\n+++\r\n# T\r\n"), runs);
        assert_eq!(parse_note("+++\nruns = []\n+++"), Ok((vec![], String::new())));
        // Found by the `notes` fuzz target: a body that read back differently once written out.
        assert_eq!(parse_note("+++\nruns = []\n+++\na\r\r\nb"), Ok((vec![], "a\nb".to_string())));
    }

    #[test]
    fn a_bad_note_says_what_is_wrong_and_on_which_line() {
        assert_eq!(parse_note("runs = []\n"), Err("no `+++` line opening front matter that names its runs".into()));
        assert_eq!(parse_note("+++\nruns = []\n"), Err("no `+++` line closing its front matter".into()));
        assert_eq!(parse_note("+++\n+++\n# T"), Err("front matter line 1: missing field `runs`".into()));
        assert_eq!(parse_note("+++\n# a comment\nruns = [\"a\",\n  2]\n+++\n"), Err("front matter line 4: invalid type: integer `2`, expected a string".into()));
    }

    use proptest::prelude::*;

    const NOTE: &str = include_str!("../../../reports/notes/h100-sanitize.md");

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// A note damaged anywhere reads as its runs and body or as an error saying why, never a
        /// panic; its title and status are found or found missing; the note as written reads.
        #[test]
        fn a_damaged_note_is_a_warning_not_a_panic(edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8), cut in any::<prop::sample::Index>()) {
            prop_assert!(super::parse_note(NOTE).is_ok_and(|(runs, _)| runs.len() == 2));
            let mut b = NOTE.as_bytes()[..600].to_vec();
            for (at, byte) in edits {
                let i = at.index(b.len());
                b[i] = byte;
            }
            b.truncate(cut.index(b.len() + 1));
            let text = String::from_utf8_lossy(&b);
            if let Ok((_, body)) = super::parse_note(&text) {
                let _ = title_and_status(&body);
            }
        }

        #[test]
        fn any_text_is_a_note_or_an_error(text in "(\\+\\+\\+\n)?[\\PC\n]{0,300}") {
            let _ = super::parse_note(&text);
            let _ = title_and_status(&text);
        }
    }
}
