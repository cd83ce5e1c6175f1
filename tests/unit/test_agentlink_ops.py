"""The one op table (issue 20): every file operation is a row on each end of the wire, and the
seam's file methods are each written once over it."""

from __future__ import annotations

import inspect

from toolseam.backends.agentlink import ops
from toolseam.backends.agentlink.parts import AgentFiles, FileMethods, LocalFiles
from toolseam.seam.protocol import FilePart
from toolseam_agent import ops as agent_ops
from toolseam_agent.wire import GREP


def test_every_agent_file_op_has_one_host_row_and_back() -> None:
    host = {op.name for op in ops.TABLE}
    assert len(host) == len(ops.TABLE)
    assert host - {GREP} == set(agent_ops.FILE_OPS)  # grep: the agent's killable search
    for op in ops.TABLE:
        if op.in_process == "call":
            assert op.function is agent_ops.FILE_OPS[op.name]
        if op.in_process == "walk":
            assert op.name in agent_ops.STEPWISE
    assert set(agent_ops.FILE_OPS) >= agent_ops.INLINE


def test_the_seam_file_methods_are_written_once() -> None:
    methods = {name for name, _ in inspect.getmembers(FilePart, inspect.isfunction)
               if not name.startswith("_")}
    assert methods and methods <= set(vars(FileMethods))
    for part in (LocalFiles, AgentFiles):  # a part says how a row runs, nothing more
        assert not methods & set(vars(part)), part
