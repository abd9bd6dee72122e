"""Shared test helpers: start a real Ray cluster and a splitserve deployment once per module."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from splitserve.config import SplitserveConfig, load_config

# Two cores on CI: cap Ray's object store and let every engine have one core of its own.
OBJECT_STORE_BYTES = 128 * 2**20


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base_url: str, timeout_s: float = 300, proc: Any = None) -> None:
    """Poll /health until every pool answers (status `ok`: every engine loaded; 200 alone may
    be `degraded`, with a prefill pool still short) or fail the test. `proc`: the server's
    process, when the test started one: its exit fails the test at once, not at the timeout."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the server exited with status {proc.returncode} before it was healthy")
        try:
            r = httpx.get(f"{base_url}/health", timeout=5)
            if r.status_code == 200 and r.json().get("status") == "ok":
                return
            last = r.text
        except httpx.HTTPError as err:
            last = repr(err)
        time.sleep(1)
    pytest.fail(f"deployment not healthy after {timeout_s}s: {last}")


@contextlib.contextmanager
def _deploy(cfg: SplitserveConfig, device: str) -> Iterator[str]:
    """Start Ray in this process, deploy `cfg`, yield the base URL; tear everything down after."""
    import ray
    from ray import serve

    from splitserve.app import build_app, serve_run_options
    from splitserve.ingress import cluster_env_of, start_serve
    from splitserve.launcher import init_local_ray
    from splitserve.models import build_tiny_model

    build_tiny_model()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    options = {"num_cpus": 2 if device == "cpu" else None,
               "object_store_memory": OBJECT_STORE_BYTES, "include_dashboard": False,
               "log_to_driver": False, "namespace": "splitserve-tests"}
    with cluster_env_of(cfg):
        init_local_ray(**options)  # retried once when the raylet missed Ray's fixed 30 s wait
    try:
        start_serve(cfg.router.host, cfg.router.port)
        serve.run(build_app(cfg, device, kv_host="127.0.0.1"), **serve_run_options(cfg))
        base = f"http://{cfg.router.host}:{cfg.router.port}"
        wait_healthy(base)
        yield base
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()


class _Shared:
    """The deployment `shared_deployment` left running: its config key, URL and teardown."""

    key: str | None = None
    base: str = ""
    stack: contextlib.ExitStack | None = None


def _deployment_key(cfg: SplitserveConfig, device: str) -> str:
    data = cfg.model_dump(mode="json")
    data["router"].pop("port", None)  # every test config gets a free port: not a difference
    return json.dumps([device, data], sort_keys=True)


def close_shared_deployment() -> None:
    """Tear down the deployment `shared_deployment` left running, if any."""
    stack, _Shared.stack, _Shared.key = _Shared.stack, None, None
    if stack is not None:
        stack.close()


@contextlib.contextmanager
def running_deployment(cfg: SplitserveConfig, device: str = "cpu") -> Iterator[str]:
    """Start Ray in this process, deploy `cfg`, yield the base URL; tear everything down after.

    A module whose tests change the deployment (kill replicas, scale pools, inject faults) uses
    this: it gets a cluster of its own."""
    close_shared_deployment()  # one Ray cluster per process
    with _deploy(cfg, device) as base:
        yield base


@contextlib.contextmanager
def shared_deployment(cfg: SplitserveConfig, device: str = "cpu") -> Iterator[str]:
    """Like `running_deployment`, for modules that only send requests: the deployment stays up
    after the block, and the next module asking for the same config (the port aside) gets it
    instead of a new cluster. Each start of Ray and two engines costs a minute or more on two
    cores. Tests on a shared deployment must not assume fresh counters or caches: they compare
    metrics before and after their own requests. Torn down by the next other deployment or at
    the end of the session (`tests/e2e/conftest.py` orders the modules that share)."""
    key = _deployment_key(cfg, device)
    if _Shared.key != key:
        close_shared_deployment()
        stack = contextlib.ExitStack()
        _Shared.base = stack.enter_context(_deploy(cfg, device))
        _Shared.key, _Shared.stack = key, stack
    yield _Shared.base


def trace_of(path: str, response_id: str, root: str = "POST /v1/completions",
             timeout_s: float = 30) -> list[dict]:
    """The spans in span file `path` of the trace whose `root` span answered `response_id`
    (the root span is written when the response stream closes, which may be just after the
    client saw its end)."""
    from splitserve.router import tracing as tr
    from splitserve.router.span_file import read_spans

    deadline = time.monotonic() + timeout_s
    while True:
        spans = read_spans(path)
        roots = [s for s in spans if s["name"] == root
                 and s["attributes"].get(tr.GENAI_RESPONSE_ID) == response_id]
        if roots or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(roots) == 1, f"no single root span for {response_id}"
    return [s for s in spans if s["trace_id"] == roots[0]["trace_id"]]


def pool_stats(pool: str):
    """Engine stats (`EngineStats`) of pool `pool` of the running `splitserve` application."""
    from ray import serve

    return serve.get_deployment_handle(pool, app_name="splitserve").stats.remote().result()


