"""Secrets in ordinary phrasing are refused by memory; ordinary facts with numbers are not.

A tester saved five credentials as `always/` entries (QA pass 6, area I, defect 1): "the router
admin login is admin with Summer2024!", "the passphrase correct horse battery staple", "the
alarm disarms with 8 2 6 1", "dana@example.com / Qwerty!234", "login ... Tr0ub4dor&3". The
checks here generate the phrasings (hypothesis) from the four shapes of heron/memory/refuse.py
rather than list those five: a credential word and its value, a password-like word, an email
with a password-like word after it, a number spelled out a digit at a time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_memory_properties import SETTINGS
from typer.testing import CliRunner

from heron.cli import app
from heron.memory import EntryPath, MemoryRefused, MemoryService
from heron.memory.refuse import find_secret, password_like, without_secret
from heron.messages import user
from heron.store import Store

PATH = EntryPath("personal", "always", None, "fact")


@pytest.fixture
def service(tmp_path):
    store = Store(tmp_path / "t.db")
    yield MemoryService(tmp_path / "memory", store)
    store.close()


def _said(service: MemoryService, text: str) -> int:
    conv = service.store.open_conversation("c")
    service.store.append(conv.id, user(f"Remember that {text}"))
    return conv.id


@pytest.mark.parametrize(
    "said",
    [
        "The router admin login is admin with Summer2024!",
        "For the NAS I use the passphrase correct horse battery staple",
        "The alarm disarms with 8 2 6 1",
        "my netflix account is dana@example.com / Qwerty!234",
        "My bank login is dana.k and it uses Tr0ub4dor&3",
        "My passport number is C4F9K2LM7",
    ],
)
def test_the_testers_credentials_are_refused_with_why_and_what_to_do(service, said):
    cid = _said(service, said)
    with pytest.raises(MemoryRefused, match="secrets and credentials are never saved") as e:
        service.save(cid, PATH, said)
    assert "write it themselves" in (e.value.hint or "")  # a false alarm has a way in


# ---- generated phrasings -----------------------------------------------------------------------

LOWER, UPPER, DIGITS = "abcdefghjkmnpqrstuvwxyz", "ABCDEFGHJKLMNPQRSTUVWXYZ", "0123456789"
SYMBOLS = "!#$%&*+=?^~"


@st.composite
def passwords(draw: st.DrawFn) -> str:
    """A password as people make them: a word, then digits and a symbol, or letters and digits
    and a symbol mixed, 8 to 16 characters; capitals, small letters, digits and a symbol."""
    head = draw(st.sampled_from(UPPER)) + draw(st.text(LOWER, min_size=3, max_size=7))
    digits = draw(st.text(DIGITS, min_size=1, max_size=4))
    symbol = draw(st.sampled_from(SYMBOLS))
    tail = draw(st.text(LOWER + DIGITS, min_size=2, max_size=4))
    order = draw(st.sampled_from([(head, digits, symbol, tail), (head, symbol, digits, tail)]))
    return "".join(order)


PREFIX = st.sampled_from(["my", "the", "our", "For the NAS the", "The router's", "my bank"])
WORD_NOUN = st.sampled_from(
    [
        *("password", "passphrase", "passcode", "Passwort", "contraseña", "wachtwoord"),
        *("senha", "Kennwort", "security answer", "mot de passe", "memorable word"),
    ]
)
CODE_NOUN = st.sampled_from(
    [
        *("login", "PIN", "credentials", "Geheimzahl", "Türcode", "pin code", "alarm code"),
        *("gate code", "door code", "safe code", "login details", "recovery code", "code pin"),
        # any code, whatever it opens (qa24b M2)
        *("gym locker code", "padlock code", "voicemail code", "code", "shed code for the back"),
        *("combination to my bike lock", "suitcase combination", "building code"),
    ]
)
IS = st.sampled_from(["is", "was", ":", "=", "is set to", "ist", "est", "lautet"])
PLAIN = st.sampled_from(["tulips", "Sonnenblume", "fluffy", "marmalade", "Bergamo", "zebra"])
SPACED = st.lists(st.sampled_from(DIGITS), min_size=4, max_size=8).map(
    lambda ds: st.sampled_from([" ", "-", "."]).map(lambda sep: sep.join(ds))
)


@SETTINGS
@given(prefix=PREFIX, noun=WORD_NOUN, verb=IS, value=st.one_of(PLAIN, passwords()))
def test_a_credential_word_with_its_value_is_refused(prefix, noun, verb, value):
    said = f"{prefix} {noun} {verb} {value}"
    assert find_secret(said), said


@SETTINGS
@given(
    prefix=PREFIX,
    noun=CODE_NOUN,
    verb=IS,
    value=st.one_of(passwords(), st.integers(1000, 99999999).map(str), SPACED.flatmap(lambda s: s)),
)
def test_a_code_word_with_a_number_or_password_is_refused(prefix, noun, verb, value):
    said = f"{prefix} {noun} {verb} {value}"
    assert find_secret(said), said


@SETTINGS
@given(
    thing=st.sampled_from(["The alarm", "The front door", "My phone", "The safe", "I"]),
    verb=st.sampled_from(["disarms with", "unlocks with", "log in with", "signs in using"]),
    value=st.one_of(passwords(), SPACED.flatmap(lambda s: s)),
)
def test_a_verb_of_credentials_with_its_value_is_refused(thing, verb, value):
    said = f"{thing} {verb} {value}"
    assert find_secret(said), said


@SETTINGS
@given(
    name=st.text(LOWER, min_size=3, max_size=8),
    sep=st.sampled_from([" / ", ":", " : ", ", ", " with ", " pw ", " password "]),
    password=passwords(),
)
def test_an_email_with_a_password_after_it_is_refused(name, sep, password):
    said = f"my account is {name}@example.com{sep}{password}"
    assert find_secret(said), said


@SETTINGS
@given(password=passwords(), where=st.sampled_from(["{} is what I use", "I always type {}"]))
def test_a_password_like_word_is_refused_anywhere(password, where):
    assert password_like(password)
    assert find_secret(where.format(password))


@SETTINGS
@given(digits=SPACED.flatmap(lambda s: s))
def test_a_number_spelled_out_a_digit_at_a_time_is_refused(digits):
    assert find_secret(f"It is {digits} for the shed"), digits


# A code, a lock's combination or a network's key named by what it opens (qa24b M2): these were
# saved to always/ and sent with every request, and a forget left them in the history.
@pytest.mark.parametrize(
    "said",
    [
        "My gym locker code is 4711",
        "the bike lock opens with 3391",
        "the padlock code is 4711",
        "the combination to my bike lock is 3391",
        "the key safe at my mum's opens with 2580",
        "my voicemail code is 8812",
        "the wifi is called Home and its key is tulips",
        "The wifi key is tulips",
        "the key to our network is marmalade",
        "the code for the shed is 4711",
    ],
)
def test_a_code_combination_or_network_key_named_by_what_it_opens_is_refused(said):
    assert find_secret(said), said
    assert not any(ch.isdigit() for ch in without_secret(said)), without_secret(said)
    assert "tulips" not in without_secret(said) and "marmalade" not in without_secret(said)


@SETTINGS
@given(
    lock=st.sampled_from(["bike lock", "padlock", "key safe at my mum's", "lockbox", "locker"]),
    verb=st.sampled_from(["opens with", "unlocks with", "opens using", "opens with the code"]),
    value=st.one_of(st.integers(1000, 99999999).map(str), SPACED.flatmap(lambda s: s)),
)
def test_a_lock_that_opens_with_a_number_is_refused(lock, verb, value):
    said = f"The {lock} {verb} {value}"
    assert find_secret(said), said


# ---- ordinary facts stay savable ---------------------------------------------------------------

ORDINARY = st.one_of(
    st.builds("my flat is number {} on the {}rd floor".format, st.integers(1, 99999), st.just(3)),
    st.builds("write to me at {}@example.com".format, st.text(LOWER, min_size=3, max_size=8)),
    st.builds("I was born in {}".format, st.integers(1900, 2025)),
    st.builds("my office is room {}".format, st.integers(1, 9999)),
    st.builds(
        "order INV-{}-{:04} arrives on Friday".format, st.integers(2000, 2030), st.integers(1, 9999)
    ),
    st.builds("I have {} kids aged {} and {}".format, *[st.integers(1, 20)] * 3),
    st.builds("my login expired in {}".format, st.integers(1990, 2030)),
    st.builds("my phone number is +49 176 {}".format, st.integers(1000000, 99999999)),
    st.sampled_from(
        [
            "My password manager is Bitwarden",
            "I use a password manager",
            "I changed my password yesterday",
            "the PIN is in the drawer",
            "I sign in with Google",
            "I log in with my fingerprint",
            "The login page is slow",
            "I have an iPhone15 and a MacBook",
            "I use Python3.12 at work",
            "ISO-8601 dates please",
            "My passport expires in 2027",
            "version v2.3.1 ships on Friday",
            "my email is dana@example.com and I work at ACME2",
            "my phone number is +49 176 21778647",  # 13 digits that pass the Luhn check
            # a code that names a place, a kind or a rule, not what opens a lock (qa24b M2)
            "my postcode is 10115",
            "my post code is 10115",
            "the zip code is 94107",
            "the area code is 030",
            "the dialling code for Berlin is 030",
            "the dress code is casual",
            "the code is on GitHub",
            "the meeting code is in the invite",
            "the door opens with a push",
            "the colour code is blue",
            "error code 404 keeps showing",
            "error code 4040 keeps showing",
            "the sort code is 20-00-00",
            "my tax code is 1257L",
            "the discount code is SAVE20",
            "the code is 2000 lines long",
            "the exhibition opens with 1200 paintings",
            "the season opens with the 2026 derby",
            "the combination of work and 2 kids is hard",
            "the wifi is slow and the key issue is the router",
            "the wifi is fine; the key is under the mat",
            "my keyboard is a Keychron K2",
        ]
    ),
)


@settings(max_examples=80, deadline=None)
@given(said=ORDINARY)
def test_ordinary_facts_with_numbers_and_emails_are_not_secrets(said):
    assert find_secret(said) is None, said


def test_an_ordinary_fact_with_a_number_is_saved(service):
    said = "my flat is number 4711 on the 3rd floor"
    cid = _said(service, said)
    assert service.save(cid, PATH, said).text == "My flat is number 4711 on the 3rd floor"


# ---- forget, and the memory folder's history ---------------------------------------------------


def _home_memory() -> Path:
    return Path(os.environ["HERON_HOME"]) / "memory"


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(_home_memory()), *args], capture_output=True)
    return done.stdout.decode("utf-8", "replace")


def _everything_git_keeps() -> str:
    """Every object of the repository, reachable or not, and every commit's patch."""
    objects = subprocess.run(
        ["git", "-C", str(_home_memory()), "cat-file", "--batch-all-objects", "--batch"],
        capture_output=True,
    ).stdout.decode("utf-8", "replace")
    return objects + _git("log", "--all", "-p")


