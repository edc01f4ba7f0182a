"""Performance benchmarks of the platform, each measured side by side with its baseline in the same run.

``rollout bench`` (or ``python -m bench``) starts its own Kafka broker on free ports, runs every
benchmark against worker subprocesses with their own data folders, prints a table and writes
``docs/performance.md``. The pure parts (percentiles, rates, target evaluation, tables) live in
``bench.report`` and ``bench.measure``; everything that starts processes lives in the other modules.
"""
