"""Token counting with tiktoken cl100k_base from the rank file shipped as package data."""

from __future__ import annotations

import functools
import hashlib

import numpy as np
import tiktoken

from providers.offline import TIKTOKEN_DIR

ENCODING_NAME = "cl100k_base"
RANK_FILE = TIKTOKEN_DIR / "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"  # sha1 of the download URL, tiktoken's cache name
RANK_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"


def verify_rank_file() -> None:
    """Check the shipped rank file against tiktoken's published sha256."""
    digest = hashlib.sha256(RANK_FILE.read_bytes()).hexdigest()
    if digest != RANK_SHA256:
        msg = f"{RANK_FILE}: sha256 {digest} != expected {RANK_SHA256}; reinstall Inlet"
        raise RuntimeError(msg)


@functools.cache
def encoding() -> tiktoken.Encoding:
    """Return the cl100k_base encoding, loaded once."""
    return tiktoken.get_encoding(ENCODING_NAME)


def count_tokens(text: str) -> int:
    """Count cl100k_base tokens in text."""
    return len(encoding().encode(text, disallowed_special=()))


def encode(text: str) -> list[int]:
    """Encode text as cl100k_base tokens, special-token text taken literally."""
    return encoding().encode(text, disallowed_special=())


def decode(tokens: list[int]) -> str:
    """Decode cl100k_base tokens."""
    return encoding().decode(tokens)


@functools.cache
def _token_bytes() -> np.ndarray:
    """Byte length of every token id (special tokens included), for offsets without decoding.

    Read from the encoding's rank table in one pass (~8 ms); asking tiktoken token by token took ~70-90 ms,
    which the first chunk of a small run paid on its own path.
    """
    enc = encoding()
    lengths = np.zeros(enc.n_vocab, dtype=np.int64)  # an id cl100k leaves unused keeps 0
    # tiktoken's own rank table (private): tests/test_tokenizer.py checks every id against decoding it.
    ranks = enc._mergeable_ranks
    lengths[np.fromiter(ranks.values(), np.int64, len(ranks))] = np.fromiter(map(len, ranks), np.int64, len(ranks))
    for text, token in enc._special_tokens.items():
        lengths[token] = len(text.encode())
    return lengths


def warm() -> None:
    """Load what token counting and cutting use (the encoding, the token byte lengths), once per process."""
    _token_bytes()


def token_offsets(text: str) -> tuple[list[int], list[int]]:
    """Return (tokens, character offset where each token starts, plus len(text) at the end).

    A token that begins inside a multi-byte character counts from that character, so cutting text at
    these offsets never splits a character (decoding a token slice could, leaving U+FFFD behind). The
    offsets are tiktoken's decode_with_offsets', computed from token byte lengths in NumPy.
    """
    tokens = encode(text)
    if not tokens:
        return tokens, [len(text)]
    lengths = _token_bytes()[np.asarray(tokens)]
    starts = np.cumsum(lengths) - lengths  # byte offset of each token
    raw = np.frombuffer(text.encode(), dtype=np.uint8)
    # Index of the character each byte belongs to: count the bytes that begin a character.
    char_of_byte = np.cumsum((raw & 0xC0) != 0x80) - 1
    return tokens, [*np.maximum(char_of_byte[starts], 0).tolist(), len(text)]
