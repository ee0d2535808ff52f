"""The "tiny" preset: a deterministic random-weight Llama with a real byte-level BPE
tokenizer, as a Hugging Face directory transformers loads too; for tests that need speed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float32",
}
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
_CORPUS = """\
Continuous batching re-forms the batch after every decode step: finished sequences leave,
waiting ones join, and when memory runs out a victim is swapped out or recomputed.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
Paris is the capital of France; Berlin is the capital of Germany; Rome is in Italy.
One, two, three, four, five, six, seven, eight, nine, ten. 0123456789 + - * / = ( ) .
def step(self): output = self.scheduler.schedule(); return self.runner.execute(output)
Le café est très chaud. Größe, Straße, naïve, déjà vu, smörgåsbord, 東京, 北京, 服务.
"""


def build_tokenizer(vocab_size: int) -> Tokenizer:
    """Byte-level BPE trained on a fixed text, padded with reserved tokens to exactly
    `vocab_size` so every id the model can emit decodes to something."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    missing = vocab_size - tok.get_vocab_size()
    tok.add_special_tokens([f"<|reserved_{i}|>" for i in range(missing)])
    return tok


def _init_std(name: str, shape: torch.Size) -> float:
    """Larger than a trained model's 0.02 so a 4-layer random net still has peaked,
    context-dependent logits."""
    if "norm" in name:
        return 0.0
    if "embed" in name or "lm_head" in name:
        return 1.0
    return 1.0 / shape[-1] ** 0.5 * 2.0


def tiny_state_dict(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    h, inter = config["hidden_size"], config["intermediate_size"]
    hd, nh, nkv = config["head_dim"], config["num_attention_heads"], config["num_key_value_heads"]
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], h),
              "model.norm.weight": (h,), "lm_head.weight": (config["vocab_size"], h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (nh * hd, h),
                   p + "self_attn.k_proj.weight": (nkv * hd, h),
                   p + "self_attn.v_proj.weight": (nkv * hd, h),
                   p + "self_attn.o_proj.weight": (h, nh * hd),
                   p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                   p + "mlp.down_proj.weight": (h, inter),
                   p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)}
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name in sorted(shapes):  # fixed order: the same seed gives the same weights
        shape = torch.Size(shapes[name])
        std = _init_std(name, shape)
        out[name] = torch.ones(shape) if std == 0.0 else torch.randn(shape, generator=g) * std
    return out


def write_tiny_model(out_dir: Path) -> Path:
    """Write the tiny model to `out_dir` (atomically, via a temporary sibling)."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text(json.dumps(TINY_CONFIG, indent=2) + "\n")
    gen = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    save_file(tiny_state_dict(TINY_CONFIG), str(tmp / "model.safetensors"),
              metadata={"format": "pt"})
    build_tokenizer(TINY_CONFIG["vocab_size"]).save(str(tmp / "tokenizer.json"))
    tok_config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|im_start|>",
                  "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>",
                  "pad_token": "<|endoftext|>", "chat_template": CHATML_TEMPLATE,
                  "model_max_length": TINY_CONFIG["max_position_embeddings"]}
    (tmp / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    try:
        tmp.rename(out_dir)
    except OSError:  # written concurrently by another process: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