def _entry_written_by_an_old_heron(rel: str, text: str) -> None:
    """An entry saved before the secret check knew its shape, committed as a save was."""
    from heron.config import Settings

    settings = Settings.load()
    store = Store(settings.paths.ensure().db)
    try:
        service = MemoryService(settings.paths.memory, store)
        file = settings.paths.memory / rel

        def write() -> None:
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(f"---\norigin: user\nquote: {text!r}\n---\n{text}\n")

        service.history.record(f"saved {rel} (user)", write)
        other = settings.paths.memory / "personal/always/tea.md"
        service.history.record(
            "saved personal/always/tea.md (user)", lambda: other.write_text("I drink tea\n")
        )
    finally:
        store.close()


needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="memory history needs git")


@needs_git
def test_forgetting_a_secret_takes_every_version_out_of_the_history():
    """After `heron memory forget`, `git log --all -p` still showed Summer2024! four times."""
    secret = "The router admin login is admin with Summer2024!"
    _entry_written_by_an_old_heron("personal/always/router.md", secret)
    subjects = _git("log", "--format=%s").splitlines()
    cli = CliRunner()
    forgot = cli.invoke(app, ["memory", "forget", "personal/always/router.md"])
    assert forgot.exit_code == 0, forgot.output
    assert "It held a credential" in forgot.output and "taken out of the memory" in forgot.output
    assert "Summer2024" not in _everything_git_keeps()
    assert _git("log", "--format=%s").splitlines() == [
        "removed personal/always/router.md",
        *subjects,
    ]
    assert (_home_memory() / "personal/always/tea.md").read_text() == "I drink tea\n"
    assert "I drink tea" in _git("show", "HEAD~1:personal/always/tea.md")  # the rest is kept
    # undo passes over the purged removal and takes back the change before it (qa22x M5)
    undo = cli.invoke(app, ["memory", "undo"])
    assert undo.exit_code == 0, undo.output
    assert "Passed over: removed personal/always/router.md" in undo.output
    assert "Undid: saved personal/always/tea.md" in undo.output
    assert not (_home_memory() / "personal/always/tea.md").exists()


