"""The task runner a run's batches go to, chosen by the config's execution section."""

from __future__ import annotations

from prefect.task_runners import ProcessPoolTaskRunner, TaskRunner, ThreadPoolTaskRunner

from schemas.config import ExecutionConfig


def make_task_runner(cfg: ExecutionConfig) -> TaskRunner:
    """Build the runner: threads of this process, processes of this machine, or a Dask cluster."""
    if cfg.task_runner == "thread":
        return ThreadPoolTaskRunner(max_workers=cfg.workers)
    if cfg.task_runner == "process":
        return ProcessPoolTaskRunner(max_workers=cfg.workers)
    import dask
    from prefect_dask import DaskTaskRunner

    if cfg.dask_address is not None:
        return DaskTaskRunner(address=cfg.dask_address)
    # Non-daemonic workers, so that a batch can start its extraction processes (and keep their time limit).
    dask.config.set({"distributed.worker.daemon": False})
    return DaskTaskRunner(cluster_kwargs={"n_workers": cfg.workers, "threads_per_worker": 1, "processes": True,
                                          "dashboard_address": None})
