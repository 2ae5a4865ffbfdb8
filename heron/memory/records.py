"""Memory's rows: every SQL statement of heron/memory/ lives here, each in a function named for
what it reads or writes, so the memory modules hold no SQL (tests/test_architecture_sql.py) and
nothing outside memory/ imports this module.

The full-text functions take FTS5 expressions as recall builds them (quoted words, a word as a
prefix `"word"*`, a quoted phrase, joined by OR). On SQLite they run on FTS5's `messages_fts`
(BM25); on PostgreSQL the same expression becomes a tsquery (`_tsquery`) over the generated
column `messages.body_tsv` (GIN), ranked by `ts_rank`: another scale than BM25, and recall
reads only the order (auto-recall's gate reads the words each hit holds, never the score).

    full-text index   messages_fts / body_tsv: counts, ranking, phrase matches, indexed text
    messages          the largest id, parents and children, dates, hit rows
    vectors           message_vectors: what lacks a vector, saving them, reading them back
    suggestions       memory_suggestions: the review queue
    snapshots         memory_snapshots: a conversation's frozen Memory section
    cursors           memory_cursors: the review cursor and the /new floor of recent history
    revocations       memory_revocations: what the user asked to forget
    summaries         other conversations' consolidation summaries (Recent history)
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from heron.memory import codes
from heron.store import Store
from heron.store.pg import REWRITES, pg_of
from heron.store.records import ANSWERED, stored_time

# ---- the full-text index (messages_fts, rowid = messages.id; body_tsv on PostgreSQL) ---------

# A message's indexed text on PostgreSQL: its text parts and the person's answers to ask_user
# (heron/store/migrations/m024_answers_indexed.py) joined by newlines, as SQLite's triggers
# write `messages_fts.body`; '' when it has none (it is then not indexed).
_ANSWERS = (
    '$[*] ? (@.kind == "tool_result" && @.is_error == false'
    f' && @.content starts with "{ANSWERED}").content'
)
_BODY = f"""array_to_string(ARRAY(SELECT jsonb_array_elements_text(jsonb_path_query_array(
    {{m}}.parts::jsonb, '$[*] ? (@.kind == "text").text')
    || jsonb_path_query_array({{m}}.parts::jsonb, '{_ANSWERS}'))), chr(10))"""
_PHRASE = re.compile(r'"([^"]*)"(\*?)')


def _tsquery(expression: str) -> tuple[str, str]:
    """An FTS5 expression of recall's (quoted words or phrases, `*` for a prefix, OR between
    them, parentheses around a number's groupings) as PostgreSQL's: the SQL that makes the
    tsquery, and its one parameter. One phrase of several words is a phrase search
    (`phraseto_tsquery`, which also keeps the stop words' places); otherwise each word is a
    lexeme, `:*` for a prefix, joined by `|`. A number is searched in the groupings as
    PostgreSQL's parser reads them (`numbers.pg_forms`: "48.250" is one word there), and a code
    in the spellings of its seams it tells apart (`codes.pg_forms`: "qx-99812", "qx 99812",
    "qx99812")."""
    found = _pg_phrases(expression)
    if len(found) == 1 and len(found[0][0].split()) > 1:
        return "phraseto_tsquery('english', ?)", found[0][0]
    # A phrase quoted whole: PostgreSQL's parser splits it as it split the messages (a code
    # such as "qx-99812" into 'qx' <-> '-99812', "v2.3.1" not at all), words joined by <->.
    lexemes = [_quoted(words) + (":*" if star else "") for words, star in found]
    return "to_tsquery('english', ?)", " | ".join(lexemes)


def _quoted(words: str) -> str:
    return "'" + words.replace("\\", "\\\\").replace("'", "''") + "'"


def _pg_phrases(expression: str) -> list[tuple[str, str]]:
    """The phrases of an FTS5 expression, each number's in PostgreSQL's groupings and each
    code's in its spellings, without repeats (a number's FTS5 forms give the same ones)."""
    found: dict[tuple[str, str], None] = {}
    for words, star in _PHRASE.findall(expression):
        if words.split():
            found.update(dict.fromkeys((form, star) for form in codes.pg_forms(words)))
    return list(found)


def rows_matching(store: Store, expression: str, cap: int) -> int:
    """How many indexed messages match an FTS5 expression, counted up to `cap`."""
    if pg_of(store.conn) is not None:
        query, param = _tsquery(expression)
        rows = store.query(
            f"SELECT count(*) FROM (SELECT 1 FROM messages WHERE body_tsv @@ {query} LIMIT ?) s",
            (param, cap),
        )
        return int(rows[0][0])
    rows = store.query(
        "SELECT count(*) FROM (SELECT 1 FROM messages_fts WHERE messages_fts MATCH ? LIMIT ?)",
        (expression, cap),
    )
    return int(rows[0][0])


def matches_elsewhere(store: Store, expression: str, conversation_id: int, cap: int) -> bool:
    """Whether one of the first `cap` messages matching an FTS5 expression belongs to another
    conversation than `conversation_id`, or `cap` messages or more match (taken as yes). The
    first match of another conversation ends the look (the matches stream through a
    co-routine, never collected whole)."""
    if pg_of(store.conn) is not None:
        query, param = _tsquery(expression)
        matches = f"SELECT conversation_id AS c FROM messages WHERE body_tsv @@ {query} LIMIT ?"
    else:
        param, matches = (
            expression,
            (
                "SELECT m.conversation_id AS c FROM messages_fts f CROSS JOIN messages m"
                " ON m.id = f.rowid WHERE messages_fts MATCH ? LIMIT ?"
            ),
        )
    found = store.query(
        f"SELECT 1 FROM ({matches}) s WHERE c != ? LIMIT 1", (param, cap, conversation_id)
    )
    return bool(found) or rows_matching(store, expression, cap) >= cap


def conversation_size(store: Store, conversation_id: int, cap: int) -> int:
    """How many messages the conversation holds, counted up to `cap` (from its index)."""
    rows = store.query(
        "SELECT count(*) FROM (SELECT 1 FROM messages WHERE conversation_id = ? LIMIT ?) s",
        (conversation_id, cap),
    )
    return int(rows[0][0])


# A conversation's filter on a full-text search. The unary plus keeps it out of FTS5's
# xBestIndex: offered `rowid IN (...)`, the planner runs the whole MATCH once per message of
# the conversation (75 ms at 100,000 messages); as a plain filter the list is built once and
# each match is checked against it before its bm25() is computed (under 1 ms).
_IN_CONVERSATION = "+rowid IN (SELECT id FROM messages WHERE conversation_id = ?)"


def bm25_ranked(
    store: Store,
    expression: str,
    limit: int,
    conversation_id: int | None = None,
    outside: int | None = None,
    newest: int | None = None,
    within: Sequence[tuple[float, float]] = (),
) -> list[tuple[int, float]]:
    """(message id, -bm25) best first for an FTS5 expression: within one conversation, or
    with `outside`, in every conversation but that one; with `newest`, among the newest
    `newest` matches of the whole index only (the others are never scored); with `within`,
    only messages written in one of those spans (start included, end not: the days a query
    names). On PostgreSQL the score is ts_rank's."""
    if pg_of(store.conn) is not None:
        return _ranked_pg(store, expression, limit, conversation_id, outside, newest, within)
    sql = "SELECT rowid, -bm25(messages_fts) AS s FROM messages_fts WHERE messages_fts MATCH ?"
    params: list[object] = [expression]
    if newest is not None:
        # A bare rowid bound is offered to FTS5 (plan `INDEX 0:M1>`): it skips the older
        # matches' entries instead of scoring them. The floor is the newest-th match's id.
        sql += (
            " AND rowid >= coalesce((SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?"
            " ORDER BY rowid DESC LIMIT 1 OFFSET ?), 0)"
        )
        params += [expression, newest - 1]
    if conversation_id is not None:
        sql += f" AND {_IN_CONVERSATION}"
        params.append(conversation_id)
    if outside is not None:
        sql += f" AND NOT {_IN_CONVERSATION}"
        params.append(outside)
    if within:  # `created` has no index: one pass over the messages, only when a day is named
        spans, values = _spans(within)
        sql += f" AND +rowid IN (SELECT id FROM messages WHERE {spans})"
        params += values
    # The same order as FTS5's "ORDER BY rank" (ties by rowid), a third faster at 100,000
    # messages: rank sorts every match, where SQLite keeps only the best `limit` as it goes.
    sql += " ORDER BY s DESC, rowid LIMIT ?"
    params.append(limit)
    return [(r[0], r[1]) for r in store.query(sql, params)]


