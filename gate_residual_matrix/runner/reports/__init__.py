"""Stage 5: cell reports: the schema, its rules, reading and writing, and partial runs merged."""
