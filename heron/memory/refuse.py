"""What memory refuses whatever the quote: secrets, and sensitive claims not asked for.

Secrets are the patterns tool output is scrubbed of (heron/redact.py), and what a person says
in passing: PIN-like numbers, card numbers (Luhn), social security numbers, identity documents'
numbers, passwords in any phrasing ("pass hunter2", "my password for the bank is x"), long hex
or random strings, a key spelled out a character at a time ("s-k-a-n-t-..."), and a credential
in ordinary words (`find_credential`: the four shapes it looks for are told there). Sensitive
claims (health, sexuality, religion, politics) are saved only when the person explicitly asked
to remember that exact thing. Every function is pure and returns what it found, in words the
model is told.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache

from heron.redact import PATTERNS, entropy

_STRONG = r"(?:password|passwd|passphrase|passcode|mot de passe|kennwort)s?"
# Words right after a credential noun that make it another thing ("password manager").
_NOT_CREDENTIAL = frozenset(
    """manager managers vault app apps reset resets policy policies rules requirements hint hints
    field fields prompt prompts screen page strength length protected protection change changes
    changed expired expires expiry recovery generator lock locks pages""".split()  # noqa: SIM905
)
_OTHER_THING = "|".join(sorted(_NOT_CREDENTIAL))
# A word with a digit or a symbol in it (punctuation that ends a sentence does not count).
_VALUE = r"(?=\S*[\d_]|\S*[^\w\s.,;:!?])\S{4,}"


# The patterns are compiled on first use (`_secret_patterns`, `_sensitive_patterns`): most
# processes never save a memory, and compiling them cost a few milliseconds of every start.
@cache
def _secret_patterns() -> list[tuple[str, re.Pattern[str]]]:
    return [
        *((f"a secret ({kind})", pattern) for kind, pattern in PATTERNS),
        ("a bearer token", re.compile(r"\bbearer\s+[A-Za-z0-9._~+/=-]{16,}", re.IGNORECASE)),
        (
            "a password",
            re.compile(
                rf"\b{_STRONG}\b(?!\s+(?:{_OTHER_THING})\b)(?:[^.\n]{{0,40}}?(?:\bis\b|\bwas\b|=|:)\s*\S{{3,}}"
                rf"|\s*[:=]?\s*{_VALUE})"
                rf"|\b(?:pass|pw|pwd)(?:\s*[:=]\s*|\s+)(?=\S*\d)\S{{4,}}",
                re.IGNORECASE,
            ),
        ),
        (
            "a PIN or access code",
            re.compile(
                r"\b(?:pin|pin code|pin number|passcode|combination|door code|lock code"
                r"|access code|security code|alarm code)\b"
                r"[^\d\n]{0,16}\d(?:[ -]?\d){3,7}\b",
                re.IGNORECASE,
            ),
        ),
        (
            "a social security number",
            re.compile(
                r"\b\d{3}-\d{2}-\d{4}\b|\b(?:ssn|social security(?: number)?)\b\D{0,16}\d{3}", re.I
            ),
        ),
        (
            "a credential",
            re.compile(
                r"\b(?:api[_ -]?key|secret|token|access[_ -]?key)\s*(?:is|=|:)\s*\S{6,}", re.I
            ),
        ),
        (
            "an identity document's number",
            re.compile(
                r"\b(?:passport|id card|identity card|national id|driver'?s licen[cs]e"
                r"|personalausweis|reisepass|carte d'identit[ée]|passeport)"
                r"(?:\s*(?:number|no\.?|nr\.?|#|num[ée]ro))?\b[^.\n]{0,24}?"
                r"(?<![\w-])(?=[A-Z0-9]*\d)[A-Z0-9]{6,12}\b",
                re.IGNORECASE,
            ),
        ),
        ("a key (a long hex string)", re.compile(r"\b[0-9a-fA-F]{24,}\b")),
        # One character, one separator, at least ten times: a key or code spelled out to get past
        # the patterns above.
        ("a key or code spelled out", re.compile(r"(?<![\w-])(?:[A-Za-z0-9][-_.,\s]){9,}\w\b")),
    ]


# Card networks' numbers start with 2 to 6 (Mastercard, Amex, Visa, Discover); a phone number
# written "+49 176 ..." or "0176 ..." is none, though one in ten passes the Luhn check.
_CARD = r"(?<![+\d])\b[2-6](?:[ -]?\d){12,18}\b"
_TOKEN = r"[A-Za-z0-9+/=_\-.]{20,}"


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _random_looking(token: str) -> bool:
    """Long, high-entropy and mixing character classes: a key or token, not a word or a path."""
    if token.count("/") > 2 or token.count(".") > 1:
        return False  # a path, a URL or a dotted name
    classes = sum(bool(re.search(p, token)) for p in (r"[a-z]", r"[A-Z]", r"[0-9]", r"[+/=_\-]"))
    return classes >= 3 and entropy(token) >= 3.8


def find_secret(text: str) -> str | None:
    """What kind of secret `text` holds, or None. Patterns first, then a credential in
    ordinary phrasing (`find_credential`), card numbers (Luhn), then any long token random
    enough to be a key."""
    for what, pattern in _secret_patterns():
        if pattern.search(text):
            return what
    found = find_credential(text)
    if found:
        return found
    for match in re.finditer(_CARD, text):
        digits = re.sub(r"\D", "", match.group())
        if 13 <= len(digits) <= 19 and _luhn(digits):
            return "a card number"
    for match in re.finditer(_TOKEN, text):
        if _random_looking(match.group()):
            return "a token or key (a long random string)"
    return None


MASK = "\u2026"  # what stands where a secret's words were left out


def without_secret(text: str) -> str:
    """`text` with the words of each secret it holds left out, each run as one MASK: "My bank
    PIN is 4711 and the wifi password is tulips99" -> "My bank … and the wifi …". What a
    forget keeps of a statement (heron/memory/service.py): its other words still revoke it,
    and no secret is kept."""
    words = text.split()
    for start, end in secret_runs(words):
        words[start:end] = [MASK]
    return MASK if find_secret(" ".join(words)) else " ".join(words)


LINE_MASKED_MAX = 2_000  # characters of a line whose secret is cut out word by word


def notes_without_secrets(text: str) -> str:
    """A workspace file Heron's tools wrote (USER.md, AGENTS.md, SOUL.md) as the system prompt
    carries it: each line holding a secret by memory's rules with the secret's words left out
    (a line over LINE_MASKED_MAX characters wholly: `secret_runs` is quadratic in its words),
    under a note saying what was; a secret spread over lines leaves none of the text. The
    tools write what any text they read told them to: a card number there is not the person
    giving it (qa24d Medium 1), and memory would refuse it. None found: `text` as it is."""
    lines = text.split("\n")
    kinds: list[str] = []
    for i, line in enumerate(lines):
        kind = find_secret(line)
        if kind is None:
            continue
        kinds.append(kind)
        indent = line[: len(line) - len(line.lstrip())]
        lines[i] = indent + (without_secret(line) if len(line) <= LINE_MASKED_MAX else MASK)
    kept = "\n".join(lines)
    spread = find_secret(kept)
    if not kinds and spread is None:
        return text
    what = ", ".join(dict.fromkeys(kinds if spread is None else [*kinds, spread]))
    if spread is not None:
        return f"[Heron left this file's text out: it holds what looks like {what}]"
    return f"[Heron left out what looks like {what}, each as {MASK}]\n{kept}"


def secret_runs(words: list[str]) -> Iterator[tuple[int, int]]:
    """Each secret's run of `words` as (start, end); the caller replaces `words[start:end]` by
    one word (a MASK) before the next is looked for, so a later run may hold an earlier one's
    MASK. A secret's run is found word by word, since the shapes say what they found, not
    where: the shortest start of the text that holds one ends at the secret's last word, and
    the shortest end of that start holds the whole secret (the word that names it too: "PIN
    is 4711"). Each round masks at least one word: at most one round a word."""
    for _ in range(len(words)):
        if not find_secret(" ".join(words)):
            return
        end = next(i for i in range(1, len(words) + 1) if find_secret(" ".join(words[:i])))
        start = next(j for j in range(end - 1, -1, -1) if find_secret(" ".join(words[j:end])))
        yield start, end


# ---- credentials in ordinary phrasing ---------------------------------------------------------
#
# A person gives a credential the way they would tell a friend: "the router login is admin with
# Summer2024!", "the alarm disarms with 8 2 6 1", "passphrase correct horse battery staple". No
# single pattern holds all of those, but each is one of four shapes, and none of the four is how
# an ordinary fact is said:
#   1. a word that names a credential (in a few languages), then its value in the same clause;
#   2. a word that looks like a password: capitals, small letters, digits and a symbol inside;
#   3. an email address with a password-like word right after it ("a@b.c / x", "a@b.c:x");
#   4. a number spelled out a digit at a time, as a PIN is dictated ("8 2 6 1").
# A number or an address alone is not a secret ("my flat is number 4711", "write to me at
# dana@example.com"): only a word that names a credential makes a bare number or word one.

# Words that name a credential whose value may be a plain word ("the password is tulips").
_WORD_NOUNS = (
    r"passwords?|passwd|passphrases?|pass phrases?|passcodes?|pass codes?"
    r"|security answers?|secret answers?|security question answers?|memorable words?"
    r"|recovery phrases?|seed phrases?|mnemonic"
    # French, German, Spanish, Portuguese, Italian, Dutch, Swedish and Danish/Norwegian.
    r"|mot de passe|mots de passe|kennwort|passwort|contrase[ñn]a|senha|parola d'ordine"
    r"|wachtwoord|l[öo]senord|adgangskode|passord"
)
# Words that name a credential whose value is a number or a word with digits or symbols in it
# ("the gate code is 4711", "my login is dana / Tr0ub4dor&3"): "the login page" is no secret.
_CODE_NOUNS = (
    r"pins?|pin codes?|pin numbers?|logins?|log-ins?|logons?|sign-ins?|credentials"
    r"|login details|recovery (?:codes?|keys?)|unlock codes?"
    r"|(?:door|gate|alarm|disarm|arming|lock|safe|access|security|entry|garage|keypad) codes?"
    r"|code pin|code secret|code d'acc[eè]s|identifiants?|geheimzahl|zugangs(?:code|daten)"
    r"|anmeldedaten|t[üu]rcode|c[oó]digo de acceso|codice pin|toegangscode"
)
# Verbs whose object is a credential ("disarms with", "I log in with").
_CRED_VERBS = (
    r"(?:dis)?arms?|unlocks?|log(?:s|ged)? ?in|sign(?:s|ed)? ?in|log(?:s|ged)? on"
    r"|authenticates?"
)
# Where a credential's value is given: after one of these, a plain word is the value.
_ASSIGN = re.compile(
    r"^(?:is|was|are|were|=|:|-+>?|reads|equals|set to|is set to|uses?|ist|lautet|est|es|é|è"
    r"|er|är)$",
    re.IGNORECASE,
)
# The first word after "is" that says no value follows ("the PIN is in the drawer").
_NOT_VALUE = frozenset(
    """the a an my your his her our their its this that these those in on at under inside behind
    with for from of to by somewhere stored saved kept written noted not never no none too very
    same different new old changed expired required needed long short secret private hidden
    unknown forgotten lost also still now being going hard easy weak strong only just always
    printed shown stuck taped labelled labeled
    der die das ein eine mein meine le la les un une mon ma mes el los las mi""".split()  # noqa
)
# Words a clause can hold that are no value: the words before a password, between two.
_STOPWORDS = _NOT_VALUE | frozenset(
    """and or but if then than so as is was are were be been it i me we you he she they
    and und et y e""".split()  # noqa: SIM905
)
# A phrase credential's value may be ordinary words ("passphrase correct horse battery staple").
_PHRASE_NOUNS = re.compile(
    r"pass ?phrases?|seed phrases?|recovery phrases?|mnemonic|memorable words?"
    r"|security answers?|secret answers?",
    re.IGNORECASE,
)
_CUE = re.compile(
    rf"(?<![\w-])(?:(?P<word>{_WORD_NOUNS})|(?P<noun>{_CODE_NOUNS})|(?P<verb>{_CRED_VERBS})\s+(?:it\s+|them\s+)?"
    rf"(?:with|using|by entering|by typing))(?![\w-])",
    re.IGNORECASE,
)
# Tried only where an address can start (not inside a run of its characters): from every
# position of a long run the search was quadratic, 97 s for 200,000 letters in one message.
_EMAIL = re.compile(r"(?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_AFTER_EMAIL = re.compile(
    r"\s*(?:[/:|,;]|\band\b|\bwith\b|\bpw\b|\bpwd\b|\bpass(?:word)?\b)\s*(?:[:=]\s*)?(\S+)",
    re.IGNORECASE,
)
# 4 to 8 single digits with a space, dash or dot between each: a PIN said aloud.
_SPACED_DIGITS = re.compile(r"(?<![\w.,-])\d(?:[ .-]\d){3,7}(?![\w]|[ .-]\d)")
_SPECIAL = re.compile(r"[^\w\s.,'@/:-]")  # symbols a password holds, not a name or a date
_YEAR_BEFORE = frozenset({"in", "since", "from", "until", "till", "by", "before", "after"})
_CLAUSE_END = re.compile(r"[.!?;](?:\s|$)|\n")
_EDGE_PUNCT = ".,;:!?)\"'"


def _bare(token: str) -> str:
    """A word without the punctuation a sentence puts around it."""
    return token.strip(_EDGE_PUNCT).lstrip("(\"'")


def password_like(token: str) -> bool:
    """Capitals, small letters, digits and a symbol inside the word, 8 characters or more:
    "Tr0ub4dor&3", "Qwerty!234". A name, a version or a date has fewer kinds of characters
    ("iPhone15", "Python3.12", "ISO-8601"); a symbol that ends it may end the sentence."""
    word = _bare(token)
    if len(word) < 8 or _EMAIL.fullmatch(word):
        return False
    inner = word[:-1]
    return (
        any(c.islower() for c in word)
        and any(c.isupper() for c in word)
        and any(c.isdigit() for c in word)
        and bool(_SPECIAL.search(inner))
    )


def _value_like(token: str) -> bool:
    """A word that could be a credential's value wherever it stands: four digits or more, or
    letters with digits or a symbol in them ("hunter2", "Summer2024!", "dana.k"). Not an email
    address (a login's name, the password is what follows it)."""
    word = _bare(token)
    if len(word) < 4 or _EMAIL.fullmatch(word):
        return False
    if word.isdigit():
        return True
    has_letter = any(c.isalpha() for c in word)
    return has_letter and (any(c.isdigit() for c in word) or bool(_SPECIAL.search(word)))


def _clause_after(text: str, at: int) -> str:
    """The rest of the clause from `at`, at most 80 characters."""
    tail = text[at : at + 80]
    end = _CLAUSE_END.search(tail)
    return tail[: end.start() + 1] if end else tail


def _value_after(cue: re.Match[str], text: str) -> bool:
    """Whether the clause after a credential word gives its value."""
    tail = _clause_after(text, cue.end())
    words = tail.split()
    noun = cue.group("word") or cue.group("noun")
    if noun and words and _bare(words[0]).casefold() in _NOT_CREDENTIAL:
        return False  # "password manager", "PIN reset": another thing
    if _SPACED_DIGITS.search(tail):
        return True
    for i, word in enumerate(words):
        before = _bare(words[i - 1]).casefold() if i else ""
        if _value_like(word) and not (_bare(word).isdigit() and before in _YEAR_BEFORE):
            return True
    if not cue.group("word"):
        return False  # "I sign in with Google", "the login is dana": no secret word given
    for i, word in enumerate(words[:-1]):
        if _ASSIGN.match(word.strip(",")) or word.endswith(":"):
            nxt = _bare(words[i + 1]).casefold()
            return len(nxt) >= 3 and nxt not in _NOT_VALUE
    if words and words[0].startswith((":", "=")):
        return True
    if _PHRASE_NOUNS.fullmatch(noun):
        content = [w for w in words[:4] if _bare(w).casefold() not in _STOPWORDS]
        return len(content) >= 2 and _bare(words[0]).casefold() not in _STOPWORDS
    return False


def find_credential(text: str) -> str | None:
    """A credential said in ordinary words, as what kind (the four shapes above), or None."""
    for cue in _CUE.finditer(text):
        if _value_after(cue, text):
            word = " ".join(cue.group().split()).casefold()
            return f'a credential (a value given for "{word}")'
    named = _code_named_by_what_it_opens(text)
    if named:
        return f'a credential (a value given for "{named}")'
    for email in _EMAIL.finditer(text):
        after = _AFTER_EMAIL.match(text, email.end())
        if after and _value_like(after.group(1)):
            return "a login (an email address with a password-like word after it)"
    if any(password_like(token) for token in text.split()):
        return "a password (a word mixing capitals, small letters, digits and a symbol)"
    if _SPACED_DIGITS.search(text):
        return "a PIN or code spelled out a digit at a time"
    return None


# ---- codes, combinations and keys named by what they open (shape 1 too) ----------------------
#
# "My gym locker code is 4711", "the combination to my bike lock is 3391", "the bike lock opens
# with 3391", "the wifi is called Home and its key is tulips" were saved to always/ (qa24b M2):
# the nouns of `_CODE_NOUNS` name a few things a code opens, and a person names any. So any
# code or combination is a credential's name, unless the word before it says the code is a
# public one (a postcode, a dress code, an error code), and only when its value is given right
# after "is" (or right after the code: "locker code 4711"); "the code is on GitHub" gives none.

# Words before "code" that make it a place's, a kind's or a rule's code: no credential.
_PUBLIC_CODES = frozenset(
    """post postal zip area dialling dialing calling country city airport iata icao flight sort
    swift bic iban routing tax vat hs customs tariff error status exit return response http
    fault trouble diagnostic engine colour color dress source qr bar product article item part
    model style course class module language locale currency discount promo promotional voucher
    coupon gift referral tracking booking confirmation reference ref order invoice customer
    client member membership employee student staff meeting time unicode ascii hex morse emoji
    machine cheat icd medical billing cost project department""".split()  # noqa: SIM905
)
_CODE = re.compile(
    r"(?<![\w-])(?:(?P<before>[\w'-]+)\s+)?(?P<code>codes?|code numbers?|combinations?)(?![\w-])",
    re.IGNORECASE,
)
# Words that give a code's value ("is"), and those that may stand between ("is set to 4711").
_CODE_ASSIGN = frozenset("is was = : reads ist lautet est es é è er är".split())  # noqa: SIM905
_CODE_FILLER = frozenset("set to now still".split())  # noqa: SIM905
# A number followed by one of these counts something: "the code is 2000 lines long".
_COUNTED = frozenset(
    """lines line characters chars words bytes files tests commits times years days hours
    minutes people percent""".split()  # noqa: SIM905
)
_LOCKS = (
    r"(?:pad|bike |bicycle |cable |combination |door |u-)?locks?|(?:key ?)?safes?"
    r"|(?:lock|key) ?box(?:es)?|lockers?|doors?|gates?|sheds?|garages?|suitcases?|briefcases?"
    r"|cabinets?|keypads?"
)
# A lock, then (in the same clause) what opens it: "the key safe at my mum's opens with 2580".
_OPENS = re.compile(
    rf"(?<![\w-])(?P<lock>{_LOCKS})(?![\w-])[^.\n;!?]{{0,40}}?\b(?:opens?|opened|comes open)"
    r"\s+(?:with|using|by entering|by typing|by dialling|by dialing|on)\s+(?:the\s+)?"
    r"(?:(?:code|number|combination|digits|pin)\s+)?(?P<value>\S+)",
    re.IGNORECASE,
)
_NETWORKS = r"wi-?fi|wlan|wireless|network|hotspot|router"
# A network's key, its value a plain word as a password's is: "the wifi is called Home and its
# key is tulips", "the key to our network is marmalade". "The key issue is the router" is none.
_NETWORK_KEY = re.compile(
    rf"(?<![\w-])(?:(?:{_NETWORKS})(?![\w-])[^.\n;!?]{{0,60}}?(?<![\w-])keys?"
    rf"|keys?\s+(?:to|for|of)\s+(?:the\s+|my\s+|our\s+|your\s+)?(?:{_NETWORKS}))(?![\w-])",
    re.IGNORECASE,
)


def _code_value(words: list[str], at: int) -> bool:
    """Whether `words[at]` is a code's value: four digits or more (a dash or dot between them
    allowed: "12-34-56"), or a word with digits or a symbol in it, and not a count."""
    if at >= len(words):
        return False
    word = _bare(words[at])
    digits = re.fullmatch(r"\d(?:[.-]?\d){3,}", word) is not None
    counted = at + 1 < len(words) and _bare(words[at + 1]).casefold() in _COUNTED
    return (digits or _value_like(word)) and not counted


def _code_given(tail: str) -> bool:
    """Whether the clause after "code" gives its value: right after it ("locker code 4711"), or
    after the first "is" within a few words ("the code for the back door is set to 4711")."""
    words = tail.split()
    if _code_value(words, 0):
        return True
    for i, word in enumerate(words[:8]):
        if word.casefold() in _CODE_ASSIGN or (word.endswith(":") and len(word) > 1):
            after = i + 1
            while after < len(words) and words[after].casefold() in _CODE_FILLER:
                after += 1
            return _code_value(words, after)
    return False


def _code_named_by_what_it_opens(text: str) -> str | None:
    """The words that name a code, a lock or a network's key whose value `text` gives, or
    None (the comment above says which)."""
    for code in _CODE.finditer(text):
        before = (code.group("before") or "").casefold()
        if before not in _PUBLIC_CODES and _code_given(_clause_after(text, code.end())):
            name = code.group("code").casefold()
            return name if before in _STOPWORDS else f"{before} {name}"
    for opens in _OPENS.finditer(text):
        if _code_value([opens.group("value")], 0):
            return " ".join(opens.group("lock").split()).casefold()
    for key in _NETWORK_KEY.finditer(text):
        words = _clause_after(text, key.end()).split()
        if len(words) > 1 and words[0].casefold() in _CODE_ASSIGN:
            value = _bare(words[1]).casefold()
            if len(value) >= 3 and value not in _NOT_VALUE:
                return "network key"
    return None


# ---- sensitive claims ------------------------------------------------------------------------


@cache
def _sensitive_patterns() -> list[tuple[str, re.Pattern[str]]]:
    return [
        (
            "health",
            re.compile(
                r"\b(?:hiv|aids|cancer|tumou?r|diabet\w*|depress\w*|anxiety|bipolar|schizophreni\w*"
                r"|adhd|autis\w*|ocd|ptsd|epilep\w*|diagnos\w*|disorder|disease|illness|chronic"
                r"|medication|prescri\w*|antidepressant\w*|therapy|therapist|psychiatri\w*"
                r"|pregnan\w*|miscarriage|abortion|addict\w*|rehab|overdose|suicid\w*|self-harm"
                r"|mental health|hepatitis|disabilit\w*|chemo\w*|insulin|surgery)\b",
                re.IGNORECASE,
            ),
        ),
        (
            "sexuality",
            re.compile(
                r"\b(?:gay|lesbian|bisexual|homosexual|heterosexual|queer|asexual|pansexual"
                r"|transgender|non-binary|nonbinary|sexual orientation|sexuality|closeted"
                r"|coming out|came out|sex life|kink\w*)\b",
                re.IGNORECASE,
            ),
        ),
        (
            "religion",
            re.compile(
                r"\b(?:religio\w*|muslim|islam\w*|christian\w*|catholic\w*|protestant|jewish"
                r"|judaism|jew|hindu\w*|buddhis\w*|sikh\w*|atheis\w*|agnostic|mormon|evangelical"
                r"|church|mosque|synagogue|pray\w*|faith|allah|bible|quran|torah)\b",
                re.IGNORECASE,
            ),
        ),
        (
            "politics",
            re.compile(
                r"\b(?:politic\w*|democrat\w*|republican\w*|socialist"
                r"|communist|fascist|libertarian|tory|tories|green party|left-wing"
                r"|right-wing|vote[sd]?|voting|voter|election\w*|party member|union member"
                r"|trump|biden|harris|maga)\b",
                re.IGNORECASE,
            ),
        ),
    ]


def find_sensitive(text: str) -> str | None:
    """Which sensitive kind of claim `text` makes (health, sexuality, religion, politics)."""
    for what, pattern in _sensitive_patterns():
        if pattern.search(text):
            return what
    return None
