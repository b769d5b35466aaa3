// Bakes the git commit and dirty flag into the binary for record provenance.
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let commit = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    // Dirty: a tracked file that builds the binary differs from the commit. The report, notes,
    // notebooks and docs do not: a report regenerated before a GPU build left every record of
    // that run marked dirty, and so out of the report's verification.
    let built = ["status", "--porcelain", "--untracked-files=no", "--", ":/", ":(top,exclude)reports", ":(top,exclude)notebooks", ":(top,exclude)*.md"];
    let dirty = git(&built).map(|s| !s.is_empty()).unwrap_or(false);
    println!("cargo:rustc-env=LAB_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=LAB_GIT_DIRTY={dirty}");
    // Sources too: the dirty flag must follow edits, not only commits.
    for p in ["../.git/HEAD", "../.git/index", "../.git/refs", "../kernels", "src", "peers", "Cargo.toml"] {
        println!("cargo:rerun-if-changed={p}");
    }
}
