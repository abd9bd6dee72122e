"""The vLLM general plugin: registered as an entry point, and it turns NIXL's zero
progress-thread delay into `PROGRESS_DELAY_US` on the real NIXL bindings."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
from splitserve.engine import vllm_plugin


def test_registered_as_a_vllm_general_plugin() -> None:
    eps = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert eps.get("splitserve") == "splitserve.engine.vllm_plugin:register"


def test_zero_progress_delay_is_replaced_and_everything_else_passes_through() -> None:
    mod = vllm_plugin.nixl_api_module()
    if mod is None:
        pytest.skip("NIXL is not installed")
    assert vllm_plugin.patch_nixl_progress_delay() is True
    assert vllm_plugin.patch_nixl_progress_delay() is True  # idempotent: no double wrapping
    assert not isinstance(mod.nixlBind._real, vllm_plugin._BindingsWithDelay)
    cfg = mod.nixlBind.nixlAgentConfig()
    cfg.pthrDelay = 0  # what nixl_agent.__init__ does
    cfg.lthrDelay = 100_000
    assert cfg.real.pthrDelay == vllm_plugin.PROGRESS_DELAY_US
    assert cfg.real.lthrDelay == 100_000
    cfg.pthrDelay = 7  # a deliberate non-zero delay is kept
    assert cfg.real.pthrDelay == 7
    assert mod.nixlBind.DRAM_SEG is mod.nixlBind._real.DRAM_SEG


def test_an_agent_starts_with_the_patch() -> None:
    mod = vllm_plugin.nixl_api_module()
    if mod is None:
        pytest.skip("NIXL is not installed")
    vllm_plugin.register()
    agent = mod.nixl_agent("splitserve-plugin-test", mod.nixl_agent_config(num_threads=1))
    assert "UCX" in agent.backends
