# Set-up and everyday commands. `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU build of torch is installed first so that no range below pulls a CUDA build.
TORCH_PIN ?= torch==2.13.0

# The documentation builds in its own light environment (no torch needed: the API pages are
# read from the source) and renders its maths offline with KaTeX from the npm registry.
DOCS_VENV     := .venv-docs
DOCS_REQS     := "mkdocs>=1.5" "mkdocs-material>=9" "mkdocstrings[python]>=0.24"
KATEX_VERSION ?= 0.16.47
KATEX_DIR     := docs/assets/katex

.PHONY: venv install install-test demo test test-fast lint dist wheel-smoke docs katex bench clean

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_PIN)"
	touch $@

venv: $(VENV)/.created

# `fast` (numba) brings the compiled TensorSRHT kernels: a newcomer gets the fast path.
install: venv
	$(PIP) install -q -e ".[fast,plot,progress]"

install-test: venv
	$(PIP) install -q -e ".[test,fast,sklearn,plot,progress]"

demo: install
	$(PY) -m rfgp.demo

# Everything, the long statistical tests (marked slow) included.
test: install-test
	$(PY) -m pytest -n 2 -q --doctest-modules rfgp tests

# The quick check while working: skips the tests marked slow.
test-fast: install-test
	$(PY) -m pytest -n 2 -q -m "not slow" --doctest-modules rfgp tests

lint: install-test
	$(VENV)/bin/ruff check .

# The release files: dist/rfgp-VERSION.tar.gz and dist/rfgp-VERSION-py3-none-any.whl (the wheel
# built from the sdist, as pip builds it).
dist: install-test
	rm -rf dist
	$(PY) -m build --outdir dist .

# Builds the wheel, installs it with the sklearn extra into a fresh virtual environment (torch
# first) and fits the bundled concrete set from a folder outside the source tree.
wheel-smoke: install-test
	$(PY) tools/wheel_smoke.py --torch "$(TORCH_PIN)"

$(DOCS_VENV)/.created:
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install -q $(DOCS_REQS)
	touch $@

# KaTeX's distribution files (script, styles, fonts, auto-render) copied into the docs.
$(KATEX_DIR)/.version-$(KATEX_VERSION):
	rm -rf $(KATEX_DIR) build/katex
	mkdir -p build/katex $(KATEX_DIR)
	cd build/katex && npm pack --silent katex@$(KATEX_VERSION) > /dev/null
	tar -xzf build/katex/katex-$(KATEX_VERSION).tgz -C build/katex
	cp -r build/katex/package/dist/katex.min.js build/katex/package/dist/katex.min.css \
		build/katex/package/dist/fonts build/katex/package/dist/contrib $(KATEX_DIR)/
	cp build/katex/package/LICENSE $(KATEX_DIR)/LICENSE
	touch $@

katex: $(KATEX_DIR)/.version-$(KATEX_VERSION)

docs: $(DOCS_VENV)/.created katex
	$(DOCS_VENV)/bin/mkdocs build --strict

bench: install-test
	for f in benchmarks/*.py; do $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) $(DOCS_VENV) $(KATEX_DIR) build dist site *.egg-info demo_output
