"""vLLM's utility endpoints in its shapes: `POST /tokenize` (a prompt, or chat messages
through the chat template), `POST /detokenize` and `GET /version`. Bodies take the same
limits as generation, a text or id list is bounded like a prompt, and tokenizing runs on
a worker thread."""

from __future__ import annotations

from fastapi import FastAPI
from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from stepserve import __version__
from stepserve.core import request_limits as lim
from stepserve.server.body import parse_body, read_json, validate
from stepserve.server.errors import bad_request
from stepserve.server.protocol import ChatCompletionRequest, TokenId, _Lenient
from stepserve.server.serving import (
    ServingContext,
    chat_prompt,
    check_model,
    check_text_size,
    check_token_count,
)


class TokenizeCompletionRequest(_Lenient):
    model: str | None = Field(None, max_length=1024)
    prompt: str = Field(max_length=lim.MAX_REQUEST_BYTES_MAX)
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(ChatCompletionRequest):
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(_Lenient):
    model: str | None = Field(None, max_length=1024)
    tokens: list[TokenId]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str


# path -> (the request bodies it takes, its answer): for /openapi.json (openapi.py)
BODY_ROUTES = {
    "/tokenize": ((TokenizeCompletionRequest, TokenizeChatRequest), TokenizeResponse),
    "/detokenize": ((DetokenizeRequest,), DetokenizeResponse),
}


def install_tokenize_routes(app: FastAPI) -> None:
    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        """vLLM's /tokenize: `prompt` (text), or `messages` rendered by the chat
        template; `{count, max_model_len, tokens, token_strs}`."""
        ctx: ServingContext = request.app.state.ctx
        tok = ctx.tokenizer
        data = await read_json(ctx, request)
        chat = isinstance(data, dict) and "messages" in data
        body = validate(data, TokenizeChatRequest if chat else TokenizeCompletionRequest)
        check_model(ctx, body.model)
        if isinstance(body, TokenizeChatRequest):
            ids, param = await chat_prompt(ctx, body, body.add_generation_prompt), "messages"
        else:
            check_text_size(ctx, len(body.prompt), "prompt")
            ids = await ctx.off_loop(tok.encode, body.prompt, body.add_special_tokens)
            param = "prompt"
        check_token_count(ctx, len(ids), param)
        strs = await ctx.off_loop(lambda: [tok.id_to_token(i) or "" for i in ids]) \
            if body.return_token_strs else None
        return JSONResponse({"count": len(ids), "max_model_len": ctx.max_model_len,
                             "tokens": ids, "token_strs": strs})

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        """vLLM's /detokenize: `tokens` to `{prompt}`."""
        ctx: ServingContext = request.app.state.ctx
        body = await parse_body(ctx, request, DetokenizeRequest)
        check_model(ctx, body.model)
        check_token_count(ctx, len(body.tokens), "tokens")
        bad = [t for t in body.tokens if t >= ctx.vocab_size]
        if bad:
            raise bad_request(f"tokens must be in [0, {ctx.vocab_size}); got {bad[:5]}",
                              "tokens")
        text = await ctx.off_loop(ctx.tokenizer.decode, body.tokens)
        return JSONResponse({"prompt": text})

    @app.get("/version", response_model=VersionResponse)
    async def version() -> dict:
        return {"version": __version__}

