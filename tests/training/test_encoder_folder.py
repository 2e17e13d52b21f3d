"""Which folders count as an encoder with its tokenizer (sentsim.encoder_folder), before any model loads."""

from __future__ import annotations

import json

import pytest

from sentsim.encoder_folder import encoder_folder
from sentsim.errors import UsageError


@pytest.mark.parametrize("files", [
    {"tokenizer.json": "{}"}, {"vocab.txt": "[PAD]\n"}, {"spiece.model": ""},
    {"spm.model": ""},  # DeBERTa-v2/v3
    {"sentencepiece.model": ""},  # RemBERT
    {"source.spm": "", "target.spm": ""},  # Marian
    {"tokenizer_config.json": json.dumps({"tokenizer_class": "ByT5Tokenizer"})},  # bytes: no vocabulary file
])
def test_a_folder_with_any_kind_of_tokenizer_is_an_encoder(tmp_path, files):
    (tmp_path / "config.json").write_text("{}")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert encoder_folder(str(tmp_path)) == tmp_path


@pytest.mark.parametrize("files", [
    {}, {"tokenizer_config.json": json.dumps({"tokenizer_class": "BertTokenizer"})},
    {"tokenizer_config.json": "not json"},
])
def test_a_folder_without_its_tokenizer_files_is_refused_in_one_line(tmp_path, files):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_text("")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(UsageError) as err:
        encoder_folder(str(tmp_path))
    assert str(err.value).startswith(f"--backbone {tmp_path}: no tokenizer") and "\n" not in str(err.value)
