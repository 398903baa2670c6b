"""Where and how computation runs: devices, the fast path (bf16, channels_last, compile), processes."""
