"""An install set for a host without network (`speedsplit bundle`): the wheels a target Python
needs for a requirements file, less what the host already has, with the project's own wheel,
a manifest, and the whole split into parts of a given size with their checksums.

    speedsplit bundle --requirements requirements/gpu.txt --have host-freeze.txt \\
        --python-version 3.12 --out bundle/ [--part-mib 58]

`--have` is the host's `pip freeze`: a package it holds at a version the requirements accept
is left out (torch and its CUDA libraries stay the host's); one it holds at a version they
refuse is bundled and named in the manifest as shadowing the host's. Every other requirement is
fetched for the target (its Python, its platform tags: `pip download --only-binary=:all:`), one
version each, and its own requirements followed for the target's markers; a package with no
wheel for the target is built from its sdist where it is pure Python. With `--lock` (name==version
lines, requirements/gpu.lock: what ran), a package takes its pinned version. It does not
backtrack: two requirements that no one version meets fail the build with one line naming both
(pin the package in the lock or the requirements file).

The archive holds the wheels and the project (the checkout's tracked files, of its evidence
folders only their configs and notes: the workflow runs from there). The folder it writes:
`bundle.tar.partNNN`, `SHA256SUMS`, `manifest.json` (a copy, to read) and `install.py`
(speedsplit/offline/host.py, which needs only Python on the host).
"""

from __future__ import annotations

import fnmatch
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from speedsplit.core.errors import UserError
from speedsplit.offline import host

REPO = Path(__file__).resolve().parents[2]
# The largest part: a GPU host takes at most 64 MiB a transfer, a part and the workflow's tree
# (its evidence folders out of it: tests/workflow/test_evidence.py) together.
PART_MIB = 58.0
# manylinux tags a wheel for an x86-64 Linux host may carry (glibc 2.17 to 2.39)
LINUX_X86_64 = [f"manylinux_2_{n}_x86_64" for n in range(17, 40)] + ["manylinux2014_x86_64", "linux_x86_64"]


class BundleBuildError(UserError, ValueError):
    """A bundle that cannot be built, and why (one line)."""


@dataclass(frozen=True)
class Target:
    """The host's Python: its version (3.12) and the platform tags its wheels may carry, and
    folders of wheels built elsewhere that pip may take first (a C extension with no wheel on
    the index, built on a Python of the host's version)."""

    python_version: str
    platforms: tuple[str, ...] = tuple(LINUX_X86_64)
    find_links: tuple[str, ...] = ()

    def environment(self) -> dict[str, str]:
        """Marker values of the target (PEP 508), for the requirements' markers."""
        env = default_environment()
        env.update(
            python_version=self.python_version,
            python_full_version=f"{self.python_version}.0",
            sys_platform="linux",
            platform_system="Linux",
            platform_machine="x86_64",
            os_name="posix",
            implementation_name="cpython",
            platform_python_implementation="CPython",
        )
        return env

    def pip_args(self) -> list[str]:
        args = ["--python-version", self.python_version, "--implementation", "cp", "--only-binary=:all:"]
        for p in self.platforms:
            args += ["--platform", p]
        for d in self.find_links:
            args += ["--find-links", str(d)]
        return args


def read_freeze(path: str | Path) -> dict[str, Version | None]:
    """A `pip freeze`: canonical name -> version (None: installed from a path or URL)."""
    have: dict[str, Version | None] = {}
    for raw in Path(path).read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement:
            raise BundleBuildError(f"{path}: {raw!r} is not a `pip freeze` line") from None
        pins = [s.version for s in req.specifier if s.operator == "=="]
        try:
            have[canonicalize_name(req.name)] = Version(pins[0]) if pins else None
        except InvalidVersion:
            have[canonicalize_name(req.name)] = None
    return have


def read_omit(path: str | Path) -> dict[str, str]:
    """Packages left out on purpose: `pattern: why` lines (fnmatch patterns: `nvidia-*`)."""
    omit = {}
    for raw in Path(path).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, why = line.partition(":")
        if not sep or not why.strip():
            raise BundleBuildError(f"{path}: {raw!r} is not a 'package: why it is left out' line")
        omit[canonicalize_name(name.strip()) if "*" not in name else name.strip().lower()] = why.strip()
    return omit


