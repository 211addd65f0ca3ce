"""What a server's log and exit say: one launch's output, the lines that name a failure, the
exit's cause in words, and the facts the engine logged about itself (kernel, attention
backend, weight and KV-cache memory)."""

from __future__ import annotations

import re
import signal
from datetime import datetime
from pathlib import Path


def launch_output(log_path: str | Path, offset: int) -> str:
    """A server log from `offset` (where one launch's output starts); empty if unreadable."""
    try:
        with open(log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


# A log line that names a failure: an exception with its message (a class named ...Error or
# ...Exception, or a traceback's last line, `package.module.Class: message`), a fatal CUDA or
# memory error, the kernel's "Killed", a command line's refusal ("api_server.py: error:
# unrecognized arguments: ..."). Class names are matched as written (a line of code that says
# send_no_error names nothing). vLLM prefixes its lines with the process and level.
_CAUSE = re.compile(
    r"(?:(?-i:\b[A-Z]\w*(?:Error|Exception))\b:?.*|(?-i:^[a-z_]\w*(?:\.[a-z_]\w*)+\.[A-Z]\w*): .+"
    r"|CUDA error:.*|\bout of memory\b.*|^Killed$|Segmentation fault.*|(?<=: )error: .+|^error: .+)",
    re.I,
)
_PREFIX = re.compile(r"^(?:\(\w+ pid=\d+\)\s*)?(?:(?:ERROR|CRITICAL|WARNING|INFO)\s+[\d-]+ [\d:.]+ \[[^\]]*\]\s*)?")


_QUIET_LEVEL = re.compile(r"(?:^|[\s\]\)-])(?:DEBUG|INFO|WARNING|WARN)(?=[\s:\-]|$)")


def log_cause(text: str, lines: int = 3) -> str:
    """The last distinct lines of a server log that name a failure (an exception and its
    message first of all), prefixes stripped; empty when the log names none."""
    found: list[str] = []
    for raw in text.splitlines():
        if _QUIET_LEVEL.search(raw[:80]):
            continue  # a warning that mentions an error is not the failure
        line = _PREFIX.sub("", raw.strip()).strip()
        if not line or line.startswith(("File ", "Traceback", "raise ", "^")):
            continue
        m = _CAUSE.search(line)
        if m:
            cause = line[:300]
            if cause in found:
                found.remove(cause)
            found.append(cause)
    return " | ".join(found[-lines:])


def exit_cause(returncode: int | None) -> str:
    """A server's end in words: its exit code, or the signal that killed it."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        sig = -returncode
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        why = " (sent by the kernel's out-of-memory killer, or kill -9)" if sig == signal.SIGKILL else ""
        return f"killed by {name} (signal {sig}){why}"
    return f"exited with code {returncode}"


# --- what the engine says it ran -------------------------------------------------------------

_FACTS = {
    "linear_kernel": [r"Using (\w+LinearKernel) for", r"Using (\w*[Mm]arlin\w*) kernel", r"(\w+LinearKernel)"],
    "attention_backend": [
        r"Using (?:AttentionBackendEnum\.)?(\w+) (?:attention )?backend",
        r"attn_implementation[=: ]+['\"]?(\w+)",
    ],
    "weight_memory_gib": [r"Model loading took ([\d.]+) ?GiB", r"model weights take ([\d.]+) ?GiB"],
    "kv_cache_tokens": [r"KV cache size: ([\d,]+) tokens"],
    "kv_cache_gib": [
        r"Available KV cache memory: ([\d.]+) ?GiB",  # vLLM
        r"reserved ([\d.]+) ?GiB memory for KV Cache as specified by kv_cache_memory_bytes",  # vLLM, sized by hand
        r"Memory available for cache allocation: (\d+) ?(MB)",  # transformers' continuous batching
    ],
    # vLLM counts its CUDA graphs outside --gpu-memory-utilization and says what would fit
    "kv_cache_fit_gib": [r"--kv-cache-memory=\d+` \(([\d.]+) GiB\) to fit into requested memory"],
    "max_concurrency": [r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x"],
    # where a vLLM start-up went (the rest of startup_s: imports, the API server, health polls)
    # (vLLM's V1 model runner says "GiB memory and"; a drafter's compile is added to the model's)
    "load_s": [r"Model loading took [\d.]+ ?GiB(?: memory)? and ([\d.]+) seconds"],
    "compile_s": [r"torch\.compile took ([\d.]+) s in total"],
    "graphs_s": [r"Graph capturing finished in ([\d.]+) secs"],
    "engine_init_s": [r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"],
    "quantization": [r"quantization=(\w+)"],
    # a compiled extension the engine or a plugin of it could not load, running on its fallback
    # instead (LMCache: "lmcache.cuda_ops compiled extension not found; CudaDeviceOps stays on the
    # torch baseline for all ops", a wheel built against another torch)
    "missing_extension": [r"([\w.]+) compiled extension not found; .*(?:baseline|fallback)"],
    "dtype": [r"dtype=(torch\.\w+|\w+)"],
}
_NUMBERS = {
    "weight_memory_gib": float,
    "kv_cache_gib": float,
    "kv_cache_fit_gib": float,
    "max_concurrency": float,
    "kv_cache_tokens": int,
    "load_s": float,
    "compile_s": float,
    "graphs_s": float,
    "engine_init_s": float,
}
# vLLM's compile cache: read back (warm) or filled (cold) in this launch
_WARM = re.compile(r"Directly load (?:the compiled graph|AOT compilation)")
_COLD = re.compile(r"Compiling a graph for compile range|saved AOT compiled function")


# Facts a launch reports once per model it compiles (a speculative drafter's too): their sum
_SUMMED = {"compile_s"}


def engine_facts(log_text: str) -> dict:
    """Facts the engine reported about itself (first match of each, or the sum of every
    match for _SUMMED), None where silent."""
    facts: dict = {}
    for key, patterns in _FACTS.items():
        facts[key] = None
        if key in _SUMMED:
            found = [_NUMBERS[key](v) for pat in patterns for v in re.findall(pat, log_text)]
            facts[key] = round(sum(found), 3) if found else None
            continue
        for pat in patterns:
            m = re.search(pat, log_text)
            if m:
                value = m.group(1).replace(",", "")
                facts[key] = _NUMBERS[key](value) if key in _NUMBERS else value
                if m.re.groups > 1 and m.group(2) == "MB":
                    facts[key] = round(facts[key] / 1024, 3)
                break
    facts["compile_cache"] = "warm" if _WARM.search(log_text) else "cold" if _COLD.search(log_text) else None
    for key, (start, end) in _SPANS.items():
        facts[key] = _span_s(log_text, start, end)
    return facts


# Start-up phases the engine does not time itself, read off its log lines' clocks (whole
# seconds): (the line it starts at, the line it ends at).
_SPANS = {
    # the API server resolving the model's configuration (a cold vLLM cache inspects the
    # model class in a subprocess here)
    "config_s": (r"non-default args", r"Resolved architecture"),
    # the engine process starting: its own imports, until it initialises the engine
    "spawn_s": (r"Resolved architecture", r"Initializing a V1 LLM engine"),
    # after the CUDA graphs: the KV cache's set-up and the warm-up runs
    "warmup_s": (r"Graph capturing finished", r"init engine \(profile, create kv cache, warmup model\) took"),
}
_CLOCK = re.compile(r"(?:INFO|WARNING|DEBUG|ERROR) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")


def _span_s(log_text: str, start: str, end: str) -> float | None:
    """Seconds between the first log line matching start and the first matching end."""
    times = []
    for pat in (start, end):
        line = next((ln for ln in log_text.splitlines() if re.search(pat, ln)), None)
        m = _CLOCK.search(line) if line else None
        if m is None:
            return None
        mo, d, h, mi, sec = map(int, m.groups())
        # the lines carry no year: a leap one, so that 02-29 reads (a span across a new year reads back in time)
        times.append(datetime(2000, mo, d, h, mi, sec))
    return (times[1] - times[0]).total_seconds() if times[1] >= times[0] else None


def kernel_matches(expect: str, kernel: str | None) -> bool | None:
    """None when nothing is expected; else whether the reported kernel matches the regex."""
    if not expect:
        return None
    return bool(re.search(expect, kernel or ""))
