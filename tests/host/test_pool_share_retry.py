"""A rootless pool directory whose namespace mount fails with EINVAL once (a full suite saw it
about once in 200 pools) is tried once more, and the first failure is logged; any other
failure, or a second EINVAL, is the pool's failure — and leaves no directory behind."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from toolseam.backends.containers.pool import mounts
from toolseam.backends.staging import user_dir


class Flaky(mounts.NamespaceSlots):
    def __init__(self, failures: list[int]) -> None:
        super().__init__(os.getpid())
        self.failures = failures
        self.shared: list[str] = []
        self.unmounted: list[str] = []

    def share(self, directory: str) -> None:
        if self.failures:
            code = self.failures.pop(0)
            raise OSError(code, f"mount on {directory}: {os.strerror(code)}")
        self.shared.append(directory)

    def unmount_below(self, path: str) -> None:
        self.unmounted.append(path)


def test_one_einval_is_tried_again_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    slots = Flaky([errno.EINVAL])
    with caplog.at_level(logging.WARNING, logger=mounts.__name__):
        path = mounts.make_pool_dir(slots)
    try:
        assert slots.shared == [path] and path in slots.unmounted
        assert "Invalid argument; trying once more" in caplog.text
    finally:
        mounts.remove_pool_dir(path)


@pytest.mark.parametrize("failures", [[errno.EINVAL, errno.EINVAL], [errno.EPERM]])
def test_a_second_einval_or_another_error_is_the_pools(failures: list[int]) -> None:
    expected = failures[-1]
    slots = Flaky(failures)
    before = set(os.listdir(user_dir("pools")))
    with pytest.raises(OSError) as raised:
        mounts.make_pool_dir(slots)
    assert raised.value.errno == expected
    assert slots.shared == []
    assert set(os.listdir(user_dir("pools"))) <= before


def test_the_fresh_process_path_mounts_in_the_namespace_it_joins(tmp_path: Path) -> None:
    """What runs when a forked child's setns is refused (decision 389): a new interpreter
    joins the namespace (here this process's own) and makes the steps, then detaches them."""
    target = str(tmp_path / "shared")
    os.mkdir(target)
    code, said = mounts._in_fresh_process(os.getpid(), [
        (target, target, mounts.MS_BIND | mounts.MS_REC), (None, target, mounts.MS_SHARED)])
    try:
        assert (code, said) == (0, "")
        assert mounts._mounts_below(target, "/proc/self/mountinfo") == [target]
    finally:
        assert mounts._in_fresh_process(os.getpid(), [(None, target, mounts._UNMOUNT)]) == (0, "")
    assert mounts._mounts_below(target, "/proc/self/mountinfo") == []
    code, said = mounts._in_fresh_process(os.getpid(), [(None, target + "-missing",
                                                         mounts.MS_SHARED)])
    assert code == errno.ENOENT and said.startswith("step 1 of 1")
