"""The web source against a local site: conditional requests, sitemap, allowlist, size and time limits."""

from __future__ import annotations

import lancedb
import pytest

from flows.ingest import ingest
from query import search
from schemas.config import load_config
from tests.web_server import Site, serve

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _page(title: str, body: str) -> bytes:
    return (f"<html lang='en'><head><title>{title}</title></head><body><nav><a href='/'>Home</a></nav>"
            f"<main><h1>{title}</h1><p>{body}</p></main></body></html>").encode()


def _sitemap(base: str, paths: list[str]) -> bytes:
    locs = "".join(f"<url><loc>{base}{p}</loc></url>" for p in paths)
    return f'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{locs}</urlset>'.encode()


@pytest.fixture
def site():
    pages = {"/tides.html": _page("Tides", "High water at the harbour mouth comes forty minutes after Dover."),
             "/moorings.html": _page("Moorings", "Visitor moorings are the yellow buoys north of the breakwater."),
             "/fuel.html": _page("Fuel", "The fuel berth sells diesel from eight until six every day."),
             "/slipway.html": _page("Slipway", "The slipway is usable two hours either side of high water.")}
    with serve(Site(pages=dict(pages))) as running:
        running.pages["/sitemap.xml"] = _sitemap(running.base, list(pages))
        yield running


def _docs(config) -> dict[str, dict]:
    db = lancedb.connect(str(load_config(config).store.uri))
    return {d["doc_id"]: d for d in db.open_table("documents").to_arrow().to_pylist()}


def test_unchanged_pages_cost_one_304_and_no_extraction(site, write_config, tmp_path):
    config = write_config(tmp_path, sources=[{"name": "web", "kind": "web", "sitemap": f"{site.base}/sitemap.xml"}])
    first = ingest(config_path=str(config))
    assert first["docs_new"] == 4 and first["docs_quarantined"] == 0
    docs = _docs(config)
    tides = docs[f"web:{site.base}/tides.html"]
    assert tides["title"] == "Tides" and tides["uri"] == f"{site.base}/tides.html" and tides["validator"]
    assert search("when is high water at the harbour mouth", k=1, config=config)[0].doc_id == tides["doc_id"]

    site.log.clear()
    second = ingest(config_path=str(config))
    assert (second["docs_unchanged"], second["docs_new"], second["docs_changed"]) == (4, 0, 0)
    assert all(site.statuses(p) == [304] for p in ("/tides.html", "/moorings.html", "/fuel.html", "/slipway.html"))
    assert second["stage_seconds"].get("extract", 0) < 1 and second["chunks_written"] == 0

    site.pages["/fuel.html"] = _page("Fuel", "The fuel berth now sells diesel and petrol from seven until nine.")
    site.log.clear()
    third = ingest(config_path=str(config))
    assert (third["docs_changed"], third["docs_unchanged"]) == (1, 3)
    assert site.statuses("/fuel.html") == [200] and site.statuses("/tides.html") == [304]

    # A page gone from the site and its sitemap is deleted: the listing succeeded.
    del site.pages["/slipway.html"]
    site.pages["/sitemap.xml"] = _sitemap(site.base, ["/tides.html", "/moorings.html", "/fuel.html"])
    fourth = ingest(config_path=str(config))
    assert fourth["docs_deleted"] == 1 and f"web:{site.base}/slipway.html" not in _docs(config)

    # The sitemap fails: the listing failed, nothing is deleted.
    del site.pages["/sitemap.xml"]
    fifth = ingest(config_path=str(config))
    assert fifth["docs_deleted"] == 0 and len(_docs(config)) == 3
    assert any("sitemap" in n and "nothing deleted" in n for n in fifth["notices"])


def test_redirects_off_the_allowlist_big_pages_and_slow_pages(site, write_config, tmp_path):
    other_host = site.base.replace("127.0.0.1", "localhost")
    site.redirects["/elsewhere.html"] = f"{other_host}/tides.html"
    site.redirects["/moved.html"] = "/moorings.html"  # same host: followed
    site.pages["/big.html"] = _page("Big", "word " * 5_000)
    site.slow["/slow.html"] = 3
    site.pages["/slow.html"] = _page("Slow", "This page takes its time.")
    urls = [f"{site.base}{p}" for p in ("/tides.html", "/elsewhere.html", "/moved.html", "/big.html", "/slow.html")]
    config = write_config(tmp_path, sources=[{"name": "web", "kind": "web", "urls": urls, "timeout_s": 1}],
                          extraction={"max_file_mb": 0.01})
    summary = ingest(config_path=str(config))
    docs = _docs(config)
    assert docs[f"web:{site.base}/moved.html"]["uri"] == f"{site.base}/moorings.html", "redirect on the same host"
    assert docs[f"web:{site.base}/big.html"]["status"] == "quarantined"
    assert docs[f"web:{site.base}/big.html"]["error"].startswith("too_large")
    assert f"web:{site.base}/elsewhere.html" not in docs and f"web:{site.base}/slow.html" not in docs
    notices = " ".join(summary["notices"])
    assert "a host outside the allowed ones" in notices and "ReadTimeout" in notices
