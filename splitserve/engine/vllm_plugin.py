"""splitserve's vLLM general plugin: loaded by vLLM in every engine process it starts.

Registered as the `vllm.general_plugins` entry point `splitserve` (pyproject.toml), so vLLM
runs `register()` in the API process, the EngineCore and every worker process, before the
KV connector creates its NIXL agent.

What it does: NIXL's Python API creates each agent with a progress-thread delay of 0
(`nixl._api.nixl_agent.__init__` sets `pthrDelay = 0`). The UCX backend's shared progress thread
then polls with a zero timeout and spins: measured here, an idle agent holds 86 % of a core,
in every engine worker, on the core that the worker computes on. With a delay, the thread
waits in `epoll` (it still wakes on every socket event) and an idle agent uses 2 %. vLLM gives
no setting for it, so the plugin substitutes `PROGRESS_DELAY_US` for a zero delay.

It also installs per-request KV-transfer telemetry (`kv_telemetry`): the connector's measured
duration and bytes of each transfer, tagged with the request they belong to.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from splitserve.engine import kv_telemetry

log = logging.getLogger("splitserve.engine")

# Microseconds NIXL's progress thread waits for events when idle. 100 us: idle CPU 2 % (vs 86 %
# at 0) and well under a decode step, so a transfer never waits noticeably for progress.
PROGRESS_DELAY_US = 100


class _AgentConfig:
    """A `nixlAgentConfig` whose zero progress-thread delay becomes `PROGRESS_DELAY_US`."""

    def __init__(self, real: Any) -> None:
        object.__setattr__(self, "real", real)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "pthrDelay" and value == 0:
            value = PROGRESS_DELAY_US
        setattr(self.real, name, value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class _BindingsWithDelay:
    """Stands in for the `nixlBind` module inside `nixl._api`: everything passes through,
    except that agent configs are `_AgentConfig`s and agents get the real config."""

    splitserve_patched = True

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def nixlAgentConfig(self) -> _AgentConfig:
        """A fresh agent config, wrapped."""
        return _AgentConfig(self._real.nixlAgentConfig())

    def nixlAgent(self, name: str, config: Any) -> Any:
        """The real agent, from the real config."""
        real = config.real if isinstance(config, _AgentConfig) else config
        return self._real.nixlAgent(name, real)


def nixl_api_module() -> Any | None:
    """The module that defines `nixl_agent` (nixl re-exports it from a CUDA-flavoured
    package), or None when NIXL is not installed."""
    try:
        from nixl._api import nixl_agent
    except ImportError:
        return None
    return sys.modules[nixl_agent.__module__]


def patch_nixl_progress_delay() -> bool:
    """Install the delay substitution (idempotent); False when NIXL is absent."""
    mod = nixl_api_module()
    if mod is None or not hasattr(mod, "nixlBind"):
        return False
    if not getattr(mod.nixlBind, "splitserve_patched", False):
        mod.nixlBind = _BindingsWithDelay(mod.nixlBind)
        log.debug("NIXL progress-thread delay set to %d us", PROGRESS_DELAY_US)
    return True


def register() -> None:
    """vLLM general-plugin entry point: runs in every vLLM process, possibly several times."""
    patch_nixl_progress_delay()
    kv_telemetry.install()
