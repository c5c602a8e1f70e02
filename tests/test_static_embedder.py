"""The static embedder: a model2vec model distilled offline from the bundled MiniLM, used for ingest and queries."""

from __future__ import annotations

import numpy as np
import pytest

from flows.ingest import ingest
from providers.embedders import (
    STATIC_DIM,
    STATIC_PREFIX,
    embedder_spec,
    make_embedder,
    static_model_dir,
)
from query import search
from schemas.config import EmbeddingConfig


def test_the_static_model_is_distilled_from_minilm_and_embeds_by_meaning():
    cfg = EmbeddingConfig(kind="static")
    spec = embedder_spec(cfg)  # distils it on first use on this machine (~40 s), then reads it from disk
    assert spec.dim == STATIC_DIM and spec.fingerprint.startswith(STATIC_PREFIX)
    assert (static_model_dir() / "model.safetensors").is_file()
    embedder = make_embedder(cfg)
    vectors = embedder.embed(["How do I winterize the outboard engine?", "Storing an outboard motor for winter",
                              "The regatta results were announced at noon"])
    assert vectors.shape == (3, STATIC_DIM) and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    related, unrelated = float(vectors[0] @ vectors[1]), float(vectors[0] @ vectors[2])
    assert related > unrelated + 0.1, (related, unrelated)
    assert embedder.truncated(["word " * 5000]) == [False], "a static model reads every word piece"


@pytest.mark.usefixtures("prefect_harness")
def test_a_run_with_the_static_embedder_answers_vector_searches(corpus, write_config):
    config = write_config(corpus, embedding={"kind": "static", "dim": None})
    summary = ingest(config_path=str(config))
    assert summary["docs_new"] == 5 and summary["texts_embedded"] > 0
    hit = search("gelcoat hardener mixing ratio", k=1, mode="vector", config=config)[0]
    assert hit.doc_id == "sample:guides/boat-maintenance.md"
