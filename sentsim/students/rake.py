"""RAKE keyphrase extraction (Rose et al. 2010), as PaSeR uses it (002 §3.1.1), with a bundled stoplist.

No maintained PyPI package works offline without extra downloads (rake-nltk needs nltk's stopword
corpus), so this is a direct implementation:

1. split the sentence into words at whitespace and punctuation; a stopword, a number or a
   punctuation mark ends the current candidate phrase;
2. word score = deg(w) / freq(w), where deg(w) is the number of words co-occurring with w in
   candidate phrases (w itself included, i.e. the sum of the lengths of the phrases holding w)
   and freq(w) the number of times w occurs in them;
3. phrase score = sum of its word scores; phrases are returned best first, each once
   (ties broken by first position in the sentence).

`Phrase.start`/`end` are character offsets into the original sentence, so the phrase can be masked
in place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The SMART-derived stoplist RAKE's authors used (Fox 1989 / Salton), trimmed to common function words.
STOPWORDS = frozenset("""
a about above across after afterwards again against all almost alone along already also although always am
among amongst an and another any anyhow anyone anything anyway anywhere are around as at be became because
become becomes becoming been before beforehand behind being below beside besides between beyond both but by
can cannot could did do does doing done down during each either else elsewhere enough etc even ever every
everyone everything everywhere except few for former formerly from further had has have having he hence her
here hereafter hereby herein hereupon hers herself him himself his how however i ie if in indeed into is it
its itself just last latter latterly least less let like many may me meanwhile might mine more moreover most
mostly much must my myself namely neither never nevertheless next no nobody none noone nor not nothing now
nowhere of off often on once one only onto or other others otherwise our ours ourselves out over own per
perhaps please rather re same say says said see seem seemed seeming seems several she should since so some
somehow someone something sometime sometimes somewhere still such than that the their theirs them themselves
then thence there thereafter thereby therefore therein thereupon these they this those though through
throughout thru thus to together too toward towards under until up upon us very via was we well were what
whatever when whence whenever where whereafter whereas whereby wherein whereupon wherever whether which while
whither who whoever whole whom whose why will with within without would yet you your yours yourself
yourselves s t don doesn didn isn aren wasn weren won wouldn shouldn couldn can't don't i'm it's
""".split())

_TOKEN = re.compile(r"[A-Za-z][A-Za-z'\-]*|\d+(?:[.,]\d+)*|[^\sA-Za-z\d]")


@dataclass(frozen=True)
class Phrase:
    text: str
    score: float
    start: int  # character offsets in the sentence
    end: int
    words: tuple


def _candidates(sentence: str, stopwords) -> list[list[tuple]]:
    phrases, current = [], []
    for m in _TOKEN.finditer(sentence):
        tok = m.group(0)
        word = tok.lower().strip("'-")
        is_word = tok[0].isalpha() and word and word not in stopwords
        if is_word:
            current.append((word, m.start(), m.end()))
        else:
            if current:
                phrases.append(current)
            current = []
    if current:
        phrases.append(current)
    return phrases


def extract_phrases(sentence: str, stopwords=STOPWORDS, max_words: int = 4) -> list[Phrase]:
    """Candidate phrases ranked by RAKE score, best first; phrases longer than `max_words` are
    dropped (RAKE's usual cap; long runs are usually lists or names, not one idea)."""
    cands = [c for c in _candidates(sentence or "", stopwords) if len(c) <= max_words]
    freq: dict[str, int] = {}
    deg: dict[str, int] = {}
    for c in cands:
        for w, _, _ in c:
            freq[w] = freq.get(w, 0) + 1
            deg[w] = deg.get(w, 0) + len(c)
    seen, out = set(), []
    for c in cands:
        words = tuple(w for w, _, _ in c)
        if words in seen:
            continue
        seen.add(words)
        score = sum(deg[w] / freq[w] for w in words)
        start, end = c[0][1], c[-1][2]
        out.append(Phrase(sentence[start:end], score, start, end, words))
    return sorted(out, key=lambda p: (-p.score, p.start))


def top_phrases(sentence: str, k: int = 3, **kw) -> list[Phrase]:
    """The k best phrases, returned in sentence order (as they will be masked and reconstructed)."""
    return sorted(extract_phrases(sentence, **kw)[:k], key=lambda p: p.start)


def mask_phrases(sentence: str, phrases: list[Phrase], mask_token: str) -> str:
    """s~: each phrase replaced in place by one `mask_token` per word."""
    out, pos = [], 0
    for p in sorted(phrases, key=lambda p: p.start):
        out.append(sentence[pos:p.start])
        out.append(" ".join([mask_token] * len(p.words)))
        pos = p.end
    out.append(sentence[pos:])
    return "".join(out)
