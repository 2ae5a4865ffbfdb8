"""Logging in to the web face of `heron serve`, on every bind, loopback included: every route
and /ws need the session cookie; a one-time code (printed by the serve, or fresh from `heron
web` through the control socket) works once and for ten minutes; a session outlives restarts;
a foreign Host is refused before routing (DNS rebinding), a state-changing request from another
origin is refused (CSRF); and a sandboxed command that reaches 127.0.0.1 changes nothing."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest
from serve_helpers import (
    Running,
    control_login,
    log_in,
    running_serve,
    ws_client,
    ws_hello,
)
from websockets.exceptions import InvalidStatus

from heron.config import Settings
from heron.memory import EntryPath, MemoryService
from heron.messages import Reply, Text
from heron.providers.scripted import ScriptedProvider
from heron.serve.auth import CODE_SECONDS, COOKIE, SESSION_SECONDS, SESSIONS_NAME, Auth
from heron.store import Store

LOGIN_ADVICE = "Run `heron web` on this machine"
SPENT_OR_WRONG = "The code is wrong, has expired, or was already used"


def _echo(request) -> Reply:
    said = request.messages[-1].text.partition("[Runtime")[0].strip()
    return Reply([Text(f"echo: {said}")], "done")


def _seed() -> int:
    """A conversation `keep` and a waiting memory suggestion (its id)."""
    settings = Settings.load()
    store = Store(settings.paths.ensure().db)
    try:
        store.open_conversation("keep")
        store.set_title(store.conversation("keep").id, "kept title")
        service = MemoryService(settings.paths.memory, store)
        path = EntryPath("personal", "when", "coding", "small-commits")
        suggestion = service.suggest_lesson(path, "Prefer small commits", "one huge commit")
    finally:
        store.close()
    assert suggestion is not None
    return suggestion


def _unchanged(suggestion: int) -> bool:
    """The suggestion still waits and `keep` still exists, with its title."""
    settings = Settings.load()
    store = Store(settings.paths.db)
    try:
        waiting = [s.id for s in MemoryService(settings.paths.memory, store).waiting()]
        conv = store.conversation("keep")
        return suggestion in waiting and conv is not None and conv.title == "kept title"
    finally:
        store.close()


async def _fresh_login(serve: Running) -> str:
    """What `heron web` asks the serve for: a new login address."""
    return await control_login(serve.info.socket)


async def _raw(serve: Running, target: str, *headers: str) -> str:
    """The status line a request written by hand gets (headers as a rebinding page or a
    crafted client sends them), with the session cookie."""
    port = serve.url.rsplit(":", 1)[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", int(port))
    lines = [f"GET {target} HTTP/1.1", *headers, f"Cookie: {COOKIE}={serve.token}", "", ""]
    writer.write("\r\n".join(lines).encode())
    status = (await asyncio.wait_for(reader.readline(), 30)).decode().strip()
    writer.close()
    return status


async def _upgrade(serve: Running, host: str, origin: str) -> str:
    """The status line a /ws upgrade with this Host and Origin gets."""
    return await _raw(
        serve,
        "/ws",
        f"Host: {host}",
        f"Origin: {origin}",
        "Connection: Upgrade",
        "Upgrade: websocket",
        "Sec-WebSocket-Version: 13",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
    )


async def test_on_loopback_every_route_and_the_ws_need_a_login():
    async with running_serve(ScriptedProvider(_echo)) as serve:
        async with serve.http(cookies={}) as anon:
            page = await anon.get("/")
            api = await anon.get("/api/conversations")
            asset = await anon.get("/app.js")
            post = await anon.post("/api/conversations", json={"key": "x"})
        with pytest.raises(InvalidStatus) as refused:
            async with ws_client(serve, additional_headers={}):
                pass
        async with serve.http() as http:
            assert (await http.get("/api/conversations")).status_code == 200
            assert (await http.get("/")).status_code == 200
        async with ws_client(serve) as ws:
            assert (await ws_hello(ws))["type"] == "welcome"
    assert page.status_code == 401 and page.headers["content-type"].startswith("text/html")
    assert LOGIN_ADVICE in page.text and "heron web --open" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert api.status_code == 401 and LOGIN_ADVICE in api.json()["detail"]["hint"]
    assert asset.status_code == 401 and post.status_code == 401
    assert refused.value.response.status_code == 403


async def test_a_code_works_once_and_sets_a_strict_lasting_cookie_kept_only_as_a_hash():
    async with running_serve(ScriptedProvider(_echo)) as serve, serve.http(cookies={}) as anon:
        spent = await anon.get(serve.login)  # the printed code: the helper used it
        fresh = await _fresh_login(serve)
        first = await anon.get(fresh)
        anon.cookies.clear()  # another browser (a logged-in one is sent home, code unspent)
        again = await anon.get(fresh)
        wrong = await anon.get("/login", params={"code": "not-a-code"})
    for refused in (spent, again, wrong):
        assert refused.status_code == 403
        # One message for the three (no oracle), true of each: a mistyped code is not told
        # it expired or was used.
        assert SPENT_OR_WRONG in refused.text and LOGIN_ADVICE in refused.text
    assert first.status_code == 303 and first.headers["location"] == "/"
    cookie = first.headers["set-cookie"].lower()
    for attribute in ("httponly", "samesite=strict", "path=/", f"max-age={SESSION_SECONDS}"):
        assert attribute in cookie
    token = first.cookies[COOKIE]
    kept = Settings.load().paths.home / SESSIONS_NAME
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    text = kept.read_text()
    assert token not in text and hashlib.sha256(token.encode()).hexdigest() in text
    assert serve.token not in text


async def test_a_serve_whose_output_is_not_a_terminal_prints_no_login_code():
    """The QA's attack: `heron serve > serve.log` (or nohup) leaves its output outside
    HERON_HOME, where a command with network "loopback" read the code and logged in as the
    person. Not a terminal, the serve prints no code, only how to get one; and the start-up
    code (which `--open` would hand the browser) no longer works once `heron web` gave another."""
    async with running_serve(ScriptedProvider(_echo), terminal=False) as serve:
        printed = serve.out.getvalue()
        async with serve.http(cookies={}) as anon:
            revoked = await anon.get(serve.login)  # the helper asked for one as `heron web` does
    code = serve.login.partition("code=")[2]
    assert code and code not in printed and "code=" not in printed
    assert "Log in: run `heron web`" in printed and "not a terminal" in printed
    assert revoked.status_code == 403 and SPENT_OR_WRONG in revoked.text


def test_the_start_up_code_works_once_until_heron_web_gives_another():
    auth = Auth()
    printed = auth.new_code(first=True)
    assert auth.login(printed) is not None and auth.login(printed) is None  # once
    printed = auth.new_code(first=True)
    fresh = auth.new_code()  # `heron web`
    assert auth.login(printed) is None and auth.login(fresh) is not None
    assert (
        auth.login(auth.new_code()) is not None
    )  # codes from `heron web` do not revoke each other


@pytest.mark.parametrize("first", [True, False])  # the start-up code, and `heron web`'s
def test_an_unspent_code_stops_working_after_about_two_minutes(first: bool):
    """qa21v H2: a terminal logged to a file (`script`, tmux logging) keeps the printed code
    where a sandboxed command can read it. A browser spends a code at once, so a short life
    leaves such a copy worth little; `heron web` gives a fresh one any time."""
    now = [1_000_000.0]
    auth = Auth(clock=lambda: now[0])
    code = auth.new_code(first=first)
    now[0] += 3 * 60
    assert auth.login(code) is None
    code = auth.new_code(first=first)
    now[0] += 90
    assert auth.login(code) is not None


async def test_an_expired_code_and_an_expired_session_say_what_to_do():
    now = [1_000_000.0]
    auth = Auth.load(Settings.load().paths.ensure().home, clock=lambda: now[0])
    async with running_serve(ScriptedProvider(_echo), auth=auth) as serve:
        late = await _fresh_login(serve)
        now[0] += CODE_SECONDS + 1
        async with serve.http(cookies={}) as anon:
            expired = await anon.get(late)
            assert expired.status_code == 403 and LOGIN_ADVICE in expired.text
            assert "2 minutes" in expired.text
            in_time = await _fresh_login(serve)
            now[0] += CODE_SECONDS - 1
            assert (await anon.get(in_time)).status_code == 303
            anon.cookies.clear()
        async with serve.http() as http:
            assert (await http.get("/api/conversations")).status_code == 200
            probe = await http.get("/api/session")  # what the page asks when its socket closes
            assert probe.status_code == 200 and probe.json() == {"logged_in": True}
            now[0] += SESSION_SECONDS + 1
            gone = await http.get("/api/conversations")
            assert (await http.get("/api/session")).status_code == 401
    assert gone.status_code == 401 and LOGIN_ADVICE in gone.json()["detail"]["hint"]


async def test_a_session_survives_a_restart_of_the_serve():
    async with running_serve(ScriptedProvider(_echo)) as serve:
        token = serve.token
    async with running_serve(ScriptedProvider(_echo)) as again:
        async with again.http(cookies={COOKIE: token}) as http:
            assert (await http.get("/api/conversations")).status_code == 200
        async with ws_client(again, additional_headers={"Cookie": f"{COOKIE}={token}"}) as ws:
            assert (await ws_hello(ws))["type"] == "welcome"
        async with again.http(cookies={COOKIE: "made-up"}) as http:
            assert (await http.get("/api/conversations")).status_code == 401


async def test_a_foreign_host_is_refused_before_routing():
    async with running_serve(ScriptedProvider(_echo)) as serve:
        port = serve.url.rsplit(":", 1)[1]
        async with serve.http() as http:
            rebound = await http.get(
                "/api/conversations", headers={"Host": f"rebind.evil.example:{port}"}
            )
            other_port = await http.get("/api/conversations", headers={"Host": "127.0.0.1:1"})
            by_name = await http.get("/api/conversations", headers={"Host": f"localhost:{port}"})
        evil = f"rebind.evil.example:{port}"
        ws_rebound = await _upgrade(serve, evil, f"http://{evil}")
        ws_own = await _upgrade(serve, f"127.0.0.1:{port}", serve.url)
        own = f"Host: 127.0.0.1:{port}"
        twice = await _raw(serve, "/api/conversations", own, f"Host: {evil}")
        once = await _raw(serve, "/api/conversations", own)
    assert rebound.status_code == 421 and "conversations" not in rebound.text
    assert other_port.status_code == 421
    assert by_name.status_code == 200  # the loopback names of this server are its own
    assert " 403 " in ws_rebound and " 101 " in ws_own
    assert " 421 " in twice and " 200 " in once  # two Host headers: neither is trusted


async def test_a_state_changing_request_from_another_origin_is_refused():
    suggestion = _seed()
    async with running_serve(ScriptedProvider(_echo)) as serve:
        port = int(serve.url.rsplit(":", 1)[1])
        async with serve.http() as http:  # logged in: only the Origin is wrong
            form = {"Content-Type": "application/x-www-form-urlencoded"}
            forged = [
                await http.post(
                    f"/api/memory/review/{suggestion}/accept",
                    headers={"Origin": "http://evil.example", **form},
                    content="x=1",
                ),
                await http.patch(
                    "/api/conversations/keep",
                    headers={"Origin": f"http://127.0.0.1:{port + 1}"},  # same site, not origin
                    json={"title": "pwned"},
                ),
                await http.delete("/api/conversations/keep", headers={"Origin": "null"}),
                await http.delete(  # a browser that left the Origin out says where it came from
                    "/api/conversations/keep", headers={"Sec-Fetch-Site": "same-site"}
                ),
            ]
            assert _unchanged(suggestion)
            own = await http.post(
                f"/api/memory/review/{suggestion}/accept",
                headers={"Origin": serve.url, "Sec-Fetch-Site": "same-origin"},
            )
    assert [r.status_code for r in forged] == [403, 403, 403, 403]
    assert all("another site" in r.json()["detail"]["message"] for r in forged)
    assert own.status_code == 200 and own.json()["status"] == "accepted"  # the UI's own works


CURLS = """\
U=http://127.0.0.1:{port}
curl -s -o /dev/null -w 'list=%{{http_code}}\\n' $U/api/conversations
curl -s -o /dev/null -w 'accept=%{{http_code}}\\n' -X POST $U/api/memory/review/{id}/accept
curl -s -o /dev/null -w 'delete=%{{http_code}}\\n' -X DELETE $U/api/conversations/keep
curl -s -o /dev/null -w 'rename=%{{http_code}}\\n' -X PATCH -H 'Origin: '$U \
  -H 'Content-Type: application/json' --data '{{"title":"pwned"}}' $U/api/conversations/keep
