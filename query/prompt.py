"""Prompts for answering from search results: condition, cited context, question (the Docs Agent shape)."""

from __future__ import annotations

from query.search import SearchResult

DEFAULT_CONDITION = ("You are a helpful assistant that answers questions from the documents below. Read the "
                     "context first, answer the question at the end from it alone, cite the sources you used "
                     "by their number, and say so plainly when the context does not hold the answer.")
RELATED_CONDITION = ("Read the context below and write five questions a reader could ask next that the "
                     "context answers, one per line, without numbering.")


def context_block(results: list[SearchResult]) -> str:
    """Number each result and give its citation, then its text (neighbours in order around it)."""
    parts = []
    for i, hit in enumerate(results, 1):
        body = "\n".join([*(n.text for n in hit.before), hit.text, *(n.text for n in hit.after)])
        parts.append(f"[{i}] {hit.citation}\n{body.strip()}")
    return "\n\n".join(parts)


def build_prompt(question: str, results: list[SearchResult], condition: str = DEFAULT_CONDITION) -> str:
    """Return the prompt that answers question from results: condition, then context with citations, then question."""
    return f"{condition.strip()}\n\nContext:\n{context_block(results)}\n\nQuestion: {question.strip()}\n"


def build_related_questions_prompt(results: list[SearchResult], condition: str = RELATED_CONDITION) -> str:
    """Return the prompt asking for the questions a reader may ask next about the same context."""
    return f"{condition.strip()}\n\nContext:\n{context_block(results)}\n"
