"""Query helpers: filters become safe SQL; a table is searched with its own embedder."""

from __future__ import annotations

import pytest

from providers.embedders import MINILM_FINGERPRINT, HashingEmbedder, query_embedder
from schemas.config import EmbeddingConfig
from query.search import where_clause


def test_where_dict_becomes_sql():
    clause = where_clause({"doc_type": "guide", "tags": ["a", "b"], "grade": 5, "source": "it's"})
    assert clause == ("doc_type IN ('guide') AND (array_has(tags, 'a') OR array_has(tags, 'b')) AND "
                      "(extra LIKE '%\"grade\": 5%') AND source IN ('it''s')")


def test_raw_sql_and_none_pass_through():
    assert where_clause("language = 'en'") == "language = 'en'"
    assert where_clause(None) is None


def test_embedder_is_rebuilt_from_table_fingerprint():
    cfg = EmbeddingConfig()
    assert isinstance(query_embedder("hashing-v1:dim=16", cfg), HashingEmbedder)
    assert query_embedder(MINILM_FINGERPRINT, cfg).fingerprint == MINILM_FINGERPRINT
    with pytest.raises(ValueError, match="no embedder matches"):
        query_embedder("other-model:dim=768", cfg)


def test_hashing_vectors_are_normalised_and_deterministic():
    emb = HashingEmbedder(dim=32)
    a, b = emb.embed(["Tide tables for the harbour", "Tide tables for the harbour"])
    assert (a == b).all() and abs(float((a * a).sum()) - 1.0) < 1e-5
