#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The soak: ringloader at the shape users run it, under a seeded schedule of faults.

One supervised ringloaderd over a dataset on a delay mount (tests/support/delayfs: 5 ms per
open, as NFS), in a memory cgroup of its own where the host has one and under a container's
open-file limit (1,024, with io_depth 64 x 16 streams wanting them all); eight trainers at once, C++
(`ringloaderctl consume`) and Python (tests/soak/trainer.py), mixing uint8 and float32 at 224 px
in batches of 64 to 256 (the float32 batch of 256 is a 462 MB ring), some holding batches, one
pausing, one resized mid-epoch. Meanwhile faults drawn from --seed: the daemon SIGKILLed, OOM
killed by its cgroup, reloaded with SIGHUP, a trainer SIGKILLed and restarted at once, /metrics
and stats scraped, and the whole mount not answering for 45 s (delayfs stopped, as an NFS server
gone: the daemon must wait it out, striking and skipping nothing).

At the end, checked:
  - every trainer took each sample of each epoch it finished exactly once, and of the epoch it
    was in at most once;
  - the bytes of each sample equal an undisturbed run's (a fresh daemon over the local copy,
    no faults) in three epochs of each trainer: its first, its last finished and one drawn;
  - the daemon's RSS, open files, threads and the rings in /dev/shm stay flat after warm-up
    (printed over time); the dataset's files open, the reads in flight at the instant sampled,
    stay within the daemon's read_files_limit;
  - no sample was struck, quarantined or skipped as bad (every sample of the dataset is good).
A one-page report goes to stdout (and --report). Exit 0 when every check passed, 1 otherwise;
the same --seed draws the same faults at the same moments.

With --feeders N the daemon draws decoded samples from N feeders as well (ringloaderd with
server.feeder_listen over the same dataset path, dialled with mutual TLS), and the feeder fault
SIGKILLs one (restarted 3-8 s later) or SIGSTOPs it for 10-20 s, past its lease. The trainers'
bytes are still checked against the undisturbed run, which has no feeders; the feeders must have
decoded part of the run, and their RSS and threads stay flat too. The daemon dials them with
its own certificate, which each hup fault rotates first, as with --tls.

With --tls the daemon listens on TCP 127.0.0.1 with mutual TLS (a CA and certificates made with
the openssl command; every trainer connects with RINGLOADER_TLS_*), and each hup fault rotates
its certificate first: at the end, the certificate served must be the last one issued and no
client may have been refused.

  tests/soak/soak.py [--minutes M] [--seed S] [--faults kill,oom,hup,trainer,scrape,stall,feeder]
                     [--nofile 1024] [--tls] [--feeders N] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import xxhash

import ringloader as rl

ROOT = Path(__file__).resolve().parents[2]
IMAGES = 768
CLASSES = 8
WARMUP_FRACTION = 0.25
ALL_FAULTS = ("kill", "oom", "hup", "trainer", "scrape", "stall", "feeder")
DEFAULT_FAULTS = ALL_FAULTS
FEEDER_LEASE_S = 5  # server.feeder_lease_ms's default: a feeder stopped longer is given up
STALL_SECONDS = 45.0  # shortened to end at least AFTER_STALL_SECONDS before the run does
AFTER_STALL_SECONDS = 20.0


@dataclass
class Trainer:
    name: str
    kind: str  # "cpp" or "python"
    dtype: str
    batch_size: int
    seed: int
    extra: List[str] = field(default_factory=list)
    process: Optional[subprocess.Popen] = None
    restarts: int = 0

    def samples_path(self, work: Path) -> Path:
        return work / f"{self.name}.samples"

    def state_path(self, work: Path) -> Path:
        return work / f"{self.name}.state"


TRAINERS = [
    Trainer("cpp-u8-64", "cpp", "uint8", 64, 1),
    Trainer("cpp-f32-128", "cpp", "float32", 128, 2),
    Trainer("cpp-u8-256", "cpp", "uint8", 256, 3),
    Trainer("cpp-f32-64", "cpp", "float32", 64, 4),
    Trainer("py-f32-256-hold", "python", "float32", 256, 5, ["--hold", "2"]),
    Trainer("py-u8-64-pause", "python", "uint8", 64, 6,
            ["--pause-after", "20", "--pause-s", "20"]),
    Trainer("py-f32-64-resize", "python", "float32", 64, 7,
            ["--resize-after", "5", "--resize-batch-size", "128"]),
    Trainer("py-u8-128-hold", "python", "uint8", 128, 8, ["--hold", "4", "--step-ms", "20"]),
]


def ctl_binary() -> str:
    return rl.find_binary("ringloaderctl")


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- the memory cgroup ----

