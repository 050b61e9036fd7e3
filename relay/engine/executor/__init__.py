"""The executor side of the engine: one task moves its partitions through a pipeline's
sides, reporting progress, until the driver stops it."""
