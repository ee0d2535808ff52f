"""Streaming detokenization per token: `tokenizers`' DecodeStream (what the engine uses,
model/tokenizer.IncrementalDetokenizer) against our Python prefix/read-offset window
(model/tokenizer.WindowDetokenizer), side by side on the same token streams.

Each text is tokenized with the model's tokenizer, then fed one id at a time to a fresh
detokenizer seeded with a short prompt, as the engine does for every generated token.
Time per token is the best of `--rounds` alternating passes (other load on the machine
only slows a pass down). Before timing, every stream's deltas are compared: both must
give the same delta for every token, and their concatenation must equal decoding the
ids at once, with skip_special_tokens on and off.

    python benchmarks/detok.py --model default --json detok.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

PROSE = ("The scheduler admits waiting requests while the KV cache has free blocks. When a "
         "running request needs a block and none is free, the newest request is preempted: "
         "its blocks are freed and it is recomputed later. Throughput rises with batch size "
         "until the step becomes compute-bound; after that, latency grows instead. ")
MULTIBYTE = ("Grüße aus Köln — naïve café, crème brûlée, Ångström. 東京の天気は晴れです。"
             "中文字符也要正确显示。한국어 문장도 있습니다. Ελληνικά, русский текст, עברית, "
             "emoji 🎉👍🏽🙂🚀 and a flag 🇫🇷, maths ∑∫√∞ ≤ ≥. ")
CODE = ("def attention(q, k, v, scale):\n    scores = (q @ k.T) * scale  # [T, T]\n"
        "    return softmax(scores, dim=-1) @ v\n\n\tif x != None:\n\t\tprint(f'{x!r:>10}')\n")
CHAT = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "Translate 'good morning' into Japanese.<|im_end|>\n<|im_start|>assistant\n"
        "おはようございます (ohayō gozaimasu) 🌅<|im_end|>\n<|endoftext|>")
TEXTS = {"english prose": PROSE, "multi-byte UTF-8": MULTIBYTE, "code": CODE,
         "chat + special tokens": CHAT}
PROMPT = "Answer the question below.\n"


def load(model: str):
    from stepserve.model.presets import resolve_model
    from stepserve.model.tokenizer import Tokenizer

    return Tokenizer(resolve_model(model))


def streams(tok, repeat: int) -> dict[str, list[int]]:
    return {name: tok.encode(text * repeat, add_special_tokens=False)
            for name, text in TEXTS.items()}


def deltas(kind, tok, prompt: list[int], ids: list[int], skip: bool) -> list[str]:
    detok = kind(tok, prompt, skip)
    return [detok.add(i) for i in ids]


def check_same(tok, prompt: list[int], ids: list[int]) -> None:
    """Raise if the two give different deltas or text on one stream."""
    from stepserve.model.tokenizer import IncrementalDetokenizer, WindowDetokenizer

    for skip in (True, False):
        ours = deltas(WindowDetokenizer, tok, prompt, ids, skip)
        stream = deltas(IncrementalDetokenizer, tok, prompt, ids, skip)
        whole = tok.decode(ids, skip_special_tokens=skip)
        if ours != stream or "".join(stream) != whole:
            raise SystemExit(f"detokenizers differ (skip_special_tokens={skip}) on "
                             f"{tok.decode(ids[:20])!r}...")


def time_per_token(kind, tok, prompt: list[int], ids: list[int], skip: bool) -> float:
    detok = kind(tok, prompt, skip)
    start = time.perf_counter()
    for i in ids:
        detok.add(i)
    return (time.perf_counter() - start) / len(ids)


def measure(tok, ids_by_text: dict[str, list[int]], rounds: int) -> list[dict]:
    from stepserve.model.tokenizer import IncrementalDetokenizer, WindowDetokenizer

    prompt = tok.encode(PROMPT, add_special_tokens=False)
    kinds = {"python window": WindowDetokenizer, "DecodeStream": IncrementalDetokenizer}
    rows = []
    for name, ids in ids_by_text.items():
        check_same(tok, prompt, ids)
        for skip in (True, False):
            best = {k: float("inf") for k in kinds}
            for r in range(rounds):
                order = list(kinds) if r % 2 == 0 else list(reversed(kinds))
                for k in order:
                    best[k] = min(best[k], time_per_token(kinds[k], tok, prompt, ids, skip))
            rows.append({"text": name, "skip_special_tokens": skip, "tokens": len(ids),
                         "window_us": best["python window"] * 1e6,
                         "decodestream_us": best["DecodeStream"] * 1e6,
                         "speedup": best["python window"] / best["DecodeStream"]})
    return rows


def print_table(rows: list[dict], model: str, rounds: int) -> None:
    print(f"\nmodel {model}'s tokenizer, best of {rounds} rounds, microseconds per token "
          "(deltas identical on every stream)\n")
    print(f"{'text':<24}{'skip':>6}{'tokens':>8}{'window us':>11}{'DecodeStream us':>17}"
          f"{'window/DS':>11}")
    for r in rows:
        print(f"{r['text']:<24}{str(r['skip_special_tokens']):>6}{r['tokens']:>8}"
              f"{r['window_us']:>11.2f}{r['decodestream_us']:>17.2f}{r['speedup']:>10.1f}x")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default", help="model name or directory")
    p.add_argument("--repeat", type=int, default=20, help="copies of each text in a stream")
    p.add_argument("--rounds", type=int, default=5, help="alternating timed passes")
    p.add_argument("--json", metavar="OUT", help="also write every number as JSON")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from stepserve.model.tokenizer import DecodeStream

    if DecodeStream is None:
        raise SystemExit("this tokenizers has no DecodeStream (needs >= 0.21)")
    tok = load(args.model)
    rows = measure(tok, streams(tok, args.repeat), args.rounds)
    print_table(rows, args.model, args.rounds)
    if args.json:
        out = Path(args.json)
        out.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
