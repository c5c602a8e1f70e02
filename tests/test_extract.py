"""Extraction with unstructured on real files: structure, pages, encryption, bad input."""

from __future__ import annotations

import shutil

import pytest

from runtime.extraction import close_pools, shared_pool
from schemas.config import ExtractionConfig
from schemas.errors import ExtractionError
from tasks.clean import clean_html, decode_text
from tasks.extract import (
    SpacyModelMissingError,
    extract_document,
    extract_isolated,
    partition_elements,
    partitioners_ready,
    require_spacy_model,
    split_front_matter,
)
from tests.conftest import SAMPLE

CFG = ExtractionConfig()


def _kinds(doc: str) -> list[tuple[str, int | None, str]]:
    result = extract_document("d", str(SAMPLE / doc), CFG)
    return [(e["kind"], e["heading_level"], e["text"]) for e in result.elements]


def test_markdown_is_kept_as_written_without_front_matter():
    result = extract_document("d", str(SAMPLE / "guides/boat-maintenance.md"), CFG)
    assert result.title == "Boat maintenance guide"
    (element,) = result.elements
    assert element["kind"] == "markdown"
    assert element["text"].startswith("# Boat maintenance guide")
    assert "```bash\n# log a completed winterization" in element["text"]
    assert "tags: [maintenance" not in element["text"]


def test_html_titles_become_headings_and_tables_survive():
    kinds = _kinds("policies/safety-policy.html")
    assert ("heading", 1, "Safety policy") in kinds and ("heading", 2, "Wind limits") in kinds
    table = next(t for k, _, t in kinds if k == "table")
    assert "Laser dinghies | 20 knots | 25 knots" in table
    assert any(k == "list" and t.startswith("- Check the inflation") for k, _, t in kinds)
    assert not any("Home" in t for _, _, t in kinds), "navigation is dropped"


def test_docx_headings_tables_and_lists():
    kinds = _kinds("handbook/membership-handbook.docx")
    assert ("heading", 1, "Membership handbook") in kinds and ("heading", 2, "Volunteer duties") in kinds
    assert any(k == "table" and "Junior (under 18) | 90 euros | no" in t for k, _, t in kinds)
    assert any(k == "list" for k, _, _ in kinds)


@pytest.mark.parametrize("doc", ["policies/safety-policy.html", "handbook/membership-handbook.docx"])
def test_unstructured_detects_no_language_inlet_would_not_read(doc):
    # Its langdetect pass over each document only fills metadata.languages (~13% of an HTML page's partition CPU).
    data = (SAMPLE / doc).read_bytes()
    kind = "." + doc.rsplit(".", 1)[1]
    text = decode_text(data) if kind == ".html" else None
    elements = partition_elements(kind, data, text, CFG)
    assert elements and all(e.metadata.languages is None for e in elements)


def test_pdf_with_empty_user_password_opens_with_page_numbers():
    result = extract_document("d", str(SAMPLE / "reports/regatta-report-2025.pdf"), CFG)
    pages = {e["page"] for e in result.elements}
    assert pages == {1, 2}
    assert any(e["page"] == 2 and "surplus of 1,530 euros" in e["text"] for e in result.elements)


def test_text_file_is_partitioned():
    result = extract_document("d", str(SAMPLE / "harbour-faq.txt"), CFG)
    assert any("numbered space" in e["text"] for e in result.elements)


def test_real_encrypted_report_with_empty_password_opens(shared_corpora):
    folder = shared_corpora / "pdf" / "docugami-kg-rag" / "ntsb-aviation-incident-accident-reports"
    result = extract_document("d", str(folder / "20080102X00002.pdf"), CFG)
    assert len(result.elements) > 10 and max(e["page"] for e in result.elements) == 3


