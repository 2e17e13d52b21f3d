"""Context-set construction per query sentence (003 §3.3: retrieve, expand to slots, select diverse) on the
reference corpus, as a harvest's contexts stage does it.

    python bench/context_sets.py [--config configs/teacher.yaml] [--sentences 40] [--set KEY=VALUE ...]

Opens the config's corpus and retrieval index (the user cache that `make reference` fills), takes the first
--sentences sentences of STS-B dev (both sides of each pair) and times `ContextSource.context_sets` on them
in this process (process CPU-seconds, one thread). Prints the CPU-seconds per sentence, the mean number of
candidate slots per sentence, and a hash of every chosen context (chunk, slot, centre, window), so that two
versions of the code can be timed side by side and shown to choose the same contexts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STSB_DEV = ROOT.parent / "shared" / "data" / "sts" / "stsbenchmark" / "sts-dev.csv"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "teacher.yaml"))
    ap.add_argument("--sentences", type=int, default=40)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    from corpus.view import CorpusIndex
    from sentsim.config import load_config
    from sentsim.context.bundle_meta import read_bundle_meta
    from sentsim.harvest.config import HarvestConfig
    from sentsim.pairs_file import read_pairs_file
    from sentsim.retrieval import open_retriever
    from sentsim.screening.contexts import ContextSource

    cfg = load_config(HarvestConfig, args.config, args.sets, out="unused")
    window = int(read_bundle_meta(cfg.context_models[0]).get("model_config", {}).get("context_sentences", 1))
    corpus = CorpusIndex(cfg.corpus)
    source = ContextSource(corpus, cfg.contexts, window, cfg.seed, open_retriever(cfg.index, corpus=cfg.corpus))
    pairs = read_pairs_file(str(STSB_DEV))
    texts = [s for p in pairs for s in p[:2]][:args.sentences]
    t0 = time.process_time()
    sets = source.context_sets(texts)
    cpu = time.process_time() - t0
    chosen = [[s.candidates, s.shortfall_reason,
               [[c.chunk_id, c.slot, c.centre_id, c.left, c.right, c.retrieval_score] for c in s.contexts]]
              for s in sets]
    digest = hashlib.sha256(json.dumps(chosen).encode()).hexdigest()[:16]
    shortlist = cfg.contexts.rerank_shortlist  # the screening keeps that many for the harvest's Eq. 3 re-rank
    print(f"context_sets: {len(texts)} sentences, |C_s| = {cfg.contexts.size}"
          f"{f' (shortlists of {shortlist} for the Eq. 3 re-rank)' if shortlist else ''}, "
          f"{sum(s.candidates for s in sets) / len(texts):,.0f} candidate slots per sentence, "
          f"{cpu / len(texts):.3f} CPU-s per sentence, chosen contexts sha256 {digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
