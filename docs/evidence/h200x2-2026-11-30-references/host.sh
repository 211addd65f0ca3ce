#!/bin/bash
# The commands this evidence was measured with, on the GPU host (two H200s, Python 3.12 with
# torch 2.11 and transformers 5.17, no network), run from the repository root:
#   bash host.sh ceiling  # the load generator's own ceiling on this host (after unpack)
#   bash host.sh probe    # which INT4 kernels vLLM can run here (after unpack)
#   bash host.sh gather   # after each part of the install set reached the host as $1's folder
#   bash host.sh unpack   # vLLM 0.26.0 (sha256-checked), its wheels and the workflow's wheels
#   bash host.sh start    # the workflow's measurements, in the background
#   bash host.sh status   # progress
#   bash host.sh pack     # results and logs into $OUT/evidence.tgz
set -euo pipefail
SITE=/tmp/site
HERE=docs/evidence/h200x2-2026-11-30-references
CONFIG=${CONFIG:-config/h200-smoke.yaml config/h200-references.yaml $HERE/two-cards.yaml}  # space-separated
TARGETS=${TARGETS:-measurements}
GPUS=${GPUS:-2}
EXTRA=${EXTRA:-}  # further snakemake options (e.g. --prioritize FILES), before the targets
export PYTHONPATH=$SITE:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_UPDATE_CHECK=1
case "$1" in
  gather)  # copy one carried part folder into /tmp/parts
    mkdir -p /tmp/parts && cp -r "$2"/. /tmp/parts/ && ls /tmp/parts | head -n 8
    ;;
  ceiling)  # the client's ceiling: the real load generator against a server that answers at once
    python3 -m speedsplit.ceiling --users 64 --output-tokens 256 --highest-measured "${HIGHEST:-9516}"
    ;;
  probe)
    python3 $HERE/kernel_probe.py
    ;;
  unpack)
    # The install set travels as one tar split into parts (bundle.tar.partN, bundle.sha256).
    cat $(ls /tmp/parts/bundle.tar.part* | sort) > /tmp/bundle.tar
    want=$(cat /tmp/parts/bundle.sha256); got=$(sha256sum /tmp/bundle.tar | cut -d' ' -f1)
    [ "$want" = "$got" ] || { echo "bundle sha256 mismatch: parts missing or damaged"; exit 1; }
    tar -xf /tmp/bundle.tar -C /tmp/parts && rm /tmp/bundle.tar /tmp/parts/bundle.tar.part*
    cat $(ls /tmp/parts/vllm_tree.tar.xz.part* | sort) > /tmp/vllm_tree.tar.xz
    want=$(cut -d' ' -f1 /tmp/parts/vllm_tree.sha256); got=$(sha256sum /tmp/vllm_tree.tar.xz | cut -d' ' -f1)
    [ "$want" = "$got" ] || { echo "sha256 mismatch: parts missing or damaged"; exit 1; }
    rm -rf $SITE && mkdir -p $SITE
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $SITE /tmp/parts/wheels/*.whl
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $SITE --upgrade /tmp/parts/whl/*.whl
    xz -dc -T0 /tmp/vllm_tree.tar.xz | tar -x -C $SITE
    python3 -c "import vllm, snakemake, psutil, aiohttp, pydantic; print('vllm', vllm.__version__, 'snakemake', snakemake.__version__)"
    ;;
  start)
    mkdir -p ~/.cache/huggingface/hub results
    : "${SPEEDSPLIT_WORKFLOW_COMMIT:?set it to the commit measured (the copied tree has no .git)}"
    export SPEEDSPLIT_WORKFLOW_COMMIT
    nvidia-smi topo -m > results/topo.txt 2>&1 || true
    # shellcheck disable=SC2086  # CONFIG and TARGETS are lists
    setsid nohup python3 -m snakemake --configfile $CONFIG --cores all --resources gpu=$GPUS \
      --scheduler greedy $EXTRA -- $TARGETS > results/snakemake.out 2>&1 < /dev/null &
    echo "started: results/snakemake.out"
    ;;
  status)
    grep -E "^\[|Finished|Error|error|steps \(" results/snakemake.out | tail -n 14 || true
    ls results/bench/*/*/*/*/run*.json results/profile/*/*/*/*.json results/hardware/*.json 2>/dev/null | wc -l
    nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader
    ;;
  pack)
    # shellcheck disable=SC2046  # the paths that exist
    tar -czf "$OUT/evidence.tgz" $(ls -d results/bench results/hardware results/quantize \
      results/profile results/link results/logs results/snakemake.out results/topo.txt \
      results/plan.json 2>/dev/null)
    ls -la "$OUT"
    ;;
esac
