#!/usr/bin/env bash
# The one GPU run: bench/gpu.py on the machine's GPU with the teacher filling the time left (configs/gpu_context.yaml
# trained from scratch on the Wikipedia corpus, then STS-B test, the dev sample and any --pairs scored at
# |C_s| = 16 and 100 beside TF-IDF). Run it in the checkout's root with `.gpu/` carried (bench/gpu_prep.sh fills
# it); it fetches and copies nothing. Extra arguments go to bench/gpu.py (e.g. --pairs .gpu/data/sick.tsv).
#   bash bench/gpu_run.sh
# OUT: where gpu.json, gpu.md, run.log and the score files go (default bench/out/gpu; a lent machine's $OUT).
# BUDGET_S: bench/gpu.py's budget (default 510 s: with Python's start-up and the wheels, under 9 minutes).
# SECTIONS: default peak,teacher (the peak, for the teacher's MFU); peak,train,score,host,teacher measures the
# rest too, in about 4 of those minutes, which the teacher's training then lacks.
# PY: python3. SITE: where the wheels go (default /tmp/site) when pydantic is not importable.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT=${OUT:-bench/out/gpu}
G=.gpu/data
if [ ! -d "$G/corpus-enwiki58k" ] || [ ! -f "$G/sts-test.csv" ]; then
  echo "bench/gpu_run.sh: $G is incomplete: run bench/gpu_prep.sh in the checkout and carry .gpu" >&2
  exit 2
fi
# the carried wheels go first on the path: pydantic (not on that machine) and the transformers this project pins
# over the machine's own (bench/gpu_prep.sh says why)
SITE=${SITE:-/tmp/site}
mkdir -p "$SITE"
"$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" .gpu/wheels/*.whl
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if ! "$PY" -c "import transformers.models.bart" 2>"$SITE/transformers-import.err"; then
  echo "bench/gpu_run.sh: the carried transformers does not import here ($(tail -1 "$SITE/transformers-import.err"));" \
    "using the machine's own: its compiled BART training breaks into many graphs" >&2
  rm -rf "$SITE"/transformers "$SITE"/transformers-*.dist-info "$SITE"/huggingface_hub "$SITE"/huggingface_hub-*.dist-info
fi
mkdir -p "$OUT"
"$PY" bench/gpu.py --corpus "$G/corpus-enwiki58k" --tokenizer "$G/tokenizer" --warm-start-shape "$G/minilm_shape" \
  --contexts "$G/contexts" --stsb-test "$G/sts-test.csv" --dev-pairs "$G/contexts/stsb-dev-300.jsonl" \
  --sections "${SECTIONS:-peak,teacher}" --teacher-minutes fill --budget-s "${BUDGET_S:-510}" --out "$OUT" "$@" \
  2>&1 | tee "$OUT/run.log"
