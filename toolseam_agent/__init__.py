"""The sandbox agent: file operations, confinement and process control in stdlib-only Python.

This package is the ONE implementation of everything that touches a filesystem or a process.
The host backend imports its modules in-process (file operations) and runs it as a long-lived
child process in a private pid namespace (process control); the container backends mount a
staged copy read-only into the sandbox and run it there. It is a top-level package with ONE
import name, ``toolseam_agent``, on the host and in every sandbox: a staged directory holds
``toolseam_agent/`` and a two-line ``__main__.py``, and ``python -I -S DIR`` runs it (Python puts
a directory it runs on ``sys.path`` itself). It must import nothing outside the standard library
and nothing from ``toolseam``: an image may have neither.
"""

from .wire import PROTOCOL_VERSION

__all__ = ["PROTOCOL_VERSION"]
