"""A catalogue of bad inputs run through the real `sentsim` commands, counting exit codes and tracebacks.

    .venv/bin/python bench/bad_inputs.py [--sentsim PATH] [--work DIR] [--only GROUP] [--out FILE.md]

Each case writes an input file (or a config value), runs one command as a user types it (a subprocess,
from a scratch folder), and is classified: exit status, whether sentsim printed a traceback (a stderr
line that starts with "Traceback"; a Ray actor's own log lines carry an "(Actor pid=...)" prefix),
whether the refusal is one `sentsim: error:` line, and whether the outcome is the one expected (a
refusal with exit 2, or a run that reads the input as meant). Issue 37's acceptance: 0 tracebacks.

`--sentsim` runs another checkout's command (e.g. /work/main/.venv/bin/sentsim) on the same catalogue,
for a before/after table. The shared inputs (the bundled sample corpus, its TF-IDF index, a tiny context
model and a tiny BERT) are built once under --work with this checkout's library.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
# the checkout too: else tests/storage/, a test folder, is imported as the storage package
sys.path.append(str(ROOT))
SAMPLE = ROOT / "corpus" / "sample" / "us_speeches_sample.jsonl.gz"


@dataclass
class Case:
    group: str
    name: str
    argv: Callable[[dict], list]  # the command's arguments, given the shared inputs and the case's folder
    write: Optional[Callable[[Path], None]] = None  # writes the case's input file(s) into its folder
    expect: str = "refused"  # "refused" (exit 2, one line) or "ok" (exit 0)


def _pq(path: Path, **cols) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({k: pa.array(v) if not isinstance(v, pa.Array) else v for k, v in cols.items()}), path)


def _truncate(path: Path, keep: int = -40) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def unreadable_json(number: str, text: str) -> dict:
    """JSON lines json.loads refuses with RecursionError and ValueError, and one it reads whose string no
    UTF-8 text can hold; `number` and `text` name the fields that carry the long integer and the surrogate."""
    return {"nested 100,000 deep": "[" * 100_000 + "]" * 100_000,
            "integer of 5,001 digits": '{"s1": "a b", "s2": "c d", "id": "x", "paragraphs": ["Fine."], "%s": %s}'
            % (number, "7" * 5001),
            "lone surrogate \\ud800": '{"s1": "a b", "s2": "c d", "score": 1, "paragraphs": ["Fine."], "%s": %s}'
            % (text, '"Bad \\ud800 here."' if text != "paragraphs" else '["Bad \\ud800 here."]')}


PAIRS = (["The nation must stay strong.", "Taxes were cut this year."],
         ["Our country has to remain powerful.", "Taxes went down."])


def catalogue() -> list[Case]:
    import pyarrow as pa

    docs = '{"id": "a", "paragraphs": ["One plain sentence here. And another one."]}\n'
    cases: list[Case] = []

    # ---- corpus build
    def corpus(name, write, expect="refused", extra=()):
        cases.append(Case("corpus build", name, lambda s, d, f=name.split(" ")[0]: [
            "corpus", "build", d / f, "--out", d / "out", "--executor", "inline", *extra], write, expect))

    corpus("t.jsonl.gz (truncated gzip)", lambda d: (d / "t.jsonl.gz").write_bytes(SAMPLE.read_bytes()[:3000]))
    corpus("p.jsonl.gz (plain JSON lines)", lambda d: (d / "p.jsonl.gz").write_text(docs), "ok")
    corpus("t.txt.gz (truncated gzip)",
           lambda d: (d / "t.txt.gz").write_bytes(gzip.compress(b"Hello. World." * 500)[:60]))
    corpus("p.txt.gz (plain text)", lambda d: (d / "p.txt.gz").write_text("Hello there. This is plain text.\n"), "ok")
    for kind, values in (("int", [1, 2]), ("binary", [b"One. Two.", b"x"]), ("list-int", [[1], [2]]),
                         ("struct", [{"a": 1}, {"a": 2}]), ("float", [1.5, float("nan")]), ("bool", [True, False])):
        corpus(f"{kind}.parquet (text column of {kind})", lambda d, k=kind, v=values: _pq(d / f"{k}.parquet", text=v))
    corpus("tr.parquet (truncated)",
           lambda d: (_pq(d / "tr.parquet", text=["One. Two."] * 50), _truncate(d / "tr.parquet")))
    corpus("z.parquet (0 bytes)", lambda d: (d / "z.parquet").write_bytes(b""))
    corpus("e.parquet (no rows)", lambda d: _pq(d / "e.parquet", text=pa.array([], pa.string())))
    corpus("b.jsonl (byte-order mark)", lambda d: (d / "b.jsonl").write_bytes(b"\xef\xbb\xbf" + docs.encode()), "ok")
    corpus("b.txt (byte-order mark)", lambda d: (d / "b.txt").write_bytes(b"\xef\xbb\xbfHello there. Fine.\n"), "ok")
    corpus("l.jsonl (latin-1 bytes)",
           lambda d: (d / "l.jsonl").write_bytes(docs.replace("plain", "caf\xe9").encode("latin-1")))
    corpus("p.jsonl.gz --set unit_bytes=.inf", lambda d: (d / "p.jsonl.gz").write_text(docs), "refused",
           ("--set", "unit_bytes=.inf"))
    corpus("p.jsonl.gz --set chunk.size=nan", lambda d: (d / "p.jsonl.gz").write_text(docs), "refused",
           ("--set", "chunk.size=nan"))
    # lines json.loads cannot read (RecursionError, ValueError), and one it reads that no UTF-8 text holds
    for label, line in unreadable_json("id", "paragraphs").items():
        corpus(f"j.jsonl ({label})", lambda d, x=line: (d / "j.jsonl").write_text(docs + x + "\n"))
        corpus(f"j.jsonl ({label}) --set on_error=skip", lambda d, x=line: (d / "j.jsonl").write_text(docs + x + "\n"),
               "ok", ("--set", "on_error=skip"))
    corpus("u.parquet (text bytes not UTF-8)", lambda d: _pq(d / "u.parquet", text=pa.array(
        [b"One. Two.", b"caf\xe9."]).view(pa.string())))
    corpus("docs (a folder)", lambda d: (d / "docs").mkdir())
    for label, yaml_text in (("key named twice", b"chunk:\n  size: 4\n  size: 6\n"),
                             ("top-level key named twice", b"on_error: skip\non_error: fail\n"),
                             ("docs_per_unit: true", b"docs_per_unit: true\n"),
                             ("chunk.stride: false", b"chunk:\n  stride: false\n"),
                             ("latin-1 bytes", b"on_error: sk\xe9p\n"),
                             ("integer of 5,001 digits", b"unit_bytes: " + b"7" * 5001 + b"\n")):
        corpus(f"p.jsonl --config c.yaml ({label})", lambda d, y=yaml_text: ((d / "p.jsonl").write_text(docs),
               (d / "c.yaml").write_bytes(y)), "refused", ("--config", "c.yaml"))

    # ---- harvest --pairs and the harvest's config
    def harvest(name, write=None, expect="refused", extra=(), pairs=None, bundle="bundle"):
        def argv(s, d):
            base = ["harvest", "--corpus", s["corpus"], "--index", s["index"], "--context-models", s[bundle],
                    "--out", d / "run", "--executor", "inline", "--set", "rank.enabled=false",
                    "--set", "contexts.size=4", "--set", "contexts.retrieve_chunks=20"]
            return base + (["--pairs", d / pairs] if pairs else ["--set", "anchors.n=4"]) + list(extra)
        cases.append(Case("harvest", name, argv, write, expect))

    for name, gold in (("string gold", ["3.5", "high"]), ("NaN gold", [1.0, float("nan")]),
                       ("inf gold", [float("inf"), 2.0]), ("bool gold", [True, False])):
        harvest(f"p.parquet ({name})", lambda d, g=gold: _pq(d / "p.parquet", s1=PAIRS[0], s2=PAIRS[1], gold=g),
                pairs="p.parquet")
    harvest("p.parquet (s1 of ints)", lambda d: _pq(d / "p.parquet", s1=[1, 2], s2=PAIRS[1]), pairs="p.parquet")
    harvest("p.parquet (truncated)", lambda d: (_pq(d / "p.parquet", s1=PAIRS[0], s2=PAIRS[1]),
                                                _truncate(d / "p.parquet")), pairs="p.parquet")
    harvest("p.parquet (no rows)", lambda d: _pq(d / "p.parquet", s1=pa.array([], pa.string()),
                                                 s2=pa.array([], pa.string())), pairs="p.parquet")
    harvest("p.tsv (gold 'nan')", lambda d: (d / "p.tsv").write_text(
        f"s1\ts2\tgold\n{PAIRS[0][0]}\t{PAIRS[1][0]}\tnan\n"), pairs="p.tsv")
    harvest("p.jsonl (gold NaN token)", lambda d: (d / "p.jsonl").write_text(
        json.dumps({"s1": PAIRS[0][0], "s2": PAIRS[1][0], "gold": float("nan")}) + "\n"), pairs="p.jsonl")
    harvest("p.tsv.gz (truncated gzip)", lambda d: (d / "p.tsv.gz").write_bytes(
        gzip.compress(f"{PAIRS[0][0]}\t{PAIRS[1][0]}\n".encode() * 40)[:50]), pairs="p.tsv.gz")
    harvest("p.tsv (byte-order mark on its header)", lambda d: (d / "p.tsv").write_text(
        "\ufeffs1\ts2\tgold\n" + "".join(f"{a}\t{b}\t3\n" for a, b in zip(*PAIRS))), "ok", pairs="p.tsv")
    harvest("g.tsv (every pair retrieves nothing: all null)", lambda d: (d / "g.tsv").write_text(
        "zzqx qqzx\txqzz zqxq\nqxqz zzxq\tqqqz xxzq\n"), pairs="g.tsv")
    for label, line in unreadable_json("gold", "s2").items():
        harvest(f"p.jsonl ({label})", lambda d, x=line: (d / "p.jsonl").write_text(
            json.dumps({"s1": PAIRS[0][0], "s2": PAIRS[1][0]}) + "\n" + x + "\n"), pairs="p.jsonl")
    harvest("p.parquet (s2 bytes not UTF-8)", lambda d: _pq(d / "p.parquet", s1=PAIRS[0], s2=pa.array(
        [b"fine", b"caf\xe9"]).view(pa.string())), pairs="p.parquet")
    harvest("p.tsv (a folder)", lambda d: (d / "p.tsv").mkdir(), pairs="p.tsv")
    harvest("p.tsv (a TAB inside a sentence, under a header)", lambda d: (d / "p.tsv").write_text(
        f"s1\ts2\n{PAIRS[0][0]}\t{PAIRS[1][0]}\nA cat\tsat.\tA dog sat.\n"), pairs="p.tsv")
    cases.append(Case("harvest", "--out a symlink to nothing (a disk not mounted)", lambda s, d: [
        "harvest", "--corpus", s["corpus"], "--index", s["index"], "--context-models", s["bundle"], "--out",
        d / "link", "--executor", "inline", "--set", "rank.enabled=false", "--set", "anchors.n=4"],
        lambda d: (d / "link").symlink_to(d / "unmounted" / "runs")))
    harvest("--set pairs_per_unit=true", extra=("--set", "pairs_per_unit=true"))
    harvest("--set splits=[0.98,0.02,0.01]", extra=("--set", "splits=[0.98,0.02,0.01]"))
    harvest("--set scoring.lambda_fwd=.nan", extra=("--set", "scoring.lambda_fwd=.nan"))
    harvest("--set scoring.lambda_left=inf", extra=("--set", "scoring.lambda_left=inf"))
    harvest("--set splits=[1.5,-0.25,-0.25]", extra=("--set", "splits=[1.5,-0.25,-0.25]"))
    harvest("--set seed=-1", extra=("--set", "seed=-1"))
    harvest("every λ 0", extra=tuple(x for t in ("disc", "fwd", "left", "right")
                                     for x in ("--set", f"scoring.lambda_{t}=0")))
    harvest("λ only on terms the models lack", extra=("--set", "scoring.lambda_fwd=0"), bundle="fwd_only")
    harvest("--set contexts.rerank_shortlist=4 (not above contexts.size=4)",
            extra=("--set", "contexts.rerank_shortlist=4"))
    harvest("contexts.rerank_shortlist with contexts.mode=random",
            extra=("--set", "contexts.rerank_shortlist=600", "--set", "contexts.mode=random"))

    # ---- remix of a finished harvest
    for flag, value in (("--lambda-fwd", "inf"), ("--lambda-fwd", "nan"), ("--lambda-left", "-1"),
                        ("--lambda-disc", "1")):
        cases.append(Case("remix", f"{flag} {value}", lambda s, d, f=flag, v=value: [
            "remix", s["harvest"], "--out", d / "mix", f, v]))

    # ---- eval sts
    def scores(fmt, value):
        def write(d):
            rows = [dict(s1="A cat sits.", s2="A cat sat.", score="0.9" if isinstance(value, str) else 0.9),
                    dict(s1="A dog runs.", s2="The sky.", score=value)]
            p = d / f"s.{fmt}"
            if fmt == "parquet":
                _pq(p, **{k: [r[k] for r in rows] for k in ("s1", "s2", "score")})
            elif fmt == "jsonl":
                p.write_text("".join(json.dumps(r) + "\n" for r in rows))
            else:
                sep = "," if fmt == "csv" else "\t"
                p.write_text(f"s1{sep}s2{sep}score\n"
                             + "".join(f"{r['s1']}{sep}{r['s2']}{sep}{r['score']}\n" for r in rows))
        cases.append(Case("eval sts", f"--scores s.{fmt} (score {value})", lambda s, d, f=fmt: [
            "eval", "sts", "--scores", d / f"s.{f}", "--data", s["sts"], "--tasks", "STSb"], write))

    for fmt in ("csv", "tsv", "jsonl", "parquet"):
        for value in (float("nan"), float("inf")):
            scores(fmt, value)
    scores("parquet", "high")
    cases.append(Case("eval sts", "--scores s.parquet (s1 of bytes, not UTF-8)", lambda s, d: [
        "eval", "sts", "--scores", d / "s.parquet", "--data", s["sts"], "--tasks", "STSb"],
        lambda d: _pq(d / "s.parquet", s1=pa.array([b"A cat sits.", b"\xff"]), s2=["A cat sat.", "x"],
                      score=[0.9, 0.1])))
    for label, line in unreadable_json("score", "s1").items():
        cases.append(Case("eval sts", f"--scores s.jsonl ({label})", lambda s, d: [
            "eval", "sts", "--scores", d / "s.jsonl", "--data", s["sts"], "--tasks", "STSb"],
            lambda d, x=line: (d / "s.jsonl").write_text(x + "\n")))
    cases.append(Case("eval sts", "--scores s.parquet (truncated)", lambda s, d: [
        "eval", "sts", "--scores", d / "s.parquet", "--data", s["sts"], "--tasks", "STSb"],
        lambda d: (_pq(d / "s.parquet", s1=["a"] * 40, s2=["b"] * 40, score=[0.5] * 40), _truncate(d / "s.parquet"))))

    def sts12(d, gold):
        y = d / "sts" / "STS2012-en-test"
        y.mkdir(parents=True)
        (y / "STS.input.x.txt").write_text("a b\tc d\ne f\tg h\n")
        (y / "STS.gs.x.txt").write_text(gold)
    cases.append(Case("eval sts", "STS12 with every gold line empty", lambda s, d: [
        "eval", "sts", "--tfidf", "--data", d / "sts", "--tasks", "STS12"], lambda d: sts12(d, "\n\n")))
    cases.append(Case("eval sts", "STS12 with a gold 'nan'", lambda s, d: [
        "eval", "sts", "--tfidf", "--data", d / "sts", "--tasks", "STS12"], lambda d: sts12(d, "1.0\nnan\n")))

    def sick_bom(d):
        (d / "sts" / "SICK").mkdir(parents=True)
        (d / "sts" / "SICK" / "SICK_trial.txt").write_bytes(b"\xef\xbb\xbf" + (
            "pair_ID\tsentence_A\tsentence_B\trelatedness_score\n1\tA cat.\tA dog.\t3.5\n2\tRain.\tSun.\t1.0\n"
            "3\tA man sings.\tA man sings loudly.\t4.5\n").encode())
    cases.append(Case("eval sts", "SICK with a byte-order mark on its header", lambda s, d: [
        "eval", "sts", "--tfidf", "--data", d / "sts", "--tasks", "SICK-R"], sick_bom, "ok"))

    # ---- training
    def run_with(d, nan=False, split=None):
        """The trainers' small harvest (harvest_support.small_pairs_run), with one NaN score or odd split."""
        from harvest_support import small_pairs_run, write_pairs_run

        pairs, sentences = small_pairs_run(nan_score=nan)
        if split is not None:
            pairs = pairs.set_column(pairs.schema.get_field_index("split"), "split",
                                     pa.array([split] + pairs["split"].to_pylist()[1:], pa.string()))
        write_pairs_run(d / "h", pairs, sentences)

    def train(group, name, args, write, expect="refused"):
        cases.append(Case(group, name, lambda s, d, a=args: [
            "train", *a(s, d), "--backbone", s["bert"], "--out", d / "o", "--max-steps", "1",
            "--set", "max_seq_length=16"], write, expect))

    surrogate = lambda s, d: ["surrogate", "--data", d / "h", "--init", "scratch"]  # noqa: E731
    train("train surrogate", "a NaN score in the harvest", surrogate, lambda d: run_with(d, nan=True))
    train("train surrogate", "a split 'valid' in the harvest", surrogate, lambda d: run_with(d, split="valid"))
    train("train surrogate", "--set lr=.inf", lambda s, d: surrogate(s, d) + ["--set", "lr=.inf"], run_with)
    student = lambda s, d: ["student", "--objective", "rse", "--executor", "inline", "--data", d / "h"]  # noqa: E731
    train("train student", "a NaN score in the harvest", student, lambda d: run_with(d, nan=True))
    train("train student", "--set rse.score_threshold=nan", lambda s, d: student(s, d) + [
        "--set", "rse.score_threshold=nan"], run_with)
    triples = "".join(json.dumps({"s_i": f"sentence {i} about {w}", "relation": "entailment", "s_j": f"on {w}"}) + "\n"
                      for i, w in enumerate("river city vote law war peace tax school".split()))
    rse_file = lambda name: lambda s, d: ["student", "--objective", "rse", "--executor", "inline",  # noqa: E731
                                          "--triples", d / name, "--set", "batch_size=4"]
    train("train student", "t.jsonl.gz (truncated gzip)", rse_file("t.jsonl.gz"),
          lambda d: (d / "t.jsonl.gz").write_bytes(gzip.compress(triples.encode())[:-30]))
    train("train student", "t.jsonl (latin-1 bytes)", rse_file("t.jsonl"),
          lambda d: (d / "t.jsonl").write_bytes(triples.replace("river", "caf\xe9").encode("latin-1")))
    train("train student", "t.jsonl (byte-order mark)", rse_file("t.jsonl"),
          lambda d: (d / "t.jsonl").write_bytes(b"\xef\xbb\xbf" + triples.encode()), "ok")
    return cases


