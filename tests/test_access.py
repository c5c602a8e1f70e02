"""A document's own access level and expiry: honoured in every search path, fail closed, re-stamped without re-embedding."""

from __future__ import annotations

import io
import zipfile
from datetime import UTC, date, datetime
from pathlib import Path

import docx
import lancedb
import pytest
from typer.testing import CliRunner

from flows.ingest import ingest
from inlet.cli import app
from query import search
from schemas.config import ExtractionConfig, load_config
from schemas.errors import ExtractionError
from tasks.access import declared_access, effective_access, field_name
from tasks.extract import extract_bytes, extract_document
from tasks.metadata import docx_metadata, front_matter_metadata, html_metadata

MODES = ("vector", "fulltext", "hybrid")
SECRET = "The harbour vault combination is kept by the treasurer and changes every spring equinox."
OPEN = "Members may borrow the club dinghies on weekends after a short safety briefing at the boathouse."


def _markdown(body: str, **front: object) -> str:
    lines = [f"{k}: {v}" for k, v in front.items()]
    return ("---\n" + "\n".join(lines) + "\n---\n" if lines else "") + f"# Note\n\n{body}\n"


def _docx(text: str, *, category: str | None = None, custom: dict[str, str] | None = None) -> bytes:
    """A real DOCX from python-docx; custom properties added as Word writes them (docProps/custom.xml)."""
    document = docx.Document()
    document.add_heading("Note", level=1)
    document.add_paragraph(text)
    if category is not None:
        document.core_properties.category = category
    buffer = io.BytesIO()
    document.save(buffer)
    if not custom:
        return buffer.getvalue()
    props = "".join(
        f'<property fmtid="{{D5CDD505-2E9C-101B-9397-08002B2CF9AE}}" pid="{i}" name="{name}"><vt:lpwstr>{value}'
        "</vt:lpwstr></property>" for i, (name, value) in enumerate(custom.items(), start=2))
    custom_xml = ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?><Properties xmlns="http://schemas.'
                  'openxmlformats.org/officeDocument/2006/custom-properties" xmlns:vt="http://schemas.openxmlformats'
                  f'.org/officeDocument/2006/docPropsVTypes">{props}</Properties>')
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename == "[Content_Types].xml":
                data = data.replace(b"</Types>", b'<Override PartName="/docProps/custom.xml" ContentType="application/'
                                    b'vnd.openxmlformats-officedocument.custom-properties+xml"/></Types>')
            elif item.filename == "_rels/.rels":
                data = data.replace(b"</Relationships>", b'<Relationship Id="rIdCustom" Type="http://schemas.'
                                    b'openxmlformats.org/officeDocument/2006/relationships/custom-properties" '
                                    b'Target="docProps/custom.xml"/></Relationships>')
            dst.writestr(item, data)
        dst.writestr("docProps/custom.xml", custom_xml)
    return out.getvalue()


def _ids(config: Path, text: str, clearance: str, **kwargs: object) -> dict[str, set[str]]:
    """The doc ids each search mode returns for text."""
    return {mode: {h.doc_id for h in search(text, k=20, mode=mode, clearance=clearance, config=config, **kwargs)}
            for mode in MODES}


def _chunks(config: Path) -> dict[str, list[dict]]:
    table = lancedb.connect(str(load_config(config).store.uri)).open_table("chunks")
    out: dict[str, list[dict]] = {}
    for row in table.to_arrow().select(["doc_id", "access_level", "expires_at", "text"]).to_pylist():
        out.setdefault(row["doc_id"], []).append(row)
    return out


# --- what documents declare ------------------------------------------------------------------------


def test_front_matter_names_are_matched_ignoring_case_dashes_and_camel_case():
    assert [field_name(n) for n in ("accessLevel", "Access-Level", "access_level", "expiryDate")] == [
        "access_level", "access_level", "access_level", "expiry_date"]
    declared = front_matter_metadata({"Access-Level": "Confidential", "expiration": date(2030, 1, 1),
                                      "expiryDate": "2029-06-01T12:00:00+02:00", "title": "x"})
    assert declared["declared_level"] == "confidential"
    assert declared["declared_expiry"] == datetime(2029, 6, 1, 10, tzinfo=UTC), "the earlier, in UTC"
    assert front_matter_metadata({"expires": "never"}) == {}, "'never' declares no expiry"
    assert "declared_level" not in front_matter_metadata({"title": "no declaration"})


