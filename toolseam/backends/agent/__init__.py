"""The sandbox agent: file operations, confinement and process control in stdlib-only Python.

This package is the ONE implementation of everything that touches a filesystem or a process.
The host backend imports its modules in-process (file operations) and runs it as a long-lived
child process in a private pid namespace (process control); the container backends mount this
directory read-only into the sandbox and run it there. It must therefore import nothing outside
the standard library, and nothing from the rest of ``toolseam`` — modules here use relative
imports only, so the directory works both as ``toolseam.backends.agent`` and as a top-level
``agent`` package inside a container.
"""

from .wire import PROTOCOL_VERSION

__all__ = ["PROTOCOL_VERSION"]
