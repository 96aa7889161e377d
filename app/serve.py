"""`lad serve`: the options, the log, the model, and uvicorn with a bounded graceful drain.

Every setting of ``app.settings.Settings`` is a flag (``--max-batch-size 16``) as well as
an environment variable (``LAD_MAX_BATCH_SIZE``) or a line of ``.env``; a flag wins. The
bearer tokens are environment-only (a flag would show in ``ps``). Building the parser
imports no model code, so ``lad serve --help`` answers at once.

Drain: in a container `lad serve` is PID 1 and gets the orchestrator's SIGTERM itself. It
then stops accepting connections, lets every request in flight finish (their batches
included: the model worker stops only after the last request) and exits within
``LAD_DRAIN_TIMEOUT_S``; requests still running at the bound are cancelled. Uvicorn would
re-raise the signal after its shutdown so that the process dies *by* SIGTERM; here a
completed drain exits 0, which PID 1 (for which the kernel ignores SIGTERM's default
action) needs in order to exit at all.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from typing import Any

import uvicorn
from pydantic import ValidationError

from app.cli_help import BooleanFlag, command_parser
from app.settings import Settings

log = logging.getLogger("lad.serve")
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_BAD_SETTINGS = 2
EXIT_MODEL_UNAVAILABLE = 3
ENV_ONLY = frozenset({"retrieve_token", "admin_token"})
"""Settings that are never flags: secrets would be visible in the process list."""


def build_parser() -> argparse.ArgumentParser:
    """One flag per setting, with its environment variable and default in the help."""
    parser = command_parser(
        prog="lad serve",
        description="Run the HTTP service. Every option is also an environment variable "
        "(shown) or a line of a .env file in the working directory; a flag wins. "
        "LAD_RETRIEVE_TOKEN and LAD_ADMIN_TOKEN are environment-only.",
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
    """`lad serve`: settings, logging, model, then the server until a signal."""
    try:
        settings = settings_from(argv)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors()
        )
        print(f"lad serve: invalid settings: {problems}", flush=True)
        return EXIT_BAD_SETTINGS
    from app.logs import configure_logging

    configure_logging(settings.log_level, settings.log_format)
    problem = settings.exposure_problem()
    if problem is not None:
        log.error("%s", problem)
        return EXIT_BAD_SETTINGS
    from app.api.server import return_large_buffers_to_the_os
    from app.main import create_app, load_runner_from_settings
    from app.models.loader import ModelLoadError

    return_large_buffers_to_the_os()
    try:
        runner = load_runner_from_settings(settings)
    except ModelLoadError as exc:
        log.error("%s", exc)
        return EXIT_MODEL_UNAVAILABLE
    return serve(create_app(settings, runner=runner), settings)


class DrainingServer(uvicorn.Server):
    """uvicorn.Server that drains on SIGTERM/SIGINT and does not re-raise the signal."""

    def __init__(self, config: uvicorn.Config, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.drain_timeout_s = drain_timeout_s
        self.signalled: int | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
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


def serve(app: Any, settings: Settings, **options: Any) -> int:
    """Run ``app`` until a signal, then drain; 0 after a clean stop.

    The server's timeouts and connection limit come from ``app.api.server``; ``options``
    override further ``uvicorn.Config`` arguments. Uvicorn's own access log and logging
    config are off: ``app.logs`` writes the request lines.
    """
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
    server.run()
    if server.signalled is not None:
        log.info("stopped after %s", signal.Signals(server.signalled).name)
    return 0 if server.started else 1
