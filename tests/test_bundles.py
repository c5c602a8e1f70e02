"""llms-full.txt bundles: both formats, URL rules, one virtual document per page, per-page change detection."""

from __future__ import annotations

import shutil

import lancedb
import pytest

from flows.ingest import ingest
from query import search
from schemas.config import SourceConfig, load_config
from tasks.bundle import keep_member, parse_bundle
from tasks.clean import decode_text
from tasks.crawl import list_source

BUNDLES = {"langgraph-llms-full.txt": 48, "mcp-modelcontextprotocol-llms-full.txt": 43, "crewai-llms-full.txt": 214}


@pytest.mark.parametrize(("name", "pages"), BUNDLES.items())
def test_bundles_hold_the_pages_they_really_hold(shared_corpora, name, pages):
    members = parse_bundle(decode_text((shared_corpora / "llms-full" / name).read_bytes()))
    assert len(members) == pages
    assert len({m.key for m in members}) == pages, "every page has its own key"


def test_bare_rules_inside_a_page_do_not_split_it(shared_corpora):
    members = parse_bundle(decode_text((shared_corpora / "llms-full" / "langgraph-llms-full.txt").read_bytes()))
    assert sum(m.text.count("\n---\n") for m in members) > 50, "the bundle's own horizontal rules stay inside pages"
    first = members[0]
    assert first.key == "how-tos/use-remote-graph.md" and first.text.startswith("# How to interact with the deployment")


def test_title_and_source_format_keeps_the_heading_and_drops_the_source_line(shared_corpora):
    members = parse_bundle(decode_text((shared_corpora / "llms-full" / "crewai-llms-full.txt").read_bytes()))
    agents = members[0]
    assert (agents.key, agents.title) == ("https://docs.crewai.com/en/concepts/agents", "Agents")
    assert agents.text.startswith("# Agents\n") and "Source: https://" not in agents.text.split("\n", 3)[1]


def test_url_rules_keep_and_drop(shared_corpora):
    src = SourceConfig(name="crew", kind="bundle", path=shared_corpora / "llms-full" / "crewai-llms-full.txt",
                       keep=("/en/tools/", "/en/concepts/"), drop=("*/tools/database-data/*",))
    listed = list_source(src)
    urls = [r["uri"] for r in listed.rows]
    assert urls and all("/en/tools/" in u or "/en/concepts/" in u for u in urls)
    assert not [u for u in urls if "/tools/database-data/" in u]
    everything = parse_bundle(decode_text(src.path.read_bytes()))
    tools_and_concepts = [m for m in everything if "/en/tools/" in m.key or "/en/concepts/" in m.key]
    dropped = [m for m in tools_and_concepts if "/tools/database-data/" in m.key]
    assert len(urls) == len(tools_and_concepts) - len(dropped) and dropped
    assert keep_member("https://x/oss/python/langchain/a", ("/oss/python/langchain/",), ("/oss/javascript/",))
    assert not keep_member("https://x/oss/javascript/langchain/a", (), ("/oss/javascript/",))


def test_paths_become_urls_with_a_base_url(shared_corpora):
    src = SourceConfig(name="lg", kind="bundle", path=shared_corpora / "llms-full" / "langgraph-llms-full.txt",
                       base_url="https://langchain-ai.github.io/langgraph/")
    rows = list_source(src).rows
    assert rows[0]["doc_id"] == "lg:how-tos/use-remote-graph.md"
    assert rows[0]["uri"] == "https://langchain-ai.github.io/langgraph/how-tos/use-remote-graph.md"


def test_an_html_page_saved_as_a_bundle_is_reported_as_such(shared_corpora):
    src = SourceConfig(name="lc", kind="bundle", path=shared_corpora / "bad" / "wrong_extension" / "langchain-llms-full.txt")
    listed = list_source(src)
    assert listed.rows == [] and "is an HTML page, not an llms-full.txt bundle" in listed.failure


@pytest.mark.usefixtures("prefect_harness")
def test_editing_one_page_reprocesses_only_that_page(shared_corpora, write_config, tmp_path):
    bundle = tmp_path / "mcp-llms-full.txt"
    shutil.copy(shared_corpora / "llms-full" / "mcp-modelcontextprotocol-llms-full.txt", bundle)
    bundle.chmod(0o644)
    config = write_config(tmp_path, sources=[{"name": "mcp", "kind": "bundle", "path": str(bundle),
                                              "drop": ["/community/"]}])
    first = ingest(config_path=str(config))
    pages = parse_bundle(bundle.read_text(encoding="utf-8"))
    kept = [m for m in pages if "/community/" not in m.key]
    assert first["docs_new"] == len(kept) < len(pages) and first["docs_quarantined"] == 0

    db = lancedb.connect(str(load_config(config).store.uri))
    docs = {d["doc_id"]: d for d in db.open_table("documents").to_arrow().to_pylist()}
    assert docs["mcp:https://modelcontextprotocol.io/clients"]["title"] == "Example Clients"
    assert docs["mcp:https://modelcontextprotocol.io/clients"]["uri"] == "https://modelcontextprotocol.io/clients"

    text = bundle.read_text(encoding="utf-8")
    target = "https://modelcontextprotocol.io/examples"
    start = text.index(f"Source: {target}")
    bundle.write_text(text[:start] + text[start:].replace(
        "\n\n", "\n\nThe lighthouse keeper's reference server answers tide questions.\n\n", 1), encoding="utf-8")
    second = ingest(config_path=str(config))
    assert (second["docs_changed"], second["docs_new"], second["docs_deleted"]) == (1, 0, 0)
    assert second["docs_unchanged"] == len(kept) - 1
    hit = search("lighthouse keeper reference server tide questions", k=1, config=config, mode="fulltext")[0]
    assert hit.doc_id == f"mcp:{target}" and hit.citation.uri == target
