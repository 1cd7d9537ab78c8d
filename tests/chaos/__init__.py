"""The chaos suite: every broker process as a real OS process on real PostgreSQL and
nats-server, a mixed workload, faults on a seeded schedule, and invariants checked at the end
(tests/chaos/test_chaos.py runs a small one; `python -m tests.chaos` any size)."""
