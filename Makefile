# Set-up and everyday commands. `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU build of torch is installed first so that no range below pulls a CUDA build.
TORCH_PIN ?= torch==2.13.0

.PHONY: venv install install-test demo test test-fast lint docs bench clean

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
	$(PY) examples/demo.py

test: install-test
	$(PY) -m pytest -n 2 -q --doctest-modules rfgp tests

test-fast: install-test
	$(PY) -m pytest -n 2 -q -m "not slow" --doctest-modules rfgp tests

lint: install-test
	$(VENV)/bin/ruff check .

docs: venv
	$(PIP) install -q -e ".[docs]"
	$(VENV)/bin/mkdocs build --strict

bench: install-test
	for f in benchmarks/*.py; do $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) build dist site *.egg-info demo_output
