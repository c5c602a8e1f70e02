"""Stages as Prefect tasks: arguments reach the function as given, and Prefect does not walk into them."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect import flow

from runtime.stage import opaque_value, stage
from schemas.config import InletConfig, load_config

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "inlet.yaml"

pytestmark = pytest.mark.usefixtures("prefect_harness")


class CountingList(list):
    """A list that counts how often something iterates over it."""

    iterations = 0

    def __iter__(self):
        CountingList.iterations += 1
        return super().__iter__()


@stage("echo")
def echo(cfg: InletConfig, paths: list[str], name: str, count: int) -> tuple:
    """Return the arguments as the function received them."""
    return cfg, paths, name, count


def test_a_stage_receives_its_arguments_as_given():
    cfg = load_config(CONFIG)
    paths = CountingList(["a.parquet", "b.parquet"])

    @flow
    def run() -> tuple:
        return echo(cfg, paths, name="x", count=3)

    got_cfg, got_paths, name, count = run()
    assert got_cfg is cfg and got_paths is paths  # not annotations, not copies
    assert (name, count) == ("x", 3)


def test_prefect_does_not_walk_into_a_stages_arguments():
    # Prefect looks for futures inside every task argument, three passes a call, unless it is told not to: a
    # walk over an InletConfig was most of a stage call's overhead.
    paths = CountingList(["a.parquet"] * 100)
    CountingList.iterations = 0

    @flow
    def run() -> None:
        echo(load_config(CONFIG), paths, name="x", count=1)

    run()
    assert CountingList.iterations == 0


def test_scalars_are_passed_bare_and_everything_else_opaque():
    from prefect.utilities.annotations import opaque

    assert [opaque_value(v) for v in ("s", 1, 2.5, True, None)] == ["s", 1, 2.5, True, None]
    wrapped = opaque_value([1, 2])
    assert isinstance(wrapped, opaque) and wrapped.unwrap() == [1, 2]
