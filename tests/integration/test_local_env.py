"""bin/local-env on a fresh machine (issue 43): with PostgreSQL and RabbitMQ absent from
PATH it installs them from Debian's packages, starts them, makes the loopback trust the
README expects, creates the role and the database, and says what it did; where apt-get
cannot run it says exactly what to install and stops.

The real script runs in bash under a controlled PATH: the few tools it uses, and a fake
apt-get that records what it was asked to install and "installs" recording stand-ins for
the packages' commands (nothing on this machine is installed or uninstalled)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("cat", "head", "id", "ls", "seq", "sleep", "touch", "sed", "chmod", "basename")

RECORD = '#!/bin/bash\necho "$(basename "$0") $*" >> "$FF_LOG"\n'
# What each package's commands do here: record the call, and keep a little state in
# $FF_STATE so that a started server answers afterwards.
STAND_INS = {
    "postgresql": {
        "pg_ctlcluster": RECORD + 'touch "$FF_STATE/pg-up"\n',
        "pg_isready": RECORD + '[ -e "$FF_STATE/pg-up" ]\n',
        "psql": RECORD
        + 'case "$*" in\n'
        + '  *"SHOW hba_file"*) echo "$FF_STATE/pg_hba.conf" ;;\n'
        + '  *"-d flowforge"*) exit 2 ;;  # no such role yet\n'
        + "esac\n",
    },
    "rabbitmq-server": {
        "rabbitmq-server": RECORD + 'touch "$FF_STATE/rabbit-up"\n',
        "rabbitmqctl": RECORD + 'case "$*" in *status*) [ -e "$FF_STATE/rabbit-up" ] ;; esac\n',
    },
    "python3-venv": {},
}
APT_GET = (
    RECORD
    + 'if [ "$1" = install ]; then\n'
    + '  for package in "$@"; do\n'
    + '    if [ -d "$FF_STANDINS/$package" ]; then\n'
    + '      /bin/cp "$FF_STANDINS/$package"/* "$FF_BIN"/\n'
    + "    fi\n"
    + "  done\n"
    + "fi\n"
)
RUNUSER = RECORD + 'while [ "$1" != -- ]; do shift; done\nshift\nexec "$@"\n'


def _script(path: Path, text: str) -> None:
    assert not path.exists() and not path.is_symlink(), path  # never write through a link
    path.write_text(text)
    path.chmod(0o755)


def _machine(tmp_path: Path, *, apt: bool, root: bool) -> tuple[dict[str, str], Path]:
    """A project directory with its venv already made, and the environment of a machine
    with neither PostgreSQL nor RabbitMQ on PATH."""
    project, bin_dir, state, stand_ins = (tmp_path / n for n in ("p", "bin", "state", "pkgs"))
    for folder in (project / ".venv" / "bin", bin_dir, state):
        folder.mkdir(parents=True)
    (project / ".venv" / "bin" / "python").symlink_to(sys.executable)
    (project / ".venv" / ".installed").touch()
    for tool in TOOLS if root else [t for t in TOOLS if t != "id"]:
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    (bin_dir / "python3").symlink_to(sys.executable)
    for package, commands in STAND_INS.items():
        (stand_ins / package).mkdir(parents=True)
        for name, text in commands.items():
            _script(stand_ins / package / name, text)
    if apt:
        _script(bin_dir / "apt-get", APT_GET)
    _script(bin_dir / "runuser", RUNUSER)
    if not root:
        _script(bin_dir / "id", '#!/bin/bash\n[ "$1" = -u ] && echo 1000 || echo dev\n')
    (state / "pg_hba.conf").write_text("host all all 127.0.0.1/32 scram-sha-256\n")
    env = {
        "PATH": str(bin_dir),
        "HOME": str(tmp_path),
        "FF_LOG": str(state / "calls.log"),
        "FF_STATE": str(state),
        "FF_STANDINS": str(stand_ins),
        "FF_BIN": str(bin_dir),
    }
    return env, project


def _source(env: dict[str, str], project: Path) -> subprocess.CompletedProcess[str]:
    """`. bin/local-env` as bin/test sources it (set -euo pipefail), then a marker."""
    return subprocess.run(
        ["/bin/bash", "-c", f"set -euo pipefail; . {ROOT / 'bin' / 'local-env'}; echo sourced"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_fresh_machine_gets_postgresql_and_rabbitmq_installed_started_and_a_database(
    tmp_path: Path,
) -> None:
    if os.geteuid() != 0:
        raise AssertionError("runs as root, as CI does (the script's root path)")
    env, project = _machine(tmp_path, apt=True, root=True)
    done = _source(env, project)
    assert done.returncode == 0 and done.stdout == "sourced\n", done
    calls = Path(env["FF_LOG"]).read_text().splitlines()
    assert calls[0] == "apt-get install -y -qq postgresql rabbitmq-server", calls
    assert any(c.startswith("pg_ctlcluster --skip-systemctl-redirect ") for c in calls)
    assert calls.index("rabbitmq-server -detached") > 0
    assert 'psql -qc CREATE ROLE "root" LOGIN SUPERUSER' in calls
    assert 'psql -qc CREATE DATABASE flowforge OWNER "root"' in calls
    hba = (Path(env["FF_STATE"]) / "pg_hba.conf").read_text().splitlines()
    assert hba[:2] == ["host all all 127.0.0.1/32 trust", "host all all ::1/128 trust"]
    said = done.stderr
    assert "installing postgresql rabbitmq-server from Debian's packages" in said
    assert "installed postgresql rabbitmq-server" in said
    assert "starting PostgreSQL" in said and "starting RabbitMQ" in said
    assert "created the database flowforge (owner root)" in said

    # Sourced again, everything is there: nothing is installed or created twice.
    Path(env["FF_LOG"]).write_text("")
    again = _source(env, project)
    assert again.returncode == 0, again
    assert not [c for c in Path(env["FF_LOG"]).read_text().splitlines() if "apt-get" in c]
    assert "install" not in again.stderr


def test_without_apt_it_says_exactly_what_to_install_and_stops(tmp_path: Path) -> None:
    env, project = _machine(tmp_path, apt=False, root=False)
    done = _source(env, project)
    assert done.returncode == 1 and done.stdout == "", done
    assert "missing: postgresql rabbitmq-server" in done.stderr
    assert "sudo apt-get install postgresql rabbitmq-server" in done.stderr
    assert not Path(env["FF_LOG"]).exists()  # nothing was run on the machine's behalf