def _omitted(name: str, omit: dict[str, str]) -> str | None:
    return next((why for pat, why in omit.items() if fnmatch.fnmatchcase(name, pat)), None)


def read_requirements(path: str | Path) -> list[Requirement]:
    out = []
    for raw in Path(path).read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            out.append(Requirement(line))
        except InvalidRequirement:
            raise BundleBuildError(f"{path}: {raw!r} is not a requirement") from None
    return out


@dataclass
class Picked:
    name: str
    version: Version
    file: str
    needed_by: list[str] = field(default_factory=list)
    extras: set[str] = field(default_factory=set)


def _requires(wheel: Path) -> list[Requirement]:
    """A wheel's own requirements (its METADATA's Requires-Dist)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode("utf-8", "replace")
    reqs = []
    for line in text.split("\n\n", 1)[0].splitlines():
        if line.startswith("Requires-Dist:"):
            reqs.append(Requirement(line.split(":", 1)[1].strip()))
    return reqs


def _fetch(req: Requirement, target: Target, into: Path, pin: Version | None = None) -> Path:
    """One wheel for the target meeting req (no dependencies): the pinned version, else the
    newest the index has; else a wheel built from its sdist (pure Python only)."""
    spec = f"{req.name}=={pin}" if pin is not None else f"{req.name}{req.specifier}"
    before = set(into.iterdir())
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(into), *target.pip_args(), spec]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:  # no wheel for the target: build one from the sdist
        src = Path(tempfile.mkdtemp(dir=into.parent))
        cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-binary", ":all:", "-w", str(src), spec]
        built = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(src.glob("*-none-any.whl"))
        if built.returncode != 0 or not wheels:
            why = (done.stderr or done.stdout).strip().splitlines()[-1:]
            raise BundleBuildError(f"{spec}: no wheel for Python {target.python_version} on Linux x86-64 ({why})")
        shutil.move(str(wheels[0]), into / wheels[0].name)
        shutil.rmtree(src)
    new = [p for p in set(into.iterdir()) - before if p.suffix == ".whl"]
    if len(new) != 1:
        raise BundleBuildError(f"{spec}: pip fetched {len(new)} wheels, not one")
    return new[0]


@dataclass
class Resolved:
    """What the target lacks (picked, fetched), the host packages picked ones shadow, the host
    packages that were enough, and the requirements left unmet on purpose (omitted)."""

    picked: dict[str, Picked] = field(default_factory=dict)
    shadows: list[dict] = field(default_factory=list)
    kept: set[str] = field(default_factory=set)
    unmet: dict[str, dict] = field(default_factory=dict)


def resolve(
    requirements: list[Requirement],
    have: dict[str, Version | None],
    target: Target,
    into: Path,
    omit: dict[str, str] | None = None,
    lock: dict[str, Version | None] | None = None,
    progress=print,
) -> Resolved:
    """The wheels the target lacks, fetched into `into`, following each one's requirements."""
    env = target.environment()
    queue: list[tuple[Requirement, str]] = [(r, "requirements") for r in requirements]
    out = Resolved()
    picked, shadows, kept = out.picked, out.shadows, out.kept
    while queue:
        req, by = queue.pop(0)
        if req.marker and not req.marker.evaluate({**env, "extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in picked:
            p = picked[name]
            if not req.specifier.contains(p.version, prereleases=True):
                raise BundleBuildError(
                    f"{name}: {p.version} was picked for {p.needed_by[0]}, but {by} needs {name}{req.specifier}; "
                    "pin one version in the requirements file"
                )
            p.needed_by.append(by)
            new_extras = set(req.extras) - p.extras
            if new_extras:
                p.extras |= new_extras
                queue += _extra_requires(into / p.file, new_extras, env, name)
            continue
        held = have.get(name)
        if name in have and (held is None or req.specifier.contains(held, prereleases=True)):
            kept.add(name)
            continue
        why = _omitted(name, omit or {})
        if why is not None:  # left out on purpose: the host's, if it has one, or none
            entry = out.unmet.setdefault(name, {"name": name, "host": str(held) if held else None, "why": why})
            entry.setdefault("needed_by", []).append(f"{by}: {req}")
            continue
        pin = (lock or {}).get(name)
        if pin is not None and not req.specifier.contains(pin, prereleases=True):
            raise BundleBuildError(f"{name}: the lock pins {pin}, but {by} needs {name}{req.specifier}")
        wheel = _fetch(req, target, into, pin)
        _, version, _, _ = parse_wheel_filename(wheel.name)
        picked[name] = Picked(name, version, wheel.name, [by], set(req.extras))
        if name in have:
            shadows.append({"name": name, "host": str(have[name]), "bundled": str(version), "why": f"{by}: {req}"})
        progress(f"bundle: {wheel.name} (for {by})")
        queue += [(r, name) for r in _requires(wheel) if not r.marker or r.marker.evaluate({**env, "extra": ""})]
        queue += _extra_requires(wheel, set(req.extras), env, name)
    return out


def _extra_requires(wheel: Path, extras: set[str], env: dict, by: str) -> list[tuple[Requirement, str]]:
    """What the wheel requires for these extras only, its markers met (and so dropped)."""
    out = []
    for r in _requires(wheel):
        if r.marker and any(r.marker.evaluate({**env, "extra": e}) for e in extras):
            if not r.marker.evaluate({**env, "extra": ""}):
                extras_of = f"[{','.join(sorted(r.extras))}]" if r.extras else ""
                out.append((Requirement(f"{r.name}{extras_of}{r.specifier}"), f"{by}[{','.join(sorted(extras))}]"))
    return out


# what of an evidence folder travels: its configs and notes, not its committed results
EVIDENCE_KEEPS = (".yaml", ".yml", ".md", ".sh", ".py")  # .py, .sh: scripts its steps run


def project_files(repo: Path = REPO) -> list[str]:
    """The checkout's tracked files that a host runs the workflow from (git ls-files)."""
    done = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True)
    if done.returncode != 0:
        raise BundleBuildError(f"{repo}: not a git checkout (the bundle takes its tracked files)")
    files = [f for f in done.stdout.decode().split("\0") if f and (repo / f).is_file()]
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo, capture_output=True)
    if dirty.stdout.strip():
        print(f"bundle: {repo} has uncommitted changes: the bundle takes the files as they are on disk", flush=True)
    return [f for f in files if not f.startswith("docs/evidence/") or f.endswith(EVIDENCE_KEEPS)]


