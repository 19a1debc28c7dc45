# The two commands a newcomer needs: `make demo` (the main job) and `make test`.
# The demo installs addnorm and its runtime dependencies only; the tests add the dev extras
# (pytest, mypy, ruff and the reference libraries they compare with).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
BASE   := $(VENV)/.installed-base
DEV    := $(VENV)/.installed-dev

.PHONY: install install-dev demo test lint clean

$(BASE): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e .
	touch $(BASE)

$(DEV): $(BASE)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(DEV)

install: $(BASE)

install-dev: $(DEV)

demo: $(BASE)
	$(PY) -m addnorm demo

lint: $(DEV)
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m mypy src/addnorm

test: $(DEV)
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m mypy src/addnorm
	$(PY) -m pytest -q -n 2

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
