"""The OpenAI-compatible HTTP server: `create_app(engine)` (api.py) over an AsyncEngine
(async_engine.py) that runs the engine's step loop on a background thread.

Nothing is imported here, so `stepserve` commands that do not serve need no fastapi."""
