"""The kernel's own stdout/stderr reach `.heron/kernel.log` bounded (heron/tools/kernel_log.py):
a head as it comes, the last bytes with a count of what was left out, a log too large started
over. In-process: the test writes into the pipe as the kernel would."""

from __future__ import annotations

import os
from pathlib import Path

from heron import workspace_io
from heron.tools.kernel_log import KernelLog
from heron.tools.python_kernel import KERNEL_LOG


def _run(workspace: Path, written: list[bytes], **caps: int) -> bytes:
    log = KernelLog(workspace_io.append_to(workspace, KERNEL_LOG), **caps)
    write_end = os.dup(log.write_end)  # what the kernel holds
    log.started()
    for data in written:
        os.write(write_end, data)
    os.close(write_end)  # the kernel ended
    log.join(timeout=10)
    return (workspace / KERNEL_LOG).read_bytes()


def test_a_flood_keeps_its_head_and_its_last_bytes_with_a_count(tmp_path: Path) -> None:
    flood = [b"start-up line\n", b"x" * 300_000, b"y" * 300_000, b"Segmentation fault\n"]
    text = _run(tmp_path, flood, head=100, tail=50)
    lines = text.split(b"\n")
    assert lines[0].startswith(b"--- kernel started ")
    body = text[len(lines[0]) + 1 :]
    assert body.startswith(b"start-up line\n" + b"x" * 86 + b"\n[heron: ")
    left_out = 14 + 600_000 + 19 - 100 - 50
    assert f"[heron: {left_out} bytes of the kernel's output left out]\n".encode() in body
    assert body.endswith(b"y" * 31 + b"Segmentation fault\n")
    assert len(text) < 400


def test_a_quiet_kernel_is_logged_whole_after_the_earlier_ones(tmp_path: Path) -> None:
    _run(tmp_path, [b"first kernel\n"])
    text = _run(tmp_path, [b"second ", b"kernel\n"])
    assert text.count(b"--- kernel started ") == 2
    assert text.index(b"first kernel\n") < text.index(b"second kernel\n")
    assert text.endswith(b"second kernel\n")
    assert b"left out" not in text


def test_a_log_past_its_limit_starts_over_at_a_kernels_start(tmp_path: Path) -> None:
    _run(tmp_path, [b"old " * 1000], head=10_000, start_over=2_000)
    text = _run(tmp_path, [b"new\n"], start_over=2_000)
    assert b"old" not in text
    assert text.endswith(b"new\n")


def test_the_start_line_names_whose_kernel_it_is(tmp_path: Path) -> None:
    """A serve runs a kernel per conversation, all logging to one file: each start says
    whose it is (the soak's log could not be read back to a conversation)."""
    log = KernelLog(workspace_io.append_to(tmp_path, KERNEL_LOG), whose="conversation personal")
    log.started()
    log.join(timeout=10)
    first = (tmp_path / KERNEL_LOG).read_bytes().split(b"\n")[0]
    assert first.startswith(b"--- kernel started ")
    assert first.endswith(b" for conversation personal")