curl -s -o /dev/null -w 'ws=%{{http_code}}\\n' -H 'Origin: '$U -H 'Connection: Upgrade' \
  -H 'Upgrade: websocket' -H 'Sec-WebSocket-Version: 13' \
  -H 'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==' $U/ws
curl -s -o /dev/null -w 'login=%{{http_code}}\\n' "$U/login?code=guess"
ls -A {home} | tr '\\n' ' '; echo
"""


@pytest.mark.parametrize("network", ["loopback", "all"])
async def test_a_sandboxed_command_that_reaches_the_serve_changes_nothing(
    network: str, heron_home: Path
):
    """The QA's attack: `bash` in bubblewrap with the host's loopback (through pasta) or all
    the network, curling the serve's API and /ws as the person would."""
    from sandbox_helpers import call_tool, seed_home

    if shutil.which("bwrap") is None or shutil.which("curl") is None:
        pytest.skip("needs bubblewrap and curl")
    if network == "loopback" and shutil.which("pasta") is None:
        pytest.skip("pasta (Debian passt) is not installed")
    seed_home(heron_home, f'network = "{network}"')
    suggestion = _seed()
    async with running_serve(ScriptedProvider(_echo)) as serve:
        port = serve.url.rsplit(":", 1)[1]
        command = CURLS.format(port=port, id=suggestion, home=heron_home)
        result = await call_tool("bash", {"command": command})
    out = result.content
    for line in ("list=401", "accept=401", "delete=401", "rename=401", "ws=403", "login=403"):
        assert line in out, out  # reached (not 000), and refused
    assert _unchanged(suggestion)
    assert "serve.sock" not in out and SESSIONS_NAME not in out  # HERON_HOME stays hidden


