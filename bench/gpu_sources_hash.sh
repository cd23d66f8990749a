#!/usr/bin/env bash
# Prints one hash of the sources vllmx._C is compiled from (cuda/, csrc/, cmake/, CMakeLists.txt,
# the Cython files), the same here and on the GPU machine (which has the tree but no .git):
# bench/gpu_prebuild.sh stamps its library with it, bench/gpu_check.sh compares.
set -euo pipefail
cd "$(dirname "$0")/.."
{ find cuda csrc cmake -type f; echo CMakeLists.txt
  find src/vllmx -maxdepth 1 -type f \( -name '*.pyx' -o -name '*.pxi' -o -name '*.pxd' \); } |
  LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1
