//! The report: golden files on a small fixture (a CPU run with a damaged line and a hostile
//! record, a GPU run, notes), determinism, escaping, the empty case, the committed outputs, and a
//! real browser loading the HTML.

use lab::report::{render, ReportOptions};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn fixture_opts(out: &Path) -> ReportOptions {
    let f = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/report");
    ReportOptions {
        records: f.join("records"),
        notes: f.join("notes"),
        templates: root().join("templates"),
        out: out.to_path_buf(),
        log: out.join("research_log.md"),
        // Fixed, so an edit to a kernel does not change the golden files.
        kernels: [("softmax", "0123456789abcdef"), ("vector_add", "fedcba9876543210")].into_iter().map(|(f, h)| (f.to_string(), h.to_string())).collect(),
    }
}

#[test]
fn fixture_renders_to_the_golden_files() {
    let out = tempfile::tempdir().unwrap();
    let rendered = render(&fixture_opts(out.path())).unwrap();
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/report/golden");
    for name in ["index.html", "research_log.md", "vector_add.html"] {
        let got = &rendered.files[&out.path().join(name)];
        let path = golden.join(name);
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, got).unwrap();
        }
        let want = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(got == &want, "{name} differs from {} (rerun with UPDATE_GOLDEN=1 and review the diff)", path.display());
    }
}

#[test]
fn rendering_twice_gives_identical_bytes() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (ra, rb) = (render(&fixture_opts(a.path())).unwrap(), render(&fixture_opts(a.path())).unwrap());
    assert_eq!(ra.files, rb.files);
    let rc = render(&fixture_opts(b.path())).unwrap();
    assert_eq!(ra.files.len(), rc.files.len());
    assert!(ra.files.keys().any(|p| p.to_string_lossy().contains("figures/roofline-")));
}

