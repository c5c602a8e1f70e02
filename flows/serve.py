"""Serve Inlet's deployments from one process (Prefect's serve), with prefect.yaml's schedules and parameters."""

from __future__ import annotations

import importlib
from pathlib import Path

import yaml
from prefect import Flow
from prefect.client.schemas.objects import ConcurrencyLimitConfig
from prefect.deployments.runner import RunnerDeployment
from prefect.events import DeploymentEventTrigger
from prefect.schedules import Cron

from schemas.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
PREFECT_YAML = ROOT / "prefect.yaml"
_PATHS = {"config_path", "dataset"}  # flow parameters that name files


def _flow(entrypoint: str, origin: Path) -> Flow:
    path, _, name = entrypoint.partition(":")
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    found = getattr(module, name, None)
    if not isinstance(found, Flow):
        msg = f"{origin}: entrypoint '{entrypoint}' is not a Prefect flow"
        raise ConfigError(msg)
    return found


def runner_deployments(path: Path = PREFECT_YAML, names: list[str] | None = None) -> list[RunnerDeployment]:
    """Build the deployments of prefect.yaml (or those named) for serve: same flows, parameters, schedules, limits."""
    try:
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        msg = f"{path}: cannot read the deployments: {exc}"
        raise ConfigError(msg) from None
    chosen = [d for d in spec.get("deployments") or [] if names is None or d["name"] in names]
    missing = sorted(set(names or []) - {d["name"] for d in chosen})
    if missing:
        msg = f"{path}: deployments: no deployment named {', '.join(missing)}"
        raise ConfigError(msg)
    out = []
    for d in chosen:
        limit = d.get("concurrency_limit")
        # Served flows run in this process, wherever it was started: relative paths mean the project's.
        parameters = {k: str(ROOT / v) if k in _PATHS and not Path(v).is_absolute() else v
                      for k, v in (d.get("parameters") or {}).items()}
        out.append(_flow(d["entrypoint"], path).to_deployment(
            name=d["name"], description=d.get("description"), parameters=parameters,
            schedules=[Cron(s["cron"], timezone=s.get("timezone", "UTC")) for s in d.get("schedules") or []],
            concurrency_limit=ConcurrencyLimitConfig(**limit) if isinstance(limit, dict) else limit,
            triggers=[DeploymentEventTrigger(**t) for t in d.get("triggers") or []]))
    return out
