#!/bin/bash
# The commands this evidence was measured with, on the GPU host (two H200s, Python 3.12 with
# torch 2.11, transformers 5.17 and nvidia-ml-py, no network), from the repository root:
#   bash host.sh gather DIR   # after each part of the install set reached the host as DIR
#   bash host.sh unpack       # vLLM 0.26.0 (sha256-checked), its wheels and the workflow's wheels
#   bash host.sh start        # the workflow's measurements, in the background
#   bash host.sh status; bash host.sh pack
set -euo pipefail
HERE=docs/evidence/h200x2-2026-11-30-capacity-steady
CONFIG="config/h200-smoke.yaml config/h200-capacity.yaml config/h200-capacity-steady.yaml $HERE/two-cards.yaml" \
    GPUS=2 exec bash docs/evidence/h200x2-2026-11-30-references/host.sh "$@"