@pytest.mark.slow  # the real CLI in its own process
async def test_heron_web_prints_a_fresh_login_address():
    env = {**os.environ, "HERON_HOME": str(Settings.load().paths.home)}

    async def heron_web() -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "heron", "web", env=env, stdout=-1, stderr=-1
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode or 0, out.decode(), err.decode()

    rc, out, err = await heron_web()
    assert rc == 2 and "no heron serve runs" in err and "heron serve" in err
    async with running_serve(ScriptedProvider(_echo)) as serve:
        rc, out, err = await heron_web()
        assert rc == 0, err
        url = out.strip()
        assert url.startswith(f"{serve.url}/login?code=") and url != serve.login
        token = await log_in(url)
        async with serve.http(cookies={COOKIE: token}) as http:
            assert (await http.get("/api/conversations")).status_code == 200
    assert "works once" in err


def test_a_damaged_sessions_file_logs_browsers_out_and_starts_clean(tmp_path: Path):
    (tmp_path / SESSIONS_NAME).write_text("{not json")
    auth = Auth.load(tmp_path)
    assert auth.sessions == {}
    token = auth.login(auth.new_code())
    assert token is not None and auth.allows({COOKIE: token})
    assert Auth.load(tmp_path).allows({COOKIE: token})
    assert not Auth.load(tmp_path).allows({COOKIE: token + "x"})


