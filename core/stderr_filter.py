"""The process that sits on the far end of a Paddle process's stderr (see fallback.py).

It copies every byte to the real stderr except Paddle's fallback lines, which it reports on
stdout as ``device-type op dtype`` records, and answers sync markers so the parent can wait
until everything written before a marker has been seen. Being a separate process, it outlives
a crash of its parent and still passes on the crash report.
"""

from __future__ import annotations

import os
import re
import sys

FALLBACK = re.compile(
    rb"missing (\w+) kernel: (\w+), expected_kernel_key:\(\w+, [^,]+, (\w+)\), fallbacking to CPU one!")
SYNC = re.compile(rb"\x00anychip-sync (\d+)$")
# INFO lines Paddle prints while loading anychip's bridge: anychip's plumbing, not the user's.
LOAD_NOISE = re.compile(rb"^I\d{4} [\d:.]+ +\d+ (init|custom_device_load|custom_kernel)\.cc:\d+\]")


def main() -> None:
    stdin, stdout, stderr = sys.stdin.fileno(), sys.stdout.fileno(), sys.stderr.fileno()
    pending = b""
    while True:
        chunk = os.read(stdin, 65536)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        out, records = [], []
        for line in lines:
            if m := FALLBACK.search(line):
                records.append(b"fallback %s %s %s\n" % (m[1], m[2], m[3]))
            elif m := SYNC.search(line):  # after an unfinished line (a progress bar) or alone
                records.append(b"sync %s\n" % m[1])
                if m.start():
                    out.append(line[:m.start()])
            elif not LOAD_NOISE.match(line):
                out.append(line + b"\n")
        if pending and not pending.startswith((b"I", b"W", b"\x00")):  # not a glog line: pass it on now
            out.append(pending)
            pending = b""
        if out:
            os.write(stderr, b"".join(out))
        if records:
            try:
                os.write(stdout, b"".join(records))
            except BrokenPipeError:  # the parent is gone; keep forwarding its stderr
                pass
    if pending:
        os.write(stderr, pending)


if __name__ == "__main__":
    main()
