"""The AddressSanitizer test builds the library again with ASan (about a minute on one core) and runs the quick
``asan`` selection against it. So that the build overlaps the rest of the suite on a 2-core CI machine, as the
NVRTC builds do (tests/cuda/conftest.py), its child starts when collection ends and the test runs last, waiting for
it."""

import tempfile

import pytest

ASAN_TEST = "test_malformed_input_is_memory_safe_under_asan"
ASAN_SELECTION = ["-q", "-k", "quick"]
ASAN_CHILD = pytest.StashKey[tuple]()


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected theirs
def pytest_collection_modifyitems(config, items):
    waiting = [item for item in items if item.name == ASAN_TEST]
    if not waiting or config.option.collectonly:
        return
    import asan_runner

    items[:] = [item for item in items if item not in waiting] + waiting  # it waits last
    output = tempfile.TemporaryFile(mode="w+")
    config.stash[ASAN_CHILD] = (asan_runner.start(ASAN_SELECTION, output), output)


@pytest.fixture
def asan_quick_run(request):
    """() -> (exit status, output) of the quick ASan selection: the child collection started, or one started now."""
    def wait():
        import asan_runner

        started = request.config.stash.get(ASAN_CHILD, None)
        if started is None:
            output = tempfile.TemporaryFile(mode="w+")
            started = (asan_runner.start(ASAN_SELECTION, output), output)
        child, output = started
        child.wait()
        output.seek(0)
        return child.returncode, output.read()

    return wait
