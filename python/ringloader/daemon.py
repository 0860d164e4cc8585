# SPDX-License-Identifier: Apache-2.0
"""A private ringloader daemon for a notebook or a script: no config file, no service."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Union

from . import _ringloader
from .errors import Error, InvalidArgument, Unavailable


def find_binary(name: str) -> str:
    """``name`` (ringloaderd, ringloaderctl) under this package's install prefix, else on PATH.

    The package lives in <prefix>/lib/python3.X/dist-packages/ringloader, the binaries in
    <prefix>/bin.
    """
    prefix = Path(__file__).resolve().parents[4]
    candidate = prefix / "bin" / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    raise Error(f"cannot find {name}: not in {prefix / 'bin'} and not on PATH; install ringloader "
                "(scripts/setup) or pass binary=")


def _toml_value(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        escaped = text.replace("\\", "\\\\").replace('"', '\\"')
        if any(ord(c) < 0x20 for c in escaped):
            raise InvalidArgument(f"{key}: control characters are not allowed in {text!r}")
        return f'"{escaped}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(key, v) for v in value) + "]"
    raise InvalidArgument(f"{key}: a {type(value).__name__} cannot go into the daemon's config")


def _table(name: str, values: Mapping[str, Any], header: str) -> str:
    lines = [header]
    for key, value in values.items():
        if not isinstance(key, str) or not key.replace("_", "").isalnum():
            raise InvalidArgument(f"{name}: {key!r} is not a config key")
        lines.append(f"{key} = {_toml_value(f'{name}.{key}', value)}")
    return "\n".join(lines) + "\n"


def _parent_pid(pid: int) -> Optional[int]:
    """The parent of process ``pid`` (from /proc), or None when it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ')' ends it.
    fields = stat[stat.rfind(")") + 2:].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def _serving_daemon(endpoint: str) -> Optional[Dict[str, Any]]:
    """The stats of the daemon answering at ``endpoint`` ({} when it answers health but not
    stats), or None when nothing answers there."""
    try:
        _ringloader.health(endpoint, 1.0)
    except Unavailable:
        return None
    try:
        return _ringloader.daemon_stats(endpoint, 2.0)
    except Error:
        return {}


def _describe(stats: Mapping[str, Any]) -> str:
    return f"pid {stats['pid']}" if stats.get("pid") else "a daemon whose pid it would not say"


def _stop(process: "subprocess.Popen[bytes]", workdir: str, keep: bool) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if not keep:
        shutil.rmtree(workdir, ignore_errors=True)


