"""Ingest's Beam job and its driver: new files of SOURCE to a new span of sharded TFRecords (`stoke ingest`)."""