class MemoryCgroup:
    """A memory cgroup of the soak's own (v1 or v2), or none where the host has no controller."""

    def __init__(self, name: str):
        self.path: Optional[Path] = None
        self.v2 = False
        self.why_not = ""
        v1 = Path("/sys/fs/cgroup/memory")
        v2 = Path("/sys/fs/cgroup/cgroup.controllers")
        try:
            if v1.is_dir():
                self.path = v1 / name
            elif v2.exists() and "memory" in v2.read_text().split():
                self.v2 = True
                self.path = Path("/sys/fs/cgroup") / name
            else:
                self.why_not = "no memory cgroup controller on this host"
                return
            self.path.mkdir(exist_ok=True)
            self.set_limit(None)
        except OSError as e:
            self.why_not = f"cannot create a memory cgroup: {e}"
            self.path = None

    def set_limit(self, limit: Optional[int]) -> None:
        assert self.path is not None
        if self.v2:
            (self.path / "memory.max").write_text("max" if limit is None else str(limit))
        else:
            (self.path / "memory.limit_in_bytes").write_text(
                "-1" if limit is None else str(limit))

    def usage(self) -> int:
        assert self.path is not None
        f = "memory.current" if self.v2 else "memory.usage_in_bytes"
        return int((self.path / f).read_text())

    def oom_kills(self) -> int:
        assert self.path is not None
        if self.v2:
            for line in (self.path / "memory.events").read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
            return 0
        for line in (self.path / "memory.oom_control").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def remove(self) -> None:
        if self.path is None:
            return
        for _ in range(50):
            procs = (self.path / "cgroup.procs").read_text().split()
            for pid in procs:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)
        log(f"could not remove cgroup {self.path}")


# ---- the daemon ----

