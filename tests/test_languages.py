"""Full-text search in every language: ICU word splitting (Chinese, Japanese, Thai) and the store's own stemmer."""

from __future__ import annotations

from pathlib import Path

import lancedb
import pytest
from lancedb.index import FTS

from flows.ingest import ingest
from flows.maintenance import maintenance
from query import search
from schemas.errors import ConfigError
from store.commit import FTS_PREFIX, fulltext_index_name

pytestmark = pytest.mark.usefixtures("prefect_harness")

DOCS = {
    "beijing.md": "# 北京\n\n北京是中华人民共和国的首都，也是全国的政治和文化中心，常住人口超过两千万。\n",
    "canal.md": "# 大运河\n\n京杭大运河是世界上里程最长、工程最大的古代运河，北起北京，南到杭州。\n",
    "tokyo.md": "# 東京\n\n東京都は日本の首都であり、世界有数の人口を持つ大都市圏の中心である。\n",
    "bangkok.md": "# กรุงเทพ\n\nกรุงเทพมหานครเป็นเมืองหลวงและนครที่มีประชากรมากที่สุดของประเทศไทย\n",
    "harbour.md": "# Harbour\n\nThe harbour masters keep the tide tables and the mooring registers for every visiting yacht.\n",
}
RUSSIAN = {
    f"r{i}.md": text for i, text in enumerate([
        "# Порт\n\nКапитаны порта ведут таблицы приливов и журналы стоянок для всех яхт.\n",
        "# Верфь\n\nНа верфи ремонтируют корпуса лодок и меняют паруса перед сезоном.\n",
        "# Клуб\n\nЧлены клуба дежурят на причале по выходным и встречают гостей.\n",
    ])
}


def _folder(tmp_path: Path, docs: dict[str, str]) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir(exist_ok=True)
    for name, text in docs.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


@pytest.fixture
def store(tmp_path: Path, write_config) -> Path:
    config = write_config(_folder(tmp_path, DOCS))
    ingest(config_path=str(config))
    return config


def _chunks(config: Path) -> lancedb.table.Table:
    return lancedb.connect(str(config.parent / "store" / "lancedb")).open_table("chunks")


def _top(query: str, config: Path, mode: str = "fulltext") -> str:
    hits = search(query, k=1, mode=mode, config=config)
    return hits[0].doc_id.split(":", 1)[1] if hits else ""


@pytest.mark.parametrize(("query", "doc"), [
    ("中国的首都", "beijing.md"),   # "capital of China": a whitespace tokenizer sees one word in each sentence
    ("最长的运河", "canal.md"),
    ("日本の首都", "tokyo.md"),
    ("เมืองหลวงของไทย", "bangkok.md"),
    ("harbour master tide table", "harbour.md"),  # English, stemmed: masters, tables
])
def test_a_query_in_any_script_finds_its_document_by_full_text(store, query, doc):
    assert _top(query, store) == doc


def test_a_store_indexed_by_an_older_inlet_is_reindexed_at_the_next_run(store):
    table = _chunks(store)
    table.drop_index(fulltext_index_name(table))
    table.create_index("text", config=FTS(with_position=False))  # what Inlet built before: it cannot split Chinese
    table.tags.update("published", table.version)
    assert _top("中国的首都", store) != "beijing.md"
    summary = ingest(config_path=str(store))
    assert summary["docs_new"] == summary["docs_changed"] == 0
    assert fulltext_index_name(_chunks(store)).startswith(FTS_PREFIX)
    assert _top("中国的首都", store) == "beijing.md"


def test_the_index_stems_in_the_stores_most_common_language_and_maintenance_follows_it(tmp_path, write_config):
    folder = _folder(tmp_path, {"harbour.md": DOCS["harbour.md"]})
    config = write_config(folder)
    ingest(config_path=str(config))
    assert fulltext_index_name(_chunks(config)) == FTS_PREFIX + "en"
    _folder(tmp_path, RUSSIAN)
    ingest(config_path=str(config))
    assert fulltext_index_name(_chunks(config)) == FTS_PREFIX + "en", "decided when built, not at every run"
    maintenance(config_path=str(config))
    assert fulltext_index_name(_chunks(config)) == FTS_PREFIX + "ru"
    # "капитан порта" (singular) finds "Капитаны порта" through the Russian stemmer.
    assert _top("капитан порта", config) == "r0.md"
    pinned = write_config(folder, name="pinned.yaml", query={"fulltext_language": "none"})
    maintenance(config_path=str(pinned))
    assert fulltext_index_name(_chunks(config)) == FTS_PREFIX + "plain"


def test_an_unknown_fulltext_language_is_refused_naming_the_key(tmp_path, write_config):
    from schemas.config import load_config

    config = write_config(tmp_path, query={"fulltext_language": "klingon"})
    with pytest.raises(ConfigError, match=r"query.fulltext_language.*'klingon' is not auto, none or a language"):
        load_config(config)
