"""The repetition guard and the bound on continuing cut replies (issue 19), without a model:
the scripted provider, the fake OpenAI server on 127.0.0.1, and the `heron` command against it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from heron.agent.runner import CONTINUE, RunHooks, RunLimits, Runner
from heron.config import Config, Settings, load_config
from heron.errors import ConfigError
from heron.messages import Reply, Text, user
from heron.providers.openai_compat import OpenAICompatProvider
from heron.providers.profiles import ModelProfile, profile_for
from heron.providers.repetition import MARKER, LoopDetector, repeats_itself
from heron.providers.scripted import ScriptedProvider
from heron.request import StreamEvent
from heron.testing.fake_openai import FakeOpenAIServer
from heron.testing.script import ServerReply
from heron.tools.context import ToolContext
from heron.tools.registry import ToolRegistry

HELLO_LOOP = "".join(f"{i}. Hello! " for i in range(1, 2001))  # what SmolLM2 said to "hi"
PROSE = (
    "Paris is the capital of France. It sits on the Seine, in the north of the country, and "
    "has been the seat of government for most of the last thousand years. The city is known "
    "for its museums, among them the Louvre and the Musée d'Orsay, and for the Eiffel Tower, "
    "built for the world's fair of 1889. About two million people live in the city proper and "
    "more than twelve million in the metropolitan area around it.\n\n"
    "1. Take the metro to Châtelet.\n2. Walk to the river.\n3. Cross the Pont Neuf.\n"
)
GUARDED = ModelProfile(loop_guard=True)


def ctx(tmp_path) -> ToolContext:
    return ToolContext(workspace=tmp_path)


def runner_for(provider, profile=ModelProfile(), limits=RunLimits()) -> Runner:
    return Runner(provider, ToolRegistry([]), profile, limits)


# ---- the detector ------------------------------------------------------------------------------


def test_a_numbered_list_of_the_same_line_is_a_loop_within_a_few_items():
    detector = LoopDetector()
    items = 0
    for i in range(1, 100):
        items = i
        if detector.feed(f"{i}. Hello! "):
            break
    assert detector.looping and items <= 6


def test_varied_prose_and_a_short_list_are_not_a_loop():
    assert not repeats_itself(PROSE)
    assert not repeats_itself(PROSE.replace("Paris", "Lyon") + " " + PROSE[:200])


def test_pieces_cut_anywhere_read_as_the_whole_text():
    whole = LoopDetector()
    whole.feed(PROSE)
    whole.finish()
    pieces = LoopDetector()
    for start in range(0, len(PROSE), 3):  # cuts inside words and numbers
        pieces.feed(PROSE[start : start + 3])
    pieces.finish()
    assert pieces.tokens == whole.tokens and not pieces.looping
    assert repeats_itself("Hel" + "lo there, friend. " * 5)


# ---- the guard in a run ------------------------------------------------------------------------


async def test_guard_stops_the_stream_keeps_the_reply_and_marks_it(tmp_path):
    """Through the real OpenAI adapter and HTTP: the guard stops reading a 20,000-token loop
    after a few items, and the connection is usable for the next request."""
    script = [ServerReply(text=HELLO_LOOP, stop="length"), ServerReply(text="Hi again.")]
    with FakeOpenAIServer(script) as server:
        provider = OpenAICompatProvider("small-local", "k", server.base_url)
        events: list[StreamEvent] = []
        runner = runner_for(provider, GUARDED)
        first = await runner.run("", [user("hi")], ctx(tmp_path), RunHooks(on_event=events.append))
        second = await runner.run("", [user("again")], ctx(tmp_path), RunHooks())
        await provider.aclose()
    assert first.stop == "repetition" and first.model_calls == 1
    text = first.text
    assert text.endswith(MARKER) and text.startswith("1. Hello! 2. Hello!")
    assert len(text) < 400 < len(HELLO_LOOP)  # read a few chunks, not the whole reply
    shown = "".join(e.text for e in events)
    assert shown == text  # what the user saw is what is kept, marker included
    assert first.usage.output > 0
    assert second.text == "Hi again." and len(server.requests) == 2


async def test_without_the_guard_a_loop_streams_to_its_end(tmp_path):
    loop = HELLO_LOOP[:3000]
    provider = ScriptedProvider([Reply([Text(loop)], "done")])
    result = await runner_for(provider).run("", [user("hi")], ctx(tmp_path), RunHooks())
    assert result.stop == "done" and result.text == loop


async def test_guard_leaves_a_plain_answer_alone(tmp_path):
    provider = ScriptedProvider([Reply([Text(PROSE)], "done")])
    result = await runner_for(provider, GUARDED).run("", [user("q")], ctx(tmp_path), RunHooks())
    assert result.stop == "done" and result.text == PROSE


# ---- continuation ------------------------------------------------------------------------------


def cut_replies(n: int) -> list[Reply]:
    return [Reply([Text(f"Part {word} of the story. ")], "length") for word in PROSE.split()[:n]]


async def test_continuation_is_bounded_per_run(tmp_path):
    provider = ScriptedProvider(cut_replies(10))
    result = await runner_for(provider).run("", [user("go")], ctx(tmp_path), RunHooks())
    assert result.stop == "length" and result.model_calls == 3  # the reply and 2 continuations
    assert [r.messages[-1].text for r in provider.requests[1:]] == [CONTINUE, CONTINUE]

    provider = ScriptedProvider(cut_replies(10))
    none = runner_for(provider, limits=RunLimits(max_continuations=0))
    assert (await none.run("", [user("go")], ctx(tmp_path), RunHooks())).model_calls == 1


async def test_profile_without_continuation_stops_at_the_cut(tmp_path):
    provider = ScriptedProvider(cut_replies(3))
    runner = runner_for(provider, ModelProfile(continue_cut=False))
    result = await runner.run("", [user("go")], ctx(tmp_path), RunHooks())
    assert result.stop == "length" and result.model_calls == 1


async def test_a_cut_loop_is_not_continued_even_unguarded(tmp_path):
    provider = ScriptedProvider([Reply([Text(HELLO_LOOP[:300])], "length"), *cut_replies(2)])
    result = await runner_for(provider).run("", [user("hi")], ctx(tmp_path), RunHooks())
    assert result.stop == "length" and result.model_calls == 1


async def test_a_loop_across_continuations_ends_them(tmp_path):
    piece = "The same sentence comes back once more, again and again. "
    provider = ScriptedProvider([Reply([Text(piece)], "length")] * 3 + cut_replies(3))
    runner = runner_for(provider, limits=RunLimits(max_continuations=5))
    result = await runner.run("", [user("go")], ctx(tmp_path), RunHooks())
    # Each piece alone is no loop, nor are two; the third makes the cut text one: stop there.
    assert result.model_calls == 3 and not repeats_itself(piece * 2)


# ---- configuration -----------------------------------------------------------------------------


def test_max_continuations_is_read_from_config_and_checked(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[agent]\nmax_continuations = 0\n")
    assert load_config(path).agent.max_continuations == 0
    assert Config().agent.max_continuations == 2
    path.write_text("[agent]\nmax_continuations = -1\n")
    with pytest.raises(ConfigError, match="max_continuations must be at least 0"):
        load_config(path)


async def test_engine_runs_with_the_configured_bound(heron_home):
    from heron.agent.engine import Engine

    (heron_home / "config.toml").write_text("[agent]\nmax_continuations = 1\n")
    provider = ScriptedProvider(cut_replies(5))
    async with Engine.open(Settings.load(), ephemeral=True, provider=provider) as engine:
        result = await engine.turn("k", "tell me a story")
    assert result.run.model_calls == 2 and result.ok


def test_profiles_of_the_offline_model_and_overrides():
    small = profile_for("smollm2-135m-instruct")
    assert small.loop_guard and not small.continue_cut and small.max_output <= 512
    assert small.temperature is not None and small.repeat_penalty is not None
    big = profile_for("claude-sonnet-4-5")
    assert not big.loop_guard and big.continue_cut
    over = profile_for("my-model", {"my-*": {"loop_guard": True, "temperature": 1}})
    assert over.loop_guard and over.temperature == 1.0
    with pytest.raises(ConfigError, match="loop_guard must be bool"):
        profile_for("my-model", {"my-*": {"loop_guard": "yes"}})


# ---- the command -------------------------------------------------------------------------------


@pytest.mark.slow  # the real CLI in a subprocess
def test_heron_run_against_a_looping_small_model_ends_in_one_call(heron_home):
    """`heron run` as a user runs it, against a server that loops like SmolLM2 did: one request,
    the loop stopped and marked on stdout, exit status 0."""
    with FakeOpenAIServer([ServerReply(text=HELLO_LOOP, stop="length")]) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HERON_", "OPENAI"))}
        env.update(
            HERON_HOME=str(heron_home),
            HERON_BASE_URL=server.base_url,
            HERON_API_KEY="dummy",
            HERON_MODEL="smollm2-135m-instruct",
        )
        done = subprocess.run(
            [sys.executable, "-m", "heron", "run", "-"],
            input="hi",
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        requests = list(server.requests)
    assert done.returncode == 0, done.stderr
    assert len(requests) == 1 and requests[0]["max_tokens"] == 512
    assert done.stdout.startswith("1. Hello!") and MARKER.strip() in done.stdout
