"""Context screening (paper 003 §3.3): candidate expansion, head-only scoring from cached reps,
and the greedy diverse selection of C_s. `ContextSetConfig` holds the paper's parameters;
`contexts.ContextSource` composes these parts and is the one screening implementation, shipped by
the harvest's ContextStage and by `sentsim contexts` (its job: `contexts_job`). The representation
cache is `cache.ContextCache`; the job that writes it through the shard store (`sentsim cache
build`) is `cache_job`."""

from sentsim.screening.cache import ContextCache
from sentsim.screening.candidates import Candidates, expand_candidates
from sentsim.screening.config import ContextSetConfig
from sentsim.screening.score import score_candidates, score_windows
from sentsim.screening.select import jaccard, select_diverse, word_set

__all__ = ["ContextCache", "Candidates", "ContextSetConfig", "expand_candidates", "score_candidates", "score_windows",
           "jaccard", "select_diverse", "word_set"]
