"""Record tests/fixtures/target-profile/tiny-seqs3-budget32.json: the probes' raw figures
of one `profile --target` run against our own server over the tiny model, with
max_num_seqs 3, max_num_batched_tokens 32 and prefix caching on (the harness's other
settings: 512 KV blocks of 16, max_model_len 256).

    PYTHONPATH=src python tests/profile/make_fixture.py
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "server"))

from server_harness import make_engine, serve  # noqa: E402

from stepserve.profile.target import TargetOptions, run_probes  # noqa: E402

OUT = HERE.parent / "fixtures" / "target-profile" / "tiny-seqs3-budget32.json"
TRUTH = {"max_num_seqs": 3, "max_num_batched_tokens": 32}


def main() -> None:
    with serve(make_engine(**TRUTH)) as served:
        figs = asyncio.run(run_probes(TargetOptions(served.url, budget_s=60)))
    # the URL's port is a free one of that run: kept, it names nothing now
    OUT.write_text(json.dumps(figs.to_json(), allow_nan=False, separators=(",", ":")))
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes, {len(figs.runs)} probe runs)")


if __name__ == "__main__":
    main()