def _ranked_pg(
    store: Store,
    expression: str,
    limit: int,
    conversation_id: int | None,
    outside: int | None,
    newest: int | None,
    within: Sequence[tuple[float, float]],
) -> list[tuple[int, float]]:
    query, param = _tsquery(expression)
    sql = f"SELECT id, ts_rank(body_tsv, q) AS s FROM messages, {query} q WHERE body_tsv @@ q"
    params: list[object] = [param]
    if newest is not None:
        # The floor's query is its own (a subquery naming the outer `q` would be run again for
        # every match: 100 ms a search at 1,500 messages); run once, before the scoring.
        sql += (
            f" AND id >= coalesce((SELECT id FROM messages, {query} f WHERE body_tsv @@ f"
            " ORDER BY id DESC LIMIT 1 OFFSET ?), 0)"
        )
        params += [param, newest - 1]
    if conversation_id is not None:
        sql += " AND conversation_id = ?"
        params.append(conversation_id)
    if outside is not None:
        sql += " AND conversation_id != ?"
        params.append(outside)
    if within:
        spans, values = _spans(within)
        sql += f" AND ({spans})"
        params += values
    params.append(limit)
    rows = store.query(sql + " ORDER BY s DESC, id LIMIT ?", params)
    return [(int(r[0]), float(r[1])) for r in rows]


