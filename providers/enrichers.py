"""Chunk enrichers: add searchable context to a chunk without touching its text."""

from __future__ import annotations

import functools

from providers.types import Enricher, EnrichInput
from schemas.config import EnrichmentConfig


class KeywordEnricher:
    """Offline enricher: YAKE keywords plus the document title and heading path."""

    VERSION = "1"

    def __init__(self, max_keywords: int = 8, language: str = "en") -> None:
        import yake  # here, not at import: with networkx ~0.1 s, which a run without enrichment need not pay

        self._max = max_keywords
        self._extractor = yake.KeywordExtractor(lan=language, n=2, top=max_keywords, dedup_lim=0.7)
        self.fingerprint = f"keywords-yake-{yake.__version__}:v{self.VERSION}:top={max_keywords}:lang={language}"

    def _keywords(self, text: str) -> list[str]:
        return [kw for kw, _score in self._extractor.extract_keywords(text)][: self._max]

    def enrich(self, items: list[EnrichInput], documents: list[str | None] | None = None) -> list[str | None]:
        """Return 'Title / Section / Keywords' lines for each chunk."""
        out = []
        for item in items:
            lines = []
            if item.title:
                lines.append(f"Title: {item.title}")
            if item.heading_path:
                lines.append(f"Section: {' > '.join(item.heading_path)}")
            keywords = self._keywords(item.text)
            if keywords:
                lines.append(f"Keywords: {', '.join(keywords)}")
            out.append("\n".join(lines))
        return out


def resolve_enrichment(cfg: EnrichmentConfig) -> tuple[EnrichmentConfig, str | None]:
    """Return the enrichment config to run with, and a notice when Gemini falls back for want of a key."""
    from providers.keys import gemini_api_key

    if not cfg.enabled or cfg.provider != "gemini" or gemini_api_key():
        return cfg, None
    notice = (f"no GEMINI_API_KEY or GOOGLE_API_KEY in the environment: enriching with local keywords "
              f"instead of Gemini {cfg.kind}")
    return cfg.model_copy(update={"provider": "local", "kind": "keywords"}), notice


def make_enricher(cfg: EnrichmentConfig) -> Enricher:
    """Build the enricher the config names; reused while the config and its prompt file are unchanged."""
    if cfg.provider == "gemini":
        from providers.gemini_enricher import load_prompt

        # The prompt file is read every time: editing it (a version bump) must reach the next run.
        return _gemini_enricher(cfg, load_prompt(cfg.prompt_path()))
    return _keyword_enricher(cfg.max_keywords)


@functools.cache
def _keyword_enricher(max_keywords: int) -> Enricher:
    return KeywordEnricher(max_keywords=max_keywords)


@functools.cache
def _gemini_enricher(cfg: EnrichmentConfig, prompt: object) -> Enricher:
    from providers.gemini_enricher import GeminiEnricher
    from providers.keys import require_gemini_api_key

    return GeminiEnricher(kind=cfg.kind, prompt=prompt, api_key=require_gemini_api_key(), model=cfg.model,
                          system=cfg.system, base_url=cfg.base_url, timeout_ms=int(cfg.timeout_s * 1000),
                          attempts=cfg.attempts, max_in_flight=cfg.max_in_flight,
                          requests_per_minute=cfg.requests_per_minute, tokens_per_minute=cfg.tokens_per_minute)
