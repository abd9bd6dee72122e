"""The GPU path: the same deployment on CUDA (CUDA build of vLLM, `pip install splitserve[gpu]`).

Skipped where no CUDA device is visible. Set SPLITSERVE_GPU_MODEL to a local model directory to
test a real model; otherwise the tiny model is served on the GPU.
"""

from __future__ import annotations

import os

import openai
import pytest

from tests.conftest import running_deployment, test_config

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("mode", ["colocated", "disaggregated"])
def test_gpu_deployment_answers(mode):
    overrides = {
        "mode": mode,
        "device": "cuda",
        "disaggregation.min_remote_prompt_tokens": 1,
        "disaggregation.prefill": "remote",  # the remote path, whatever the rule predicts
    }
    if os.environ.get("SPLITSERVE_GPU_MODEL"):
        overrides["model.path"] = os.environ["SPLITSERVE_GPU_MODEL"]
    cfg = test_config(**overrides)
    with running_deployment(cfg, device="cuda") as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        prompt = "The quick brown fox jumps over the lazy dog. " * 20
        whole = client.completions.create(
            model=cfg.model.name, prompt=prompt, max_tokens=16, temperature=0
        )
        streamed = "".join(
            c.choices[0].text
            for c in client.completions.create(
                model=cfg.model.name, prompt=prompt, max_tokens=16, temperature=0, stream=True
            )
            if c.choices
        )
        assert whole.usage.completion_tokens == 16
        assert streamed == whole.choices[0].text
