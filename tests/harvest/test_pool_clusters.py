"""Pool-mode clusters (sentsim/harvest/clusters.py): exact sizes, determinism, topic purity and the pairs they give."""

import itertools

import numpy as np
import pytest

from sentsim.harvest.clusters import balanced_clusters, cluster_pairs, estimated_seconds, two_level_hint

TOPICS = {
    "cats": ["Cat kitten purrs.", "Kitten and cat nap.", "Cat chases kitten.", "Black cat, small kitten.",
             "Kitten cat milk.", "Cat kitten play."],
    "stocks": ["Stock market shares fell.", "Shares and stock market slump.", "Market stock shares rally.",
               "Stock shares market report.", "Investors: market stock shares.", "Shares stock market close."],
    "rain": ["Rain flooded river valley.", "River rain storm.", "Storm rain river flood.",
             "Heavy rain, river flood.", "River flood after rain.", "Rain storm river town."],
}


def synthetic(n, n_topics, seed):
    """Texts of 8 words drawn from 25-word topic vocabularies that overlap their neighbours', and their topics."""
    rng = np.random.default_rng(seed)
    topics = rng.integers(0, n_topics, n)
    words = rng.integers(0, 25, (n, 8))
    return [" ".join(f"w{(t * 10 + w) % (n_topics * 10)}" for w in row) for t, row in zip(topics, words)], topics


