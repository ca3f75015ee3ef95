"""The package's names live in one place each: no old path or method name resolves, the
public paths import without a warning, every other module says it is internal by a ``_`` in its
path, and what users read (examples/, the demo, the guide, the README) names public names only;
the benchmarks may import internals, but only names that exist."""

import ast
import importlib
import importlib.util
import pkgutil
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import rfgp
from rfgp import kernels

REMOVED_MODULES = [
    "rfgp.allocation",
    "rfgp.kernels.exact",
    "rfgp.kernels.operator",
    "rfgp.inference.dirichlet",
]


@pytest.mark.parametrize("module", REMOVED_MODULES)
def test_removed_modules_are_not_in_the_package(module):
    # Listed from the package's own folders (an import could be answered by another checkout's
    # editable-install finder).
    parent, _, name = module.rpartition(".")
    present = {info.name for info in pkgutil.iter_modules(importlib.import_module(parent).__path__)}
    assert name not in present


REMOVED_NAMES = [
    (rfgp, "allocation"),
    (rfgp, "ops"),
    (kernels, "helmholtz_components"),
    (kernels, "_srht_numba"),
    (kernels._fourier, "SPECTRAL_DENSITIES"),
    *[(rfgp.inference, name) for name in (
        "ALPHA_GRID", "DirichletExactGP", "DirichletGPClassifier", "softmax_expectation",
        "DirichletLikelihood", "dirichlet_transform", "validate_labels",
    )],
]


@pytest.mark.parametrize("module, name", REMOVED_NAMES,
                         ids=[f"{m.__name__}.{n}" for m, n in REMOVED_NAMES])
def test_removed_names_raise_attribute_error(module, name):
    with pytest.raises(AttributeError, match=name):
        getattr(module, name)


@pytest.mark.parametrize("cls, old", [
    (kernels.MaclaurinKernel, "exact"),
    (kernels.MaclaurinKernel, "expected_kernel"),
    (kernels.GaussianSketchKernel, "expected_kernel"),
    (kernels.SphericalFeatureKernel, "exact"),
    (kernels.HelmholtzKernel, "component"),
])
def test_renamed_methods_have_one_name(cls, old):
    assert not hasattr(cls, old)


def test_current_homes():
    from rfgp.classification import DirichletGPClassifier, softmax_expectation
    from rfgp.inference import helmholtz_components
    from rfgp.kernels import MATERN_NU, optimize_allocation
    from rfgp.likelihoods import DirichletLikelihood

    assert rfgp.DirichletGPClassifier is DirichletGPClassifier
    assert rfgp.helmholtz_components is helmholtz_components
    assert callable(softmax_expectation) and callable(optimize_allocation)
    assert MATERN_NU["matern32"] == 1.5 and MATERN_NU["rbf"] is None
    assert issubclass(DirichletLikelihood, object)


