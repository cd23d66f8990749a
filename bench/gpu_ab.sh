#!/usr/bin/env bash
# A/B of kernel changes end to end in one call on the GPU machine: builds the tree as it is (A),
# runs bench/gpu_vs_vllm.py --engines vllmx on the workloads, then for each patch applies it,
# rebuilds incrementally, runs the same workloads and takes the patch back out; a variant given
# as DIR/_C.so.xz (bench/gpu_prebuild.sh's library of other sources, say the commit before the
# change, copied into an ignored folder and carried) runs that library in place of A's, with no
# build on the machine, under the tag DIR's name. Prints one table
# of decode / prefill tok/s per variant and writes one JSON ($OUT/gpu_ab.json, else
# bench/results/gpu_ab.json): the device tool brings back only a few files from $OUT, so the
# runs' own reports stay on the machine.
#
#   bash bench/gpu_ab.sh MODELS WORKLOADS [PATCH ...]
#   bash bench/gpu_ab.sh "llama-3-8b qwen3-0.6b" "1024:128:1,4,8,32 7936:64:4" .gpu/a.patch .gpu/b.patch
#   bash bench/gpu_ab.sh "llama-3-8b" "1024:128:64,128,256" .gpu/before/_C.so.xz
#
# WORKLOADS: one or more of gpu_vs_vllm.py's IN:OUT:BATCHES, space-separated. Patches are
# `git diff` output (applied with patch -p1; the machine has no git). Runs against no vLLM:
# compare variants with each other, and with vLLM through gpu_vs_vllm.py itself.
set -uo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 2 ]] || { sed -n 2,18p "$0"; exit 2; }
MODELS=$1 WORKLOADS=$2
shift 2
RUNS=$(mktemp -d)
DEST=${OUT:-bench/results}

SKIP_TESTS=1 SKIP_BENCH=1 OUT='' bash bench/gpu_check.sh >"$RUNS/build.log" 2>&1 ||
  { tail -40 "$RUNS/build.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}

run() {  # variant tag
  # shellcheck disable=SC2086
  OUT="$RUNS/$1" python3 bench/gpu_vs_vllm.py --engines vllmx --models $MODELS \
    --workloads $WORKLOADS >"$RUNS/$1.log" 2>&1 || { echo "$1: run failed"; tail -20 "$RUNS/$1.log"; }
  echo "$1 done (${SECONDS}s)"
}
rebuild() {
  # (A prebuilt library (gpu_check.sh) leaves no build/gpu to patch: prebuild the patched tree
  # here instead, bench/gpu_prebuild.sh, and pass its _C.so.xz as a variant.)
  [[ -f build/gpu/build.ninja ]] ||
    { echo "no build/gpu to rebuild: A is build/gpu-prebuilt's library; pass the patched" \
        "tree's prebuilt DIR/_C.so.xz instead of the patch"; return 1; }
  ninja -C build/gpu >"$RUNS/rebuild.log" 2>&1 || { tail -30 "$RUNS/rebuild.log"; return 1; }
  for so in build/gpu/_C*.so; do cp -f "$so" src/vllmx/; done
}

mkdir -p "$RUNS/A"
run A
lib=src/vllmx/_C$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
cp -f "$lib" "$RUNS/A.so"
patched=0
tags=(A)  # the report's variants, in order
for p in "$@"; do
  if [[ $p == *.so.xz ]]; then
    tag=$(basename "$(dirname "$p")")
    tags+=("$tag")
    mkdir -p "$RUNS/$tag"
    if python3 -c 'import lzma, sys; open(sys.argv[2], "wb").write(lzma.open(sys.argv[1]).read())' \
      "$p" "$lib"; then
      run "$tag"
    else
      echo "$tag: could not be unpacked"
    fi
    cp -f "$RUNS/A.so" "$lib"
    continue
  fi
  patched=1
  tag=$(basename "$p" .patch)
  tags+=("$tag")
  mkdir -p "$RUNS/$tag"
  if patch -p1 --forward <"$p" >/dev/null && rebuild; then
    run "$tag"
  else
    echo "$tag: did not apply or build"
  fi
  patch -p1 -R <"$p" >/dev/null || { echo "$tag: could not be taken back out"; exit 1; }
done
[[ $patched == 0 ]] || rebuild || exit 1

python3 - "$RUNS" "$DEST/gpu_ab.json" "${tags[@]}" <<'EOF'
import json
import os
import sys

runs, dest, tags = sys.argv[1], sys.argv[2], sys.argv[3:]
report = {}
for tag in tags:
    try:
        with open(os.path.join(runs, tag, "gpu_vs_vllm.json")) as f:
            report[tag] = json.load(f)
    except OSError:
        report[tag] = None
base = report["A"]
print("| model | workload | " + " | ".join(f"{t} decode (prefill) tok/s" for t in tags) + " |")
print("|---|---|" + "---|" * len(tags))
for model, entry in (base or {}).get("models", {}).items():
    for w, a in entry.get("vllmx", {}).get("runs", {}).items():
        cells = []
        for t in tags:
            r = (report[t] or {}).get("models", {}).get(model, {}).get("vllmx", {}) \
                .get("runs", {}).get(w)
            if r is None:
                cells.append("-")
                continue
            ratio = "" if t == "A" else f" {r['decode_tok_s'] / a['decode_tok_s']:.3f}x"
            cells.append(f"{r['decode_tok_s']:,.0f}{ratio} ({r['prefill_tok_s']:,.0f})")
        print(f"| {model} | {w} | " + " | ".join(cells) + " |")
with open(dest, "w") as f:
    json.dump(report, f, indent=1)
print(f"wrote {dest}")
EOF
