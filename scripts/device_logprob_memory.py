"""Peak device memory of naive vs chunked per-token log-probs (forward + backward) on a platform.

    python scripts/device_logprob_memory.py cuda|npu

Used by scripts/device_check_{cuda,npu}.sh; prints one line per size with the naive/chunked ratio.
"""

from __future__ import annotations

import sys

import torch

from areal_core.active_platform import activate_platform, resolve_platform
from areal_core.plugins import load_plugins
from areal_core.train.logprobs import token_logprobs

SIZES = [(8192, 32768), (16384, 151936)]  # (tokens, vocab)


def peak_mib(platform, impl: str, n: int, vocab: int, hidden: int = 1024) -> float:
    dev = platform.device(0)
    generator = torch.Generator(device=dev).manual_seed(0)
    hid = (torch.randn(n, hidden, device=dev, generator=generator) / hidden**0.5).requires_grad_()
    weight = torch.randn(vocab, hidden, device=dev, generator=generator).requires_grad_()
    labels = torch.randint(0, vocab, (n,), device=dev, generator=generator)
    platform.synchronize()
    platform.empty_cache()
    getattr(torch, platform.device_type).reset_peak_memory_stats()
    base = platform.memory_stats()["allocated_bytes"]
    if impl == "naive":
        logprobs = (hid @ weight.T).float().log_softmax(-1).gather(-1, labels[:, None]).squeeze(-1)
    else:
        logprobs, _ = token_logprobs(hid, weight, labels, chunk_size=1024)
    logprobs.sum().backward()
    platform.synchronize()
    return (platform.memory_stats()["peak_bytes"] - base) / 2**20


def main() -> None:
    platform = activate_platform(resolve_platform(sys.argv[1], load_plugins()))
    platform.set_device(0)
    for n, vocab in SIZES:
        naive, chunked = peak_mib(platform, "naive", n, vocab), peak_mib(platform, "chunked", n, vocab)
        print(f"tokens {n} vocab {vocab}: naive {naive:.0f} MiB  chunked {chunked:.0f} MiB  ratio {naive / chunked:.1f}x")


if __name__ == "__main__":
    main()
