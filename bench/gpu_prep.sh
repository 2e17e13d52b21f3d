#!/usr/bin/env bash
# Fills the ignored `.gpu/` with what bench/gpu_run.sh needs on a lent GPU machine, copied from ../shared: only
# that, because a run carries the checkout and `.gpu/` together in 64 MiB and the whole kit is 78 MB.
#   bash bench/gpu_prep.sh            # then run `bash bench/gpu_run.sh` there, with `.gpu` carried
# KIT (../shared/gpu) and DATA (../shared/data) say where to copy from.
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=${KIT:-../shared/gpu}
DATA=${DATA:-../shared/data}
LIMIT=$((64 * 1024 * 1024))

rm -rf .gpu
mkdir -p .gpu/wheels .gpu/data/contexts
# pydantic and what it needs (sentsim's configs), psutil (bench/common.py); not Ray's, not blingfire (nothing is
# split into sentences there: the corpus comes built)
for w in pydantic pydantic_core annotated_types typing_inspection typing_extensions psutil; do
  cp "$KIT"/wheels/"$w"-[0-9]*.whl .gpu/wheels/
done
# the transformers this project pins (pyproject.toml) and the newest huggingface_hub 1.x it imports with (2.x
# needs httpx2, which that machine lacks): the machine's transformers 5.17 draws LayerDrop's random number in
# every BART layer of a training step even at layerdrop 0, a branch on a tensor that breaks a compiled step
# into ~20 graphs (seen here with torch 2.11); 5.23 skips the draw. From PyPI, ~14 MB.
pin=$(grep -o '"transformers==[^"]*"' pyproject.toml | tr -d '"')
if ! "${PY:-python3}" -m pip download -q --no-deps --only-binary :all: -d .gpu/wheels "$pin" huggingface_hub==1.33.0 \
    2> >(grep -v "^WARNING: Location" >&2); then
  echo "bench/gpu_prep.sh: could not download $pin and huggingface_hub from PyPI" >&2
  exit 1
fi
cp -R "$KIT/data/corpus-enwiki58k" "$KIT/data/tokenizer" "$KIT/data/minilm_shape" .gpu/data/
# the dev sample (the teacher's `dev` set) and its k16 export (the `score` section's throughput units)
cp "$KIT/data/contexts/stsb-dev-300.jsonl" "$KIT/data/contexts/contexts-k16.jsonl.gz" .gpu/data/contexts/
cp "$DATA/sts/stsbenchmark/sts-test.csv" .gpu/data/
chmod -R u+w .gpu  # the shared copies are read-only; the next prep must be able to remove these
grep -qxF '/.gpu/' .gitignore || echo '/.gpu/' >> .gitignore

gpu=$(du -sb .gpu | cut -f1)
tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
total=$((gpu + tree))
awk -v g="$gpu" -v t="$tree" 'BEGIN { printf ".gpu/: %.1f MiB; checkout (tracked, and untracked not ignored): %.1f MiB; \
carried: %.1f MiB of 64\n", g / 1048576, t / 1048576, (g + t) / 1048576 }'
if [ "$total" -gt "$LIMIT" ]; then
  echo "bench/gpu_prep.sh: over 64 MiB: ignore bench outputs and caches, or carry less" >&2
  exit 1
fi