def shared_inputs(work: Path) -> dict:
    """The sample corpus, its index, a tiny context model (and a copy that provides fwd only), a tiny
    BERT, an STS-B test file and a small finished harvest: built once, reused by every case."""
    from harvest_support import build_index_for, harvest_config, tiny_bert, tiny_context_bundle

    from sentsim.corpus_job import build_corpus
    from sentsim.harvest.job import harvest

    s = {k: work / k for k in ("corpus", "index", "bundle", "fwd_only", "bert", "sts", "harvest")}
    if not (s["harvest"] / "_COMPLETE").exists():
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        build_corpus([str(SAMPLE)], str(s["corpus"]), overrides=["docs_per_unit=4"], executor="inline", quiet=True)
        build_index_for(s["corpus"], s["index"])
        tiny_context_bundle(s["corpus"], s["bundle"])
        shutil.copytree(s["bundle"], s["fwd_only"])
        meta = json.loads((s["fwd_only"] / "context.json").read_text())
        meta["directions"] = {"fwd": meta["directions"]["fwd"]}
        (s["fwd_only"] / "context.json").write_text(json.dumps(meta))
        tiny_bert(s["bert"], layers=1, width=32, heads=2, positions=64)
        (s["sts"] / "stsbenchmark").mkdir(parents=True)
        (s["sts"] / "stsbenchmark" / "sts-test.csv").write_text(
            "g\tf\t2012\t1\t4.0\tA cat sits.\tA cat sat.\ng\tf\t2012\t2\t1.0\tA dog runs.\tThe sky.\n"
            "g\tf\t2012\t3\t3.0\tHe is here.\tHe came.\n")
        cfg = harvest_config(s["corpus"], s["index"], s["bundle"], s["harvest"], rank={"enabled": False},
                             anchors={"n": 4, "per_unit": 2}, contexts={"size": 4, "retrieve_chunks": 20})
        harvest(cfg, executor="inline", quiet=True)
    return s


