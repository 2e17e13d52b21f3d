"""Configuration of `sentsim harvest` / jobs/harvest_pairs.py. Defaults cite their paper section."""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Tuple

from pydantic import Field, field_validator, model_validator

from sentsim.config import Section, Seed, expand_path, without_added_later
from sentsim.context.config import ScorerConfig
from sentsim.harvest import metrics
from sentsim.pipeline import StageResources
from sentsim.screening.config import ContextSetConfig, discriminator_in_use  # `contexts:`; where a disc acts


class AnchorConfig(Section):
    # No paper fixes it: 003 §3.4 harvests 100M pairs without saying how they are drawn. 1,000 anchors (about
    # 5,000 pairs with the default partners) is a small run's size, to raise for a training harvest.
    n: int = Field(1000, ge=1, description="anchor sentences sampled from the corpus (seeded)")
    per_unit: int = Field(16, ge=1, description="anchors per work unit (one shard, one completion marker)")
    # No paper fixes it (003 sets no length for the sentences it pairs): 4 leaves out headings, applause lines
    # and fragments, whose contexts say little of what they mean. Not measured.
    min_tokens: int = Field(4, ge=1, description="skip anchors shorter than this many words")


class PartnerConfig(Section):
    # A mix so the harvested scores span the similarity range (which pairs get a label).
    neighbours: int = Field(2, ge=0, description="partners from the anchor's top retrieved chunks (likely similar)")
    same_doc: int = Field(1, ge=0, description="partners from the anchor's own document")
    random: int = Field(2, ge=0, description="random corpus partners (likely dissimilar)")
    neighbour_chunks: int = Field(16, ge=1, description="retrieved chunks to draw neighbours from")
    # Pool mode labels a pair by comparing two stored vectors, so dense pairs are cheap: every pair among
    # the anchors of each TF-IDF cluster of K (K(K-1)/2 pairs for K sentences' scoring). 0: the partners above.
    cluster_size: int = Field(0, ge=0, description="contexts.mode=pool: label every pair within TF-IDF clusters "
                                                   "of this many anchors (0: neighbours, same_doc and random)")
    # No paper fixes it (003 has no clustering; this project's own choice,
    # docs/notes/2026-11-27-pool-harvest-design.md). Flat clustering costs about n^2/K distances in the driver;
    # 2 costs about n*2*sqrt(n/K), with clusters of the same sizes but other pairs (sentsim/harvest/clusters.py).
    # Measured on enwiki sentences (bench/results/cluster_scale.md): 18 s against 110 s at 90K anchors and K=32,
    # level at 20K, within-cluster TF-IDF cosine 86-110% of flat's; on 1M enwiki+gutenberg sentences 411 s at
    # K=32 (flat projected at 2-4 h). Flat stays the default, as a run resumes only with the clustering it began
    # with and an anchor-count threshold would move runs made before across it; flat prints the two estimates
    # and this key before it starts where two levels are estimated 3x faster (clusters.two_level_hint).
    cluster_levels: Literal[1, 2] = Field(
        1, description="partners.cluster_size's clustering: 1, flat k-means over all anchors; 2, first about "
                       "sqrt(n/K) equal groups, then clusters of K within each: for large anchor counts (about "
                       "100,000 or more), where flat grows as n^2/K; same cluster sizes, other pairs. Flat says "
                       "so before it starts where two levels are estimated much faster")

    # a run made before cluster_levels resumes with it at 1
    ADDED_LATER = {"cluster_levels": 1}


class HarvestResources(Section):
    """`resources.<stage>` of the harvest's stages: the one place their actors' resources are set. A pool
    harvest (contexts.mode=pool) scores its sentence vectors with `scoring` and writes them with `rank`'s
    resources, then labels pairs with `label`'s."""

    contexts: StageResources = StageResources()
    scoring: StageResources = StageResources()
    rank: StageResources = StageResources(num_cpus=0.25)
    label: StageResources = StageResources(num_cpus=0.25)  # contexts.mode=pool: pairs from stored vectors