class Daemon:
    """Starts ``ringloaderd --supervise`` on a private socket; stops it on exit.

    >>> with Daemon(datasets={"pets": "/data/pets"}, memory_limit="2GiB") as d:
    ...     loader = Loader("pets", endpoint=d.endpoint, batch_size=64)

    Decoding happens in the daemon's process: a corrupt image that crashes the decoder, or a
    decode that runs out of memory, kills the daemon, which its supervisor restarts, and the
    loader continues with exactly the next batch. The notebook's kernel never sees it.

    Args:
        datasets: name -> an ImageFolder root, or a dict of ``[[datasets]]`` keys
            (``{"path": ..., "format": "manifest", "manifest": ...}``).
        memory_limit: the daemon's ``[server] memory_limit``.
        binary: the ``ringloaderd`` to run (default: :func:`find_binary`).
        startup_timeout: seconds to wait for the daemon to serve.
        failpoints: a ``[failpoints]`` table (tests: crash the daemon on purpose).
        tls: a ``[tls]`` table (``ca``, ``cert``, ``key``, ``allowed_clients``) for a TCP
            ``listen``: mutual TLS. This process then connects with ``RINGLOADER_TLS_CA``,
            ``RINGLOADER_TLS_CERT`` and ``RINGLOADER_TLS_KEY`` from its environment.
        **server: other ``[server]`` keys (``ring_slots``, ``decode_threads``, ``log_level``...);
            ``listen`` makes it listen there instead of its private socket.

    The daemon runs until :meth:`stop`, the ``with`` block's end, garbage collection of this
    object, or the end of this Python process, even a killed one (it stops when its parent
    goes).
    """

    def __init__(self, datasets: Mapping[str, Union[str, os.PathLike, Mapping[str, Any]]], *,
                 memory_limit: str = "2GiB", binary: Optional[str] = None,
                 startup_timeout: float = 60.0, failpoints: Optional[Mapping[str, Any]] = None,
                 tls: Optional[Mapping[str, Any]] = None,
                 keep_workdir: bool = False, **server: Any) -> None:
        if not datasets:
            raise InvalidArgument("datasets: give at least one name -> path")
        self._binary = binary or find_binary("ringloaderd")
        self._workdir = tempfile.mkdtemp(prefix="ringloader-")
        self._keep = keep_workdir
        self._socket = os.path.join(self._workdir, "ringloader.sock")
        self._config = os.path.join(self._workdir, "ringloaderd.toml")
        self._log = os.path.join(self._workdir, "ringloaderd.log")
        listen = server.pop("listen", None)
        if listen is not None and (not isinstance(listen, str) or not listen):
            raise InvalidArgument(f"listen: must be an endpoint string such as "
                                  f"'unix:/path/to.sock' or '127.0.0.1:7070', got {listen!r}")
        # The daemon listens where asked; the health checks and endpoint follow it.
        self._endpoint = listen or f"unix:{self._socket}"
        server_keys: Dict[str, Any] = {
            "listen": self._endpoint,
            "state_dir": os.path.join(self._workdir, "state"),
            "memory_limit": memory_limit,
        }
        server_keys.update(server)
        text = _table("server", server_keys, "[server]")
        for name, spec in datasets.items():
            if isinstance(spec, Mapping):
                table = {"name": name, "format": "imagefolder", **spec}
            else:
                table = {"name": name, "format": "imagefolder", "path": os.path.abspath(spec)}
            text += "\n" + _table("datasets", table, "[[datasets]]")
        if tls:
            text += "\n" + _table("tls", tls, "[tls]")
        if failpoints:
            text += "\n" + _table("failpoints", failpoints, "[failpoints]")
        Path(self._config).write_text(text)
        self._process: Optional[subprocess.Popen[bytes]] = None
        self._finalizer: Optional[weakref.finalize] = None
        self.start(startup_timeout)

    @property
    def endpoint(self) -> str:
        """Where the daemon listens (``unix:<private socket>`` unless ``listen=`` said otherwise):
        pass it to :class:`Loader`."""
        return self._endpoint

    @property
    def pid(self) -> Optional[int]:
        """The supervisor's process id (None when stopped)."""
        return self._process.pid if self._process is not None and self._process.poll() is None \
            else None

    @property
    def config_path(self) -> str:
        return self._config

    def stats(self, timeout: float = 10.0) -> Dict[str, Any]:
        """This daemon's counters (see :func:`ringloader.daemon_stats`)."""
        return _ringloader.daemon_stats(self.endpoint, timeout)

    def log(self) -> str:
        """What the daemon has logged so far."""
        try:
            return Path(self._log).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def start(self, timeout: float = 60.0) -> None:
        """Starts the daemon (the constructor does) and waits until it serves."""
        if self.pid is not None:
            return
        if self._finalizer is not None:
            raise Error("this Daemon was stopped (its directory is gone): start a new Daemon")
        # The health checks below would be answered by another daemon serving at listen= (and,
        # on TCP, gRPC lets two servers share a port): refused before anything starts.
        if self._endpoint != f"unix:{self._socket}":
            other = _serving_daemon(self._endpoint)
            if other is not None:
                raise Error(f"listen={self._endpoint!r}: another ringloaderd already serves there "
                            f"({_describe(other)}); stop it, or give this Daemon another listen=")
        with open(self._log, "ab") as log:
            self._process = subprocess.Popen(
                [self._binary, "--supervise", "--config", self._config,
                 "--parent-pid", str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        self._finalizer = weakref.finalize(self, _stop, self._process, self._workdir, self._keep)
        deadline = time.monotonic() + timeout
        while True:
            if self._process.poll() is not None:
                tail = "\n".join(self.log().splitlines()[-20:])
                raise Error(f"ringloaderd exited with status {self._process.returncode} before "
                            f"serving; its log:\n{tail}")
            try:
                if _ringloader.health(self.endpoint, 1.0) == "SERVING":
                    other = self._other_daemon()
                    if other is None:
                        return
                    self.stop()
                    raise Error(f"listen={self._endpoint!r}: another ringloaderd serves there "
                                f"({_describe(other)}), not the one this Daemon started; stop "
                                "it, or give this Daemon another listen=")
            except Unavailable:
                pass
            except Error:
                # A daemon that is exiting (a config it refuses after indexing starts) may end
                # the check with CANCELLED: its exit, and its log's reason, are what to raise.
                try:
                    self._process.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    raise
                continue
            if time.monotonic() > deadline:
                self.stop()
                raise Unavailable(f"ringloaderd did not serve within {timeout} s; its log:\n"
                                  + "\n".join(self.log().splitlines()[-20:]))
            time.sleep(0.05)

    def _other_daemon(self) -> Optional[Dict[str, Any]]:
        """None when the daemon serving at the endpoint is this one's (the child of the
        supervisor it started), else that daemon's stats. Unavailable when it cannot tell yet."""
        try:
            stats = _ringloader.daemon_stats(self.endpoint, 2.0)
        except Error as e:
            raise Unavailable(str(e)) from e
        pid = int(stats.get("pid") or 0)
        mine = self._process is not None and pid != 0 and _parent_pid(pid) == self._process.pid
        return None if mine else stats

    def stop(self) -> None:
        """Stops the daemon (SIGTERM, then SIGKILL after 15 s) and removes its directory."""
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> "Daemon":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<ringloader.Daemon endpoint={self.endpoint!r} pid={self.pid}>"

