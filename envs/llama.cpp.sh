#!/usr/bin/env bash
# llama.cpp's OpenAI-compatible server (llama-server) and its GGUF converter, for the llamacpp-*
# stacks: built from the llama.cpp source that llama-cpp-python 0.3.36's source archive on PyPI
# carries (vendor/llama.cpp, sha256-checked), because PyPI has no llama.cpp server binary and
# the package registries are all these machines reach. CPU only; about 8 minutes on 2 cores.
#
#   envs/llama.cpp.sh PREFIX   # PREFIX/bin/llama-server, PREFIX/share/llama.cpp/ (converter, vocabularies)
#
# `make llama-cpp` runs it into .venv (where the workflow looks first); on a GPU host build
# with -DGGML_CUDA=ON added to LLAMA_CMAKE_ARGS.
set -euo pipefail
PREFIX=${1:?usage: envs/llama.cpp.sh PREFIX}
PYTHON=${PYTHON:-python3}
VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$PYTHON" -m pip download -q --no-binary=:all: --no-deps "llama-cpp-python==$VERSION" -d "$work"
echo "$SHA256  $work/llama_cpp_python-$VERSION.tar.gz" | sha256sum -c --quiet -
tar -xzf "$work/llama_cpp_python-$VERSION.tar.gz" -C "$work"
src=$work/llama_cpp_python-$VERSION/vendor/llama.cpp

generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
# shellcheck disable=SC2086  # LLAMA_CMAKE_ARGS is a list
cmake -S "$src" -B "$work/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=ON ${LLAMA_CMAKE_ARGS:-} > "$work/cmake.log"
cmake --build "$work/build" --target llama-server -j "$(nproc)" > "$work/build.log" || {
  tail -n 30 "$work/build.log"
  exit 1
}

share=$PREFIX/share/llama.cpp
rm -rf "$share" && mkdir -p "$PREFIX/bin" "$share/models"
cp -r "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py" "$src/LICENSE" "$share/"
cp "$src"/models/ggml-vocab-*.gguf "$share/models/"
install -m 755 "$work/build/bin/llama-server" "$PREFIX/bin/llama-server.tmp"
mv "$PREFIX/bin/llama-server.tmp" "$PREFIX/bin/llama-server"  # whole, or not at all
"$PREFIX/bin/llama-server" --version 2>&1 | head -n 2