@needs_git
def test_forgetting_keeps_the_text_in_the_history_says_so_and_purge_takes_it_out():
    _entry_written_by_an_old_heron("personal/always/flat.md", "My flat is on the third floor")
    cli = CliRunner()
    forgot = cli.invoke(app, ["memory", "forget", "personal/always/flat.md"])
    assert "stays in the memory folder's history" in forgot.output
    assert "forget --purge personal/always/flat.md" in forgot.output
    assert "third floor" in _git("log", "--all", "-p")
    purged = cli.invoke(app, ["memory", "forget", "--purge", "personal/always/flat.md"])
    assert purged.exit_code == 0, purged.output
    assert "was forgotten before; every version of it was taken out" in purged.output
    assert "third floor" not in _everything_git_keeps()


@given(st.text(alphabet="ab.+-@ c1", max_size=60))
def test_the_email_pattern_finds_what_it_found_before_trying_only_where_one_can_start(text):
    """From every position of a long run of an address's characters the search was quadratic
    (97 s for 200,000 letters in one message: the serve's loop held). It now starts only where
    an address can, and finds the same addresses."""
    import re

    from heron.memory.refuse import _EMAIL

    before = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
    assert [m.span() for m in _EMAIL.finditer(text)] == [m.span() for m in before.finditer(text)]
