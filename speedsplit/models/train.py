"""A small model that has learned something: a synthetic shape trained briefly on the Python
standard library's sources (models/corpus.py), with a byte-level BPE tokenizer trained on the
same text. Its FP16 and INT4 outputs then differ for real reasons, so the quality factors of a
chain (analysis/quality.py) say something on a machine with no model hub, and a speculative
decoder's acceptance is that of a model that predicts its text.

Seeded and single-process, so the same library and versions give the same weights on a CPU; the
tiny shape trains in about a minute on 2 cores. On a CUDA card (the small shapes: a few hundred
million parameters) it trains in bfloat16 autocast, for a bounded time (`max_s`: the schedule is
fitted to the steps that time allows, measured over the first steps), so its step count, and its
weights, depend on the card: the report says how many steps it took. The held-out part of the corpus is written beside
the weights (HELD_OUT_TEXT), the text the quality probes score the model on, and a sample of
what it trained on (TRAIN_SAMPLE_TEXT), the text its GPTQ quantization calibrates on.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from speedsplit.core.numbers import Positive
from speedsplit.models.corpus import Corpus, stdlib_corpus

HELD_OUT_TEXT = "speedsplit-heldout.txt"
# A sample of the text it trained on: what GPTQ calibrates the model on (never the held-out text,
# which the quality checks score).
TRAIN_SAMPLE_TEXT = "speedsplit-train-sample.txt"
TRAIN_SAMPLE_CHARS = 400_000
# Shapes small enough to train in the model rule (parameters, at most), on a CPU and on a card.
MAX_TRAINED_PARAMS = {"cpu": 5_000_000, "cuda": 1_000_000_000}
TIMED_STEPS = 10  # steps after the warm-up whose time fits the schedule to max_s


class Training(BaseModel):
    """How the model is trained: config models.*.training (planning/model_config.py's entry,
    whose schema this is)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(1000, ge=1, description="Optimiser steps (the tiny shape does about 19 a second on 2 cores).")
    seq_len: int = Field(128, ge=8, description="Tokens per training sequence.")
    batch: int = Field(16, ge=1, description="Sequences per step.")
    lr: Positive = Field(0.003, description="Peak learning rate (AdamW, cosine decay).")
    warmup_steps: int = Field(20, ge=0, description="Steps of linear warm-up.")
    max_s: Positive | None = Field(
        None,
        description="Train at most this long (seconds): the steps the time allows, measured over the first ones, "
        "the schedule fitted to them (steps at most). The step count then depends on the card; the model's "
        "speedsplit-model.json records it.",
    )
    corpus_bytes: int = Field(
        4_000_000, ge=100_000, description="Bytes of the Python standard library's sources to train on."
    )
    corpus: Literal["stdlib", "installed"] = Field(
        "stdlib",
        description="'stdlib': the standard library's sources alone (8 MB on Python 3.12); 'installed': the "
        "installed packages' sources beside them (more text: what a model of hundreds of millions of parameters "
        "needs not to learn the library by heart).",
    )