@pytest.mark.parametrize(("rel", "reason"), [
    ("pdf_encrypted/pdfminer__aes-256.pdf", "encrypted"),
    ("pdf_truncated/truncated25pct__2023_Q1_NVDA.pdf", "corrupt"),
    ("unsupported_format/unstructured__fake.doc", "unsupported"),
    ("wrong_extension/renamed__word_sample.docx.pdf", None),  # sniffed as DOCX: extracts fine
])
def test_bad_files_raise_reasoned_errors(shared_corpora, rel, reason):
    path = shared_corpora / "bad" / rel
    if reason is None:
        assert extract_document("d", str(path), CFG).elements
        return
    with pytest.raises(ExtractionError) as err:
        extract_document("d", str(path), CFG)
    assert err.value.reason == reason and err.value.message


def test_strict_open_xml_word_files_are_unsupported_not_corrupt(shared_corpora):
    with pytest.raises(ExtractionError) as err:
        extract_document("d", str(shared_corpora / "docx" / "docling" / "Strict.docx"), CFG)
    assert err.value.reason == "unsupported" and "Strict Open XML" in err.value.message


SCANNED = "pdf_no_text_layer/ocrmypdf__francais.pdf"  # a scanned page of French text


@pytest.mark.skipif(shutil.which("tesseract") is None or shutil.which("pdftoppm") is None,
                    reason="tesseract and poppler are not installed (.ci/run installs them)")
def test_scanned_pdf_is_read_with_ocr_when_enabled(shared_corpora):
    with pytest.raises(ExtractionError, match="OCR is off"):
        extract_document("d", str(shared_corpora / "bad" / SCANNED), CFG)
    result = extract_document("d", str(shared_corpora / "bad" / SCANNED), ExtractionConfig(ocr=True))
    assert "vieux whisky au juge blond" in " ".join(e["text"] for e in result.elements)
    assert {e["page"] for e in result.elements} == {1}


@pytest.mark.skipif(shutil.which("tesseract") is None or shutil.which("pdftoppm") is None,
                    reason="tesseract and poppler are not installed (.ci/run installs them)")
def test_ocr_that_fails_quarantines_the_document_and_says_why(shared_corpora):
    # Debian's tesseract-ocr brings the English pack only: Japanese cannot load.
    with pytest.raises(ExtractionError, match="OCR failed") as err:
        extract_document("d", str(shared_corpora / "bad" / SCANNED), ExtractionConfig(ocr=True, ocr_languages=("jpn",)))
    assert err.value.reason == "no_text"


def test_ocr_without_tesseract_says_what_to_install(shared_corpora, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ExtractionError, match="tesseract and pdftoppm is not installed") as err:
        extract_document("d", str(shared_corpora / "bad" / SCANNED), ExtractionConfig(ocr=True))
    assert err.value.reason == "no_text"


def test_missing_file_is_unreadable(tmp_path):
    with pytest.raises(ExtractionError, match="unreadable"):
        extract_document("d", str(tmp_path / "gone.md"), CFG)


def test_oversized_file_is_quarantined_unread(tmp_path):
    big = tmp_path / "big.txt"
    big.write_text("x" * 2048)
    with pytest.raises(ExtractionError, match="too_large"):
        extract_document("d", str(big), ExtractionConfig(max_file_mb=0.001))


def test_non_utf8_text_is_decoded_by_detection():
    text = "Überseehafen: Schiffe müssen die Gebühren vor der Abfahrt bezahlen, sagt die Behörde."
    assert decode_text(text.encode("cp1252")) == text
    assert decode_text(b"\xef\xbb\xbfa\r\nb") == "a\nb"
    # Both are valid UTF-8 byte for byte, and both would be read wrongly as UTF-8.
    english = "This is a test document to use for unit tests. It has several sentences in it."
    assert decode_text(english.encode("utf-16-be")) == english, "UTF-16 without a BOM"
    korean = "한국어 텍스트는 이렇게 인코딩됩니다. 한국어 텍스트는 이렇게 인코딩됩니다."
    assert decode_text(korean.encode("iso-2022-kr")) == korean


