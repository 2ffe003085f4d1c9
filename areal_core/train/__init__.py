"""Training plane: FSDP2 engine, packing, chunked log-probs, worker processes."""
