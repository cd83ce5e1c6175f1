"""The listing rule in one place: glob matching, code-point sort, then cap. Pure: no I/O."""

from .globs import CompiledGlob, GlobSyntaxError, compile_glob
from .order import Page, sort_and_cap

__all__ = ["CompiledGlob", "GlobSyntaxError", "Page", "compile_glob", "sort_and_cap"]
