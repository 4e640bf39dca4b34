"""A real OpenSSH server on 127.0.0.1 for the remote-agent tests, as the current user.

The fixture `sshd` generates a host key and a client key, starts
``sshd -D -e -p PORT -f CONFIG`` (keys only, no PAM, StrictModes off, its pid file
in the test's directory) and writes an ssh client config, so that
``ssh -F CONFIG localhost true`` logs in with no prompt. Host ``unreachable`` in
that config names a port nobody listens on. If sshd or ssh-keygen is missing or the
server cannot start, the test is skipped, saying why (``apt-get install -y
openssh-server`` provides them).

The fixture `second_account` makes a local account of its own (a unique name, its
own home under /home, a shell, no password) as a worker host's account is: the
same install of Python and gpuwatch, another home. It needs root (useradd); it
makes the interpreter, the venv and this checkout reachable by that account (an
``o+x`` on each directory on the way that lacks it, as /root has), and undoes all
of it at the end: its processes are ended by pid, the account and its home
removed, each mode put back. `sshd_two_accounts` is `sshd` letting that account in
too, with the client key in its own ``~/.ssh/authorized_keys``:
``ssh -F CONFIG NAME@localhost`` logs in as it. Both client and server pass
PYTHONPATH (this checkout) on (SetEnv/AcceptEnv), as a person's ssh config may:
the far side runs this checkout's code, not whatever the venv's install names.
"""

from __future__ import annotations

import getpass
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuwatch.supervisor.cluster import ssh_prefix

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd")
START_TIMEOUT_S = 15.0
ROOT = Path(__file__).resolve().parents[2]
ACCOUNT_PREFIX = "gpuwt-"  # a second account's name: this, then 6 random letters


@dataclass(frozen=True)
class Account:
    """A local account of the test's own: its name, uid and home."""

    name: str
    uid: int
    gid: int
    home: Path

    def processes(self) -> list[int]:
        """The pids of this account's live processes (not zombies)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if entry.stat().st_uid != self.uid:
                    continue
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z":
                found.append(int(entry.name))
        return found


@dataclass(frozen=True)
class SshServer:
    port: int
    client_config: Path
    log_path: Path

    def prefix(self, host: str = "localhost") -> list[str]:
        """ssh argv (cluster.ssh_prefix) that reaches `host` through this server's config."""
        return list(ssh_prefix(host, ["-F", str(self.client_config)]))

    def ssh(self, *command: str, host: str = "localhost") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.prefix(host), *command], capture_output=True, text=True, timeout=30,
            stdin=subprocess.DEVNULL, check=False,
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _find_sshd() -> str | None:
    for candidate in SSHD_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("sshd")


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuwatch-test", "-f", str(path)],
        check=True, capture_output=True, timeout=30,
    )


def _reachable_install() -> list[Path]:
    """What the far side runs: the interpreter (through its venv's symlink), its prefixes,
    and this checkout."""
    return [Path(sys.executable).resolve(), Path(sys.executable), Path(sys.prefix),
            Path(sys.base_prefix), ROOT]


def _open_the_way(paths: list[Path]) -> dict[Path, int]:
    """Give others o+x on each directory above paths that lacks it; {dir: its old mode}."""
    changed: dict[Path, int] = {}
    for path in paths:
        for directory in reversed(path.parents):
            mode = directory.stat().st_mode
            if directory not in changed and not mode & stat.S_IXOTH:
                changed[directory] = stat.S_IMODE(mode)
                directory.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
    return changed


def _end_processes(account: Account) -> list[int]:
    """SIGKILL every process of the test's account, by pid; the pids it found."""
    found = account.processes()
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while account.processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


@pytest.fixture
def second_account() -> Iterator[Account]:
    """A fresh local account (its own home), removed again at the end with all it ran."""
    if os.geteuid() != 0:
        pytest.skip("a second local account needs root (useradd); this test runs as "
                    f"{getpass.getuser()}")
    for tool in ("useradd", "userdel"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not found (apt-get install -y passwd)")
    name = ACCOUNT_PREFIX + "".join(secrets.choice("abcdefghijkmnpqrstuvwxyz") for _ in range(6))
    home = Path("/home") / name
    made = subprocess.run(
        # -p '*': no password, yet not locked ("!"): sshd without PAM refuses locked ones.
        ["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/sh",
         "--user-group", "--comment", "gpuwatch test account", "-p", "*", name],
        capture_output=True, text=True, timeout=60, check=False,
    )
    if made.returncode != 0:
        pytest.skip(f"useradd {name} failed: {made.stderr.strip()}")
    entry = pwd.getpwnam(name)
    account = Account(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))
    opened: dict[Path, int] = {}
    try:
        opened = _open_the_way(_reachable_install())
        yield account
    finally:
        _end_processes(account)
        for directory, mode in opened.items():
            directory.chmod(mode)
        subprocess.run(["userdel", "--remove", name], capture_output=True, timeout=60,
                       check=False)
        if home.exists():  # userdel leaves a home it did not make as the account's
            shutil.rmtree(home, ignore_errors=True)


