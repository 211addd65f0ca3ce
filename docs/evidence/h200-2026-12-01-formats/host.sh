#!/bin/bash
# The commands this evidence was measured with, on the GPU host (one H200, Python 3.12 with
# torch 2.11 and transformers 5.17, no network), run from the repository root:
#   bash host.sh gather DIR  # after each part of the install set reached the host as DIR
#   bash host.sh unpack      # vLLM 0.26.0 (sha256-checked), its wheels, the workflow's wheels, GPTQModel 7.6.0's
#   bash host.sh all         # in the background, each step in its own copy of the tree:
#     1. /tmp/wf:  config/h200-formats.yaml less hf-fp16: the 8B model, GPTQModel's GPTQ checkpoint
#                  made on the card, vllm-fp16, vllm-fp8, vllm-gptq-machete, vllm-marlin
#     2. /tmp/wf2: config/h200-formats-engine-int4.yaml: the same INT4 stacks on engine-initialised weights
#     3. /tmp/wf:  config/h200-formats.yaml whole: only hf-fp16's jobs are new (checked by a dry run first)
#     4. /tmp/wf:  speedsplit's Poisson mode against `vllm bench serve` on one vLLM FP16 server
#   bash host.sh status      # progress, and the results so far packed into $OUT
set -euo pipefail
SITE=/tmp/site
export PYTHONPATH=$SITE:. VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_UPDATE_CHECK=1
MODEL=resources/models/llama-3.1-8b/fp16
PY=python3
SERVER_ARGS="--dtype float16 --max-model-len 2048"  # as the workflow's vllm-fp16 on this model
LOAD="--rate 8 --requests 150 --prompt-tokens 512 --output-tokens 128 --reps 3"
SMK="python3 -m snakemake --cores all --resources gpu=1 --scheduler greedy"
SMOKE=config/h200-smoke.yaml

fidelity() {
  # One vLLM FP16 server on the workflow's model and its vllm-fp16 compile cache (the shared
  # folder step 1's results name), then both load generators alternating, 3 reps each.
  mkdir -p results/fidelity
  local key
  key=$($PY -c "import glob, json; r = [json.load(open(p))['server']['compile_cache_dir'] for p in sorted(glob.glob('results/bench/llama-3.1-8b/vllm-fp16/*/*/run*.json'))]; print(next(c[7:] for c in r if c and c.startswith('shared ')))")
  echo "compile cache: results/cache/shared/$key" > results/fidelity/cache.txt
  VLLM_CACHE_ROOT=results/cache/shared/$key/instance0/vllm setsid $PY -m vllm.entrypoints.openai.api_server \
    --model $MODEL --served-model-name llama-3.1-8b --host 127.0.0.1 --port 8123 $SERVER_ARGS --seed 0 \
    > results/fidelity/server.log 2>&1 < /dev/null &
  local pid=$! t0=$SECONDS
  until $PY -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8123/health')" 2>/dev/null; do
    sleep 1; kill -0 $pid 2>/dev/null || { echo "server died" >> results/fidelity/fidelity.out; return 1; }
  done
  echo "server ready in $((SECONDS - t0)) s" >> results/fidelity/cache.txt
  # shellcheck disable=SC2086  # LOAD is a list
  $PY -m speedsplit.cli fidelity --url http://127.0.0.1:8123 --model llama-3.1-8b --tokenizer $MODEL $LOAD \
    > results/fidelity/fidelity.out 2>&1 || true
  kill -- -$pid 2>/dev/null || true
  sleep 5
}

hf_only() {
  # Step 3 adds hf-fp16 to the finished grid: a dry run must plan hf-fp16's bench jobs only.
  local planned
  planned=$($SMK -n --configfile $SMOKE config/h200-formats.yaml -- measurements 2>&1 | grep -E "^\s*output: results/bench/" | grep -oE "results/bench/[^ ,]+\.json" | sort -u)
  echo "$planned" > results/step3-planned.txt
  if echo "$planned" | grep -v "/hf-fp16/" | grep -q .; then
    echo "step 3 skipped: the dry run plans more than hf-fp16's jobs" >> results/all.out; return 1
  fi
  $SMK --configfile $SMOKE config/h200-formats.yaml -- measurements > results/snakemake-formats-hf.out 2>&1
}

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
    python3 -c "import vllm, snakemake, psutil, aiohttp, pydantic, polars, altair, gptqmodel; print('vllm', vllm.__version__, 'snakemake', snakemake.__version__, 'gptqmodel', gptqmodel.__version__)"
    ;;
  all)
    : "${SPEEDSPLIT_WORKFLOW_COMMIT:?set it to the commit measured (the copied tree has no .git)}"
    export SPEEDSPLIT_WORKFLOW_COMMIT
    mkdir -p ~/.cache/huggingface/hub
    rm -rf /tmp/wf /tmp/wf2 && cp -a . /tmp/wf && cp -a . /tmp/wf2 && mkdir -p /tmp/wf/results /tmp/wf2/results
    printf 'benchmark:\n  stacks: [vllm-fp16, vllm-fp8, vllm-gptq-machete, vllm-marlin]\n' > /tmp/vllm-first.yaml
    nvidia-smi topo -m > /tmp/wf/results/topo.txt 2>&1 || true
    cd /tmp/wf
    setsid nohup bash -c "
      date +%s > results/t0-formats
      $SMK --configfile $SMOKE config/h200-formats.yaml /tmp/vllm-first.yaml -- measurements > results/snakemake-formats.out 2>&1
      date +%s > results/t0-engine-int4
      (cd /tmp/wf2 && $SMK --configfile $SMOKE config/h200-formats-engine-int4.yaml -- measurements > results/snakemake-engine-int4.out 2>&1)
      date +%s > results/t0-hf
      bash $0 hf-only
      date +%s > results/t0-fidelity
      bash $0 fidelity-now
      date +%s > results/t1" > results/all.out 2>&1 < /dev/null &
    echo "started in /tmp/wf (steps 1, 3, 4) and /tmp/wf2 (step 2)"
    ;;
  hf-only)
    hf_only
    ;;
  fidelity-now)
    fidelity
    ;;
  status)
    for f in /tmp/wf/results/snakemake-formats.out /tmp/wf2/results/snakemake-engine-int4.out /tmp/wf/results/snakemake-formats-hf.out; do
      [ -f $f ] && { echo "== $f"; grep -E "^\[|Finished|Error|error|steps \(" $f | tail -n 6; }
    done
    ls /tmp/wf/results/bench/*/*/*/*/run*.json /tmp/wf2/results/bench/*/*/*/*/run*.json 2>/dev/null | wc -l
    tail -n 5 /tmp/wf/results/fidelity/fidelity.out /tmp/wf/results/all.out 2>/dev/null || true
    nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader
    for d in /tmp/wf /tmp/wf2; do
      # shellcheck disable=SC2046  # the paths that exist
      (cd $d && tar -czf "$OUT/$(basename $d).tgz" $(ls -d results/bench results/hardware results/quantize \
        results/fidelity results/logs results/snakemake-*.out results/all.out results/t0-* results/t1 \
        results/topo.txt results/plan.json results/step3-planned.txt 2>/dev/null))
    done
    ls -la "$OUT"
    ;;
esac
