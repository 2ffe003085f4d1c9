"""The built-in ``hf`` inference engine: a transformers generation server and its client.

``server`` is the process (``python -m areal_core.builtin.engine_hf.server``), ``generator`` batches
and decodes, ``client`` is :class:`HFEngine`, ``receiver`` and ``channel`` the two halves of its
weight channel. The JSON bodies live in :mod:`areal_core.api.wire`, shared with every engine.
"""

from areal_core.api import hookimpl


@hookimpl
def areal_register_inference_engines(register):
    register("hf", "areal_core.builtin.engine_hf.client:HFEngine")
