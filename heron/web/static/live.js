// The streaming reply's Markdown, cut where it is safe to draw once: the finished blocks of a
// text (up to its last blank line outside a code fence) never change as more text streams in,
// so the page renders each of them once and redraws only the unfinished tail. The rule is the
// terminal's (heron/channels/terminal.py, split_blocks), which prints a block once it is done.

// Python's str.splitlines() line ends: a line that ends in anything but "\n" stops the scan
// there, as it does in split_blocks.
const LINE = /[^\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]*(?:\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029])?/g;

// The finished Markdown blocks at the start of `text` and the unfinished rest, as
// [done, rest]; done + rest === text.
export function splitBlocks(text) {
  let done = 0, offset = 0, fenced = false;
  LINE.lastIndex = 0;
  for (let m = LINE.exec(text); m && m[0]; m = LINE.exec(text)) {
    const line = m[0];
    offset += line.length;
    if (!line.endsWith("\n")) break;
    const stripped = line.trim();
    if (stripped.startsWith("```") || stripped.startsWith("~~~")) fenced = !fenced;
    else if (!stripped && !fenced) done = offset;
  }
  return [text.slice(0, done), text.slice(done)];
}

// Moves what of a streamed text segment finished since the last call into `seg.blocks` (each
// entry drawn once, in order) and returns the unfinished tail. A finished cut never moves:
// text only grows, and the rest is scanned from where the last cut ended.
export function advance(seg) {
  if (!seg.blocks) { seg.blocks = []; seg.at = 0; }
  const [done, rest] = splitBlocks(seg.text.slice(seg.at));
  if (done) { seg.blocks.push(done); seg.at += done.length; }
  return rest;
}