@pytest.mark.parametrize("terminal", [True, False])
async def test_serve_open_says_so_when_no_browser_can_be_opened(monkeypatch, terminal: bool):
    """`heron serve --open` on a machine without a browser says so, instead of silence, and
    where the login address is: printed on a terminal, else to be had from `heron web`."""
    import webbrowser

    from heron.channels.web_login import NO_BROWSER

    asked: list[str] = []

    def no_browser(url: str, *args: object, **kwargs: object) -> bool:
        asked.append(url)
        return False  # what webbrowser.open answers with no browser registered

    monkeypatch.setattr(webbrowser, "open", no_browser)
    here = "found no browser to open here"
    async with running_serve(
        ScriptedProvider(_echo), open_browser=True, terminal=terminal
    ) as serve:
        for _ in range(200):  # the browser is opened on a thread; bounded, not timed
            if here in serve.out.getvalue():
                break
            await asyncio.sleep(0.05)
        assert asked == [serve.login]
        said = serve.out.getvalue()
        assert "plain HTTP" not in said  # on loopback, nothing crosses a network
    if terminal:
        assert f"{NO_BROWSER}\n" in said and f"Log in: {serve.login}" in said
        return
    # qa21v L2: with output to a file no address is printed, so no line points at one
    assert "open the address in yours" not in said and serve.login not in said
    assert "Log in: your browser is asked to open the login address" in said
    assert "run `heron web`" in said.split(here)[1].split("\n")[0]


@pytest.mark.parametrize(
    ("origin", "same"),
    [
        ("http://127.0.0.1:8765", True),
        ("https://127.0.0.1:8765", True),
        ("http://127.0.0.1:8765/", False),  # a trailing slash: no browser sends it
        ("HTTP://127.0.0.1:8765", False),  # nor an upper-case scheme
        ("http://127.0.0.1:8765/app", False),
        ("http://user@127.0.0.1:8765", False),
        ("ftp://127.0.0.1:8765", False),
        ("http://127.0.0.1:8766", False),
    ],
)
def test_the_origin_must_be_exactly_the_servers_own(origin: str, same: bool) -> None:
    """The QA's note: the check compared a normalised form, so forms no browser sends passed."""
    from heron.serve.auth import allowed_hosts, same_origin

    host = "127.0.0.1:8765"
    assert same_origin(origin, host, allowed_hosts("127.0.0.1", 8765)) is same


def test_heron_web_goes_on_past_a_broken_config_toml():
    """qa24c L4: with config.toml broken (the person editing it), `heron web` refused, so no
    browser could be logged in to a running serve until the file was fixed; it needs only the
    home. It goes on with the defaults, saying so, to its own answer."""
    from typer.testing import CliRunner

    from heron.cli import app

    Settings.load().paths.ensure().config.write_text("[tools\n")
    result = CliRunner().invoke(app, ["web"])
    assert result.exit_code != 0
    assert "no heron serve runs on" in result.output  # what it says with no serve
    assert "goes on with the default settings" in result.output
