"""areal-engine-vllm: registers the ``vllm`` inference engine (``rollout.engine: vllm``).

Only "module:attr" strings here: discovery must not import vLLM or torch.
"""

from areal_core.api import hookimpl

AREAL_API = ">=1.0,<2"  # the areal_core.api versions this plugin supports


@hookimpl
def areal_register_inference_engines(register):
    register("vllm", "areal_engine_vllm.client:VLLMEngine")

