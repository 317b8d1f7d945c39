"""Runs a command in a pseudo-terminal, as a person at a terminal would: waits until a text shows
on its screen, types keys, and waits for it to exit. Standard library only (CI has no tmux).

usage: pty_run.py --expect TEXT [--keys q] [--timeout S] [--rows R] [--cols C] -- COMMAND...
Prints one JSON object: sawExpected, exitCode (None if it had to be killed), timedOut,
terminalRestored (echo and line mode back on after it exited), output (all it wrote).
"""
import argparse
import fcntl
import json
import os
import pty
import select
import signal
import struct
import sys
import termios
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument('--expect', required=True)
    ap.add_argument('--keys', default='q')
    ap.add_argument('--timeout', type=float, default=20.0)
    ap.add_argument('--rows', type=int, default=50)
    ap.add_argument('--cols', type=int, default=160)
    ap.add_argument('command', nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ['--'] else a.command
    if not cmd:
        ap.error('give the command after --')

    pid, fd = pty.fork()
    if pid == 0:
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack('HHHH', a.rows, a.cols, 0, 0))
        try:
            os.execvp(cmd[0], cmd)
        finally:
            os._exit(127)

    out = b''
    deadline = time.monotonic() + a.timeout
    saw = False
    typed = False
    status = None
    while time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], 0.05)
        if r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal (it exited)
                chunk = b''
            if not chunk:
                break
            out += chunk
        if not saw and a.expect.encode() in out:
            saw = True
        if saw and not typed:
            os.write(fd, a.keys.encode())
            typed = True
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
            # Drain what is left on the screen.
            try:
                while select.select([fd], [], [], 0.05)[0]:
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        break
                    out += chunk
            except OSError:
                pass
            break

    restored = None
    try:
        lflag = termios.tcgetattr(fd)[3]
        restored = bool(lflag & termios.ECHO) and bool(lflag & termios.ICANON)
    except termios.error:
        pass

    timed_out = status is None
    if timed_out:
        # Give it a moment after EOF, then stop it.
        for _ in range(40):
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
                timed_out = False
                break
            time.sleep(0.05)
    if status is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    exit_code = os.waitstatus_to_exitcode(status) if status is not None else None
    os.close(fd)
    json.dump({'sawExpected': saw, 'exitCode': exit_code, 'timedOut': timed_out, 'terminalRestored': restored,
               'output': out.decode('utf-8', 'replace')}, sys.stdout)
    sys.stdout.write('\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
