"""areal-engine-sglang: registers the ``sglang`` inference engine (``rollout.engine: sglang``).

Only "module:attr" strings here: discovery must not import SGLang or torch.
"""

from areal_core.api import hookimpl

AREAL_API = ">=1.0,<2"  # the areal_core.api versions this plugin supports


@hookimpl
def areal_register_inference_engines(register):
    register("sglang", "areal_engine_sglang.client:SGLangEngine")
