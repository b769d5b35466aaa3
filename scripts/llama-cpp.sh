#!/usr/bin/env bash
# llama.cpp, the inference peer, from the sources that llama-cpp-python 0.3.36's sdist vendors.
#   scripts/llama-cpp.sh fetch OUT.tar.gz   (a machine with PyPI) download the sdist, keep
#                                           vendor/llama.cpp without models, docs, tests, the web
#                                           UI and the non-CUDA ggml backends (~5 MB)
#   scripts/llama-cpp.sh build TAR DIR [cpu] (the GPU host) unpack and build the CUDA tools for
#                                           sm_90 into DIR/build/bin (a few minutes on 16 cores);
#                                           with `cpu`, the CPU backend only, on any machine
#                                           (~15 minutes on 2 cores), for loading and perplexity
set -euo pipefail
case "${1:-}" in
fetch)
    out=$(realpath -m "${2:?usage: llama-cpp.sh fetch OUT.tar.gz}")
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    python3 -m venv "$work/venv"
    "$work/venv/bin/pip" -q install scikit-build-core cmake ninja
    "$work/venv/bin/pip" -q download --no-deps --no-binary :all: --no-build-isolation llama-cpp-python==0.3.36 -d "$work"
    tar xzf "$work"/llama_cpp_python-0.3.36.tar.gz -C "$work"
    src="$work/llama_cpp_python-0.3.36/vendor/llama.cpp"
    rm -rf "$src"/{docs,models,media,benches,tests,pocs,examples,gguf-py,scripts,conversion,skills,.github,app,tools/ui}
    for b in cann et hexagon hip metal musa opencl openvino rpc sycl virtgpu vulkan webgpu zdnn zendnn; do rm -rf "$src/ggml/src/ggml-$b"; done
    tar czf "$out" -C "$(dirname "$src")" llama.cpp
    ls -la "$out"
    ;;
build)
    tarball=$(realpath "${2:?usage: llama-cpp.sh build TAR DIR}")
    dir=${3:?usage: llama-cpp.sh build TAR DIR [cpu]}
    backend=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
    # The CPU build targets AVX2 rather than -march=native: a host that reports AMX without
    # granting its tile state kills llama.cpp's quantized products with SIGILL (tilezero).
    [ "${4:-}" = cpu ] && backend=(-DGGML_CUDA=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
    mkdir -p "$dir"
    tar xzf "$tarball" -C "$dir"
    gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
    cmake -S "$dir/llama.cpp" -B "$dir/build" "${gen[@]}" "${backend[@]}" -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF >"$dir/configure.log"
    cmake --build "$dir/build" -j"$(nproc)" --target llama-bench llama-completion llama-perplexity llama-tokenize >"$dir/build.log"
    ls "$dir/build/bin"
    ;;
*)
    echo "usage: llama-cpp.sh fetch OUT.tar.gz | build TAR DIR [cpu]" >&2
    exit 2
    ;;
esac
