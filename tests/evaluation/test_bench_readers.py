"""The bench scripts read a run's scores and gold labels as numbers through RunReader's check: a column of
text is named in one line, not cast or failed on later."""

import pyarrow as pa
import pytest
from conftest import load_bench
from harvest_support import small_pairs_run, write_pairs_run

from sentsim.errors import InputError


def test_lambda_mix_reads_score_and_gold_as_numbers(tmp_path):
    mix = load_bench("lambda_mix")
    pairs, sentences = small_pairs_run()
    gold = [float(i % 5) for i in range(pairs.num_rows)]
    numbers = write_pairs_run(tmp_path / "numbers", pairs.append_column("gold", pa.array(gold)), sentences)
    scores = mix.scores_of(str(numbers))
    assert len(scores) == 107 and all(isinstance(s, float) and isinstance(g, float) for s, g in scores.values())
    text = write_pairs_run(tmp_path / "text", pairs.append_column("gold", pa.array([str(g) for g in gold])),
                           sentences)
    with pytest.raises(InputError, match=f"^{text}: column gold of table pairs holds string, not numbers"):
        mix.scores_of(str(text))
