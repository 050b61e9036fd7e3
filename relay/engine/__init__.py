"""How every pipeline runs: Spark (`spark.py`), the driver's rounds, membership, failover,
retries and status (`driver/`), the task loop on the executors (`executor/`), the control
channel between them, and the metrics. A pipeline plugs in through `pipeline.Pipeline` (driver)
and `executor.sides.Sides` (executor); nothing here imports a pipeline.
"""
