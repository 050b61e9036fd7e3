"""The driver side of the engine: start-up, rounds of tasks, the membership of ktm processes,
source failover, retries, live status and progress."""
