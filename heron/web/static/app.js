// Heron's browser UI: one conversation's transcript and its live stream, over /ws (the serve
// protocol, docs/web.md) and the REST routes under /api. Preact with htm, no build step.
import { Component, h, render } from "./vendor/preact.js";
import { useEffect, useLayoutEffect, useRef, useState, useCallback } from "./vendor/preact-hooks.js";
import htm from "./vendor/htm.js";
import { marked } from "./vendor/marked.js";
import DOMPurify from "./vendor/purify.js";
import { highlightElement } from "./vendor/highlight/index.js";
import { advance } from "./live.js";

const html = htm.bind(h);
const LANGS = new Set(["asm", "bash", "c", "css", "csv", "diff", "docker", "git", "go", "html",
  "http", "ini", "java", "js", "json", "lua", "make", "md", "pl", "plain", "py", "regex", "rs",
  "sql", "toml", "ts", "uri", "xml", "yaml"]);
const ALIAS = { python: "py", javascript: "js", typescript: "ts", sh: "bash", shell: "bash",
  rust: "rs", yml: "yaml", markdown: "md", dockerfile: "docker", perl: "pl" };

// ---- markdown ---------------------------------------------------------------------------------

const mdCache = new Map(); // text -> sanitised HTML: a long transcript re-renders for free
const MD_CACHE = 5000;
const DRAW_MS = 50; // the live reply is drawn at most 20 times a second
// A conversation opens with its newest PAGE items; earlier ones come a page at a time, as the
// reader scrolls up to the top or presses "Load earlier messages" (docs/web.md). A 22,000-message
// branch drawn whole held 73,000 nodes and 0.6-1 GB of heap, and took 4 s to open.
const PAGE = 200;
const LIST_PAGE = 50; // conversations in the list, and how many more "More conversations" shows

// Model text is untrusted: sanitised after parsing, before it reaches the DOM. HTML only, no
// SVG or MathML: an svg the sanitiser emptied (its script-like children removed) still drew
// its default 300x150 as a blank block in the reply. No form control, and no class, style or
// id (but a code block's language): with them a reply drew an exact copy of the approval card,
// or a form asking for a key (qa21p finding 5). No raw-text element either (textarea, title,
// style, xmp, ...): left open, one reads the rest of its text as plain characters.
const RAW_TEXT = ["textarea", "title", "style", "xmp", "plaintext", "noembed", "noscript", "iframe",
  "noframes", "script"];
const SANITISE = {
  USE_PROFILES: { html: true },
  FORBID_TAGS: ["form", "button", "input", "select", "option", "optgroup", "datalist", ...RAW_TEXT],
  FORBID_ATTR: ["style", "id"],
  ALLOW_DATA_ATTR: false,
};
const CODE_LANGUAGE = /^language-[\w+-]+$/;
DOMPurify.addHook("uponSanitizeAttribute", (node, data) => {
  if (data.attrName === "class") {
    data.keepAttr = node.nodeName === "CODE" && CODE_LANGUAGE.test(data.attrValue);
  }
});
const toHtml = (text) => DOMPurify.sanitize(marked.parse(text, { gfm: true, breaks: false }), SANITISE);

export function renderMarkdown(text) {
  const key = text || "";
  let out = mdCache.get(key);
  if (out === undefined) {
    out = toHtml(key);
    if (mdCache.size >= MD_CACHE) mdCache.delete(mdCache.keys().next().value);
    mdCache.set(key, out);
  }
  return out;
}

function highlightIn(el) {
  for (const code of el.querySelectorAll("pre code")) {
    const m = /language-([\w+-]+)/.exec(code.className);
    let lang = m ? m[1].toLowerCase() : "plain";
    lang = ALIAS[lang] || lang;
    if (!LANGS.has(lang)) lang = "plain";
    code.dataset.lang = lang;
    highlightElement(code, lang, "multiline", { hideLineNumbers: true }).catch(() => {});
  }
}

function Markdown({ text }) {
  const ref = useRef(null);
  const out = renderMarkdown(text);
  useEffect(() => { if (ref.current && out.includes("<pre")) highlightIn(ref.current); }, [text]);
  return html`<div class="md" ref=${ref} dangerouslySetInnerHTML=${{ __html: out }}></div>`;
}

// A finished block of the streaming reply: parsed, sanitised and highlighted once, then never
// touched again (its text cannot change); only the tail after it is drawn anew.
class Block extends Component {
  shouldComponentUpdate() { return false; }
  componentDidMount() { if (this.base) highlightIn(this.base); }
  render({ text }) {
    return html`<div class="md-block" dangerouslySetInnerHTML=${{ __html: toHtml(text) }}></div>`;
  }
}

// The streaming text of a live reply: its finished blocks (keyed, drawn once) and the
// unfinished tail, the only part each draw parses. Both are laid out as one .md (the blocks'
// wrappers are display: contents), so the page looks as the whole text would.
function LiveText({ seg }) {
  const tail = advance(seg);
  if (tail !== seg.tail) { seg.tail = tail; seg.tailHtml = tail ? toHtml(tail) : ""; } // once a draw
  return html`<div class="md">${seg.blocks.map((b, i) => html`<${Block} key=${i} text=${b} />`)}
    ${tail && html`<div class="md-block md-tail" dangerouslySetInnerHTML=${{ __html: seg.tailHtml }}></div>`}</div>`;
}

// ---- the model of a conversation as shown -----------------------------------------------------

// A live turn, built from protocol events exactly as heron/web/transcript.py builds a stored
// one: the user's text, then ordered segments (reasoning, text, tool pills).
function newLive(ev) {
  // messageId: the stored row of the message that opened the turn (turn_start's message_id),
  // the same data-id its item has once the transcript is read again.
  // heron: the turn was opened by Heron (a subagent's result, a goal's nudge, a reminder), whose
  // message shows as a note, as the transcript shows it. asking: a question (ask_user) waits.
  return { turnId: ev.turn_id, messageId: ev.message_id ?? null,
    text: ev.text === null ? null : ev.text || "", files: ev.files || [], channel: ev.channel, segments: [],
    heron: !!ev.provenance && ev.provenance !== "user",
    started: Date.now(), done: false, mail: [], asking: false };
}

function applyToLive(live, ev) {
  const segs = live.segments;
  const last = segs[segs.length - 1];
  if (ev.type === "delta" || ev.type === "reasoning") {
    const kind = ev.type === "delta" ? "text" : "reasoning";
    if (last && last.kind === kind) last.text += ev.text;
    else segs.push({ kind, text: ev.text });
  } else if (ev.type === "tool_start") {
    segs.push({ kind: "tool", call_id: ev.call_id, name: ev.name, args: ev.args,
      result: null, is_error: false });
  } else if (ev.type === "tool_end") {
    const seg = segs.find((s) => s.kind === "tool" && s.call_id === ev.call_id);
    if (seg) { seg.result = ev.result; seg.is_error = ev.is_error; }
  }
}

// What the page says when heron serve does not answer at all (stopped, restarting): the
// browser's own words for it ("Failed to fetch") name no cause and no way out.
const NO_SERVE = "heron serve does not answer (stopped or restarting?). The page reconnects by itself once it runs again";

async function api(path, opts = {}) {
  let res;
  try {
    res = await fetch("/api" + path, { headers: { "Content-Type": "application/json" },
      credentials: "same-origin", ...opts });
  } catch { throw new Error(NO_SERVE); } // no answer at all: the network or the serve is down
  let body = null;
  try { body = await res.json(); } catch { body = null; }
  if (!res.ok) {
    const d = body && body.detail;
    const msg = d && typeof d === "object" ? withHint(d.message, d.hint) : String(d || res.status);
    throw new Error(msg);
  }
  return body;
}

