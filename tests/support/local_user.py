"""Another local user: an unprivileged account made for the tests (``useradd``), whose
commands run through ``runuser`` — the attacker on a shared machine (issue 44)."""

from __future__ import annotations

import pwd
import subprocess

OTHER_USER = "toolseam-other"
_EXISTS = 9  # useradd's exit status when the name is taken (another xdist worker made it)


def other_user() -> pwd.struct_passwd:
    """The account, made now if missing (no home, no login shell)."""
    try:
        return pwd.getpwnam(OTHER_USER)
    except KeyError:
        made = subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin",
                               OTHER_USER], capture_output=True, text=True, check=False)
        assert made.returncode in (0, _EXISTS), made.stderr
        return pwd.getpwnam(OTHER_USER)


def run_as_other_user(script: str, *args: str, timeout: float = 30
                      ) -> subprocess.CompletedProcess[str]:
    """``python3 -c script args…`` as the other user (the system's python3: the project's
    virtual environment need not be theirs to read), from ``/``."""
    other_user()
    return subprocess.run(["runuser", "-u", OTHER_USER, "--", "/usr/bin/python3", "-c", script,
                           *args], capture_output=True, text=True, timeout=timeout, cwd="/",
                          check=False)
