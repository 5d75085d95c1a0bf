"""What the stages agree on, and nothing else: the stage registry, the ROOT layout, the record and
serving schema, the settings, and the typed results. Names and models only: nothing here reads or
writes a file, and nothing here imports the rest of Stoke."""
