"""What ktm does: one folder per pipeline, each with its task spec (`spec.py`), its driver side
(`driver.py`: plan, resume points, task specs) and its executor side (`executor.py`: where a
task reads and writes).

- relay: Kafka to Kafka, record batches moved whole (`ktm relay`)
- backup: Kafka to store segments; restore: segments to Kafka; compact: segments merged

`kafka_target.py` is the write side relay and restore share; `sources.py` the source pool relay
and backup share; `jobs.py` runs each long-running pipeline on the engine's runner
(relay.engine); docs/design.md says how to add one.
"""
