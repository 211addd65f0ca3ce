"""Each experiment answers its own question on the report's first screen: the blocks the
analyses give (capacity, factorial, topologies, traffic), read from committed evidence."""

import pytest
from conftest import REPO

from speedsplit.output import analyses
from speedsplit.output.aggregate import evidence_frames

EVIDENCE = REPO / "docs" / "evidence"


@pytest.mark.parametrize(
    "folder, heading, says",
    [
        (
            "h200-2026-11-30-capacity",
            "Capacity",
            ["hf-fp16 32, broke at 64", "vllm-fp16 96, broke at 128", "vllm-marlin / vllm-fp16 0.667×"],
        ),
        (
            "h200x2-2026-11-30-factorial",
            "The operational number, decomposed",
            # two runs of hf-generate-b64 greedy 2.3x apart (480 and 1109 tok/s): an interval as wide as that
            ["operational runtime factor 25.7× [3.05, 216] = matched 8.8×", "batch ceiling 2.89×"],
        ),
        (
            "h200x2-2026-11-30-topologies",
            "Topologies: does sharding pay?",
            ["vllm-marlin at u64-h200-wide-greedy (llama-3.1-8b): 2x1 1.64×", "2x1 wins (2x1 / tp2 1.1×"],
        ),
        (
            "h200-2026-12-01-traffic",
            "Under traffic",
            [
                "study at r16-mix-greedy (16 req/s), llama-3.1-8b: goodput: runtime 21×",
                "prefix caching",
                "Sustainable req/s",
            ],
        ),
        (
            "h200x2-2026-11-30-references",
            "INT4 kernels against FP16",
            ["at 64 users (h200-wide; llama-3.1-8b, tp1): MacheteLinearKernel 1.03× [0.994, 1.07]; MarlinLinearKernel"],
        ),
    ],
)
def test_an_experiments_first_screen_answers_its_question(folder, heading, says):
    block = "".join(analyses.answers(evidence_frames(EVIDENCE / folder)[0]))
    assert heading in block
    for text in says:
        assert text in block, text


def test_a_plain_chain_run_has_no_block_of_its_own():
    assert analyses.answers(evidence_frames(EVIDENCE / "h200x2-2026-11-30-energy")[0]) == []
