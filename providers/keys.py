"""API keys come from the environment only, and never appear in logs, tables or messages."""

from __future__ import annotations

import os

from schemas.errors import ConfigError

KEY_VARIABLES = ("GEMINI_API_KEY", "GOOGLE_API_KEY")


def gemini_api_key() -> str | None:
    """Return the Gemini API key from GEMINI_API_KEY or GOOGLE_API_KEY, if one is set."""
    for name in KEY_VARIABLES:
        if os.environ.get(name):
            return os.environ[name]
    return None


def require_gemini_api_key() -> str:
    """Return the Gemini API key or say, without any value, which variables to set."""
    key = gemini_api_key()
    if key is None:
        msg = f"Gemini needs an API key: set {' or '.join(KEY_VARIABLES)}"
        raise ConfigError(msg)
    return key