def disagg_reasons(base_url: str) -> dict[str, float]:
    """The router's conditional-disaggregation decisions so far, by reason (its /metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    return {
        s.labels["reason"]: s.value
        for family in text_string_to_metric_families(text) for s in family.samples
        if s.name == "splitserve_disagg_reasons_total"
    }


async def decoding_stream(client, model: str, chunks: int = 1):
    """A long greedy stream (1500 tokens, short prompt: decoded on the decode worker), read
    until `chunks` text chunks have arrived; close it when done with it."""
    stream = await client.completions.create(
        model=model, prompt="a stream that keeps the decode worker busy", max_tokens=1500,
        temperature=0, stream=True, extra_body={"min_tokens": 1500},
    )
    seen = 0
    async for chunk in stream:
        seen += bool(chunk.choices and chunk.choices[0].text)
        if seen >= chunks:
            break
    return stream


def pools_at_rest(
    pools: tuple[str, ...] = ("prefill", "decode"), timeout_s: float = 120.0
) -> dict[str, tuple[int, float]]:
    """Each pool's (unfinished requests, KV cache usage), polled until every pool holds no
    request and no KV block or `timeout_s` has passed (the default outlasts the NIXL abort
    timeout that frees a prefill's unfetched blocks)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = {pool: pool_stats(pool) for pool in pools}
        rest = {p: (s.num_unfinished, s.kv_cache_usage) for p, s in stats.items()}
        if all(r == (0, 0.0) for r in rest.values()) or time.monotonic() > deadline:
            return rest
        time.sleep(2)


def direct_greedy(
    prompt_ids: list[int], max_tokens: int, *, fresh_cache: bool = False,
    deployment: str = "decode", lora=None, ignore_eos: bool = False,
) -> list[int]:
    """Greedy token ids from the decode pool's engine called directly through its Serve handle,
    bypassing the router: the reference that router and disaggregated outputs are compared with.

    `fresh_cache` drops the engine's prefix cache first, so that the reference recomputes the
    prompt instead of reusing KV that an earlier (e.g. NIXL-delivered) request left behind.
    `deployment`: the pool deployment to call (several-model configs name one per model);
    `lora`: a `LoraRef` to run the request with; `ignore_eos`: generate all `max_tokens`.
    """
    import asyncio
    import uuid

    from ray import serve

    from splitserve.engine.messages import GenerateRequest

    async def run() -> list[int]:
        handle = serve.get_deployment_handle(deployment, app_name="splitserve")
        if fresh_cache:
            await handle.reset_prefix_cache.remote()
        req = GenerateRequest.completion(f"direct-{uuid.uuid4().hex}", prompt_ids, max_tokens,
                                         lora=lora, ignore_eos=ignore_eos)
        out: list[int] = []
        async for chunk in handle.options(stream=True).generate.remote(req):
            out.extend(chunk.token_ids)
        return out

    return asyncio.run(run())


def test_config(**overrides) -> SplitserveConfig:
    """The default config on a free port, with dotted overrides."""
    return load_config(None).with_overrides(**{"router.port": free_port(), **overrides})


test_config.__test__ = False  # a helper, not a test


async def stream_token_ids(
    client, ids: list[int], max_tokens: int, *, model: str = "splitserve-tiny", on_tokens=None
) -> list[int]:
    """Greedy token ids of one streamed completion through the router (the real `openai`
    client, `return_token_ids`); `on_tokens(new_ids)` sees each chunk's ids as they arrive."""
    got: list[int] = []
    stream = await client.completions.create(
        model=model, prompt=ids, max_tokens=max_tokens, temperature=0, stream=True,
        extra_body={"return_token_ids": True},
    )
    async for chunk in stream:
        if chunk.choices:
            new = chunk.choices[0].model_extra.get("token_ids") or []
            got += new
            if on_tokens is not None:
                on_tokens(new)
    return got


# Modules that take their deployment from `shared_deployment`, in the order they run (first in
# the session, so that consecutive ones find the config they need already up): test_api and
# test_bench use the default colocated config, test_params that one and then the disaggregated
# config of test_disaggregated, test_vllm_compat that one and then a colocated one.
SHARING_MODULES = ("e2e/test_api.py", "e2e/test_bench.py", "e2e/test_params.py",
                   "e2e/test_disaggregated.py", "e2e/test_vllm_compat.py")


def _module_name(path) -> str:
    return f"{path.parent.name}/{path.name}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the SHARING_MODULES first, in their order; everything else keeps its order."""
    def key(pair: tuple[int, pytest.Item]) -> tuple[int, int]:
        index, item = pair
        name = _module_name(item.path)
        return (0, SHARING_MODULES.index(name)) if name in SHARING_MODULES else (1, index)

    items[:] = [item for _, item in sorted(enumerate(items), key=key)]


@pytest.fixture(scope="session", autouse=True)
def _shared_deployment_session() -> Iterator[None]:
    """Stop the shared deployment, if one is left, at the end of the session."""
    yield
    close_shared_deployment()


@pytest.fixture(scope="module", autouse=True)
def _shared_deployment_scope(request: pytest.FixtureRequest) -> None:
    """Stop a shared deployment before a module that does not share one: its engines would only
    take memory, and test_serve_cli starts clusters of its own."""
    if _module_name(request.path) not in SHARING_MODULES:
        close_shared_deployment()