def train_tokenizer(text: str, vocab_size: int, special_tokens: list[str]):
    """A byte-level BPE tokenizer of vocab_size tokens learnt from text (every string encodes;
    the special tokens take the first ids)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text.split("\n\n"), trainer)
    unk, bos, eos = special_tokens
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token=unk, bos_token=bos, eos_token=eos, pad_token=unk, model_max_length=1 << 30
    )


def _lr(step: int, t: Training, total: int | None = None) -> float:
    """Linear warm-up, then a cosine down to a tenth at step `total` (t.steps unless fitted)."""
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    done = (step - t.warmup_steps) / max(1, (total or t.steps) - t.warmup_steps)
    return t.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, done))))


def fitted_steps(t: Training, step: int, elapsed_s: float, step_s: float) -> int:
    """The steps a time bound allows: those done, and as many more as the time left holds at
    step_s each (t.steps at most, one more than done at least)."""
    if t.max_s is None or step_s <= 0:
        return t.steps
    return max(step + 1, min(t.steps, step + int((t.max_s - elapsed_s) / step_s)))


def _batch(ids, t: Training, gen):
    import torch

    starts = torch.randint(0, len(ids) - t.seq_len - 1, (t.batch,), generator=gen)
    return torch.stack([ids[s : s + t.seq_len] for s in starts.tolist()])


def mean_loss(model, ids, seq_len: int, windows: int = 16) -> float:
    """Mean next-token loss (nats) over up to `windows` consecutive windows of ids."""
    import torch

    n = min(windows, (len(ids) - 1) // seq_len)
    device = next(model.parameters()).device
    with torch.no_grad():
        x = ids[: n * seq_len].view(n, seq_len).to(device)
        return float(model(input_ids=x, labels=x).loss)


def train(cfg: dict, corpus: Corpus, t: Training, seed: int, progress=print):
    """Train a causal LM of config cfg on the corpus (on the card where there is one); returns
    (model in FP16, tokenizer, report)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from speedsplit.models.checkpoint import SPECIAL_TOKENS

    # every core the process may run on (a cluster job's allocation), whatever OMP_NUM_THREADS
    # says (Snakemake sets it to a job's threads: one)
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    tokenizer = train_tokenizer(corpus.train, cfg["vocab_size"], SPECIAL_TOKENS)
    tok_s = time.perf_counter() - t0
    train_ids = torch.tensor(tokenizer(corpus.train)["input_ids"], dtype=torch.long)
    held_ids = torch.tensor(tokenizer(corpus.held_out)["input_ids"], dtype=torch.long)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg), dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    if params > MAX_TRAINED_PARAMS[device]:
        raise ValueError(
            f"a model of {params:,} parameters is too large to train here "
            f"(at most {MAX_TRAINED_PARAMS[device]:,} on a {device.upper()})"
        )
    model.to(device)
    # on a card: bfloat16 matrix products (float32 weights and optimiser state)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=t.lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    first = last = None
    total = t.steps
    t1 = time.perf_counter()
    timed_from = None
    step = 0
    while step < total:
        for group in opt.param_groups:
            group["lr"] = _lr(step, t, total)
        x = _batch(train_ids, t, gen).to(device)
        with autocast:
            loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        last = loss.item()  # waits for the step: the time below is the step's
        first = last if first is None else first
        step += 1
        if step == max(1, t.warmup_steps):
            timed_from = (step, time.perf_counter())
        elif timed_from and step == timed_from[0] + TIMED_STEPS and t.max_s is not None:
            step_s = (time.perf_counter() - timed_from[1]) / TIMED_STEPS
            total = fitted_steps(t, step, time.perf_counter() - t1, step_s)
            progress(f"train: {step_s * 1e3:.0f} ms a step, {total} steps in {t.max_s:.0f} s")
        if step % 50 == 1 or step == total:
            progress(f"train: step {step}/{total}, loss {last:.3f} ({time.perf_counter() - t1:.0f} s)")
    model.eval()
    held = mean_loss(model, held_ids, t.seq_len)
    report = {
        **t.model_dump(),
        "steps_done": step,
        "seed": seed,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "parameters": params,
        "train_tokens": len(train_ids),
        "held_out_tokens": len(held_ids),
        "tokens_seen": step * t.batch * t.seq_len,
        "loss_first": first,
        "loss_last": last,
        "held_out_loss": held,
        "held_out_perplexity": math.exp(held),
        "tokenizer_s": tok_s,
        "threads": torch.get_num_threads(),
        "train_s": time.perf_counter() - t1,
        "corpus": corpus.identity,
    }
    return model.to("cpu", torch.float16), tokenizer, report


def write_trained(cfg: dict, out: Path, seed: int, training: Training, progress=print) -> dict:
    """Train and write the model, its tokenizer and its held-out text into out; returns the
    training report."""
    corpus = stdlib_corpus(train_bytes=training.corpus_bytes, installed=training.corpus == "installed")
    model, tokenizer, report = train(cfg, corpus, training, seed, progress)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (Path(out) / HELD_OUT_TEXT).write_text(corpus.held_out)
    (Path(out) / TRAIN_SAMPLE_TEXT).write_text(corpus.train[:TRAIN_SAMPLE_CHARS])
    progress(
        f"train: {report['parameters']:,} parameters, {report['tokens_seen']:,} tokens in {report['train_s']:.0f} s; "
        f"held-out perplexity {report['held_out_perplexity']:.1f}"
    )
    return report
