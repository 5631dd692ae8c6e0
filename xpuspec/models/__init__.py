"""Model bundles: the format, where bundles come from (a path, the default model, the demo pair)."""
