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
def _known_lengths() -> np.ndarray:
    """Byte length of each token id met so far in this process; -1 for one not yet met."""
    return np.full(encoding().n_vocab, -1, dtype=np.int64)


def _byte_length(token: int) -> int:
    try:
        return len(encoding().decode_single_token_bytes(token))
    except KeyError:  # an id cl100k leaves unused
        return 0


def _token_byte_lengths(tokens: np.ndarray) -> np.ndarray:
    """Byte length of each token id (special tokens included; an id cl100k leaves unused: 0).

    Asked of tiktoken's public decode_single_token_bytes once per distinct id a process meets, then
    looked up: chunking 200 corpus pages meets ~8,700 ids (~10 ms), where learning all 100,277 up front
    took ~41 ms of every fresh process. Threads may learn the same id at once: they write the same value.
    """
    known = _known_lengths()
    lengths = known[tokens]
    if (lengths < 0).any():
        new = list(set(tokens[lengths < 0].tolist()))
        known[new] = [_byte_length(token) for token in new]
        lengths = known[tokens]
    return lengths


def warm() -> None:
    """Load the encoding, once per process (token byte lengths are learnt as tokens are met)."""
    encoding()


def token_offsets(text: str) -> tuple[list[int], list[int]]:
    """Return (tokens, character offset where each token starts, plus len(text) at the end).

    A token that begins inside a multi-byte character counts from that character, so cutting text at
    these offsets never splits a character (decoding a token slice could, leaving U+FFFD behind). The
    offsets are tiktoken's decode_with_offsets', computed from token byte lengths in NumPy.
    """
    tokens = encode(text)
    if not tokens:
        return tokens, [len(text)]
    lengths = _token_byte_lengths(np.asarray(tokens))
    starts = np.cumsum(lengths) - lengths  # byte offset of each token
    raw = np.frombuffer(text.encode(), dtype=np.uint8)
    # Index of the character each byte belongs to: count the bytes that begin a character.
    char_of_byte = np.cumsum((raw & 0xC0) != 0x80) - 1
    return tokens, [*np.maximum(char_of_byte[starts], 0).tolist(), len(text)]