def assert_sizes(clusters, n, size):
    assert clusters.dtype == np.int64 and clusters.shape == (n,)
    counts = np.bincount(clusters)
    assert len(counts) == -(-n // size) and counts.min() > 0
    short = counts[counts != size]
    assert len(short) == (1 if n % size else 0)
    if len(short):
        assert short[0] == n % size


@pytest.mark.parametrize("n,size", [(30, 6), (31, 6), (35, 6), (100, 7), (9, 2), (50, 3)])
def test_sizes_are_exact(n, size):
    texts, _ = synthetic(n, 4, seed=n)
    assert_sizes(balanced_clusters(texts, size, seed=0), n, size)


def test_deterministic_for_a_seed():
    texts, _ = synthetic(400, 10, seed=1)
    a = balanced_clusters(texts, 8, seed=3)
    assert np.array_equal(a, balanced_clusters(texts, 8, seed=3))
    assert any(not np.array_equal(a, balanced_clusters(texts, 8, seed=s)) for s in (4, 5, 6))


def test_topics_land_in_pure_clusters():
    texts = [t for sents in TOPICS.values() for t in sents]
    topic = np.repeat(np.arange(len(TOPICS)), 6)
    for seed in range(3):
        cl = balanced_clusters(texts, 6, seed=seed)
        assert_sizes(cl, len(texts), 6)
        for c in range(3):
            assert len(set(topic[cl == c])) == 1, (seed, cl)


def test_cluster_pairs_are_every_pair_within_each_cluster_once():
    size = 5
    texts, _ = synthetic(23, 3, seed=2)
    cl = balanced_clusters(texts, size, seed=0)
    ids = [100 + 3 * i for i in range(len(texts))][::-1]  # ids unrelated to the order of the texts
    arr = cluster_pairs(ids, cl)
    assert arr.dtype == np.int64 and arr.shape[1] == 2
    pairs = list(map(tuple, arr.tolist()))
    assert len(pairs) == len(set(pairs))
    assert all(a < b for a, b in pairs)
    cluster_of = dict(zip(ids, cl.tolist()))
    assert all(cluster_of[a] == cluster_of[b] for a, b in pairs)
    counts = np.bincount(cl)
    assert len(pairs) == sum(c * (c - 1) // 2 for c in counts)
    full = [c for c in range(len(counts)) if counts[c] == size]
    for c in full:
        assert sum(cluster_of[a] == c for a, _ in pairs) == size * (size - 1) // 2
    # ordered by cluster, then a, then b
    assert pairs == sorted(pairs, key=lambda p: (cluster_of[p[0]], p[0], p[1]))
    expected = [p for c in range(len(counts))
                for p in itertools.combinations(sorted(i for i in ids if cluster_of[i] == c), 2)]
    assert pairs == expected


def test_cluster_pairs_edge_cases():
    assert cluster_pairs([], np.array([], dtype=np.int64)).shape == (0, 2)
    assert cluster_pairs([5, 2, 9], np.array([1, 0, 1])).tolist() == [[5, 9]]
    assert cluster_pairs([3, 1, 2], np.zeros(3, dtype=np.int64)).tolist() == [[1, 2], [1, 3], [2, 3]]
    # an id repeated within a cluster gives each pair once; across clusters, once per cluster
    assert cluster_pairs([4, 4, 7, 4, 7], np.array([0, 0, 0, 1, 1])).tolist() == [[4, 7], [4, 7]]
    assert cluster_pairs([4, 4], np.array([0, 0])).shape == (0, 2)
    with pytest.raises(ValueError):
        cluster_pairs([1, 2], np.array([0]))


def test_cluster_pairs_memory_is_the_pairs_array():
    """Pairs grow as n*(K-1)/2 (127.5M at 1M anchors in clusters of 256): they are built straight into the array
    returned, with no Python object a pair (a list of tuples took 10x the array's memory)."""
    import tracemalloc

    n, size = 40_000, 128
    clusters = np.arange(n, dtype=np.int64)[::-1] // size
    tracemalloc.start()
    try:
        pairs = cluster_pairs(np.arange(n, dtype=np.int64), clusters)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert pairs.shape == ((n // size) * size * (size - 1) // 2 + (n % size) * (n % size - 1) // 2, 2)
    assert peak < 1.5 * pairs.nbytes, (peak, pairs.nbytes)


@pytest.mark.parametrize("size", [1, 0, -3])
def test_size_below_two_raises(size):
    with pytest.raises(ValueError, match="at least 2"):
        balanced_clusters(["a b", "c d"], size, seed=0)


def test_small_inputs():
    assert np.array_equal(balanced_clusters(["one", "two", "three"], 5, seed=0), [0, 0, 0])
    assert np.array_equal(balanced_clusters(["one", "two"], 2, seed=0), [0, 0])
    out = balanced_clusters([], 4, seed=0)
    assert out.dtype == np.int64 and out.shape == (0,)


def test_texts_without_words_do_not_crash():
    assert np.array_equal(balanced_clusters([""] * 7, 3, seed=0), [0, 0, 0, 1, 1, 1, 2])
    assert np.array_equal(balanced_clusters(["!!", "?", "...", "--", ""], 2, seed=0), [0, 0, 1, 1, 2])
    # a few empty texts among real ones, 1-char tokens and stop words kept
    texts = ["", "a", "the of and", "", "I x", "to be or not", "", "cats", "a b c", "z"]
    assert_sizes(balanced_clusters(texts, 3, seed=1), len(texts), 3)


def test_duplicate_texts_fill_clusters_exactly():
    texts = ["same words here"] * 10 + ["other text"] * 7
    cl = balanced_clusters(texts, 4, seed=0)
    assert_sizes(cl, len(texts), 4)
    assert np.array_equal(cl, balanced_clusters(texts, 4, seed=0))


def test_large_run_has_exact_sizes():
    """Past the size where mini-batch k-means takes over."""
    n, size = 8_000, 50
    texts, _ = synthetic(n, 200, seed=7)
    assert_sizes(balanced_clusters(texts, size, seed=11), n, size)


def test_clustering_says_what_it_clusters_and_what_it_took_without_changing_the_clusters(capsys):
    """Clustering 90K anchors took minutes with nothing printed: it says how many into how many clusters
    before, and the seconds after, on stderr as the harvest's other lines."""
    texts, _ = synthetic(300, 5, 1)
    said = balanced_clusters(texts, 64, seed=2)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "[harvest] clustering 300 sentences into 5 TF-IDF clusters of 64"
    assert len(err) == 2 and err[1].startswith("[harvest] clustered 300 sentences in ") and err[1].endswith(" s")
    lines = []
    assert (balanced_clusters(texts, 64, seed=2, progress=lines.append) == said).all()
    assert (balanced_clusters(texts, 64, seed=2, progress=None) == said).all()
    assert len(lines) == 2 and capsys.readouterr().err == ""
    balanced_clusters(texts[:10], 64, seed=2)  # one cluster: nothing to cluster, nothing said
    assert capsys.readouterr().err == ""


def test_flat_at_a_size_where_two_levels_are_much_faster_names_the_key_first(capsys):
    """Flat clustering of 300,000 anchors in clusters of 32 would take about an hour: before it starts, one line
    says so, with two levels' estimate and the key; the clusters are the flat ones all the same (texts without a
    word keep the test fast: they fill clusters in input order)."""
    n = 300_000
    assert np.array_equal(balanced_clusters([""] * n, 32, seed=0), np.arange(n) // 32)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and err[1].startswith(f"[harvest] clustering {n:,} sentences into 9,375 TF-IDF clusters")
    assert err[0] == "[harvest] " + two_level_hint(n, 32)
    assert "partners.cluster_levels: 2" in err[0] and err[0].count("estimate") == 2
    assert err[0].startswith(f"[harvest] flat clustering of {n:,} sentences in clusters of 32: estimated about ")
    # levels=2 chosen, or flat where two levels save little (90K in clusters of 256: 18 s against 16 s
    # measured): no such line
    balanced_clusters([""] * n, 32, seed=0, levels=2)
    balanced_clusters([""] * 90_000, 256, seed=0)
    assert not any("cluster_levels" in line for line in capsys.readouterr().err.splitlines())


def test_two_level_hint_follows_the_measured_costs():
    """The estimates grow as the benchmark did (flat as n^2/K, two levels near n^1.5); the line appears where
    two levels were measured several times faster (90K in clusters of 32: 110 s against 18 s), and never at the
    sizes of the test suite or the demo, whose output stays as it was."""
    assert estimated_seconds(1_000_000, 32, 1) > 10 * estimated_seconds(1_000_000, 32, 2)
    assert estimated_seconds(200_000, 32, 1) > 3.5 * estimated_seconds(100_000, 32, 1)
    assert estimated_seconds(5, 32, 2) == estimated_seconds(5, 32, 1)  # one cluster: no two levels
    for n, size in ((1_000_000, 32), (1_000_000, 256), (500_000, 32), (90_000, 32)):
        line = two_level_hint(n, size)
        assert line and "partners.cluster_levels: 2" in line, (n, size)
    for n in (10, 1_000, 5_000, 8_000):  # the demo's 1,000 anchors; this file's largest clustering, 8,000
        for size in (2, 4, 8, 32, 256):
            assert two_level_hint(n, size) is None, (n, size)
    assert all(two_level_hint(20_000, size) is None for size in (8, 32, 256))  # level in the bench at 20K
    assert two_level_hint(90_000, 256) is None


# two levels (levels=2, partners.cluster_levels: 2): groups of whole clusters' worth, then clusters within each

@pytest.mark.parametrize("n,size", [
    (30, 6), (31, 6), (35, 6), (100, 7), (9, 2), (50, 3),
    (13, 4),    # 4 clusters: 2 groups of 8, the second short of a group (n < size * groups * per group)
    (17, 4),    # 5 clusters: groups of 12 and 5, the remainder cluster in the short group
    (400, 20),  # n a multiple of size and of the group size: no remainder anywhere
    (420, 20),  # n a multiple of size, not of the group size (groups of 100: four, and one of 20)
    (1000, 10), (999, 10), (8, 3), (12, 5)])
def test_two_levels_keep_the_sizes_exact(n, size):
    texts, _ = synthetic(n, 4, seed=n)
    assert_sizes(balanced_clusters(texts, size, seed=0, progress=None, levels=2), n, size)


def test_two_levels_with_two_clusters_or_fewer_are_the_flat_clustering(capsys):
    for n in (5, 12, 16):  # one cluster, two clusters: too few for groups
        texts, _ = synthetic(n, 3, seed=n)
        assert np.array_equal(balanced_clusters(texts, 8, seed=1, levels=2), balanced_clusters(texts, 8, seed=1))
    assert "two levels" not in capsys.readouterr().err


def test_two_levels_are_deterministic_for_a_seed():
    """As the flat clustering (test_deterministic_for_a_seed): a function of the texts and the seed, in their
    order (neither clustering promises the same labels for the texts in another order)."""
    texts, _ = synthetic(600, 10, seed=1)
    a = balanced_clusters(texts, 8, seed=3, progress=None, levels=2)
    assert_sizes(a, 600, 8)
    assert np.array_equal(a, balanced_clusters(texts, 8, seed=3, progress=None, levels=2))
    assert any(not np.array_equal(a, balanced_clusters(texts, 8, seed=s, progress=None, levels=2)) for s in (4, 5))
    assert not np.array_equal(a, balanced_clusters(texts, 8, seed=3, progress=None))  # other pairs than flat


def test_two_levels_keep_topics_together():
    """Two topics of 24 sentences each, clusters of 6: the groups (of 12 here) and the clusters stay pure."""
    texts = [t for sents in TOPICS.values() for t in sents][:12] * 2
    topic = np.repeat([0, 1, 0, 1], 6)
    for seed in range(3):
        cl = balanced_clusters(texts, 6, seed=seed, progress=None, levels=2)
        assert_sizes(cl, 24, 6)
        assert all(len(set(topic[cl == c])) == 1 for c in range(4)), (seed, cl)


def test_two_levels_of_texts_without_words():
    """No TF-IDF at either level: clusters fill in input order, as the flat clustering's do."""
    for n, size in ((7, 3), (17, 4), (40, 5)):
        assert np.array_equal(balanced_clusters([""] * n, size, seed=0, progress=None, levels=2),
                              np.arange(n) // size)
    texts = ["", "a", "the of and", "", "I x", "to be or not", "", "cats", "a b c", "z", "!!", "?"]
    assert_sizes(balanced_clusters(texts, 3, seed=1, progress=None, levels=2), len(texts), 3)


def test_two_levels_past_mini_batch_k_means():
    n, size = 8_000, 50
    texts, _ = synthetic(n, 200, seed=7)
    assert_sizes(balanced_clusters(texts, size, seed=11, progress=None, levels=2), n, size)


def test_two_levels_say_what_each_level_does_and_took(capsys):
    texts, _ = synthetic(300, 5, 1)
    said = balanced_clusters(texts, 16, seed=2, levels=2)  # 19 clusters: 4 groups of 5 clusters' worth (80)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == ("[harvest] clustering 300 sentences into 19 TF-IDF clusters of 16 in two levels: "
                      "4 groups of 80, then clusters of 16 within each")
    assert err[1].startswith("[harvest] level 1: 300 sentences into 4 groups in ") and err[1].endswith(" s")
    assert err[2].startswith("[harvest] level 2: 4 groups into 19 clusters of 16 in ") and err[2].endswith(" s")
    assert err[3].startswith("[harvest] clustered 300 sentences in ") and len(err) == 4
    lines = []
    assert (balanced_clusters(texts, 16, seed=2, progress=lines.append, levels=2) == said).all()
    assert (balanced_clusters(texts, 16, seed=2, progress=None, levels=2) == said).all()
    assert len(lines) == 4 and capsys.readouterr().err == ""


@pytest.mark.parametrize("levels", [0, 3])
def test_other_levels_raise(levels):
    with pytest.raises(ValueError, match="levels must be 1 or 2"):
        balanced_clusters(["a b", "c d", "e f"], 2, seed=0, levels=levels)


def test_the_capacity_walk_is_the_full_walk_and_keeps_no_distance_rows():
    """The walk over each text's m nearest centres, then blocks of its further ones, places every text as the walk
    over all n*k (distance, text, centre) pairs does (module docstring), here with texts that go hundreds of
    centres past their m; and it never holds as much as the n x k distances (keeping each such text's whole row
    took the flat clustering of 500,000 texts in clusters of 256 to 7.9 GiB more)."""
    import tracemalloc

    from sentsim.harvest import clusters as C

    n, size = 3_000, 3
    texts, _ = synthetic(n, 3, seed=5)  # 3 topics, 1,000 clusters: most texts find their nearest centres full
    k = n // size
    X = C._tfidf(texts, max_features=2048)
    centres = C._kmeans(X, k, 0, True)
    cand_d, cand_c = C._nearest(X, centres, C._CANDIDATES)
    room = np.full(k, size, dtype=np.int64)
    tracemalloc.start()
    try:
        labels = C._assign(X, centres, cand_d, cand_c, room)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < n * k * 8, peak

    D = C._distances(X, np.ascontiguousarray(centres.T), np.einsum("ij,ij->i", centres, centres))
    t, c = np.divmod(np.arange(n * k), k)
    full = np.full(n, -1)
    rooms = room.copy()
    for i in np.lexsort((c, t, D.reshape(-1))):
        if full[t[i]] < 0 and rooms[c[i]]:
            full[t[i]] = c[i]
            rooms[c[i]] -= 1
    assert np.array_equal(labels, full)
    rank = (D < D[np.arange(n), full][:, None]).sum(axis=1)  # centres nearer than the one each text got
    assert rank.max() > C._CANDIDATES + 2 * C._REST_BLOCK  # past the first two blocks
