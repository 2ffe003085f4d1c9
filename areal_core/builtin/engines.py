"""Built-in inference engine: ``hf`` (a transformers generation server on its node's address)."""

from areal_core import hookimpl


@hookimpl
def areal_register_inference_engines(register):
    register("hf", "areal_core.hf_engine.client:HFEngine")