function keyFromHash() {
  const m = /(?:^#|&)c=([^&]+)/.exec(location.hash);
  return m ? decodeURIComponent(m[1]) : "personal";
}

// ---- the connection ---------------------------------------------------------------------------

// True when the serve answers but this browser's login is gone (a revoked or expired
// session: 401); false when it answers otherwise or not at all (stopped, restarting).
async function loggedOut() {
  try {
    const res = await fetch("/api/session", { credentials: "same-origin", cache: "no-store" });
    return res.status === 401;
  } catch { return false; }
}

// One WebSocket to /ws, reopened after a drop; resumes from the last seq it saw, so nothing is
// lost or shown twice. A seq counts in the serve process that numbered it (its `instance`,
// named in every welcome): the hello names it too, and a restarted serve answers `gap`.
// `onEvent` gets every server event in order.
class Connection {
  constructor(onEvent, onState) {
    this.onEvent = onEvent; this.onState = onState;
    this.key = null; this.lastSeq = 0; this.ws = null; this.retry = 0; this.outbox = [];
    this.instance = null; // the serve whose numbering lastSeq is in
    this.everOpen = false; // the page's first socket has opened
    this.onDropped = null; // told what the person sent while the first socket was opening, if it failed
    this.loggedOut = false; // the serve answers, but not to this browser: no retries
  }
  open(key, lastSeq) {
    this.key = key; this.lastSeq = lastSeq;
    if (this.ws && this.ws.readyState <= 1) { this.hello(); return; }
    const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`);
    this.ws = ws;
    ws.onopen = () => { this.retry = 0; this.everOpen = true; this.onState("open"); this.hello();
      for (const m of this.outbox.splice(0)) ws.send(JSON.stringify(m)); };
    ws.onmessage = (e) => {
      let ev; try { ev = JSON.parse(e.data); } catch { return; }
      if (ev.conversation && ev.conversation !== this.key) return;
      if (ev.type === "welcome" && ev.instance) this.instance = ev.instance;
      if (typeof ev.seq === "number" && ev.type !== "welcome") {
        if (ev.seq <= this.lastSeq) return; // already seen: never shown twice
        this.lastSeq = ev.seq;
      }
      this.onEvent(ev);
    };
    ws.onclose = () => {
      if (this.ws !== ws) return;
      if (!this.everOpen) { // the first socket never opened: what the person sent is given back
        const typed = this.outbox.filter((m) => m.type === "send" || m.type === "command");
        this.outbox = this.outbox.filter((m) => !typed.includes(m));
        if (typed.length && this.onDropped) this.onDropped(typed);
      }
      this.onState("closed");
      // A refused upgrade looks like a drop to the page (the browser hides the 403): one
      // cheap route tells a serve that is down from a login that is gone. Logged out, the
      // page stops retrying until the person comes back to it (resume).
      loggedOut().then((out) => {
        if (this.ws !== ws) return;
        if (out) { this.loggedOut = true; this.onState("logged out"); return; }
        const wait = Math.min(5000, 200 * 2 ** this.retry++);
        setTimeout(() => this.open(this.key, this.lastSeq), wait);
      });
    };
  }
  // Tried again once when the tab is shown or focused (after `heron web` in another tab).
  resume() {
    if (!this.loggedOut) return;
    this.loggedOut = false; this.retry = 0; this.onState("connecting");
    this.open(this.key, this.lastSeq);
  }
  hello() {
    const m = { type: "hello", conversation: this.key, last_seq: this.lastSeq };
    if (this.instance) m.instance = this.instance;
    this.send(m);
  }
  // Sent now, or kept and sent once the socket opens (a view's read, asked while it opens).
  send(m) {
    if (!this.sendNow(m)) this.outbox.push(m);
  }
  // What the person typed: sent now, or, while the page's first socket opens (a message sent
  // right after the page loads), the moment it opens; else not at all (false): never
  // delivered later without a word, after they may have given up on it and sent it again.
  sendTyped(m) {
    if (this.sendNow(m)) return true;
    if (this.everOpen || !this.ws || this.ws.readyState !== 0) return false;
    this.outbox.push(m);
    return true;
  }
  sendNow(m) {
    if (!this.ws || this.ws.readyState !== 1) return false;
    this.ws.send(JSON.stringify(m));
    return true;
  }
}

// ---- components -------------------------------------------------------------------------------

function ToolPill({ seg }) {
  const state = seg.result === null || seg.result === undefined ? "running" : seg.is_error ? "error" : "done";
  return html`<details class=${"pill " + state} data-call=${seg.call_id}>
    <summary aria-label=${`tool ${seg.name}, ${state}`}><span class="pill-name">${seg.name}</span>
      <span class="pill-state">${state === "running" ? "running…" : state === "error" ? "failed" : "done"}</span></summary>
    <div class="pill-body">
      <div class="pill-label">arguments</div>
      <pre class="pill-args">${JSON.stringify(seg.args || {}, null, 2)}</pre>
      ${state !== "running" && html`<div class="pill-label">result</div>
        <pre class="pill-result">${seg.result}</pre>`}
    </div></details>`;
}

// How an approval's wait ended (approval_end), as its card says it.
function approvalOutcome(seg) {
  const where = seg.mine ? "" : " in another window";
  if (seg.reason === "answered") return (seg.allowed ? "Allowed" : "Denied") + where;
  if (seg.reason === "deadline") return "Denied: nobody answered in time";
  return "Denied: the turn was stopped";
}

// An error's message and its hint as one line: a full stop between them only where the
// message ends without one of its own ("did you mean /status? Nothing was sent.", not "?.").
function withHint(message, hint) {
  if (!hint) return message;
  return /[.?!:]$/.test(message) ? `${message} ${hint}` : `${message}. ${hint}`;
}

// A command the agent wants to run, waiting for the person's yes or no: whether the sandbox
// confines it (approval "ask" with bubblewrap working) or not, the exact command as text (htm
// escapes it), Allow and Deny as buttons; once decided, the decision.
// A command waiting for approval as the card shows it, by the rules of the terminal's prompt
// (command_shown in heron/channels/visible.py): every control, invisible, reordering or
// blank-drawn character but the plain space (NBSP, U+3000, U+2800, the Hangul fillers) as its
// escape (\u202e), runs of 3 or more blank lines, of 40 or more spaces and of 40 or more of
// one escaped character by their length, and its size. Padding cannot push the real command
// out of sight above the buttons, nor a bidi override make it read as something else.
const HIDDEN_CLASS = "\\p{Cc}\\p{Cf}\\p{Cs}\\p{Zl}\\p{Zp}\\u00a0\\u1680\\u2000-\\u200a\\u202f\\u205f\\u3000"
  + "\\u2800\\u115f\\u1160\\u3164\\uffa0";
const HIDDEN = new RegExp(`[${HIDDEN_CLASS}]`, "gu");
const HIDDEN_ONE = new RegExp(`^[${HIDDEN_CLASS}]$`, "u");
const REPEAT_RUN = /(.)\1{39,}/gsu;
const BLANK_RUN = /(?:\n[ \t]*){3,}\n/g;
const SPACE_RUN = /[ \t]{40,}/g;

function escapeChar(c) {
  const n = c.codePointAt(0);
  if (c === "\r") return "\\r";
  if (n < 0x100) return "\\x" + n.toString(16).padStart(2, "0");
  return n < 0x10000 ? "\\u" + n.toString(16).padStart(4, "0") : "\\U" + n.toString(16).padStart(8, "0");
}

export function commandShown(command) {
  let hidden = 0, runs = 0;
  let text = command.replace(REPEAT_RUN, (m, c) => {
    if (c === "\n" || c === "\t" || !HIDDEN_ONE.test(c)) return m;
    const n = [...m].length;
    hidden += n; runs += 1;
    return `[${n} × ${escapeChar(c)}]`;
  });
  text = text.replace(HIDDEN, (c, at, all) => {
    if (c === "\n" || c === "\t" || (c === "\r" && all[at + 1] === "\n")) return c;
    hidden += 1;
    return escapeChar(c);
  });
  text = text.replace(BLANK_RUN, (m) => { runs += 1; return `\n[${m.split("\n").length - 2} blank lines]\n`; });
  text = text.replace(SPACE_RUN, (m) => { runs += 1; return `[${m.length} spaces]`; });
  const lines = command.split("\n").length, chars = [...command].length;
  let size = `↑ the whole command: ${lines} line${lines === 1 ? "" : "s"}, ${chars} characters`;
  if (runs) size += "; runs of blank lines or spaces are shown as [N blank lines], [N spaces]";
  const flag = hidden ? `⚠ It holds ${hidden} invisible, control or reordering character${hidden === 1 ? "" : "s"},`
    + " shown as escapes (\\u202e): it may not read the way it runs." : "";
  return { text, size, flag };
}

function ApprovalCard({ seg, onApprove }) {
  const waiting = !seg.reason;
  const shown = commandShown(seg.command || "");
  return html`<div class=${"approval " + (waiting ? "waiting" : seg.allowed ? "allowed" : "denied")}
      role="group" aria-label=${"the agent wants to run " + seg.tool} data-approval=${seg.id}>
    <div class="approval-tag">The agent wants to run (${seg.tool}, ${seg.confined ? "sandboxed" : "unconfined"}):</div>
    <pre class="approval-command"><code>${shown.text}</code></pre>
    <div class="approval-size">${shown.size}</div>
    ${shown.flag && html`<div class="approval-flag" role="alert">${shown.flag}</div>`}
    ${waiting ? html`<div class="approval-actions">
        <button class="allow" disabled=${seg.sent} onClick=${() => onApprove(seg, true)}>Allow</button>
        <button class="deny" disabled=${seg.sent} onClick=${() => onApprove(seg, false)}>Deny</button></div>`
      : html`<div class="approval-outcome">${approvalOutcome(seg)}</div>`}</div>`;
}

function Segments({ segments, live, onApprove }) {
  return segments.map((s, i) => s.kind === "text" ? (live ? html`<${LiveText} key=${i} seg=${s} />`
    : html`<${Markdown} key=${i} text=${s.text} />`)
    : s.kind === "reasoning" ? html`<details key=${i} class="reasoning">
        <summary>Reasoning</summary><div class="reasoning-text">${s.text}</div></details>`
    : s.kind === "note" ? html`<div key=${i} class="note" role="note">${s.text}</div>`
    : s.kind === "question" ? html`<div key=${i} class="question" role="note"
        aria-label="the agent asks you"><div class="question-tag">The agent asks you</div>
        <div class="question-text">${s.text}</div>
        ${s.wait && html`<div class="question-wait">${s.wait}</div>`}</div>`
    : s.kind === "answer" ? html`<article key=${i} class="msg user answer" aria-label="your answer">
        <div class="mail-tag">your answer</div><div class="user-text">${s.text}</div></article>`
    : s.kind === "approval" ? html`<${ApprovalCard} key=${i} seg=${s} onApprove=${onApprove} />`
    : html`<${ToolPill} key=${i} seg=${s} />`);
}

// Where a message was typed, as heron.bus.CHANNEL_NAMES says it.
const CHANNELS = { web: "the browser", terminal: "heron chat", script: "heron run" };
// What marks mail, the same live and stored: the channel it came from when it is not the
// channel of the turn's own message (heron/agent/control.py mail_label).
const mailTag = (channel) => "sent while the agent worked" + (channel ? `, from ${CHANNELS[channel] || channel}` : "");

// A question as ask_user sends it: its text, then the line heron/proactive/ask.py's
// waiting_line writes, "(Waiting up to 60 minutes for your answer. Run ask_c13...)", which
// the page says in the person's words (the run's id is for `heron runs cancel`, not for them).
const WAITING = /\n\(Waiting up to (.+) for your answer\. Run \S+\.\)\s*$/;
export function questionOf(text) {
  const m = WAITING.exec(text || "");
  if (!m) return { text, wait: null };
  return { text: text.slice(0, m.index), wait: `It waits up to ${m[1]} for your answer.` };
}

// A size as heron.messages.size_label says it: "812 bytes", "123 kB", "4.2 MB".
export function sizeLabel(size) {
  if (size < 1024) return `${size} bytes`;
  if (size < 1024 * 1024) return `${Math.round(size / 1024)} kB`;
  return `${(size / (1024 * 1024)).toFixed(1)} MB`;
}

// A text file the model got inline (in the message's text): a chip with its name and size
// whose text opens in place, read from the files route the first time it is opened.
function TextFile({ f }) {
  const [body, setBody] = useState(null);
  const [open, setOpen] = useState(false);
  const toggled = async (e) => {
    setOpen(e.currentTarget.open);
    if (!e.currentTarget.open || body !== null) return;
    try {
      const res = await fetch(f.url, { credentials: "same-origin" });
      setBody(res.ok ? await res.text() : `(the file cannot be read: ${res.status})`);
    } catch { setBody(`(${NO_SERVE})`); }
  };
  return html`<details class="file text-file" onToggle=${toggled}>
    <summary aria-label=${`attachment ${f.name}, ${sizeLabel(f.size)}`}>${f.name}
      <span class="file-size">${sizeLabel(f.size)}</span></summary>
    ${open && html`<pre class="file-text">${body === null ? "Loading…" : body}</pre>`}</details>`;
}

// A message's attachments: images as thumbnails, a text file the model got inline as a chip
// that opens to its text, any other file as a chip that opens it (or saves it).
function Files({ files }) {
  if (!files || !files.length) return null;
  return html`<div class="files">${files.map((f) => f.inline ? html`<${TextFile} f=${f} />`
    : f.mime.startsWith("image/")
    ? html`<a href=${f.url} target="_blank" rel="noopener"><img class="thumb" src=${f.url} alt=${f.name} /></a>`
    : html`<a class="file" href=${f.url} target="_blank" rel="noopener"
        aria-label=${`attachment ${f.name}, ${sizeLabel(f.size)}`}>${f.name}
        <span class="file-size">${sizeLabel(f.size)}</span></a>`)}</div>`;
}

// The attachments of the live turn's message, as turn_start names them ("notes.txt (2 kB)"):
// the stored message, once the turn ends, shows them as Files does.
function Labels({ files }) {
  if (!files || !files.length) return null;
  return html`<div class="files">${files.map((label, i) => html`<span key=${i} class="file pending"
    aria-label=${"attachment " + label}>${label}</span>`)}</div>`;
}

function Item({ item, onEdit, number }) {
  if (item.kind === "separator") {
    return html`<div class="separator" role="separator" data-id=${item.id}>${item.text}</div>`;
  }
  if (item.kind === "note" && item.failed) { // a failed turn's note, from its turn row
    return html`<div class="note error" role="note"><pre>${item.text}</pre></div>`;
  }
  if (item.kind === "note") return html`<div class="note" data-id=${item.id}>${By(item.by)} ${item.text}</div>`;
  if (item.kind === "user") return html`<${UserItem} item=${item} onEdit=${onEdit} number=${number} />`;
  return html`<article class="msg assistant" data-id=${item.id} aria-label="agent's reply">
    <${Segments} segments=${item.segments} /></article>`;
}

// One of your messages; "edit" opens its text in place (a box of its own, line breaks kept:
// a browser's prompt() is one line), Enter sends it as a new branch, Shift-Enter is a new line,
// Esc or Cancel closes it.
function UserItem({ item, onEdit, number }) {
  const [draft, setDraft] = useState(null); // the text being edited; null: not editing
  const box = useRef(null);
  useEffect(() => { if (draft !== null && box.current && document.activeElement !== box.current) box.current.focus(); }, [draft !== null]);
  const editable = onEdit && number;
  const save = () => {
    const text = (draft || "").trim();
    setDraft(null);
    if (text && text !== item.text.trim()) onEdit(number, text);
  };
  const keys = (e) => {
    if (e.key === "Escape") { e.preventDefault(); e.stopPropagation(); setDraft(null); }
    else if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); save(); }
  };
  return html`<article class=${"msg user" + (item.mail ? " mail" : "") + (editable ? " editable" : "")} data-id=${item.id}
      aria-label="your message">
    ${item.mail && html`<div class="mail-tag">${mailTag(item.mail_from)}</div>`}
    ${draft === null ? html`<div class="user-text">${item.text}</div>` : html`<form class="edit-form"
        onSubmit=${(e) => { e.preventDefault(); save(); }}>
      <textarea ref=${box} aria-label="edit your message" value=${draft} onKeyDown=${keys}
        rows=${Math.min(12, draft.split("\n").length + 1)} onInput=${(e) => setDraft(e.target.value)} />
      <div class="edit-actions"><button type="submit">Answer it on a new branch</button>
        <button type="button" onClick=${() => setDraft(null)}>Cancel</button></div></form>`}
    <${Files} files=${item.files} />
    ${editable && draft === null && html`<button class="edit" aria-label="edit this message"
      onClick=${() => setDraft(item.text)}>edit</button>`}
  </article>`;
}

// A stored item never changes: it renders again only when the transcript is read again.
class PureItem extends Component {
  shouldComponentUpdate(next) {
    return next.item !== this.props.item || next.number !== this.props.number;
  }
  render(props) { return html`<${Item} ...${props} />`; }
}

// The redraw of the Live component: a streamed piece redraws the live reply alone, not the page.
const liveDraws = new Set();

// Keeps the transcript scrolled to its end while the reader is at (or near) the end. Called
// as a layout effect: in the same task as the change, before it is painted (a plain effect
// runs a frame later, after a frame with the new text below the fold).
function keepAtEnd(el) {
  if (el && el.scrollHeight - el.scrollTop - el.clientHeight < 200) el.scrollTop = el.scrollHeight;
}

// Scrolls to the item of a search hit and marks it. Items above it are laid out at an
// estimated height until drawn (as for jumpToEnd), so it is centred again on the next frames.
function showHit(list, id, frames = 10) {
  const el = list && list.querySelector(`[data-id="${id}"]`);
  if (!el) return;
  el.classList.add("hit");
  el.scrollIntoView({ block: "center" });
  if (frames > 0) requestAnimationFrame(() => showHit(list, id, frames - 1));
}

// Scrolls a transcript just read to its newest message. Replies off screen are laid out at
// an estimated height (content-visibility, style.css) until drawn, a frame or two after they
// come into view, so the end moves as the newest are drawn: go to it again on the next frames.
function jumpToEnd(el, frames = 10) {
  el.scrollTop = el.scrollHeight;
  if (frames > 0) requestAnimationFrame(() => jumpToEnd(el, frames - 1));
}

// A command this tab sent mid-turn that the serve answered at once (/status, or refused:
// a /resume elsewhere): its answer is said where it is, and it gets no status of its own.
// True when it was taken off the live view's list.
function answered(lv, kind) {
  const first = lv && !lv.done ? lv.mail.findIndex((x) => !x.state) : -1;
  if (first < 0 || !lv.mail[first].command || (kind !== "command" && kind !== "error")) return false;
  lv.mail.splice(first, 1);
  return true;
}

function Live({ live, list, onApprove, notes }) {
  const [, redraw] = useState(0);
  useEffect(() => {
    const draw = () => redraw((n) => n + 1);
    liveDraws.add(draw);
    return () => { liveDraws.delete(draw); };
  }, []);
  useLayoutEffect(() => keepAtEnd(list.current));
  return html`${live.text !== null && (live.heron
      ? html`<div class="note" data-id=${live.messageId ?? undefined}>${live.text}</div>`
      : html`<article class="msg user live-user"
      data-id=${live.messageId ?? undefined} aria-label="your message">
      <div class="user-text">${live.text}</div><${Labels} files=${live.files} /></article>`)}
    ${live.mail.filter((m) => m.state || !m.command).map((m, i) => html`<article key=${"m" + i} class="msg user mail" aria-label="mail">
      <div class="mail-tag">${m.state === "queued" ? "queued for the next turn"
        : mailTag(m.channel && m.channel !== live.channel ? m.channel : null)}</div>
      <div class="user-text">${m.text}</div></article>`)}
    <article class="msg assistant live" aria-label="agent's reply, streaming">
      <${Segments} segments=${live.segments} live onApprove=${onApprove} /></article>
    ${notes.map((n) => html`<${Note} key=${n.id} n=${n} />`)}`;
}

// What Heron said outside a reply (a failed turn, a command's answer, /stop's): shown where it
// was said, not at the foot of the page, where later turns would come above it.
function Note({ n }) {
  return html`<div class=${"note " + n.kind} role="note">${By(n.by)}<pre>${n.text}</pre></div>`;
}

// Who said a note of background work (a monitor, the heartbeat, a goal), shown before it.
const By = (by) => by ? html`<span class="by">from ${by}:</span>` : "";

// A stored item's identity in the page (a failed turn's note names the row it follows).
const itemKey = (it) => `${it.kind}${it.id}${it.failed ? "-t" + it.turn : ""}${it.part != null ? "-p" + it.part : ""}`;

// Where a note goes: after the turn it was said in (the live one's message), else after the
// newest turn when it came, whole (a reply stored later goes above it): the last item's turn,
// or `lastTurn` (the message of the newest turn this page saw start), when that turn ended
// before the page read it (a command's answer right after the turn it stopped), else after
// the item that was last. `known`: the newest stored row the page knew of then, for placing
// it again should its turn leave the branch.
export function anchorOf(live, items, lastTurn = null) {
  const last = items[items.length - 1];
  const known = Math.max(lastTurn ?? 0, ...(last ? [last.id, ...(last.rows || [])] : [0]));
  if (live && live.messageId != null) return { turn: live.messageId, known };
  const newest = last ? last.turn_message ?? last.id : null;
  if (lastTurn != null && (newest == null || lastTurn > newest)) return { turn: lastTurn, known };
  if (last && last.turn_message != null) return { turn: last.turn_message, known };
  return { item: last ? itemKey(last) : null, known };
}

// Whether `it` shows the stored row `row` (a note that speaks of a message goes after it).
const holds = (it, row) => it.kind === "user" && (it.rows || []).includes(row);

// Whether a note's anchor is in `items` (or is the live turn): one that is not (a branch
// switched away from it) goes after the newest item of the branch the page now shows that was
// stored before the note came (the turns after it, however soon they came, stay below it).
function anchored(n, items, live) {
  if (n.after.row != null) { // a stored row: in place once read, waiting while none so new is
    return items.some((it) => holds(it, n.after.row)) || !items.some((it) => it.id >= n.after.row);
  }
  if (n.after.turn != null) {
    return (live && live.messageId === n.after.turn) || items.some((it) => it.turn_message === n.after.turn);
  }
  return n.after.item == null || items.some((it) => itemKey(it) === n.after.item);
}

// What Heron said outside replies that the store does not keep (the answers to Stop and to
// commands, "Stopped by ...", "New conversation started", "Switched to branch 1"): kept in
// this tab's sessionStorage per conversation, the newest NOTES_KEPT, so a reload shows them in
// their places again. Never stored in the conversation, where the model would read them; a
// tab opened later, or another browser, does not have them (docs/web.md). A background
// message (`by`, or kind `message`) is not kept here: the store has it.
const NOTES_KEPT = 50;
const notesKey = (conv) => `heron.notes.${conv}`;
let notesMade = 0;
const noteId = () => `${Date.now().toString(36)}.${++notesMade}`;
const keepable = (n) => n.kind !== "message" && !n.by;

export function keptNotes(conv) {
  try {
    const kept = JSON.parse(sessionStorage.getItem(notesKey(conv)) || "[]");
    return Array.isArray(kept) ? kept.filter((n) => n && n.id && n.after && typeof n.text === "string") : [];
  } catch { return []; } // storage refused (a private window) or damaged: nothing kept
}

function keepNotes(conv, notes) {
  try {
    const kept = notes.filter(keepable).slice(-NOTES_KEPT);
    if (kept.length) sessionStorage.setItem(notesKey(conv), JSON.stringify(kept));
    else sessionStorage.removeItem(notesKey(conv));
  } catch { /* storage full or refused: the notes stay live only */ }
}

// How many of Heron's stored notes say `text` (a background message, kept where it was said).
function storedNotes(items, text) {
  return items.filter((it) => it.kind === "note" && !it.failed && it.text === text).length;
}

// The transcript's items with each note after its anchor; `live` gets those of its turn, and
// a note whose anchor is not shown (another branch) goes at the end. A failed turn's note the
// store already gives (its turn row) is not shown twice.
function placeNotes(shown, items, notes, live, earlier = null) {
  const failed = new Set(items.filter((it) => it.failed).map((it) => it.turn_message));
  const kept = new Map(); // per text, the stored notes not yet matched to a live one
  const left = notes.filter((n) => {
    if (n.kind === "error" && failed.has(n.after.turn)) return false;
    if (n.kind !== "message" && !n.by) return true; // `by`: kept in the transcript too
    if (!kept.has(n.text)) kept.set(n.text, storedNotes(items, n.text));
    if (kept.get(n.text) <= n.stored) return true;
    kept.set(n.text, kept.get(n.text) - 1); // stored since it came: the transcript shows it
    return false;
  });
  const take = (test) => {
    const out = left.filter(test);
    for (const n of out) left.splice(left.indexOf(n), 1);
    return out;
  };
  const rows = shown.map((it, i) => {
    const next = shown[i + 1];
    const turnEnds = it.turn_message != null && (!next || next.turn_message !== it.turn_message);
    const key = itemKey(it);
    const here = (n) => n.after.item === key || (n.after.row != null && holds(it, n.after.row));
    return { it, notes: take((n) => here(n) || (turnEnds && n.after.turn === it.turn_message)) };
  });
  const mine = live && live.messageId != null ? take((n) => n.after.turn === live.messageId) : [];
  // A note said before the first item held, whose place is not shown: it belongs to a page
  // above, not read yet (a note kept across a reload), and shows once that page is read.
  const first = items.length ? items[0].id : null;
  const above = (n) => earlier != null && first != null && n.after.known < first;
  return { rows, live: mine, rest: left.filter((n) => !above(n)) };
}

function Banner({ live, onStop, conn }) {
  const [now, setNow] = useState(Date.now());
  useEffect(() => { const t = setInterval(() => setNow(Date.now()), 1000); return () => clearInterval(t); }, []);
  const secs = Math.max(0, Math.round((now - live.started) / 1000));
  if (conn !== "open") { // what the turn does now is unknown until the page reconnects
    return html`<div class="banner down" role="status" aria-live="polite">
      <span class="banner-text">${DOWN}</span></div>`;
  }
  return html`<div class="banner" role="status" aria-live="polite">
    <span class="spinner" aria-hidden="true"></span>
    <span class="banner-text">${live.segments.some((s) => s.kind === "approval" && !s.reason)
      ? "The agent waits for your approval" : live.asking ? "The agent waits for your answer"
      : `Agent is working · ${secs} s`}${live.retry
      ? ` · the model did not answer (${live.retry.text || "error"}); trying again in ${Math.max(0, Math.round(live.retry.seconds - (now - live.retry.at) / 1000))} s`
      : ""}</span>
    <button class="stop" onClick=${onStop} aria-label="stop the agent (Esc)">Stop</button></div>`;
}

// A turn another process runs in this conversation (`heron run --model`, the `elsewhere`
// event): its stream stays in that process, so the banner says where it runs and that its
// reply shows when it ends; Stop stops it as /stop does.
function Elsewhere({ about, onStop }) {
  return html`<div class="banner" role="status" aria-live="polite" aria-label="a turn runs elsewhere">
    <span class="spinner" aria-hidden="true"></span>
    <span class="banner-text">A turn runs in ${about.where}: its reply shows when it ends (its stream shows only there)</span>
    <button class="stop" onClick=${onStop} aria-label="stop that turn">Stop</button></div>`;
}

// The message box takes the focus (on load, on opening a conversation, from the skip link).
function focusInput() {
  const box = document.getElementById("input");
  if (box) box.focus();
}

// What the message box says it is for: the answer to a question that waits (ask_user), mail
// for the running turn, or a new message.
export function placeholderOf(busy, asking) {
  if (asking) return "The agent waits for your answer: what you send answers its question";
  if (busy) return "The agent is working; what you send goes to its mailbox";
  return "Message Heron (Enter sends, Shift-Enter new line)";
}

function Composer({ onSend, draft, busy, asking, uploads, setUploads, notify }) {
  const [text, setText] = useState("");
  draft.current = (t) => setText((now) => now || t); // never over what was typed since
  const [drag, setDrag] = useState(false);
  const fileRef = useRef(null);
  useEffect(focusInput, []); // typing right after the page loads reaches the box
  const add = useCallback(async (fileList) => {
    // A copy first: the picker's FileList is live, and emptied (value = "") while we upload.
    for (const f of [...fileList]) {
      try {
        const res = await fetch(`/api/uploads?name=${encodeURIComponent(f.name || "pasted")}`,
          { method: "POST", body: f, headers: { "Content-Type": f.type || "application/octet-stream" } });
        const body = await res.json();
        if (!res.ok) throw new Error(body.detail ? withHint(body.detail.message, body.detail.hint) : res.status);
        setUploads((u) => [...u, { name: body.name, mime: body.mime, upload_id: body.upload_id, size: body.size }]);
      } catch (e) {
        notify(`Could not attach ${f.name}: ${e instanceof TypeError ? NO_SERVE : e.message}`);
      }
    }
  }, []);
  const submit = () => {
    if (!text.trim() && !uploads.length) return;
    if (onSend(text, uploads)) { setText(""); setUploads([]); }
  };
  return html`<form class=${"composer" + (drag ? " drag" : "")} aria-label="send a message"
      onSubmit=${(e) => { e.preventDefault(); submit(); }}
      onDragOver=${(e) => { e.preventDefault(); setDrag(true); }}
      onDragLeave=${() => setDrag(false)}
      onDrop=${(e) => { e.preventDefault(); setDrag(false); add(e.dataTransfer.files); }}>
    ${uploads.length > 0 && html`<ul class="uploads" aria-label="attachments">${uploads.map((u, i) =>
      html`<li key=${u.upload_id}>${u.name} <button type="button" aria-label=${"remove " + u.name}
        onClick=${() => setUploads((x) => x.filter((_, j) => j !== i))}>×</button></li>`)}</ul>`}
    <div class="composer-row">
      <button type="button" class="attach" aria-label="attach files" onClick=${() => fileRef.current.click()}>+</button>
      <input type="file" multiple hidden ref=${fileRef} aria-label="choose files"
        onChange=${(e) => { add(e.target.files); e.target.value = ""; }} />
      <textarea id="input" rows="2" aria-label="message" value=${text}
        placeholder=${placeholderOf(busy, asking)}
        onInput=${(e) => setText(e.target.value)}
        onPaste=${(e) => { const fs = [...e.clipboardData.files].filter((f) => f.type.startsWith("image/"));
          if (fs.length) { e.preventDefault(); add(fs); } }}
        onKeyDown=${(e) => { if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); submit(); } }}></textarea>
      <button type="submit" class="send" aria-label="send">Send</button>
    </div></form>`;
}

// When a conversation was last used, as the list says it: "just now", "5 min ago", "3 h ago",
// "yesterday", "4 days ago", then the date.
// A count and its noun, singular for one ("1 turn", "2 turns"), as heron.messages.plural.
export function plural(count, noun) {
  return `${count.toLocaleString("en")} ${noun}${count === 1 ? "" : "s"}`;
}

// `day`: the date the serve gives for it, in the agent's zone (what `heron conversations list`
// shows), rather than the browser's own zone's date.
export function ago(epoch, now = Date.now() / 1000, day = null) {
  const s = Math.max(0, now - epoch);
  if (s < 60) return "just now";
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  const days = Math.floor(s / 86400);
  if (days === 1) return "yesterday";
  if (days < 7) return `${days} days ago`;
  return day || new Date(epoch * 1000).toLocaleDateString();
}

// What tells apart conversations that began with the same words: the current branch's turns
// (with the branches, when more than one), and last activity.
export function convMeta(c) {
  const turns = c.turns === undefined ? null : plural(c.turns, "turn");
  const branches = c.branches > 1 ? `${c.branches} branches` : null;
  return [turns, branches, c.updated ? ago(c.updated, Date.now() / 1000, c.day) : null].filter(Boolean).join(" · ");
}

// Where a search hit off the current branch is: "on branch 2", or "on another branch".
const offBranch = (c) => (c.branch ? `on branch ${c.branch}` : "on another branch");

function Sidebar({ current, open, onOpen, onClose, onRenamed, notify, refresh, running, waiting, streamed }) {
  const [rows, setRows] = useState([]);
  const [, setMinute] = useState(0); // "5 min ago" moves on while the page stays open
  useEffect(() => { const t = setInterval(() => setMinute((m) => m + 1), 60000); return () => clearInterval(t); }, []);
  const [q, setQ] = useState("");
  const [more, setMore] = useState(false); // the list goes on past what it shows
  const held = useRef(LIST_PAGE); // how many it shows: a read again keeps those "more" added
  const asked = useRef(0);
  const listed = (offset, limit) => api(`/conversations?q=${encodeURIComponent(q)}&offset=${offset}&limit=${limit}`);
  const load = useCallback(async () => {
    const n = ++asked.current; // answers may come back out of order: keep the newest ask's
    try {
      const found = await listed(0, held.current);
      if (n === asked.current) { setRows(found.conversations); setMore(found.more); }
    } catch (e) { notify(e.message); }
  }, [q]);
  useEffect(() => { held.current = LIST_PAGE; }, [q]); // a new search starts at one page
  // The next page of the list (or of a search's conversations), after the last shown.
  const loadMore = async () => {
    const n = ++asked.current;
    try {
      const found = await listed(rows.length, LIST_PAGE);
      if (n !== asked.current) return;
      const have = new Set(rows.map((c) => c.key));
      const next = [...rows, ...found.conversations.filter((c) => !have.has(c.key))];
      held.current = next.length; setRows(next); setMore(found.more);
    } catch (e) { notify(e.message); }
  };
  useEffect(() => { load(); }, [q, refresh]);
  // A turn's first streamed piece: its conversation is stored by then. Read the list again
  // only when it is not in it yet (a new one): every open tab reads it at the same moment,
  // and on a busy machine those reads held the stream back (bench/web.py, docs/web.md).
  useEffect(() => { if (streamed && !rows.some((c) => c.key === current)) load(); }, [streamed]);
  // A turn started elsewhere in a conversation this list does not show yet: read it again.
  useEffect(() => { if (running.some((k) => !rows.some((c) => c.key === k))) load(); }, [running]);
  // What the list says of a conversation where work goes on: an answer awaited says more.
  const state = (key) => waiting.includes(key) ? html`<span class="in-use waits">waits for your answer</span>`
    : running.includes(key) ? html`<span class="in-use">a turn is running</span>` : null;
  const rename = async (key, old) => {
    const title = prompt("New title", old || "");
    if (!title) return;
    try { await api(`/conversations/${encodeURIComponent(key)}`, { method: "PATCH", body: JSON.stringify({ title }) });
      onRenamed(key, title); load(); }
    catch (e) { notify(e.message); }
  };
  const remove = async (key) => {
    if (!confirm(`Delete conversation ${key}? This cannot be undone.`)) return;
    try { await api(`/conversations/${encodeURIComponent(key)}`, { method: "DELETE" });
      if (key === current) onOpen("personal"); load(); }
    catch (e) { notify(e.message); }
  };
  const create = async () => {
    try { const { key } = await api("/conversations", { method: "POST", body: "{}" }); onOpen(key); load(); }
    catch (e) { notify(e.message); }
  };
  // A hit on another branch than the current one is not on the page the conversation opens
  // with: it opens at its newest message, and a notice says where the hit is.
  const openHit = (c) => {
    if (c.on_branch !== false) { onOpen(c.key, c.message_id); return; }
    onOpen(c.key);
    notify(`That message is ${offBranch(c)} of ${c.key}, not the one shown`
      + (c.branch ? `: /tree ${c.branch} switches to it.` : "."));
  };
  const closeRef = useRef(null);
  // Opened over the page (a phone): the focus goes into it, first to the way out. In the
  // render's own task: a plain effect ran a frame later, after an Esc that closed it already.
  useLayoutEffect(() => { if (open && closeRef.current) closeRef.current.focus(); }, [open]);
  return html`<nav class=${"sidebar" + (open ? " open" : "")} aria-label="conversations">
    <div class="side-head"><button class="new" onClick=${create}>New conversation</button>
      <button class="side-close" ref=${closeRef} aria-label="close the list of conversations"
        onClick=${onClose}>×</button></div>
    <input type="search" class="search" placeholder="Search messages" aria-label="search conversations"
      value=${q} onInput=${(e) => setQ(e.target.value)} />
    <ul class="convs" role="list">${rows.map((c) => html`<li key=${c.key}
        class=${(c.key === current ? "current" : "") + (running.includes(c.key) ? " running" : "")
          + (waiting.includes(c.key) ? " waiting" : "")}>
      <a href=${"#c=" + encodeURIComponent(c.key)} aria-current=${c.key === current ? "page" : undefined}
        onClick=${(e) => { e.preventDefault(); openHit(c); }}>
        <span class="conv-title">${c.title || c.key}</span>
        <span class="conv-meta">${convMeta(c)}</span>
        ${state(c.key)}
        ${c.snippet && html`<span class="snippet">${c.on_branch === false
          && html`<em class="elsewhere">${offBranch(c)}: </em>`}${c.snippet}</span>`}</a>
      <span class="conv-actions">
        <button aria-label=${"rename " + c.key} onClick=${() => rename(c.key, c.title)}>rename</button>
        <button aria-label=${"delete " + c.key} onClick=${() => remove(c.key)}>delete</button></span>
    </li>`)}</ul>
    ${more && html`<button class="more" onClick=${loadMore}>More conversations</button>`}</nav>`;
}

// ---- side panels ------------------------------------------------------------------------------

function usePanel(path, deps) {
  const [data, setData] = useState(null);
  const [error, setError] = useState(null);
  const reload = useCallback(async () => {
    try { setData(await api(path)); setError(null); } catch (e) { setError(e.message); }
  }, [path]);
  useEffect(() => { reload(); }, [path, ...deps]);
  return [data, error, reload];
}

function Branches({ conv, command, tick }) {
  const [data, error] = usePanel(`/conversations/${encodeURIComponent(conv)}/branches`, [tick]);
  if (error) return html`<p class="error">${error}</p>`;
  if (!data) return html`<p>Loading…</p>`;
  return html`<section aria-label="branches"><h2>Branches</h2>
    <button onClick=${() => command("/retry")}>Retry the last message</button>
    <ol class="branches">${data.branches.map((b) => html`<li key=${b.id} class=${b.current ? "current" : ""}>
      <button onClick=${() => command(`/tree ${b.n}`)} aria-current=${b.current ? "true" : undefined}
        aria-label=${`switch to branch ${b.n}`}>${b.current ? "● " : ""}${b.text || "(empty)"}
        <span class="conv-meta">branch ${b.n} · ${b.when}</span></button></li>`)}</ol>
    </section>`;
}

function Memory({ notify }) {
  const [data, error, reload] = usePanel("/memory", []);
  const forget = async (path) => {
    if (!confirm(`Forget ${path}? Its quote is revoked, so it is not learned again.`)) return;
    try { await api(`/memory/entries/${path}`, { method: "DELETE" }); reload(); } catch (e) { notify(e.message); }
  };
  if (error) return html`<p class="error">${error}</p>`;
  if (!data) return html`<p>Loading…</p>`;
  if (!data.scopes.length) return html`<section aria-label="memory"><h2>Memory</h2><p>No entries yet.</p></section>`;
  return html`<section aria-label="memory"><h2>Memory</h2>${data.scopes.map((s) => html`<div key=${s.scope}>
    <h3>${s.scope}</h3><ul class="entries">${s.entries.map((e) => html`<li key=${e.path} class="entry">
      <div class="entry-path">${e.path} <span class="origin">${e.origin}</span></div>
      <div class="entry-text">${e.text}</div>
      ${e.quote && html`<blockquote class="quote">you said: “${e.quote}”</blockquote>`}
      ${(e.conversation || e.day) && html`<div class="source">${[e.conversation && `from ${e.conversation}${e.message ? ` · message ${e.message}` : ""}`, e.day].filter(Boolean).join(" · ")}</div>`}
      <button class="forget" aria-label=${"forget " + e.path} onClick=${() => forget(e.path)}>Forget</button>
    </li>`)}</ul></div>`)}</section>`;
}

function Review({ notify }) {
  const [data, error, reload] = usePanel("/memory/review", []);
  const [checked, setChecked] = useState({});
  if (error) return html`<p class="error">${error}</p>`;
  if (!data) return html`<p>Loading…</p>`;
  const apply = async () => {
    for (const s of data.suggestions) {
      const verdict = checked[s.id] ? "accept" : "reject";
      try { await api(`/memory/review/${s.id}/${verdict}`, { method: "POST" }); }
      catch (e) { notify(e.message); }
    }
    setChecked({}); reload();
  };
  if (!data.suggestions.length) return html`<section aria-label="review"><h2>Review</h2><p>Nothing waits for review.</p></section>`;
  return html`<section aria-label="review"><h2>Review</h2>
    <p>Check what to keep; the rest is dropped.</p>
    <ul class="review">${data.suggestions.map((s) => html`<li key=${s.id}><label>
      <input type="checkbox" checked=${!!checked[s.id]} data-id=${s.id}
        onChange=${(e) => setChecked({ ...checked, [s.id]: e.target.checked })} /> ${s.line}</label></li>`)}</ul>
    <button class="apply" onClick=${apply}>Keep checked, drop the rest</button></section>`;
}

function Compactions({ conv, tick }) {
  const [data, error] = usePanel(`/conversations/${encodeURIComponent(conv)}/compactions`, [tick]);
  if (error) return html`<p class="error">${error}</p>`;
  if (!data) return html`<p>Loading…</p>`;
  return html`<section aria-label="compaction inspector"><h2>Compactions</h2>
    ${data.compactions.length ? data.compactions.map((c) => html`<details key=${c.id} class="compaction">
      <summary>${c.kind} · ${c.reason} · folded ${c.rows_folded} messages (#${c.rows[0]}–#${c.rows[1]}) · ${c.tokens_before} → ${c.tokens_after} tokens</summary>
      <pre>${c.summary}</pre></details>`) : html`<p>No compactions yet.</p>`}
    <h3>Model view</h3>
    <details><summary>System prompt</summary><pre>${data.system}</pre></details>
    <details><summary>Tools (${data.tools.length}, sent before the system prompt)</summary>
      <pre>${data.tools.map((t) => `${t.name}: ${t.description}`).join("\n")}</pre></details>
    <ol class="view">${data.view.map((m, i) => html`<li key=${i}><b>${m.role}</b><pre>${m.text}</pre></li>`)}</ol>
  </section>`;
}

function Status({ conv, tick }) {
  const [data, error] = usePanel(`/conversations/${encodeURIComponent(conv)}/status`, [tick]);
  if (error) return html`<p class="error">${error}</p>`;
  if (!data) return html`<p>Loading…</p>`;
  const pct = data.window ? ((100 * data.context) / data.window).toFixed(1) : "0.0";
  return html`<section aria-label="status"><h2>Status</h2><dl class="status">
    <dt>model</dt><dd>${data.model}</dd>
    <dt>conversation</dt><dd>${conv} (${plural(data.turns, "turn")})</dd>
    <dt>context</dt><dd>${data.context.toLocaleString()} tokens (${pct}% of ${data.window.toLocaleString()})</dd>
    <dt>cache hit rate</dt><dd>${data.cache_hit === null ? "no model calls yet" : Math.round(100 * data.cache_hit) + "%"}</dd>
    <dt>cost</dt><dd>${data.cost_usd === null ? "unknown (a model without a price, or a reply stopped mid-stream)" : "$" + data.cost_usd.toFixed(4)}</dd>
    <dt>turn</dt><dd>${data.busy ? "running" : "idle"}</dd></dl></section>`;
}

// ---- proactive work: the conversation's goal, jobs and subagents, each with a cancel button --
// (a job also with pause or resume, and run now).
// Over the socket, not REST: `work` asks, `cancel` ends one piece, `job` pauses, resumes or
// runs a job now, and the server answers this
// page alone with a `work` event (docs/web.md, "Protocol"), which the listeners below hear.

const workListeners = new Set();

function since(epoch, until) {
  const s = Math.max(0, Math.round((until || Date.now() / 1000) - epoch));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
}

function Work({ conv, send, tick, notify }) {
  const [data, setData] = useState(null);
  useEffect(() => {
    const hear = (ev) => { setData(ev); if (ev.done) notify(ev.done); };
    workListeners.add(hear);
    send({ type: "work" });
    return () => { workListeners.delete(hear); };
  }, [conv, tick]);
  if (!data) return html`<p>Loading…</p>`;
  const cancel = (target, id, what) => {
    if (confirm(`${what}?`)) send(id === undefined ? { type: "cancel", target } : { type: "cancel", target, id });
  };
  // Pause, resume and run-now need no confirmation: each is undone by another click (`job`).
  const act = (action, id) => send({ type: "job", action, id });
  const first = (t) => (t.split("\n").find((l) => l.trim()) || "").trim();
  const g = data.goal;
  return html`<section aria-label="work"><h2>Work</h2>
    <h3>Goal</h3>
    ${g ? html`<div class="work-item goal">
      <div>${first(g.objective)}</div>
      <div class="work-meta">${g.status === "parked" ? "parked (its budget ran out)" : g.status} ·
        ${g.turns_used} of ${plural(g.max_turns, "turn")} · ${g.tokens_used.toLocaleString()} of ${plural(g.max_tokens, "token")}</div>
      <button aria-label="stop the goal" onClick=${() => cancel("goal", undefined, "Stop the goal")}>Stop</button>
    </div>` : html`<p>No goal. <code>/goal TEXT</code> sets one.</p>`}
    <h3>Jobs</h3>
    ${data.jobs.length ? html`<ul class="work">${data.jobs.map((j) => html`<li key=${"j" + j.id} class="work-item">
      <div>${first(j.prompt)}</div>
      <div class="work-meta">job ${j.id} · ${j.mode} · ${j.schedule}${j.status === "paused" ? " · paused" : ""}${j.next_local ? " · next " + j.next_local : ""}${j.running ? " · running since " + j.running.since + " (run " + j.running.run + ")" : j.last_outcome ? " · last " + j.last_outcome : ""}</div>
      ${j.status === "paused"
        ? html`<button aria-label=${"resume job " + j.id} onClick=${() => act("resume", j.id)}>Resume</button>`
        : html`<button aria-label=${"pause job " + j.id} onClick=${() => act("pause", j.id)}>Pause</button>`}
      <button aria-label=${"run job " + j.id + " now"} onClick=${() => act("run_now", j.id)}>Run now</button>
      <button aria-label=${"cancel job " + j.id} onClick=${() => cancel("job", j.id, `Cancel job ${j.id}`)}>Cancel</button>
    </li>`)}</ul>` : html`<p>No jobs bound to this conversation.</p>`}
    <h3>Subagents</h3>
    ${data.subagents.length ? html`<ul class="work">${data.subagents.map((r) => html`<li key=${r.id} class="work-item">
      <div>${first(r.task)}</div>
      <div class="work-meta">${r.id} · ${r.status === "waiting" ? r.waiting : (r.status === "running" ? "running" : r.status + ", not reported back") + " · " + since(r.started, r.finished)}</div>
      <button aria-label=${"cancel subagent " + r.id} onClick=${() => cancel("subagent", r.id, `Cancel subagent ${r.id}`)}>Cancel</button>
    </li>`)}</ul>` : html`<p>No subagents working for this conversation.</p>`}
  </section>`;
}

// The open conversation as a file, as `heron conversations export` writes it: plain links
// (Tab reaches them, Enter follows them); the route answers with Content-Disposition attachment.
function Download({ conv }) {
  const url = (format) => `/api/conversations/${encodeURIComponent(conv)}/export?format=${format}`;
  return html`<span class="download" role="group" aria-label="download this conversation">Download
    <a href=${url("md")} download aria-label="download this conversation as Markdown">Markdown</a>
    <a href=${url("json")} download aria-label="download this conversation as JSON">JSON</a></span>`;
}

const PANELS = ["branches", "memory", "review", "compaction", "status", "work"];
const DOWN = "No connection to heron serve: what the agent does is not shown until the page "
  + "reconnects (it does by itself). What you send meanwhile is not sent";
const NOT_SENT = "Not sent: no connection to heron serve (stopped or restarting?). Your message "
  + "stays in the box: send it again once the page is connected";
const LOGGED_OUT = "Logged out: this browser's login to heron serve has expired or was revoked. "
  + "Run `heron web` on the serve's machine and open the address it prints (`heron web --open` "
  + "opens it); then come back to this tab, which reconnects. What you typed stays in the box";
// The terminal's notice (heron/channels/script.py EMBEDDED_BANNER), with the browser's way out.
const DEMO = "Offline demo model (SmolLM2-135M, no tools, short answers) for trying Heron out; "
  + "for real work set ANTHROPIC_API_KEY, OPENAI_API_KEY or HERON_BASE_URL and start heron serve again (see README).";

// ---- the app ----------------------------------------------------------------------------------

function App() {
  const [conv, setConv] = useState(keyFromHash());
  const [items, setItems] = useState([]);
  const [title, setTitle] = useState(null);
  const [, setShown] = useState(0); // bumped when the live turn changes as a whole
  const [notes, setNotes] = useState(() => keptNotes(keyFromHash()));
  // The notes of this conversation are kept in this tab across a reload (keptNotes).
  useEffect(() => keepNotes(conv, notes), [conv, notes]);
  const [conn, setConnState] = useState("connecting");
  const [uploads, setUploads] = useState([]);
  const [panel, setPanel] = useState(null);
  const [side, setSide] = useState(false);
  const [tick, setTick] = useState(0);
  const [streamed, setStreamed] = useState(0); // a turn's first streamed piece came
  const [toast, setToast] = useState(null);
  const [running, setRunning] = useState([]); // conversations where a turn runs (any client)
  const [waiting, setWaiting] = useState([]); // where a question or an approval waits for you
  const [foreign, setForeign] = useState(null); // a turn of another process runs (where)
  const [embedded, setEmbedded] = useState(false); // the offline demo model answers
  const draft = useRef(null); // puts a text back in the composer (a send the serve refused)
  const liveRef = useRef(null);
  const itemsRef = useRef([]); // the items last read, for the events' handler (a note's place)
  const convRef = useRef(conv);
  const listRef = useRef(null);
  const connRef = useRef(null);
  const loaded = useRef(false);
  const toEnd = useRef(false); // the next transcript drawn is a first read: show its newest
  const fetches = useRef(0);
  const loading = useRef(null); // the first read of the transcript, while it runs
  const [earlier, setEarlier] = useState(null); // the `before` of the page above what is held
  const start = useRef(null); // the first row of what is held: what a read again starts from
  const older = useRef(null); // a read of an earlier page, while it runs
  const place = useRef(null); // {height, top} of the list before an earlier page went on top
  const fresh = useRef(true); // the next welcome answers a fresh attach
  const hit = useRef(null); // a search hit's row: the conversation opens there, not at its end
  const replay = useRef(null); // {until, events}: the journal's events of a fresh attach
  const chatId = useRef(null); // this tab's id in events (welcome): who answered an approval
  const stopping = useRef(false); // this tab sent /stop: its turn's end needs no word
  const lastTurn = useRef(null); // the message of the newest turn seen start (a note's place)
  const menuRef = useRef(null); // the ☰ button (a phone): where the focus goes back to
  const sideRef = useRef(side); // the list is open, for the window's key handler
  sideRef.current = side;

  // A notice shows for six seconds of its own: an earlier notice's timer ends no later one
  // (the "heron serve stopped" notice took "Not sent" away two seconds after it came).
  const toastTimer = useRef(0);
  const notify = (m) => {
    setToast(m); clearTimeout(toastTimer.current);
    toastTimer.current = setTimeout(() => setToast(null), 6000);
  };
  // The live turn (liveRef) changes as events come. What the whole page shows of it (a turn
  // starts or ends, mail, a retry's wait) is drawn at once by showLive; a streamed piece
  // redraws only the live reply, at most every DRAW_MS and then on the next frame (drawLive),
  // so a fast stream, or ten tabs of one, never queues renders behind the socket.
  const frame = useRef(0);
  const showLive = (v) => { liveRef.current = v; setShown((n) => n + 1); };
  const drawLive = () => {
    if (frame.current) return;
    frame.current = setTimeout(() => requestAnimationFrame(() => {
      frame.current = 0;
      for (const draw of liveDraws) draw();
    }), DRAW_MS);
  };

  // The first read takes the newest page; a read again (a turn ended) every item from the
  // first row held on, so the pages read earlier stay. When that row is no longer on the
  // branch (/edit, /tree), the answer is the newest page again, and it replaces them.
  const loadTranscript = useCallback(async (key) => {
    const gen = ++fetches.current;
    const since = loaded.current ? start.current : null;
    const query = since != null ? `since=${since}` : `limit=${PAGE}`;
    try {
      const t = await api(`/conversations/${encodeURIComponent(key)}/transcript?${query}`);
      // Only the newest read counts: an older one may predate the turn that just ended.
      if (key !== convRef.current || gen !== fetches.current) return;
      if (!loaded.current && hit.current == null) toEnd.current = true;
      let all = t.items;
      if (since != null && t.start === since) { // an earlier page may have come meanwhile
        all = [...itemsRef.current.filter((it) => it.id < since), ...t.items];
        if (start.current === since) setEarlier(t.earlier);
      } else { start.current = t.start; setEarlier(t.earlier); }
      itemsRef.current = all; setItems(all); setTitle(t.title); loaded.current = true;
      // Notes said after a turn no longer on the branch (/tree, /edit) go after its newest
      // item, as read now: the turns that come later go below them, in every tab alike.
      // (A note said before the first item held is left as it is: its place is on a page
      // above, not read yet.)
      const again = (n) => ({ ...n, after: anchorOf(null, all.filter((it) => it.id <= n.after.known)) });
      const placed = (n) => anchored(n, all, liveRef.current)
        || (t.earlier != null && all.length > 0 && n.after.known < all[0].id);
      setNotes((ns) => (ns.every(placed) ? ns : ns.map((n) => (placed(n) ? n : again(n)))));
      // A turn that ended before the transcript was read is in it now: one render swaps them.
      if (liveRef.current && liveRef.current.done) showLive(null);
      document.body.dataset.rendered = String(all.length);
      setTick((x) => x + 1);
    } catch (e) { notify(e.message); } finally { if (gen === fetches.current) loading.current = null; }
  }, []);

  // The page above the first item held, put on top where the reader is: the list keeps its
  // distance from the bottom, so what was on screen stays there.
  const loadEarlier = async () => {
    const key = convRef.current, before = earlier;
    if (before == null || older.current) return;
    older.current = before; setShown((n) => n + 1);
    try {
      const t = await api(`/conversations/${encodeURIComponent(key)}/transcript?before=${before}&limit=${PAGE}`);
      if (key !== convRef.current || start.current !== before) return; // moved on meanwhile
      const el = listRef.current;
      if (el) place.current = { height: el.scrollHeight, top: el.scrollTop };
      const held = new Set(itemsRef.current.map(itemKey));
      const all = [...t.items.filter((it) => !held.has(itemKey(it))), ...itemsRef.current];
      start.current = t.start; setEarlier(t.earlier);
      itemsRef.current = all; setItems(all);
      document.body.dataset.rendered = String(all.length);
    } catch (e) { notify(e.message); } finally { older.current = null; setShown((n) => n + 1); }
  };
  // Scrolled to (near) the top: the page above comes by itself.
  const onScroll = (e) => { if (e.currentTarget.scrollTop < 300 && !toEnd.current) loadEarlier(); };

  // A fresh attach (page load, another conversation) is answered with the journal's events up
  // to welcome.seq. The transcript is the truth for every turn that ended; only a turn still
  // open at the end of that replay is drawn from its events.
  const onEvent = useCallback((ev) => {
    if (ev.type === "welcome") {
      chatId.current = ev.chat_id;
      if (ev.title) setTitle(ev.title); // else the transcript's: a reconnect keeps it
      setEmbedded(!!ev.embedded);
      if (ev.running) setRunning(ev.running);
      if (ev.waiting) setWaiting(ev.waiting);
      setForeign(ev.elsewhere ? { ...ev.elsewhere, conversation: ev.conversation } : null);
      if (ev.gap || (!loaded.current && !loading.current)) {
        // Told `gap` (fell behind, or a restarted serve numbers anew): the stream shown is
        // over or unknown; the transcript says what happened, and a turn running now shows
        // from its next event, below what the store holds of it.
        stopping.current = false;
        showLive(ev.gap && ev.busy ? { ...newLive({ text: null }), orphan: true } : null);
        loadTranscript(convRef.current);
      }
      if (ev.gap) connRef.current.lastSeq = ev.seq;
      const from = connRef.current.lastSeq;
      replay.current = fresh.current && !ev.gap && ev.seq > from ? { until: ev.seq, events: [] } : null;
      fresh.current = false;
      return;
    }
    const r = replay.current;
    if (r && typeof ev.seq === "number" && ev.seq <= r.until) {
      r.events.push(ev);
      if (ev.seq === r.until) { replay.current = null; finishReplay(r.events); }
      return;
    }
    apply(ev);
  }, []);

  function finishReplay(events) {
    let open = -1;
    events.forEach((e, i) => {
      if (e.type === "turn_start") open = i;
      else if (e.type === "turn_end") open = -1;
    });
    if (open >= 0) for (const e of events.slice(open)) apply(e);
    // The transcript may have been read before a turn of the replay ended: read it once more.
    if (events.some((e) => e.type === "turn_end")) loadTranscript(convRef.current);
  }

  function apply(ev) {
    let lv = liveRef.current;
    switch (ev.type) {
      case "turn_start": {
        const pending = lv && !lv.done ? lv.mail : [];
        const next = newLive(ev);
        if (ev.message_id != null) lastTurn.current = ev.message_id;
        // A queued message opening this turn is no longer shown as queued.
        next.mail = pending.filter((m) => m.text !== ev.text && m.state === "mail");
        showLive(next);
        break;
      }
      case "delta": case "reasoning": case "tool_start": case "tool_end": case "approval":
        if (!lv || lv.done) {
          // A turn whose start this page never saw (the journal no longer had it): its stream
          // shows below what the store already holds of it.
          lv = { ...newLive({ text: null }), orphan: true };
          showLive(lv);
        }
        if (lv.retry) { lv.retry = null; showLive(lv); } // the banner's wait is over
        if (ev.type === "approval") { // a command waits for a yes or no: drawn at once
          if (!lv.segments.some((x) => x.kind === "approval" && x.id === ev.id)) {
            lv.segments.push({ kind: "approval", id: ev.id, tool: ev.tool, command: ev.command, confined: ev.confined });
          }
          showLive(lv); break;
        }
        applyToLive(lv, ev); drawLive();
        // By the first streamed piece the turn has stored the message: the list shows its
        // conversation, open views read it again.
        if (!lv.listed) { lv.listed = true; setStreamed((x) => x + 1); }
        break;
      case "status":
        if (ev.state === "running") { // the hub's: where turns run, this conversation or not
          setRunning(ev.running || []); setWaiting(ev.waiting || []);
        } else if (lv && ev.state === "restart") { // a retried stream differs: it starts again below
          lv.segments.push({ kind: "note", text: "The stream was cut; the reply starts again." });
          lv.retry = null; showLive(lv);
        } else if (lv && ev.state === "retry") {
          lv.retry = { seconds: ev.seconds, text: ev.text, at: Date.now() }; showLive(lv);
        } else if (lv && (ev.state === "mail" || ev.state === "queued")) {
          if (ev.chat_id != null && ev.chat_id === chatId.current) { // this tab's own message
            // The serve answers this tab's sends in order, each once: this status is the
            // oldest one's without an answer (a command answered at once has none: `answered`).
            const m = lv.mail.find((x) => !x.state);
            if (m) { m.state = ev.state; m.channel = ev.channel; }
          } else if (ev.text) { // another tab's, a terminal's or a script's: shown here too
            if (ev.state === "mail" && lv.asking) lv.segments.push({ kind: "answer", text: ev.text });
            else lv.mail.push({ text: ev.text, state: ev.state, channel: ev.channel });
          }
          if (ev.state === "mail") lv.asking = false; // answered here or from another client
          showLive(lv);
        }
        break;
      case "message":
        if (ev.kind === "question") { // ask_user: the next message answers it
          if (!lv || lv.done) { // its turn's start was not seen (told `gap`): shown all the same
            lv = { ...newLive({ text: null }), orphan: true };
          }
          lv.segments.push({ kind: "question", ...questionOf(ev.text) }); lv.asking = true; showLive(lv);
        } else if (ev.code === "stop_answer" && ev.chat_id !== chatId.current) {
          // Another client's "Stopped.": the turn's end said here who stopped it.
        } else if (ev.code === "keeping") {
          // Its message is being kept as the serve stops: the "unanswered" notice says the end.
        } else if (ev.code === "unanswered" && ev.chat_id !== chatId.current) {
          // Another client's message kept unanswered as the serve stopped: its notice is for it.
        } else if (ev.kind !== "answer") {
          if (ev.chat_id === chatId.current && answered(lv, ev.kind)) showLive(lv);
          // A notice about a stored message (this tab's, kept unanswered as the serve
          // stopped) goes after it, though the page reads that row only later.
          const row = ev.message_id;
          const after = row != null ? { row, known: row } : anchorOf(lv, itemsRef.current, lastTurn.current);
          // A monitor's or the heartbeat's message is also stored here as Heron's note: how
          // many such notes the transcript holds now, so the stored one replaces this one.
          const stored = storedNotes(itemsRef.current, ev.text);
          setNotes((n) => [...n, { id: noteId(), kind: ev.kind, text: ev.text, by: ev.by, after, stored }]);
        }
        break;
      case "approval_end": { // answered here or elsewhere, stopped, or past its deadline
        const seg = lv && lv.segments.find((x) => x.kind === "approval" && x.id === ev.id);
        if (seg) {
          Object.assign(seg, { allowed: ev.allowed, reason: ev.reason, mine: ev.by === chatId.current });
          showLive(lv);
        }
        break;
      }
      case "turn_end":
        if (ev.interrupted && ev.stopped_by && !stopping.current) {
          // Another client stopped it (a terminal, another tab, a script): say which.
          const text = `Stopped by ${ev.stopped_by}. What the turn finished is kept.`;
          const after = anchorOf(lv, itemsRef.current, lastTurn.current);
          setNotes((n) => [...n, { id: noteId(), kind: "stopped", text, after }]);
        }
        stopping.current = false;
        if (lv) { lv.done = true; lv.interrupted = ev.interrupted; showLive(lv); }
        if (ev.switch_to) { openConv(ev.switch_to); break; }
        loadTranscript(convRef.current);
        break;
      case "error":
        if (typeof ev.text === "string") { // a send refused (a mistyped command): not sent
          if (lv) lv.mail = lv.mail.filter((m) => m.state || m.text !== ev.text);
          if (draft.current) draft.current(ev.text);
        }
        notify(withHint(ev.message, ev.hint));
        break;
      case "work":
        for (const hear of workListeners) hear(ev);
        break;
      case "elsewhere": // another process's turn began or ended here: the store has its rows
        setForeign(ev.running ? ev : null);
        loadTranscript(convRef.current);
        break;
    }
  }

  useEffect(() => {
    connRef.current = new Connection(onEvent, setConnState);
    connRef.current.onDropped = (typed) => { // the first socket failed: the text goes back
      notify(NOT_SENT);
      const said = typed.find((m) => m.type === "send");
      if (said && draft.current) draft.current(said.text);
    };
    // The transcript is read while the socket opens; the welcome then only adds the stream.
    loading.current = loadTranscript(conv);
    connRef.current.open(conv, 0);
    const onHash = () => { const k = keyFromHash(); if (k !== convRef.current) openConv(k); };
    window.addEventListener("hashchange", onHash);
    const onKey = (e) => {
      if (e.key !== "Escape") return;
      if (sideRef.current) closeSide(); // the list opened over the page goes first
      else if (liveRef.current && !liveRef.current.done) stop();
    };
    window.addEventListener("keydown", onKey);
    // Back to a logged-out tab (perhaps after logging in in another): one more try.
    const onBack = () => { if (!document.hidden) connRef.current.resume(); };
    window.addEventListener("focus", onBack);
    document.addEventListener("visibilitychange", onBack);
    return () => {
      window.removeEventListener("hashchange", onHash); window.removeEventListener("keydown", onKey);
      window.removeEventListener("focus", onBack); document.removeEventListener("visibilitychange", onBack);
    };
  }, []);

  const live = liveRef.current;
  useLayoutEffect(() => {
    // A conversation opens at its newest message; later reads keep the reader's place.
    const el = listRef.current;
    if (place.current && el) { // an earlier page went on top: the same text stays in view
      el.scrollTop = el.scrollHeight - place.current.height + place.current.top;
      place.current = null;
    } else if (toEnd.current && el) jumpToEnd(el);
    else keepAtEnd(el);
    toEnd.current = false;
  }, [items, live, notes]);

  // A search hit's conversation opens at the hit: the pages above the newest are read until
  // one holds its row, which is then scrolled to the middle of the screen and marked.
  useEffect(() => {
    const at = hit.current;
    if (at == null || !loaded.current || older.current) return;
    const found = items.find((it) => it.id === at || (it.rows || []).includes(at));
    if (!found) {
      if (earlier != null) loadEarlier(); else hit.current = null;
      return;
    }
    hit.current = null;
    showHit(listRef.current, found.id);
  }, [items]);

  function openConv(key, at = null) {
    hit.current = at;
    convRef.current = key; loaded.current = false; loading.current = null;
    start.current = null; older.current = null; place.current = null; setEarlier(null);
    fresh.current = true; replay.current = null; lastTurn.current = null;
    itemsRef.current = []; setConv(key); setItems([]); setNotes(keptNotes(key)); showLive(null); setSide(false);
    setTitle(null);
    focusInput(); // the next thing a person does in a conversation they open is type
    if (location.hash !== "#c=" + encodeURIComponent(key)) location.hash = "c=" + encodeURIComponent(key);
    connRef.current.open(key, 0);
  }

  const MESSAGE_LIMIT = 8 * 1024 * 1024; // bytes of one message, as heron/messages.py has it
  const notSent = () => (connRef.current.loggedOut ? LOGGED_OUT : NOT_SENT);
  // False when it could not be sent (no connection): the composer keeps it.
  const send = (text, files) => {
    // Too large for one message (heron/messages.py MESSAGE_LIMIT): said here and kept in the
    // box; the serve's refusal could not give it back (it would not fit a frame either).
    const size = text.length > MESSAGE_LIMIT / 4 ? new TextEncoder().encode(text).length : 0;
    if (size > MESSAGE_LIMIT) {
      notify(`The message is ${(size / 2 ** 20).toFixed(1)} MB; one message holds at most ` +
        `${MESSAGE_LIMIT / 2 ** 20} MB. Nothing was sent: save it as a file in the workspace and ask about the file.`);
      return false;
    }
    const m = { type: "send", text };
    if (files && files.length) m.files = files;
    if (!connRef.current.sendTyped(m)) { notify(notSent()); return false; }
    // /stop's own answer says it stopped; /new's says a new conversation began, so the
    // stopped turn's note ("Stopped by /new from the browser") is shown here as in every tab.
    if (text.trim() === "/stop") stopping.current = true;
    const lv = liveRef.current;
    if (lv && !lv.done && lv.asking) { // the answer to its question: shown where it was asked
      lv.segments.push({ kind: "answer", text }); lv.asking = false; showLive(lv);
    } else if (lv && !lv.done) { lv.mail.push({ text, state: null, command: text.trim().startsWith("/") }); showLive(lv); }
    return true;
  };
  const stop = () => { stopping.current = true; connRef.current.send({ type: "stop" }); };
  const closeSide = () => { setSide(false); if (menuRef.current) menuRef.current.focus(); };
  const approve = (seg, allow) => { // the first answer from any client decides (approval_end)
    seg.sent = true; showLive(liveRef.current);
    connRef.current.send({ type: "approve", id: seg.id, allow });
  };
  const command = (text) => { if (!connRef.current.sendTyped({ type: "command", text })) notify(notSent()); };
  const onEdit = (n, text) => command(`/edit ${n} ${text}`); // its own box said what

  const working = live && !live.done;
  const elsewhere = waiting.some((k) => k !== conv); // another conversation waits for an answer
  // A tab in the background says in its title how many conversations wait for an answer.
  useEffect(() => { document.title = (waiting.length ? `(${waiting.length}) ` : "") + "Heron"; }, [waiting]);
  // While a turn is drawn from its stream, its stored rows are left out: those the store
  // marks running, and all of that turn's once a read finds it saved before its turn_end
  // arrived (it is shown once, live, until the end swaps it for the stored item).
  const mine = (it) => live.messageId != null && it.turn_message === live.messageId;
  const shown = live && !live.orphan ? items.filter((it) => !it.running && !mine(it)) : items;
  // (Notes kept across a reload wait for the transcript, which holds their places.)
  const placed = placeNotes(shown, items, loaded.current ? notes : [], live, earlier);
  return html`<div class=${"layout" + (panel ? " with-panel" : "")}>
    <a class="skip" href="#input" onClick=${(e) => { e.preventDefault(); focusInput(); }}>Skip to message box</a>
    <${Sidebar} current=${conv} open=${side} onOpen=${openConv} onClose=${closeSide} notify=${notify} refresh=${tick}
      streamed=${streamed}
      running=${running} waiting=${waiting}
      onRenamed=${(key, t) => { if (key === convRef.current) setTitle(t); }} />
    ${side && html`<div class="backdrop" aria-hidden="true" onClick=${closeSide}></div>`}
    <main class="chat" aria-label="conversation">
      <header class="top">
        <button class=${"menu" + (elsewhere ? " waits" : "")} aria-expanded=${side} ref=${menuRef}
          onClick=${() => (side ? closeSide() : setSide(true))}
          aria-label=${elsewhere ? "conversations (one waits for your answer)" : "conversations"}>☰</button>
        <h1 class="title">${title || conv}</h1>
        <span class=${"conn " + conn} role="status" aria-label=${"connection " + conn}>${conn === "open" ? "" : conn}</span>
        <nav class="tabs" aria-label="views">${PANELS.map((p) => html`<button key=${p}
          aria-pressed=${panel === p} onClick=${() => setPanel(panel === p ? null : p)}>${p}</button>`)}
          <button onClick=${() => command("/new")} aria-label="start afresh (/new)">/new</button></nav>
        ${(items.length > 0 || live) && html`<${Download} conv=${conv} />`}
      </header>
      ${conn === "logged out" && html`<div class="logout" role="alert" aria-label="logged out">${LOGGED_OUT}.</div>`}
      ${embedded && html`<div class="demo" role="note" aria-label="offline demo model">${DEMO}</div>`}
      <div class="messages" role="log" aria-live="polite" aria-label="transcript" ref=${listRef}
        onScroll=${onScroll}>
        ${earlier != null && html`<button class="earlier" onClick=${loadEarlier} disabled=${!!older.current}>${
          older.current ? "Loading earlier messages…" : "Load earlier messages"}</button>`}
        ${placed.rows.flatMap(({ it, notes: after }) => [html`<${PureItem} key=${itemKey(it)} item=${it}
          onEdit=${onEdit} number=${it.number} />`, ...after.map((n) => html`<${Note} key=${n.id} n=${n} />`)])}
        ${live && html`<${Live} live=${live} list=${listRef} onApprove=${approve} notes=${placed.live} />`}
        ${placed.rest.map((n) => html`<${Note} key=${n.id} n=${n} />`)}
      </div>
      ${working && html`<${Banner} live=${live} onStop=${stop} conn=${conn} />`}
      ${toast && html`<div class="toast" role="alert">${toast}</div>`}
      ${!working && foreign && foreign.conversation === conv && html`<${Elsewhere} about=${foreign}
        onStop=${() => connRef.current.send({ type: "stop" })} />`}
      <${Composer} onSend=${send} draft=${draft} busy=${working} asking=${!!(working && live && live.asking)} uploads=${uploads} setUploads=${setUploads} notify=${notify} />
    </main>
    ${panel && html`<aside class="panel" aria-label=${panel}>
      <button class="close" aria-label="close panel" onClick=${() => setPanel(null)}>×</button>
      ${panel === "branches" && html`<${Branches} conv=${conv} command=${command} tick=${tick + streamed} />`}
      ${panel === "memory" && html`<${Memory} notify=${notify} />`}
      ${panel === "review" && html`<${Review} notify=${notify} />`}
      ${panel === "compaction" && html`<${Compactions} conv=${conv} tick=${tick + streamed} />`}
      ${panel === "status" && html`<${Status} conv=${conv} tick=${tick + streamed} />`}
      ${panel === "work" && html`<${Work} conv=${conv} tick=${tick + streamed} notify=${notify}
        send=${(m) => connRef.current.send(m)} />`}
    </aside>`}
  </div>`;
}

render(html`<${App} />`, document.getElementById("app"));
// The parser and the sanitiser compile their patterns and build their document on first use:
// done while the page is idle, not when the first piece of a reply arrives.
(window.requestIdleCallback || setTimeout)(() => toHtml("*Heron*, `ready`.\n\n- one\n"));
