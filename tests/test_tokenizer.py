"""tiktoken works offline from the rank file shipped as package data."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np

from providers.tokenizer import (
    RANK_FILE,
    _token_byte_lengths,
    count_tokens,
    encoding,
    token_offsets,
    verify_rank_file,
)


def test_shipped_rank_file_matches_published_sha256():
    verify_rank_file()
    assert RANK_FILE.name == "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"


def test_cl100k_counts_tokens_from_the_shipped_file():
    assert count_tokens("hello world") == 2
    assert count_tokens("<|endoftext|>") > 1  # special-token text is counted literally, not refused


def test_user_tiktoken_cache_dir_is_respected(tmp_path):
    code = "import providers, os; print(os.environ['TIKTOKEN_CACHE_DIR'])"
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(tmp_path)


def test_default_points_at_package_data():
    code = "import providers, os; print(os.environ['TIKTOKEN_CACHE_DIR'])"
    env = {k: v for k, v in os.environ.items() if k != "TIKTOKEN_CACHE_DIR"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(RANK_FILE.parent)


def test_token_byte_lengths_match_decoding_every_id():
    enc = encoding()
    ids = np.arange(enc.n_vocab)
    lengths = _token_byte_lengths(ids[::-1].copy())[::-1]  # learnt in any order, met again: the same lengths
    assert (_token_byte_lengths(ids) == lengths).all()
    for token in range(enc.n_vocab):
        try:
            expected = len(enc.decode_single_token_bytes(token))
        except KeyError:  # an id cl100k leaves unused
            expected = 0
        assert lengths[token] == expected, token


def test_token_offsets_cut_text_where_its_tokens_begin():
    text = "Grüße, 世界! <|endoftext|> tokens"
    tokens, edges = token_offsets(text)
    assert edges[-1] == len(text) and len(edges) == len(tokens) + 1
    # Every token starts at or after the one before, and the pieces between edges cover the text exactly.
    assert edges == sorted(edges) and "".join(text[a:b] for a, b in itertools.pairwise(edges)) == text[edges[0]:]
    assert edges[0] == 0
    assert edges[:-1] == encoding().decode_with_offsets(tokens)[1], "tiktoken's own offsets"


def test_the_cached_encoding_tokenizes_exactly_as_tiktokens_own(tmp_path, monkeypatch):
    import tiktoken

    from providers import tokenizer

    monkeypatch.setenv("INLET_CACHE_DIR", str(tmp_path))
    made = tokenizer.encoding.__wrapped__()  # writes the cache entry
    read = tokenizer.encoding.__wrapped__()  # builds from it
    assert (tmp_path / tokenizer._cache_folder().name / "done").exists()
    reference = tiktoken.get_encoding("cl100k_base")
    texts = ["Hello, world!", "naïve café — 東京 🚤 ", "    def f(x):\n\treturn x**2  # 12345678", "<|endoftext|> as text",
             " ".join(f"word{i}" for i in range(500))]
    for enc in (made, read):
        assert enc.n_vocab == reference.n_vocab and enc.name == reference.name
        assert enc.special_tokens_set == reference.special_tokens_set
        for text in texts:
            assert enc.encode(text, disallowed_special=()) == reference.encode(text, disallowed_special=())
        assert enc.encode("<|endoftext|>", allowed_special="all") == reference.encode("<|endoftext|>", allowed_special="all")


def test_a_damaged_tokenizer_cache_is_written_again(tmp_path, monkeypatch, caplog):
    from providers import tokenizer

    monkeypatch.setenv("INLET_CACHE_DIR", str(tmp_path))
    tokenizer.encoding.__wrapped__()
    ranks = tmp_path / tokenizer._cache_folder().name / "ranks.marshal"
    whole = ranks.read_bytes()
    for damage in (b"broken", whole[: len(whole) // 2], b""):  # not marshal data; cut short (a full disk); empty
        ranks.write_bytes(damage)
        caplog.clear()
        enc = tokenizer.encoding.__wrapped__()
        assert "damaged" in caplog.text and enc.encode("Hello, world!") == [9906, 11, 1917, 0]
