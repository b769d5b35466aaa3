//! `lab doctor`: what this machine offers the lab, and what is missing, in plain words.

use std::process::Command;

fn line(what: &str, found: Result<String, String>) {
    match found {
        Ok(s) => println!("  ok       {what:<10} {s}"),
        Err(s) => println!("  missing  {what:<10} {s}"),
    }
}

fn run(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd).args(args).output().map_err(|e| format!("`{cmd}` not found ({e})"))?;
    let text = String::from_utf8_lossy(if out.stdout.is_empty() { &out.stderr } else { &out.stdout }).trim().to_string();
    if out.status.success() {
        Ok(text.lines().next().unwrap_or_default().to_string())
    } else {
        Err(format!("`{cmd}` failed: {}", text.lines().last().unwrap_or_default()))
    }
}

pub fn print() {
    println!("lab {} (commit {})", env!("CARGO_PKG_VERSION"), crate::record::git_info().commit);
    let gpu = crate::gpu::Gpu::new(0);
    line(
        "GPU",
        gpu.as_ref()
            .map(|g| {
                let i = &g.info;
                format!("{} (sm_{}, {} SMs, {:.0} GiB, L2 {} MiB)", i.name, g.arch, i.sm_count, i.memory_bytes as f64 / (1u64 << 30) as f64, i.l2_bytes >> 20)
            })
            .map_err(|e| format!("{e}; `lab run` will use the CPU backend")),
    );
    line(
        "driver",
        gpu.as_ref().map(|g| format!("{} (CUDA {})", g.info.driver, g.info.cuda)).map_err(|_| "no CUDA driver in use".into()),
    );
    line(
        "NVRTC",
        crate::gpu::compile::nvrtc_version().map(|(a, b)| format!("{a}.{b}")).map_err(|e| e.to_string()),
    );
    line(
        "headers",
        crate::gpu::compile::cuda_include_dir()
            .map(|p| p.display().to_string())
            .ok_or_else(|| "cuda_bf16.h not found: set LAB_CUDA_INCLUDE or CUDA_HOME".into()),
    );
    // SAFETY: only probes the dynamic loader.
    let cublas = unsafe { cudarc::cublas::sys::is_culib_present() };
    line(
        "cuBLAS",
        if cublas { Ok("libcublas loadable".into()) } else { Err("libcublas.so.13 not found: the tensor ceiling cannot run".into()) },
    );
    line("MPI", run("mpirun", &["--version"]).map_err(|e| format!("{e}; collectives need Open MPI")));
    line(
        "collective",
        if cfg!(feature = "mpi") {
            Ok("built with `--features mpi`: Open MPI transport and MPI_Allreduce peer".into())
        } else {
            Err("built without `--features mpi`: thread transport only (rebuild with it to run under mpirun)".into())
        },
    );
    let py = super::peers::python();
    line(
        "torch",
        run(&py, &["-c", "import torch; print(torch.__version__, 'cuda' if torch.cuda.is_available() else 'cpu-only')"])
            .map_err(|e| format!("{e}; `--peers torch` needs {py} with PyTorch")),
    );
}