def project_wheel(project: Path, into: Path) -> Path:
    """speedsplit's own wheel, built from the project's copy (the checkout gets no build/)."""
    before = set(into.iterdir())
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(into), str(project)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    new = [p for p in set(into.iterdir()) - before if p.name.startswith("speedsplit-")]
    if done.returncode != 0 or not new:
        raise BundleBuildError(f"building speedsplit's wheel failed: {(done.stderr or done.stdout).strip()[-300:]}")
    return new[0]


def build(
    requirements: str | Path | list[str | Path],
    out: str | Path,
    target: Target,
    have: str | Path | None = None,
    part_mib: float = PART_MIB,
    omit: str | Path | None = None,
    lock: str | Path | None = None,
    progress=print,
) -> dict:
    """Build the bundle in `out` for one requirements file or several (an add-on's beside the
    base's, resolved together); returns its manifest. Every input is read before anything is
    written, and the bundle is built beside `out` and put in its place only once whole: a
    malformed file or a failed download leaves a bundle already there as it was."""
    files_in = [Path(requirements)] if isinstance(requirements, (str, Path)) else [Path(r) for r in requirements]
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not (out / host.SUMS).exists():
        raise BundleBuildError(f"{out}: exists and is not a bundle; refusing to replace it")
    reqs = [r for f in files_in for r in read_requirements(f)]
    held, pins = read_freeze(have) if have else {}, read_freeze(lock) if lock else {}
    omitted = read_omit(omit) if omit else {}
    out.parent.mkdir(parents=True, exist_ok=True)
    new = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        manifest, parts, unmet = _build_into(new, files_in, reqs, held, pins, omitted, target, part_mib, progress)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    new.chmod(0o755)
    shutil.rmtree(out, ignore_errors=True)
    new.rename(out)
    total = sum(w["bytes"] for w in manifest["wheels"])
    progress(
        f"bundle: {len(manifest['wheels'])} wheels, {total / 2**20:.1f} MiB in {parts} parts of at most "
        f"{part_mib:g} MiB under {out}; the host's own: {len(manifest['host_has'])}, shadowed: "
        f"{len(manifest['shadows'])}, left out: {unmet}"
    )
    for u in manifest["left_out"]:
        progress(f"  left out {u['name']} (host: {u['host'] or 'none'}; {u['why']}), needed by {u['needed_by'][0]}")
    return manifest