def run_case(case: Case, sentsim: str, s: dict, root: Path) -> dict:
    d = root / f"{case.group}-{case.name}".replace(" ", "_").replace("/", "_")[:80]
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    if case.write:
        case.write(d)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", HF_HUB_OFFLINE="1")
    t0 = time.time()
    # as typed from the case's folder: its own files by their names
    argv = [str(a.relative_to(d)) if isinstance(a, Path) and a.is_relative_to(d) else str(a) for a in case.argv(s, d)]
    r = subprocess.run([sentsim, *argv], capture_output=True, text=True, cwd=d, env=env, timeout=900)
    lines = r.stderr.splitlines()
    own = any(ln.startswith("Traceback") for ln in lines)
    errors = [ln for ln in lines if ln.startswith("sentsim: error:")]
    ok = (r.returncode == 0 and not own) if case.expect == "ok" else (
        r.returncode == 2 and not own and len(errors) == 1)
    return {"group": case.group, "case": case.name, "expect": case.expect, "rc": r.returncode, "traceback": own,
            "one_line": len(errors) == 1, "as_expected": ok, "seconds": time.time() - t0,
            "said": (errors[0][len("sentsim: error: "):] if errors else (lines[-1] if lines else ""))[:150]}


def table(results: list[dict], label: str) -> str:
    groups = list(dict.fromkeys(r["group"] for r in results))
    out = [f"### {label}", "", "| command | cases | exit 0 | exit 2 | other exit | traceback | as expected |",
           "|---|---|---|---|---|---|---|"]
    for g in groups + ["all"]:
        rs = [r for r in results if g in ("all", r["group"])]
        out.append(f"| {'**all**' if g == 'all' else g} | {len(rs)} | {sum(r['rc'] == 0 for r in rs)} | "
                   f"{sum(r['rc'] == 2 for r in rs)} | {sum(r['rc'] not in (0, 2) for r in rs)} | "
                   f"{sum(r['traceback'] for r in rs)} | {sum(r['as_expected'] for r in rs)} |")
    out += ["", "| command | case | expected | exit | traceback | says |", "|---|---|---|---|---|---|"]
    for r in results:
        said = r["said"].replace("|", "\\|")
        out.append(f"| {r['group']} | {r['case']} | {r['expect']} | {r['rc']} | {'yes' if r['traceback'] else ''} | "
                   f"{said} |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentsim", default=shutil.which("sentsim") or str(Path(sys.executable).parent / "sentsim"),
                    help="the sentsim command to run (default: this venv's)")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "sentsim-bad-inputs"),
                    help="where the shared inputs are built once and the cases run")
    ap.add_argument("--only", help="run only the cases of this command group (e.g. 'eval sts')")
    ap.add_argument("--out", help="also write the Markdown table here")
    args = ap.parse_args()
    work = Path(args.work)
    s = shared_inputs(work / "shared")
    cases = [c for c in catalogue() if not args.only or c.group == args.only]
    results = []
    for c in cases:
        res = run_case(c, args.sentsim, s, work / "cases")
        results.append(res)
        print(f"{res['rc']:>3} {'TB ' if res['traceback'] else '   '}{'ok ' if res['as_expected'] else 'BAD'} "
              f"{c.group}: {c.name} ({res['seconds']:.0f}s) {res['said'][:90]}", flush=True)
    md = table(results, f"`{args.sentsim}`")
    print(md)
    if args.out:
        Path(args.out).write_text(md)
    return 1 if any(r["traceback"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
