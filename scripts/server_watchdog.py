"""Stop a private TorchServe once the process that started it is gone.

    python -m scripts.server_watchdog --owner PID --server-pid PID [--interval 1]

The tests, the load-test tools and the reliability suite start TorchServe as a daemon (`torchserve --start`) and stop
it in a `finally` block. A SIGKILL (an out-of-memory kill, `kill -9`, a CI runner's hard timeout) runs no `finally`,
and the server would keep its ports, its workers and two cores busy for good. `scripts.ops.server.start_isolated`
starts this watchdog beside each private server, in its own session so a signal to the owner's process group does not
reach it. It polls both processes: when the server is gone it exits; when the owner is gone it stops the server the
way Server.stop does (SIGTERM to the frontend, whose shutdown hook stops the workers), then SIGKILLs whatever of the
server's process tree is still there after --grace seconds.
Exit codes: 0 the server stopped (by its owner or by this watchdog), 2 bad arguments.
"""

import argparse
import sys
import time

from scripts.ops.server import process_alive, stop_process_tree


def watch(owner, server_pid, interval=1.0, grace=30.0):
    """Block until the server stops; stop it first if the owner dies. Returns what happened."""
    while process_alive(server_pid):
        if not process_alive(owner):
            stop_process_tree(server_pid, grace)
            return "owner gone: server stopped"
        time.sleep(interval)
    return "server stopped by its owner"


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m scripts.server_watchdog",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--owner", type=int, required=True, help="pid of the process that started the server")
    parser.add_argument("--server-pid", type=int, required=True, help="pid of TorchServe's frontend (its pid file)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between checks")
    parser.add_argument("--grace", type=float, default=30.0, help="seconds after SIGTERM before SIGKILL")
    args = parser.parse_args(argv)
    if args.interval <= 0 or args.grace < 0:
        parser.error("--interval must be positive and --grace not negative")
    print(watch(args.owner, args.server_pid, args.interval, args.grace))
    return 0


if __name__ == "__main__":
    sys.exit(main())
