"""`lad serve`: the options, the log, the model, and uvicorn with a bounded graceful drain.

Every setting of ``app.settings.Settings`` is a flag (``--max-batch-size 16``) as well as
an environment variable (``LAD_MAX_BATCH_SIZE``) or a line of ``.env``; a flag wins. The
bearer tokens are environment-only (a flag would show in ``ps``). Building the parser
imports no model code, so ``lad serve --help`` answers at once.

Start-up order: the settings, then the port (bound, not yet listening: a busy port fails
at once, not after the model load), then the model, then the server; ``ready`` is logged
once the socket listens. Each cause of a failed start has its own exit status
(:data:`EXIT_CODES`, shown by ``lad serve --help`` and docs/operations.md).

Drain: in a container `lad serve` is PID 1 and gets the orchestrator's SIGTERM itself. It
then stops accepting connections, lets every request in flight finish (their batches
included: the model worker stops only after the last request) and exits within
``LAD_DRAIN_TIMEOUT_S``; requests still running at the bound are cancelled. Uvicorn would
re-raise the signal after its shutdown so that the process dies *by* SIGTERM; here a
completed drain exits 0, which PID 1 (for which the kernel ignores SIGTERM's default
action) needs in order to exit at all.

SIGHUP (a closed terminal, or an operator used to daemons that reload on it) changes
nothing: `lad serve` reloads no settings (restart it to change them), so the signal is
logged and ignored from the start of `main`, and no request is dropped.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import signal
import socket
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

import uvicorn
from pydantic import ValidationError

from app.cli_help import BooleanFlag, command_parser
from app.settings import Settings

log = logging.getLogger("lad.serve")
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_STOPPED = 0
EXIT_FAILED = 1
EXIT_BAD_SETTINGS = 2
EXIT_MODEL_UNAVAILABLE = 3
EXIT_PORT_BUSY = 4
EXIT_CANNOT_BIND = 5
EXIT_APP_STARTUP_FAILED = 6
UVICORN_STARTUP_FAILURE = 3
"""uvicorn's own exit status for a failed lifespan start-up: newer releases raise it from
``Server.run``; 0.30, our lower bound, returns without starting (``uvicorn.run`` exits)."""
EXIT_CODES: dict[int, str] = {
    EXIT_STOPPED: "stopped by SIGTERM or SIGINT after the requests in flight finished.",
    EXIT_FAILED: "an unexpected error (the log has its traceback).",
    EXIT_BAD_SETTINGS: "invalid settings or flags, or a non-loopback address without "
    "LAD_ADMIN_TOKEN.",
    EXIT_MODEL_UNAVAILABLE: "the model cannot be loaded: not a directory, not in the Hugging "
    "Face cache with the hub offline or unreachable, or an unsupported family.",
    EXIT_PORT_BUSY: "the port is already in use (found before the model is loaded).",
    EXIT_CANNOT_BIND: "the address cannot be bound: not an address of this machine, or a "
    "port below 1024 without the privilege.",
    EXIT_APP_STARTUP_FAILED: "the service failed to start after the model loaded, e.g. the "
    "profile store (LAD_STORE_URL) cannot be opened.",
}
"""`lad serve`'s exit status per cause (docs/operations.md lists the same)."""
HELP_WIDTH = 78
ENV_ONLY = frozenset({"retrieve_token", "admin_token"})
"""Settings that are never flags: secrets would be visible in the process list."""


def _hangup(sig: int, frame: Any) -> None:
    log.info("received SIGHUP: ignored (lad serve reloads nothing; restart it to apply settings)")


