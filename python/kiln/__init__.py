"""kiln for Python: the runtime (kiln.runtime, ctypes over libkiln_rt), the
Hugging Face config import (kiln.config, through `kilnc import hf`) and the
load-trace recorder (kiln.recorder); kiln.torch carries plans out in a
PyTorch model. kiln.runtime, kiln.config and kiln.recorder use the standard
library only. docs/python.md is the reference."""

__version__ = "0.1.0"
