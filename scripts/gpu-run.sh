#!/usr/bin/env bash
# One run on a GPU host: `lab doctor`, `lab run` with torch peers, then `lab sanitize` over the
# same experiments; records land in OUT_DIR.
# usage: scripts/gpu-run.sh OUT_DIR [EXPERIMENT...] [lab run flags...]
set -euo pipefail
out=${1:?usage: gpu-run.sh OUT_DIR [EXPERIMENT] [flags...]}
shift
bin=${LAB_BIN:-target/release/lab}
mkdir -p "$out"
"$bin" doctor | tee "$out/doctor.txt"
"$bin" run "${@:-all}" --peers torch --out "$out" 2>&1 | tee "$out/run.log"
# The experiments named before the first flag (all when none or `all`).
exps=()
for a in "$@"; do
  [[ $a == -* ]] && break
  [[ $a == all ]] || exps+=("$a")
done
# LAB_SANITIZE_JOBS sanitizer processes side by side (default: one per core but one).
jobs=${LAB_SANITIZE_JOBS:-$(( $(nproc) > 2 ? $(nproc) - 1 : 1 ))}
"$bin" sanitize ${exps[@]+"${exps[@]}"} --jobs "$jobs" --out "$out" 2>&1 | tee "$out/sanitize.log"
