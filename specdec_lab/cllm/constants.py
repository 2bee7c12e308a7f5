"""The names CLLM training accepts, in a module light enough for parameter validation to import."""

CONSISTENCY_KINDS = ("global", "local")  # compare a state with the fixed point, or with the next state
CONSISTENCY_TARGETS = ("soft", "hard")  # the fixed point's distribution (the paper), or its tokens
MIXED_PRECISION = ("no", "bf16", "fp16")  # accelerate's mixed_precision
