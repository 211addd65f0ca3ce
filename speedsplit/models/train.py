"""A small model that has learned something: a synthetic shape trained briefly on the Python
standard library's sources (models/corpus.py), with a byte-level BPE tokenizer trained on the
same text. Its FP16 and INT4 outputs then differ for real reasons, so the quality factors of a
chain (analysis/quality.py) say something on a machine with no model hub.

Seeded and single-process, so the same library and versions give the same weights; the tiny
shape trains in about a minute on 2 cores. The held-out part of the corpus is written beside
the weights (HELD_OUT_TEXT), the text the quality probes score the model on, and a sample of
what it trained on (TRAIN_SAMPLE_TEXT), the text its GPTQ quantization calibrates on.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from speedsplit.models.corpus import Corpus, stdlib_corpus

HELD_OUT_TEXT = "speedsplit-heldout.txt"
# A sample of the text it trained on: what GPTQ calibrates the model on (never the held-out text,
# which the quality checks score).
TRAIN_SAMPLE_TEXT = "speedsplit-train-sample.txt"
TRAIN_SAMPLE_CHARS = 400_000
# Shapes small enough to train on a CPU in the model rule (parameters, at most).
MAX_TRAINED_PARAMS = 5_000_000


@dataclass(frozen=True)
class Training:
    """How the model is trained (config models.*.training)."""

    steps: int = 1000
    seq_len: int = 128
    batch: int = 16
    lr: float = 3e-3
    warmup_steps: int = 20


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


def _lr(step: int, t: Training) -> float:
    """Linear warm-up, then a cosine down to a tenth."""
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    done = (step - t.warmup_steps) / max(1, t.steps - t.warmup_steps)
    return t.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * done)))


def _batch(ids, t: Training, gen):
    import torch

    starts = torch.randint(0, len(ids) - t.seq_len - 1, (t.batch,), generator=gen)
    return torch.stack([ids[s : s + t.seq_len] for s in starts.tolist()])


def mean_loss(model, ids, seq_len: int, windows: int = 16) -> float:
    """Mean next-token loss (nats) over up to `windows` consecutive windows of ids."""
    import torch

    n = min(windows, (len(ids) - 1) // seq_len)
    with torch.no_grad():
        x = ids[: n * seq_len].view(n, seq_len)
        return float(model(input_ids=x, labels=x).loss)


def train(cfg: dict, corpus: Corpus, t: Training, seed: int, progress=print):
    """Train a causal LM of config cfg on the corpus; returns (model in FP16, tokenizer, report)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from speedsplit.models.checkpoint import SPECIAL_TOKENS

    # every core the process may run on (a cluster job's allocation), whatever OMP_NUM_THREADS
    # says (Snakemake sets it to a job's threads: one)
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    t0 = time.perf_counter()
    tokenizer = train_tokenizer(corpus.train, cfg["vocab_size"], SPECIAL_TOKENS)
    tok_s = time.perf_counter() - t0
    train_ids = torch.tensor(tokenizer(corpus.train)["input_ids"], dtype=torch.long)
    held_ids = torch.tensor(tokenizer(corpus.held_out)["input_ids"], dtype=torch.long)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg), dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    if params > MAX_TRAINED_PARAMS:
        raise ValueError(
            f"a model of {params:,} parameters is too large to train here (at most {MAX_TRAINED_PARAMS:,})"
        )
    opt = torch.optim.AdamW(model.parameters(), lr=t.lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    first = last = None
    t1 = time.perf_counter()
    for step in range(t.steps):
        for group in opt.param_groups:
            group["lr"] = _lr(step, t)
        x = _batch(train_ids, t, gen)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        last = loss.item()
        first = last if first is None else first
        if step % 50 == 0 or step == t.steps - 1:
            progress(f"train: step {step + 1}/{t.steps}, loss {last:.3f} ({time.perf_counter() - t1:.0f} s)")
    model.eval()
    held = mean_loss(model, held_ids, t.seq_len)
    report = {
        **asdict(t),
        "seed": seed,
        "parameters": params,
        "train_tokens": len(train_ids),
        "held_out_tokens": len(held_ids),
        "tokens_seen": t.steps * t.batch * t.seq_len,
        "loss_first": first,
        "loss_last": last,
        "held_out_loss": held,
        "held_out_perplexity": math.exp(held),
        "tokenizer_s": tok_s,
        "threads": torch.get_num_threads(),
        "train_s": time.perf_counter() - t1,
        "corpus": corpus.identity,
    }
    return model.to(torch.float16), tokenizer, report


def write_trained(cfg: dict, out: Path, seed: int, training: Training, progress=print) -> dict:
    """Train and write the model, its tokenizer and its held-out text into out; returns the
    training report."""
    corpus = stdlib_corpus()
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
