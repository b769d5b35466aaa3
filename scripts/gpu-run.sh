#!/usr/bin/env bash
# One run on a GPU host: `lab doctor`, then `lab run` with torch peers; records land in OUT_DIR.
# usage: scripts/gpu-run.sh OUT_DIR [EXPERIMENT...] [lab run flags...]
set -euo pipefail
out=${1:?usage: gpu-run.sh OUT_DIR [EXPERIMENT] [flags...]}
shift
bin=${LAB_BIN:-target/release/lab}
mkdir -p "$out"
"$bin" doctor | tee "$out/doctor.txt"
"$bin" run "${@:-all}" --peers torch --out "$out" 2>&1 | tee "$out/run.log"
