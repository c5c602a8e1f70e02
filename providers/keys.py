"""API keys come from the environment or a Prefect Secret block, and never appear in logs, tables or messages."""

from __future__ import annotations

import functools
import os

from schemas.errors import ConfigError

KEY_VARIABLES = ("GEMINI_API_KEY", "GOOGLE_API_KEY")
_block: str | None = None  # the Secret block named by the running config, if any


def use_secret_block(name: str | None) -> None:
    """Name the Prefect Secret block to read the key from when no key variable is set."""
    global _block  # one key source per process, set by the flow or the query entry point
    _block = name


@functools.cache
def _secret(name: str) -> str:
    from prefect.blocks.system import Secret

    try:
        value = Secret.load(name).get()
    except ValueError:  # Prefect's error for a block that does not exist
        msg = f"api_key_block: no Prefect Secret block named '{name}'"
        raise ConfigError(msg) from None
    if not isinstance(value, str) or not value:
        msg = f"api_key_block: Prefect Secret block '{name}' does not hold a non-empty string"
        raise ConfigError(msg)
    return value


def gemini_api_key() -> str | None:
    """Return the Gemini API key from GEMINI_API_KEY, GOOGLE_API_KEY or the configured Secret block."""
    for name in KEY_VARIABLES:
        if os.environ.get(name):
            return os.environ[name]
    return _secret(_block) if _block else None


def require_gemini_api_key() -> str:
    """Return the Gemini API key or say, without any value, where to put one."""
    key = gemini_api_key()
    if key is None:
        msg = f"Gemini needs an API key: set {' or '.join(KEY_VARIABLES)}, or api_key_block in the config"
        raise ConfigError(msg)
    return key
