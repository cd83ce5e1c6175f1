"""The host end of the agent wire: everything a backend needs to talk to ``toolseam_agent``,
and no knowledge of any engine.

* ``launch`` — the staged agent directory and the interpreter arguments that run it;
* ``channel`` — ``AgentChannel``, one JSON-lines connection (a socketpair, a unix socket, an
  engine's attach stream), with the protocol check at ``hello``;
* ``ops`` — THE op table: each file operation's wire name, seam result model and how the host
  runs it in-process;
* ``errors`` — THE map from the agent's error answers to seam exceptions;
* ``parts`` — ``AgentExec``, ``LocalFiles`` and ``AgentFiles``, the exec and file parts driven
  by that table, which ``backends/composed.py`` forwards the seam to.
"""
