"""contexts.mode=random (003 §5.4's ablation): contexts around random corpus sentences, each with a full window,
so no context loses an Eq. 3 term at a document's edge; runs made before that resume only as they were."""

import numpy as np
import pyarrow.dataset as ds
import pytest
from conftest import error_line, sentsim_cli
from harvest_support import build_index_for


@pytest.fixture(scope="module")
def index(speech_corpus, tmp_path_factory):
    return build_index_for(speech_corpus, tmp_path_factory.mktemp("random_ctx") / "index")


def test_full_windows_are_the_centres_with_w_sentences_a_side_in_their_document(speech_corpus):
    from corpus.documents import doc_key_of
    from corpus.view import CorpusIndex
    from sentsim.screening.candidates import full_windows

    corpus = CorpusIndex(str(speech_corpus))
    ids = corpus.ids
    for w in (1, 2):
        got = full_windows(ids, ids, w)
        want = [all(0 <= i + d and doc_key_of(i + d) == doc_key_of(i) and corpus.text(i + d) is not None
                    for d in range(-w, w + 1)) for i in ids.tolist()]
        assert got.tolist() == want and 0 < got.sum() < len(ids)
    # a sentence missing from the corpus breaks the windows that need it, and is no centre itself
    some = ids[ids != ids[10]]
    assert not full_windows(ids[9:12], some, 1).any()


@pytest.mark.parametrize("full", [True, False])
def test_random_contexts_take_only_full_windows(speech_corpus, full):
    from corpus.view import CorpusIndex
    from sentsim.screening.candidates import full_windows
    from sentsim.screening.config import ContextSetConfig
    from sentsim.screening.contexts import ContextSource

    corpus = CorpusIndex(str(speech_corpus))
    w = 3
    cfg = ContextSetConfig(mode="random", size=400, random_full_windows=full)
    sets = ContextSource(corpus, cfg, w, seed=0).context_sets(["A sentence.", "Another one."])
    centres = np.array([c.centre_id for cs in sets for c in cs.contexts])
    short = [c for cs in sets for c in cs.contexts if not len(c.left) == len(c.right) == w]
    if full:
        assert not short and full_windows(centres, corpus.ids, w).all()
    else:  # every sentence, as runs made before the key drew: 400 of ~3.8K hit some of the ~120 edge slots
        assert short


def test_a_random_contexts_run_from_before_full_windows_is_refused_by_name_and_resumes_with_it(
        speech_corpus, index, tmp_path):
    """An unfinished random-mode run begun before `contexts.random_full_windows` drew any sentence: finished
    under today's default, its later units would draw otherwise than its done ones, so it is refused in one line
    naming the key, and resumes with the key set as the run was built."""
    out = tmp_path / "ctx"
    args = ("contexts", "--corpus", speech_corpus, "--index", index, "--out", out, "--executor", "inline",
            "--set", "sample=40", "--set", "per_unit=16", "--set", "contexts.size=8", "--set", "contexts.mode=random",
            "--set", "window=3")
    old = ("--set", "contexts.random_full_windows=false")
    r = sentsim_cli(*args, *old, "--max-units", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    r = sentsim_cli(*args)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    line = error_line(r.stderr)
    assert "(contexts.random_full_windows: False -> True)" in line and "--force-new" in line, line
    r = sentsim_cli(*args, *old)
    assert r.returncode == 0 and "contexts: 40 sentences screened" in r.stdout, (r.stdout, r.stderr[-2000:])
    r = sentsim_cli(*args, "--out", tmp_path / "new")
    assert r.returncode == 0, r.stderr[-2000:]
    from corpus.view import CorpusIndex
    from sentsim.screening.candidates import full_windows

    centres = ds.dataset(str(tmp_path / "new" / "contexts")).to_table().column("centre_id").to_numpy()
    assert len(centres) and full_windows(centres, CorpusIndex(str(speech_corpus)).ids, 3).all()
