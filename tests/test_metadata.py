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
from tasks.extract import extract_document
from tasks.metadata import _prose, detect_language

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


def test_the_unpacked_language_model_scores_exactly_as_py3langids_own_loader(tmp_path, monkeypatch):
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    from tasks import metadata

    monkeypatch.setenv("INLET_MODEL_DIR", str(tmp_path))
    monkeypatch.setattr(metadata, "_MODEL", None)  # loaded afresh here, put back afterwards
    ours = metadata.language_identifier()
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 1, "unpacked once into the model folder"
    assert not [p for p in tmp_path.iterdir() if ".partial" in p.name or ".raw" in p.name], "nothing half-written left"
    folder = next(p for p in tmp_path.iterdir() if p.is_dir())
    (folder / "ptc.npy").rename(tmp_path / "aside.npy")  # a folder someone emptied by hand: named, not a KeyError
    with pytest.raises(RuntimeError, match=r"lacks ptc; remove the folder"):
        metadata._model_arrays(folder)
    (tmp_path / "aside.npy").rename(folder / "ptc.npy")
    reference = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    for text in ("The harbour master keeps the tide tables in the office by the quay.",
                 "Der Hafenmeister führt die Gezeitentabellen im Büro am Kai.",
                 "Le capitaine du port garde les tables des marées au bureau.",
                 "El capitán del puerto guarda las tablas de mareas en la oficina."):
        assert ours.classify(text) == reference.classify(text)


def test_the_numpy_automaton_scores_real_pages_exactly_as_py3langids_own_walk(shared_corpora):
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    from tasks import metadata

    ours = metadata.language_identifier()
    metadata.page_in_language_model()  # as the flow's warm-up does: it reads the arrays, changes nothing
    reference = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    pages = sorted((shared_corpora / "markdown").rglob("*.md"))[:300] + sorted((shared_corpora / "html").rglob("*.htm*"))
    texts = [t for p in pages for text in [p.read_text(encoding="utf-8", errors="replace")]
             for t in (_prose(text, 2000)[:2000], text[:40], text[:4])]
    # Shorter than the automaton's depth, featureless, control bytes, other scripts.
    texts += ["", "a", "ab", "!!!! ???? ....", "12345", "\x00\x01", "日本語のテキストです", "Ελληνικά κείμενα εδώ"]
    assert len(texts) > 900
    for text in texts:
        assert ours.classify(text) == reference.classify(text), text[:80]  # language and confidence, to the bit


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
