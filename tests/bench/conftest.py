"""Fixtures of the benchmarks' tests: the tiny stand-in zoo (tests/bench/standins.py), registered
for real, in-process, once per session (bench.real_zoo)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import real_zoo as real
from bench.real_zoo import RealZoo
from tests.bench.standins import StandIn, image_model, text_model


@pytest.fixture(scope="session")
def standins(tmp_path_factory: pytest.TempPathFactory) -> list[StandIn]:
    root = tmp_path_factory.mktemp("standins")
    return [image_model(root / "image"), text_model(root / "text")]


@pytest.fixture(scope="session")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("state")


@pytest.fixture(scope="session")
def zoo(standins: list[StandIn], state_dir: Path) -> RealZoo:
    return real.real_zoo(built=standins, state_dir=state_dir, log=lambda line: None)
