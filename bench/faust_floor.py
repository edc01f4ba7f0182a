"""What Faust's stream costs by itself: the worker's agent shape with no work in its body.

The same Faust settings as the worker (``streams.app.create_app``'s consumer knobs), one agent
over the raw topics taking batches with ``take_events(batch_size, within=...)`` and doing
nothing with them. Its rate is the most any Faust-stream worker can reach on this machine with
this broker: the framework's per-message cost (conductor, channel queue, stream iteration, acks)
without validation, ClickHouse or derivation. Runs as its own process
(``python -m bench.faust_floor``) and prints (time, consumed) samples as JSON.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import faust

from bench.consumer_baseline import reader_parser
from streams.app import faust_broker_url


def run(*, bootstrap: str, topics: list[str], group: str, data_dir: Path, batch_size: int, within: float,
        expect: int, timeout: float) -> dict[str, Any]:
    """Consume ``expect`` messages with a no-op agent; return progress samples."""
    (data_dir / "faust").mkdir(parents=True, exist_ok=True)
    app = faust.App(
        group, broker=faust_broker_url(bootstrap), store="memory://", datadir=str(data_dir / "faust"),
        topic_allow_declare=False, consumer_auto_offset_reset="earliest", broker_commit_interval=1.0,
        broker_session_timeout=10.0, broker_heartbeat_interval=3.0, web_enabled=False,
    )
    topic = app.topic(*topics, key_serializer="raw", value_serializer="raw")
    state: dict[str, Any] = {"began": None, "consumed": 0, "samples": [(0.0, 0)], "error": None}

    @app.agent(topic, name="floor")
    async def floor(stream: Any) -> None:
        async for batch in stream.take_events(batch_size, within=within):
            if state["began"] is None:
                state["began"] = time.monotonic()
            state["consumed"] += len(batch)
            state["samples"].append((time.monotonic() - state["began"], state["consumed"]))

    async def main() -> None:
        await app.start()
        deadline = time.monotonic() + timeout
        try:
            while state["consumed"] < expect:
                if time.monotonic() > deadline:
                    state["error"] = f"consumed {state['consumed']} of {expect} in {timeout:.0f}s"
                    return
                await asyncio.sleep(0.05)
        finally:
            await app.stop()

    logging.disable(logging.WARNING)
    asyncio.run(main())
    if state["error"]:
        raise TimeoutError(state["error"])
    return {"samples": state["samples"], "consumed": state["consumed"]}


def main(argv: list[str] | None = None) -> int:
    """Command line: consume with a no-op agent, print the samples as JSON on stdout."""
    parser = reader_parser("bench.faust_floor", __doc__)
    parser.add_argument("--within", type=float, default=0.5)
    args = parser.parse_args(argv)
    result = run(bootstrap=args.bootstrap, topics=args.topics.split(","), group=args.group, data_dir=args.data_dir,
                 batch_size=args.batch_size, within=args.within, expect=args.expect, timeout=args.timeout)
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