def test_binary_content_is_unsupported_or_undecodable(tmp_path):
    blob = bytes(range(256)) * 64
    (tmp_path / "data.weird").write_bytes(blob)
    (tmp_path / "notes.txt").write_bytes(blob)
    with pytest.raises(ExtractionError) as unknown:
        extract_document("d", str(tmp_path / "data.weird"), CFG)
    with pytest.raises(ExtractionError) as named_text:
        extract_document("d", str(tmp_path / "notes.txt"), CFG)
    assert (unknown.value.reason, named_text.value.reason) == ("unsupported", "decode_error")


def test_html_title_falls_back_from_heading_to_title_element_to_file_name(tmp_path):
    pages = {"h.html": "<html><head><title>T</title></head><body><h1>Heading</h1><p>Body text here.</p></body></html>",
             "t.html": "<html><head><title>Only &amp; title</title></head><body><p>Body text here.</p></body></html>",
             "name-only.html": "<html><body><p>Body text here.</p></body></html>"}
    for name, html in pages.items():
        (tmp_path / name).write_text(html)
    titles = [extract_document("d", str(tmp_path / n), CFG).title for n in pages]
    assert titles == ["Heading", "Only & title", "name-only"]


def test_a_heading_too_long_to_be_one_is_not_the_document_title(tmp_path):
    # Every chunk row carries its document's title: a misread 400-character "heading" would ride in all of them.
    long = "Long " * 80
    (tmp_path / "h.html").write_text(f"<html><body><h1>{long}</h1><p>Body text here.</p><h2>Tides</h2>"
                                     "<p>High water is at noon.</p></body></html>")
    (tmp_path / "m.md").write_text(f"# {long}\n\nBody text here.\n\n## Tides\n\nHigh water is at noon.\n")
    (tmp_path / "only.md").write_text(f"# {long}\n\nBody text here.\n")
    titles = [extract_document("d", str(tmp_path / n), CFG).title for n in ("h.html", "m.md", "only.md")]
    assert titles == ["Tides", "Tides", "only"]


def test_navigation_and_page_furniture_are_dropped():
    html = ("<html><body><a href='#c'>Skip to content</a><header><a href='/'>Site</a></header>"
            "<nav><a>Home</a><a>Docs</a></nav><div id='c'><h1>Tides</h1><p>High water is at noon.</p>"
            "<button>Copy</button></div><div class='sidebar'>Related: moorings</div>"
            "<footer>© Harbour club</footer></body></html>")
    from unstructured.partition.html import partition_html

    texts = [e.text for e in partition_html(text=clean_html(html))]
    assert texts == ["Tides", "High water is at noon."]


def test_front_matter_split():
    meta, body = split_front_matter("---\ntitle: T\ntags: [a]\n---\n# H\n")
    assert meta == {"title": "T", "tags": ["a"]} and body == "# H\n"
    assert split_front_matter("---\n: [bad\n---\nx")[0] == {}


def test_without_the_spacy_model_every_document_fails_alike_saying_how_to_fix_it(monkeypatch):
    # A worker started without en_core_web_sm keeps that as its broken state: each document gets the same
    # error, so the run's systemic-failure breaker names it. Markdown needs no model and is still read.
    import spacy.util

    html = str(SAMPLE / "policies/safety-policy.html")
    monkeypatch.setattr(spacy.util, "is_package", lambda name: name != "en_core_web_sm")
    require_spacy_model.cache_clear()
    partitioners_ready.cache_clear()
    try:
        with pytest.raises(SpacyModelMissingError, match="make setup"):
            extract_document("d", html, CFG)
        assert extract_document("m", str(SAMPLE / "guides/boat-maintenance.md"), CFG).elements
        partitioners_ready()  # what a new extraction worker runs first
        failed = extract_isolated("d", html, CFG, in_worker=True)
        assert (failed.reason, failed.error_type) == ("error", "SpacyModelMissingError")
        assert "en_core_web_sm is not installed" in failed.message and "`make setup`" in failed.message
    finally:
        require_spacy_model.cache_clear()
        partitioners_ready.cache_clear()
        monkeypatch.undo()
    assert extract_isolated("d", html, CFG, in_worker=True).elements, "found again once installed"


