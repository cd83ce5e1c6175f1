"""Kept for imports written before the handle moved into the seam: ``toolseam.seam.handle``."""

from .seam.handle import HANDLE_VERSION, AttachError, AttachRefusal, SessionHandle, attach_refused

__all__ = ["HANDLE_VERSION", "AttachError", "AttachRefusal", "SessionHandle", "attach_refused"]
