"""The workspace modes, one module each (``bind``, ``copy``): how the sandbox gets its workspace
and its channel. How long it lives is the sandbox's lifetime (``../lifetimes/``), whose hooks
each mode calls; ``backend.py`` pairs them, nothing here."""