class Daemon:
    """ringloaderd --supervise with the soak's config, in the cgroup when there is one."""

    def __init__(self, work: Path, data: Path, cgroup: Optional[MemoryCgroup], metrics_port: int,
                 name: str, nofile: int = 0, tls: Optional["Pki"] = None,
                 listen_tls: bool = False, feeders: Optional[List[str]] = None):
        self.work = work / name
        self.work.mkdir()
        self.tls = tls  # [tls]: for a TCP listen when listen_tls, and for dialling feeders
        self.feeders = feeders or []
        self.endpoint = (f"127.0.0.1:{free_port()}" if listen_tls else
                         f"unix:{self.work}/ringloader.sock")
        self.config = self.work / "ringloaderd.toml"
        self.log_path = self.work / "ringloaderd.log"
        self.data = data
        self.metrics = f"127.0.0.1:{metrics_port}" if metrics_port else ""
        self.config.write_text(self._config_text())
        prefix = ""
        if cgroup is not None and cgroup.path is not None:
            prefix = f"echo $$ > {cgroup.path}/cgroup.procs && "
        # A container's open-file limit (soft and hard: the daemon cannot raise it).
        limit = f"/usr/bin/prlimit --nofile={nofile}:{nofile} -- " if nofile else ""
        self.process = subprocess.Popen(
            ["/bin/sh", "-c", prefix + f'exec {limit}"$0" --supervise --config "$1" >"$2" 2>&1',
             rl.find_binary("ringloaderd"), str(self.config), str(self.log_path)],
            start_new_session=True)
        deadline = time.monotonic() + 120
        while not self.serving():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ringloaderd did not start: {self.log()[-2000:]}")
            time.sleep(0.2)

    def serving(self) -> bool:
        try:
            return rl.health(self.endpoint, 1.0) == "SERVING"
        except rl.Error:
            return False

    def _config_text(self) -> str:
        return "\n".join([
            "[server]",
            f'listen = "{self.endpoint}"',
            f'state_dir = "{self.work}/state"',
            'memory_limit = "3GiB"',
            "max_streams = 16",
            # 16 x 64 reads ahead would want every descriptor of a 1,024 limit (--nofile): the
            # daemon must share them out, not run into EMFILE.
            "io_depth = 64",
            # A third of the default, so that a stall of the mount outlasts it even in a short
            # run: the outage is then told from poison (and said), not just waited out.
            "decode_deadline_ms = 10000",
            f'metrics_listen = "{self.metrics}"',
            "",
            *([] if self.tls is None else [
                "[tls]",
                f'ca = "{self.tls.dir}/ca.pem"',
                f'cert = "{self.tls.dir}/daemon.pem"',
                f'key = "{self.tls.dir}/daemon.key"',
                'allowed_clients = ["DNS:trainer"]',
                ""]),
            *[f'[[feeders]]\naddress = "{address}"\n' for address in self.feeders],
            "[[datasets]]",
            'name = "imagenet"',
            'format = "imagefolder"',
            f'path = "{self.data}"',
            "",
        ])

    def serving_pid(self) -> Optional[int]:
        try:
            children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
            pids = children.read_text().split()
            return int(pids[0]) if pids else None
        except (FileNotFoundError, ProcessLookupError, ValueError):
            return None

    def wait_serving_pid(self, other_than: Optional[int] = None, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid = self.serving_pid()
            if pid is not None and pid != other_than:
                return pid
            time.sleep(0.02)
        raise RuntimeError("the supervisor has no new serving child")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


class Feeder:
    """A ringloaderd decoding for the soak's daemon: server.feeder_listen on 127.0.0.1 with
    mutual TLS (it takes certificates for IP:127.0.0.1: the daemon's, issued by the soak's CA),
    over the same dataset path. The feeder fault SIGKILLs it (start() brings it back on the same
    address) or SIGSTOPs it (cont())."""

    def __init__(self, work: Path, name: str, data: Path, pki: "Pki"):
        self.name = name
        self.work = work / name
        self.work.mkdir()
        self.address = f"127.0.0.1:{free_port()}"
        self.endpoint = f"unix:{self.work}/ringloader.sock"
        self.config = self.work / "ringloaderd.toml"
        self.log_path = self.work / "ringloaderd.log"
        self.config.write_text("\n".join([
            "[server]",
            f'listen = "{self.endpoint}"',
            f'feeder_listen = "{self.address}"',
            f'feeder_data_listen = "127.0.0.1:{free_port()}"',  # most answers come there
            f'state_dir = "{self.work}/state"',
            'memory_limit = "1GiB"',
            "decode_threads = 1",
            "",
            "[tls]",
            f'ca = "{pki.dir}/ca.pem"',
            f'cert = "{pki.dir}/feeder.pem"',
            f'key = "{pki.dir}/feeder.key"',
            'allowed_clients = ["IP:127.0.0.1"]',  # the daemon's certificate names it
            "",
            "[[datasets]]",
            'name = "imagenet"',
            'format = "imagefolder"',
            f'path = "{data}"',
            ""]))
        self.process: Optional[subprocess.Popen] = None
        self.down = False     # SIGKILLed by the fault, not started again yet
        self.stopped = False  # SIGSTOPped by the fault, not continued yet
        self.start(wait=True)

    def start(self, wait: bool = False) -> None:
        """Started again by the fault, it is not waited for: it indexes the dataset first, which
        takes as long as the mount does (a stalled one, all of the stall)."""
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen([rl.find_binary("ringloaderd"), "--config",
                                             str(self.config)], stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        self.down = False
        deadline = time.monotonic() + 60
        while wait:
            try:
                if rl.health(self.endpoint, 1.0) == "SERVING":
                    break
            except rl.Error:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()  # (not left running when it would not serve in time)
                self.process.wait()
                raise RuntimeError(f"feeder {self.name} did not start: {self.log()[-2000:]}")
            time.sleep(0.1)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.down = True

    def stop(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)
        self.stopped = True

    def cont(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)
        self.stopped = False

    def exited_by_itself(self) -> bool:
        return not self.down and self.process.poll() is not None

    def resources(self) -> Optional[Tuple[float, int]]:
        """(RSS MiB, threads) of its process (self.process.pid), or None while it is down."""
        try:
            status = Path(f"/proc/{self.process.pid}/status").read_text()
            rss = next(int(l.split()[1]) for l in status.splitlines() if l.startswith("VmRSS:"))
            threads = next(int(l.split()[1]) for l in status.splitlines()
                           if l.startswith("Threads:"))
            return rss / 1024, threads
        except (FileNotFoundError, ProcessLookupError, StopIteration):
            return None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def finish(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        if self.stopped:
            self.cont()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


HOG = """
import sys
print("ready", flush=True)
sys.stdin.readline()  # go
chunks = []
for _ in range(64):  # 512 MiB, touched page by page
    b = bytearray(8 << 20)
    b[::4096] = b"x" * len(b[::4096])
    chunks.append(b)
"""


def oom_kill(daemon: Daemon, cgroup: MemoryCgroup) -> None:
    """A real OOM kill of the serving daemon by its memory cgroup: a process in the cgroup
    allocates past a limit set just above what the cgroup holds; the daemon, whose
    oom_score_adj is 1000, is the one the OOM killer picks, as a daemon whose decodes outgrew
    its cgroup would be."""
    pid = daemon.serving_pid()
    if pid is None:
        return
    hog = subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    try:
        (cgroup.path / "cgroup.procs").write_text(str(hog.pid))
        Path(f"/proc/{pid}/oom_score_adj").write_text("1000")
        hog.stdout.readline()
        cgroup.set_limit(cgroup.usage() + (64 << 20))
        hog.stdin.write("go\n")
        hog.stdin.flush()
        daemon.wait_serving_pid(other_than=pid, timeout=60)
    finally:
        hog.kill()
        hog.wait()
        cgroup.set_limit(None)


class Pki:
    """A CA, the daemon's certificate (re-issued by rotate()) and the trainers' one, made with the
    openssl command in `dir`."""

    def __init__(self, dir: Path):
        self.dir = dir
        dir.mkdir()
        self._openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                      "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=soak CA",
                      "-days", "30")
        self.issue("trainer", "DNS:trainer")
        self.rotate()

    def _openssl(self, *args: str) -> str:
        return subprocess.run(["openssl", *args], cwd=self.dir, check=True, capture_output=True,
                              text=True).stdout

    def issue(self, name: str, sans: str) -> None:
        self._openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                      "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
                      f"/CN={name}", "-addext", f"subjectAltName={sans}")
        self._openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                      "-CAcreateserial", "-out", f"{name}.pem", "-days", "30", "-copy_extensions",
                      "copy")

    def rotate(self) -> str:
        """A new certificate for the daemon, at the same paths; its serial."""
        self.issue("daemon", "IP:127.0.0.1")
        self.serial = self._openssl("x509", "-in", "daemon.pem", "-noout", "-serial").strip()
        return self.serial

    def client_env(self) -> Dict[str, str]:
        return {"RINGLOADER_TLS_CA": str(self.dir / "ca.pem"),
                "RINGLOADER_TLS_CERT": str(self.dir / "trainer.pem"),
                "RINGLOADER_TLS_KEY": str(self.dir / "trainer.key")}

    def served_serial(self, endpoint: str) -> str:
        """The serial of the certificate a new connection to `endpoint` is shown."""
        shown = subprocess.run(["openssl", "s_client", "-connect", endpoint, "-CAfile", "ca.pem",
                                "-cert", "trainer.pem", "-key", "trainer.key"], cwd=self.dir,
                               stdin=subprocess.DEVNULL, capture_output=True, text=True).stdout
        return subprocess.run(["openssl", "x509", "-noout", "-serial"], input=shown,
                              capture_output=True, text=True).stdout.strip()


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- trainers ----

