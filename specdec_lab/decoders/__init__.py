"""Decoders: each takes prompt token ids and returns a `GenerationResult`."""
