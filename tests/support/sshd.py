"""A real OpenSSH server on 127.0.0.1 for the remote-agent tests, as the current user.

The fixture `sshd` generates a host key and a client key, starts
``sshd -D -e -p PORT -f CONFIG`` (keys only, no PAM, StrictModes off, its pid file
in the test's directory) and writes an ssh client config, so that
``ssh -F CONFIG localhost true`` logs in with no prompt. Host ``unreachable`` in
that config names a port nobody listens on. If sshd or ssh-keygen is missing or the
server cannot start, the test is skipped, saying why (``apt-get install -y
openssh-server`` provides them).
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuwatch.supervisor.cluster import ssh_prefix

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd")
START_TIMEOUT_S = 15.0


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


@pytest.fixture
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
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
    if os.geteuid() == 0 and not Path("/run/sshd").is_dir():
        # sshd started as root wants its privilege-separation directory.
        try:
            Path("/run/sshd").mkdir(mode=0o755)
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
            f"AllowUsers {user}\n"
            "LogLevel VERBOSE\n"
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
