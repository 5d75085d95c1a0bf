"""The machinery stages share, below them all: fsspec file I/O and what the spans under ROOT hold, the
edges of a stage program (settings files, options, one-line errors), leases, child processes, TFRecord
framing, plots, NVML, the model repository and the serving pins. A stage never imports another stage;
what two of them need lives here."""
