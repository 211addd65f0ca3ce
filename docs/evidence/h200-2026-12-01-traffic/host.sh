#!/bin/bash
# The commands this evidence was measured with, on the GPU host (one H200, Python 3.12 with
# torch 2.11 and transformers 5.17, no network), run from the repository root:
#   bash host.sh gather DIR  # after each part of the install set reached the host as DIR
#   bash host.sh unpack      # vLLM 0.26.0 (sha256-checked), its wheels and the workflow's wheels
#   bash host.sh start       # the workflow's measurements (config/h200-traffic.yaml), in the background
#   bash host.sh fidelity    # then: speedsplit's Poisson mode against `vllm bench serve`, in the background
#   bash host.sh status      # progress
#   bash host.sh pack        # results and logs into $OUT/evidence.tgz
set -euo pipefail
SITE=/tmp/site
CONFIG=${CONFIG:-config/h200-traffic.yaml}
TARGETS=${TARGETS:-measurements}
export PYTHONPATH=$SITE:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_UPDATE_CHECK=1
MODEL=${MODEL:-resources/models/llama-3.1-8b/fp16}
CACHE=results/cache/llama-3.1-8b__vllm-fp16__tp1__all/instance0  # the workflow's vllm-fp16 compile cache
PY=${PY:-python3}
SERVER_ARGS=${SERVER_ARGS:---dtype float16 --max-model-len 8192}  # as the workflow's vllm-fp16
LOAD=${LOAD:---rate 8 --requests 150 --prompt-tokens 512 --output-tokens 128 --reps 3}
case "$1" in
  gather)  # copy one carried part folder into /tmp/parts
    mkdir -p /tmp/parts && cp -r "$2"/. /tmp/parts/ && ls /tmp/parts | head -n 12
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
    setsid nohup python3 -m snakemake --configfile $CONFIG --cores all --resources gpu=1 \
      --scheduler greedy -- $TARGETS > results/snakemake.out 2>&1 < /dev/null &
    echo "started: results/snakemake.out"
    ;;
  fidelity)
    # One vLLM FP16 server (the workflow's model and compile cache), then both load generators
    # at 8 requests/s, 150 requests of 512 prompt / 128 output tokens, alternating, 3 reps each.
    mkdir -p results/fidelity
    VLLM_CACHE_ROOT=$CACHE/vllm TORCHINDUCTOR_CACHE_DIR=$CACHE/inductor TRITON_CACHE_DIR=$CACHE/triton \
      setsid nohup $PY -m vllm.entrypoints.openai.api_server --model $MODEL --served-model-name llama-3.1-8b \
      --host 127.0.0.1 --port 8123 $SERVER_ARGS --seed 0 \
      > results/fidelity/server.log 2>&1 < /dev/null &
    echo $! > results/fidelity/server.pid
    setsid nohup bash -c "until $PY -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:8123/health')\" 2>/dev/null; do sleep 2; done; \
      $PY -m speedsplit.cli fidelity --url http://127.0.0.1:8123 --model llama-3.1-8b --tokenizer $MODEL \
        $LOAD > results/fidelity/fidelity.out 2>&1; \
      kill -- -\$(cat results/fidelity/server.pid)" > /dev/null 2>&1 < /dev/null &
    echo "started: results/fidelity/fidelity.out"
    ;;
  status)
    grep -E "^\[|Finished|Error|error|steps \(" results/snakemake.out | tail -n 14 || true
    ls results/bench/*/*/*/*/run*.json 2>/dev/null | wc -l
    tail -n 4 results/fidelity/fidelity.out 2>/dev/null || true
    nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader
    ;;
  pack)
    # shellcheck disable=SC2046  # the paths that exist
    tar -czf "$OUT/evidence.tgz" $(ls -d results/bench results/hardware results/quantize results/fidelity \
      results/logs results/snakemake.out results/topo.txt results/plan.json 2>/dev/null)
    ls -la "$OUT"
    ;;
esac
