#!/usr/bin/env bash
# One call on the GPU machine: build vllmx._C with CUDA in place, run the GPU tests, then the GPU
# benchmark where it exists. GPU time is scarce, so everything happens in this one script.
#
#   bash bench/gpu_check.sh            # sm_90a only (the H200); VLLMX_CUDA_ARCHS="80-real;90a-real"
#   PYTEST_ARGS="-k sample" bash bench/gpu_check.sh
#   SKIP_TESTS=1 SKIP_BENCH=1 PROFILE=1 bash bench/gpu_check.sh   # build + decode kernel profile
#
# The machine has Python 3.12 with torch, transformers, cython, scikit-build-core, cmake and ninja
# but no internet: wheels it lacks (gguf, nvidia-cutlass for the sm_90a GEMM's headers, ...)
# travel in .whl/ and go to /tmp/site, where CMake's Python finds them. Output goes to
# stdout and, where $OUT is set (the device tool), to $OUT/gpu_check.log. Exit status: nonzero
# when the build or any test fails.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:+$OUT/gpu_check.log}
exec > >(tee ${LOG:-/dev/null}) 2>&1
export PYTHONUNBUFFERED=1

step() { printf '\n=== %s (%ds)\n' "$1" "$SECONDS"; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
nvcc --version | tail -1
python3 --version

if compgen -G ".whl/*.whl" >/dev/null; then
  step "carried wheels"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

# A library bench/gpu_prebuild.sh built elsewhere from these very sources (build/gpu-prebuilt,
# sent along): unpacked instead of compiled.
pre=build/gpu-prebuilt
if [[ -f $pre/SOURCES && -f $pre/_C.so.xz && -z "${VLLMX_CUDA_ARCHS:-}" ]] &&
   read -r hash so <"$pre/SOURCES" && [[ $hash == "$(bash bench/gpu_sources_hash.sh)" &&
   $so == _C$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))') ]]; then
  step "prebuilt $so (sources $hash)"
  python3 -c 'import lzma, sys; open(sys.argv[2], "wb").write(lzma.open(sys.argv[1]).read())' \
    "$pre/_C.so.xz" "src/vllmx/$so" || exit 1
else
  step "build (CUDA architectures ${VLLMX_CUDA_ARCHS:-90a})"
  mkdir -p build
  cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DVLLMX_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${VLLMX_CUDA_ARCHS:-90a}" \
    ${VLLMX_CUTLASS_DIR:+-DVLLMX_CUTLASS_DIR="$VLLMX_CUTLASS_DIR"} \
    -DPython_EXECUTABLE="$(command -v python3)" >build/gpu-configure.log 2>&1 \
    || { cat build/gpu-configure.log; exit 1; }
  ninja -C build/gpu -j "$(nproc)" || exit 1
  for so in build/gpu/_C*.so; do cp -f "$so" src/vllmx/; done
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
python3 -c "from vllmx import _C; print('cuda_built', _C.cuda_built(), 'cuda_available', \
_C.cuda_available(), 'devices', _C.cuda_device_count(), 'mem (free, total)', _C.cuda_mem_get_info())" \
  || exit 1

tests_rc=0
if [[ -z "${SKIP_TESTS:-}" ]]; then
  step "GPU tests"
  # shellcheck disable=SC2086
  python3 -m pytest -m gpu tests/cuda -q -rs -p no:cacheprovider ${PYTEST_ARGS:-} \
    --junitxml="${OUT:-/tmp}/gpu_tests.xml"
  tests_rc=$?
fi

bench_rc=0
if [[ -f bench/gpu_vs_transformers.py && -z "${SKIP_BENCH:-}" ]]; then
  step "GPU benchmark"
  python3 bench/gpu_vs_transformers.py ${BENCH_ARGS:-}
  bench_rc=$?
fi

if [[ -n "${PROFILE:-}" ]]; then
  step "decode profile"
  # shellcheck disable=SC2086
  python3 bench/gpu_decode_profile.py ${PROFILE_ARGS:-}
fi

step "summary"
[[ -n "${SKIP_TESTS:-}" ]] || python3 - "${OUT:-/tmp}/gpu_tests.xml" <<'EOF'
import sys
import xml.etree.ElementTree as ET

try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError) as e:
    sys.exit(f"no test report ({e})")
suite = root if root.tag == "testsuite" else root.find("testsuite")
n, f, e, s = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
print(f"GPU tests: {n - f - e - s} passed, {f} failed, {e} errors, {s} skipped "
      f"in {float(suite.get('time', 0)):.1f}s")
for case in suite.iter("testcase"):
    if case.find("failure") is not None or case.find("error") is not None:
        print("  FAILED", case.get("classname"), case.get("name"))
EOF
echo "tests rc=$tests_rc bench rc=$bench_rc total ${SECONDS}s"
[[ $tests_rc -eq 0 && $bench_rc -eq 0 ]]
