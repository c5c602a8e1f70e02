"""Structured answers Gemini must give for each enrichment kind (used as its response schema)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KeywordsAnswer(_Answer):
    """Search keywords for one chunk."""

    keywords: list[str] = Field(min_length=1, max_length=30)


class QuestionsAnswer(_Answer):
    """Questions the chunk answers."""

    questions: list[str] = Field(min_length=1, max_length=10)


class ContextAnswer(_Answer):
    """A short text situating the chunk in its document."""

    context: str = Field(min_length=1)


class CustomAnswer(_Answer):
    """Whatever a user prompt asks for, as text."""

    text: str = Field(min_length=1)


ANSWERS: dict[str, type[_Answer]] = {
    "keywords": KeywordsAnswer, "questions": QuestionsAnswer, "context": ContextAnswer, "custom": CustomAnswer,
}


def render_answer(answer: _Answer) -> str:
    """Turn a parsed answer into the enrichment text stored beside the chunk."""
    if isinstance(answer, KeywordsAnswer):
        return "Keywords: " + ", ".join(k.strip() for k in answer.keywords if k.strip())
    if isinstance(answer, QuestionsAnswer):
        return "Questions:\n" + "\n".join(f"- {q.strip()}" for q in answer.questions if q.strip())
    if isinstance(answer, ContextAnswer):
        return answer.context.strip()
    return answer.text.strip()  # type: ignore[attr-defined]
