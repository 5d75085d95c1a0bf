"""What the stages agree on, and nothing else: the stage registry, the ROOT layout, the record and
serving schema, the settings, the typed results and summaries, and the edges of a stage program.
Reads and writes files through components/common/files.py and imports nothing else of Stoke."""
