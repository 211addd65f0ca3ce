#!/bin/bash
# The commands this evidence (and h200-2026-12-02-startup's) was measured with, on the GPU host
# (one H200, Python 3.12 with torch 2.11 and transformers 5.17, no network), from the
# repository root:
#   bash host.sh gather DIR  # after each part of the install set reached the host as DIR
#   bash host.sh unpack      # vLLM 0.26.0 (sha256-checked), its wheels and the workflow's; then
#                            # one import of vLLM's API server timed before and after writing
#                            # the bytecode of everything installed (results/bytecode.txt)
#   bash host.sh bytecode    # torch and the installed set compiled into /tmp/pyc, read by every
#                            # later Python through /tmp/site/sitecustomize.py (run by hand at
#                            # 23:19:56, 100 s into step 1: the first vllm-fp16 start had begun)
#   bash host.sh all         # in the background, from a copy of the tree (/tmp/wf), in order:
#     1. capacity under a 24 GiB cap, rates 48-256 requests/s (config/h200-traffic-cliff.yaml
#        over config/h200-smoke.yaml and config/h200-traffic-capped.yaml)
#     2. speedsplit's Poisson mode against `vllm bench serve` on one vLLM FP16 server, both
#        on the arrival times vLLM draws for each seed (results/fidelity/)
#     3. the config/h200-smoke.yaml grid whole, on the compile caches steps 1-2 left
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
CLIFF="config/h200-smoke.yaml config/h200-traffic-capped.yaml config/h200-traffic-cliff.yaml"

fidelity() {
  # One vLLM FP16 server on the workflow's model and its vllm-fp16 compile cache (the shared
  # folder step 1's results name), then both load generators alternating, 3 reps each.
  mkdir -p results/fidelity
  local key
  key=$($PY -c "import glob, json; r = [(json.load(open(p)).get('server') or {}).get('compile_cache_dir') for p in sorted(glob.glob('results/bench/llama-3.1-8b/vllm-fp16/*/*/run*.json'))]; print(next(c[7:] for c in r if c and c.startswith('shared ')))")
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

import_s() {  # seconds one fresh interpreter takes to import vLLM's API server
  $PY -c "import subprocess, sys, time; t = time.time(); subprocess.run([sys.executable, '-c', 'import vllm.entrypoints.openai.api_server'], capture_output=True); print(round(time.time() - t, 1))"
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
    python3 -c "import vllm, snakemake, psutil, aiohttp, pydantic, polars, altair; print('vllm', vllm.__version__, 'snakemake', snakemake.__version__)"
    # Installed as above, nothing under $SITE has bytecode, and where PYTHONDONTWRITEBYTECODE
    # is set no run writes any: every process then compiles each module it imports.
    {
      echo "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-}"
      echo "pyc files under $SITE: $(find $SITE -name '*.pyc' | wc -l)"
      echo "import vllm.entrypoints.openai.api_server, no bytecode: $(import_s) s, again: $(import_s) s"
      t0=$SECONDS; python3 -m compileall -q -j 0 $SITE > /dev/null 2>&1 || true
      echo "compileall -j 0 $SITE: $((SECONDS - t0)) s, pyc files now: $(find $SITE -name '*.pyc' | wc -l)"
      echo "import vllm.entrypoints.openai.api_server, with bytecode: $(import_s) s, again: $(import_s) s"
    } | tee /tmp/bytecode.txt
    ;;
  bytecode)
    S=$SECONDS; PYTHONPYCACHEPREFIX=/tmp/pyc python3 -m compileall -q -j 0 /opt/torch/.venv/lib/python3.12/site-packages $SITE > /dev/null 2>&1 || true
    echo "compileall into /tmp/pyc: $((SECONDS - S)) s, $(find /tmp/pyc -name '*.pyc' | wc -l) pyc"
    echo "with all bytecode: $(PYTHONPYCACHEPREFIX=/tmp/pyc import_s) s, again: $(PYTHONPYCACHEPREFIX=/tmp/pyc import_s) s"
    printf 'import sys\nsys.pycache_prefix = "/tmp/pyc"\n' > $SITE/sitecustomize.py
    ;;
  all)
    : "${SPEEDSPLIT_WORKFLOW_COMMIT:?set it to the commit measured (the copied tree has no .git)}"
    export SPEEDSPLIT_WORKFLOW_COMMIT
    mkdir -p ~/.cache/huggingface/hub
    rm -rf /tmp/wf && cp -a . /tmp/wf && mkdir -p /tmp/wf/results
    cp /tmp/bytecode.txt /tmp/wf/results/ 2>/dev/null || true
    nvidia-smi topo -m > /tmp/wf/results/topo.txt 2>&1 || true
    cd /tmp/wf
    setsid nohup bash -c "
      date +%s > results/t0-cliff
      $SMK --configfile $CLIFF -- measurements > results/snakemake-cliff.out 2>&1
      cp results/plan.json results/plan-cliff.json; date +%s > results/t0-fidelity
      bash $0 fidelity-now; date +%s > results/t0-smoke  # failed here (fixed since); run after step 3
      $SMK --configfile $SMOKE -- measurements > results/snakemake-smoke.out 2>&1
      cp results/plan.json results/plan-smoke.json; date +%s > results/t1" > results/all.out 2>&1 < /dev/null &
    echo "started in /tmp/wf: results/snakemake-cliff.out, results/fidelity/, results/snakemake-smoke.out"
    ;;
  fidelity-now)
    fidelity
    ;;
  status)
    cd /tmp/wf
    for f in results/snakemake-cliff.out results/snakemake-smoke.out; do
      [ -f $f ] && { echo "== $f"; grep -E "^\[|Finished|Error|error|steps \(" $f | tail -n 6; }
    done
    ls results/bench/*/*/*/*/run*.json 2>/dev/null | wc -l
    tail -n 5 results/fidelity/fidelity.out results/fidelity/cache.txt results/all.out 2>/dev/null || true
    nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader
    # shellcheck disable=SC2046  # the paths that exist
    tar -czf "$OUT/wf.tgz" $(ls -d results/bench results/hardware results/quantize results/fidelity \
      results/logs results/snakemake-*.out results/all.out results/t0-* results/t1 results/topo.txt \
      results/bytecode.txt results/plan.json results/plan-*.json 2>/dev/null)
    ls -la "$OUT"
    ;;
esac