def test_importing_the_package_emits_no_rfgp_warning():
    # A fresh interpreter: modules already imported by this test session would not re-run.
    code = (
        "import warnings\n"
        "warnings.simplefilter('error')\n"
        "warnings.filterwarnings('ignore', module='(?!rfgp)')\n"
        "warnings.filterwarnings('ignore', message='.*torch.jit.*')\n"
        "import rfgp, rfgp.inference, rfgp.kernels, rfgp.classification, rfgp.sklearn\n"
        "import rfgp.botorch, rfgp.bayesopt, rfgp.variance, rfgp.metrics, rfgp.likelihoods\n"
        "import rfgp.datasets, rfgp.recipes, rfgp.demo\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


# ---------------------------------------------------------------------------- the public edge
ROOT = Path(__file__).resolve().parents[1]

#: The modules a user may import; every other module of the package is internal and has a
#: ``_``-prefixed component in its dotted path.
PUBLIC_MODULES = {
    "rfgp",
    "rfgp.kernels",
    "rfgp.inference",
    "rfgp.classification",
    "rfgp.recipes",
    "rfgp.sklearn",
    "rfgp.datasets",
    "rfgp.demo",
    "rfgp.demo.__main__",
    "rfgp.metrics",
    "rfgp.variance",
    "rfgp.likelihoods",
    "rfgp.bayesopt",
    "rfgp.botorch",
}

def _package_modules(path=None, prefix="rfgp."):
    """Every module and package below rfgp, listed from the folders (nothing is imported:
    the optional extras need not be installed)."""
    path = path or [str(ROOT / "rfgp")]
    names = []
    for info in pkgutil.iter_modules(path, prefix):
        names.append(info.name)
        if info.ispkg:
            sub = Path(path[0]) / info.name.rpartition(".")[2]
            names += _package_modules([str(sub)], info.name + ".")
    return names


def test_the_walk_finds_the_public_and_the_internal_modules():
    modules = set(_package_modules())
    assert PUBLIC_MODULES - {"rfgp"} <= modules
    assert {"rfgp.kernels._fourier", "rfgp.kernels._sketches.polynomial", "rfgp._ops"} <= modules


def test_every_module_outside_the_public_list_is_underscore_prefixed():
    offenders = [
        name for name in _package_modules()
        if name not in PUBLIC_MODULES
        and not any(part.startswith("_") for part in name.split(".")[1:])
    ]
    assert offenders == []


def _module_file(module: str) -> Path:
    base = ROOT / Path(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _declared_all(module: str) -> set:
    """A module's ``__all__``, read from its source (a literal list)."""
    tree = ast.parse(_module_file(module).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{module} has no __all__")


#: Names a public package exports for another layer of rfgp, not for users: the recipes import
#: the inference layer through ``rfgp.inference``'s names, never from its modules, so these are
#: in its ``__all__``; the API pages do not document them and what users read must not name them.
LAYER_NAMES = {
    "rfgp.inference": {
        "CHOICE_FEATURES", "MAX_ITERATIVE_FEATURES", "MAX_WEIGHT_FEATURES", "ScaleCalibration",
        "calibrate_scales", "calibrate_source_scales", "classifier_fit_cost", "cross_validate",
        "evidence_hessian", "exact_evidence_cost", "feature_evidence_cost", "final_fit_cost",
        "final_path", "fit_calibrated", "fit_calibrated_source", "kd_blocks", "FEATURE_STEP",
        "row_capped_features", "largest_features_within", "lengthscale_draws",
        "measure_machine_rate",
        "WARM_UP_STEPS", "EvidenceObjective", "SearchResult", "dirichlet_objective",
        "maximize_evidence", "search_evidence", "search_two_paths", "two_path_search",
    },
}


def _user_facing(module: str) -> set:
    """The names of a public module's ``__all__`` that users may call (without the names it
    exports for another layer of the package)."""
    return _declared_all(module) - LAYER_NAMES.get(module, set())


def _rfgp_imports(path: Path):
    """``(module, name or None, line)`` of every import of rfgp in a file, at any depth."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == "rfgp" or node.module.startswith("rfgp.")):
            for alias in node.names:
                yield node.module, alias.name, node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "rfgp" or alias.name.startswith("rfgp."):
                    yield alias.name, None, node.lineno


USER_FACING = sorted([*(ROOT / "examples").glob("*.py"), *(ROOT / "rfgp" / "demo").glob("*.py")])
BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))
#: Guide pages for contributors, which name the internal modules they describe.
CONTRIBUTOR_PAGES = [ROOT / "docs" / "guide" / "architecture.md"]
USER_PAGES = sorted([*(ROOT / "docs" / "guide").glob("*.md"), ROOT / "README.md",
                     ROOT / "docs" / "index.md"])
USER_PAGES = [page for page in USER_PAGES if page not in CONTRIBUTOR_PAGES]


def _import_problems(imports):
    """What is wrong with ``(module, name, line)`` imports a user reads: internal modules, or
    names outside the module's ``__all__``."""
    problems = []
    for module, name, line in imports:
        if module not in PUBLIC_MODULES:
            problems.append(f"line {line}: {module} is internal")
        elif name is not None and name not in _user_facing(module):
            problems.append(f"line {line}: {name} is not a user-facing name of {module}")
    return problems


@pytest.mark.parametrize("path", USER_FACING, ids=[str(p.relative_to(ROOT)) for p in USER_FACING])
def test_examples_and_the_demo_import_public_names_only(path):
    assert _import_problems(_rfgp_imports(path)) == []


def test_there_are_examples_to_check():
    assert len([p for p in USER_FACING if p.parent.name == "examples"]) >= 6


@pytest.mark.parametrize("path", BENCHMARKS, ids=[p.name for p in BENCHMARKS])
def test_benchmark_imports_resolve(path):
    # Benchmarks may import internals (they measure them), but every name must exist.
    problems = []
    for module, name, line in _rfgp_imports(path):
        if module in ("rfgp.botorch", "rfgp.sklearn"):
            pytest.importorskip(module.rpartition(".")[2])
        imported = importlib.import_module(module)
        if name is not None and not hasattr(imported, name):
            problems.append(f"line {line}: {module} has no {name}")
    assert problems == []


def _code_block_imports(text: str):
    """``(module, name, line)`` of the rfgp imports in a Markdown page's Python code blocks
    (indented blocks, as in list items, included)."""
    for block in re.finditer(r"```python\n(.*?)```", text, flags=re.S):
        first_line = text.count("\n", 0, block.start()) + 2
        tree = ast.parse(textwrap.dedent(block.group(1)))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "rfgp":
                for alias in node.names:
                    yield node.module, alias.name, first_line + node.lineno - 1
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "rfgp":
                        yield alias.name, None, first_line + node.lineno - 1


def _private_mentions(text: str):
    """Dotted ``rfgp.a.b`` names in a text that are not public: after the longest public
    module, the next part must be in that module's ``__all__`` and no later part private."""
    for match in re.finditer(r"\brfgp(?:\.\w+)+", text):
        parts = match.group(0).split(".")
        depth = max(k for k in range(1, len(parts) + 1) if ".".join(parts[:k]) in PUBLIC_MODULES)
        module, rest = ".".join(parts[:depth]), parts[depth:]
        if (rest and rest[0] not in _user_facing(module)) or any(
                part.startswith("_") and not part.startswith("__") for part in rest):
            yield match.group(0)


@pytest.mark.parametrize("page", USER_PAGES, ids=[str(p.relative_to(ROOT)) for p in USER_PAGES])
def test_user_pages_name_public_names_only(page):
    text = page.read_text()
    problems = _import_problems(_code_block_imports(text))
    problems += [f"{name} is not public" for name in _private_mentions(text)]
    assert problems == []


def test_the_page_check_finds_private_names():
    text = (
        "See `rfgp.recipes._schedule.plan_regression` and `rfgp.fit_auto`.\n\n"
        "1. A list item:\n\n   ```python\n   from rfgp.inference import RandomFeatureGP\n"
        "   from rfgp.recipes import not_a_public_name\n   ```\n"
    )
    assert list(_private_mentions(text)) == ["rfgp.recipes._schedule.plan_regression"]
    assert _import_problems(_code_block_imports(text)) == [
        "line 7: not_a_public_name is not a user-facing name of rfgp.recipes"]
    assert list(_private_mentions("`rfgp.inference.calibrate_scales`")) == [
        "rfgp.inference.calibrate_scales"]
    assert list(_private_mentions("rfgp.RandomFeatureGP.update, rfgp.kernels.real_form")) == []


def test_the_import_check_reads_every_kind_of_import(tmp_path):
    source = tmp_path / "example.py"
    source.write_text(
        "import rfgp.kernels._fourier\n"
        "from rfgp.inference import statistics\n"
        "def f():\n    from rfgp.kernels import RandomFeatureKernel\n"
    )
    assert sorted(_rfgp_imports(source)) == [
        ("rfgp.inference", "statistics", 2), ("rfgp.kernels", "RandomFeatureKernel", 4),
        ("rfgp.kernels._fourier", None, 1)]
    assert "statistics" not in _declared_all("rfgp.inference")


@pytest.mark.parametrize("module", sorted(PUBLIC_MODULES - {"rfgp.demo.__main__"}))
def test_every_name_in_a_public_all_exists(module):
    if module in ("rfgp.sklearn", "rfgp.botorch"):
        pytest.importorskip(module.rpartition(".")[2])
    imported = importlib.import_module(module)
    missing = [name for name in _declared_all(module) if not hasattr(imported, name)]
    assert missing == []


API_PAGES = sorted((ROOT / "docs" / "api").glob("*.md"))


@pytest.mark.parametrize("page", API_PAGES, ids=[p.name for p in API_PAGES])
def test_api_pages_document_public_paths(page):
    problems = []
    for line in page.read_text().splitlines():
        if not line.startswith("::: "):
            continue
        path = line[4:].strip()
        module, _, name = path.rpartition(".")
        public = path in PUBLIC_MODULES or (
            module in PUBLIC_MODULES and name in _user_facing(module))
        if not public:
            problems.append(path)
    assert problems == []


def test_the_layer_names_are_what_the_recipes_import_from_the_inference_layer():
    # Each is imported from rfgp.inference by a module of rfgp outside it, and the rest of
    # rfgp.inference's __all__ is documented on an API page.
    imported = set()
    for path in (ROOT / "rfgp").rglob("*.py"):
        if ROOT / "rfgp" / "inference" not in path.parents:
            imported |= {name for module, name, _ in _rfgp_imports(path)
                         if module == "rfgp.inference"}
    assert LAYER_NAMES["rfgp.inference"] <= _declared_all("rfgp.inference")
    assert LAYER_NAMES["rfgp.inference"] <= imported
    documented = {line[4:].strip().rpartition(".")[2] for page in API_PAGES
                  for line in page.read_text().splitlines()
                  if line.startswith("::: ")}
    assert _user_facing("rfgp.inference") <= documented


@pytest.mark.parametrize("page", CONTRIBUTOR_PAGES, ids=[p.name for p in CONTRIBUTOR_PAGES])
def test_contributor_pages_name_modules_and_files_that_exist(page):
    text = page.read_text()
    missing = []
    for match in set(re.findall(r"\brfgp(?:\.\w+)+", text)):
        parts = match.split(".")
        depth = max(k for k in range(1, len(parts) + 1)
                    if importlib.util.find_spec(".".join(parts[:k])) is not None)
        obj = importlib.import_module(".".join(parts[:depth]))
        for part in parts[depth:]:
            obj = getattr(obj, part, None)
        if obj is None:
            missing.append(match)
    missing += [name for name in re.findall(r"`(rfgp/[\w/]+\.py)", text)
                if not (ROOT / name).is_file()]
    assert missing == []
