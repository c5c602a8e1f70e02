"""Document metadata: front matter, per-path rules, page language, detected language, merged with the source's."""

from __future__ import annotations

import json
import re
import textwrap

import lancedb
import pytest

from flows.ingest import ingest
from query import search
from schemas.config import ExtractionConfig, load_config
from schemas.errors import ConfigError
from tasks import extract
from tasks.extract import Extracted, detect_inline, extract_document
from tasks.metadata import _prose, detect_language, detect_languages

FRACTIONS = textwrap.dedent("""\
    ---
    title: Adding fractions
    tags: [fractions, arithmetic]
    description: Common denominators first.
    lang: en-GB
    ---
    # Fractions

    To add two fractions, rewrite both over a common denominator and add the numerators.
    """)
CELLS = textwrap.dedent("""\
    # Die Zelle

    Jede Zelle ist von einer Membran umgeben. Im Zellkern liegt die Erbinformation, und die
    Mitochondrien liefern der Zelle die Energie, die sie zum Leben braucht.
    """)


@pytest.mark.usefixtures("prefect_harness")
def test_front_matter_path_rules_and_detected_language_reach_documents_and_chunks(tmp_path, write_config):
    corpus = tmp_path / "school"
    (corpus / "math" / "grade-5").mkdir(parents=True)
    (corpus / "biology" / "grade-7").mkdir(parents=True)
    (corpus / "math" / "grade-5" / "fractions.md").write_text(FRACTIONS)
    (corpus / "biology" / "grade-7" / "cells.md").write_text(CELLS)
    config = write_config(corpus, sources=[{
        "name": "school", "path": str(corpus), "metadata": {"tags": ["school"], "board": "north"},
        "metadata_rules": [{"path": r"^(?P<subject>[^/]+)/grade-(?P<grade>\d+)/", "set": {"doc_type": "lesson"}}],
    }])
    ingest(config_path=str(config))

    db = lancedb.connect(str(load_config(config).store.uri))
    docs = {d["doc_id"]: d for d in db.open_table("documents").to_arrow().to_pylist()}
    fractions, cells = docs["school:math/grade-5/fractions.md"], docs["school:biology/grade-7/cells.md"]
    assert fractions["title"] == "Adding fractions", "front matter title first"
    assert fractions["tags"] == ["school", "fractions", "arithmetic"], "source tags, then the document's"
    assert fractions["language"] == "en", "stated in front matter, normalised"
    assert fractions["doc_type"] == "lesson"
    assert json.loads(fractions["extra"]) == {"board": "north", "subject": "math", "grade": "5",
                                              "description": "Common denominators first."}
    assert cells["language"] == "de", "detected: neither the source nor the file states it"
    assert json.loads(cells["extra"])["subject"] == "biology" and cells["title"] == "Die Zelle"

    chunks = db.open_table("chunks").to_arrow().to_pylist()
    assert {c["language"] for c in chunks if c["doc_id"] == cells["doc_id"]} == {"de"}
    hits = search("common denominator numerators", k=5, config=config, where={"grade": "5"}, mode="fulltext")
    assert [h.doc_id for h in hits] == [fractions["doc_id"]]
    assert search("Zelle Membran", k=5, config=config, where={"tags": "arithmetic"}, mode="fulltext") == []

    # An unchanged, touched file keeps its merged metadata (the listing alone does not know it).
    (corpus / "biology" / "grade-7" / "cells.md").touch()
    again = ingest(config_path=str(config))
    assert again["docs_unchanged"] == 2
    cells_again = {d["doc_id"]: d for d in db.open_table("documents").to_arrow().to_pylist()}[cells["doc_id"]]
    assert cells_again["language"] == "de"


