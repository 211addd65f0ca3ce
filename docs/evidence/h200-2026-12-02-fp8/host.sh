#!/bin/bash
# The commands this evidence was measured with, on the GPU host (one H200, Python 3.12 with
# torch 2.11 and transformers 5.17, no network), from the repository root:
#   bash host.sh gather DIR  # after each part of the install set reached the host as DIR
#   bash host.sh unpack      # vLLM 0.26.0 (sha256-checked), its wheels, the workflow's and
#                            # GPTQModel 7.6.0's; then the bytecode of torch and the installed
#                            # set written into /tmp/pyc, read by every later Python through
#                            # /tmp/site/sitecustomize.py (the host sets PYTHONDONTWRITEBYTECODE)
#   bash host.sh all         # in the background, from a copy of the tree (/tmp/wf):
#                            # config/h200-awq.yaml over config/h200-smoke.yaml: the 8B model,
#                            # GPTQModel's AWQ checkpoint made on the card, vllm-fp16, vllm-awq,
#                            # vllm-awq-marlin, hf-fp16, two runs of each cell
#                            # Started 02:04:54; stopped by hand at 02:11:09 (`host.sh stop-awq`)
#                            # when GPTQModel's AWQ had done 3 of 32 layers in 2:36 (about 50 s a
#                            # layer: 27 min for the model, more than the device time left)
#   bash host.sh fp8         # in its place, in /tmp/wf on the same results: config/h200-fp8.yaml
#                            # over config/h200-smoke.yaml: vllm-fp16 (its four runs already there),
#                            # vllm-fp8, hf-fp16; started 02:11:25, done 02:17:15
#   bash host.sh fastpack    # then, for the next session's plan: the same AWQ quantization with a
#                            # vectorised AWQ packer (awq_fastpack.py, as it ran), stopped by hand
#                            # after 8 layers (about 34 s a layer)
#   bash host.sh status      # progress, and the results so far packed into $OUT
# Then, on the machine started again at commit 307ad43: `bash host.sh gather DIR` (each part),
# `bash host.sh unpack`, `bash docs/evidence/h200-2026-12-02-fp8/awq_probe.sh 285`.
set -euo pipefail
SITE=/tmp/site
export PYTHONPATH=$SITE:. VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_UPDATE_CHECK=1
SMK="python3 -m snakemake --cores all --resources gpu=1 --scheduler greedy"
AWQ="config/h200-smoke.yaml config/h200-awq.yaml"

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
    S=$SECONDS; PYTHONPYCACHEPREFIX=/tmp/pyc python3 -m compileall -q -j 0 /opt/torch/.venv/lib/python3.12/site-packages $SITE > /dev/null 2>&1 || true
    printf 'import sys\nsys.pycache_prefix = "/tmp/pyc"\n' > $SITE/sitecustomize.py
    echo "compileall into /tmp/pyc: $((SECONDS - S)) s" | tee /tmp/bytecode.txt
    python3 -c "import vllm, snakemake, gptqmodel, polars, altair; print('vllm', vllm.__version__, 'snakemake', snakemake.__version__, 'gptqmodel', gptqmodel.__version__)" 2>&1 | tail -n 1
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
      date +%s > results/t0-awq
      $SMK --configfile $AWQ -- measurements > results/snakemake-awq.out 2>&1
      date +%s > results/t1" > results/all.out 2>&1 < /dev/null &
    echo "started in /tmp/wf: results/snakemake-awq.out"
    ;;
  stop-awq)  # the whole Snakemake process group: the quantize job with it
    cd /tmp/wf; date +%s > results/t-awq-stopped
    kill -TERM -- "-$(ps -eo pgid,cmd | grep "[s]nakemake --cores" | head -1 | awk '{print $1}')"
    sleep 10; python3 -m snakemake --unlock --configfile $AWQ
    ;;
  fp8)
    : "${SPEEDSPLIT_WORKFLOW_COMMIT:?set it to the commit measured (the copied tree has no .git)}"
    export SPEEDSPLIT_WORKFLOW_COMMIT
    cp config/h200-fp8.yaml /tmp/wf/config/ && cd /tmp/wf
    setsid nohup bash -c "date +%s > results/t0-fp8
      $SMK --configfile config/h200-smoke.yaml config/h200-fp8.yaml -- measurements > results/snakemake-fp8.out 2>&1
      date +%s > results/t1-fp8" > results/all-fp8.out 2>&1 < /dev/null &
    ;;
  fastpack)
    cp docs/evidence/h200-2026-12-02-fp8/awq_fastpack.py /tmp/wf/ && cd /tmp/wf
    setsid nohup python3 awq_fastpack.py > /tmp/awq-exp.log 2>&1 < /dev/null &
    ;;
  status)
    cd /tmp/wf
    grep -E "^\[|Finished|Error|error|steps \(" results/snakemake-awq.out | tail -n 6 || true
    grep "\[speedsplit\]" results/snakemake-awq.out | tail -n 20 || true
    ls results/bench/*/*/*/*/run*.json 2>/dev/null | wc -l
    tail -n 3 results/logs/quantize/*/*.log results/all.out 2>/dev/null || true
    nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader
    # shellcheck disable=SC2046  # the paths that exist
    tar -czf "$OUT/wf.tgz" $(ls -d results/bench results/hardware results/quantize results/logs \
      results/snakemake-*.out results/all.out results/t0-* results/t1 results/topo.txt \
      results/bytecode.txt results/plan.json 2>/dev/null)
    ls -la "$OUT"
    ;;
esac
