#!/bin/bash
# A pool harvest with rank targets on, whole command timed by farm-bench, this checkout (A) against another (B):
# 512 sample-corpus anchors, every pair in TF-IDF clusters of 32 (7,936 pairs), |P| = 8, the demo's context-model
# shape untrained, the bundled MiniLM as E1 with 1,000 rank anchors, inline, fp32, 1 torch thread.
#
#     bash bench/pool_rank_cost.sh OTHER_CHECKOUT [RUNS]      # e.g. a `git worktree add /tmp/old <commit>`
#
# Inputs are built once under bench/out/pool_rank_cost (bench/pool_cost.py's). farm-bench prints both commands'
# medians and the A/B ratios, taken pair by pair.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OTHER=$(cd "${1:?usage: bench/pool_rank_cost.sh OTHER_CHECKOUT [RUNS]}" && pwd)
RUNS=${2:-3}
PY=${PY:-$ROOT/.venv/bin/python}
WORK=$ROOT/bench/out/pool_rank_cost
mkdir -p "$WORK"
PYTHONPATH=$ROOT/bench:$ROOT/tests:$ROOT "$PY" -c "
import sys; from pathlib import Path; import pool_cost; pool_cost.inputs(Path(sys.argv[1]))" "$WORK"
cat > "$WORK/run.sh" <<RUN
#!/bin/bash
# run.sh CHECKOUT OUT: the harvest from CHECKOUT's code into a fresh OUT
set -e
rm -rf "\$2"
cd "$WORK"
PYTHONPATH=\$1 exec "$PY" -c "import sys; from sentsim.cli import entry; sys.argv[0] = 'sentsim'; entry()" harvest \\
  --corpus "$WORK/corpus" --index "$WORK/index" --context-models "$WORK/ctx" --out "\$2" --executor inline \\
  --set contexts.mode=pool --set contexts.pool_size=8 --set anchors.n=512 --set anchors.per_unit=64 \\
  --set partners.cluster_size=32 --set rank.n_anchors=1000 --set scoring.autocast=off --set scoring.torch_threads=1
RUN
chmod +x "$WORK/run.sh"
farm-bench -n "$RUNS" --warmup 0 --timeout 3600 --vs "$WORK/run.sh $OTHER $WORK/b" -- "$WORK/run.sh" "$ROOT" "$WORK/a"
