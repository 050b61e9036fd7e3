"""ktm relay: Kafka to Kafka, resumed from the destination's provenance."""
