"""elements -> chunks: heading sections cut to a token limit, or fixed token windows."""

from __future__ import annotations

import functools
import hashlib
import re
import string
from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa
from prefect import task
from prefect.cache_policies import NO_CACHE

from providers.tokenizer import count_tokens as _count_tokens
from providers.tokenizer import encode, encoding, token_offsets
from runtime.artifacts import read_artifact, write_artifact
from runtime.cpu import map_parts, split_by_size
from runtime.isolate import each_document, quarantined_by
from schemas.arrow import CHUNKS_SCHEMA, ELEMENTS_SCHEMA
from schemas.config import ChunkingConfig, ChunkStrategy
from schemas.errors import UNEXPECTED, DocumentFailure
from tasks.clean import heading_title

_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t#]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


@functools.lru_cache(maxsize=1 << 16)
def count_tokens(text: str) -> int:
    """Count cl100k tokens; cached because packing asks about the same blocks several times."""
    return _count_tokens(text)


@dataclass
class Block:
    """A unit the chunker never splits unless it alone is over the limit."""

    text: str
    kind: str  # heading | code | text
    level: int | None = None  # heading level, for headings
    page: int | None = None
    title: str | None = None  # heading text without the # marks


@dataclass
class Section:
    """Blocks under one heading path."""

    path: tuple[str, ...]
    blocks: list[Block] = field(default_factory=list)


@dataclass(frozen=True)
class Piece:
    """One chunk before ids are assigned (tokens: its cl100k count when packing knew it exactly)."""

    text: str
    path: tuple[str, ...]
    pages: tuple[int, ...]
    tokens: int | None = None


# --- Markdown text -> blocks ---------------------------------------------------------------


def _close_paragraph(lines: list[str], out: list[Block]) -> None:
    text = "\n".join(lines).strip("\n")
    if text.strip():
        out.append(Block(text, "text"))
    lines.clear()


def parse_markdown(text: str) -> list[Block]:
    """Split Markdown into heading, fenced-code and paragraph blocks, text kept as written.

    A heading line too long to be one (heading_title) is a paragraph line.
    """
    out: list[Block] = []
    para: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence:
            _close_paragraph(para, out)
            marker = fence.group(1)
            end = i + 1
            # A fence closes on a line of the same character, at least as long; unclosed runs to the end.
            while end < len(lines) and not re.match(rf"^ {{0,3}}{marker[0]}{{{len(marker)},}}\s*$", lines[end]):
                end += 1
            out.append(Block("\n".join(lines[i : end + 1]), "code"))
            i = end + 1
            continue
        heading = _HEADING.match(line)
        if heading and heading_title(heading.group(2)) is not None:
            _close_paragraph(para, out)
            out.append(Block(line.strip(), "heading", level=len(heading.group(1)), title=heading.group(2).strip()))
        elif not line.strip():
            _close_paragraph(para, out)
        else:
            para.append(line)
        i += 1
    _close_paragraph(para, out)
    return out


def elements_to_blocks(rows: list[dict]) -> list[Block]:
    """Turn one document's element rows (in order) into blocks; a heading too long to be one is text."""
    blocks: list[Block] = []
    for row in rows:
        if row["kind"] == "markdown":
            blocks.extend(parse_markdown(row["text"]))
        elif row["kind"] == "heading" and (title := heading_title(row["text"])) is not None:
            level = min(max(row["heading_level"] or 1, 1), 6)
            blocks.append(Block(f"{'#' * level} {title}", "heading", level=level, page=row["page"], title=title))
        else:
            kind = "code" if row["kind"] == "code" else "text"
            blocks.append(Block(row["text"], kind, page=row["page"]))
    return blocks


# --- blocks -> sections ----------------------------------------------------------------------


def split_sections(blocks: list[Block], levels: int) -> list[Section]:
    """Start a section at every heading of level <= levels; deeper headings stay in the body."""
    sections: list[Section] = [Section(())]
    stack: list[tuple[int, str]] = []
    for block in blocks:
        if block.kind == "heading" and block.level is not None and block.level <= levels:
            stack = [(lvl, t) for lvl, t in stack if lvl < block.level] + [(block.level, block.title or "")]
            sections.append(Section(tuple(t for _, t in stack), [block]))
        else:
            sections[-1].blocks.append(block)
    return _fold_empty_headings([s for s in sections if s.blocks])


