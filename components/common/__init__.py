"""The machinery stages share, below them all: fsspec file I/O, leases, child processes, TFRecord
framing, plots, NVML, the model repository and the serving pins. A stage never imports another
stage; what two of them need lives here."""