@pytest.mark.parametrize(("front", "named"), [
    ({"access_level": "secret"}, "'access_level': 'secret' is not an access level"),
    ({"access_level": None}, "'access_level': None is not an access level"),
    ({"accessLevel": ["internal"]}, "'accessLevel': ['internal'] is not an access level"),
    ({"expires_at": "next tuesday"}, "'expires_at': 'next tuesday' is not a date or time"),
    ({"expiration": 2025}, "'expiration': 2025 is not a date or time"),
])
def test_a_declaration_that_is_not_valid_fails_closed_naming_field_and_value(front, named):
    with pytest.raises(ExtractionError) as caught:
        front_matter_metadata(front)
    assert caught.value.reason == "invalid" and named in caught.value.message


def test_html_meta_tags_in_any_order_and_place_count_and_http_equiv_expires_does_not():
    page = ('<html lang="en"><head><meta http-equiv="expires" content="0">'
            "<meta content='internal' name='Access-Level'>"
            '<meta name="expires" content="Sun, 31 Jan 2027 12:00:00 GMT"></head>'
            '<body><meta name="access_level" content="restricted"><p>text</p></body></html>')
    meta = html_metadata(page)
    assert meta["declared_level"] == "restricted", "two declarations: the stricter wins"
    assert meta["declared_expiry"] == datetime(2027, 1, 31, 12, tzinfo=UTC)
    assert html_metadata('<html><head><meta http-equiv="Expires" content="0"></head></html>') == {}
    with pytest.raises(ExtractionError, match=r"HTML <meta> 'expires': '0' is not a date"):
        html_metadata('<html><head><meta name="expires" content="0"></head></html>')


def test_docx_custom_properties_and_a_category_that_names_a_level_declare_others_do_not():
    assert docx_metadata(_docx(OPEN, custom={"access_level": "restricted", "expires": "2031-02-03"})) == {
        "declared_level": "restricted", "declared_expiry": datetime(2031, 2, 3, tzinfo=UTC)}
    assert docx_metadata(_docx(OPEN, category="Confidential")) == {"declared_level": "confidential"}
    assert docx_metadata(_docx(OPEN, category="Quarterly report")) == {}, "free-text Category is no declaration"
    with pytest.raises(ExtractionError, match="DOCX custom property 'Access Level': 'top' is not an access level"):
        docx_metadata(_docx(OPEN, custom={"Access Level": "top"}))


@pytest.mark.slow
def test_real_documents_with_other_custom_properties_are_not_declarations(shared_corpora):
    # Word files written by others: custom dates, strings, sensitivity labels, SharePoint fields.
    names = ("testWORD_custom_props.docx", "testWORD_docSecurity.docx", "testWORD_null_style.docx",
             "testWORD_various.docx")
    for name in names:
        result = extract_document("d", str(shared_corpora / "docx" / "tika" / name), ExtractionConfig())
        assert "declared_level" not in result.metadata and "declared_expiry" not in result.metadata, name


def test_hugo_expiry_date_in_real_front_matter_is_read(shared_corpora):
    page = shared_corpora / "markdown" / "opentelemetry-io" / "announcements" / "kubecon-china.md"
    if not page.exists():
        pytest.skip("the OpenTelemetry announcements are not in this copy of the corpora")
    result = extract_bytes("d", page.name, page.read_bytes(), ExtractionConfig())
    assert result.metadata["declared_expiry"] == datetime(2025, 6, 11, tzinfo=UTC)


def test_the_source_level_is_a_floor_and_the_earlier_expiry_wins():
    soon, later = datetime(2027, 1, 1, tzinfo=UTC), datetime(2028, 1, 1, tzinfo=UTC)
    assert effective_access("restricted", None, {"declared_level": "public"})["access_level"] == "restricted"
    assert effective_access("public", None, {"declared_level": "internal"})["access_level"] == "internal"
    assert effective_access("public", soon, {"declared_expiry": later})["expires_at"] == soon
    assert effective_access("public", later, {"declared_expiry": soon})["expires_at"] == soon
    assert effective_access("internal", soon, {}) == {"access_level": None, "expires_at": None, "declared_level": None}
    assert declared_access([("unrelated", "x")], "front matter") == {}


