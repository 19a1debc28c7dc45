# The two commands a newcomer needs: `make demo` (the main job) and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install demo test lint clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m addnorm demo

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m mypy src/addnorm

test: $(STAMP)
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m mypy src/addnorm
	$(PY) -m pytest -q -n 2

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
