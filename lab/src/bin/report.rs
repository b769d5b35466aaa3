//! `report`: renders research_log.md and the HTML report from the records, notes and templates.

use clap::Parser;
use lab::report::{render, ReportOptions};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "report", version, about = "Render research_log.md and reports/*.html from the records")]
struct Cli {
    #[arg(long, default_value = "reports/records")]
    records: PathBuf,
    #[arg(long, default_value = "reports/notes")]
    notes: PathBuf,
    #[arg(long, default_value = "templates")]
    templates: PathBuf,
    /// Folder for the HTML pages and figures/.
    #[arg(long, default_value = "reports")]
    out: PathBuf,
    /// Where research_log.md goes.
    #[arg(long, default_value = "research_log.md")]
    log: PathBuf,
    /// Write nothing; exit 1 when the files on disk differ from a fresh render.
    #[arg(long)]
    check: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let opts = ReportOptions { records: cli.records, notes: cli.notes, templates: cli.templates, out: cli.out, log: cli.log, ..Default::default() };
    let rendered = match render(&opts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    for w in &rendered.warnings {
        eprintln!("warning: {w}");
    }
    if cli.check {
        let diffs = rendered.check(&opts);
        for d in &diffs {
            eprintln!("{d}");
        }
        if !diffs.is_empty() {
            eprintln!("the committed report is stale: run `cargo run --release --bin report`");
            return ExitCode::from(1);
        }
        println!("report is up to date ({} files)", rendered.files.len());
        return ExitCode::SUCCESS;
    }
    if let Err(e) = rendered.write(&opts) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    println!("wrote {} files", rendered.files.len());
    ExitCode::SUCCESS
}
