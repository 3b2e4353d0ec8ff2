"""Model resolution: the shipped GGUF (converted once, cached), directories, GGUF paths, tiny model."""

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from slea.models import SHIPPED, load_model, resolve_checkpoint, shipped_gguf, strip_gguf_quantizer, tiny_model


@pytest.mark.slow
def test_shipped_model_loads_as_a_plain_checkpoint():
    model, tokenizer = load_model(SHIPPED)
    assert isinstance(model, LlamaForCausalLM) and model.config.num_hidden_layers == 30
    assert not getattr(model, "is_quantized", False) and getattr(model, "hf_quantizer", None) is None
    assert tokenizer.pad_token_id is not None and tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    )
    # The cache is reused: resolving twice gives the same directory, and it round-trips.
    assert resolve_checkpoint(SHIPPED) == resolve_checkpoint(str(shipped_gguf()))


@pytest.mark.slow
def test_a_saved_checkpoint_directory_loads(tmp_path):
    model, tokenizer = tiny_model()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, _ = load_model(str(tmp_path))
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor)


@pytest.mark.slow
def test_gguf_loaded_by_transformers_saves_after_stripping_the_quantizer(tmp_path):
    gguf = shipped_gguf()
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    strip_gguf_quantizer(model)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "config.json").is_file()
    assert "quantization_config" not in (tmp_path / "config.json").read_text()


@pytest.mark.slow
def test_tiny_model_shares_the_tokenizer_and_family():
    model, tokenizer = tiny_model()
    assert isinstance(model, LlamaForCausalLM)
    assert model.config.vocab_size == len(tokenizer) and model.config.num_hidden_layers == 2
    again, _ = tiny_model()
    torch.testing.assert_close(again.model.embed_tokens.weight, model.model.embed_tokens.weight)  # seeded: reproducible
    ids = torch.tensor([tokenizer("hello world")["input_ids"]])
    assert model(ids).logits.shape == (1, ids.shape[1], len(tokenizer))


def test_unknown_names_say_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="GGUF file"):
        load_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="local hub cache"):
        load_model("nobody/no-such-model-xyz")
    with pytest.raises(ValueError, match="dtype"):
        load_model(SHIPPED, dtype="int8")


def test_a_model_cache_that_cannot_be_written_names_itself_and_the_bake(tmp_path, monkeypatch):
    # A pod's read-only image is the case (tests/deploy/test_baked_model.py); as root here no mode
    # stops a write, so the cache's parent is a file instead: the same OSError on the first mkdir.
    (tmp_path / "not-a-directory").write_text("")
    monkeypatch.setenv("SLEA_CACHE_DIR", str(tmp_path / "not-a-directory" / "cache"))
    with pytest.raises(OSError, match=r"cannot convert .*\.gguf into .*not-a-directory.*SLEA_CACHE_DIR.*Dockerfile"):
        resolve_checkpoint(SHIPPED)
