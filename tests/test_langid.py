"""The language model's decompressed cache: same answers as py3langid's own loader, made once, repaired."""

from __future__ import annotations

import json

import numpy as np
import pytest
from py3langid.langid import MODEL_FILE, LanguageIdentifier

from providers import langid
from tests.conftest import CORPORA

SAMPLES = [
    "The pipeline keeps a retrieval knowledge base fresh, one changed document at a time.",
    "Die Pipeline hält eine Wissensdatenbank aktuell, ein geändertes Dokument nach dem anderen.",
    "La canalización mantiene actualizada una base de conocimiento, documento a documento.",
    "管道一次处理一个已更改的文档，使检索知识库保持最新。",
    "यह पाइपलाइन ज्ञान भंडार को ताज़ा रखती है।",
    "12345 ### ---",
]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("INLET_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_cached_model_answers_exactly_as_py3langids_own_loader(cache_dir):
    reference = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    made = langid.load_identifier()  # writes the cache entry
    read = langid.load_identifier()  # reads it back
    folder = langid.cache_folder(langid.model_path())
    assert folder.parent == cache_dir and (folder / "manifest.json").exists() and (folder / "done").exists()
    assert read.nb_ptc.dtype == np.float32, "widened once, not on every call"
    for text in SAMPLES:
        assert made.rank(text) == reference.rank(text)
        assert read.rank(text) == reference.rank(text)
        assert read.classify(text) == reference.classify(text)


def test_a_damaged_cache_entry_is_written_again(cache_dir, caplog):
    langid.load_identifier()
    folder = langid.cache_folder(langid.model_path())
    (folder / "ptc.npy").write_bytes(b"not an array")
    identifier = langid.load_identifier()
    assert "damaged" in caplog.text
    assert identifier.classify(SAMPLES[1])[0] == "de"
    assert langid.load_identifier().classify(SAMPLES[0])[0] == "en"  # the rewritten entry reads cleanly


def test_an_unwritable_cache_loads_the_packaged_model_and_says_so(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder would go")
    monkeypatch.setenv("INLET_CACHE_DIR", str(blocker / "cache"))
    identifier = langid.load_identifier()
    assert "cache unusable" in caplog.text
    assert identifier.classify(SAMPLES[2])[0] == "es"


def test_a_cache_entry_left_half_removed_is_made_again(cache_dir):
    folder = langid.cache_folder(langid.model_path())
    folder.mkdir(parents=True)
    (folder / "ptc.npy").write_bytes(b"what an interrupted clean-up left")  # no "done": never complete
    identifier = langid.load_identifier()
    assert (folder / "done").exists() and identifier.classify(SAMPLES[1])[0] == "de"


# What classify_many must answer exactly as classify does: the edges of its batching and of py3langid's encoding.
EDGES = [
    "", "   ", "x", "ALL CAPITALS ARE READ AS LOWER CASE TEXT BY THE MODEL", "Ｆｕｌｌｗｉｄｔｈ ｌｅｔｔｅｒｓ",
    "e\u0301te\u0301 de\u0301compose\u0301 en NFD", "a lone surrogate \ud800 in the middle", "emoji only 🙂🙂🙂🙂",
    "مرحبا بالعالم، هذه جملة عربية قصيرة", "Привет, мир! Это короткое русское предложение.",
    "mixed: the cat とねこ der Hund 狗 le chien", "12345 ### ---", "Die Katze " * 400,
]


def _corpus_samples() -> list[str]:
    """Real documents' openings in many languages, when ../shared is beside the checkout."""
    texts = [path.read_text(encoding="utf-8", errors="replace")[:2000]
             for path in sorted(CORPORA.glob("markdown/**/*.md"))[:150]]
    for corpus in sorted(CORPORA.glob("eval/**/corpus.jsonl")):
        with corpus.open(encoding="utf-8") as lines:
            texts.extend(json.loads(line).get("text", "")[:2000] for line, _ in zip(lines, range(25)))
    return [t for t in texts if t]


def test_classify_many_answers_exactly_as_classify_does_text_by_text(cache_dir):
    identifier = langid.load_identifier()
    texts = [*SAMPLES, *EDGES, *_corpus_samples()]
    expected = [identifier.classify(text) for text in texts]
    assert langid.classify_many(identifier, texts) == expected
    assert langid.classify_many(identifier, texts[::-1]) == expected[::-1], "answers follow the texts, not the batch"
    assert langid.classify_many(identifier, EDGES[:1]) == expected[len(SAMPLES):len(SAMPLES) + 1]
    few = [*SAMPLES, *EDGES] * 2  # enough to be walked together even without ../shared's texts
    assert langid.classify_many(identifier, few) == expected[:len(SAMPLES) + len(EDGES)] * 2
    assert langid.classify_many(identifier, []) == []
    # The packaged model's own identifier (its float16 table, the fallback when the cache is unusable) too.
    packaged = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    assert langid.classify_many(packaged, texts[:200]) == [packaged.classify(t) for t in texts[:200]]
