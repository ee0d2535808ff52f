"""64 concurrent streaming clients: every token arrives, in order, and the counts match
`usage`; the texts equal the offline engine's for the same greedy requests."""

from __future__ import annotations

import asyncio

from server_harness import MODEL

from stepserve.core.request import SamplingParams

N_CLIENTS = 64


def _jobs():
    words = ["fox", "Paris", "step", "batch", "queue", "token", "cache", "Rome"]
    return [(f"{words[i % 8]} number {i} is", 8 + (i * 7) % 33) for i in range(N_CLIENTS)]


async def _one(client, prompt: str, max_tokens: int, chat: bool):
    kw = dict(model=MODEL, max_tokens=max_tokens, temperature=0.0, stream=True,
              stream_options={"include_usage": True, "continuous_usage_stats": True},
              extra_body={"ignore_eos": True})
    if chat:
        stream = await client.chat.completions.create(
            messages=[{"role": "user", "content": prompt}], **kw)
    else:
        stream = await client.completions.create(prompt=prompt, **kw)
    pieces, counts, usage = [], [], None
    async for chunk in stream:
        if chunk.choices:
            c = chunk.choices[0]
            piece = (c.delta.content or "") if chat else c.text
            pieces.append(piece)
            counts.append(chunk.usage.completion_tokens)
        else:
            usage = chunk.usage
    return "".join(pieces), counts, usage


def test_64_concurrent_streams(served, offline_llm):
    jobs = _jobs()
    chat = [i % 2 == 1 for i in range(N_CLIENTS)]

    async def run_all():
        client = served.async_client(timeout=120)
        try:
            return await asyncio.gather(*(_one(client, p, m, c)
                                          for (p, m), c in zip(jobs, chat)))
        finally:
            await client.close()

    results = asyncio.run(run_all())
    tok = offline_llm.tokenizer
    prompts = [{"prompt_token_ids": tok.encode_chat([{"role": "user", "content": p}])}
               if c else p for (p, _), c in zip(jobs, chat)]
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for _, m in jobs]
    offline = offline_llm.generate(prompts, params, use_tqdm=False)
    for (text, counts, usage), (_, max_tokens), want in zip(results, jobs, offline):
        assert text == want.outputs[0].text  # every piece, in order
        assert usage.completion_tokens == max_tokens == len(want.outputs[0].token_ids)
        assert usage.prompt_tokens == len(want.prompt_token_ids)
        assert counts == sorted(counts) and counts[-1] == max_tokens
    served.wait_idle()
    m = served.metrics()
    assert m["stepserve:num_gpu_blocks_used"] == 0
    assert m["stepserve:num_sequences_active"] >= 0
