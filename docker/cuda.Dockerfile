# areal-core on NVIDIA GPUs: vLLM's CUDA image (the vLLM areal-engine-vllm[cuda] pins) plus this
# repository's wheels. Build the wheels into dist/ first; docs/cuda.md has the build and run lines.
# Not buildable on the dev machine (no Docker engine there); tests/test_docker.py lints it.
FROM vllm/vllm-openai:v0.32.0

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# areal-core[cuda]: the core, its default weight path, the CUDA platform, NCCL weight updates and
# the vLLM engine; vLLM and its CUDA torch come with the image and are kept as they are.
COPY dist/areal_core-*.whl dist/areal_reshard_disk-*.whl dist/areal_platform_cuda-*.whl \
     dist/areal_reshard_xccl-*.whl dist/areal_engine_vllm-*.whl /tmp/areal-wheels/
RUN python3 -m pip install --no-cache-dir /tmp/areal-wheels/*.whl \
    && rm -rf /tmp/areal-wheels \
    && areal plugins

WORKDIR /workspace
ENTRYPOINT ["areal"]
# GSM8K with Qwen3-0.6B on GPUs 0 (server) and 1 (trainer); the packaged config serves with SGLang,
# this image with vLLM. Runs go to /workspace/runs: mount a host directory there.
CMD ["run", "--example", "gsm8k-cuda", "rollout.engine=vllm"]
