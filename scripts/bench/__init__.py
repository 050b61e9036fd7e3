"""ktm's benchmark: ktm against the relay loop every team writes, on local Tansu brokers.

Run from the repository root, in ktm's venv (psutil needed; confluent-kafka optional):

    python -m scripts.bench                     # every section but scaling, full sizes
    python -m scripts.bench --quick             # a smoke run of the same, small sizes
    python -m scripts.bench --sections latency,stop --rate 2000
    python -m scripts.bench --quick --sections store,roundtrip --store dir,s3
    python -m scripts.bench --sections throughput,steady,latency --repeat 3   # median (range)
    python -m scripts.bench --help

Results come from what the programs report, never from their log lines: ktm's --summary-json
(records, Spark start, first record, rounds) and its /metrics (acknowledged records, live), the
loops' JSON summary line, a reader on the destination (records, and their raw batches' sizes),
the destination's end offsets, and psutil on each process tree; the store and roundtrip
sections add the store's listing (segment names and sizes) and `ktm check`.

Modules: options (flags and presets), machine (header), data (brokers, topics, datasets,
record-by-record checks), feed (paced producer and destination readers), processes (launch,
watch and reap process trees), contenders (ktm and the loops), loops (the baseline loops),
sampling (periodic samples, slope, lag), wire (bytes per record of a topic's batches), ceiling
(the fastest producer into a fresh broker), store_runs (store places, configs and processes of
ktm backup/restore/compact/check, store listings), measure_copy / measure_live / measure_stop /
measure_store / measure_roundtrip (the measurements), report (tables; --repeat merges runs).
"""
