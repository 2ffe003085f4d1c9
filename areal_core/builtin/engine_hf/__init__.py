"""The built-in ``hf`` inference engine: a transformers generation server and its client.

``server`` is the process (``python -m areal_core.builtin.engine_hf.server``), ``generator`` batches and
decodes, ``client`` is :class:`HFEngine`, ``protocol`` holds the JSON bodies both sides share and
``bucket`` the flat-bucket layout of collective weight updates.
"""
