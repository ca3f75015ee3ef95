"""The release metadata: one version, every bundled data file in the wheel, extras that exist.

The wheel itself is built, installed into a fresh environment and used by
``tools/wheel_smoke.py`` (``make wheel-smoke``, run by CI after the tests).
"""

import fnmatch
import re
from pathlib import Path

import pytest

import rfgp

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")  # Python 3.11+


@pytest.fixture(scope="module")
def pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_has_one_home(pyproject):
    project = pyproject["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "rfgp.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", rfgp.__version__)


def test_the_changelog_starts_with_this_version():
    headings = re.findall(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), flags=re.M)
    assert headings and headings[0] == rfgp.__version__


def test_every_bundled_data_file_is_package_data(pyproject):
    # setuptools' package-data globs are relative to the package folder; "*" stops at "/".
    patterns = pyproject["tool"]["setuptools"]["package-data"]["rfgp.datasets"]
    package = ROOT / "rfgp" / "datasets"
    files = [p.relative_to(package).as_posix() for p in (package / "data").rglob("*")
             if p.is_file() and "__pycache__" not in p.parts]
    assert len(files) >= 20
    missing = [f for f in files
               if not any(fnmatch.fnmatch(f, pat) and f.count("/") == pat.count("/")
                          for pat in patterns)]
    assert missing == []


def test_extras_and_license(pyproject):
    project = pyproject["project"]
    assert set(project["optional-dependencies"]) >= {"fast", "sklearn", "botorch", "plot",
                                                      "progress", "test"}
    assert any(req.startswith("build") for req in project["optional-dependencies"]["test"])
    assert project["license-files"] == ["LICENSE"] and (ROOT / "LICENSE").is_file()
    assert any(req.startswith("torch>=") for req in project["dependencies"])


def test_the_sdist_carries_the_examples_the_tests_run():
    # tests/test_examples.py runs every script in examples/: an sdist without them fails.
    lines = (ROOT / "MANIFEST.in").read_text().splitlines()
    assert "graft tests" in lines and "graft examples" in lines
