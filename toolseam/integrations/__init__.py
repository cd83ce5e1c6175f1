"""Providers of other agent frameworks' own sandbox interfaces, each thin over the toolkit.

A framework that lets its user pick a sandbox through an interface of its own gets toolseam
as one of the choices: ``toolseam.integrations.deepagents`` (LangChain deepagents'
``BaseSandbox``), ``toolseam.integrations.pydantic_ai`` (pydantic-ai's ``WorkspaceBackend``)
and ``toolseam.integrations.openai_agents`` (the OpenAI Agents SDK's sandbox client); and
``toolseam.integrations.ray_sandbox`` is Ray's own ``ray.experimental.sandbox`` shape over the
Ray wing (docs/ray.md). Each module imports its framework, so each needs that framework's
extra installed; none is imported here (docs/integrations/).
"""