#[test]
fn record_values_are_escaped_and_problems_are_visible() {
    let out = tempfile::tempdir().unwrap();
    let r = render(&fixture_opts(out.path())).unwrap();
    let html = &r.files[&out.path().join("index.html")];
    assert!(!html.contains("<script>alert(1)</script>"), "a record's markup reached the page");
    assert!(html.contains("&lt;script&gt;alert(1)&lt;&#x2F;script&gt;") || html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(!html.contains("<b>Raw HTML shows as text.</b>"), "raw HTML in a note must not pass through");
    // The damaged line and the orphan note are warned about, and the good records still render.
    for w in ["damaged record line", ":2: not JSON", "orphan.md names run 2020-01-01T00-00-00Z-nowhere-0000000"] {
        assert!(r.warnings.iter().any(|x| x.contains(w)), "no warning containing {w:?}: {:?}", r.warnings);
        assert!(html.contains(&w.replace('/', "&#x2F;")) || html.contains(w), "warning {w:?} not on the page");
    }
    let md = &r.files[&out.path().join("research_log.md")];
    assert!(md.contains("a\\|b"), "a pipe in a value must not break the markdown table");
    assert!(md.contains("onchip_block_per_row"));
    // The log rendered as a Markdown viewer would: the hostile name shows as text, no tag.
    let mut rendered = String::new();
    pulldown_cmark::html::push_html(&mut rendered, pulldown_cmark::Parser::new_ext(md, pulldown_cmark::Options::ENABLE_TABLES));
    assert!(rendered.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "the hostile variant is not in the log");
    assert!(!rendered.contains("<script"), "a record's markup reached the rendered log");
    // A note is shown once, by its status; its page holds the rest, raw HTML as text.
    assert_eq!(md.matches("The report shows this paragraph once").count(), 1);
    assert!(!md.contains("Does the report show a note beside its run?"));
    let page = &r.files[&out.path().join("note-gpu.html")];
    assert!(page.contains("Does the report show a note beside its run?") && page.contains("&lt;b&gt;Raw HTML"));
}

/// The fixture's newest H100 run reran `scalar` at n = 16777216 30% slower than the run before:
/// the log must keep the older, faster figure as scalar's best, with that run's peer.
#[test]
fn the_best_figure_over_all_runs_leads_even_when_the_newest_run_is_slower() {
    let out = tempfile::tempdir().unwrap();
    let r = render(&fixture_opts(out.path())).unwrap();
    let md = &r.files[&out.path().join("research_log.md")];
    let h100 = md.find("**NVIDIA H100 80GB HBM3**").expect("an H100 section");
    let table = &md[h100..][md[h100..].find("`dtype=f32 n=16777216`").expect("the headline shape")..];
    let rows: Vec<&str> = table.lines().skip(4).take_while(|l| l.starts_with('|')).collect();
    let scalar: Vec<&&str> = rows.iter().filter(|l| l.starts_with("| `scalar` |")).collect();
    assert_eq!(scalar.len(), 1, "{table}");
    assert!(scalar[0].contains("2026-11-22T15-00-00Z-h100-5e5e5e5"), "not the faster older run: {}", scalar[0]);
    // 3 x 4 x 16777216 bytes in 0.0796 ms; torch took 0.0702 ms in that run.
    assert!(scalar[0].contains("| 2528.7 |") && scalar[0].contains("| 0.88x |"), "{}", scalar[0]);
    assert!(rows[0].starts_with("| `float4_grid_stride` |"), "fastest first: {rows:?}");
    // The untimed gates of that run are counted, not listed.
    assert!(md.contains("1 of 2 passed over 1 run(s); the worst is 3.50 of its tolerance"), "{md}");
    assert!(!md.contains("`dtype=f32 n=1003 timed=false` ("), "an untimed gate got a table");
}

#[test]
fn nothing_to_show_is_said_in_words() {
    let out = tempfile::tempdir().unwrap();
    let empty = tempfile::tempdir().unwrap();
    let opts = ReportOptions { records: empty.path().to_path_buf(), notes: empty.path().join("none"), ..fixture_opts(out.path()) };
    let r = render(&opts).unwrap();
    let html = &r.files[&out.path().join("index.html")];
    assert!(html.contains("No records yet"), "{html}");
    assert!(html.contains("No GPU run yet"));
    assert!(r.files[&out.path().join("research_log.md")].contains("No timed, passing records yet"));
}

#[test]
fn committed_report_is_up_to_date() {
    let o = Command::new(env!("CARGO_BIN_EXE_report")).arg("--check").current_dir(root()).output().unwrap();
    assert!(o.status.success(), "{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let size = std::fs::metadata(root().join("research_log.md")).unwrap().len();
    assert!(size < 300_000, "research_log.md is {size} bytes: an index a person reads stays under 300 KB");
}

/// Headless Chromium, the flags every call takes, and a fresh profile (kept alive by the caller).
struct Browser {
    bin: &'static str,
    profile: tempfile::TempDir,
}

const FLAGS: [&str; 10] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
];

impl Browser {
    fn new() -> Browser {
        let bin = ["chromium", "chromium-browser", "google-chrome"]
            .into_iter()
            .find(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))
            .expect("headless Chromium is needed for this test: scripts/test.sh installs Debian's `chromium`");
        Browser { bin, profile: tempfile::tempdir().unwrap() }
    }

    fn command(&self) -> Command {
        let mut c = Command::new(self.bin);
        c.args(FLAGS).arg(format!("--user-data-dir={}", self.profile.path().display())).arg("--hide-scrollbars");
        c
    }

    /// The DOM after the page's scripts ran, and Chromium's log.
    fn dom(&self, page: &Path) -> (String, String) {
        let o = self.command().arg("--allow-file-access-from-files").arg("--dump-dom").arg(format!("file://{}", page.display())).output().unwrap();
        (String::from_utf8_lossy(&o.stdout).to_string(), String::from_utf8_lossy(&o.stderr).to_string())
    }

    fn screenshot(&self, page: &Path, shot: &Path, (w, h): (u32, u32)) {
        let o = self
            .command()
            .arg(format!("--screenshot={}", shot.display()))
            .arg(format!("--window-size={w},{h}"))
            .arg(format!("file://{}", page.display()))
            .output()
            .unwrap();
        assert!(o.status.success() && shot.is_file(), "{}", String::from_utf8_lossy(&o.stderr));
    }
}

/// The text of `<pre id="result">` in a dumped DOM, unescaped.
fn result_of(dom: &str) -> String {
    let start = dom.find("<pre id=\"result\">").expect("a result block") + "<pre id=\"result\">".len();
    let end = start + dom[start..].find("</pre>").expect("the block's end");
    dom[start..end].replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
}