def start_trainer(t: Trainer, work: Path, endpoint: str, epochs: int) -> None:
    samples, state = t.samples_path(work), t.state_path(work)
    if t.kind == "cpp":
        args = [ctl_binary(), "--endpoint", endpoint, "consume", "--dataset", "imagenet",
                "--batch-size", str(t.batch_size), "--image-size", "224", "--dtype", t.dtype,
                "--seed", str(t.seed), "--epochs", str(epochs), "--samples-out", str(samples),
                "--state", str(state), "--reconnect-deadline-s", "300"]
    else:
        args = [sys.executable, str(ROOT / "tests/soak/trainer.py"), "--endpoint", endpoint,
                "--dataset", "imagenet", "--batch-size", str(t.batch_size), "--dtype", t.dtype,
                "--seed", str(t.seed), "--epochs", str(epochs), "--samples-out", str(samples),
                "--state", str(state), "--name", t.name, *t.extra]
    t.process = subprocess.Popen(args, stdout=open(work / f"{t.name}.log", "ab"),
                                 stderr=subprocess.STDOUT)


SampleKey = Tuple[int, int]  # (epoch, sample index)


def read_samples(path: Path) -> List[Tuple[int, int, int, str]]:
    """(epoch, sequence, index, digest) of each line."""
    rows = []
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        f = line.split("\t")
        rows.append((int(f[0]), int(f[1]), int(f[2]), f[5]))
    return rows


# ---- resources ----

@dataclass
class Sample:
    t: float
    pid: int
    rss_mib: float
    fds: int       # open files other than the dataset's (sockets, rings, logs, ...)
    data_fds: int  # the dataset's files open: the reads in flight at that instant
    threads: int
    rings: int


def sample_resources(daemon: Daemon, t0: float, pids: set, data: Path) -> Optional[Sample]:
    """The serving daemon's figures; `pids` collects every serving pid seen, whose rings (named
    /dev/shm/ringloader.<pid>.*) are counted: a dead incarnation's left behind counts too, and
    no other daemon's does. Its open files are split: those under `data` (reads in flight) and
    the rest."""
    pid = daemon.serving_pid()
    if pid is None:
        return None
    pids.add(pid)
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rss = next(int(l.split()[1]) for l in status.splitlines() if l.startswith("VmRSS:"))
        threads = next(int(l.split()[1]) for l in status.splitlines() if l.startswith("Threads:"))
        fds = data_fds = 0
        prefix = str(data) + "/"
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:  # closed since it was listed
                continue
            if target.startswith(prefix):
                data_fds += 1
            else:
                fds += 1
    except (FileNotFoundError, ProcessLookupError, StopIteration):
        return None
    ours = {str(p) for p in pids}
    rings = 0
    for name in os.listdir("/dev/shm"):  # ringloader.<pid>.<incarnation>.<stream> (and .lock)
        parts = name.split(".")
        rings += len(parts) == 4 and parts[0] == "ringloader" and parts[1] in ours \
            and parts[3] != "lock"

    return Sample(time.monotonic() - t0, pid, rss / 1024, fds, data_fds, threads, rings)


