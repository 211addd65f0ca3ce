"""llama.cpp's side of a model: its GGUF file, converted from the FP16 checkpoint by llama.cpp's
own converter, and the GPT-2 vocabulary a synthetic model takes so that llama.cpp and the HF
side tokenize a prompt alike.

llama.cpp comes from `make llama-cpp` (envs/llama.cpp.sh): the server binary in the
environment's bin/, its converter and vocabularies in share/llama.cpp/. SPEEDSPLIT_LLAMA_CPP
names another install prefix, SPEEDSPLIT_LLAMA_SERVER another server binary.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from speedsplit.core.results import atomic_dir
from speedsplit.models.checkpoint import ModelError

GGUF_FILE = "model.gguf"
GGUF_TYPES = ("f16", "bf16", "q8_0")
GPT2_VOCAB = "ggml-vocab-gpt-2.gguf"
BUILD_HINT = "make llama-cpp builds it (envs/llama.cpp.sh)"


def prefix() -> Path:
    return Path(os.environ.get("SPEEDSPLIT_LLAMA_CPP") or sys.prefix)


def share() -> Path:
    """llama.cpp's converter and vocabularies, or a one-line ModelError saying how to get them."""
    folder = prefix() / "share" / "llama.cpp"
    if not (folder / "convert_hf_to_gguf.py").is_file():
        raise ModelError(f"llama.cpp's converter is not in {folder}: {BUILD_HINT}")
    return folder


def server_binary() -> str | None:
    """The llama-server to start: $SPEEDSPLIT_LLAMA_SERVER, the environment's, or PATH's."""
    named = os.environ.get("SPEEDSPLIT_LLAMA_SERVER")
    if named:
        return named
    own = prefix() / "bin" / "llama-server"
    return str(own) if own.is_file() else shutil.which("llama-server")


def gpt2_tokenizer(out_dir: Path) -> int:
    """GPT-2's tokenizer, read from the vocabulary llama.cpp ships, saved in out_dir as a
    transformers tokenizer; returns its vocabulary size."""
    from transformers import AutoTokenizer

    vocab = share() / "models"
    tok = AutoTokenizer.from_pretrained(str(vocab), gguf_file=GPT2_VOCAB)
    tok.save_pretrained(out_dir)
    return len(tok)


def convert(fp16_dir: str | Path, out_dir: str | Path, gguf_type: str) -> dict:
    """The FP16 checkpoint as one GGUF file of gguf_type (llama.cpp's convert_hf_to_gguf.py),
    written whole or not at all; returns what the gguf rule reports."""
    if gguf_type not in GGUF_TYPES:
        raise ModelError(f"unknown GGUF type {gguf_type!r} (known: {', '.join(GGUF_TYPES)})")
    fp16_dir = Path(fp16_dir)
    script = share() / "convert_hf_to_gguf.py"
    with atomic_dir(out_dir) as tmp:
        t0 = time.monotonic()
        run = subprocess.run(
            [sys.executable, str(script), str(fp16_dir), "--outfile", str(tmp / GGUF_FILE), "--outtype", gguf_type],
            capture_output=True,
            text=True,
        )
        print(run.stdout + run.stderr, flush=True)  # to the rule's log
        if run.returncode != 0:
            last = (run.stderr.strip().splitlines() or ["no output"])[-1]
            raise ModelError(f"llama.cpp could not convert {fp16_dir} to GGUF {gguf_type}: {last}")
        report = {
            "variant": "gguf",
            "gguf_type": gguf_type,
            "method": "llama.cpp convert_hf_to_gguf.py",
            "convert_s": round(time.monotonic() - t0, 2),
            "size_gib": round((tmp / GGUF_FILE).stat().st_size / 2**30, 4),
            "converted_from": str(fp16_dir),
        }
        (tmp / "speedsplit-model.json").write_text(json.dumps(report, indent=2))
    return report


def check_gguf(model_dir: str | Path) -> None:
    """A gguf model folder holds a GGUF file (its magic checked), or a one-line ModelError."""
    path = Path(model_dir) / GGUF_FILE
    if not path.is_file():
        raise ModelError(f"model folder {model_dir} has no {GGUF_FILE}")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ModelError(f"{path} is not a GGUF file")
