"""Environment switches that keep Inlet offline and quiet; the user's own settings win."""

from __future__ import annotations

import os
from pathlib import Path

TIKTOKEN_DIR = Path(__file__).resolve().parent / "data" / "tiktoken"

_DEFAULTS: dict[str, str] = {
    "DO_NOT_TRACK": "1",  # unstructured (and scarf) otherwise phone home with a 10 s time-out
    "SCARF_NO_ANALYTICS": "1",
    "UNSTRUCTURED_DISABLE_NOTICE": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",  # first ephemeral start can take ~17 s
    "HF_HUB_OFFLINE": "1",  # models load from package folders, never from a hub
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # no "Loading weights" bar in cron logs
    "TRANSFORMERS_VERBOSITY": "error",
    "ANONYMIZED_TELEMETRY": "False",
}


def _add_no_proxy() -> None:
    # websockets sends even ws://127.0.0.1 through a proxy and Prefect hangs at exit.
    for key in ("NO_PROXY", "no_proxy"):
        hosts = [h for h in os.environ.get(key, "").split(",") if h]
        for local in ("127.0.0.1", "localhost"):
            if local not in hosts:
                hosts.append(local)
        os.environ[key] = ",".join(hosts)


def configure_offline_env() -> None:
    """Set telemetry-off, offline and tokenizer-cache variables unless already set."""
    for key, value in _DEFAULTS.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(TIKTOKEN_DIR))
    _add_no_proxy()