def _fold_empty_headings(sections: list[Section]) -> list[Section]:
    """Give a heading with no body of its own to the section after it, so no chunk is a bare heading."""
    out: list[Section] = []
    carry: list[Block] = []
    for sec in sections:
        blocks = carry + sec.blocks
        if all(b.kind == "heading" for b in sec.blocks):
            carry = blocks
            continue
        out.append(Section(sec.path, blocks))
        carry = []
    if carry:
        out.append(Section(sections[-1].path, carry))
    return out


def merge_small_sections(sections: list[Section], max_tokens: int) -> list[Section]:
    """Merge adjacent sections under the same ## parent while they fit in max_tokens together."""
    out: list[Section] = []
    sizes: list[int] = []
    for sec in sections:
        size = joined_tokens(sec.blocks)
        if out and len(sec.path) >= 2 and out[-1].path[:2] == sec.path[:2] and sizes[-1] + size <= max_tokens:
            out[-1] = Section(sec.path[:2], out[-1].blocks + sec.blocks)
            sizes[-1] += size
        else:
            out.append(sec)
            sizes.append(size)
    return out


# --- sections -> pieces under the token limit -------------------------------------------------


def _render(blocks: list[Block]) -> str:
    return "\n\n".join(b.text for b in blocks)


_SEPARATOR = "\n\n"
_ASCII_ALNUM = frozenset(string.ascii_letters + string.digits)
_ASCII_PUNCT = frozenset(string.punctuation)


@functools.lru_cache(maxsize=1 << 12)
def _separator_tokens(tail: str) -> int:
    """Tokens the separator adds after a text whose last pre-tokenizer piece is tail ("" : a piece of its own)."""
    return count_tokens(tail + _SEPARATOR) - (count_tokens(tail) if tail else 0)


def _last_piece(text: str) -> str | None:
    """The part of text's last cl100k piece that the separator can merge with: "" after a letter or digit,
    the closing punctuation (with the space before it) after punctuation; None when that is not certain.

    cl100k's pre-tokenizer cuts text into pieces and encodes each alone. A separator after an ASCII
    letter or digit is a piece of its own; after a run of ASCII punctuation it joins that run's piece
    (`.` and `.\n\n` are one token each). Anything else (whitespace, other scripts) is left to tiktoken.
    """
    last = text[-1:]
    if last in _ASCII_ALNUM:
        return ""
    if last not in _ASCII_PUNCT:
        return None
    start = len(text.rstrip(string.punctuation))
    before = text[start - 1 : start]
    if before == " ":
        return text[start - 1 :]  # the piece takes one space before the punctuation
    if before and not (before in _ASCII_ALNUM or before in "\t\n\r\x0b\x0c"):
        return None  # e.g. a non-ASCII symbol that the piece might take in too
    return text[start:]


def _starts_cleanly(text: str) -> bool:
    """Tell whether nothing at the start of text can join the separator's piece (no line break in its leading space)."""
    body = text.lstrip()
    lead = text[: len(text) - len(body)]
    return bool(body) and "\n" not in lead and "\r" not in lead


def joined_tokens(blocks: list[Block]) -> int:
    """Count the tokens of _render(blocks) exactly, from the blocks' own counts where the joins allow it.

    Pieces never cross a join whose left side ends in an ASCII letter, digit or punctuation and whose
    right side does not begin with a line break, so the whole counts as its parts plus what each
    separator adds (tests/test_chunk.py checks this against tiktoken on the shared corpora). Otherwise
    the rendered text is encoded.
    """
    total = 0
    for i, block in enumerate(blocks):
        if i:
            tail = _last_piece(blocks[i - 1].text)
            if tail is None or not _starts_cleanly(block.text):
                return count_tokens(_render(blocks))
            total += _separator_tokens(tail)
        total += count_tokens(block.text)
    return total


def _pages(blocks: list[Block]) -> tuple[int, ...]:
    return tuple(sorted({b.page for b in blocks if b.page is not None}))


def token_windows(text: str, max_tokens: int, overlap: int) -> list[str]:
    """Cut text into windows of max_tokens tokens, each sharing overlap tokens with the last."""
    tokens, edges = token_offsets(text)
    if len(tokens) <= max_tokens:
        return [text]
    step = max_tokens - overlap
    starts = range(0, max(len(tokens) - overlap, 1), step)
    # Cut at character offsets, not by decoding token slices: a slice can end inside a character.
    return [text[edges[s] : edges[min(s + max_tokens, len(tokens))]] for s in starts]