def _spans(within: Sequence[tuple[float, float]]) -> tuple[str, list[object]]:
    """A filter on `created` for messages written in any of the spans, and its values."""
    sql = " OR ".join(["(created >= ? AND created < ?)"] * len(within))
    return sql, [t for span in within for t in span]


def typed_within(
    store: Store, within: Sequence[tuple[float, float]], conversation_id: int | None, limit: int
) -> list[int]:
    """The first `limit` messages the person wrote (as `typed_after` reads it) in any of the
    spans, in one conversation or all, oldest first."""
    sql, params = _typed_within(within, conversation_id)
    params.append(limit)
    return [r[0] for r in store.query(f"SELECT id {sql} ORDER BY created, id LIMIT ?", params)]


def count_typed_within(
    store: Store, within: Sequence[tuple[float, float]], conversation_id: int | None
) -> int:
    """How many messages `typed_within` has to give, all of them."""
    sql, params = _typed_within(within, conversation_id)
    return int(store.query(f"SELECT count(*) {sql}", params)[0][0])


def _typed_within(
    within: Sequence[tuple[float, float]], conversation_id: int | None
) -> tuple[str, list[object]]:
    """The FROM and WHERE of the messages the person wrote in any of the spans."""
    spans, params = _spans(within)
    sql = (
        f"FROM messages WHERE ({spans}) AND role = 'user' AND kind = 'message'"
        " AND (author IS NULL OR author = 'user')"
    )
    if conversation_id is not None:
        sql += " AND conversation_id = ?"
        params.append(conversation_id)
    return sql, params


def phrase_matches(
    store: Store, phrase: str, conversation_id: int | None, limit: int, newest: bool = False
) -> list[int]:
    """Ids of the messages matching an FTS5 phrase (or an OR of phrases: a number's
    groupings), oldest first (`newest`: newest first)."""
    if pg_of(store.conn) is not None:
        # The stemmed phrase finds the candidates through the index; the words as written,
        # stop words included, must then follow each other, as in FTS5's phrase ('english'
        # drops "is the": "is the router in the garage" would match "router in the garage").
        # A number's groupings are phrases of their own, OR-ed (the exact check holding
        # implies the stemmed one of the same phrase).
        forms = [words for words, _ in _pg_phrases(phrase)]
        stemmed = " || ".join(["phraseto_tsquery('english', ?)"] * len(forms))
        written = " || ".join(["phraseto_tsquery('simple', ?)"] * len(forms))
        exact = f"to_tsvector('simple', {_BODY.format(m='messages')})"
        sql = f"SELECT id FROM messages WHERE body_tsv @@ ({stemmed}) AND {exact} @@ ({written})"
        params: list[object] = [*forms, *forms]
        order, scope = "id", " AND conversation_id = ?"
    else:
        sql = "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?"
        params, order, scope = [phrase], "rowid", f" AND {_IN_CONVERSATION}"
    if conversation_id is not None:
        sql += scope
        params.append(conversation_id)
    params.append(limit)
    order += " DESC" if newest else ""
    return [r[0] for r in store.query(sql + f" ORDER BY {order} LIMIT ?", params)]


def indexed_text(store: Store, ids: Sequence[int]) -> dict[int, str]:
    """The indexed text of each message asked for that has any."""
    if not ids:
        return {}
    marks = ",".join("?" * len(ids))
    if pg_of(store.conn) is not None:
        body = _BODY.format(m="m")
        sql = f"SELECT id, {body} FROM messages m WHERE id IN ({marks})"
        return {r[0]: r[1] for r in store.query(sql, list(ids)) if r[1]}
    sql = f"SELECT rowid, body FROM messages_fts WHERE rowid IN ({marks})"
    return {r[0]: r[1] for r in store.query(sql, list(ids))}


