"""`ktm verify`: prove a relay's copy exact, record by record, from the provenance ktm wrote."""
