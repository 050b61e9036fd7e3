"""ktm: Kafka Topic Mirror. Relays Kafka topics between clusters on Spark, losing nothing."""

__version__ = "0.3.0"
