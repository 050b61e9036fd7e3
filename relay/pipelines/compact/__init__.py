"""ktm compact: small segments merged into big ones, as one batch Spark job."""
