"""ktm backup: Kafka partitions into store segments, resumed from the store."""