class RankConfig(Section):
    enabled: bool = True
    # 004 §3.4 takes an unsupervised E1 (SimCSE, PromptBERT, SNCSE in §4.1). The default all-MiniLM-L6-v2 is the
    # one encoder this project may ship, and it was trained on about 1B supervised pairs (NLI among them), so rank
    # targets and RankEncoder students from it are not unsupervised in 004's sense; name an unsupervised one here
    # for that.
    encoder: Optional[str] = Field(None, description="base encoder E1 folder; default: the bundled all-MiniLM-L6-v2 "
                                                     "(a supervised encoder, unlike 004's)")
    n_anchors: int = Field(100_000, ge=2, description="anchor corpus size (004 §4.1: 100,000 sentences)")
    # No paper fixes it (004 §3.2 defines rank vectors and says nothing of storing them): bits per stored rank
    # code. 16 keep ranks exact up to 65,536 anchors and, bucketed at 004's 100K, Spearman within about 1e-4 of
    # exact (rank/vectors.py); 8 halves the bytes at a coarser rank.
    bits: Literal[8, 16, 32] = 16
    # What each sentence row keeps: `codes`, n_anchors * bits / 8 bytes of rank codes (200 KB at
    # 100K anchors); `vectors`, E1's float16 vector (2 * dim bytes: 768 for MiniLM) plus the anchor matrix once
    # per run (side table rank_anchors), ranks computed where used; `auto` (default), the smaller of the two, so
    # codes for small anchor sets (<= 384 with MiniLM at 16 bits) and vectors at 004's 100K. `auto` stays out of
    # the fingerprint (semantic()): runs from before this key resume, keeping their codes (stages.py).
    storage: Literal["auto", "vectors", "codes"] = "auto"


class GroupingConfig(Section):
    """Grouped scoring (sentsim/harvest/grouping.py; not in paper 003): every sentence of a group
    is scored against the union of the group's context sets, and each pair keeps three Eq. 4 similarities:
    (a) paper, over C_s1 + C_s2; (b) union, over the whole union; (c) centred, over the union after
    removing each context's mean over the group. Costs more items per pair than the paper's 4·|C_s|."""

    enabled: bool = False  # off = 003 §3.3 as published
    # --pairs runs: pairs per group, grouped by TF-IDF neighbourhood within a unit. A corpus harvest's
    # group is an anchor and its partners.
    pairs_per_group: int = Field(4, ge=1)
    score: Literal["paper", "union", "centred"] = "paper"  # which variant fills the `score` column


# config keys that name input files or folders: their contents are fingerprinted, not their spelling
INPUT_PATHS = ("corpus", "index", "discriminator", "context_models", "pairs_file")
# config keys that semantic() leaves out (placement, speed, where things lie), flattened; a refused resume
# does not list them
# scoring settings that change how fast, not what: left out of the fingerprint
SCORING_EXECUTION = ("device", "torch_threads", "batch_tokens", "compile")
UNFINGERPRINTED = (("out", "resources", "contexts.rep_cache", "rank.encoder") + INPUT_PATHS
                   + tuple(f"scoring.{k}" for k in SCORING_EXECUTION))


# the partners keys a clustered pool harvest (partners.cluster_size) never reads: it pairs within clusters
CLUSTERED_UNREAD = tuple(f"partners.{k}" for k in ("neighbours", "same_doc", "random", "neighbour_chunks"))


# a share of the pairs (train, dev or test; 003 §3.4)
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]


