"""What the stages share, and nothing else: the ROOT layout, the record and serving schema, the
settings, the typed results, and the edges of a stage program. Imports nothing else of Stoke."""