# The index's vocabulary on SQLite: FTS5's own view of its terms (porter stems), a virtual
# table of this connection's temp schema (nothing stored: a read-only connection makes it too).
_VOCABULARY = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.heron_vocabulary"
    " USING fts5vocab(main, messages_fts, row)"
)


def vocabulary(store: Store, shortest: int, longest: int) -> list[tuple[str, int]]:
    """(word, messages holding it) of every word of the full-text index from `shortest` to
    `longest` characters, as the index keeps it (a stem: "carolin", "oliv"). Reads the whole
    index: for a word no message holds, never on auto-recall's path."""
    if pg_of(store.conn) is not None:
        sql = (
            "SELECT word, ndoc FROM ts_stat('SELECT body_tsv FROM messages')"
            " WHERE length(word) BETWEEN ? AND ?"
        )
    else:
        store.query(_VOCABULARY)
        sql = "SELECT term, doc FROM temp.heron_vocabulary WHERE length(term) BETWEEN ? AND ?"
    return [(str(r[0]), int(r[1])) for r in store.query(sql, (shortest, longest))]


# FTS5's porter stemmer, as the index applied it, on a private database in memory: a word
# written to it is read back from its vocabulary, without a write to the store.
_STEMMER_LOCK = threading.Lock()
_STEMMER: sqlite3.Connection | None = None


def stems(store: Store, words: Sequence[str]) -> dict[str, str]:
    """Each word as the full-text index keeps it (its stem: "caroleine" -> "carolein"); a word
    the index would not keep (a stop word on PostgreSQL) is left out."""
    if not words:
        return {}
    if pg_of(store.conn) is not None:
        rows = store.query(
            "SELECT w, array_to_string(tsvector_to_array(to_tsvector('english', w)), ' ')"
            " FROM unnest(?::text[]) w",
            (list(words),),
        )
        return {r[0]: r[1] for r in rows if r[1]}
    global _STEMMER
    with _STEMMER_LOCK:
        if _STEMMER is None:
            _STEMMER = sqlite3.connect(":memory:", check_same_thread=False)
            _STEMMER.execute("CREATE VIRTUAL TABLE w USING fts5(t, tokenize = 'porter unicode61')")
            _STEMMER.execute("CREATE VIRTUAL TABLE v USING fts5vocab(w, instance)")
        _STEMMER.executemany("INSERT INTO w (rowid, t) VALUES (?, ?)", enumerate(words, 1))
        found = _STEMMER.execute("SELECT doc, term FROM v WHERE offset = 0").fetchall()
        _STEMMER.execute("DELETE FROM w")
    return {words[doc - 1]: term for doc, term in found}


# ---- messages ---------------------------------------------------------------------------------


def max_message_id(store: Store) -> int:
    """The largest message id (0 for none), read from the primary key: it stands in for the
    count, which costs a scan."""
    return int(store.query("SELECT coalesce(max(id), 0) FROM messages")[0][0])


def parent_links(store: Store, ids: Sequence[int]) -> list[tuple[int, int | None]]:
    """(message, parent) for the messages asked for and their children."""
    if not ids:
        return []
    marks = ",".join("?" * len(ids))
    rows = store.query(
        f"SELECT id, parent_id FROM messages WHERE id IN ({marks}) OR parent_id IN ({marks})",
        [*ids, *ids],
    )
    return [(r[0], r[1]) for r in rows]


# Which of the asked ids are on the branch ending at a head: the branch is walked down to the
# oldest of them, no further (ids fall along a branch: a parent is older than its child).
_ON_CHAIN_SQL = """WITH RECURSIVE chain(id) AS (
    SELECT ?
    UNION ALL
    SELECT m.parent_id FROM messages m{indexed} JOIN chain ON m.id = chain.id
    WHERE m.parent_id IS NOT NULL AND m.parent_id >= ?)
  SELECT id FROM chain WHERE id IN ({marks})"""
# Each step of SQLite's walk reads the parent from the index of (id, parent_id) (m029), a few
# pages for the whole walk: left to itself the planner takes the table's rows, a page a step.
_PARENT_OF = " INDEXED BY messages_parent_of"