def _overlap_tail(block: Block, overlap: int) -> Block | None:
    # Never carry a piece of a code block into the next chunk: it would be cut inside the fence.
    if overlap == 0 or block.kind == "code":
        return None
    tokens, edges = token_offsets(block.text)
    if len(tokens) <= overlap:
        return block
    return Block(block.text[edges[len(tokens) - overlap] :].lstrip(), block.kind, page=block.page)


def _split_big_block(block: Block, cfg: ChunkingConfig) -> list[Block]:
    parts = token_windows(block.text, cfg.max_tokens, cfg.overlap_tokens)
    return [Block(p, block.kind, page=block.page) for p in parts]


def pack_section(section: Section, cfg: ChunkingConfig) -> list[Piece]:
    """Pack a section's blocks into pieces of at most max_tokens, with overlap between them."""
    total = joined_tokens(section.blocks)
    if total <= cfg.max_tokens:
        return [Piece(_render(section.blocks), section.path, _pages(section.blocks), total)]
    pieces: list[Piece] = []
    current: list[Block] = []
    size = 0
    sep = count_tokens("\n\n")
    for block in section.blocks:
        n = count_tokens(block.text)
        parts = [block] if n <= cfg.max_tokens else _split_big_block(block, cfg)
        for part in parts:
            n = count_tokens(part.text)
            if current and size + sep + n > cfg.max_tokens:
                pieces.append(Piece(_render(current), section.path, _pages(current), joined_tokens(current)))
                tail = _overlap_tail(current[-1], cfg.overlap_tokens)
                # Carry the overlap only if it still leaves room for the next part.
                keep = tail is not None and count_tokens(tail.text) + sep + n <= cfg.max_tokens
                current, size = ([tail], count_tokens(tail.text)) if keep else ([], 0)
            current.append(part)
            size += (sep if size else 0) + n
    if current:
        pieces.append(Piece(_render(current), section.path, _pages(current), joined_tokens(current)))
    return pieces


def fixed_pieces(blocks: list[Block], cfg: ChunkingConfig) -> list[Piece]:
    """Cut the whole document into fixed token windows, ignoring headings."""
    tokens: list[int] = []
    pages: list[int | None] = []
    sep = encode("\n\n")
    for block in blocks:
        block_tokens = encode(block.text) + sep
        tokens.extend(block_tokens)
        pages.extend([block.page] * len(block_tokens))
    tokens, pages = tokens[: -len(sep)] if blocks else tokens, pages[: -len(sep)] if blocks else pages
    step = cfg.max_tokens - cfg.overlap_tokens
    joined, offsets = encoding().decode_with_offsets(tokens)
    edges = [*offsets, len(joined)]
    out = []
    for start in range(0, max(len(tokens) - cfg.overlap_tokens, 1), step):
        # Cut at character offsets: decoding a token slice could split a character.
        text = joined[edges[start] : edges[min(start + cfg.max_tokens, len(tokens))]].strip()
        if text:
            seen = tuple(sorted({p for p in pages[start : start + cfg.max_tokens] if p is not None}))
            out.append(Piece(text, (), seen))
    return out


def pieces_for_document(rows: list[dict], cfg: ChunkingConfig) -> list[Piece]:
    """Chunk one document's element rows into pieces according to cfg."""
    blocks = elements_to_blocks(rows)
    if cfg.strategy == ChunkStrategy.FIXED:
        return fixed_pieces(blocks, cfg)
    sections = split_sections(blocks, cfg.heading_levels)
    if cfg.merge_small_sections:
        sections = merge_small_sections(sections, cfg.max_tokens)
    return [p for sec in sections for p in pack_section(sec, cfg) if p.text.strip()]


# --- pieces -> chunk rows -------------------------------------------------------------------


def text_hash(text: str) -> str:
    """Return the sha256 hex digest of a text."""
    return hashlib.sha256(text.encode()).hexdigest()


def make_chunk_id(doc_id: str, digest: str, repeat: int) -> str:
    """Content-addressed chunk id: stable when the text moves within its document."""
    return hashlib.sha256(f"{doc_id}\0{digest}\0{repeat}".encode()).hexdigest()[:32]


