"""Engine hosting shared by both pools: typed messages, engine arguments, the host base class."""

from splitserve.engine.args import EngineSpec, engine_env, engine_kwargs, engine_spec
from splitserve.engine.messages import EngineStats, GenerateChunk, GenerateRequest, Sampling

__all__ = [
    "EngineSpec",
    "EngineStats",
    "GenerateChunk",
    "GenerateRequest",
    "Sampling",
    "engine_env",
    "engine_kwargs",
    "engine_spec",
]