# --- the real flow and LanceDB -----------------------------------------------------------------------


@pytest.fixture
def two_sources(tmp_path: Path, write_config) -> tuple[Path, Path, Path]:
    """A public source and a restricted one, each with documents that declare their own access."""
    public, restricted = tmp_path / "public", tmp_path / "restricted"
    public.mkdir()
    restricted.mkdir()
    (public / "vault.md").write_text(_markdown(SECRET, access_level="confidential"))
    (public / "dinghies.md").write_text(_markdown(OPEN))
    (public / "regatta.md").write_text(_markdown("The spring regatta results were posted on the noticeboard by "
                                                 "the race officer.", expires_at="2020-01-01"))
    (public / "typo.md").write_text(_markdown("The winter mooring rates rise by four percent next season.",
                                              access_level="confidentail"))
    (public / "baddate.md").write_text(_markdown("The slipway resurfacing is scheduled once the tides allow.",
                                                 expiration="soonish"))
    (public / "page.html").write_text('<html><head><title>Keys</title><meta name="access-level" '
                                      'content="confidential"></head><body><h1>Keys</h1><p>The spare boathouse '
                                      "keys hang behind the galley door in a red tin.</p></body></html>")
    (public / "minutes.docx").write_bytes(_docx("The committee minutes record the harbour lease negotiation "
                                                "with the port authority.", custom={"access_level": "internal"}))
    (restricted / "lower.md").write_text(_markdown("The insurance claim for the damaged pontoon is still open "
                                                   "with the underwriter.", access_level="public"))
    config = write_config(public, sources=[
        {"name": "club", "path": str(public), "metadata": {"access_level": "public", "doc_type": "club-docs"}},
        {"name": "board", "path": str(restricted), "metadata": {"access_level": "restricted"}},
    ])
    return config, public, restricted


@pytest.mark.usefixtures("prefect_harness")
def test_a_confidential_declaration_in_a_public_source_never_reaches_lower_clearances(two_sources):
    config, _, _ = two_sources
    summary = ingest(config_path=str(config))
    vault = "club:vault.md"

    for clearance in ("public", "internal", "restricted"):
        assert all(vault not in found for found in _ids(config, SECRET, clearance).values()), clearance
        fell_back = _ids(config, SECRET, clearance, where={"doc_type": "no-such-type"}, fallback=True)
        assert all(vault not in found for found in fell_back.values()), f"fallback, {clearance}"
        pinned = _ids(config, SECRET, clearance, as_of=summary["run_id"])
        assert all(vault not in found for found in pinned.values()), f"as_of, {clearance}"
    found = _ids(config, SECRET, "confidential")
    assert all(vault in ids for ids in found.values()), "the test can fail: the chunk is there for its readers"

    chunks = _chunks(config)
    assert {c["access_level"] for c in chunks[vault]} == {"confidential"}
    assert {c["access_level"] for c in chunks["club:page.html"]} == {"confidential"}, "HTML <meta>"
    assert {c["access_level"] for c in chunks["club:minutes.docx"]} == {"internal"}, "DOCX custom property"
    assert {c["access_level"] for c in chunks["club:dinghies.md"]} == {"public"}
    for doc, text in (("club:page.html", "spare boathouse keys galley door red tin"),
                      ("club:minutes.docx", "committee minutes harbour lease port authority")):
        assert all(doc not in ids for ids in _ids(config, text, "public").values()), doc
    assert summary["docs_access_raised"] == 3, "vault.md, page.html, minutes.docx"


@pytest.mark.usefixtures("prefect_harness")
def test_a_lower_declaration_is_ignored_with_a_notice_and_the_source_level_stands(two_sources):
    config, _, _ = two_sources
    summary = ingest(config_path=str(config))
    assert {c["access_level"] for c in _chunks(config)["board:lower.md"]} == {"restricted"}
    text = "insurance claim damaged pontoon underwriter"
    assert all("board:lower.md" not in ids for ids in _ids(config, text, "internal").values())
    assert all("board:lower.md" in ids for ids in _ids(config, text, "restricted").values())
    assert [n for n in summary["notices"] if "board:lower.md" in n] == [
        "board:lower.md declares access level public, below its source's restricted: ignored, it is indexed as "
        "restricted"]