def chunk_rows(doc_id: str, pieces: list[Piece]) -> list[dict]:
    """Give pieces ids, positions and neighbour links."""
    repeats: Counter[str] = Counter()
    ids, digests = [], []
    for piece in pieces:
        digest = text_hash(piece.text)
        ids.append(make_chunk_id(doc_id, digest, repeats[digest]))
        digests.append(digest)
        repeats[digest] += 1
    total = len(pieces)
    return [
        {
            "chunk_id": ids[i], "doc_id": doc_id, "chunk_index": i, "total_chunks": total,
            "prev_chunk_id": ids[i - 1] if i > 0 else None,
            "next_chunk_id": ids[i + 1] if i + 1 < total else None,
            "heading_path": list(p.path), "text": p.text, "text_hash": digests[i],
            "token_count": count_tokens(p.text) if p.tokens is None else p.tokens,
            "page_start": p.pages[0] if p.pages else None, "page_end": p.pages[-1] if p.pages else None,
        }
        for i, p in enumerate(pieces)
    ]


def chunk_document(doc_id: str, rows: list[dict], cfg: ChunkingConfig) -> list[dict]:
    """Chunk one document's element rows (in order) into chunk rows."""
    return chunk_rows(doc_id, pieces_for_document(rows, cfg))


def _chunk_documents(docs: list[tuple[str, list[dict]]], cfg: ChunkingConfig) -> tuple[pa.Table, list[DocumentFailure]]:
    """Chunk several documents, each given as (doc_id, its element rows); one that raises is a failure, not an error.

    The chunks come back as an Arrow table: from a worker process, its buffers cross to the run's process whole,
    where row dicts were unpickled one object at a time under the run's interpreter lock.
    """
    done, failures = each_document(lambda doc: chunk_document(doc[0], doc[1], cfg),
                                   ((doc_id, (doc_id, rows)) for doc_id, rows in docs), "chunk")
    return pa.Table.from_pylist([r for rows in done for r in rows], schema=CHUNKS_SCHEMA), failures


def _died(doc: tuple[str, list[dict]]) -> tuple[pa.Table, list[DocumentFailure]]:
    """A document whose chunking killed the worker process, twice: no chunks, a failure."""
    return CHUNKS_SCHEMA.empty_table(), [DocumentFailure(doc[0], "chunk", UNEXPECTED, "the worker process chunking it died",
                                                         "WorkerDied")]


def _joined(results: list[tuple[pa.Table, list[DocumentFailure]]]) -> tuple[pa.Table, list[DocumentFailure]]:
    return (pa.concat_tables([CHUNKS_SCHEMA.empty_table(), *(chunks for chunks, _ in results)]),
            [f for _, failures in results for f in failures])


# What chunking reads of an element row (its position is the order the rows come in).
_ELEMENT_FIELDS = ["doc_id", "kind", "text", "heading_level", "page"]


def chunk_elements(elements: pa.Table, cfg: ChunkingConfig) -> tuple[pa.Table, list[DocumentFailure]]:
    """Chunk every document in the elements table, in doc_id order (parts on the CPU pool when there is one).

    Returns the chunks and the documents whose chunking raised (they have no chunks).
    """
    by_doc: dict[str, list[dict]] = {}
    ordered = elements.sort_by([("doc_id", "ascending"), ("element_index", "ascending")]).select(_ELEMENT_FIELDS)
    for row in ordered.to_pylist():
        by_doc.setdefault(row["doc_id"], []).append(row)
    docs = list(by_doc.items())
    parts = split_by_size(docs, [sum(len(r["text"]) for r in rows) for _, rows in docs])
    return _joined(map_parts(functools.partial(_chunk_documents, cfg=cfg), parts, died=_died, join=_joined))


@task(name="chunk", cache_policy=NO_CACHE)
def chunk_stage(elements_path: str, cfg: ChunkingConfig, run_dir: str, extracted_path: str) -> tuple[str, str]:
    """Read elements, chunk them, write the chunks artifact; quarantine documents whose chunking raised."""
    chunks, failures = chunk_elements(read_artifact(elements_path, ELEMENTS_SCHEMA), cfg)
    extracted_path = quarantined_by(failures, extracted_path, run_dir, "chunked")
    return write_artifact(chunks, run_dir, "chunks", CHUNKS_SCHEMA), extracted_path
