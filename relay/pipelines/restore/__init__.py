"""ktm restore: store segments into Kafka (and consumer-group offsets, translated)."""