def ignore_hangup() -> None:
    """Log and ignore SIGHUP (module docstring); only the main thread can set a handler."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, _hangup)


def build_parser() -> argparse.ArgumentParser:
    """One flag per setting, with its environment variable and default in the help."""
    parser = command_parser(
        prog="lad serve",
        description=textwrap.fill(
            "Run the HTTP service. Every option is also an environment variable (shown) or a "
            "line of a .env file in the working directory; a flag wins. LAD_RETRIEVE_TOKEN "
            "and LAD_ADMIN_TOKEN are environment-only.",
            HELP_WIDTH,
        ),
        epilog="exit status:\n"
        + "\n".join(
            textwrap.fill(text, HELP_WIDTH, initial_indent=f"  {code}  ", subsequent_indent=" " * 5)
            for code, text in EXIT_CODES.items()
        ),
        raw_description=True,
    )
    for name, field in Settings.model_fields.items():
        if name in ENV_ONLY:
            continue
        default = field.get_default(call_default_factory=True)
        shown = (
            "unset"
            if default is None
            else (",".join(map(str, default)) if isinstance(default, list) else default)
        )
        as_flag = {"action": BooleanFlag} if field.annotation is bool else {"metavar": "VALUE"}
        parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            help=f"{field.description or name.replace('_', ' ')} "
            f"[env LAD_{name.upper()}; default: {shown}]",
            **as_flag,
        )
    return parser


def settings_from(argv: list[str] | None) -> Settings:
    args = build_parser().parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if v is not None}
    return Settings(**overrides)


def main(argv: list[str] | None = None) -> int:
    """`lad serve`: settings, logging, the port, the model, then the server until a signal;
    an :data:`EXIT_CODES` status."""
    ignore_hangup()
    try:
        settings = settings_from(argv)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors()
        )
        print(f"lad serve: invalid settings: {problems}", flush=True)
        return EXIT_BAD_SETTINGS
    from app.observability.logs import configure_logging

    configure_logging(settings.log_level, settings.log_format)
    problem = settings.exposure_problem()
    if problem is not None:
        log.error("%s", problem)
        return EXIT_BAD_SETTINGS
    try:
        sock = bind(settings.host, settings.port)
    except BindError as exc:
        log.error("%s", exc)
        return exc.exit_code
    from app.engine import openmp

    openmp.configure()  # before the first import of torch (the OpenMP runtime reads it then)
    from app.engine import host_memory
    from app.main import create_app, load_runner_from_settings
    from app.models.loader import ModelLoadError

    # before the model load starts threads (each picks its arena at its first allocation)
    host_memory.apply(host_memory.policy_for(settings.host_memory_retain_s))
    try:
        runner = load_runner_from_settings(settings)
    except ModelLoadError as exc:
        log.error("%s", exc)
        sock.close()
        return EXIT_MODEL_UNAVAILABLE
    return serve(create_app(settings, runner=runner), settings, sock=sock)


class BindError(OSError):
    """The service's address cannot be bound, with the exit status of its cause."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port), not listening yet: connections are refused until
    the server starts, and a busy port is known before the model load (uvicorn's own bind
    comes after it). SO_REUSEADDR as uvicorn sets it: a restart is not refused by the
    previous process's closing connections."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise BindError(f"cannot bind {host}:{port}: {exc}", EXIT_CANNOT_BIND) from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise _bind_error(host, port, exc) from None
    return sock


def _bind_error(host: str, port: int, exc: OSError) -> BindError:
    if exc.errno == errno.EADDRINUSE:
        return BindError(
            f"port {port} on {host} is already in use (another lad serve?): stop that "
            "process or choose another LAD_PORT / --port",
            EXIT_PORT_BUSY,
        )
    return BindError(f"cannot bind {host}:{port}: {exc.strerror or exc}", EXIT_CANNOT_BIND)


class DrainingServer(uvicorn.Server):
    """uvicorn.Server that drains on SIGTERM/SIGINT and does not re-raise the signal."""

    def __init__(self, config: uvicorn.Config, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.drain_timeout_s = drain_timeout_s
        self.signalled: int | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and not self.should_exit:  # the socket listens: requests are answered
            host, port = sockets[0].getsockname()[:2] if sockets else (self.config.host, 0)
            log.info("ready: serving on http://%s:%d", _shown_host(host), port)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, _hangup)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: stop waiting
            return
        if not self.should_exit:
            self.signalled = sig
            log.info(
                "received %s: no new connections; finishing the requests in flight "
                "(at most %g s, LAD_DRAIN_TIMEOUT_S)",
                signal.Signals(sig).name,
                self.drain_timeout_s,
            )
        self.should_exit = True


def _shown_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def serve(app: Any, settings: Settings, sock: socket.socket | None = None, **options: Any) -> int:
    """Run ``app`` on ``sock`` (default: bind the settings' host and port now) until a signal,
    then drain; an :data:`EXIT_CODES` status (0 after a clean stop).

    The server's timeouts and connection limit come from ``app.api.server``; ``options``
    override further ``uvicorn.Config`` arguments. Uvicorn's own access log and logging
    config are off: ``app.observability.logs`` writes the request lines.
    """
    if sock is None:
        try:
            sock = bind(settings.host, settings.port)
        except BindError as exc:
            log.error("%s", exc)
            return exc.exit_code
    from app.api.server import uvicorn_options

    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=settings.drain_timeout_s,
        **{**uvicorn_options(settings), **options},
    )
    server = DrainingServer(config, settings.drain_timeout_s)
    try:
        with sock:
            server.run(sockets=[sock])
    except SystemExit as exc:  # uvicorn's lifespan failure (the store, ...): its log says why
        return EXIT_APP_STARTUP_FAILED if exc.code == UVICORN_STARTUP_FAILURE else EXIT_FAILED
    except OSError as exc:  # listen() lost a race for the port to another process
        error = _bind_error(settings.host, settings.port, exc)
        log.error("%s", error)
        return error.exit_code
    if server.signalled is not None:
        log.info("stopped after %s", signal.Signals(server.signalled).name)
    if not server.started and getattr(getattr(server, "lifespan", None), "should_exit", False):
        return EXIT_APP_STARTUP_FAILED  # uvicorn 0.30: a failed lifespan returns, no exit
    return EXIT_STOPPED if server.started else EXIT_FAILED
