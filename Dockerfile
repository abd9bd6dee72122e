# splitserve image for Kubernetes (the Helm chart's Ray head and workers, KServe pods).
#
#   docker build -t REGISTRY/splitserve:0.1.0 .
#   docker push REGISTRY/splitserve:0.1.0
#   helm install splitserve helm/splitserve --set image.repository=REGISTRY/splitserve
#
# Base: vLLM's official CUDA image of the release splitserve pins (vllm 0.32.0, with PyTorch,
# CUDA and NCCL). On top: Ray with Serve (the RayService runs `ray start` in this image, so Ray's
# version must match the chart's rayVersion), NIXL for the KV transfer, and splitserve itself.
# The same image serves the KServe targets: the ServingRuntime runs `splitserve serve`, and an
# LLMInferenceService runs its vLLM.
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0
FROM ${VLLM_IMAGE}

# KubeRay's probes use wget; tini reaps the engine processes vLLM forks.
RUN apt-get update \
    && apt-get install -y --no-install-recommends wget tini \
    && rm -rf /var/lib/apt/lists/*

# Pinned like the project (pyproject.toml): Ray 2.60.0 with Serve, NIXL 1.5.1. vLLM and torch
# come from the base image and are not reinstalled.
RUN python3 -m pip install --no-cache-dir "ray[serve]==2.60.0" "nixl==1.5.1"
# The model-cache Job (`python -m splitserve.models.download`) copies s3:// and gs:// models with
# these clients (hub models go through huggingface_hub, which vLLM already brings).
RUN python3 -m pip install --no-cache-dir "boto3>=1.34" "google-cloud-storage>=2.16"

WORKDIR /opt/splitserve
COPY pyproject.toml README.md ./
COPY splitserve ./splitserve
COPY router ./router
COPY controller ./controller
COPY prefill_workers ./prefill_workers
COPY decode_workers ./decode_workers
COPY kv_transfer ./kv_transfer
# The project's own runtime dependencies (FastAPI, pydantic, ...) resolve against what the base
# image has; vLLM itself is not touched (no [gpu]/[cpu] extra here).
RUN python3 -m pip install --no-cache-dir . \
    && python3 -c "import vllm, ray, nixl; from ray import serve; import splitserve.app"

# Not root: the user `splitserve` (uid/gid 10001, the Helm chart's runAsUser/fsGroup) with a
# writable HOME, where Hugging Face downloads, the built-in tiny model and vLLM's and Triton's
# caches go (mount a volume at HF_HOME to keep models across pod restarts). Ray writes /tmp/ray.
RUN groupadd --gid 10001 splitserve \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/splitserve splitserve
ENV HOME=/home/splitserve \
    HF_HOME=/home/splitserve/.cache/huggingface \
    RAY_USAGE_STATS_ENABLED=0 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /home/splitserve

EXPOSE 8000 8080
# The base image's entrypoint is `vllm serve`; KubeRay and KServe set their own commands.
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["splitserve", "serve", "-c", "/etc/splitserve/config.yaml", "--host", "0.0.0.0"]
