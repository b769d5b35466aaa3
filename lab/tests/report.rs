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
    assert!(ra.files.keys().any(|p| p.to_string_lossy().ends_with("roofline.svg")));
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
    assert!(md.contains("cpu_parallel") && md.contains("onchip_block_per_row"));
    assert!(md.contains("Does the report show a note beside its run?"));
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