/// Headless Chromium opens the report of the committed records, rendered from disk: the page's
/// script must run to the end (it marks <body> when done) with no uncaught error; on a laptop's
/// first screen (1366 x 768) the index shows the roofline whole and each experiment's page its
/// ladder; screenshots are kept.
#[test]
fn report_loads_in_a_real_browser() {
    let browser = Browser::new();
    let site = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_report")).arg("--out").arg(site.path()).arg("--log").arg(site.path().join("research_log.md")).current_dir(root()).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let shots = root().join("target/report-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let (html, log) = browser.dom(&site.path().join("index.html"));
    assert!(html.contains("data-ready=\"yes\""), "the page script did not finish:\n{log}");
    assert!(!log.contains("Uncaught"), "console error:\n{log}");
    browser.screenshot(&site.path().join("index.html"), &shots.join("index.png"), (1400, 2200));
    // The first screen: each page in a frame of a laptop's size, its first figure measured.
    let pages = ["index.html", "gemm.html", "softmax.html", "vector_add.html"];
    let frames: String = pages.iter().map(|p| format!("<iframe src=\"{p}\" width=\"1366\" height=\"768\"></iframe>\n")).collect();
    let probe = site.path().join("first-screen.html");
    std::fs::write(
        &probe,
        format!(
            r#"<!doctype html><html><body style="margin:0">{frames}<pre id="result"></pre><script>
window.addEventListener("load", function () {{
  var out = [];
  document.querySelectorAll("iframe").forEach(function (f) {{
    var d = f.contentDocument, fig = d.querySelector("figure"), table = d.querySelector("table");
    var b = fig ? fig.querySelector("svg").getBoundingClientRect() : null;
    out.push({{page: f.getAttribute("src"), top: b ? b.top : -1, bottom: b ? b.bottom : -1, width: b ? b.width : -1,
      title: fig ? fig.querySelector("svg text").textContent.trim() : "",
      figure_first: !!fig && (!table || !!(fig.compareDocumentPosition(table) & Node.DOCUMENT_POSITION_FOLLOWING))}});
  }});
  document.getElementById("result").textContent = JSON.stringify(out);
}});
</script></body></html>"#
        ),
    )
    .unwrap();
    let (dom, log) = browser.dom(&probe);
    let seen: Vec<serde_json::Value> = serde_json::from_str(&result_of(&dom)).unwrap_or_else(|e| panic!("{e}: {dom}\n{log}"));
    assert_eq!(seen.len(), pages.len(), "{seen:?}");
    for p in &seen {
        let page = p["page"].as_str().unwrap();
        let title = p["title"].as_str().unwrap();
        assert!(p["figure_first"].as_bool().unwrap(), "{page} opens with a table, not its figure");
        let want = if page == "index.html" { "Roofline" } else { "the ladder" };
        assert!(title.contains(want), "{page} opens with `{title}`, not its {want}");
        let (top, bottom) = (p["top"].as_f64().unwrap(), p["bottom"].as_f64().unwrap());
        assert!(top >= 0.0 && bottom <= 768.0 && p["width"].as_f64().unwrap() > 600.0, "{page}: its figure is not on the first screen: {p}");
    }
    for page in ["index", "gemm"] {
        browser.screenshot(&site.path().join(format!("{page}.html")), &shots.join(format!("{page}-first-screen.png")), (1366, 768));
    }
}