def _build_into(
    out: Path, files_in: list[Path], reqs, held, pins, omitted, target: Target, part_mib: float, progress
) -> tuple[dict, int, int]:
    """The bundle's files, written into the empty folder out: its manifest, how many parts, and
    how many requirements it left out."""
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        stage = Path(tmp) / "stage"
        wheels = stage / "wheels"
        wheels.mkdir(parents=True)
        got = resolve(reqs, held, target, wheels, omitted, pins, progress)
        picked, shadows, kept = got.picked, got.shadows, sorted(got.kept)
        tree = project_files()
        for f in tree:
            (stage / "project" / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, stage / "project" / f)
        own = project_wheel(stage / "project", wheels)
        shutil.rmtree(stage / "project" / "build", ignore_errors=True)
        files = sorted(p.file for p in picked.values()) + [own.name]
        manifest = {
            "target": {"python_version": target.python_version, "platforms": list(target.platforms)},
            "requirements": [line for f in files_in for line in f.read_text().splitlines()],
            "wheels": [_entry(wheels / f, picked) for f in files],
            "project": {"files": len(tree), "bytes": sum((REPO / f).stat().st_size for f in tree)},
            "commit": _commit(),
            "host_has": kept,
            "shadows": shadows,
            "left_out": sorted(got.unmet.values(), key=lambda u: u["name"]),
        }
        (stage / host.MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        archive = Path(tmp) / host.ARCHIVE
        with tarfile.open(archive, "w") as tar:  # wheels are compressed already
            tar.add(stage / host.MANIFEST, host.MANIFEST)
            for f in files:
                tar.add(wheels / f, f"wheels/{f}")
            for f in tree:
                tar.add(stage / "project" / f, f"project/{f}")
        parts = _split(archive, out, int(part_mib * 2**20))
        sums = {host.ARCHIVE: host.sha256(archive), **{p.name: host.sha256(p) for p in parts}}
    (out / host.SUMS).write_text("".join(f"{d}  {n}\n" for n, d in sums.items()))
    (out / host.MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.copy(Path(host.__file__), out / "install.py")
    return manifest, len(parts), len(got.unmet)


def _commit() -> str | None:
    """The checkout's commit: the host's copy has no .git (SPEEDSPLIT_WORKFLOW_COMMIT there)."""
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() or None


def _entry(path: Path, picked: dict[str, Picked]) -> dict:
    name, version, _, _ = parse_wheel_filename(path.name)
    p = picked.get(canonicalize_name(name))
    return {
        "file": path.name,
        "name": str(name),
        "version": str(version),
        "sha256": host.sha256(path),
        "bytes": path.stat().st_size,
        "needed_by": sorted(set(p.needed_by)) if p else ["the project"],
    }


def _split(archive: Path, out: Path, size: int) -> list[Path]:
    parts = []
    with open(archive, "rb") as f:
        while block := f.read(size):
            part = out / f"{host.ARCHIVE}.part{len(parts):03d}"
            part.write_bytes(block)
            parts.append(part)
    return parts