def on_chain(store: Store, head_id: int, ids: Sequence[int]) -> set[int]:
    """Which of the messages asked for are on the branch that ends at `head_id`."""
    if not ids:
        return set()
    indexed = "" if pg_of(store.conn) is not None else _PARENT_OF
    sql = _ON_CHAIN_SQL.format(indexed=indexed, marks=",".join("?" * len(ids)))
    return {r[0] for r in store.query(sql, (head_id, min(ids), *ids))}


def placed(store: Store, ids: Sequence[int]) -> dict[int, tuple[int, int | None, float]]:
    """message id -> (its conversation, that conversation's head and `created`), of the
    messages asked for."""
    if not ids:
        return {}
    marks = ",".join("?" * len(ids))
    rows = store.query(
        "SELECT m.id, c.id, c.head_id, c.created FROM messages m JOIN conversations c"
        f" ON c.id = m.conversation_id WHERE m.id IN ({marks})",
        list(ids),
    )
    return {r[0]: (r[1], r[2], float(r[3])) for r in rows}


def typed_after(store: Store, conversation_id: int, message_id: int, limit: int) -> list[int]:
    """The first `limit` messages the person wrote in the conversation after `message_id` (role
    user, kind message, their authorship: not Heron's rows nor a row of tool results), on any
    branch, oldest first."""
    rows = store.query(
        "SELECT id FROM messages WHERE conversation_id = ? AND id > ? AND role = 'user'"
        " AND kind = 'message' AND (author IS NULL OR author = 'user') ORDER BY id LIMIT ?",
        (conversation_id, message_id, limit),
    )
    return [r[0] for r in rows]


def messages_from(store: Store, conversation_id: int, lowest: int) -> int:
    """How many messages of the conversation have an id of `lowest` or more (from its index)."""
    rows = store.query(
        "SELECT count(*) FROM messages WHERE conversation_id = ? AND id >= ?",
        (conversation_id, lowest),
    )
    return int(rows[0][0])


def written_since(
    store: Store, conversation_id: int, since: float, below: int | None, cap: int
) -> bool:
    """Whether a message of the conversation (with an id under `below`, when given) was
    written at `since` or later. The newest `cap` of them are read, newest first, until one
    is; when `cap` or more are older than `since`, the answer is yes (not known)."""
    under = "" if below is None else " AND id < ?"
    params: list[object] = [conversation_id, *([] if below is None else [below])]
    found = store.query(
        f"SELECT 1 FROM (SELECT created FROM messages WHERE conversation_id = ?{under}"
        " ORDER BY id DESC LIMIT ?) s WHERE created >= ? LIMIT 1",
        [*params, cap, since],
    )
    if found:
        return True
    rows = store.query(
        f"SELECT count(*) FROM (SELECT 1 FROM messages WHERE conversation_id = ?{under} LIMIT ?) s",
        [*params, cap],
    )
    return int(rows[0][0]) >= cap


def of_conversation(store: Store, ids: Sequence[int], conversation_id: int) -> set[int]:
    """Which of the messages asked for belong to the conversation, a small one (the caller's
    `Recall._outside` asks only for one of at most SMALL_SCOPE messages): its ids are read from
    their index and met with the ids asked for, half the time of looking up each of the
    hundreds asked for by its id."""
    if not ids:
        return set()
    rows = store.query("SELECT id FROM messages WHERE conversation_id = ?", (conversation_id,))
    return {r[0] for r in rows}.intersection(ids)


def message_dates(store: Store, ids: Sequence[int]) -> list[tuple[int, int, float]]:
    """(message, conversation, created) of the messages asked for."""
    if not ids:
        return []
    marks = ",".join("?" * len(ids))
    rows = store.query(
        f"SELECT id, conversation_id, created FROM messages WHERE id IN ({marks})", list(ids)
    )
    return [(r[0], r[1], stored_time(r[2])) for r in rows]


def hit_rows(store: Store, ids: Sequence[int]) -> list[tuple[Any, ...]]:
    """id, conversation_id, key, role, created, body and author of each indexed message asked
    for."""
    if not ids:
        return []
    marks = ",".join("?" * len(ids))
    if pg_of(store.conn) is not None:
        body = _BODY.format(m="m")
        rows = store.query(
            f"SELECT m.id, m.conversation_id, c.key, m.role, m.created, {body}, m.author"
            f" FROM messages m JOIN conversations c ON c.id = m.conversation_id"
            f" WHERE m.id IN ({marks})",
            list(ids),
        )
        rows = [r for r in rows if r[5]]
    else:
        rows = store.query(
            f"SELECT m.id, m.conversation_id, c.key, m.role, m.created, f.body, m.author"
            f" FROM messages m JOIN conversations c ON c.id = m.conversation_id"
            f" JOIN messages_fts f ON f.rowid = m.id WHERE m.id IN ({marks})",
            list(ids),
        )
    return [(*r[:4], stored_time(r[4]), *r[5:]) for r in rows]


