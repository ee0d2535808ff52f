"""Tokenizer: `tokenizers.Tokenizer` from tokenizer.json plus tokenizer_config.json's special
tokens, BOS handling and chat template, without transformers. The streaming detokenizer
steps `tokenizers`' DecodeStream (1.6-6x faster per token than `WindowDetokenizer`, the
same scheme in Python, kept for tokenizers < 0.21 and as benchmarks/detok.py's baseline).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from stepserve.model.model_args import generation_eos_ids

try:
    from tokenizers.decoders import DecodeStream
except ImportError:  # tokenizers < 0.21
    DecodeStream = None


def _token_text(value: Any) -> str | None:
    """Special tokens appear as strings or as {"content": ...} dicts in older configs."""
    return value.get("content") if isinstance(value, dict) else value


def _compile_template(template: str) -> jinja2.Template:
    """The environment transformers renders chat templates in, so output matches it."""
    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: Any = None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def _read_chat_template(model_dir: Path, config: dict[str, Any]) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        named = {t["name"]: t["template"] for t in template}
        template = named.get("default")
    if template is None and (model_dir / "chat_template.jinja").is_file():
        template = (model_dir / "chat_template.jinja").read_text()
    return template


def chat_template_of(value: str) -> str:
    """`--chat-template`, as vLLM reads it: the path of a template file, or the template
    itself in one line (its `\\n` escapes decoded). A value without `{`, `}` or a newline
    that names no file is taken for a mistyped path, not a template. ValueError names the
    problem (a file that cannot be read, a template that does not compile)."""
    try:
        is_file = Path(value).expanduser().is_file()
    except (OSError, ValueError):  # a name too long, a NUL byte: a template, not a path
        is_file = False
    if is_file:
        try:
            template = Path(value).expanduser().read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--chat-template {value!r}: cannot read it: {e}") from None
    elif not any(c in value for c in "{}\n"):
        raise ValueError(f"--chat-template {value!r}: no such file, and not a template "
                         "(a template holds {{ }} or {% %})")
    else:
        try:
            template = value.encode("latin-1", "backslashreplace").decode("unicode_escape")
        except UnicodeDecodeError as e:
            raise ValueError(f"--chat-template: a bad escape in the template: {e}") from None
    try:
        _compile_template(template)
    except jinja2.TemplateError as e:
        raise ValueError(f"--chat-template: the template does not compile: {e}") from None
    return template


class Tokenizer:
    def __init__(self, model_dir: str | Path) -> None:
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no tokenizer.json (only fast tokenizers are "
                                    "supported)")
        self._tok = HFTokenizer.from_file(str(path))
        cfg_path = model_dir / "tokenizer_config.json"
        config = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        # None: trust tokenizer.json's post-processor, as transformers does.
        self._add_bos: bool | None = config.get("add_bos_token")
        self.chat_template = _read_chat_template(model_dir, config)
        self._template: jinja2.Template | None = None
        self.special_tokens = {k: _token_text(v) for k, v in config.items()
                               if k.endswith("_token") and _token_text(v) is not None
                               and not isinstance(v, bool)}
        self.eos_token_ids = self._eos_ids(model_dir)
        self._max_token_bytes: int | None = None

    def _eos_ids(self, model_dir: Path) -> tuple[int, ...]:
        """Every id that ends generation: generation_config's, then the tokenizer's eos."""
        ids = list(generation_eos_ids(model_dir))
        if self.eos_token is not None:
            tid = self._tok.token_to_id(self.eos_token)
            if tid is not None and tid not in ids:
                ids.append(tid)
        return tuple(ids)

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`. Through encode_batch, which releases the GIL while it
        works (encode holds it: 1 s for 1 MB, during which no other thread runs), so a
        server can tokenize on a worker thread without stalling its event loop."""
        ids = self._encode(text, add_special_tokens)
        if not add_special_tokens or self._add_bos is None or self.bos_token_id is None:
            return ids
        has_bos = bool(ids) and ids[0] == self.bos_token_id
        if self._add_bos and not has_bos:
            return [self.bos_token_id, *ids]
        if not self._add_bos and has_bos:
            plain = self._encode(text, False)
            if not plain or plain[0] != self.bos_token_id:  # the post-processor added it
                return ids[1:]
        return ids

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def max_token_bytes(self) -> int:
        """The most UTF-8 bytes one token decodes to (a lone partial character counts as
        its replacement character, 3 bytes, more than it stands for). n tokens decode to
        at most n times this many bytes, hence characters: the bound a server checks a
        text prompt against before tokenizing it."""
        if self._max_token_bytes is None:
            pieces = self._tok.decode_batch([[i] for i in range(self.vocab_size)],
                                            skip_special_tokens=False)
            self._max_token_bytes = max(len(p.encode("utf-8")) for p in pieces)
        return self._max_token_bytes

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def use_chat_template(self, template: str) -> None:
        """Render chats with `template` instead of the folder's own (--chat-template)."""
        self.chat_template = template
        self._template = None

    def apply_chat_template(self, messages: list[dict[str, Any]],
                            add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """Render `messages` with the model's chat template (jinja2, sandboxed)."""
        if self.chat_template is None:
            raise ValueError("this model's tokenizer_config.json has no chat_template")
        if self._template is None:
            self._template = _compile_template(self.chat_template)
        return self._template.render(messages=messages,
                                     add_generation_prompt=add_generation_prompt,
                                     **{**self.special_tokens, **kwargs})

    def encode_chat(self, messages: list[dict[str, Any]],
                    add_generation_prompt: bool = True) -> list[int]:
        """Prompt ids for a chat; the template already holds any BOS, so none is added
        (transformers' apply_chat_template(tokenize=True) does the same)."""
        text = self.apply_chat_template(messages, add_generation_prompt)
        return self.encode(text, add_special_tokens=False)

    def detokenizer(self, prompt_ids: list[int] | None = None, skip_special_tokens: bool = True
                    ) -> IncrementalDetokenizer | WindowDetokenizer:
        kind = WindowDetokenizer if DecodeStream is None else IncrementalDetokenizer
        return kind(self, prompt_ids or [], skip_special_tokens)


# Prompt tokens that seed a detokenizer: SentencePiece decoders drop the leading space of
# the first token they see, which is wrong mid-text.
CONTEXT = 5


class IncrementalDetokenizer:
    """Text deltas, one `add()` per generated token; their concatenation equals
    decoding all generated ids at once (once the stream ends on a whole character)."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int],
                 skip_special_tokens: bool = True) -> None:
        self._hf = tokenizer._tok
        context = prompt_ids[-CONTEXT:]  # their text is not output
        self._stream = self._seeded(context, skip_special_tokens)
        if self._pending:  # the prompt ends mid-character: seed only up to a whole one,
            # so the broken character stays the prompt's (as in decoding the output alone)
            self._stream = self._seeded(context[:self._whole], skip_special_tokens)
        self.output_ids: list[int] = []
        self.text = ""

    def _seeded(self, context: list[int], skip_special_tokens: bool) -> DecodeStream:
        """A stream fed `context`; `_whole`: how many of them end on a whole character,
        `_pending`: whether the stream still holds bytes of an unfinished one."""
        stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self._whole, self._pending = 0, False
        for k, token_id in enumerate(context):
            self._pending = stream.step(self._hf, token_id) is None
            if not self._pending:
                self._whole = k + 1
        return stream

    def add(self, token_id: int) -> str:
        """Append one token; return the newly complete text (may be "")."""
        self.output_ids.append(token_id)
        delta = self._stream.step(self._hf, token_id) or ""  # None: mid-character
        self.text += delta
        return delta


class WindowDetokenizer:
    """IncrementalDetokenizer's deltas, computed in Python: decode the window before the
    new token and the window with it, release the difference once it ends on a whole
    character."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int],
                 skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = list(prompt_ids[-CONTEXT:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.num_prompt_context = len(self.ids)
        self.text = ""

    def add(self, token_id: int) -> str:
        """Append one token; return the newly complete text (may be "")."""
        self.ids.append(token_id)
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self.prefix_offset:self.read_offset], self.skip_special_tokens)
        full = decode(self.ids[self.prefix_offset:], self.skip_special_tokens)
        # An incomplete UTF-8 sequence decodes to U+FFFD: wait for the rest of its bytes.
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            delta = full[len(prefix):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            self.text += delta
            return delta
        return ""

    @property
    def output_ids(self) -> list[int]:
        return self.ids[self.num_prompt_context:]
