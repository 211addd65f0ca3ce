"""Where a decode step's time goes, from a torch profiler trace: each GPU kernel is put in one
class by its name (dense GEMM, quantized GEMM with its dequantisation, attention,
communication, copies, other kernels; memcpy and memset by their category), and the time no kernel runs is the
GPU's idle time (the CPU's scheduling, launches and Python between kernels). The classes add up
to the window exactly: where kernels of two classes overlap (two streams), the time goes to the
first class in CLASSES' order.

On a CPU the trace holds no kernel: the host's ops (`cpu_op` events, nested) are put in the
same classes, an op inside another counting for the first class in that order (an int4 matmul
inside a linear op is quantized GEMM), and the time no op runs is the idle time.

The kernel names are those of vLLM 0.26 on Hopper (cuBLAS's nvjet and sm90 GEMMs, Marlin,
Machete, CUTLASS's FP8 scaled-mm, FlashAttention 3, NCCL and vLLM's custom all-reduce) and of
its CPU build; a kernel no pattern knows counts as `other` and is named in the record's top
kernels, so a misfiled one can be seen.
"""

from __future__ import annotations

import json
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from speedsplit.core.spans import length, union

# In order of precedence: an event matching several patterns goes to the first.
PATTERNS: dict[str, re.Pattern] = {
    # NCCL's kernels and vLLM's custom all-reduce (one- and two-shot, cross_device_reduce)
    "communication": re.compile(
        r"nccl|all_?reduce|allreduce|cross_device_reduce|all_?gather|reduce_?scatter|all_to_all", re.I
    ),
    # attention itself and the KV-cache writes that feed it
    "attention": re.compile(
        r"flash|fmha|attention|attn|paged_?kv|kv_cache|reshape_and_cache|BatchDecode|BatchPrefill|mla_|sdpa", re.I
    ),
    # INT4/INT8/FP8 weight GEMMs and their (de)quantisation kernels
    "quantized_gemm": re.compile(
        r"marlin|machete|gptq|awq|exllama|allspark|conch|w4a16|w4a8|w8a8|wna16|int4|int8|fp8|e4m3|"
        r"scaled_mm|dequant|_quant|quant_",
        re.I,
    ),
    # cuBLAS (nvjet on Hopper, sm90/ampere xmma), CUTLASS, GEMV, and the CPU's matmuls and
    # linear layers (vLLM's CPU build: _C::weight_packed_linear)
    "dense_gemm": re.compile(
        r"gemm|gemv|nvjet|xmma|cublas|cutlass|matmul|s16816|wmma|splitkreduce|aten::(?:mm|addmm|bmm|matmul)\b|"
        r"linear|onednn|mkldnn|dnnl",
        re.I,
    ),
    # memcpy and memset (by their trace category) and the kernels and ops that copy tensors (not
    # Inductor's fused kernels, whose names list the ops fused: triton_red_fused__to_copy_embedding_...)
    "copy": re.compile(r"^(?!triton_).*?(?:copy|aten::to\b|aten::contiguous|aten::clone|memset)", re.I),
}
KERNEL_CLASSES = ("communication", "attention", "quantized_gemm", "dense_gemm", "copy", "other")
CLASSES = (*KERNEL_CLASSES, "idle")  # what a step's time splits into, in order
COPY_CATEGORIES = ("gpu_memcpy", "gpu_memset")
# vLLM names each engine step it runs under the profiler: execute_context_{requests}({tokens})
# _generation_{requests}({tokens}); a step with context tokens prefilled some prompt
STEP_ANNOTATION = re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")
TOP_KERNELS = 3  # the longest kernels named in each class


def classify(name: str) -> str:
    """A kernel's (or a CPU op's) class by its name."""
    for cls, pattern in PATTERNS.items():
        if pattern.search(name):
            return cls
    return "other"


