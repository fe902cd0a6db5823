#!/usr/bin/env bash
# The 16-core measurements of docs/results.md, on a lent GPU machine: each mode is one call of
# the `device` tool's `run` (under its 600 s limit) and writes its results to
# $OUT (or ./bench-out when OUT is unset).
#
# That machine has torch, torchvision, Pillow and matplotlib but not the JPEG
# codec. Here, once per checkout, in the repository root (.gitignore keeps the
# wheels out of git, so they travel only when carried):
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl simplejpeg turbojpeg
#
# then run(command="bash tools/lent_machine.sh bench", carry=[".whl"]), and the
# same with "pipeline". Modes:
#
#   bench     python -m threadloader bench at 8, 16 and 32 workers on 4000 files
#             (400 generated photo-like JPEGs, each copied 10 times): the table,
#             CSV and plot of docs/results.md's 16-core section.
#   pipeline  the swapped import alone (examples/image_pipeline_benchmark.py:
#             ImageFolder + PIL transforms, unchanged user code) at 16 workers,
#             worker_processes 4 and 16.
#   zoo       python -m threadloader bench --zoo at 8, 16 and 32 workers, 2 rounds:
#             DataLoader against the default, threads and processes on every
#             workload. If one call would pass the 600 s limit, split the
#             workloads over two calls (ZOO_WORKLOADS=trivial,json-tokenize,npy,torch-heavy
#             with OUT=bench-out/zoo-a, then the rest with OUT=bench-out/zoo-b).
#
# WORKERS, COPIES, MAX_BATCHES, BATCHES, PROCESSES, ROUNDS and ZOO_WORKLOADS override the
# sizes (a 2-core smoke run: WORKERS=1,2 COPIES=1 MAX_BATCHES=2 BATCHES=2 bash
# tools/lent_machine.sh bench; ROUNDS=1 WORKERS=2 ZOO_WORKLOADS=trivial bash tools/lent_machine.sh zoo).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:?usage: $0 bench|pipeline|zoo}
out=${OUT:-bench-out}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
data=${TMPDIR:-/tmp}/threadloader-lent
{
    date -u
    echo "cores: $(nproc)"
    nvidia-smi -L 2>/dev/null || echo "no NVIDIA GPU"
    python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)'
} | tee "$out/machine.txt"

case "$mode" in
    bench)
        # The plot is written last: a missing matplotlib would fail the run after all of it.
        python3 -c 'import matplotlib' || { echo "matplotlib is missing: carry its wheel too" >&2; exit 1; }
        # 400 generated JPEGs, each under COPIES names: a data set as large as
        # the 16-core runs need, generated in seconds.
        python3 - "$data" "${COPIES:-10}" <<'EOF'
import shutil
import sys
from pathlib import Path

from threadloader.images.datagen import make_imagenet_like

base, copies = Path(sys.argv[1]), int(sys.argv[2])
src = make_imagenet_like(base / "src", num_classes=10, images_per_class=40)
root = base / f"x{copies}"
if not root.is_dir():
    for f in sorted(src.glob("*/*.JPEG")):
        (root / f.parent.name).mkdir(parents=True, exist_ok=True)
        for k in range(copies):
            shutil.copyfile(f, root / f.parent.name / f"{f.stem}_{k}.JPEG")
print(root, sum(1 for _ in root.glob("*/*.JPEG")), "files")
EOF
        python3 -m threadloader bench --root "$data/x${COPIES:-10}" --workers "${WORKERS:-8,16,32}" \
            --max-batches "${MAX_BATCHES:-100}" --out "$out" --no-progress 2>&1 | tee "$out/console.log"
        ;;
    pipeline)
        for p in ${PROCESSES:-4 16}; do
            python3 examples/image_pipeline_benchmark.py --workers "${WORKERS:-16}" --worker-processes "$p" \
                --batches "${BATCHES:-60}" --cache-dir "$data" 2>&1 | tee "$out/pipeline-p$p.log"
        done
        ;;
    zoo)
        python3 -c 'import matplotlib' || { echo "matplotlib is missing: carry its wheel too" >&2; exit 1; }
        zoo_workloads=()
        if [ -n "${ZOO_WORKLOADS:-}" ]; then zoo_workloads=(--zoo-workloads "$ZOO_WORKLOADS"); fi
        python3 -m threadloader bench --zoo --workers "${WORKERS:-8,16,32}" --rounds "${ROUNDS:-2}" \
            "${zoo_workloads[@]}" --cache-dir "$data" --out "$out" --no-progress 2>&1 | tee "$out/console.log"
        ;;
    *)
        echo "usage: $0 bench|pipeline|zoo" >&2
        exit 2
        ;;
esac