@pytest.mark.usefixtures("prefect_harness")
def test_unknown_levels_and_bad_dates_are_quarantined_as_invalid_and_expired_documents_are_never_served(two_sources):
    config, _, _ = two_sources
    summary = ingest(config_path=str(config))
    quarantined = {q["doc_id"]: q for q in summary["quarantined"]}
    assert quarantined["club:typo.md"]["reason"] == "invalid"
    assert "'access_level': 'confidentail' is not an access level" in quarantined["club:typo.md"]["message"]
    assert quarantined["club:baddate.md"]["reason"] == "invalid"
    assert "'expiration': 'soonish' is not a date or time" in quarantined["club:baddate.md"]["message"]
    chunks = _chunks(config)
    assert "club:typo.md" not in chunks and "club:baddate.md" not in chunks, "not indexed at the source's level"

    regatta = chunks["club:regatta.md"]
    assert {c["expires_at"] for c in regatta} == {datetime(2020, 1, 1, tzinfo=UTC)}
    text = "spring regatta results noticeboard race officer"
    for clearance in ("public", "confidential"):
        assert all("club:regatta.md" not in ids for ids in _ids(config, text, clearance).values()), clearance


@pytest.mark.usefixtures("prefect_harness")
def test_raising_then_lowering_a_level_in_place_restamps_chunks_without_model_calls(two_sources):
    config, public, _ = two_sources
    ingest(config_path=str(config))
    dinghies = public / "dinghies.md"
    text = "borrow club dinghies weekends safety briefing boathouse"
    assert all("club:dinghies.md" in ids for ids in _ids(config, text, "public").values())

    dinghies.write_text(_markdown(OPEN, access_level="confidential", expires_at="2999-12-31"))
    raised = ingest(config_path=str(config))
    assert raised["docs_changed"] == 1 and raised["texts_embedded"] == 0 and raised["texts_enriched"] == 0
    assert raised["chunks_reused"] == raised["chunks_written"] > 0, "the same chunks, re-stamped"
    assert {(c["access_level"], c["expires_at"]) for c in _chunks(config)["club:dinghies.md"]} == {
        ("confidential", datetime(2999, 12, 31, tzinfo=UTC))}
    for clearance in ("public", "internal", "restricted"):
        assert all("club:dinghies.md" not in ids for ids in _ids(config, text, clearance).values()), clearance

    dinghies.write_text(_markdown(OPEN, access_level="internal"))
    lowered = ingest(config_path=str(config))
    assert lowered["docs_changed"] == 1 and lowered["texts_embedded"] == 0 and lowered["texts_enriched"] == 0
    assert {(c["access_level"], c["expires_at"]) for c in _chunks(config)["club:dinghies.md"]} == {("internal", None)}
    assert all("club:dinghies.md" not in ids for ids in _ids(config, text, "public").values())
    assert all("club:dinghies.md" in ids for ids in _ids(config, text, "internal").values())


@pytest.mark.usefixtures("prefect_harness")
def test_an_indexed_document_that_turns_invalid_is_withdrawn_until_fixed(two_sources):
    config, public, _ = two_sources
    ingest(config_path=str(config))
    text = "borrow club dinghies weekends safety briefing boathouse"
    (public / "dinghies.md").write_text(_markdown(OPEN, access_level="top-secret"))
    broken = ingest(config_path=str(config))
    assert [q["reason"] for q in broken["quarantined"] if q["doc_id"] == "club:dinghies.md"] == ["invalid"]
    assert "club:dinghies.md" not in _chunks(config), "nobody can say who may read its last version"
    assert all("club:dinghies.md" not in ids for ids in _ids(config, text, "confidential").values())

    (public / "dinghies.md").write_text(_markdown(OPEN, access_level="internal"))
    fixed = ingest(config_path=str(config))
    assert fixed["docs_changed"] == 1 and fixed["docs_quarantined"] == 0
    assert all("club:dinghies.md" in ids for ids in _ids(config, text, "internal").values())