# ---- the run ----

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--faults", default=",".join(DEFAULT_FAULTS),
                   help=f"comma-separated, of {','.join(ALL_FAULTS)}")
    p.add_argument("--nofile", type=int, default=1024,
                   help="the daemon's open-file limit, as a container's (0: the host's)")
    p.add_argument("--tls", action="store_true",
                   help="TCP with mutual TLS; each hup fault rotates the daemon's certificate")
    p.add_argument("--feeders", type=int, default=0,
                   help="feeders the daemon draws decoded samples from (mutual TLS)")
    p.add_argument("--report", help="also write the report here")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    a = p.parse_args()
    faults = [f for f in a.faults.split(",") if f]
    for f in faults:
        if f not in ALL_FAULTS:
            p.error(f"--faults: unknown fault {f!r} (of {', '.join(ALL_FAULTS)})")
    if os.geteuid() != 0:
        print("soak: SKIPPED: needs root (a FUSE mount, a memory cgroup)")
        return 77
    rng = random.Random(a.seed)
    work = Path(tempfile.mkdtemp(prefix="ringloader-soak-"))
    report: List[str] = []
    failures: List[str] = []
    mount = work / "mnt"
    delayfs_proc = None
    cgroup = None
    daemon = None
    feeders: List[Feeder] = []
    try:
        log(f"seed {a.seed}, {a.minutes} min, faults {','.join(faults)}, work {work}")
        local = work / "data"
        subprocess.run([ctl_binary(), "make-dataset", "--out", str(local), "--count",
                        str(IMAGES), "--classes", str(CLASSES), "--seed", str(a.seed)],
                       check=True, capture_output=True)
        # The dataset through a delay mount, as NFS: 5 ms per open.
        delayfs = ROOT / "build/delayfs"  # tests/support/delayfs.cc
        data = local
        mount_note = "local disk (no /dev/fuse or delayfs here)"
        if Path("/dev/fuse").exists() and delayfs.exists():
            mount.mkdir()
            delayfs_proc = subprocess.Popen([str(delayfs), str(local), str(mount),
                                             "--open-delay-ms", "5"],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 20
            while not os.path.ismount(mount):
                if time.monotonic() > deadline or delayfs_proc.poll() is not None:
                    raise RuntimeError("delayfs did not mount")
                time.sleep(0.05)
            data = mount
            mount_note = "delayfs, 5 ms per open"
        elif "stall" in faults:
            log("stall fault skipped: no delay mount here")
            faults.remove("stall")
        if "oom" in faults:
            cgroup = MemoryCgroup(f"ringloader-soak-{os.getpid()}")
            if cgroup.path is None:
                log(f"oom fault skipped: {cgroup.why_not}")
                faults.remove("oom")
                cgroup = None
        if "feeder" in faults and not a.feeders:
            faults.remove("feeder")  # (no feeders to fault)
        metrics_port = free_port()
        pki = Pki(work / "tls") if a.tls or a.feeders else None
        if a.tls:
            os.environ.update(pki.client_env())  # the trainers, health checks and stats
        if a.feeders:
            pki.issue("feeder", "IP:127.0.0.1")
            for i in range(a.feeders):  # each in the list as it starts: finished whatever fails
                feeders.append(Feeder(work, f"feeder{i}", data, pki))
        daemon = Daemon(work, data, cgroup, metrics_port, "daemon", a.nofile, pki,
                        listen_tls=a.tls, feeders=[f.address for f in feeders])
        endpoint = daemon.endpoint
        epochs_cap = 1_000_000  # the clock ends the run, not the epochs
        for t in TRAINERS:
            start_trainer(t, work, endpoint, epochs_cap)
        t0 = time.monotonic()
        duration = a.minutes * 60
        warmup = duration * WARMUP_FRACTION

        # The schedule: a fault every 6-14 s after warm-up's first 10 s, drawn from the seed.
        schedule: List[Tuple[float, str]] = []
        at = 10.0
        kinds = [f for f in faults if f != "scrape"]
        while kinds:
            at += rng.uniform(6, 14)
            if at > duration - 10:
                break
            schedule.append((at, rng.choice(kinds)))
        if "scrape" in faults:
            schedule += [(s, "scrape") for s in range(5, int(duration), 5)]
        schedule.sort()
        done: Dict[str, int] = {}
        resources: List[Sample] = []
        seen_pids: set = set()
        next_sample = 0.0
        events: List[str] = []
        # (when, what): a killed feeder's restart, a stopped one's SIGCONT.
        pending: List[Tuple[float, str, Feeder]] = []
        # Samples the feeders decoded, as each incarnation of the daemon counts them (its latest
        # stats); and the feeders' (t, RSS MiB, threads, pid) over time.
        fed_by_incarnation: Dict[int, int] = {}
        feeder_resources: Dict[str, List[Tuple[float, float, int, int]]] = {
            f.name: [] for f in feeders}
        oom_before = cgroup.oom_kills() if cgroup else 0
        stall_until: Optional[float] = None  # the mount answers nothing until then
        # Samples each trainer had taken when the mount last answered again: each must take
        # more after it (the streams go on by themselves).
        taken_at_answer: Dict[str, int] = {}

        def taken(t: Trainer) -> int:
            try:
                with open(t.samples_path(work), "rb") as f:
                    return sum(1 for _ in f)
            except FileNotFoundError:
                return 0

        def answer_mount() -> None:
            nonlocal stall_until, taken_at_answer
            if stall_until is not None:
                delayfs_proc.send_signal(signal.SIGUSR2)
                stall_until = None
                events.append(f"{elapsed():6.1f} s  the mount answers again")
                taken_at_answer = {t.name: taken(t) for t in TRAINERS}

        def elapsed() -> float:
            return time.monotonic() - t0

        while elapsed() < duration:
            now = elapsed()
            if now >= next_sample:
                s = sample_resources(daemon, t0, seen_pids, data)
                if s:
                    resources.append(s)
                if feeders:
                    try:
                        st = rl.daemon_stats(endpoint, 10)
                        fed_by_incarnation[int(st["pid"])] = sum(
                            int(f.get("samples", 0)) for f in st.get("feeders", []))
                    except rl.Error:
                        pass  # (restarting)
                    for f in feeders:
                        r = f.resources()
                        if r and not f.stopped:
                            feeder_resources[f.name].append((now, r[0], r[1], f.process.pid))
                next_sample = now + 5
            for t in TRAINERS:
                if t.process.poll() is not None:
                    failures.append(f"trainer {t.name} exited with {t.process.returncode} at "
                                    f"{now:.0f} s (see {work}/{t.name}.log)")
                    start_trainer(t, work, endpoint, epochs_cap)
                    t.restarts += 1
            for f in feeders:
                if f.exited_by_itself():
                    failures.append(f"feeder {f.name} exited with {f.process.returncode} at "
                                    f"{now:.0f} s (see {f.log_path})")
                    f.down = True  # started again shortly, as after a kill
                    pending.append((now + 5, "start", f))
            for item in [p for p in pending if p[0] <= now]:
                pending.remove(item)
                _, what, f = item
                (f.start if what == "start" else f.cont)()
            if stall_until is not None and now >= stall_until:
                answer_mount()
            if schedule and schedule[0][0] <= now:
                _, kind = schedule.pop(0)
                done[kind] = done.get(kind, 0) + 1
                if kind != "scrape":
                    events.append(f"{now:6.1f} s  {kind}")
                if kind == "kill":
                    pid = daemon.serving_pid()
                    if pid:
                        os.kill(pid, signal.SIGKILL)
                        daemon.wait_serving_pid(other_than=pid)
                elif kind == "oom":
                    oom_kill(daemon, cgroup)
                elif kind == "hup":
                    pid = daemon.serving_pid()
                    if pid and pki:
                        events[-1] += f" (certificate {pki.rotate()})"
                    if pid:
                        os.kill(daemon.process.pid, signal.SIGHUP)
                elif kind == "trainer":
                    t = rng.choice(TRAINERS)
                    events[-1] += f" {t.name}"
                    t.process.kill()
                    t.process.wait()
                    start_trainer(t, work, endpoint, epochs_cap)
                    t.restarts += 1
                elif kind == "stall":
                    length = min(STALL_SECONDS, duration - AFTER_STALL_SECONDS - now)
                    if stall_until is not None:
                        events[-1] += " (already stalled)"
                    elif length < 10:
                        events[-1] += " (too near the end: not made)"
                    else:
                        delayfs_proc.send_signal(signal.SIGUSR1)  # every request waits
                        stall_until = now + length
                        events[-1] += f" (the whole mount answers nothing for {length:.0f} s)"
                elif kind == "feeder":
                    f = rng.choice(feeders)
                    if f.down or f.stopped:
                        events[-1] += f" {f.name} (already down)"
                    elif rng.random() < 0.5:
                        f.kill()
                        back = rng.uniform(3, 8)
                        pending.append((now + back, "start", f))
                        events[-1] += f" {f.name} SIGKILLed, started again {back:.0f} s later"
                    else:
                        f.stop()
                        back = rng.uniform(10, 20)
                        pending.append((now + back, "cont", f))
                        events[-1] += (f" {f.name} SIGSTOPped for {back:.0f} s (its lease is "
                                       f"{FEEDER_LEASE_S} s)")
                elif kind == "scrape":
                    try:
                        urllib.request.urlopen(f"http://{daemon.metrics}/metrics", timeout=10).read()
                        subprocess.run([ctl_binary(), "--endpoint", endpoint, "stats"],
                                       capture_output=True, timeout=30)
                    except OSError as e:
                        events.append(f"{now:6.1f} s  scrape failed: {e}")
            time.sleep(0.05)

        answer_mount()  # (a stall is made to end before the run does)
        for _, what, f in pending:  # feeders stopped at the end go on (those down stay down)
            if what == "cont":
                f.cont()
        for t in TRAINERS:
            if t.name in taken_at_answer and taken(t) <= taken_at_answer[t.name]:
                failures.append(f"{t.name} took no sample after the mount answered again")
        # The end: trainers stop where they are; the daemon's last word.
        for t in TRAINERS:
            t.process.kill()
            t.process.wait()
        final = rl.daemon_stats(endpoint, 30)
        fed_by_incarnation[int(final["pid"])] = sum(
            int(f.get("samples", 0)) for f in final.get("feeders", []))
        tls_line = "tls: off"
        if a.tls:
            # The last rotation may be a second old: gRPC's watcher reads the files each second.
            deadline = time.monotonic() + 10
            while pki.served_serial(endpoint) != pki.serial and time.monotonic() < deadline:
                time.sleep(0.5)
            served = pki.served_serial(endpoint)
            refused = int(final.get("tls", {}).get("clients_refused", 0))
            tls_line = (f"tls: {done.get('hup', 0)} certificate rotations, served {served} "
                        f"(last issued {pki.serial}), clients refused (last incarnation): "
                        f"{refused}")
            if served != pki.serial:
                failures.append(f"the daemon serves certificate {served}, not the last issued "
                                f"{pki.serial}")
            if refused:
                failures.append(f"{refused} client calls refused: "
                                f"{final['tls'].get('last_refusal')}")
        oom_kills = (cgroup.oom_kills() - oom_before) if cgroup else 0
        feeder_states = ", ".join(f"{f.get('address')} {f.get('state')}"
                                  for f in final.get("feeders", []))
        for f in feeders:
            f.finish()
        log("run over; checking")

        # ---- checks ----
        per_trainer: List[str] = []
        references: Dict[Tuple[str, int, int], Dict[int, str]] = {}
        wanted: Dict[Tuple[str, int], set] = {}
        for t in TRAINERS:
            rows = read_samples(t.samples_path(work))
            by_epoch: Dict[int, List[Tuple[int, str]]] = {}
            for epoch, _, index, digest in rows:
                by_epoch.setdefault(epoch, []).append((index, digest))
            finished = [e for e in sorted(by_epoch) if len(by_epoch[e]) >= IMAGES]
            for e, got in sorted(by_epoch.items()):
                indices = [i for i, _ in got]
                if len(indices) != len(set(indices)):
                    failures.append(f"{t.name}: epoch {e} repeats samples")
                if e in finished and sorted(indices) != list(range(IMAGES)):
                    failures.append(f"{t.name}: epoch {e} is not the dataset exactly once")
            for e in sorted(by_epoch)[:-1]:
                if e not in finished:
                    failures.append(f"{t.name}: epoch {e} ended with {len(by_epoch[e])} of "
                                    f"{IMAGES} samples")
            check = set()
            if finished:
                check = {finished[0], finished[-1], rng.choice(finished)}
            wanted[(t.name, t.seed)] = check
            per_trainer.append(
                f"  {t.name:18} {t.kind:6} {t.dtype:7} batch {t.batch_size:3}: "
                f"{len(rows):6} samples, {len(finished):3} epochs finished, "
                f"{t.restarts} restarts; bytes checked in epochs {sorted(check)}")
            if not finished:
                failures.append(f"{t.name}: finished no epoch")

        # The undisturbed run: a fresh daemon over the local copy, no faults.
        if daemon:
            daemon.stop()
        clean = Daemon(work, local, None, 0, "reference")
        try:
            for t in TRAINERS:
                for epoch in sorted(wanted[(t.name, t.seed)]):
                    loader = rl.Loader("imagenet", endpoint=clean.endpoint, batch_size=t.batch_size,
                                       image_size=224, dtype=t.dtype, seed=t.seed, output="numpy")
                    loader.set_epoch(epoch)
                    ref: Dict[int, str] = {}
                    for batch in loader:
                        images = np.asarray(batch["images"])
                        for k, index in enumerate(batch["indices"]):
                            ref[int(index)] = xxhash.xxh64(images[k].tobytes()).hexdigest()
                        del batch, images
                    loader.close()
                    got = {i: d for e, _, i, d in read_samples(t.samples_path(work)) if e == epoch}
                    differ = [i for i in ref if got.get(i) != ref[i]]
                    if differ:
                        failures.append(f"{t.name}: epoch {epoch}: {len(differ)} samples differ "
                                        f"from an undisturbed run (first: {differ[:5]})")
        finally:
            clean.stop()

        # Resources: flat after warm-up.
        after = [s for s in resources if s.t >= warmup]
        if len(after) >= 4:
            half = len(after) // 2
            first, second = after[:half], after[half:]
            # Each figure moves with the work in flight (RSS with rings and decodes); a leak grows
            # without bound: the second half's peak may exceed the first's by a margin, no more.
            # The dataset's open files are the reads in flight at the instant sampled (from 0
            # in a stall or just after a restart to io_depth x streams): no history says what
            # they should be, so they are held to the limit the daemon shares out instead; the
            # rest (sockets, rings, logs) are flat.
            for what, key, factor, slack in (
                    ("RSS MiB", "rss_mib", 1.25, 32),
                    ("open files (not the dataset's)", "fds", 1.25, 16),
                    # (each call to a feeder runs on a thread of its own: 4 per feeder at most)
                    ("threads", "threads", 1.10, 8 + 4 * len(feeders)),
                    ("rings in /dev/shm", "rings", 1.0, 2)):
                early = max(getattr(s, key) for s in first)
                late = max(getattr(s, key) for s in second)
                allowed = early * factor + slack
                if late > allowed:
                    failures.append(f"daemon {what} grew after warm-up: {early:.0f} in the first "
                                    f"half, {late:.0f} in the second (allowed {allowed:.0f})")
            read_files = int(final.get("read_files_limit", 0))
            # (+ one a decode thread may have open per decode thread, outside the reads ahead)
            data_allowed = read_files + 2 * (os.cpu_count() or 1) + 8
            data_peak = max(s.data_fds for s in after)
            if read_files and data_peak > data_allowed:
                failures.append(f"the daemon held {data_peak} of the dataset's files open at once, "
                                f"past its read_files_limit {read_files} (allowed "
                                f"{data_allowed})")
            rings_max = max(s.rings for s in after)
            if rings_max > len(TRAINERS) + 2:
                failures.append(f"{rings_max} rings in /dev/shm for {len(TRAINERS)} trainers")
        else:
            failures.append("too few resource samples after warm-up to judge flatness")

        # The feeders: they took part, and stayed flat as the daemon must.
        fed = sum(fed_by_incarnation.values())
        feeder_lines: List[str] = []
        if feeders:
            if fed == 0:
                failures.append("the feeders decoded no sample: the run did not exercise them")
            for f in feeders:
                rows = feeder_resources[f.name]
                if rows:
                    feeder_lines.append(
                        f"  {f.name}: RSS MiB {rows[0][1]:.0f} at {rows[0][0]:.0f} s, "
                        f"{max(r[1] for r in rows):.0f} at most, {rows[-1][1]:.0f} at the end; "
                        f"threads {rows[0][2]} to {max(r[2] for r in rows)}")
                # Each process on its own (a killed one starts again from nothing), from a
                # minute after it was first seen (it indexes, and is idle through a stall or the
                # daemon's backoff) and after warm-up, when it lived a minute more: the second
                # half of those samples against the first, looser than the daemon's (how much a
                # feeder holds follows how much the daemon leases it, which a stall or a restart
                # of the daemon moves). And every sample within what its config bounds:
                # memory_limit (1 GiB) and 256 MiB of code and threads.
                for pid in sorted({r[3] for r in rows}):
                    born = min(r[0] for r in rows if r[3] == pid)
                    mine = [r for r in rows if r[3] == pid and r[0] >= max(warmup, born + 60)]
                    if len(mine) < 12:
                        continue
                    half = len(mine) // 2
                    for what, k, factor, slack in (("RSS MiB", 1, 1.5, 64),
                                                   ("threads", 2, 1.25, 8)):
                        early = max(r[k] for r in mine[:half])
                        late = max(r[k] for r in mine[half:])
                        allowed = early * factor + slack
                        if late > allowed:
                            failures.append(f"feeder {f.name} (pid {pid}) {what} grew after "
                                            f"warm-up: {early:.0f} in the first half, {late:.0f} "
                                            f"in the second (allowed {allowed:.0f})")
                peak = max((r[1] for r in rows), default=0)
                if peak > 1024 + 256:
                    failures.append(f"feeder {f.name} RSS reached {peak:.0f} MiB, past its "
                                    f"memory_limit of 1 GiB and 256 MiB more")

        struck = final.get("quarantined", [])
        if struck:
            failures.append(f"{len(struck)} good samples quarantined: {struck[:3]}")
        if final.get("decode_errors", 0):
            failures.append(f"{final['decode_errors']} good samples skipped as bad: "
                            f"{final.get('decode_errors_by_reason')}")
        # Every incarnation's log (the supervisor's file): a read given up at its deadline is a
        # skipped (and struck) good sample, whichever incarnation gave it up.
        daemon_log = daemon.log()
        given_up = daemon_log.count("abandoned past decode_deadline_ms")
        if given_up:
            failures.append(f"{given_up} good samples given up at their deadline (struck): see "
                            f"{daemon.log_path}")
        if "Too many open files" in daemon_log:
            failures.append(f"the daemon ran out of open files (limit {a.nofile}): see "
                            f"{daemon.log_path}")
        if a.nofile and int(final.get("open_files_limit", 0)) != a.nofile:
            failures.append(f"stats open_files_limit {final.get('open_files_limit')}, not the "
                            f"{a.nofile} the daemon was started with")
        stalls_said = daemon_log.count("storage stalled:")
        if "oom" in faults and done.get("oom", 0) and oom_kills < done["oom"]:
            failures.append(f"{done['oom']} OOM faults but the cgroup counted {oom_kills} OOM kills")

        # ---- the report ----
        (work / "resources.tsv").write_text(
            "t\tpid\trss_mib\tfiles\tdata_files\tthreads\trings\n" +
            "".join(f"{s.t:.1f}\t{s.pid}\t{s.rss_mib:.1f}\t{s.fds}\t{s.data_fds}\t{s.threads}\t"
                    f"{s.rings}\n" for s in resources))
        report += [
            f"ringloader soak: seed {a.seed}, {a.minutes:g} min, {len(TRAINERS)} trainers, "
            f"{IMAGES} images on {mount_note}",
            f"faults: " + ", ".join(f"{k} x{v}" for k, v in sorted(done.items())) +
            (f" (cgroup OOM kills: {oom_kills})" if cgroup else ""),
            "trainers:", *per_trainer,
            f"daemon over time (serving process; {len(resources)} samples, every 5 s, "
            f"warm-up {warmup:.0f} s):",
            "     t   pid    RSS MiB  files  data files  threads  rings",
            *[f"  {s.t:4.0f}  {s.pid:6}  {s.rss_mib:8.1f}  {s.fds:5}  {s.data_fds:10}  "
              f"{s.threads:7}  {s.rings:5}" for s in resources[::max(1, len(resources) // 24)]],
            "(every sample: resources.tsv in the work directory, kept when the soak fails)",
            f"daemon restarts: {final.get('daemon_restarts', 0)}, batches served (last "
            f"incarnation): {final.get('batches_served', 0)}, opens abandoned: "
            f"{final.get('opens_abandoned', 0)}",
            tls_line,
            *([f"feeders: {len(feeders)}, which decoded {fed} samples (as each incarnation of "
               f"the daemon counted them); at the end: {feeder_states}", *feeder_lines,
               *([] if done.get("feeder") else
                 ["  (this seed's schedule here made no feeder fault: try another --seed)"])]
              if feeders else ["feeders: none"]),
            f"storage stalls said in the log: {stalls_said} (of {done.get('stall', 0)} stall "
            f"faults; one met by a kill before its deadline passed is not said)",
            "faults in order:", *[f"  {e}" for e in events[:30]],
            *([f"  ... and {len(events) - 30} more"] if len(events) > 30 else []),
            "verdict: " + ("PASSED" if not failures else f"FAILED ({len(failures)})"),
            *[f"  - {f}" for f in failures],
            f"reproduce: scripts/soak --minutes {a.minutes:g} --seed {a.seed} --faults "
            f"{','.join(faults)}" + (" --tls" if a.tls else "") +
            (f" --feeders {a.feeders}" if a.feeders else ""),
        ]
    except Exception as e:  # the harness itself broke: a failure, said as such
        failures.append(f"the soak could not run: {type(e).__name__}: {e}")
        report += [f"soak: FAILED: {failures[-1]}"]
    finally:
        if delayfs_proc and delayfs_proc.poll() is None:
            delayfs_proc.send_signal(signal.SIGUSR2)  # a stall in effect ends with the run
        for t in TRAINERS:
            if t.process and t.process.poll() is None:
                t.process.kill()
                t.process.wait()
        if daemon:
            daemon.stop()
        for f in feeders:
            f.finish()
        if cgroup:
            cgroup.remove()
        if delayfs_proc:
            delayfs_proc.send_signal(signal.SIGTERM)
            try:
                delayfs_proc.wait(20)
            except subprocess.TimeoutExpired:
                delayfs_proc.kill()
                subprocess.run(["fusermount3", "-u", "-z", str(mount)], capture_output=True)
        text = "\n".join(report)
        print(text, flush=True)
        if a.report:
            Path(a.report).write_text(text + "\n")
        if a.keep or failures:
            log(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
