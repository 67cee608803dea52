"""Run every index test against the native put/select paths and the pure-Python reference."""
import pytest

from rmq_core.store import index


@pytest.fixture(autouse=True, params=["native", "python"])
def index_impl(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setattr(index, "_native", None)
    return request.param
