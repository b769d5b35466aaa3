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
    assert!(html.contains("<b>Raw HTML shows as text.</b>") == false, "raw HTML in a note must not pass through");
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

/// Headless Chromium opens the report of the committed records, rendered from disk: the page's
/// script must run to the end (it marks <body> when done) with no uncaught error, and a
/// screenshot is kept.
#[test]
fn report_loads_in_a_real_browser() {
    let chromium = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))
        .expect("headless Chromium is needed for this test: scripts/test.sh installs Debian's `chromium`");
    let site = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_report")).arg("--out").arg(site.path()).arg("--log").arg(site.path().join("research_log.md")).current_dir(root()).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let page = format!("file://{}", site.path().join("index.html").display());
    let shots = root().join("target/report-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let profile = tempfile::tempdir().unwrap();
    let common = [
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
    let user_dir = format!("--user-data-dir={}", profile.path().display());
    let dom = Command::new(chromium).args(common).arg(&user_dir).arg("--dump-dom").arg(&page).output().unwrap();
    let log = String::from_utf8_lossy(&dom.stderr);
    let html = String::from_utf8_lossy(&dom.stdout);
    assert!(html.contains("data-ready=\"yes\""), "the page script did not finish:\n{log}");
    assert!(!log.contains("Uncaught"), "console error:\n{log}");
    let shot = format!("--screenshot={}", shots.join("index.png").display());
    let o = Command::new(chromium).args(common).arg(&user_dir).arg(&shot).arg("--window-size=1400,2200").arg(&page).output().unwrap();
    assert!(o.status.success() && shots.join("index.png").is_file(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Every headline an experiment declares matches some committed record of it (a misspelt key
/// or value would silently lead with nothing).
#[test]
fn every_declared_headline_matches_a_committed_record() {
    let (records, _) = lab::record::read_records(&root().join("reports/records")).unwrap();
    for exp in lab::experiment::registry() {
        let own: Vec<&lab::record::Record> = records.iter().filter(|r| r.experiment == exp.name() && r.time_ms.is_some()).collect();
        if own.is_empty() {
            continue;
        }
        for spec in exp.headlines() {
            assert!(own.iter().any(|r| lab::report::findings::matches(&r.params, spec)), "{}: headline `{spec}` matches no timed record", exp.name());
        }
    }
}
