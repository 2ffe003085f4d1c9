"""Peak memory and time of naive vs chunked per-token log-probs, forward + backward, on CPU.

    python bench/logprob_memory.py [--hidden 128] [--chunk-size 1024] [--threads 2]

Memory method: every (implementation, tokens, vocab) case runs in a fresh Python subprocess. It
allocates its inputs, runs a tiny warm-up (loads kernels), reads ``ru_maxrss`` as the baseline,
runs one forward + backward and reads ``ru_maxrss`` again; the difference is the extra peak
resident memory the computation needed. Fresh processes keep one case's high-water mark from
hiding the next, and RSS sees every allocation torch makes (torch's CPU allocator does not cache
and large blocks are mmap'd, so freed memory leaves the process). Time is wall time of that one
forward + backward.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

CASES = [(2048, 8192), (4096, 8192), (8192, 8192), (2048, 32768), (4096, 32768), (8192, 32768)]


def naive_token_logprobs(hidden, weight, labels):
    """Reference: the full ``[N, V]`` log-softmax in fp32."""
    logits = hidden.float() @ weight.float().T
    return logits.log_softmax(-1).gather(-1, labels[:, None]).squeeze(-1)


def _run_case(impl: str, tokens: int, vocab: int, hidden_size: int, chunk_size: int, threads: int) -> dict:
    import torch

    from areal_core.train.logprobs import token_logprobs

    torch.set_num_threads(threads)

    def step(h, w, y, a):
        if impl == "naive":
            logp = naive_token_logprobs(h, w, y)
        else:
            logp, _ = token_logprobs(h, w, y, chunk_size=chunk_size)
        (logp * a).sum().backward()

    g = torch.Generator().manual_seed(0)
    small = [torch.randn(8, hidden_size, requires_grad=True), torch.randn(16, hidden_size, requires_grad=True)]
    step(*small, torch.randint(0, 16, (8,)), torch.ones(8))  # warm-up on tiny inputs
    hidden = (torch.randn(tokens, hidden_size, generator=g) / hidden_size**0.5).requires_grad_()
    weight = torch.randn(vocab, hidden_size, generator=g).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), generator=g)
    coeff = torch.randn(tokens, generator=g)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    start = time.perf_counter()
    step(hidden, weight, labels, coeff)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_mib": (peak - base) / 1024, "seconds": seconds}


def _case_in_subprocess(impl: str, tokens: int, vocab: int, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--case", impl, str(tokens), str(vocab)]
    cmd += ["--hidden", str(args.hidden), "--chunk-size", str(args.chunk_size), "--threads", str(args.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--chunk-size", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--case", nargs=3, metavar=("IMPL", "TOKENS", "VOCAB"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        impl, tokens, vocab = args.case[0], int(args.case[1]), int(args.case[2])
        print(json.dumps(_run_case(impl, tokens, vocab, args.hidden, args.chunk_size, args.threads)))
        return

    print(f"fp32 forward+backward, hidden={args.hidden}, chunk_size={args.chunk_size}, threads={args.threads}")
    print("extra peak RSS over inputs (fresh process per case)")
    header = f"{'tokens':>6} {'vocab':>6} | {'naive MiB':>9} {'chunk MiB':>9} {'ratio':>6} |"
    header += f" {'naive s':>7} {'chunk s':>7}"
    print(header)
    print("-" * len(header))
    for tokens, vocab in CASES:
        naive = _case_in_subprocess("naive", tokens, vocab, args)
        chunked = _case_in_subprocess("chunked", tokens, vocab, args)
        ratio = chunked["peak_mib"] / naive["peak_mib"]
        print(
            f"{tokens:>6} {vocab:>6} | {naive['peak_mib']:>9.0f} {chunked['peak_mib']:>9.0f} {ratio:>6.1%} |"
            f" {naive['seconds']:>7.2f} {chunked['seconds']:>7.2f}"
        )


if __name__ == "__main__":
    main()
