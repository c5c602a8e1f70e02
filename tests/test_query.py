"""Query helpers: filters become safe SQL; a table is searched with its own embedder."""

from __future__ import annotations

import pytest

from providers.embedders import MINILM_FINGERPRINT, HashingEmbedder, query_embedder
from query.search import where_clause
from schemas.config import EmbeddingConfig


def test_where_dict_becomes_sql():
    clause = where_clause({"doc_type": "guide", "tags": ["a", "b"], "grade": 5, "source": "it's"})
    assert clause == ("doc_type IN ('guide') AND (array_has(tags, 'a') OR array_has(tags, 'b')) AND "
                      "(extra LIKE '%\"grade\": 5%') AND source IN ('it''s')")


def test_raw_sql_and_none_pass_through():
    assert where_clause("language = 'en'") == "language = 'en'"
    assert where_clause(None) is None


@pytest.mark.slow
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


def test_a_query_embedder_of_another_vector_space_is_refused():
    from query.search import check_embedder
    from schemas.errors import EmbedderMismatchError

    check_embedder("hashing-v1:dim=16", HashingEmbedder(dim=16))
    with pytest.raises(EmbedderMismatchError, match="embedded with 'hashing-v1:dim=16'.*'hashing-v1:dim=32'"):
        check_embedder("hashing-v1:dim=16", HashingEmbedder(dim=32))
    # Gemini documents and queries differ only by task type: one space.
    check_embedder("gemini:gemini-embedding-001:dim=768:task=RETRIEVAL_DOCUMENT",
                   type("E", (), {"fingerprint": "gemini:gemini-embedding-001:dim=768:task=RETRIEVAL_QUERY"})())


def test_a_version_fact_is_computed_once_while_many_readers_ask_for_it_together():
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from query.search import version_fact

    class Table:  # version_fact reads only its name
        name = "chunks"

    calls: list[int] = []
    gate = threading.Barrier(8)

    def slow(table: Table) -> int:
        calls.append(1)
        time.sleep(0.2)  # long enough for the other readers to arrive while it computes
        return 42

    def ask(_: int) -> int:
        gate.wait()
        return version_fact(Table(), "store-single-flight", 7, "tally", slow)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(8)))
    assert answers == [42] * 8
    assert len(calls) == 1, "the others waited for the one computing it"
    assert version_fact(Table(), "store-single-flight", 8, "tally", slow) == 42 and len(calls) == 2, "a new version"


def test_a_long_lived_reader_keeps_the_facts_of_the_versions_it_asked_for_last_only():
    import importlib

    from query.search import FACTS_KEPT, version_fact

    search_module = importlib.import_module("query.search")  # the package's `search` attribute is the function

    class Table:  # version_fact reads only its name
        name = "chunks"

    calls: list[int] = []

    def tally(table: Table) -> list[int]:
        calls.append(1)
        return [0] * 1000

    # A server under a live watcher meets a new version every few seconds, and keeps asking for the newest.
    for version in range(10 * FACTS_KEPT):
        version_fact(Table(), "store-bounded", version, "tally", tally)
        version_fact(Table(), "store-bounded", 0, "tally", tally)  # one old version still read (a pinned as_of)
    kept = [k for k in search_module._VERSION_FACTS if k[0] == "store-bounded"]
    assert len(kept) <= FACTS_KEPT, "old versions' facts were all kept"
    assert ("store-bounded", "chunks", 10 * FACTS_KEPT - 1, "tally") in kept, "the newest was dropped"
    assert ("store-bounded", "chunks", 0, "tally") in kept, "a version still asked for was dropped"
    assert len(calls) == 10 * FACTS_KEPT, "a kept fact was computed again"
