#!/usr/bin/env bash
# The GPU test pass: every variant of every family on its quick sweep (the untimed gates at odd
# shapes and hostile values, then small timed shapes, each checked against its reference), then
# compute-sanitizer over the same experiments. Exits non-zero if any check failed or the sanitizer
# found anything in the lab's kernels. Every record names the hash of the kernel sources it ran:
# the report's Verification section compares them with the committed kernels.
# usage: scripts/gpu-test-pass.sh OUT_DIR [EXPERIMENT...]   (llama needs LAB_SMOLLM2_GGUF)
# The sanitizer runs LAB_SANITIZE_JOBS processes side by side (default: one per core but one):
# gemm's racecheck alone is ~110 processes of 10-160 s each.
set -uo pipefail
out=${1:?usage: gpu-test-pass.sh OUT_DIR [EXPERIMENT...]}
shift
bin=${LAB_BIN:-target/release/lab}
mkdir -p "$out"
failed=()
"$bin" run "${@:-all}" --quick --out "$out" 2>&1 | tee "$out/test-pass-run.log"
[[ ${PIPESTATUS[0]} == 0 ]] || failed+=("checks")
jobs=${LAB_SANITIZE_JOBS:-$(( $(nproc) > 2 ? $(nproc) - 1 : 1 ))}
"$bin" sanitize "$@" --jobs "$jobs" --out "$out" 2>&1 | tee "$out/test-pass-sanitize.log"
[[ ${PIPESTATUS[0]} == 0 ]] || failed+=("sanitizer")
if (( ${#failed[@]} )); then
  echo "GPU test pass FAILED: ${failed[*]} (logs and records in $out)" >&2
  exit 1
fi
echo "GPU test pass: every check passed and the sanitizer found nothing in the lab's kernels"
