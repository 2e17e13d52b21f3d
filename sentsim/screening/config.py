"""The paper's context-set parameters (003 §3.3), one schema for every job that builds C_s:
the harvest (`contexts:`) and `sentsim contexts` alike."""

from __future__ import annotations

from typing import ClassVar, Literal, Optional

from pydantic import Field, model_validator

from sentsim.config import Section, without_added_later


class ContextSetConfig(Section):
    # 003 §3.3: |C_s| = 500, 20K retrieved chunks, one context per chunk, Jaccard < 0.5.
    size: int = Field(500, ge=1, description="|C_s|")
    retrieve_chunks: int = Field(20_000, ge=1, description="chunks retrieved per sentence by TF-IDF bigrams")
    jaccard: float = Field(0.5, gt=0.0, le=1.0,
                           description="max Jaccard of a new context's (i-1)-th sentence vs chosen ones")
    one_per_chunk: bool = Field(True, description="each chunk contributes at most one context")
    # A corpus sentence would otherwise be offered its own slot: the window it came from, which
    # every context model scores far above any other context.
    exclude_query_centre: bool = Field(True, description="drop candidates whose centre sentence is the query itself")
    # The windows beside its own hold it too: in the window centred on the next sentence the query is c<, and
    # the context models score it there by copying (the fwd model predicts s from c< = s, the left one c< from
    # s), as the discriminator's coherence terms rank it first (on a small harvest 134 of 140 corpus sentences
    # had such a window in C_s, 114 of them ranked first). In a pool harvest, no sentence is scored in a pool
    # context whose window holds it. Not in the paper, which does not say; false keeps runs made before this key
    # as they were.
    exclude_query_window: bool = Field(True, description="drop candidates whose window (the sentences either side "
                                                         "of its centre) holds the query itself")
    # Eq. 4 scores s1 in C_s2 too, and C_s2 may hold s1's own window (a neighbour's C_s often does): the copy that
    # the two keys above keep out of C_s1 would come back as one outlier of S(s1, .) that s2 does not share. Such
    # an item is left out of the pair's comparison (NaN, dropped pairwise), as a pool harvest leaves it out of
    # every pool context. Screened mode, under either key above; not in the paper. False only resumes runs made
    # before this key.
    exclude_in_partner_contexts: bool = Field(True, description="leave a sentence's items out of Eq. 4 in its "
                                                                "partners' (and group's) contexts whose window holds "
                                                                "it, by the two rules above")
    # 003 §3.3: "C_s is built by selecting top ranked contexts by Eq. 3". The discriminator's head-only ranking
    # screens the retrieved contexts (diverse, best first) down to this shortlist, the context models score the
    # sentence in each (S(s, c), Eq. 3, every kept term) and C_s is the shortlist's top |C_s| by S. The paper does
    # not say how many contexts Eq. 3 ranks. 0: no re-rank, C_s is the screening's top |C_s|, as in runs made
    # before this key. Costs (shortlist - |C_s|) more scored items per sentence; the harvest only
    # (harvest/rerank.py), since `sentsim contexts` has no context models.
    rerank_shortlist: int = Field(0, ge=0, description="re-rank the screening's top N contexts by Eq. 3 and keep "
                                                       "the top |C_s| (0: off; above size)")
    # 003 §5.4's ablation (34.45 against 78.47 on STS): random contexts instead of retrieval + discriminator
    # screening. `pool` (the harvest only; not in paper 003): one shared pool of random contexts for every
    # sentence, each sentence scored once against it, so a pair's Eq. 4 is a comparison of two stored vectors
    # (sentsim/harvest/pool.py).
    mode: Literal["screened", "random", "pool"] = "screened"
    # A random context is centred on a sentence with a full window, as every retrieved one is: at a document's
    # edge a side is short or empty, its Eq. 3 term drops out, and S there rises for every sentence alike (a
    # shared shift that Pearson's r reads as similarity). A pool is drawn the same way. False only resumes
    # random-mode runs made before this key.
    random_full_windows: bool = Field(True, description="centre random contexts only on sentences with a full "
                                                        "window (contexts.mode=random)")
    # 003 Table 6: STS-B rises with |C_s| (66.25 at 20, 73.93 at 100, on to 500); a shared pool costs
    # 3|P| items a sentence, not a pair, so it can afford many contexts.
    # at least 3: Eq. 4 needs 3 distinct contexts (over two every correlation is +1 or -1; harvest/similarity.py)
    pool_size: int = Field(256, ge=3, description="|P|, contexts in the shared pool (contexts.mode=pool)")
    # How the pool is drawn (not in paper 003): `random` windows, as 003's random-context ablation (§5.4);
    # `clusters`: POOL_DRAW_OVERSAMPLE x |P| random windows cut into |P| equal TF-IDF clusters of their centre
    # sentences, one window from each, so that the pool spans the corpus's topics rather than its densest ones.
    pool_draw: Literal["random", "clusters"] = Field("random", description="how the pool is drawn (contexts.mode=pool)")
    # 003 §3.3: "we cache sentence representations in advance, and compute model scores in the
    # last neural layer". A `sentsim cache build` run to reuse across jobs; when unset, a job with
    # a discriminator builds its own under <out>/rep_cache (resumable) before screening. Refused where no
    # discriminator screens (no --discriminator, or contexts.mode other than screened): nothing would read it.
    rep_cache: Optional[str] = Field(None,
                                     description="discriminator representation cache (a `sentsim cache build` run)")

    @model_validator(mode="after")
    def _shortlist(self):
        n = self.rerank_shortlist
        # the messages name keys within the section: the config error puts "contexts:" before them
        if n and self.mode != "screened":
            raise ValueError(f"rerank_shortlist: mode={self.mode} screens no shortlist to re-rank (it re-ranks "
                             "retrieved contexts, mode=screened); set it to 0")
        if n and n <= self.size:
            raise ValueError(f"rerank_shortlist={n} must be above size={self.size}: Eq. 3 picks C_s from that many "
                             "screened contexts (0: no re-rank)")
        return self

    # a run made before exclude_query_window resumes with it off (and is refused, naming it, with it on)
    ADDED_LATER = {"exclude_query_window": False, "rerank_shortlist": 0, "random_full_windows": False,
                   "exclude_in_partner_contexts": False}

    @property
    def partner_exclusion(self) -> bool:
        """Whether a sentence's items in its partners' contexts that hold it are left out (screened mode only,
        as its own C_s leaves them out only there)."""
        return (self.exclude_in_partner_contexts and self.mode == "screened"
                and (self.exclude_query_centre or self.exclude_query_window))

    # What only screening reads (retrieval, the discriminator's cut, Eq. 3's shortlist): a pool run scores every
    # sentence in the one shared pool instead, so a change to one of these changes nothing it writes
    SCREENED_ONLY: ClassVar[tuple] = ("size", "retrieve_chunks", "jaccard", "one_per_chunk", "rerank_shortlist")

    def semantic(self, keep_screened: bool = False) -> dict:
        """What changes the context sets: not where the rep cache lies (its identity is fingerprinted by the
        jobs), and `pool_size` only in pool mode, so runs made before the pool mode keep their fingerprints;
        `pool_draw` only when not random, so pool runs made before it keep theirs; `random_full_windows` only
        in random mode (a pool run keeps the pool it drew when it resumes); `exclude_in_partner_contexts` only where
        it acts (`partner_exclusion`); each ADDED_LATER key only
        when it differs from what runs made before it had. In pool mode, none of SCREENED_ONLY, unless
        `keep_screened`: run formats before 3 fingerprinted pool runs with them (sentsim/run_formats.py)."""
        d = without_added_later(self.model_dump(), self.ADDED_LATER)
        d.pop("rep_cache")
        if self.mode == "pool" and not keep_screened:
            for k in self.SCREENED_ONLY:
                d.pop(k, None)  # an ADDED_LATER key at its old value is out already
        if self.mode != "pool":
            d.pop("pool_size")
        if self.mode != "pool" or self.pool_draw == "random":
            d.pop("pool_draw")
        if self.mode != "random":
            d.pop("random_full_windows", None)
        if not self.partner_exclusion:
            d.pop("exclude_in_partner_contexts", None)
        return d

    def refuse_an_unused_discriminator(self, discriminator: Optional[str]) -> None:
        """Outside contexts.mode=screened a discriminator would do nothing (`discriminator_in_use`), while a
        job fingerprints it and builds its rep cache, so every job that takes one refuses it there."""
        if discriminator and not discriminator_in_use(discriminator, self.mode):
            raise ValueError(f"discriminator: contexts.mode={self.mode} uses none (a discriminator screens retrieved "
                             "contexts, and scores Eq. 3's disc term, only with contexts.mode=screened); drop "
                             "--discriminator or use contexts.mode=screened")

    def refuse_an_unused_rep_cache(self, discriminator: Optional[str]) -> None:
        """A rep cache holds a discriminator's representations and is read only where one screens
        (`discriminator_in_use`); elsewhere a given one would be ignored, with the user believing it used."""
        if self.rep_cache and not discriminator_in_use(discriminator, self.mode):
            raise ValueError("contexts.rep_cache: no discriminator is in use to read it (the cache holds a "
                             "discriminator's sentence representations, read only with --discriminator and "
                             "contexts.mode=screened); drop contexts.rep_cache or give the --discriminator it was "
                             "built with")


