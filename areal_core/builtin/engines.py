"""Built-in inference engine: ``hf`` (a transformers generation server on 127.0.0.1)."""

from areal_core import hookimpl


@hookimpl
def areal_register_inference_engines(register):
    register("hf", "areal_core.builtin.engine_hf.client:HFEngine")
