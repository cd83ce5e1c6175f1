"""``ToolseamSandboxClientOptions`` as the SDK's users write options: ``image`` where
``DockerSandboxClientOptions(image=…)`` has it (and used: the session runs that image), an
unknown field refused by name, a misspelt backend option named with the ones the backend
takes — never a ``TypeError`` of a class the user did not call."""

from __future__ import annotations

from typing import Any

import pytest
from agents.sandbox.manifest import Manifest
from agents.sandbox.sandboxes.docker import DockerSandboxClientOptions
from pydantic import ValidationError

from toolseam import ConfigurationError
from toolseam.integrations.openai_agents import (
    ToolseamSandboxClient,
    ToolseamSandboxClientOptions,
)
from toolseam.seam.handle import SessionHandle

from ..support import engines


def test_image_is_where_the_sdks_docker_options_have_it() -> None:
    theirs = DockerSandboxClientOptions(image="my/img:1")
    ours = ToolseamSandboxClientOptions(backend="docker", image="my/img:1")
    assert ours.image == theirs.image
    assert ours.backend_arguments() == {"image": "my/img:1"}
    again = ToolseamSandboxClientOptions.model_validate_json(ours.model_dump_json())
    assert again.image == "my/img:1"
    with_both = ToolseamSandboxClientOptions(backend="podman", image="a:1",
                                             backend_options={"image": "a:1", "rootless": True})
    assert with_both.backend_arguments() == {"image": "a:1", "rootless": True}


@pytest.mark.parametrize(("given", "named"), [
    ({"backend": "docker", "imgae": "my/img"}, "imgae"),
    ({"backend": "docker", "network_mode": "none"}, "network_mode"),
    ({"orphan_timeout": 5}, "orphan_timeout"),
])
def test_an_unknown_field_is_refused_by_name(given: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ToolseamSandboxClientOptions(**given)
    assert named in str(caught.value) and "Extra inputs are not permitted" in str(caught.value)


def test_a_misspelt_backend_option_names_it_and_the_valid_ones() -> None:
    with pytest.raises(ConfigurationError) as caught:
        ToolseamSandboxClientOptions(backend="docker", backend_options={"imgae": "my/img"})
    message = str(caught.value)
    assert message.startswith("backend_options: unknown option 'imgae' (did you mean "
                              "'image'?) for the docker backend; it takes "), message
    assert "endpoint" in message and "workspace_mode" in message
    assert "__init__" not in message and "DockerBackend" not in message
    with pytest.raises(ConfigurationError, match=r"options 'colour', 'rootles' \(did you mean "
                                                 r"'rootless'\?\) for the podman backend"):
        ToolseamSandboxClientOptions(backend="podman",
                                     backend_options={"rootles": True, "colour": 1})


@pytest.mark.parametrize(("given", "message"), [
    ({"image": "my/img"}, "image is for a container backend"),
    ({"backend": "docker", "image": "a:1", "backend_options": {"image": "b:2"}},
     "image 'a:1' and backend_options['image'] 'b:2' disagree"),
])
def test_an_image_that_cannot_be_used_is_refused(given: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("[", r"\[").replace("(", r"\(")):
        ToolseamSandboxClientOptions(**given)


@pytest.mark.parametrize("engine", ["podman", "docker"])
async def test_the_session_runs_the_image_the_options_name(engine: str) -> None:
    """The image given as ``image=`` is the one the container runs (before: dropped, and the
    backend's default was pulled from a public registry)."""
    client = ToolseamSandboxClient()
    options = ToolseamSandboxClientOptions(
        backend=engine, image=engines.IMAGE, backend_options={"endpoint": engines.endpoint(engine)})
    session = await client.create(manifest=Manifest(), options=options)
    inner: Any = session._inner
    try:
        assert inner.state.backend_options["image"] == engines.IMAGE  # a replacement's too
        assert SessionHandle.from_json(inner.state.handle).image == engines.IMAGE
    finally:
        await client.delete(session)
