"""The stages of the pipeline, one package each, over the contracts they agree on and the machinery they share."""