/// Every chart type, drawn from a fixture (two H100 runs: `lab run all --quick` and a GEMM sweep
/// with every ceiling, raw samples cut to five) and, for the roofline the report leads with,
/// from every committed H100 record, then every committed figure, opened in headless Chromium: each fits a laptop screen with
/// nothing drawn outside it and no text under 11 px, a legend lists no more than it should (a
/// roofline's: its families and dtypes, never variants), every point and bar has its hover
/// title, and no marker is drawn outside one. A screenshot of each is kept in
/// target/report-screenshots/charts/ for a person to look at.
#[test]
fn charts_fit_a_laptop_screen_in_a_real_browser() {
    use lab::record::Record;
    use lab::report::charts::{self, RooflinePoint};
    let browser = Browser::new();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/charts");
    let (records, damage) = lab::record::read_records(&fixture).unwrap();
    assert!(damage.is_empty(), "{damage:?}");
    let device = "NVIDIA H100 80GB HBM3";
    let recs: Vec<&Record> = records.iter().filter(|r| r.device.name == device).collect();
    let (committed, _) = lab::record::read_records(&root().join("reports/records")).unwrap();
    let all_h100: Vec<&Record> = committed.iter().filter(|r| r.device.name == device).collect();
    // A roofline's legend: one entry per family and per marker (dtypes outside f32, f16 and bf16
    // share one).
    let legend_of = |points: &[RooflinePoint], families: bool| {
        let mut f: Vec<&str> = points.iter().map(|p| p.family.as_str()).collect();
        f.sort();
        f.dedup();
        let mut d: Vec<&str> = points.iter().map(|p| if ["f32", "f16", "bf16"].contains(&p.dtype.as_str()) { p.dtype.as_str() } else { "other" }).collect();
        d.sort();
        d.dedup();
        if families { f.len() + d.len() } else { d.len() }
    };
    let views = lab::report::findings::experiments(&records, &[]);
    let lead = |e: &str| {
        let d = views.iter().find(|v| v.name == e).unwrap().devices.iter().find(|d| d.device == device).unwrap();
        d.lead.clone().expect("a status figure")
    };
    let points = charts::roofline_points(&recs);
    let gemm: Vec<RooflinePoint> = points.iter().filter(|p| p.family == "gemm").cloned().collect();
    let all_points = charts::roofline_points(&all_h100);
    let (g, s) = (lead("gemm"), lead("softmax"));
    let gemm_run: Vec<&Record> = recs.iter().copied().filter(|r| r.run_id == g.run_id).collect();
    // (name, svg, points expected (None: at least one), legend entries at most)
    let mut charts: Vec<(String, Option<String>, Option<usize>, usize)> = vec![
        ("roofline".into(), charts::roofline(&recs, device), Some(points.len()), legend_of(&points, true)),
        ("roofline-committed-h100".into(), charts::roofline(&all_h100, device), Some(all_points.len()), legend_of(&all_points, true)),
        ("roofline-gemm".into(), charts::family_roofline(&recs, device, "gemm"), Some(gemm.len()), legend_of(&gemm, false)),
        ("ladder-gemm".into(), charts::ladder(&recs, "gemm", &g.shape, &g.mode), None, 3),
        ("ladder-softmax".into(), charts::ladder(&recs, "softmax", &s.shape, &s.mode), None, 3),
        ("speedups-gemm".into(), charts::speedups(&gemm_run, "gemm"), None, 0),
        ("speedups-quant".into(), charts::speedups(&recs, "quant"), None, 0),
        ("scaling-gemm".into(), charts::scaling(&gemm_run, "gemm", "m"), None, 8),
        ("scaling-softmax".into(), charts::scaling(&recs, "softmax", "cols"), None, 8),
    ];
    let drawn = charts.len();
    // And every committed figure, held to the same size, text and titles (not screenshot).
    let mut committed_figures: Vec<PathBuf> = std::fs::read_dir(root().join("reports/figures")).unwrap().flatten().map(|e| e.path()).collect();
    committed_figures.sort();
    for f in committed_figures.iter().filter(|f| f.extension().is_some_and(|x| x == "svg")) {
        let name = format!("committed/{}", f.file_name().unwrap().to_string_lossy());
        // At most one legend row per family with kernels, per marker (4) and the design star.
        let cap = lab::family::with_kernels().count() + 5;
        charts.push((name, Some(std::fs::read_to_string(f).unwrap()), None, cap));
    }
    let shots = root().join("target/report-screenshots/charts");
    std::fs::create_dir_all(&shots).unwrap();
    let mut figures = String::new();
    for (i, (name, svg, ..)) in charts.iter().enumerate() {
        let svg = svg.as_ref().unwrap_or_else(|| panic!("{name}: no chart drawn from the fixture"));
        if i < drawn {
            std::fs::write(shots.join(format!("{name}.svg")), svg).unwrap();
        }
        figures.push_str(&format!("<figure data-name=\"{name}\">{svg}</figure>\n"));
    }
    let page = shots.join("charts.html");
    std::fs::write(&page, format!("<!doctype html><html><body style=\"margin:0\">{figures}<pre id=\"result\"></pre><script>{MEASURE}</script></body></html>")).unwrap();
    let (dom, log) = browser.dom(&page);
    let seen: Vec<serde_json::Value> = serde_json::from_str(&result_of(&dom)).unwrap_or_else(|e| panic!("{e}:\n{log}"));
    assert_eq!(seen.len(), charts.len());
    for (i, ((name, _, points, legend), m)) in charts.iter().zip(&seen).enumerate() {
        assert_eq!(m["name"].as_str(), Some(name.as_str()));
        let (w, h) = (m["width"].as_u64().unwrap(), m["height"].as_u64().unwrap());
        assert!(w <= 1000 && h <= 700, "{name} is {w} x {h}: larger than a laptop screen");
        assert!(m["outside"].as_array().unwrap().is_empty(), "{name}: drawn outside its {w} x {h}: {}", m["outside"]);
        assert!(m["min_font"].as_f64().unwrap() >= 11.0, "{name}: text of {} px", m["min_font"]);
        let n = m["points"].as_u64().unwrap() as usize;
        match points {
            Some(p) => assert_eq!(n, *p, "{name}: {n} points drawn, {p} expected"),
            None => assert!(n >= 1, "{name}: {n} points"),
        }
        assert_eq!(m["untitled"].as_u64(), Some(0), "{name}: points without a hover title");
        assert_eq!(m["stray"].as_u64(), Some(0), "{name}: markers outside a point or the legend");
        let entries = m["legend"].as_u64().unwrap() as usize;
        assert!(entries <= *legend, "{name}: {entries} legend entries, at most {legend} expected");
        if i < drawn {
            browser.screenshot(&shots.join(format!("{name}.svg")), &shots.join(format!("{name}.png")), (w as u32, h as u32));
        }
    }
}