def _authorize(account: Account, public_key: str) -> None:
    """The client key in the account's own ~/.ssh/authorized_keys, its own and private."""
    ssh_dir = account.home / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    keys = ssh_dir / "authorized_keys"
    keys.write_text(public_key)
    keys.chmod(0o600)
    for path in (ssh_dir, keys):
        os.chown(path, account.uid, account.gid)


@pytest.fixture
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    yield from _serve(tmp_path_factory)


@pytest.fixture
def sshd_two_accounts(
    tmp_path_factory: pytest.TempPathFactory, second_account: Account
) -> Iterator[SshServer]:
    """sshd, letting second_account in as well (NAME@localhost)."""
    yield from _serve(tmp_path_factory, second_account)


def _serve(
    tmp_path_factory: pytest.TempPathFactory, other: Account | None = None
) -> Iterator[SshServer]:
    sshd_path = _find_sshd()
    if sshd_path is None:
        pytest.skip("sshd not found (apt-get install -y openssh-server)")
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not found (apt-get install -y openssh-client)")
    # A short path: ssh's control sockets and sshd's paths have length limits.
    home = tmp_path_factory.mktemp("sshd")
    host_key, client_key = home / "host_key", home / "client_key"
    try:
        _keygen(host_key)
        _keygen(client_key)
    except (subprocess.SubprocessError, OSError) as exc:
        pytest.skip(f"ssh-keygen failed: {exc}")
    authorized = home / "authorized_keys"
    authorized.write_text(Path(f"{client_key}.pub").read_text())
    authorized.chmod(0o600)
    user = getpass.getuser()
    if other is not None:
        _authorize(other, Path(f"{client_key}.pub").read_text())
    if os.geteuid() == 0 and not Path("/run/sshd").is_dir():
        # sshd started as root wants its privilege-separation directory.
        try:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # another worker's too
        except OSError as exc:
            pytest.skip(f"sshd as root needs /run/sshd: {exc}")

    last_error = ""
    for _ in range(3):  # another process may take the port between finding and binding it
        port = _free_port()
        config = home / "sshd_config"
        config.write_text(
            f"Port {port}\n"
            "ListenAddress 127.0.0.1\n"
            f"HostKey {host_key}\n"
            f"PidFile {home / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {authorized}\n"
            "StrictModes no\n"
            "UsePAM no\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "PermitRootLogin prohibit-password\n"
            f"AllowUsers {user}{f' {other.name}' if other else ''}\n"
            "AcceptEnv PYTHONPATH\n"
            "LogLevel VERBOSE\n"
            + (
                # The other account's key is in its own home, as on a real host.
                f"Match User {other.name}\n  AuthorizedKeysFile .ssh/authorized_keys\n"
                if other else ""
            )
        )
        client_config = home / "ssh_config"
        client_config.write_text(
            "Host localhost\n"
            "  HostName 127.0.0.1\n"
            f"  Port {port}\n"
            "Host unreachable\n"
            "  HostName 127.0.0.1\n"
            f"  Port {_free_port()}\n"
            "Host *\n"
            f"  User {user}\n"
            f"  IdentityFile {client_key}\n"
            "  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {home / 'known_hosts'}\n"
            "  StrictHostKeyChecking accept-new\n"
            "  BatchMode yes\n"
            "  ConnectTimeout 10\n"
            "  LogLevel ERROR\n"
            f"  SetEnv PYTHONPATH={ROOT}\n"
        )
        log_path = home / "sshd.log"
        with open(log_path, "ab") as log_file:
            proc = subprocess.Popen(
                [sshd_path, "-D", "-e", "-p", str(port), "-f", str(config)],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
            )
        server = SshServer(port, client_config, log_path)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            result = server.ssh("true")
            if result.returncode == 0 and other is not None:
                result = server.ssh("true", host=f"{other.name}@localhost")
            if result.returncode == 0:
                break
            last_error = result.stderr.strip()
            time.sleep(0.1)
        else:
            log_tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
            last_error = (
                f"sshd exited {proc.returncode}" if proc.poll() is not None else "no login"
            ) + f": ssh said {last_error!r}; sshd log: {' | '.join(log_tail)}"
            if proc.poll() is None:
                proc.terminate()
            proc.wait(10)
            continue
        try:
            yield server
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return
    pytest.skip(f"could not start sshd on 127.0.0.1: {last_error}")
