"""The data check (`stoke datacheck`): a new span's statistics against the published history; errors
quarantine the span. `stoke spans` lists spans with their status and releases quarantined ones."""