/// Measures every `<figure>`'s SVG in the page and writes the findings as JSON into
/// `<pre id="result">`.
const MEASURE: &str = r#"
var out = [];
document.querySelectorAll("figure").forEach(function (fig) {
  var svg = fig.querySelector("svg"), box = svg.getBoundingClientRect();
  var outside = [];
  svg.querySelectorAll("text, circle, rect, polygon, polyline, line, path").forEach(function (el) {
    var b = el.getBoundingClientRect();
    if (b.width === 0 && b.height === 0) return;
    if (b.left < box.left - 1 || b.top < box.top - 1 || b.right > box.right + 1 || b.bottom > box.bottom + 1)
      outside.push(el.tagName + " " + (el.textContent || "").trim().slice(0, 40));
  });
  var fonts = Array.from(svg.querySelectorAll("text")).map(function (t) { return parseFloat(getComputedStyle(t).fontSize); });
  var points = svg.querySelectorAll("g.point");
  var untitled = Array.from(points).filter(function (g) {
    var t = g.querySelector(":scope > title");
    return !t || !t.textContent.trim();
  }).length;
  var stray = Array.from(svg.querySelectorAll("circle, polygon")).filter(function (el) {
    return !el.closest("g.point, g.legend, g.band");
  }).length;
  out.push({name: fig.dataset.name, width: +svg.getAttribute("width"), height: +svg.getAttribute("height"), outside: outside,
    min_font: Math.min.apply(null, fonts), points: points.length, untitled: untitled,
    legend: svg.querySelectorAll("g.legend-entry").length, stray: stray});
});
document.getElementById("result").textContent = JSON.stringify(out);
"#;

/// Every headline an experiment declares matches some committed record of a full sweep of it (a
/// misspelt key or value would silently lead with nothing); an experiment measured only by quick
/// sweeps, whose shapes are small on purpose, has none yet.
#[test]
fn every_declared_headline_matches_a_committed_record() {
    let (records, _) = lab::record::read_records(&root().join("reports/records")).unwrap();
    for exp in lab::experiment::registry() {
        let own: Vec<&lab::record::Record> = records.iter().filter(|r| r.experiment == exp.name() && r.time_ms.is_some() && !r.quick).collect();
        if own.is_empty() {
            continue;
        }
        for spec in exp.headlines() {
            assert!(own.iter().any(|r| lab::report::findings::matches(&r.params, spec)), "{}: headline `{spec}` matches no timed record", exp.name());
        }
    }
}
