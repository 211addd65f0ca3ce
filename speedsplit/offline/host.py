"""On a GPU host without network: join a bundle's parts, check them, and install its wheels.

This file runs before speedsplit is installed: the standard library only. `speedsplit bundle`
(speedsplit/offline/bundle.py) copies it into every bundle as `install.py`:

    python3 install.py [--bundle DIR] [--target SITE]     # on the host
    speedsplit host install --bundle DIR [--target SITE]  # the same, where speedsplit runs

It checks every part and the joined archive against SHA256SUMS (a missing or altered part
fails, naming it, before anything is installed), unpacks the archive next to the parts, and
runs `pip install --no-index --no-deps` on exactly the wheels the manifest lists: into SITE
(a folder to put on PYTHONPATH) or, without --target, the Python that runs it. The project
(Snakefile, rules, configs) is unpacked to DIR/unpacked/project: the workflow runs from there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tarfile
from pathlib import Path

ARCHIVE = "bundle.tar"
SUMS = "SHA256SUMS"
MANIFEST = "manifest.json"


class BundleError(ValueError):
    """A bundle that cannot be installed, and why (one line)."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_sums(bundle: Path) -> dict[str, str]:
    """File name -> sha256, from the bundle's SHA256SUMS (`sha256sum` format)."""
    path = bundle / SUMS
    if not path.is_file():
        raise BundleError(f"{path}: missing (is {bundle} a speedsplit bundle?)")
    sums = {}
    for line in path.read_text().splitlines():
        digest, _, name = line.strip().partition("  ")
        if digest and name:
            sums[name] = digest
    return sums


def join(bundle: Path) -> Path:
    """The bundle's archive joined from its parts, every part and the whole checked."""
    sums = read_sums(bundle)
    parts = sorted(n for n in sums if n.startswith(ARCHIVE + ".part"))
    if not parts:
        raise BundleError(f"{bundle / SUMS}: lists no {ARCHIVE}.part* files")
    for name in parts:
        part = bundle / name
        if not part.is_file():
            raise BundleError(f"{part}: missing (the bundle has {len(parts)} parts)")
        if sha256(part) != sums[name]:
            raise BundleError(f"{part}: its sha256 differs from {SUMS} (damaged in transfer?)")
    archive = bundle / ARCHIVE
    with open(archive, "wb") as out:
        for name in parts:
            out.write((bundle / name).read_bytes())
    if sha256(archive) != sums.get(ARCHIVE):
        archive.unlink()
        raise BundleError(f"{archive}: the joined parts' sha256 differs from {SUMS}")
    return archive


def unpack(bundle: Path) -> tuple[Path, dict]:
    """The archive unpacked under bundle/unpacked; its folder and its manifest. Every wheel the
    manifest lists must be there with its sha256."""
    archive = join(bundle)
    dest = bundle / "unpacked"
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    archive.unlink()
    manifest = json.loads((dest / MANIFEST).read_text())
    for w in manifest["wheels"]:
        path = dest / "wheels" / w["file"]
        if not path.is_file() or sha256(path) != w["sha256"]:
            raise BundleError(f"{path}: missing or altered (the manifest lists its sha256)")
    return dest, manifest


def install(bundle: str | Path, target: str | Path | None = None, rehearse: bool = False) -> dict:
    """Check, unpack and install the bundle's wheels (into target, a folder, if given); its
    manifest. rehearse: into target for the bundle's own Python and platform, from another
    Python (a rehearsal off the host: pip checks every wheel against the target's tags)."""
    bundle = Path(bundle)
    dest, manifest = unpack(bundle)
    wheels = [str(dest / "wheels" / w["file"]) for w in manifest["wheels"]]
    where = ["--target", str(target)] if target else []
    if rehearse:
        if not target:
            raise BundleError("a rehearsal installs into a folder: give --target")
        t = manifest["target"]
        where += ["--python-version", t["python_version"], "--implementation", "cp", "--only-binary=:all:"]
        where += [a for p in t["platforms"] for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", *where, *wheels]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise BundleError(f"pip install failed: {said[-1] if said else f'exit {done.returncode}, nothing said'}")
    print(f"installed {len(wheels)} wheels from {bundle}" + (f" into {target}" if target else ""))
    print(f"the workflow: {dest / 'project'}")
    for s in manifest.get("shadows", []):
        print(f"  {s['name']} {s['bundled']} shadows the host's {s['host']} ({s['why']})")
    return manifest


def add_args(p: argparse.ArgumentParser, bundle: str | None = None) -> None:
    """The install flags; `bundle`, the folder a bundle's own install.py sits in (else required)."""
    p.add_argument("--bundle", default=bundle, required=bundle is None, help="the bundle's folder")
    p.add_argument("--target", help="install into this folder (put it on PYTHONPATH) instead of this Python")
    p.add_argument("--rehearse", action="store_true", help="into --target for the bundle's Python, from another one")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Install a speedsplit bundle on a host without network.")
    sub = p.add_subparsers(dest="command", required=True)
    add_args(sub.add_parser("install", help="join, check and install the bundle"), str(Path(__file__).resolve().parent))
    args = p.parse_args(argv)
    try:
        install(args.bundle, args.target, args.rehearse)
    except BundleError as exc:
        print(f"install: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
