"""Context screening (paper 003 §3.3): candidate expansion, head-only scoring from cached reps,
and the greedy diverse selection of C_s. The representation cache is `cache.ContextCache`; the
job that writes it through the shard store (`sentsim cache build`) is `cache_job`."""

from sentsim.screening.cache import ContextCache
from sentsim.screening.candidates import Candidates, expand_candidates
from sentsim.screening.screen import ContextSet, ScreenConfig, Screener, score_candidates
from sentsim.screening.select import jaccard, select_diverse, word_set

__all__ = ["ContextCache", "Candidates", "expand_candidates", "ContextSet", "ScreenConfig", "Screener",
           "score_candidates", "jaccard", "select_diverse", "word_set"]