class HarvestConfig(Section):
    corpus: str
    out: str
    index: Optional[str] = None
    discriminator: Optional[str] = Field(
        None, description="a `sentsim train discriminator` model: it screens the retrieved contexts (003 §3.2.1) and "
                          "scores Eq. 3's disc term over them; contexts.mode=screened only")
    context_models: list[str] = Field(default_factory=list, description="one or more context-model bundle folders")
    pairs_file: Optional[str] = Field(
        None, description="explicit mode: score these pairs (TSV/CSV/JSONL/Parquet with s1, s2; STS-B's and SICK's "
                          "files as released; every layout in sentsim/pairs_file.py)")
    pairs_per_unit: int = Field(64, ge=1, description="explicit mode, and pool mode's labelling: pairs per work unit")
    sentences_per_unit: int = Field(64, ge=1, description="contexts.mode=pool: sentences scored per work unit")
    seed: Seed = 0
    anchors: AnchorConfig = AnchorConfig()
    partners: PartnerConfig = PartnerConfig()
    contexts: ContextSetConfig = ContextSetConfig()
    scoring: ScorerConfig = ScorerConfig()
    # Eq. 4 similarity of v_s1 and v_s2. 003 uses plain cosine; `pearson` (centred) is the default
    # because raw log-probability vectors give cosine ~1.0 for every pair (docs/reference-teacher.md).
    metric: Annotated[str, metrics.OneOf(metrics.names)] = metrics.DEFAULT
    reference_sentences: int = Field(
        8, ge=0, description="sentences whose mean score per context is the context effect (double-centred)")
    splits: Tuple[Fraction, Fraction, Fraction] = (0.98, 0.01, 0.01)  # 003 §3.4: 98/1/1 train/dev/test
    # The context_scores table (every (sentence, context) term Eq. 4 reads, not the contexts a re-rank dropped
    # (contexts.rerank_shortlist); float32: 36 bytes per item before
    # compression) is what `sentsim remix` re-weighs Eq. 3 from. At |C_s| = 500 a pair needs ~2,000 items,
    # the largest table of a harvest by far; `none` keeps no such table when λ are settled
    # and no remix is wanted (remix refuses such a harvest). `all` stays out of the fingerprint.
    keep_context_scores: Literal["all", "none"] = "all"
    rank: RankConfig = RankConfig()
    grouping: GroupingConfig = GroupingConfig()
    resources: HarvestResources = HarvestResources()

    @field_validator("corpus", "out", "index", "discriminator", "pairs_file", "context_models")
    @classmethod
    def _home(cls, v):
        """`$SENTSIM_CACHE/...` in a config file (configs/teacher.yaml points into the user cache) means the
        user cache, `~/...` the home folder (sentsim.config.expand_path)."""
        return [expand_path(p) for p in v] if isinstance(v, list) else expand_path(v)

    @field_validator("scoring")
    @classmethod
    def _eq3_weights(cls, v: ScorerConfig) -> ScorerConfig:
        """Eq. 3 (003 §3.3) is a weighted sum of log-probabilities: a negative λ would reward a context for
        making the sentence less likely, and with no term both kept and weighted every S, and so every
        pair's score, is null: such a run is refused here, before any scoring, rather than scored to nothing."""
        weights, on = v.weights(), v.enabled()
        negative = [f"lambda_{t}={w:g}" for t, w in weights.items() if w < 0]
        if negative:
            raise ValueError(f"Eq. 3 weights must be 0 or more (weights of log-probabilities; 003 §3.3 gives "
                             f"none), got {', '.join(negative)}")
        if not any(on[t] and w > 0 for t, w in weights.items()):
            raise ValueError("no Eq. 3 term is both kept (ablation, use_fwd) and weighted above 0, so every pair's "
                             "score would be null; give at least one kept term a λ above 0")
        return v

    @model_validator(mode="after")
    def _check(self):
        if abs(sum(self.splits) - 1.0) > 1e-6:
            raise ValueError(f"splits must sum to 1 (got {list(self.splits)})")
        p = self.partners
        if not self.pairs_file and not p.cluster_size and p.neighbours + p.same_doc + p.random == 0:
            raise ValueError("partners: neighbours, same_doc and random are all 0, so no anchor would have a pair")
        self.contexts.refuse_an_unused_discriminator(self.discriminator)
        self.contexts.refuse_an_unused_rep_cache(self.discriminator)
        weights, on = self.scoring.weights(), self.scoring.enabled()
        weighted = [t for t in weights if on[t] and weights[t] > 0]
        if weighted == ["disc"] and not discriminator_in_use(self.discriminator, self.contexts.mode):
            raise ValueError("scoring: the discriminator term is the only one weighted, but it is scored only with a "
                             "discriminator and screened contexts; every pair's score would be null")
        if self.contexts.rerank_shortlist and weighted == ["disc"]:
            raise ValueError("contexts.rerank_shortlist: Eq. 3 weighs only the disc term, in whose order the screening "
                             "made the shortlist, so the re-rank would keep its first contexts.size; weigh a context "
                             "model's term (scoring.lambda_fwd, lambda_left, lambda_right) or set it to 0")
        if not self.context_models:
            raise ValueError("context_models: give at least one context-model folder")
        if self.contexts.mode == "screened" and not self.index:
            raise ValueError("index: screened contexts need a retrieval index (or set contexts.mode=random)")
        self._check_pool()
        return self

    def _check_pool(self) -> None:
        pool, k = self.contexts.mode == "pool", self.partners.cluster_size
        if pool and self.grouping.enabled:
            raise ValueError("grouping scores each group over its sentences' own context sets; contexts.mode=pool has "
                             "none (every sentence shares the pool): turn grouping off")
        if k == 1:
            raise ValueError("partners.cluster_size: 1 gives no pair; use 0 (the partners) or 2 or more")
        if k and not pool:
            raise ValueError("partners.cluster_size labels pairs from stored sentence vectors: "
                             "it needs contexts.mode=pool")
        if k and self.pairs_file:
            raise ValueError("partners.cluster_size pairs up a corpus's anchors; a --pairs run labels the file's pairs")
        if self.partners.cluster_levels != 1 and not (k and pool):
            raise ValueError(f"partners.cluster_levels={self.partners.cluster_levels} clusters partners.cluster_size's "
                             "anchors: it needs partners.cluster_size (2 or more) and contexts.mode=pool")

    def unread_keys(self) -> Tuple[str, ...]:
        """The keys (dotted) a harvest of this mode never reads, so that no value of theirs changes a row. A
        per-pair corpus harvest's units are `anchors.per_unit` anchors and its groups an anchor and its partners
        (not `pairs_per_unit`, `grouping.pairs_per_group`); an explicit (--pairs) harvest, per-pair or pool,
        pairs the file's rows (no anchors, no partners). A pool corpus harvest labels units of `pairs_per_unit`
        planned pairs and scores units of `sentences_per_unit` sentences (not `anchors.per_unit`), and with
        `partners.cluster_size` pairs every two anchors of a TF-IDF cluster (not the partners' neighbours,
        same_doc, random nor neighbour_chunks). A pool run's screened-only keys are left out too: `semantic`."""
        if self.pairs_file:
            return ("anchors", "partners")
        if self.contexts.mode == "pool":
            return ("anchors.per_unit",) + (CLUSTERED_UNREAD if self.partners.cluster_size else ())
        return ("pairs_per_unit",) + (("grouping.pairs_per_group",) if self.grouping.enabled else ())

    def semantic(self, with_paths: bool = False, keep_screened: bool = False, keep_unread: bool = False) -> dict:
        """Everything that changes the rows; resources and placement do not, and neither do the spellings of
        the input paths: what they hold is fingerprinted instead (the corpus fingerprint, checkpoint hashes,
        the pairs file's sha256; job.py), so a run resumes from another folder. `with_paths` keeps them, as
        run format 1 fingerprinted them (HarvestRun.fingerprint_in_format, sentsim/run_formats.py). A pool run
        leaves out the keys only screening reads, unless `keep_screened` (or `with_paths`): formats before 3
        kept them. The keys its mode does not read (`unread_keys`) are left out, unless `keep_unread` (or
        `with_paths`): formats before 4 kept them in a per-pair run's, formats before 5 in a pool run's."""
        d = self.model_dump()
        for k in ("out", "resources") + (() if with_paths else INPUT_PATHS):
            d.pop(k)
        if not with_paths:
            d["rank"].pop("encoder")  # its checkpoint hash is fingerprinted when rank targets are on
        keep_screened = keep_screened or with_paths
        # not where the rep cache lies (its identity is: job.py)
        d["contexts"] = self.contexts.semantic(keep_screened=keep_screened)
        if self.contexts.mode == "pool" and not keep_screened:
            d.pop("keep_context_scores", None)  # a pool run keeps its sentence vectors instead
        if not self.partners.cluster_size:  # runs from before the pool mode keep their fingerprint
            d["partners"].pop("cluster_size")
        d["partners"] = without_added_later(d["partners"], PartnerConfig.ADDED_LATER)
        if self.contexts.mode != "pool":
            d.pop("sentences_per_unit")
        if not self.grouping.enabled:  # runs from before grouping existed keep their fingerprint
            d.pop("grouping")
        for k in SCORING_EXECUTION:
            d["scoring"].pop(k, None)
        if d.get("keep_context_scores") == "all":  # the default: fingerprints of earlier versions stay
            d.pop("keep_context_scores")
        if d["rank"].get("storage") == "auto":  # default-config fingerprints stay those of earlier versions
            d["rank"].pop("storage")
        if not (keep_unread or with_paths):
            for key in self.unread_keys():
                *parents, leaf = key.split(".")
                node = d
                for p in parents:
                    node = node[p]
                node.pop(leaf)
        return d
