"""scripts/probe_background.py's arguments and what it freezes (its measurement needs servers:
it is a benchmark, run by hand)."""

from __future__ import annotations

import os

import pytest

from tests.scripts import load_script

probe = load_script("probe_background")


def test_one_of_tree_and_freeze_only_is_required() -> None:
    base = ["--url", "http://127.0.0.1:1", "--model", "m"]
    with pytest.raises(SystemExit):
        probe.parse_args(base)
    with pytest.raises(SystemExit):
        probe.parse_args([*base, "--tree", "1", "--freeze-only", "2"])


def test_freeze_only_names_the_pids() -> None:
    args = probe.parse_args(["--url", "u", "--model", "m", "--freeze-only", "12,34,"])
    assert probe.frozen_pids(args) == [12, 34]


def test_a_tree_is_its_root_and_every_process_below() -> None:
    args = probe.parse_args(["--url", "u", "--model", "m", "--tree", str(os.getppid())])
    pids = probe.frozen_pids(args)
    assert os.getppid() in pids and os.getpid() in pids