class ProfileWindow(BaseModel):
    """A profiled window of decode steps (config mechanism.profile): after the cell's measured
    phase, one request per user under vLLM's torch profiler."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    delay_iterations: int = Field(16, ge=0, description="engine steps skipped once the load starts (the prefill)")
    iterations: int = Field(32, ge=1, description="engine steps recorded")

    def server_args(self, trace_dir: str) -> list[str]:
        """vLLM server arguments that arm its torch profiler for this window, traces to
        trace_dir (braces doubled: a stack's args are templates)."""
        cfg = {
            "profiler": "torch",
            "torch_profiler_dir": str(trace_dir),
            "torch_profiler_with_stack": False,
            "ignore_frontend": True,
            "delay_iterations": self.delay_iterations,
            "max_iterations": self.iterations,
        }
        return ["--profiler-config", json.dumps(cfg).replace("{", "{{").replace("}", "}}")]


class StepSplit(BaseModel):
    """One trace's window, per engine step, in ms: the classes add up to step_ms."""

    model_config = ConfigDict(extra="forbid")

    device: Literal["gpu", "cpu"] = Field(description="gpu: kernels; cpu: the host's ops (no GPU in the trace)")
    step_ms: float
    communication_ms: float
    attention_ms: float
    quantized_gemm_ms: float
    dense_gemm_ms: float
    other_ms: float
    copy_ms: float
    idle_ms: float
    steps: int = Field(description="engine steps in the window (vLLM's step annotations; else the window's iterations)")
    prefill_steps: int | None = Field(
        None, description="of them, steps that prefilled prompt tokens (null: not annotated)"
    )
    kernels: int = Field(description="kernel (or op) events in the window")
    top: dict[str, list[tuple[str, float]]] = Field(
        default_factory=dict, description="per class, its longest kernels by name with ms a step"
    )

    @property
    def compute_ms(self) -> float:
        """Every kernel's time but communication's and copies'."""
        return self.attention_ms + self.quantized_gemm_ms + self.dense_gemm_ms + self.other_ms


def split_trace(events: list[dict], steps: int) -> StepSplit | None:
    """The trace's window per step, split into CLASSES (module doc); None when it holds neither
    a kernel nor a CPU op. The window's steps are those vLLM annotated, else `steps`."""
    kernels = [e for e in events if e.get("ph") == "X" and "dur" in e and e.get("cat") == "kernel"]
    copies = [e for e in events if e.get("ph") == "X" and "dur" in e and e.get("cat") in COPY_CATEGORIES]
    device = "gpu"
    if not (kernels or copies):
        kernels = [e for e in events if e.get("ph") == "X" and "dur" in e and e.get("cat") == "cpu_op"]
        device = "cpu"
    if not (kernels or copies):
        return None
    annotated = {
        (float(e["ts"]), m.group(1))
        for e in events
        if e.get("cat") == "user_annotation"
        if (m := STEP_ANNOTATION.match(e.get("name", "")))
    }
    if annotated:
        steps = len(annotated)
    spans: dict[str, list[tuple[float, float]]] = {c: [] for c in KERNEL_CLASSES}
    named: dict[tuple[str, str], float] = {}
    for e in kernels:
        cls = classify(e.get("name", ""))
        spans[cls].append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
        key = (cls, e.get("name", "")[:120])
        named[key] = named.get(key, 0.0) + float(e["dur"])
    for e in copies:
        spans["copy"].append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    # each class takes the time no class before it holds: the union grows class by class
    taken: list[tuple[float, float]] = []
    own: dict[str, float] = {}
    for cls in KERNEL_CLASSES:
        grown = union(taken + spans[cls])
        own[cls] = length(grown) - length(taken)
        taken = grown
    window = taken[-1][1] - taken[0][0]
    per_step = 1e-3 / steps  # µs over the window -> ms per step
    top: dict[str, list[tuple[str, float]]] = {}
    for (cls, name), us in sorted(named.items(), key=lambda kv: -kv[1]):
        if len(top.setdefault(cls, [])) < TOP_KERNELS:
            top[cls].append((name, round(us * per_step, 6)))
    return StepSplit(
        device=device,
        step_ms=window * per_step,
        **{f"{c}_ms": own[c] * per_step for c in KERNEL_CLASSES},
        idle_ms=(window - length(taken)) * per_step,
        steps=steps,
        prefill_steps=sum(1 for _, ctx in annotated if ctx != "0") if annotated else None,
        kernels=len(kernels),
        top=top,
    )


class ProfileRecord(BaseModel):
    """A run's profiled window of decode steps (null where its job profiled none)."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["ok", "error"]
    window: ProfileWindow
    error: str | None = Field(None, description="why there is no split")
    ranks: list[StepSplit] = Field(default_factory=list, description="one split per trace (per GPU or host process)")
    traces: list[str] = Field(default_factory=list, description="the trace files kept, under the run's profile folder")
    seconds: float | None = Field(None, description="how long the profile took, the load and the traces' flush")

    @property
    def split(self) -> StepSplit | None:
        """The ranks' mean (one rank: its own split)."""
        if not self.ranks:
            return None
        n = len(self.ranks)
        fields = [f for f in StepSplit.model_fields if f.endswith("_ms")]
        mean = {f: sum(getattr(r, f) for r in self.ranks) / n for f in fields}
        first = self.ranks[0]
        return StepSplit(
            device=first.device,
            steps=first.steps,
            prefill_steps=first.prefill_steps,
            kernels=sum(r.kernels for r in self.ranks),
            top=first.top,
            **mean,
        )