@pytest.mark.usefixtures("prefect_harness")
def test_query_explain_shows_the_effective_level_and_expiry(two_sources):
    config, public, _ = two_sources
    (public / "dinghies.md").write_text(_markdown(OPEN, access_level="internal", expires_at="2999-12-31"))
    ingest(config_path=str(config))
    out = CliRunner().invoke(app, ["query", "borrow club dinghies weekends", "--clearance", "internal",
                                   "--explain", "-k", "1", "--config", str(config)])
    assert out.exit_code == 0, out.output
    assert "doc club:dinghies.md · chunk 1/1 · access internal · expires 2999-12-31T00:00:00+00:00" in out.output
    hit = search("borrow club dinghies weekends", k=1, clearance="internal", config=config)[0]
    assert (hit.metadata["access_level"], hit.metadata["expires_at"]) == ("internal", "2999-12-31T00:00:00+00:00")


@pytest.mark.usefixtures("prefect_harness")
def test_re_enriching_stored_chunks_keeps_each_documents_own_level_and_expiry(two_sources, write_config):
    config, public, restricted = two_sources
    ingest(config_path=str(config))
    before = {d: {(c["access_level"], c["expires_at"]) for c in rows} for d, rows in _chunks(config).items()}
    config = write_config(public, sources=[
        {"name": "club", "path": str(public), "metadata": {"access_level": "public", "doc_type": "club-docs"}},
        {"name": "board", "path": str(restricted), "metadata": {"access_level": "restricted"}},
    ], enrichment={"max_keywords": 5})
    refreshed = ingest(config_path=str(config))
    assert refreshed["docs_refreshed"] == len(before) and refreshed["docs_changed"] == 0
    after = {d: {(c["access_level"], c["expires_at"]) for c in rows} for d, rows in _chunks(config).items()}
    assert after == before and after["club:vault.md"] == {("confidential", None)}


def _html(text: str, **meta: str) -> str:
    tags = "".join(f'<meta name="{name}" content="{value}">' for name, value in meta.items())
    return f"<html><head><title>Note</title>{tags}</head><body><h1>Note</h1><p>{text}</p></body></html>"


FORMATS = {
    "md": lambda text, level=None, expires=None: _markdown(text, **{k: v for k, v in (
        ("access_level", level), ("expires_at", expires)) if v}).encode(),
    "html": lambda text, level=None, expires=None: _html(text, **{k: v for k, v in (
        ("access-level", level), ("expires", expires)) if v}).encode(),
    "docx": lambda text, level=None, expires=None: _docx(text, custom={k: v for k, v in (
        ("access_level", level), ("expires_at", expires)) if v}),
}


@pytest.mark.usefixtures("prefect_harness")
def test_markdown_html_and_docx_declarations_behave_alike(tmp_path, write_config):
    corpus = tmp_path / "formats"
    corpus.mkdir()
    topics = {"md": "lighthouse keeper logbook", "html": "chandlery invoice ledger", "docx": "sailmaker repair queue"}
    for fmt, make in FORMATS.items():
        words = topics[fmt]
        (corpus / f"raised.{fmt}").write_bytes(make(f"The {words} for the raised note is audited weekly.",
                                                    level="confidential"))
        (corpus / f"expired.{fmt}").write_bytes(make(f"The {words} for the expired note was archived.",
                                                     expires="2020-01-01"))
        (corpus / f"invalid.{fmt}").write_bytes(make(f"The {words} for the invalid note is pending.", level="secret"))
    config = write_config(corpus)
    summary = ingest(config_path=str(config))
    quarantined = {q["doc_id"]: q for q in summary["quarantined"]}
    chunks = _chunks(config)
    for fmt, words in topics.items():
        assert quarantined[f"sample:invalid.{fmt}"]["reason"] == "invalid", fmt
        assert "'secret' is not an access level" in quarantined[f"sample:invalid.{fmt}"]["message"], fmt
        assert {c["access_level"] for c in chunks[f"sample:raised.{fmt}"]} == {"confidential"}, fmt
        assert {c["expires_at"] for c in chunks[f"sample:expired.{fmt}"]} == {datetime(2020, 1, 1, tzinfo=UTC)}, fmt
        for clearance in ("public", "restricted"):
            found = _ids(config, f"{words} raised note audited", clearance)
            assert all(f"sample:raised.{fmt}" not in ids for ids in found.values()), (fmt, clearance)
        found = _ids(config, f"{words} expired note archived", "confidential")
        assert all(f"sample:expired.{fmt}" not in ids for ids in found.values()), fmt
        assert all(f"sample:raised.{fmt}" in ids for ids in _ids(config, f"{words} raised note audited",
                                                                   "confidential").values()), fmt
    assert summary["docs_access_raised"] == 3