# ---- vectors (message_vectors) -----------------------------------------------------------------


def unembedded(
    store: Store,
    model: str,
    after: int,
    conversation_id: int | None = None,
    limit: int | None = None,
) -> list[sqlite3.Row]:
    """(id, text, the previous message's text) of the indexed messages above `after` that
    have no vector for `model`, oldest first (the first `limit` of them)."""
    pg = pg_of(store.conn) is not None
    if pg:  # every message with its text (a tool call has none: it is never embedded)
        body, prev = _BODY.format(m="m"), f"nullif({_BODY.format(m='p')}, '')"
        sql = f"SELECT m.id, {body}, {prev} FROM messages m LEFT JOIN messages p"
    else:
        sql = (
            "SELECT m.id, f.body, p.body FROM messages_fts f JOIN messages m ON m.id = f.rowid"
            " LEFT JOIN messages_fts p"
        )
    sql += (
        f" ON p.{'id' if pg else 'rowid'} = m.parent_id"
        " LEFT JOIN message_vectors v ON v.message_id = m.id AND v.model = ?"
        " WHERE v.message_id IS NULL AND m.id > ?"
    )
    params: list[object] = [model, after]
    if pg:
        sql += f" AND {body} <> ''"
    if conversation_id is not None:
        sql += " AND m.conversation_id = ?"
        params.append(conversation_id)
    sql += " ORDER BY m.id"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return store.query(sql, params)


def count_unembedded(store: Store, model: str) -> int:
    """How many indexed messages have no vector for `model` (a scan: for a notice or a
    progress bar, never on a search)."""
    if pg_of(store.conn) is not None:
        sql = f"SELECT count(*) FROM messages m WHERE {_BODY.format(m='m')} <> ''"
    else:
        sql = "SELECT count(*) FROM messages_fts m WHERE 1"
    sql += (
        f" AND NOT EXISTS (SELECT 1 FROM message_vectors v WHERE v.message_id ="
        f" m.{'id' if pg_of(store.conn) is not None else 'rowid'} AND v.model = ?)"
    )
    return int(store.query(sql, [model])[0][0])


def save_vectors(store: Store, model: str, vectors: Iterable[tuple[int, bytes]]) -> None:
    """Store (message id, packed vector) pairs for `model`, in one transaction."""
    with store.transaction() as c:
        c.executemany(
            "INSERT OR REPLACE INTO message_vectors (message_id, model, vector) VALUES (?, ?, ?)",
            [(i, model, v) for i, v in vectors],
        )


def write_stamp(store: Store) -> tuple[int, int]:
    """Changes when what recall searches changed, by this connection or another. On SQLite,
    any write: this connection's changes and `PRAGMA data_version` (another's commit). On
    PostgreSQL, where no such mark exists: the newest message id (appends) and the count of
    rewrites of stored messages (`heron_rewrites`: deletes, heron/store/db.py), read in one
    statement. (A message committed after a newer one moves neither, until the next append:
    what is kept by it is one turn's searches.)"""
    pg = pg_of(store.conn)
    if pg is None:
        return store.conn.total_changes, int(store.query("PRAGMA data_version")[0][0])
    row = store.query(
        "SELECT (SELECT coalesce(max(id), 0) FROM messages),"
        f" (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {REWRITES})"
    )[0]
    return int(row[0]), int(row[1])


def vectors_stamp(store: Store) -> tuple[int, int] | None:
    """Changes when a vector may have been written: SQLite's `write_stamp`. None on
    PostgreSQL, where another worker's vectors move no mark: `vector_stamp` is the check."""
    return None if pg_of(store.conn) is not None else write_stamp(store)


def vector_stamp(store: Store, model: str) -> tuple[int, int]:
    """How many vectors `model` has, and the sum of their message ids."""
    row = store.query(
        "SELECT count(*), coalesce(sum(message_id), 0) FROM message_vectors WHERE model = ?",
        (model,),
    )[0]
    return int(row[0]), int(row[1])


def vector_rows(store: Store, model: str, after: int) -> list[sqlite3.Row]:
    """(message id, conversation, vector, parent or 0, created) of `model`'s vectors of the
    messages above `after`, in id order."""
    return store.query(
        "SELECT v.message_id, m.conversation_id, v.vector, coalesce(m.parent_id, 0),"
        " m.created FROM message_vectors v JOIN messages m ON m.id = v.message_id"
        " WHERE v.model = ? AND v.message_id > ? ORDER BY v.message_id",
        (model, after),
    )


