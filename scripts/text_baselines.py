#!/usr/bin/env python3
"""Bits per byte of byte-context models on tower-train's text split: the
figures a language model's held-out loss is compared with.

An order-k model predicts a byte from the k bytes before it, with counts from
the training split and additive smoothing (alpha), scored on the held-out
split exactly as `--data-format text` cuts it (the last 5% of the sequences).

    .venv/bin/python scripts/text_baselines.py [--data FILE] [--seq-len 128]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.data import text  # noqa: E402

SMOOTHING = {0: 1.0, 1: 0.1, 2: 0.01, 3: 0.01}


def bits_per_byte(train: np.ndarray, held_out: np.ndarray, order: int, alpha: float) -> float:
    """Held-out bits per byte of the order-`order` model fitted on `train`."""
    def contexts(data):
        key = np.zeros(len(data) - order, np.int64)
        for j in range(order):
            key = key * 256 + data[j:len(data) - order + j]
        return key, data[order:].astype(np.int64)

    context, following = contexts(train)
    pairs, pair_counts = np.unique(context * 256 + following, return_counts=True)
    seen, seen_counts = np.unique(context, return_counts=True)
    held_context, held_following = contexts(held_out)

    def count(table, counts, keys):
        at = np.minimum(np.searchsorted(table, keys), len(table) - 1)
        return np.where(table[at] == keys, counts[at], 0)

    numerator = count(pairs, pair_counts, held_context * 256 + held_following) + alpha
    denominator = count(seen, seen_counts, held_context) + 256 * alpha
    return float(-np.mean(np.log2(numerator / denominator)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None, help="a text file; default the stdlib corpus")
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    data = np.frombuffer(text.corpus(args.data), np.uint8)
    count = (len(data) - 1) // args.seq_len
    held = max(1, int(count * text.HELD_OUT))
    cut = (count - held) * args.seq_len
    train, held_out = data[:cut + 1], data[cut:count * args.seq_len + 1]
    print(f"{len(data):,} bytes; held out {len(held_out):,}")
    for order, alpha in SMOOTHING.items():
        bits = bits_per_byte(train, held_out, order, alpha)
        print(f"order {order} (alpha {alpha}): {bits:.2f} bits per byte "
              f"= loss {bits * np.log(2):.3f} nats")


if __name__ == "__main__":
    main()
