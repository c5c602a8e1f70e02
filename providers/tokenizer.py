"""Token counting with tiktoken cl100k_base from the rank file shipped as package data.

tiktoken parses the rank file's 100k base64 lines on every process start (~60 ms of ~110 ms to load the
encoding). The parsed constructor arguments, from tiktoken's own cl100k_base constructor, are kept once
per machine in Inlet's cache folder (providers/cache.py); later processes build the encoding with
tiktoken's public Encoding constructor from them. The ranks are kept as a marshalled dict: read back in
~18 ms where rebuilding the dict from arrays took ~45 ms (every run that chunks pays it). marshal reads only
what this process wrote into the user's own cache folder, as the model caches beside it; its format version
is part of the entry's key. A cache that cannot be written or read is reported
in the log and tiktoken.get_encoding is used: the tokens are the same either way.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import marshal
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import tiktoken
from tiktoken_ext import openai_public

from providers.cache import cache_root, drop_entry, make_entry, source_key
from providers.offline import TIKTOKEN_DIR

log = logging.getLogger(__name__)

ENCODING_NAME = "cl100k_base"
RANK_FILE = TIKTOKEN_DIR / "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"  # sha1 of the download URL, tiktoken's cache name
RANK_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"


def verify_rank_file() -> None:
    """Check the shipped rank file against tiktoken's published sha256."""
    digest = hashlib.sha256(RANK_FILE.read_bytes()).hexdigest()
    if digest != RANK_SHA256:
        msg = f"{RANK_FILE}: sha256 {digest} != expected {RANK_SHA256}; reinstall Inlet"
        raise RuntimeError(msg)


def _cache_folder() -> Path:
    return cache_root() / (f"tiktoken-{version('tiktoken')}-{ENCODING_NAME}-{source_key(RANK_FILE)}"
                           f"-marshal{marshal.version}")


def _write_constructor(tmp: Path) -> None:
    """Write tiktoken's own cl100k_base constructor arguments: the ranks marshalled, the rest as JSON."""
    kwargs = openai_public.ENCODING_CONSTRUCTORS[ENCODING_NAME]()
    (tmp / "ranks.marshal").write_bytes(marshal.dumps(kwargs["mergeable_ranks"]))
    rest = {k: v for k, v in kwargs.items() if k != "mergeable_ranks"}
    (tmp / "constructor.json").write_text(json.dumps(rest))


def _read_constructor(folder: Path) -> dict[str, Any]:
    ranks = marshal.loads((folder / "ranks.marshal").read_bytes())
    if not isinstance(ranks, dict) or len(ranks) < 100_000:  # cl100k has 100,256 ranks
        msg = f"ranks.marshal holds {type(ranks).__name__} of {len(ranks) if isinstance(ranks, dict) else 0} ranks"
        raise ValueError(msg)
    return {**json.loads((folder / "constructor.json").read_text()), "mergeable_ranks": ranks}


@functools.cache
def encoding() -> tiktoken.Encoding:
    """Return the cl100k_base encoding, loaded once per process (from the cache, made on first use)."""
    try:
        folder = make_entry(_cache_folder(), _write_constructor)
        try:
            return tiktoken.Encoding(**_read_constructor(folder))
        except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:  # a damaged entry: made again
            log.warning("tokenizer cache %s damaged (%s: %s); writing it again", folder, type(exc).__name__, exc)
            drop_entry(folder)
            return tiktoken.Encoding(**_read_constructor(make_entry(folder, _write_constructor)))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("tokenizer cache unusable (%s: %s); loading cl100k_base with tiktoken", type(exc).__name__, exc)
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
