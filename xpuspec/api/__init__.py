"""The Python API: the pipeline, its results, request text, the engine loop that drives a pipeline."""
