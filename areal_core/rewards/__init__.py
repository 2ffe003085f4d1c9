"""Built-in reward functions, registered by :mod:`areal_core.builtin.rewards`.

- :mod:`areal_core.builtin.rewards.math`: final-answer equivalence via ``math-verify`` (GSM8K, MATH);
- :mod:`areal_core.builtin.rewards.synthetic`: exact match for the synthetic ``arith``/``reverse`` tasks.
"""
