"""The driver side of the engine: start-up, rounds of partition groups, group membership,
source failover, retries, live status and progress."""
