"""Built-in datasets: synthetic verifiable tasks and GSM8K-style JSONL files."""

from areal_core.api import hookimpl


@hookimpl
def areal_register_datasets(register):
    register("arith", "areal_core.builtin.datasets.synthetic:load_arith")
    register("reverse", "areal_core.builtin.datasets.synthetic:load_reverse")
    register("word_problems", "areal_core.builtin.datasets.synthetic:load_word_problems")
    register("gsm8k", "areal_core.builtin.datasets.gsm8k:load_gsm8k")