def screened_as_stored(contexts: dict, stored: dict) -> dict:
    """A pool run's `contexts` semantic (ContextSetConfig.semantic) with the keys only screening reads as a
    format 2 run fingerprinted them: their values in `stored` (the stored run's contexts, a config dump or a
    semantic one), each left out where it holds the value runs made before it had (ADDED_LATER), as
    `semantic` leaves it out. Their values now change nothing a pool run writes, so they are not asked for.
    One of the run-format items listed in sentsim/run_formats.py; it is here, beside the keys it reads, so that
    run_formats (which screening's jobs use) needs nothing of screening."""
    out = {k: v for k, v in contexts.items() if k not in ContextSetConfig.SCREENED_ONLY}
    old = ContextSetConfig.ADDED_LATER
    out.update({k: stored[k] for k in ContextSetConfig.SCREENED_ONLY
                if k in stored and not (k in old and stored[k] == old[k])})
    return out


def discriminator_in_use(discriminator: Optional[str], mode: Optional[str]) -> bool:
    """The one rule for where a discriminator acts: it screens retrieved contexts and scores Eq. 3's disc
    term over them (from the rep cache of the corpus's windows, 003 §3.3) only with contexts.mode=screened.
    A manifest from before the modes has no mode: it was screened."""
    return bool(discriminator) and (mode or "screened") == "screened"