@pytest.mark.parametrize(("name", "content"), [
    ("dots.md", "# ...\n\n---\n\n* * *\n"),
    ("ellipsis.html", "<html>\n  <body>\n    <![if !supportLists]>...<![endif]>\n  </body>\n</html>\n"),
])
def test_text_without_a_letter_or_digit_is_quarantined_as_empty(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ExtractionError, match="no letter or digit") as caught:
        extract_document("d", str(path), CFG)
    assert caught.value.reason == "empty"


@pytest.mark.slow
def test_extraction_workers_outlive_a_run_and_are_replaced_for_another_config():
    # Workers take seconds to import the partitioners: later runs in the same process reuse them.
    report = str(SAMPLE / "reports" / "regatta-report-2025.pdf")
    try:
        pool = shared_pool(ExtractionConfig(), extract_isolated, partitioners_ready)
        first = pool.result(pool.submit("r", report))
        assert shared_pool(ExtractionConfig(), extract_isolated, partitioners_ready) is pool, "the next run gets the same workers"
        assert pool.result(pool.submit("r", report)).elements == first.elements
        other = shared_pool(ExtractionConfig(timeout_s=60), extract_isolated, partitioners_ready)
        assert other is not pool and not pool.is_running(), "a pool for another config stops the old one"
        assert other.result(other.submit("r", report)).elements == first.elements
        assert other._pool.schedule(_worker_tags).result() == [
            ("The", "DT"), ("club", "NN"), ("provides", "VBZ"), ("life", "NN"), ("jackets", "NNS"), (".", ".")], \
            "the workers tag with spaCy's en_core_web_sm"
    finally:
        close_pools()


def _worker_tags() -> list[tuple[str, str]]:
    """Run in an extraction worker: unstructured's part-of-speech tags for a short line."""
    from unstructured.nlp.tokenize import pos_tag

    return pos_tag("The club provides life jackets.")


def test_only_documents_a_worker_must_read_are_counted_for_starting_the_workers_early(tmp_path):
    import pyarrow as pa

    from schemas.arrow import DOCUMENTS_SCHEMA
    from tasks.extract import worker_documents

    (tmp_path / "a.md").write_text("# A\n\ntext\n")
    for name in ("b.pdf", "c.pdf", "d.pdf"):
        (tmp_path / name).write_bytes(b"%PDF-1.4")
    rows = [("a", "a.md", "new", 10), ("b", "b.pdf", "changed", 10), ("c", "c.pdf", "unchanged", 10),
            ("d", "d.pdf", "new", 2 * 1024 * 1024)]
    documents = pa.Table.from_pylist([{"doc_id": d, "path": str(tmp_path / p), "change": c, "size": n,
                                       "content_hash": f"h-{d}"} for d, p, c, n in rows], schema=DOCUMENTS_SCHEMA)
    # Markdown is read in the run's process, an unchanged file not at all, one over max_file_mb is quarantined unread.
    assert worker_documents(documents, ExtractionConfig(max_file_mb=1)) == [{"doc_id": "b", "content_hash": "h-b"}]


@pytest.mark.slow
@pytest.mark.parametrize(("first", "inherited"), [("extraction", True), ("then-cpu-pool", True),
                                                  ("cpu-pool-started", False)])
def test_a_worker_replacing_one_killed_at_its_time_limit_starts_with_the_partitioners_the_forkserver_loaded(
        first, inherited):
    """The forkserver loads the partitioners once when the extraction pool asks before it starts: no worker, first or
    replacement, imports them, whichever pool was made first. One already started light (a CPU pool's worker ran)
    is used as it is: each extraction worker then loads them itself.
    """
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT

    out = subprocess.run([sys.executable, "-m", "tests.extraction_probe", first], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    first_worker, stalled, after = (json.loads(line) for line in out.stdout.splitlines())
    assert stalled == {"stalled": "timeout"} and after["pid"] != first_worker["pid"], "the stalled worker was replaced"
    assert first_worker["loaded"] and after["loaded"]
    assert first_worker["inherited"] is after["inherited"] is inherited
