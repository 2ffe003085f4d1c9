# areal-core on Ascend NPUs: the vllm-ascend image (CANN, torch + torch_npu, vLLM + vllm-ascend)
# plus this repository's wheels. The tag must match the host's NPU driver/firmware (see the
# vllm-ascend release matrix) and carry vLLM >= 0.32, which areal-engine-vllm is written against.
# Build the wheels into dist/ first; docs/ascend.md ("Container") has the build and run lines.
# Not buildable on the dev machine (no Docker engine there); tests/test_docker.py lints it.
ARG VLLM_ASCEND_TAG=v0.32.0rc1
FROM quay.io/ascend/vllm-ascend:${VLLM_ASCEND_TAG}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# areal-core[npu]: the core, its default weight path, the NPU platform, the vLLM engine (served by
# vllm-ascend) and HCCL weight updates; nothing of the Ascend stack is reinstalled.
COPY dist/areal_core-*.whl dist/areal_reshard_disk-*.whl dist/areal_platform_npu-*.whl \
     dist/areal_engine_vllm-*.whl dist/areal_reshard_xccl-*.whl /tmp/areal-wheels/
RUN python3 -m pip install --no-cache-dir /tmp/areal-wheels/*.whl \
    && rm -rf /tmp/areal-wheels \
    && areal plugins

WORKDIR /workspace
# CANN's environment (ASCEND_HOME_PATH, library paths) is set by its set_env scripts, which the
# image sources only in interactive shells; areal's npu platform needs it.
ENTRYPOINT ["/bin/bash", "-c", "source /usr/local/Ascend/ascend-toolkit/set_env.sh && if [ -f /usr/local/Ascend/nnal/atb/set_env.sh ]; then source /usr/local/Ascend/nnal/atb/set_env.sh; fi && exec areal \"$@\"", "areal"]
# GSM8K with Qwen3-0.6B on NPUs 0 (server) and 1 (trainer). Runs go to /workspace/runs.
CMD ["run", "--example", "gsm8k-npu"]
