"""The GPU kit: the wheels the GPU machine lacks (``benchmarks/gpu_kit.txt``), for CPython 3.12.

The lent GPU machine has CUDA torch and most of the stack but no network, and none of TRL,
papermill's kernel stack, the benchmarks or the offline Qwen3 tokenizer. ``download`` fetches the
pinned cp312 manylinux wheels of ``gpu_kit.txt`` with pip into an ignored folder (``.whl/``), one
version each, and checks that they stay under the 64 MiB a device call may carry (with the
repository itself, which travels too); ``benchmarks/gpu_workshop.py --kit .whl`` installs them
there. ``from_venv`` rebuilds wheels of installed distributions from their ``RECORD`` files, so
that the CPU test installs and runs a kit without a network.

Usage (from the repository root)::

    make gpu-kit                                   # = python benchmarks/gpu_kit.py --out .whl
    python benchmarks/gpu_kit.py --out K --from-venv addict toml   # the CPU test's kit
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata as md
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "benchmarks" / "gpu_kit.txt"
CALL_LIMIT_MIB = 64.0
"""What one device call may carry: the working tree and the carried kit together."""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")


def normalize(name: str) -> str:
    """A distribution name in PEP 503 form (``Foo_Bar.baz`` -> ``foo-bar-baz``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_kit(path: Path = KIT) -> dict[str, str]:
    """The kit's pins, ``{normalized name: version}``, in file order.

    Raises:
        ValueError: a line that is not ``name==version``, or a name pinned twice.
    """
    pins: dict[str, str] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise ValueError(f"{path}:{n}: {raw!r} is not name==version")
        key = normalize(name.strip())
        if key in pins:
            raise ValueError(f"{path}:{n}: {name.strip()} is pinned twice (one version each)")
        pins[key] = version.strip()
    return pins


def wheel_name(path: Path) -> str:
    """The normalized distribution name of a wheel file (``pydantic_core-2.5-...`` ->
    ``pydantic-core``)."""
    return normalize(path.name.split("-", 1)[0])


def download(out: Path, pins: dict[str, str]) -> list[Path]:
    """``pip download`` the pinned cp312 manylinux wheels into ``out`` (no dependencies).

    Raises:
        subprocess.CalledProcessError: pip found no such wheel. RuntimeError: the folder holds
            a wheel of a name outside the pins, or two of one name, or lacks one.
    """
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "-d", str(out),
           *[x for p in PLATFORMS for x in ("--platform", p)],
           *[f"{name}=={version}" for name, version in pins.items()]]
    subprocess.run(cmd, check=True)
    return check_folder(out, pins)


def check_folder(out: Path, pins: dict[str, str]) -> list[Path]:
    """The wheels of ``out``, checked: exactly one per pinned name, at its version.

    Raises:
        RuntimeError: a wheel of another name or version, two of one name, or one missing.
    """
    wheels = sorted(out.glob("*.whl"))
    names = [wheel_name(w) for w in wheels]
    extra = sorted({n for n in names if n not in pins})
    twice = sorted({n for n in names if names.count(n) > 1})
    missing = sorted(set(pins) - set(names))
    wrong = sorted(w.name for w in wheels if wheel_name(w) in pins
                   and w.name.split("-")[1] != pins[wheel_name(w)])
    if extra or twice or missing or wrong:
        raise RuntimeError(f"{out}: not one wheel per pin: extra {extra}, twice {twice}, "
                           f"missing {missing}, wrong version {wrong}; empty the folder and rerun")
    return wheels


def from_venv(out: Path, names: list[str]) -> list[Path]:
    """Rebuild a wheel of each installed distribution ``names`` from its ``RECORD`` (no network).

    Only files inside site-packages are packed (console scripts are left out); the tag comes from
    the distribution's own ``WHEEL`` file.

    Raises:
        importlib.metadata.PackageNotFoundError: a name is not installed.
    """
    out.mkdir(parents=True, exist_ok=True)
    wheels = []
    for name in names:
        dist = md.distribution(name)
        base = Path(str(dist.locate_file("")))
        info = next(f for f in dist.files if f.parts[0].endswith(".dist-info"))
        tags = [line.split(":", 1)[1].strip() for line in
                (dist.read_text("WHEEL") or "").splitlines() if line.startswith("Tag:")]
        tag = "-".join(".".join(dict.fromkeys(t.split("-")[i] for t in tags))
                       for i in range(3)) if tags else "py3-none-any"
        target = out / f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}-{tag}.whl"
        record, files = [], [f for f in dist.files
                             if ".." not in f.parts and f.name != "RECORD"
                             and "__pycache__" not in f.parts]
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
            for f in files:
                data = (base / f).read_bytes()
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                z.writestr(str(f.as_posix()), data)
                record.append(f"{f.as_posix()},sha256={digest.decode()},{len(data)}")
            record.append(f"{info.parts[0]}/RECORD,,")
            z.writestr(f"{info.parts[0]}/RECORD", "\n".join(record) + "\n")
        wheels.append(target)
    return wheels


def tree_mib() -> float:
    """MiB of the files a device call sends of this checkout (tracked, and untracked but not
    ignored)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    return sum((ROOT / f.decode()).stat().st_size for f in files
               if f and (ROOT / f.decode()).is_file()) / 2**20


def main(argv: list[str] | None = None) -> int:
    """Download (or rebuild) the kit, print its size; exit 1 when a call could not carry it."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / ".whl"))
    ap.add_argument("--from-venv", nargs="*", default=None,
                    help="rebuild these installed distributions instead of downloading")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.from_venv is not None:
        wheels = from_venv(out, args.from_venv)
    else:
        wheels = download(out, read_kit())
    kit = sum(w.stat().st_size for w in wheels) / 2**20
    tree = tree_mib()
    print(f"{len(wheels)} wheels, {kit:.1f} MiB in {out}; with the working tree "
          f"({tree:.1f} MiB) {kit + tree:.1f} MiB of the {CALL_LIMIT_MIB:.0f} MiB a call carries")
    return 0 if kit + tree <= CALL_LIMIT_MIB else 1


if __name__ == "__main__":
    sys.exit(main())
