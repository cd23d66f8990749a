#!/usr/bin/env bash
# Builds vllmx._C with CUDA for sm_90a on this (GPU-less) machine, for the GPU machine's Python
# (3.12), so that a GPU call spends its device time on tests and benchmarks rather than on ~2
# minutes of compiling: writes build/gpu-prebuilt/_C.so.xz (~13 MB) and SOURCES, the hash of the
# sources it was built from (bench/gpu_sources_hash.sh). Send build/gpu-prebuilt along with the
# call (the device tool's carry); bench/gpu_check.sh unpacks it where the hash matches the tree
# it runs on and builds as before otherwise. A full build takes ~8 minutes on 2 cores, a rebuild
# after a change seconds to minutes.
#
#   bash bench/gpu_prebuild.sh        # PY: a Python 3.12 with cython and numpy (default: a venv
#                                     # made once in /tmp/vllmx-py312 from pyenv's 3.12)
# CUTLASS's headers: -DVLLMX_CUTLASS_DIR from CUTLASS_DIR, else the nvidia-cutlass wheel of PY.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${PY:-}" ]]; then
  PY=/tmp/vllmx-py312/bin/python
  if [[ ! -x $PY ]]; then
    base=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3 2>/dev/null | tail -1)
    [[ -n $base ]] || { echo "gpu_prebuild: no Python 3.12 (set PY)" >&2; exit 1; }
    "$base" -m venv /tmp/vllmx-py312
    # numpy no newer than the GPU machine's 2.5 (an extension runs on the numpy it was built
    # against or a later one)
    "$PY" -m pip install -q cython "numpy>=2,<=2.5.2" nvidia-cutlass
  fi
fi
out=build/gpu-prebuilt
mkdir -p "$out"
cmake -S . -B build/gpu312 -G Ninja -DCMAKE_BUILD_TYPE=Release -DVLLMX_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a ${CUTLASS_DIR:+-DVLLMX_CUTLASS_DIR="$CUTLASS_DIR"} \
  -DPython_EXECUTABLE="$PY" >build/gpu312-configure.log 2>&1 \
  || { cat build/gpu312-configure.log; exit 1; }
hash=$(bash bench/gpu_sources_hash.sh)
ninja -C build/gpu312 -j "$(nproc)"
[[ $(bash bench/gpu_sources_hash.sh) == "$hash" ]] || { echo "gpu_prebuild: sources changed" >&2; exit 1; }
so=$(ls build/gpu312/_C*.so)
xz -6 -T0 -c "$so" >"$out/_C.so.xz.tmp"
mv "$out/_C.so.xz.tmp" "$out/_C.so.xz"
printf '%s %s\n' "$hash" "$(basename "$so")" >"$out/SOURCES"
echo "gpu_prebuild: $out/_C.so.xz ($(du -h "$out/_C.so.xz" | cut -f1)) for sources $hash"