# ---- the review queue (memory_suggestions) ----------------------------------------------------

SUGGESTION_COLUMNS = (
    "kind",
    "path",
    "text",
    "quote",
    "mistake",
    "reason",
    "origin",
    "conversation_id",
    "message_id",
    "base_digest",
    "created",
)


def queue_suggestion(store: Store, values: Mapping[str, object]) -> int:
    """Insert a suggestion (SUGGESTION_COLUMNS), unless one with the same kind, path, text and
    quote is already waiting: in one transaction, the id of the new or the waiting one."""
    with store.transaction() as c:
        same = c.execute(
            "SELECT id FROM memory_suggestions WHERE status = 'waiting' AND kind = ?"
            " AND path IS ? AND text IS ? AND quote IS ?",
            (values["kind"], values["path"], values["text"], values["quote"]),
        ).fetchone()
        if same is not None:
            return int(same[0])
        cur = c.execute(
            "INSERT INTO memory_suggestions (kind, path, text, quote, mistake, reason, origin,"
            " conversation_id, message_id, base_digest, created)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [values[k] for k in SUGGESTION_COLUMNS],
        )
    assert cur.lastrowid is not None
    return cur.lastrowid


def suggestion(store: Store, suggestion_id: int) -> sqlite3.Row | None:
    rows = store.query("SELECT * FROM memory_suggestions WHERE id = ?", (suggestion_id,))
    return rows[0] if rows else None


def waiting_suggestions(store: Store) -> list[sqlite3.Row]:
    return store.query("SELECT * FROM memory_suggestions WHERE status = 'waiting' ORDER BY id")


def rejected_suggestions(store: Store) -> list[sqlite3.Row]:
    return store.query("SELECT * FROM memory_suggestions WHERE status = 'rejected' ORDER BY id")


def count_waiting(store: Store) -> int:
    rows = store.query("SELECT COUNT(*) FROM memory_suggestions WHERE status = 'waiting'")
    return int(rows[0][0])


def set_status(store: Store, suggestion_id: int, status: str, when: float) -> None:
    with store.transaction() as c:
        c.execute(
            "UPDATE memory_suggestions SET status = ?, decided = ? WHERE id = ?",
            (status, when, suggestion_id),
        )


# ---- snapshots (memory_snapshots) -------------------------------------------------------------


def snapshot(store: Store, conversation_id: int) -> sqlite3.Row | None:
    """section, digests, announced, taken and thawed of the conversation's frozen section."""
    rows = store.query(
        "SELECT section, digests, announced, taken, thawed FROM memory_snapshots"
        " WHERE conversation_id = ?",
        (conversation_id,),
    )
    return rows[0] if rows else None


def thaw_holding(store: Store, rel: str) -> int:
    """Thaw every frozen section that holds the entry `rel`, its text blanked now (it may hold
    a secret; its digests stay, to tell the next turn what was removed); how many."""
    with store.transaction() as c:
        done = c.execute(
            "UPDATE memory_snapshots SET section = '', thawed = 1 WHERE digests LIKE ?",
            (f'%"{rel}"%',),  # a path holds no LIKE wildcard: letters, digits, -, / and .
        )
        return int(done.rowcount or 0)


def save_snapshot(
    store: Store, conversation_id: int, section: str, digests: str, taken: float
) -> None:
    """Freeze the conversation's section (digests: JSON), nothing announced yet."""
    with store.transaction() as c:
        c.execute(
            "INSERT OR REPLACE INTO memory_snapshots (conversation_id, section, digests,"
            " announced, taken, thawed) VALUES (?, ?, ?, '{}', ?, 0)",
            (conversation_id, section, digests, taken),
        )


def set_announced(store: Store, conversation_id: int, announced: str) -> None:
    with store.transaction() as c:
        c.execute(
            "UPDATE memory_snapshots SET announced = ? WHERE conversation_id = ?",
            (announced, conversation_id),
        )


def drop_snapshot(store: Store, conversation_id: int) -> None:
    with store.transaction() as c:
        c.execute("DELETE FROM memory_snapshots WHERE conversation_id = ?", (conversation_id,))


# ---- cursors (memory_cursors) -------------------------------------------------------------------


def reviewed_up_to(store: Store, conversation_id: int) -> int:
    rows = store.query(
        "SELECT reviewed_message_id FROM memory_cursors WHERE conversation_id = ?",
        (conversation_id,),
    )
    return int(rows[0][0]) if rows else 0


