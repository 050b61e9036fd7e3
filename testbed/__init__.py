"""What the tests, the benchmarks (`python -m scripts.bench`) and the developer scripts start:
Tansu brokers and their topics, delaying links, SeaweedFS S3, Prometheus, a standalone Spark
cluster, ktm processes and a TLS terminator.

Not part of the ktm package (the wheel carries `relay` alone): it runs from a checkout or an
unpacked sdist, whose root must be on sys.path (`python -m` and pytest put it there; the scripts
in scripts/ add it themselves). Nothing here imports `tests`; helpers that only make sense inside
a test stay in tests/support.
"""