def test_a_rule_that_is_not_a_regular_expression_is_a_config_error(tmp_path):
    path = tmp_path / "inlet.yaml"
    path.write_text("sources:\n  - {name: s, path: ., metadata_rules: [{path: '(?P<grade>'}]}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"sources\.0\.metadata_rules\.0\.path"):
        load_config(path)


@pytest.mark.slow
def test_page_language_from_html_lang_and_from_detection(shared_corpora):
    pages = sorted((shared_corpora / "html" / "readability-test-pages").glob("*.html"))
    expected_dir = shared_corpora / "html" / "_meta" / "readability-expected-metadata"
    stated = detected = total = 0
    for page in pages:
        expected = json.loads((expected_dir / f"{page.stem}.json").read_text()).get("lang")
        if not expected:
            continue
        lang = expected.split("-")[0].lower()
        result = extract_document("d", str(page), ExtractionConfig(), detect=True)
        total += 1
        stated += (result.metadata.get("language") or result.metadata.get("detected_language")) == lang
        detected += detect_language(result.elements) == lang
    # Detection alone misses lorem-ipsum fixtures (it says Latin) and near-empty pages.
    assert total >= 70 and stated >= 0.97 * total and detected >= 0.9 * total, (total, stated, detected)


def test_the_language_model_is_loaded_once_for_all_threads():
    from concurrent.futures import ThreadPoolExecutor

    from tasks import metadata

    with ThreadPoolExecutor(4) as pool:
        models = list(pool.map(lambda _: metadata.language_identifier(), range(8)))
    assert all(model is models[0] for model in models)
    assert metadata.language_identifier() is models[0]
    assert models[0].classify(CELLS)[0] == "de"


def test_detection_reads_prose_skips_code_and_tables_and_says_none_when_unsure():
    prose = " ".join(CELLS.split("\n")[2:])  # German, without the heading
    code = "def add(a, b):\n    return a + b  # the sum of the two numbers, returned to the caller\n" * 20
    table = "| Name | Value |\n|---|---|\n| the first | one of them |\n" * 20
    assert detect_language([{"kind": "code", "text": code}, {"kind": "table", "text": table},
                            {"kind": "text", "text": prose}]) == "de"
    assert detect_language([{"kind": "markdown", "text": f"```python\n{code}```\n\n{prose}"}]) == "de"
    assert detect_language([{"kind": "text", "text": "Zelle und Membran"}]) is None, "under 40 characters"
    assert detect_language([{"kind": "code", "text": code}]) is None, "no prose at all"
    unsure = "ok ok ok ok ok ok ok ok ok ok 12 34 56 78 90 ok ok ok x y z"  # py3langid: 'hu' at ~0.08
    assert detect_language([{"kind": "text", "text": unsure}]) is None, "below 0.9"


def _rows(text: str) -> list[dict]:
    return [{"kind": "text", "text": text}]


def test_a_batch_detects_each_documents_language_as_detecting_it_alone_would():
    prose = " ".join(CELLS.split("\n")[2:])
    documents = [_rows(prose), _rows("Zelle und Membran"), _rows(FRACTIONS * 3), [], _rows("ok ok ok ok " * 6),
                 _rows("El proceso mantiene al día la base de conocimiento: cada documento que cambia se vuelve a leer, "
                       "se divide en fragmentos y se guarda otra vez.")]
    assert detect_languages(documents) == [detect_language(rows) for rows in documents] == \
        ["de", None, "en", None, None, "es"]


def test_detect_inline_sets_only_what_neither_source_nor_document_states():
    prose = " ".join(CELLS.split("\n")[2:])
    results = {i: Extracted(_rows(prose), None, i) for i in ("free", "sourced", "stated")}
    results["stated"].metadata["language"] = "fr"
    results["failed"] = extract.ExtractionError("corrupt", "unreadable")
    docs = [{"doc_id": "free", "language": None}, {"doc_id": "sourced", "language": "en"},
            {"doc_id": "stated", "language": None}, {"doc_id": "failed", "language": None}]
    detect_inline(docs, results)
    assert results["free"].metadata == {"detected_language": "de"}
    assert results["sourced"].metadata == {} and results["stated"].metadata == {"language": "fr"}
    assert isinstance(results["failed"], extract.ExtractionError)


def test_a_document_whose_detection_raises_is_quarantined_and_the_others_are_detected(monkeypatch, caplog):
    prose = " ".join(CELLS.split("\n")[2:])
    results = {"good": Extracted(_rows(prose), None, "a"), "bad": Extracted(_rows("poison " + prose), None, "b")}

    def fails_on_poison(rows: list[dict]) -> str | None:
        if rows[0]["text"].startswith("poison"):
            raise RecursionError("a sample the model could not read")
        return detect_language(rows)

    def fails_as_a_batch(documents: list[list[dict]]) -> list[str | None]:
        return [fails_on_poison(rows) for rows in documents]

    monkeypatch.setattr(extract, "detect_languages", fails_as_a_batch)
    monkeypatch.setattr(extract, "detect_language", fails_on_poison)
    detect_inline([{"doc_id": "good", "language": None}, {"doc_id": "bad", "language": None}], results)
    assert results["good"].metadata == {"detected_language": "de"}
    assert isinstance(results["bad"], extract.ExtractionError) and results["bad"].error_type == "RecursionError"
    assert "language detection failed for the batch (RecursionError" in caplog.text, "the fallback is said, not silent"


def _blanked(markdown: str) -> str:
    return re.sub(r"```.*?```", " ", markdown, flags=re.DOTALL)


def test_language_samples_begin_as_the_whole_page_blanked_would(shared_corpora):
    # Long pages are blanked only as far as the sample needs: the sample must not change.
    pages = [p.read_text(encoding="utf-8", errors="replace") for p in sorted((shared_corpora / "markdown").rglob("*.md"))]
    made = ["x" * 15990 + "``", "prose " * 3000, "intro\n```\n" + "code\n" * 5000 + "```\n" + "after " * 1000,
            "a" * 15000 + "\n```py\n" + "b" * 3000 + "\n```\n" + "c" * 5000, "`" * 20000, "word ``` " * 4000]
    for text in [*pages, *made]:
        assert _prose(text, 2000)[:2000] == _blanked(text)[:2000]
        assert len(_prose(text, 2000)) >= min(2000, len(_blanked(text)))
