"""Django's own cache tests (``tests/cache`` of the Django source
distribution), fetched with pip for the installed Django version: the
definition of a drop-in cache backend. Nothing of them is kept in this
repository."""

from __future__ import annotations

import fcntl
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import django

CACHE_DIR = Path(__file__).resolve().parents[2] / ".cache"


def fetch() -> Path:
    """The directory holding Django's ``cache`` test app, downloaded once."""
    version = django.get_version()
    root = CACHE_DIR / f"django-{version}-tests"
    if (root / "cache" / "tests.py").exists():
        return root
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / "django-tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # pytest-xdist's workers start at once: one fetches
        if not (root / "cache" / "tests.py").exists():
            _download(version, root)
    return root


def _download(version: str, root: Path) -> None:
    with tempfile.TemporaryDirectory() as download:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"django=={version}",
                "--dest",
                download,
            ],
            check=True,
        )
        (sdist,) = Path(download).glob("*.tar.gz")
        staging = Path(tempfile.mkdtemp(dir=CACHE_DIR))
        with tarfile.open(sdist) as archive:
            members = [m for m in archive.getmembers() if "/tests/cache/" in m.name and m.isfile()]
            for member in members:
                member.name = "cache/" + member.name.split("/tests/cache/", 1)[1]
            archive.extractall(staging, members=members, filter="data")
        staging.rename(root)
