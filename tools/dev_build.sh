#!/usr/bin/env bash
# Developer build: compiles vllmx._C into build/dev and copies it next to the sources, so that
# `PYTHONPATH=src pytest` runs against the tree. Serialised with a lock (two cores, many hands).
set -euo pipefail
cd "$(dirname "$0")/.."
exec 9>/tmp/vllmx-build.lock
flock 9
# CPU only (VLLMX_CUDA=OFF): CUDA compiles are slow (bench/gpu_check.sh builds with CUDA).
if [[ ! -f build/dev/build.ninja ]] || ! grep -q '^VLLMX_CUDA:STRING=OFF' build/dev/CMakeCache.txt; then
  cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DVLLMX_CUDA=OFF \
    -DPython_EXECUTABLE="$(command -v python3)" >/dev/null
fi
ninja -C build/dev
# Copy then rename: overwriting a loaded .so in place crashes the processes using it.
for so in build/dev/_C*.so; do
  cp -f "$so" "src/vllmx/.$(basename "$so").tmp"
  mv -f "src/vllmx/.$(basename "$so").tmp" "src/vllmx/$(basename "$so")"
done