def message_ids_after(store: Store, conversation_id: int, after: int) -> list[int]:
    """The ids of the conversation's messages past `after` (a review cursor), in order."""
    rows = store.query(
        "SELECT id FROM messages WHERE conversation_id = ? AND id > ? ORDER BY id",
        (conversation_id, after),
    )
    return [int(r[0]) for r in rows]


def set_reviewed_up_to(store: Store, conversation_id: int, message_id: int) -> None:
    with store.transaction() as c:
        c.execute(
            "INSERT INTO memory_cursors (conversation_id, reviewed_message_id) VALUES (?, ?)"
            " ON CONFLICT (conversation_id) DO UPDATE SET"
            " reviewed_message_id = excluded.reviewed_message_id",
            (conversation_id, message_id),
        )


def history_floor(store: Store, conversation_id: int) -> float:
    rows = store.query(
        "SELECT history_floor FROM memory_cursors WHERE conversation_id = ?", (conversation_id,)
    )
    return float(rows[0][0]) if rows else 0.0


def set_history_floor(store: Store, conversation_id: int, when: float) -> None:
    with store.transaction() as c:
        c.execute(
            "INSERT INTO memory_cursors (conversation_id, history_floor) VALUES (?, ?)"
            " ON CONFLICT (conversation_id) DO UPDATE SET history_floor = excluded.history_floor",
            (conversation_id, when),
        )


# ---- revocations (memory_revocations) ---------------------------------------------------------


def revocations(store: Store) -> list[tuple[str, float]]:
    """Every revoked statement in force (normalised; no entry in force says it) with when it
    was revoked."""
    rows = store.query("SELECT quote_key, created FROM memory_revocations WHERE held = 0")
    return [(r[0], float(r[1])) for r in rows]


def revoked_since(store: Store, created: float) -> list[str]:
    """The normalised statements in force revoked at or after `created`."""
    rows = store.query(
        "SELECT quote_key FROM memory_revocations WHERE held = 0 AND created >= ?", (created,)
    )
    return [r[0] for r in rows]


def revoked_statements(store: Store) -> list[tuple[int, str, bool]]:
    """id, statement and whether an entry in force says it, of every revocation."""
    rows = store.query("SELECT id, quote_key, held FROM memory_revocations")
    return [(int(r[0]), r[1], bool(r[2])) for r in rows]


def set_held(store: Store, held: Iterable[int], free: Iterable[int]) -> None:
    """Mark the revocations `held` (an entry in force says them: void) and `free` (none)."""
    with store.transaction() as c:
        for ids, value in ((held, 1), (free, 0)):
            for i in ids:
                c.execute("UPDATE memory_revocations SET held = ? WHERE id = ?", (value, i))


def unchecked_revocations(store: Store) -> list[tuple[int, str]]:
    """id and statement of the revocations stored before they were checked for a secret."""
    rows = store.query("SELECT id, quote_key FROM memory_revocations WHERE checked = 0")
    return [(int(r[0]), r[1]) for r in rows]


def set_checked(store: Store, statements: Mapping[int, str]) -> None:
    """Each revocation's statement as checked: its secret's words left out."""
    with store.transaction() as c:
        for i, statement in statements.items():
            c.execute(
                "UPDATE memory_revocations SET quote_key = ?, checked = 1 WHERE id = ?",
                (statement, i),
            )


def revoke(
    store: Store,
    statements: Iterable[str],
    path: str,
    conversation_id: int | None,
    message_id: int | None,
    when: float,
) -> None:
    with store.transaction() as c:
        for statement in statements:
            c.execute(
                "INSERT INTO memory_revocations (quote_key, path, conversation_id,"
                " message_id, created, checked) VALUES (?, ?, ?, ?, ?, 1)",
                (statement, path, conversation_id, message_id, when),
            )


# ---- other conversations' summaries -----------------------------------------------------------


def consolidations_elsewhere(store: Store, conversation_id: int, until: float) -> list[sqlite3.Row]:
    """created, summary, meta and conversation key of the consolidation summaries of the other
    conversations, written up to `until`, oldest first."""
    return store.query(
        "SELECT c.created, c.summary, c.meta, v.key FROM compactions c JOIN conversations v"
        " ON v.id = c.conversation_id WHERE c.kind IN ('consolidation', 'fallback')"
        " AND c.conversation_id != ? AND c.created <= ? ORDER BY c.id",
        (conversation_id, until),
    )
